package scheduler

import (
	"sync/atomic"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// A Firing write that fails is retried by a retryFiring timer message
// carrying the round. After a restart the new incarnation runs the old
// round (no owner check): it appends the batch, which the new incarnation
// also fires from its reloaded state.
func TestReviewRetryFiringAcrossRestart(t *testing.T) {
	var failA atomic.Bool
	failA.Store(true)
	var refA atomic.Uint64
	refA.Store(^uint64(0))
	var failed atomic.Int32
	p := &proxy{intercept: func(msg any) any {
		f, ok := msg.(*heraldpb.Frame)
		if !ok || f.GetProduce() == nil || !failA.Load() {
			return nil
		}
		hit := false
		_ = heraldpb.ForEachRawRecord(f.GetProduce().Records, func(_ int, rec []byte) bool {
			ev, err := decodeEvent(rec)
			if err == nil {
				for _, in := range ev.GetFiring().GetIntents() {
					for _, r := range in.Refs {
						if r == refA.Load() {
							hit = true
						}
					}
				}
			}
			return true
		})
		if !hit {
			return nil
		}
		failed.Add(1)
		return heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "busy"))
	}}
	var crashed atomic.Bool
	r := newProxyRig(t, t.TempDir(), Options{Lead: 5 * time.Millisecond, FireBatch: 1,
		crashAfterAppend: func() bool {
			if crashed.CompareAndSwap(false, true) {
				failA.Store(false)
				return true
			}
			return false
		}}, ScheduleTopic, 0, p)
	defer r.stop()
	at := time.Now().Add(300 * time.Millisecond).UnixMilli()
	res := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "t", Partition: proto.Uint32(0), DeliverAtMs: at, Records: batchOf("AAA")}}}, r.sched)
	ref, _ := ParseID(res.GetProduceResponse().ScheduleId)
	refA.Store(ref)
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "t", Partition: proto.Uint32(1), DeliverAtMs: at + 30, Records: batchOf("B")}}}, r.sched)
	r.settle(2 * time.Second)
	v0, _ := r.read(0)
	v1, _ := r.read(1)
	t.Logf("firing of A refused %d times; crashed %v; p0 %q; p1 %q", failed.Load(), crashed.Load(), v0, v1)
	if len(v0) != 1 {
		t.Fatalf("AAA appended %d times", len(v0))
	}
}
