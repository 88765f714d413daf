package scheduler

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// An append refused with a retriable error is re-sent by a timer message
// (resendChunks). If the actor restarts before it arrives, the new
// incarnation both recovers and re-fires the batch itself and handles the
// old incarnation's resendChunks: the batch is appended twice.
func TestReviewResendAcrossRestart(t *testing.T) {
	var throttleA atomic.Bool
	throttleA.Store(true)
	var throttled atomic.Int32
	p := &proxy{intercept: func(msg any) any {
		f, ok := msg.(*heraldpb.Frame)
		if ok && f.GetProduce() != nil && throttleA.Load() && bytes.Contains(f.GetProduce().Records, []byte("AAA")) {
			throttled.Add(1)
			e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "partition saturated")
			return heraldpb.ErrorFrame(f.Id, e)
		}
		return nil
	}}
	var crashed atomic.Bool
	r := newProxyRig(t, t.TempDir(), Options{Lead: 5 * time.Millisecond, FireBatch: 1,
		crashAfterAppend: func() bool {
			if crashed.CompareAndSwap(false, true) {
				throttleA.Store(false) // the partition recovers
				return true
			}
			return false
		}}, "t", 0, p)
	defer r.stop()
	at := time.Now().Add(300 * time.Millisecond).UnixMilli()
	for _, x := range []struct {
		p   uint32
		at  int64
		val string
	}{{0, at, "AAA"}, {1, at + 250, "B (its append triggers the crash)"}} {
		r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
			Topic: "t", Partition: proto.Uint32(x.p), DeliverAtMs: x.at, Records: batchOf(x.val)}}}, r.sched)
	}
	r.settle(2 * time.Second)
	v0, _ := r.read(0)
	v1, _ := r.read(1)
	t.Logf("throttled %d times; crashed %v; p0 %q; p1 %q", throttled.Load(), crashed.Load(), v0, v1)
	if len(v0) != 1 {
		t.Fatalf("AAA appended %d times", len(v0))
	}
}
