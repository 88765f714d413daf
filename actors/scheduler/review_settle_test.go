package scheduler

import (
	"sync/atomic"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// After a crash, recovery finds the batch appended and writes its fire;
// if that write fails, loadRetry re-runs recover with the intents already
// thrown away, and the found refs stay busy (and pending) for good.
func TestReviewSettleRecoveredWriteFails(t *testing.T) {
	var failNext atomic.Bool
	p := &proxy{intercept: func(msg any) any {
		f, ok := msg.(*heraldpb.Frame)
		if ok && f.GetProduce() != nil && failNext.CompareAndSwap(true, false) {
			return heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "busy"))
		}
		return nil
	}}
	var crashed atomic.Bool
	r := newProxyRig(t, t.TempDir(), Options{Lead: 5 * time.Millisecond, CompactCheck: 20 * time.Millisecond,
		crashAfterAppend: func() bool {
			if crashed.CompareAndSwap(false, true) {
				failNext.Store(true)
				return true
			}
			return false
		}}, ScheduleTopic, 0, p)
	defer r.stop()
	id := r.schedule(0, 100*time.Millisecond, "A")
	waitFor(t, "the crash", func() bool { return crashed.Load() })
	r.settle(100 * time.Millisecond)
	for i := range 5 {
		r.schedule(1, 20*time.Millisecond, "later", string(rune('a'+i)))
	}
	r.settle(500 * time.Millisecond)
	waitFor(t, "compaction past the recovered batch", func() bool { return r.reg.Get(ScheduleTopic).Stats[0].StartOffset.Load() > 0 })
	v0, _ := r.read(0)
	st := r.reg.Get(ScheduleTopic).Stats[0]
	cres := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_CancelScheduled{CancelScheduled: &heraldpb.CancelScheduledRequest{Id: id}}}, r.sched)
	t.Logf("p0 %q; __schedule start %d hw %d; cancel %s: %v", v0, st.StartOffset.Load(), st.HighWatermark.Load(), id, cres.GetError().GetMessage())
	if st.StartOffset.Load() == 0 {
		t.Fatalf("recovered batch %s never settled: busy for good, compaction held", id)
	}
}
