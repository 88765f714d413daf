// Each kind of violation added to the clean history, flagged alone.

package checker

import (
	"testing"
	"time"

	"github.com/heraldmq/herald/chaos/history"
)

// TestViolations feeds the clean history with one kind of violation added
// and checks that it is flagged, with the count expected, and nothing else.
func TestViolations(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  Options
		edit  func(h *hist)
		want  map[string]int // sections with findings besides clean()'s informational one
		valid bool
		// undrained: the run did not drain (Options.Drained is set otherwise)
		undrained bool
	}{
		{name: "acknowledged record lost", edit: func(h *hist) {
			h.setRecords("orders", 0, "p0-0", "p0-2", "p0-3")
		}, want: map[string]int{Lost: 1}},
		{name: "lost from the leader, kept by a lagging follower", edit: func(h *hist) {
			for _, r := range h.reads("orders", 0) {
				if r.Node != 2 {
					r.Records = []history.Record{{Offset: 0, Value: "p0-0"}, {Offset: 1, Value: "p0-2"}, {Offset: 2, Value: "p0-3"}}
				}
			}
		}, want: map[string]int{Lost: 1}},
		{name: "record nobody sent", edit: func(h *hist) {
			h.setRecords("timers", 0, "d-0", "d-1", "zz-9")
		}, want: map[string]int{Unknown: 1}},
		{name: "failed produce visible", edit: func(h *hist) {
			h.setRecords("orders", 1, "p1-0", "p0-1", "p1-0", "p1-1")
		}, want: map[string]int{FailedVisible: 1}},
		{name: "idempotent record stored twice", edit: func(h *hist) {
			h.setRecords("jobs", 0, "j-0", "j-1", "j-2", "j-1")
		}, want: map[string]int{Duplicated: 1}},
		{name: "idempotent record stored in two partitions", edit: func(h *hist) {
			h.setRecords("timers", 0, "d-0", "d-1", "j-2")
		}, want: map[string]int{Duplicated: 1}},
		{name: "replicas swap two records", edit: func(h *hist) {
			h.reads("orders", 0)[2].Records[2].Value, h.reads("orders", 0)[2].Records[3].Value = "p0-4", "p0-3"
		}, want: map[string]int{Diverged: 2}}, // nodes 1 and 3 at offsets 2 and 3; node 2's read ends before
		{name: "replica with a hole", edit: func(h *hist) {
			r := h.reads("orders", 0)[1] // node 2
			r.Records = []history.Record{{Offset: 0, Value: "p0-0"}, {Offset: 2, Value: "p0-3"}}
		}, want: map[string]int{Diverged: 2}}, // offset 1 against nodes 1 and 3
		{name: "idempotent keyed records reordered", edit: func(h *hist) {
			h.setRecords("orders", 0, "p0-2", "p0-0", "p0-3", "p0-4")
		}, want: map[string]int{OrderProducer: 1, OrderKey: 1}},
		{name: "idempotent unkeyed records reordered", edit: func(h *hist) {
			h.setRecords("jobs", 0, "j-0", "j-2", "j-1")
		}, want: map[string]int{OrderProducer: 1}},
		{name: "delayed messages appended in due order, not send order", edit: func(h *hist) {
			for i, v := range []string{"late-0", "late-1"} {
				o := op{Process: "delayed-9", Type: invoke, F: history.Produce, Topic: "orders", Value: v, Seq: int64(i), Idempotent: true, Due: int64(10-i) * int64(time.Second)}
				h.at(int64(20 + i)).add(o)
				o.Type, o.Offset = ok, -1
				h.add(o)
			}
			var vals []string
			for _, rec := range h.reads("orders", 0)[0].Records {
				vals = append(vals, rec.Value)
			}
			h.setRecords("orders", 0, append(vals, "late-1", "late-0")...)
		}, valid: true},
		{name: "non-idempotent unkeyed records reordered: informational", edit: func(h *hist) {
			h.at(12).produce("producer-1", "orders", 1, 3, "", "p1-2", 2, false, ok)
			h.setRecords("orders", 1, "p1-2", "p1-0", "p0-1", "p1-0")
		}, want: map[string]int{OrderUnpromised: 1}, valid: true},
		{name: "group progress back", edit: func(h *hist) {
			h.at(17).add(op{Process: "consumer-2", Type: invoke, F: history.Commit, Group: "workers", Topic: "jobs", Offset: 2},
				op{Process: "consumer-2", Type: ok, F: history.Commit, Group: "workers", Topic: "jobs", Offset: 2})
		}, want: map[string]int{CommitBackwards: 1}},
		{name: "observed progress back", edit: func(h *hist) {
			h.at(17).add(op{Process: "observer", Type: ok, F: history.Commit, Group: "workers", Topic: "jobs", Offset: 0})
		}, want: map[string]int{CommitBackwards: 1}},
		{name: "delivered after an acknowledged ack", edit: func(h *hist) {
			h.at(17).add(op{Process: "consumer-4", Type: ok, F: history.Consume, Topic: "jobs", Offset: 2, Value: "j-2", Group: "workers", Attempt: 2})
		}, want: map[string]int{AckedRedelivered: 1}},
		{name: "delivered within AckSettle of the ack", opts: Options{AckSettle: 5 * time.Millisecond}, edit: func(h *hist) {
			h.at(17).add(op{Process: "consumer-4", Type: ok, F: history.Consume, Topic: "jobs", Offset: 2, Value: "j-2", Group: "workers", Attempt: 2})
		}, valid: true},
		{name: "pull fetch invoked before the ack, delivered after", edit: func(h *hist) {
			h.before(func(o op) bool { return o.F == history.Ack && o.Value == "j-0" },
				op{Process: "consumer-9", Type: invoke, F: history.Consume, Topic: "jobs", Group: "workers"})
			h.at(17).add(op{Process: "consumer-9", Type: ok, F: history.Consume, Topic: "jobs", Offset: 0, Value: "j-0", Group: "workers", Attempt: 2})
		}, valid: true},
		{name: "key-shared: a later message of a key first delivered before an earlier one", edit: func(h *hist) {
			h.at(17).add(op{Process: "consumer-5", Type: ok, F: history.Consume, Topic: "orders", Offset: 3, Key: "k", Value: "p0-3", Group: "keys", Mode: history.ModeKeyShared, Attempt: 1},
				op{Process: "consumer-6", Type: ok, F: history.Consume, Topic: "orders", Offset: 2, Key: "k", Value: "p0-2", Group: "keys", Mode: history.ModeKeyShared, Attempt: 1},
				// a redelivery of offset 2 after 3 is fine
				op{Process: "consumer-6", Type: ok, F: history.Consume, Topic: "orders", Offset: 2, Key: "k", Value: "p0-2", Group: "keys", Mode: history.ModeKeyShared, Attempt: 2})
		}, want: map[string]int{OrderKeyShared: 1}},
		{name: "key-shared: other keys and redeliveries in any order", edit: func(h *hist) {
			h.at(17).add(op{Process: "consumer-5", Type: ok, F: history.Consume, Topic: "orders", Offset: 3, Key: "k", Value: "p0-3", Group: "keys", Mode: history.ModeKeyShared, Attempt: 1},
				op{Process: "consumer-6", Type: ok, F: history.Consume, Topic: "orders", Offset: 2, Key: "j", Value: "p0-2", Group: "keys", Mode: history.ModeKeyShared, Attempt: 1},
				op{Process: "consumer-6", Type: ok, F: history.Consume, Topic: "orders", Offset: 4, Key: "k", Value: "p0-4", Group: "keys", Mode: history.ModeKeyShared, Attempt: 1},
				op{Process: "consumer-5", Type: ok, F: history.Consume, Topic: "orders", Offset: 3, Key: "k", Value: "p0-3", Group: "keys", Mode: history.ModeKeyShared, Attempt: 2})
		}, valid: true},
		{name: "delayed message early", edit: func(h *hist) {
			h.at(21).add(op{Process: "consumer-8", Type: ok, F: history.Consume, Topic: "timers", Value: "d-1", Offset: 1, Group: "other"})
		}, want: map[string]int{Early: 1}},
		{name: "delayed message early within the tolerance", opts: Options{EarlyTolerance: time.Millisecond}, edit: func(h *hist) {
			h.at(21).add(op{Process: "consumer-8", Type: ok, F: history.Consume, Topic: "timers", Value: "d-1", Offset: 1, Group: "other"})
		}, valid: true},
		{name: "acked and dead-lettered", edit: func(h *hist) {
			h.at(17).add(op{Process: "consumer-1", Type: ok, F: history.Ack, Topic: "jobs", Offset: 1, Value: "j-1", Group: "workers"})
		}, want: map[string]int{DLQBoth: 1}},
		{name: "neither acked nor dead-lettered, drained", edit: func(h *hist) {
			h.drop(func(o op) bool { return o.DLQ })
		}, want: map[string]int{DLQNeither: 1}},
		{name: "neither acked nor dead-lettered, not drained", undrained: true, edit: func(h *hist) {
			h.drop(func(o op) bool { return o.DLQ })
		}, want: map[string]int{DLQPending: 1}, valid: true},
		{name: "ack of unknown outcome is neither", edit: func(h *hist) {
			h.drop(func(o op) bool { return o.DLQ })
			h.at(17).add(op{Process: "consumer-1", Type: info, F: history.Ack, Topic: "jobs", Offset: 1, Value: "j-1", Group: "workers"})
		}, valid: true},
		{name: "dead letter read under no group", edit: func(h *hist) {
			for i := range h.ops {
				if h.ops[i].DLQ {
					h.ops[i].Group = ""
				}
			}
		}, valid: true},
		{name: "committed half missing, drained", edit: func(h *hist) {
			h.half("h-1", history.OutcomeCommit, ok).read("halves", 0, 1)
		}, want: map[string]int{HalfLost: 1}},
		{name: "committed half missing, not drained", undrained: true, edit: func(h *hist) {
			h.half("h-1", history.OutcomeCommit, ok).read("halves", 0, 1)
		}, want: map[string]int{HalfUnsettled: 1}, valid: true},
		{name: "rolled-back half visible", edit: func(h *hist) {
			h.half("h-1", history.OutcomeRollback, ok).read("halves", 0, 1, "h-1")
		}, want: map[string]int{HalfAborted: 1}},
		{name: "half appended twice", edit: func(h *hist) {
			h.half("h-1", history.OutcomeCommit, ok).read("halves", 0, 1, "h-1", "h-1")
		}, want: map[string]int{Duplicated: 1}},
		{name: "half whose send failed, visible", edit: func(h *hist) {
			h.half("h-1", history.OutcomeCommit, fail).read("halves", 0, 1, "h-1")
		}, want: map[string]int{FailedVisible: 1}},
		{name: "half of unknown send, committed by its check-back", edit: func(h *hist) {
			h.half("h-1", history.OutcomeCommit, info).read("halves", 0, 1, "h-1")
		}, valid: true},
		{name: "half of unknown send, never stored", edit: func(h *hist) {
			h.half("h-1", history.OutcomeCommit, info).read("halves", 0, 1)
		}, valid: true},
		{name: "committed transaction missing a record", edit: func(h *hist) {
			h.txn("T1", history.OutcomeCommit, ok, "x1", "x2").read("txns", 0, 1, "x1")
		}, want: map[string]int{TxnLost: 1}},
		{name: "aborted transaction visible", edit: func(h *hist) {
			h.txn("T1", history.OutcomeRollback, ok, "x1", "x2").read("txns", 0, 1, "x2")
		}, want: map[string]int{TxnAborted: 1}},
		{name: "unfinished transaction visible", edit: func(h *hist) {
			h.txn("T1", "", ok, "x1").read("txns", 0, 1, "x1")
		}, want: map[string]int{TxnAborted: 1}},
		{name: "transaction of unknown end partly visible", edit: func(h *hist) {
			h.txn("T1", history.OutcomeCommit, info, "x1", "x2").read("txns", 0, 1, "x2")
		}, want: map[string]int{TxnPartial: 1}},
		{name: "transaction of unknown end whole", edit: func(h *hist) {
			h.txn("T1", history.OutcomeCommit, info, "x1", "x2").read("txns", 0, 1, "x2", "x1")
		}, valid: true},
		{name: "transaction of unknown end absent", edit: func(h *hist) {
			h.txn("T1", history.OutcomeCommit, info, "x1", "x2").read("txns", 0, 1)
		}, valid: true},
		{name: "committed transaction's record twice", edit: func(h *hist) {
			h.txn("T1", history.OutcomeCommit, ok, "x1").read("txns", 0, 1, "x1", "x1")
		}, want: map[string]int{Duplicated: 1}},
		{name: "request answered twice", edit: func(h *hist) {
			h.at(25).add(op{Process: "requester-0", Type: ok, F: history.Reply, RequestID: "r-0"})
		}, want: map[string]int{ReplyTwice: 1}},
		{name: "reply to another requester", edit: func(h *hist) {
			h.at(25).add(op{Process: "requester-1", Type: invoke, F: history.Request, RequestID: "r-1"},
				op{Process: "requester-0", Type: ok, F: history.Reply, RequestID: "r-1"})
		}, want: map[string]int{ReplyMisrouted: 1}},
		{name: "reply to a request nobody sent", edit: func(h *hist) {
			h.at(25).add(op{Process: "requester-0", Type: ok, F: history.Reply, RequestID: "r-404"})
		}, want: map[string]int{ReplyMisrouted: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := clean()
			tc.edit(h)
			tc.opts.Drained = !tc.undrained
			r := Check(h.ops, tc.opts)
			want := map[string]int{DuplicatedAtLeastOnce: 1}
			for k, v := range tc.want {
				want[k] = v
			}
			if got := violations(r); !equalCounts(got, want) {
				t.Fatalf("counts %v, want %v\n%s", got, want, r)
			}
			if r.Valid() != tc.valid {
				t.Fatalf("Valid() = %v, want %v\n%s", r.Valid(), tc.valid, r)
			}
			for name := range tc.want {
				if s := r.Section(name); len(s.Examples) == 0 || len(s.Examples[0].Ops) == 0 || s.Examples[0].Detail == "" {
					t.Fatalf("%s: no example with ops: %+v", name, s)
				}
			}
		})
	}
}
