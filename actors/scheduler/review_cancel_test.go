package scheduler

import (
	"fmt"
	"sync"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// A cancel accepted while the batch sits in dueQ (due within Lead, waiting
// for a round slot) is answered OK, yet the batch fires.
func TestReviewCancelWhileInDueQ(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{Lead: time.Second, MaxRounds: 1, FireBatch: 1})
	defer r.stop()
	at := time.Now().Add(1500 * time.Millisecond).UnixMilli()
	const n = 200
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
				Topic: "t", Partition: proto.Uint32(0), DeliverAtMs: at, Records: batchOf(fmt.Sprintf("v%d", i)),
			}}}, r.sched)
			ids[i] = res.GetProduceResponse().ScheduleId
		}()
	}
	wg.Wait()
	// find the largest id: last in dueQ
	last, lastV := uint64(0), ""
	for i, id := range ids {
		ref, _ := ParseID(id)
		if ref >= last {
			last, lastV = ref, fmt.Sprintf("v%d", i)
		}
	}
	// wait until the batches are due in the wheel (at - Lead) and rounds started
	time.Sleep(time.Until(time.UnixMilli(at).Add(-time.Second + 30*time.Millisecond))) // the clock must reach that time
	res := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_CancelScheduled{CancelScheduled: &heraldpb.CancelScheduledRequest{Id: fmt.Sprint(last)}}}, r.sched)
	t.Logf("cancel of %d (%s): %v", last, lastV, res.Body)
	cancelled := res.GetError() == nil
	waitFor(t, "fires", func() bool { v, _ := r.read(0); return len(v) >= n-1 })
	r.settle(300 * time.Millisecond)
	vals, _ := r.read(0)
	seen := false
	for _, v := range vals {
		if v == lastV {
			seen = true
		}
	}
	t.Logf("appended %d batches; cancelled one appended: %v; cancel answered OK: %v", len(vals), seen, cancelled)
	if cancelled && seen {
		t.Fatalf("cancel of %s succeeded but the batch fired", lastV)
	}
}
