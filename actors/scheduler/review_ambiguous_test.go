package scheduler

import (
	"sync/atomic"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// The partition stores the append but answers it with an error (as
// failPending does when the partition actor restarts or its storage fails
// after the entry was persisted): the scheduler re-sends it.
func TestReviewAmbiguousAppendError(t *testing.T) {
	var once atomic.Bool
	p := &proxy{override: func(msg, res any) any {
		f, ok := msg.(*heraldpb.Frame)
		if ok && f.GetProduce() != nil && once.CompareAndSwap(false, true) {
			return heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "partition t-0 is restarting after a failure"))
		}
		return res
	}}
	r := newProxyRig(t, t.TempDir(), Options{Lead: 5 * time.Millisecond}, "t", 0, p)
	defer r.stop()
	r.schedule(0, 100*time.Millisecond, "A")
	r.settle(time.Second)
	v0, _ := r.read(0)
	t.Logf("p0 %q", v0)
	if len(v0) != 1 {
		t.Fatalf("A appended %d times", len(v0))
	}
}
