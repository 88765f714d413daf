package scheduler

import (
	"sync/atomic"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Recovery after a crash between append and fire record looks for the
// batch on its partition; a transient THROTTLED answer to that fetch (a
// saturated partition mailbox, busy log readers) is taken as "not
// appended", and the batch is appended again.
func TestReviewRecoveryScanThrottled(t *testing.T) {
	var throttleFetch atomic.Bool
	p := &proxy{intercept: func(msg any) any {
		f, ok := msg.(*heraldpb.Frame)
		if ok && f.GetFetch() != nil && throttleFetch.CompareAndSwap(true, false) {
			e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "log readers are busy")
			e.RetryAfterMs = 100
			return heraldpb.ErrorFrame(f.Id, e)
		}
		return nil
	}}
	var crashed atomic.Bool
	r := newProxyRig(t, t.TempDir(), Options{Lead: 5 * time.Millisecond,
		crashAfterAppend: func() bool {
			if crashed.CompareAndSwap(false, true) {
				throttleFetch.Store(true)
				return true
			}
			return false
		}}, "t", 0, p)
	defer r.stop()
	r.schedule(0, 100*time.Millisecond, "A")
	r.settle(1500 * time.Millisecond)
	v0, _ := r.read(0)
	t.Logf("crashed %v; p0 %q", crashed.Load(), v0)
	if len(v0) != 1 {
		t.Fatalf("A appended %d times", len(v0))
	}
}
