package scheduler

import (
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

func isProduce(msg any) bool {
	f, ok := msg.(*heraldpb.Frame)
	return ok && f.GetProduce() != nil
}

// With nothing pending, a compaction that runs after __schedule committed
// a Schedule write but before the scheduler handled the answer cuts at the
// high watermark, deleting the acknowledged batch's record. The proxy
// holds the produce answer 50 ms, as a busy mailbox would.
func TestReviewCompactRacesScheduleWrite(t *testing.T) {
	p := &proxy{after: func(msg any) time.Duration {
		if isProduce(msg) {
			return 50 * time.Millisecond
		}
		return 0
	}}
	r := newProxyRig(t, t.TempDir(), Options{CompactCheck: 5 * time.Millisecond}, ScheduleTopic, 0, p)
	defer r.stop()
	res := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "t", Partition: proto.Uint32(0), DelayMs: 500, Records: batchOf("acked")}}}, r.sched)
	st := r.reg.Get(ScheduleTopic).Stats[0]
	t.Logf("acknowledged id %s; __schedule start %d hw %d", res.GetProduceResponse().ScheduleId, st.StartOffset.Load(), st.HighWatermark.Load())
	r.settle(1500 * time.Millisecond)
	vals, _ := r.read(0)
	l := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_ListScheduled{ListScheduled: &heraldpb.ListScheduledRequest{}}}, r.sched).GetListScheduledResponse()
	t.Logf("appended %v, pending %d", vals, l.Pending)
	if len(vals) == 0 {
		t.Fatalf("acknowledged batch never appended (its __schedule record was compacted away)")
	}
}

// An actor restart (injected crash) leaves the old incarnation's compact
// timer running; it reaches the new incarnation while it loads (pending
// still empty) and cuts __schedule at its high watermark, deleting every
// pending batch. The proxy delays __schedule fetches 30 ms (a slow disk).
func TestReviewCompactDuringReload(t *testing.T) {
	p := &proxy{before: func(msg any) time.Duration {
		if f, ok := msg.(*heraldpb.Frame); ok && f.GetFetch() != nil {
			return 30 * time.Millisecond
		}
		return 0
	}}
	var crashed bool
	r := newProxyRig(t, t.TempDir(), Options{Lead: 5 * time.Millisecond, CompactCheck: 5 * time.Millisecond,
		crashAfterAppend: func() bool { c := !crashed; crashed = true; return c }}, ScheduleTopic, 0, p)
	defer r.stop()
	r.schedule(1, 1500*time.Millisecond, "B (pending across the restart)")
	r.schedule(0, 100*time.Millisecond, "A (its append triggers the crash)")
	r.settle(2 * time.Second)
	v1, _ := r.read(1)
	st := r.reg.Get(ScheduleTopic).Stats[0]
	t.Logf("partition 1 holds %q; __schedule start %d hw %d", v1, st.StartOffset.Load(), st.HighWatermark.Load())
	if len(v1) == 0 {
		t.Fatalf("B was never appended")
	}
}
