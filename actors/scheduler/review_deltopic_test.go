package scheduler

import (
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// A topic deleted after its batch was announced (within Lead of its
// time) but before the append: the append goes to a stopped partition
// actor, the answer is a DeadLetterResponse the scheduler ignores, and the
// batch stays pending and busy for good, holding back compaction.
func TestReviewTopicDeletedAfterAnnounce(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{CompactCheck: 20 * time.Millisecond})
	defer r.stop()
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "gone", Config: &heraldpb.TopicConfig{Partitions: 1}}}}, r.mgr)
	res := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "gone", Partition: proto.Uint32(0), DelayMs: 500, Records: batchOf("x")}}}, r.sched)
	id := res.GetProduceResponse().ScheduleId
	for until := time.Now().Add(350 * time.Millisecond); time.Now().Before(until); {
		time.Sleep(10 * time.Millisecond) // the clock must pass: announced (250 ms lead), not yet appended
	}
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_DeleteTopic{DeleteTopic: &heraldpb.DeleteTopicRequest{Name: "gone"}}}, r.mgr)
	// later batches on a live topic fire and should let compaction move on
	for i := range 5 {
		r.schedule(0, 50*time.Millisecond, "later", string(rune('a'+i)))
	}
	st := r.reg.Get(ScheduleTopic).Stats[0]
	deadline := time.Now().Add(30 * time.Second)
	for st.StartOffset.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	l := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_ListScheduled{ListScheduled: &heraldpb.ListScheduledRequest{}}}, r.sched).GetListScheduledResponse()
	cres := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_CancelScheduled{CancelScheduled: &heraldpb.CancelScheduledRequest{Id: id}}}, r.sched)
	t.Logf("id %s: pending %d, listed %d, __schedule start %d hw %d; cancel: %v", id, l.Pending, len(l.Scheduled), st.StartOffset.Load(), st.HighWatermark.Load(), cres.GetError().GetMessage())
	if st.StartOffset.Load() == 0 {
		t.Fatalf("batch of the deleted topic still pending (never dropped); compaction held at its id")
	}
}
