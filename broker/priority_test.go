package broker

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/heraldmq/herald/actors/consumer"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// produceLevels appends one batch to topic's partition part whose record i
// has priority levels[i] and value "<i>/<level>", retrying retriable
// errors. One batch, so the group's first read gets all of it.
func produceLevels(t *testing.T, w *wire, topic string, part uint32, levels []uint8) {
	t.Helper()
	batch := &heraldpb.RecordBatch{}
	for i, l := range levels {
		batch.Records = append(batch.Records, &heraldpb.Record{Value: []byte(fmt.Sprintf("%d/%d", i, l)), Priority: uint32(l)})
	}
	recs, err := proto.Marshal(batch)
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, func() error {
		r := w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: topic, Partition: proto.Uint32(part), Records: recs}}})
		if e := r.GetError(); e != nil {
			if !e.Retriable {
				t.Fatalf("produce: %v", e)
			}
			return e
		}
		return nil
	})
}

// consumeAll reads n deliveries of subscription sub, acking each batch and
// granting as many credits back, and returns the offsets in delivery
// order. Every message must arrive exactly once, as a first delivery, with
// the priority its value names.
func consumeAll(t *testing.T, w *wire, sub uint64, n int, levels []uint8) []int64 {
	t.Helper()
	return consumeAllBy(t, w, sub, n, func(off int64) string { return fmt.Sprintf("%d/%d", off, levels[off]) },
		func(off int64) uint32 { return uint32(levels[off]) })
}

// wrrOrder is the delivery order Deliver gives a partition whose messages
// are all pending at once: each level a queue in offset order, the level
// of each delivery chosen by the default weights.
func wrrOrder(t *testing.T, levels []uint8) []int64 {
	pk, err := consumer.NewPriorityPicker(consumer.DefaultPriorityWeights())
	if err != nil {
		t.Fatal(err)
	}
	var queues [consumer.Priorities][]int64
	for off, l := range levels {
		queues[l] = append(queues[l], int64(off))
	}
	var out []int64
	for {
		var busy [consumer.Priorities]bool
		for l, q := range queues {
			busy[l] = len(q) > 0
		}
		l, ok := pk.Pick(busy)
		if !ok {
			return out
		}
		out, queues[l] = append(out, queues[l][0]), queues[l][1:]
	}
}

// A backlog of mixed priorities in one partition, pushed through a credit
// window of 7 to a shared subscriber: higher levels come first by weight
// (exactly the picker's order: the whole backlog is in the group's window
// from its first read), level 0 is not starved, and each message arrives
// once. An orderly subscription on the same backlog gets offset order.
func TestGroupPriorities(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "t", 1)
	r := rand.New(rand.NewPCG(1, 2))
	levels := make([]uint8, 300)
	for i := range levels {
		switch r.IntN(4) {
		case 0:
			levels[i] = 0
		case 1:
			levels[i] = 9
		default:
			levels[i] = uint8(r.IntN(consumer.Priorities))
		}
	}
	produceLevels(t, w, "t", 0, levels)

	sub := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "g", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: 7})
	got := consumeAll(t, w, sub, len(levels), levels)
	want := wrrOrder(t, levels)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("delivery %d: offset %d (level %d), want %d (level %d)\ngot  %v\nwant %v",
				i, got[i], levels[got[i]], want[i], levels[want[i]], got, want)
		}
	}
	// Higher levels first: about half the backlog is at level 5 and above,
	// but with every level waiting they weigh 40 of 55, so they make most
	// of the first third of the deliveries; level 0 still gets some of it.
	var hi, lo int
	third := got[:len(got)/3]
	for _, off := range third {
		switch l := levels[off]; {
		case l >= 5:
			hi++
		case l == 0:
			lo++
		}
	}
	if hi*10 < len(third)*6 || lo == 0 {
		t.Fatalf("first %d deliveries: %d at level 5 and above, %d at level 0", len(third), hi, lo)
	}
	if d := describe(t, w, "g"); d.Partitions[0].AckFloor != int64(len(levels)) {
		t.Fatalf("ack floor %d, want %d", d.Partitions[0].AckFloor, len(levels))
	}

	sub = subscribe(t, w, &heraldpb.SubscribeRequest{Group: "o", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_CLUSTERING, Orderly: true, Credits: 7})
	got = consumeAll(t, w, sub, len(levels), levels)
	for i, off := range got {
		if off != int64(i) {
			t.Fatalf("orderly delivery %d is offset %d: %v", i, off, got)
		}
	}
}

