package scheduler

import (
	"bytes"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// A delayed batch at the topic's max message size is accepted (and a
// plain produce of it would be), but the herald-schedule-id and
// herald-deliver-at headers push it over the limit at fire time: refused
// with MESSAGE_TOO_LARGE, which is not retriable, and dropped.
func TestReviewTaggedBatchTooLarge(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{Lead: 5 * time.Millisecond})
	defer r.stop()
	limit := int(r.reg.Get("t").Config.GetMaxMessageBytes())
	// one record whose batch encodes to exactly limit bytes
	val := bytes.Repeat([]byte("x"), limit-10)
	for len(batchOfB(val)) > limit {
		val = val[:len(val)-1]
	}
	for len(batchOfB(val)) < limit {
		val = append(val, 'x')
	}
	b := batchOfB(val)
	t.Logf("limit %d, batch %d bytes", limit, len(b))
	// a plain produce of it is accepted
	e := r.reg.Get("t")
	plain := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Partition: proto.Uint32(1), Acks: heraldpb.Acks_ACKS_ALL, Records: b}}}, e.Partitions[1])
	t.Logf("plain produce: %v", plain.GetError())
	res := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "t", Partition: proto.Uint32(0), DelayMs: 50, Records: b}}}, r.sched)
	if e := res.GetError(); e != nil {
		// Refused up front is right: with its headers it would not fit.
		if e.Code != heraldpb.ErrorCode_MESSAGE_TOO_LARGE {
			t.Fatalf("schedule refused with %v, want MESSAGE_TOO_LARGE", e)
		}
		return
	}
	t.Logf("scheduled id %s", res.GetProduceResponse().ScheduleId)
	// wait until it is no longer pending
	waitFor(t, "not pending", func() bool {
		l := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_ListScheduled{ListScheduled: &heraldpb.ListScheduledRequest{}}}, r.sched).GetListScheduledResponse()
		return l.Pending == 0
	})
	vals, _ := r.read(0)
	if len(vals) == 0 {
		t.Fatalf("acknowledged delayed batch of %d bytes (limit %d) was never appended: dropped at fire", len(b), limit)
	}
}

func batchOfB(v []byte) []byte {
	out, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: v}}})
	return out
}
