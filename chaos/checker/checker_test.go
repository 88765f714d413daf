// The hand-built clean history that the checker tests edit, and its test.

package checker

import (
	"slices"
	"testing"
	"time"

	"github.com/heraldmq/herald/chaos/history"
)

type op = history.Op

const (
	invoke = history.Invoke
	ok     = history.OK
	fail   = history.Fail
	info   = history.Info
)

// hist builds a history by hand: at sets the time (ms since the start) of
// the ops that add appends, which numbers them.
type hist struct {
	ops []op
	now int64
}

func (h *hist) at(ms int64) *hist { h.now = ms * int64(time.Millisecond); return h }

func (h *hist) add(ops ...op) *hist {
	for _, o := range ops {
		o.Index, o.Time = int64(len(h.ops)), h.now
		h.ops = append(h.ops, o)
	}
	return h
}

// produce is a producer's invoke and its completion of type t at the
// current time (the completion carries partition and offset).
func (h *hist) produce(proc, topic string, partition int32, offset int64, key, value string, seq int64, idem bool, t history.Type) *hist {
	o := op{Process: proc, Type: invoke, F: history.Produce, Topic: topic, Key: key, Value: value, Seq: seq, Idempotent: idem}
	h.add(o)
	o.Type, o.Partition, o.Offset = t, partition, offset
	return h.add(o)
}

// half is a half message's send to topic "halves", meant to end with
// outcome, completing with type t at the current time.
func (h *hist) half(value, outcome string, t history.Type) *hist {
	o := op{Process: "half-0", Type: invoke, F: history.HalfSend, Topic: "halves", Value: value, Outcome: outcome, Idempotent: true}
	h.add(o)
	o.Type = t
	if t == ok {
		o.RequestID = "7"
	}
	return h.add(o)
}

// txn is a transaction to topic "txns": its values staged (ok), then, if
// outcome is set, its end completing with type t.
func (h *hist) txn(id, outcome string, t history.Type, values ...string) *hist {
	for _, v := range values {
		o := op{Process: "txn-0", Type: invoke, F: history.TxnSend, Topic: "txns", Value: v, RequestID: id, Idempotent: true}
		h.add(o)
		o.Type = ok
		h.add(o)
	}
	if outcome == "" {
		return h
	}
	e := op{Process: "txn-0", Type: invoke, F: history.TxnEnd, RequestID: id, Outcome: outcome}
	h.add(e)
	e.Type = t
	return h.add(e)
}

// read is the final read of topic/partition from node.
func (h *hist) read(topic string, partition int32, node int, values ...string) *hist {
	o := op{Process: "reader", Type: ok, F: history.FinalRead, Topic: topic, Partition: partition, Node: node}
	for i, v := range values {
		o.Records = append(o.Records, history.Record{Offset: int64(i), Value: v})
	}
	return h.add(o)
}

// reads returns the final reads of topic/partition, to edit.
func (h *hist) reads(topic string, partition int32) []*op {
	var rs []*op
	for i := range h.ops {
		if o := &h.ops[i]; o.F == history.FinalRead && o.Topic == topic && o.Partition == partition {
			rs = append(rs, o)
		}
	}
	return rs
}

// setRecords gives every replica of topic/partition these values from
// offset 0.
func (h *hist) setRecords(topic string, partition int32, values ...string) {
	for _, r := range h.reads(topic, partition) {
		r.Records = nil
		for i, v := range values {
			r.Records = append(r.Records, history.Record{Offset: int64(i), Value: v})
		}
	}
}

// before inserts o before the first op that matches, at that op's time,
// and renumbers the ops.
func (h *hist) before(match func(op) bool, o op) {
	i := slices.IndexFunc(h.ops, match)
	o.Time = h.ops[i].Time
	h.ops = slices.Insert(h.ops, i, o)
	for j := range h.ops {
		h.ops[j].Index = int64(j)
	}
}

// drop removes the ops that match.
func (h *hist) drop(match func(op) bool) {
	h.ops = slices.DeleteFunc(h.ops, match)
}

