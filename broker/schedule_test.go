package broker

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// Delayed produces, cancels and lists with random and hostile fields get
// typed answers, and the scheduler keeps serving: a fresh delayed message
// still arrives, once, after its time.
func TestScheduleRequestsWithGarbageFields(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "t", 2)
	r := rand.New(rand.NewPCG(4, 4))
	good, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte("x")}}})
	pendingIDs := map[string]bool{} // scheduled an hour or more ahead, not cancelled
	for i := range 2000 {
		var f *heraldpb.Frame
		switch i % 3 {
		case 0:
			req := &heraldpb.ProduceRequest{Topic: []string{"t", "missing", "__schedule", "__groups", ""}[r.IntN(5)], Records: good}
			switch r.IntN(6) {
			case 0:
				req.DelayMs = r.Uint64()
			case 1:
				req.DeliverAtMs = r.Int64() - r.Int64()
			case 2:
				req.DelayMs, req.DeliverAtMs = 1+r.Uint64N(1000), time.Now().UnixMilli()
			case 3:
				req.DelayMs = 3_600_000 + r.Uint64N(1000)
				req.Records = []byte{0x0a, 0x05, 1}
			case 4:
				req.DelayMs = 3_600_000
				req.Partition = proto.Uint32(r.Uint32N(4))
			default:
				req.DeliverAtMs = time.Now().Add(time.Hour).UnixMilli()
				req.Records = nil
			}
			f = &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: req}}
		case 1:
			id := []string{"", "-1", "x", "18446744073709551616", strconv.FormatUint(r.Uint64(), 10), fmt.Sprint(r.IntN(50))}[r.IntN(6)]
			f = &heraldpb.Frame{Body: &heraldpb.Frame_CancelScheduled{CancelScheduled: &heraldpb.CancelScheduledRequest{Id: id}}}
		default:
			f = &heraldpb.Frame{Body: &heraldpb.Frame_ListScheduled{ListScheduled: &heraldpb.ListScheduledRequest{Topic: "t", Limit: r.Uint32N(20000)}}}
		}
		resp := w.call(f)
		if e := resp.GetError(); e != nil {
			if e.Code == heraldpb.ErrorCode_INTERNAL || e.Code == heraldpb.ErrorCode_ERROR_CODE_UNSPECIFIED {
				t.Fatalf("%v: %v", f, e)
			}
			continue
		}
		if pr := resp.GetProduceResponse(); pr.GetScheduleId() != "" && pr.GetDeliverAtMs() > time.Now().Add(time.Minute).UnixMilli() {
			pendingIDs[pr.GetScheduleId()] = true
		}
		if resp.GetCancelScheduledResponse() != nil {
			id := f.GetCancelScheduled().Id
			if !pendingIDs[id] {
				t.Fatalf("cancelled %s, which was not pending", id)
			}
			delete(pendingIDs, id)
		}
	}
	// The scheduler still works: a message due in 50 ms arrives once.
	resp := w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "t", Partition: proto.Uint32(1), DelayMs: 50, Records: good,
	}}})
	id := resp.GetProduceResponse().ScheduleId
	var got []string
	checkFor(t, func() error {
		got = got[:0]
		fr := w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{Topic: "t", Partition: 1, MaxBytes: 16 << 20}}})
		for _, bt := range fr.GetFetchResponse().Batches {
			_ = heraldpb.ForEachRawRecord(bt.Records, func(_ int, rec []byte) bool {
				v, _ := heraldpb.RecordHeader(rec, "herald-schedule-id")
				got = append(got, string(v))
				return true
			})
		}
		for _, g := range got {
			if g == id {
				return nil
			}
		}
		return fmt.Errorf("%s not fired yet (%d records)", id, len(got))
	})
	n := 0
	for _, g := range got {
		if g == id {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("fired %d times", n)
	}
	list := w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_ListScheduled{ListScheduled: &heraldpb.ListScheduledRequest{Limit: 10000}}}).GetListScheduledResponse()
	if int(list.Pending) != len(pendingIDs) || len(list.Scheduled) != len(pendingIDs) {
		t.Fatalf("pending %d (%d listed), want the %d accepted far ones not cancelled", list.Pending, len(list.Scheduled), len(pendingIDs))
	}
	for _, s := range list.Scheduled {
		if !pendingIDs[s.Id] {
			t.Fatalf("listed %s, not pending", s.Id)
		}
	}
}
