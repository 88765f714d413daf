package scheduler

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// A client record carrying a forged herald-schedule-id is not taken for
// the scheduler's append: the first append of A fails (not appended), and
// the check before sending it again finds only the forged record, whose
// fire token does not match, so A is appended.
func TestReviewForgedScheduleIDIgnored(t *testing.T) {
	var refused atomic.Int32
	p := &proxy{intercept: func(msg any) any {
		f, ok := msg.(*heraldpb.Frame)
		if ok && f.GetProduce() != nil && bytes.Contains(f.GetProduce().Records, []byte("real-A")) && refused.Add(1) == 1 {
			e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "saturated")
			return heraldpb.ErrorFrame(f.Id, e)
		}
		return nil
	}}
	r := newProxyRig(t, t.TempDir(), Options{Lead: 5 * time.Millisecond}, "t", 0, p)
	defer r.stop()
	id := r.schedule(0, 300*time.Millisecond, "real-A")
	forged, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte("forged"),
		Headers: []*heraldpb.Header{{Key: HeaderScheduleID, Value: []byte(id)}, {Key: HeaderFireToken, Value: []byte("0000000000000000")}}}}})
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "t", Partition: proto.Uint32(0), Acks: heraldpb.Acks_ACKS_ALL, Records: forged}}}, r.reg.Get("t").Partitions[0])
	waitFor(t, "real-A", func() bool { _, ids := r.read(0); return ids["real-A"] == id })
	r.settle(200 * time.Millisecond)
	vals, _ := r.read(0)
	if len(vals) != 2 || refused.Load() < 1 {
		t.Fatalf("partition 0 holds %q (refused %d), want the forged record and real-A once", vals, refused.Load())
	}
}