// A backlog three times the group's window (MaxPending 1024) of level-0
// messages, then five at level 9 behind it: the group reads the
// partition's level-9 sub-queue while its ordered read is stalled, so the
// five arrive within the first deliveries instead of after the backlog,
// and every message still arrives exactly once.
func TestGroupPriorityJumpsBacklog(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "j", 1)
	const backlog = 3000
	levels := make([]uint8, backlog+5)
	for i := 0; i < backlog; i += 1000 {
		produceLevels(t, w, "j", 0, levels[i:i+1000])
	}
	sub := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "g", Topic: "j", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: 5})
	high := levels[backlog:]
	for i := range high {
		high[i] = 9
	}
	// One batch, so its values name offsets from backlog on.
	batch := &heraldpb.RecordBatch{}
	for i := range high {
		batch.Records = append(batch.Records, &heraldpb.Record{Value: []byte(fmt.Sprintf("%d/9", backlog+i)), Priority: 9})
	}
	recs, _ := proto.Marshal(batch)
	if r := w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "j", Partition: proto.Uint32(0), Records: recs}}}); r.GetError() != nil {
		t.Fatalf("produce: %v", r.GetError())
	}
	// produceLevels numbers values from 0 in each batch: rewrite the
	// expectations of the backlog to match ("<i mod 1000>/0").
	got := consumeAllBy(t, w, sub, len(levels), func(off int64) string {
		if off >= backlog {
			return fmt.Sprintf("%d/9", off)
		}
		return fmt.Sprintf("%d/0", off%1000)
	}, nil)
	for pos, off := range got {
		if off >= backlog && pos >= 300 {
			t.Fatalf("level-9 offset %d was delivery %d of %d: it waited behind the backlog", off, pos, len(got))
		}
	}
	if d := describe(t, w, "g"); d.Partitions[0].AckFloor != int64(len(levels)) {
		t.Fatalf("ack floor %d, want %d", d.Partitions[0].AckFloor, len(levels))
	}
}

// consumeAllBy is consumeAll with the expected value and priority of each
// offset given by value and prio (nil: any priority).
func consumeAllBy(t *testing.T, w *wire, sub uint64, n int, value func(off int64) string, prio func(off int64) uint32) []int64 {
	t.Helper()
	var order []int64
	seen := map[int64]bool{}
	for len(order) < n {
		ds := w.deliveries(1, 10*time.Second)
		if len(ds) == 0 {
			t.Fatalf("stalled after %d of %d deliveries", len(order), n)
		}
		for _, d := range ds {
			if seen[d.Offset] || d.DeliveryCount != 1 {
				t.Fatalf("offset %d delivered again (count %d)", d.Offset, d.DeliveryCount)
			}
			seen[d.Offset] = true
			if want := value(d.Offset); string(d.Record.GetValue()) != want || prio != nil && d.Record.GetPriority() != prio(d.Offset) {
				t.Fatalf("offset %d: record %q priority %d, want %q", d.Offset, d.Record.GetValue(), d.Record.GetPriority(), want)
			}
			order = append(order, d.Offset)
		}
		ackAll(t, w, sub, ds, uint32(len(ds)))
	}
	if extra := w.deliveries(1, 50*time.Millisecond); len(extra) > 0 {
		t.Fatalf("delivered beyond the %d messages: %v", n, ids(extra))
	}
	return order
}