// clean is a history without a violation that still has what a checker
// could mistake for one: a record of unknown outcome stored, a failed
// record absent, a lagging replica, a non-idempotent duplicate, a
// redelivery before the ack, commits that overlap, broadcast members
// each acking, a delayed message delivered exactly when due, a fault.
func clean() *hist {
	h := &hist{}
	// orders: producer-0 idempotent and keyed, producer-1 neither.
	h.at(0).produce("producer-0", "orders", 0, 0, "a", "p0-0", 0, true, ok)
	h.at(1).produce("producer-1", "orders", 1, 0, "", "p1-0", 0, false, ok)
	h.at(2).produce("producer-0", "orders", 1, 1, "b", "p0-1", 1, true, ok)
	h.at(3).produce("producer-0", "orders", 0, 1, "a", "p0-2", 2, true, ok)
	h.at(4).add(op{Process: "nemesis", Type: invoke, F: history.Nemesis, Fault: "kill", Node: 2})
	h.add(op{Process: "producer-0", Type: invoke, F: history.Produce, Topic: "orders", Key: "a", Value: "p0-3", Seq: 3, Idempotent: true})
	h.at(6).add(op{Process: "producer-0", Type: info, F: history.Produce, Topic: "orders", Key: "a", Value: "p0-3", Seq: 3, Idempotent: true, Error: "timeout"})
	h.at(7).add(op{Process: "producer-0", Type: invoke, F: history.Produce, Topic: "orders", Key: "a", Value: "p0-4", Seq: 4, Idempotent: true})
	h.at(8).add(op{Process: "nemesis", Type: ok, F: history.Nemesis, Fault: "kill", Node: 2})
	h.at(9).add(op{Process: "producer-0", Type: ok, F: history.Produce, Topic: "orders", Partition: 0, Offset: 3, Key: "a", Value: "p0-4", Seq: 4, Idempotent: true})
	h.add(op{Process: "producer-1", Type: invoke, F: history.Produce, Topic: "orders", Value: "p1-1", Seq: 1})
	h.at(10).add(op{Process: "producer-1", Type: fail, F: history.Produce, Topic: "orders", Value: "p1-1", Seq: 1, Error: "rejected"})

	// jobs: group workers dead-letters after 3 deliveries.
	h.at(11).produce("producer-2", "jobs", 0, 0, "", "j-0", 0, true, ok)
	h.produce("producer-2", "jobs", 0, 1, "", "j-1", 1, true, ok)
	h.produce("producer-2", "jobs", 0, 2, "", "j-2", 2, true, ok)
	w := op{Process: "consumer-1", F: history.Consume, Type: ok, Topic: "jobs", Group: "workers", Mode: history.ModeShared, Consumer: "c1", MaxDeliveries: 3}
	del := func(value string, offset int64, attempt int) op {
		o := w
		o.Value, o.Offset, o.Attempt = value, offset, attempt
		return o
	}
	ack := func(f history.F, t history.Type, value string, offset int64) op {
		o := del(value, offset, 0)
		o.F, o.Type, o.MaxDeliveries = f, t, 0
		return o
	}
	h.at(12).add(del("j-0", 0, 1), ack(history.Ack, invoke, "j-0", 0), ack(history.Ack, ok, "j-0", 0))
	for a := 1; a <= 3; a++ {
		h.add(del("j-1", 1, a), ack(history.Nack, invoke, "j-1", 1), ack(history.Nack, ok, "j-1", 1))
	}
	h.at(13).add(op{Process: "dlq-reader", Type: ok, F: history.Consume, Topic: "workers.dlq", Group: "workers", DLQ: true, Value: "j-1"})
	h.add(del("j-2", 2, 1), ack(history.Ack, invoke, "j-2", 2), ack(history.Ack, ok, "j-2", 2))
	cm := func(proc string, t history.Type, offset int64) op {
		return op{Process: proc, Type: t, F: history.Commit, Group: "workers", Topic: "jobs", Offset: offset}
	}
	h.at(14).add(cm("consumer-1", invoke, 1), cm("consumer-1", ok, 1))
	h.add(cm("consumer-2", invoke, 2)) // overlaps the next commit: may complete after it
	h.add(cm("consumer-1", invoke, 3), cm("consumer-1", ok, 3))
	h.add(cm("consumer-2", ok, 2))
	h.add(op{Process: "observer", Type: ok, F: history.Commit, Group: "workers", Topic: "jobs", Offset: 3})

	// A redelivery before the ack, in group g-orders.
	g := op{Type: ok, F: history.Consume, Topic: "orders", Offset: 1, Value: "p0-2", Group: "g-orders", Mode: history.ModeClustering}
	c3, c4 := g, g
	c3.Process, c3.Attempt = "consumer-3", 1
	c4.Process, c4.Attempt = "consumer-4", 2
	a4 := c4
	a4.F = history.Ack
	h.at(15).add(c3, c4, a4)
	// Broadcast: every member gets and acks every message.
	for _, p := range []string{"consumer-5", "consumer-6"} {
		b := op{Process: p, Type: ok, F: history.Consume, Topic: "orders", Offset: 0, Value: "p0-0", Group: "fanout", Mode: history.ModeBroadcast, Consumer: p}
		a := b
		a.F = history.Ack
		h.add(b, a)
	}

	// Delayed messages: d-0 due at 20ms, d-1 at 22ms.
	h.at(16).add(op{Process: "producer-3", Type: invoke, F: history.Produce, Topic: "timers", Value: "d-0", Due: 20e6, Idempotent: true})
	h.add(op{Process: "producer-3", Type: ok, F: history.Produce, Topic: "timers", Value: "d-0", Due: 20e6, Idempotent: true})
	h.add(op{Process: "producer-3", Type: invoke, F: history.Produce, Topic: "timers", Value: "d-1", Due: 22e6, Seq: 1, Idempotent: true})
	h.add(op{Process: "producer-3", Type: ok, F: history.Produce, Topic: "timers", Value: "d-1", Offset: 1, Due: 22e6, Seq: 1, Idempotent: true})
	h.at(21).add(op{Process: "consumer-7", Type: ok, F: history.Consume, Topic: "timers", Value: "d-0", Group: "timers-g"})
	h.at(22).add(op{Process: "consumer-7", Type: ok, F: history.Consume, Topic: "timers", Value: "d-1", Offset: 1, Group: "timers-g"})

	// Request-reply.
	h.at(23).add(op{Process: "requester-0", Type: invoke, F: history.Request, RequestID: "r-0", ReplyTo: "inbox-0"})
	h.add(op{Process: "responder-0", Type: invoke, F: history.Reply, RequestID: "r-0", ReplyTo: "inbox-0"})
	h.at(24).add(op{Process: "requester-0", Type: ok, F: history.Reply, RequestID: "r-0"})
	h.add(op{Process: "requester-0", Type: ok, F: history.Request, RequestID: "r-0", ReplyTo: "inbox-0"})

	// Final reads: node 2 of orders/0 lags; producer-1's p1-0 was written
	// twice (at least once).
	h.at(30)
	for n := 1; n <= 3; n++ {
		if n == 2 {
			h.read("orders", 0, n, "p0-0", "p0-2")
		} else {
			h.read("orders", 0, n, "p0-0", "p0-2", "p0-3", "p0-4")
		}
		h.read("orders", 1, n, "p1-0", "p0-1", "p1-0")
		h.read("jobs", 0, n, "j-0", "j-1", "j-2")
		h.read("timers", 0, n, "d-0", "d-1")
	}
	return h
}

// violations lists the sections that must be zero unless named.
func violations(r Report) map[string]int {
	m := map[string]int{}
	for _, s := range r.Sections {
		if s.Count > 0 {
			m[s.Name] = s.Count
		}
	}
	return m
}

func TestCleanHistoryPasses(t *testing.T) {
	r := Check(clean().ops, Options{Drained: true})
	if !r.Valid() {
		t.Fatalf("clean history flagged:\n%s", r)
	}
	want := map[string]int{DuplicatedAtLeastOnce: 1}
	if got := violations(r); !equalCounts(got, want) {
		t.Fatalf("counts %v, want %v\n%s", got, want, r)
	}
	for name, checked := range map[string]int{
		Lost: 10, Duplicated: 10, Diverged: 32, OrderProducer: 7, OrderKey: 4, // the two delayed messages are not order-checked OrderUnpromised: 1,
		CommitBackwards: 4, AckedRedelivered: 10, Early: 2, DLQBoth: 3, DLQNeither: 3, ReplyTwice: 1, ReplyMisrouted: 1,
	} {
		if got := r.Section(name).Checked; got != checked {
			t.Errorf("%s checked %d, want %d", name, got, checked)
		}
	}
	if r.Delay.Delivered != 2 || r.Delay.P50 != 0 || r.Delay.Max != time.Millisecond {
		t.Errorf("delay %+v, want 2 delivered, p50 0, max 1ms", r.Delay)
	}
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
