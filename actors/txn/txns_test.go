package txn

import (
	"slices"
	"strings"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// The session state machine, applied from events as a load would: epochs
// move at every end, and checkEpoch tells a fenced zombie, a request of
// the transaction that just ended (and how it ended), and one of a
// transaction long gone apart.
func TestTxnEpochs(t *testing.T) {
	st := newState()
	off := uint64(0)
	apply := func(ev *heraldpb.TxnEvent) {
		st.applyTxn(off, ev, 1000)
		off++
	}
	apply(&heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Init{Init: &heraldpb.TxnInit{TransactionalId: "a", ProducerId: 7, Epoch: 0, TimeoutMs: 1000}}})
	m := st.txns["a"]
	data := func(seq int64) *heraldpb.TxnEvent {
		return &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Data{Data: &heraldpb.TxnData{TransactionalId: "a", Epoch: m.epoch, Topic: "t", BaseSequence: seq, Count: 2, Records: []byte{1, 2}}}}
	}
	apply(data(0))
	apply(data(2))
	if m.state != txnOpen || len(m.staged) != 2 || m.nextSeq != 4 || m.records() != 4 {
		t.Fatalf("after staging: %+v", m)
	}
	// Committed: decided (the epoch moves on, the commit appends as a
	// job), then complete.
	apply(&heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_End{End: &heraldpb.TxnEnd{TransactionalId: "a", Epoch: 0, Commit: true, Token: 5}}})
	if m.state != txnEmpty || m.epoch != 1 || !m.hasLast || !m.lastCommit || m.lastEpoch != 0 || len(m.completing) != 1 ||
		m.completing[0].epoch != 0 || len(m.completing[0].staged) != 2 || m.completing[0].token != 5 {
		t.Fatalf("after the decision: %+v", m)
	}
	// The next transaction stages while the commit appends.
	apply(data(0))
	if is := m.infos(); m.state != txnOpen || len(m.staged) != 1 || len(is) != 2 || is[0].GetState() != "committing" || is[1].GetState() != "open" {
		t.Fatalf("staging behind a commit appending: %+v", m)
	}
	apply(&heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Complete{Complete: &heraldpb.TxnComplete{TransactionalId: "a", Epoch: 0}}})
	if len(m.completing) != 0 || m.epoch != 1 || len(m.staged) != 1 {
		t.Fatalf("after the commit: %+v", m)
	}
	// A delayed data event of epoch 0 is ignored.
	apply(&heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Data{Data: &heraldpb.TxnData{TransactionalId: "a", Epoch: 0, Topic: "t", Count: 1}}})
	if len(m.staged) != 1 {
		t.Fatalf("a stale data event was staged: %+v", m)
	}
	for _, c := range []struct {
		pid   uint64
		epoch uint32
		code  heraldpb.ErrorCode
		ended bool
	}{
		{7, 1, 0, false}, // the open (next) transaction
		{7, 0, 0, true},  // the one that just ended
		{7, 2, heraldpb.ErrorCode_INVALID_TXN_STATE, false},
		{8, 1, heraldpb.ErrorCode_PRODUCER_FENCED, false},
	} {
		e, ended := m.checkEpoch(c.pid, c.epoch)
		if e.GetCode() != c.code || ended != c.ended {
			t.Errorf("pid %d epoch %d: %v ended %v, want %v %v", c.pid, c.epoch, e, ended, c.code, c.ended)
		}
	}
	// Aborted by its timeout: its requests get TXN_TIMED_OUT.
	apply(data(0))
	apply(&heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_End{End: &heraldpb.TxnEnd{TransactionalId: "a", Epoch: 1, By: "timeout"}}})
	if e, _ := m.checkEpoch(7, 1); e.GetCode() != heraldpb.ErrorCode_TXN_TIMED_OUT {
		t.Fatalf("a request of the timed-out transaction: %v", e)
	}
	if e, _ := m.checkEpoch(7, 0); e.GetCode() != heraldpb.ErrorCode_INVALID_TXN_STATE {
		t.Fatalf("a request of a transaction long gone: %v", e)
	}
	// A new session fences every older epoch.
	apply(&heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Init{Init: &heraldpb.TxnInit{TransactionalId: "a", ProducerId: 7, Epoch: 3, SessionEpoch: 3}}})
	if e, _ := m.checkEpoch(7, 2); e.GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
		t.Fatalf("the old session's epoch after a new session: %v", e)
	}
	// Compaction's snapshot keeps the session apart from the epoch.
	m.epoch = 5
	snap := m.snapshotEvent()
	st2 := newState()
	st2.applyTxn(0, snap, 0)
	if m2 := st2.txns["a"]; m2.session != 3 || m2.epoch != 5 || m2.pid != 7 {
		t.Fatalf("snapshot applied: %+v", m2)
	}
}

// Compaction, as the review found it: an idle id whose session record is
// below the cut while its TxnComplete is above it must be written again
// (a replay from the cut would not know it, and would ignore a later
// decision of it). Another id's open transaction pins the cut between.
func TestCompactionRewritesIdleSessions(t *testing.T) {
	st := newState()
	ev := func(e *heraldpb.TxnEvent) *heraldpb.TxnEvent { return e }
	seq := []*heraldpb.TxnEvent{
		ev(&heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Init{Init: &heraldpb.TxnInit{TransactionalId: "a", ProducerId: 1, UsedMs: 1000}}}),              // 0
		ev(&heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Data{Data: &heraldpb.TxnData{TransactionalId: "a", Topic: "t", Count: 1, Records: []byte{1}}}}), // 1
		ev(&heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_End{End: &heraldpb.TxnEnd{TransactionalId: "a", Commit: true, Token: 9}}}),                      // 2
		ev(&heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Init{Init: &heraldpb.TxnInit{TransactionalId: "a", ProducerId: 1, Epoch: 1, UsedMs: 1000}}}),    // 3: the snapshot after the end
		ev(&heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Init{Init: &heraldpb.TxnInit{TransactionalId: "b", ProducerId: 2, UsedMs: 1000}}}),              // 4
		ev(&heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Data{Data: &heraldpb.TxnData{TransactionalId: "b", Topic: "t", Count: 1, Records: []byte{2}}}}), // 5
		ev(&heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Complete{Complete: &heraldpb.TxnComplete{TransactionalId: "a"}}}),                               // 6
	}
	for off, e := range seq {
		st.applyTxn(uint64(off), e, 1000)
	}
	a := st.txns["a"]
	if len(a.completing) != 0 || a.sessOff != 3 || a.lastOff != 6 {
		t.Fatalf("a: %+v", a)
	}
	cut := st.compactCut(7)
	if cut != 4 {
		t.Fatalf("cut %d, want 4 (b's session record)", cut)
	}
	if got := st.sessionsBelow(cut, 1000); len(got) != 1 || got[0].id != "a" {
		t.Fatalf("sessions to write again: %v", got)
	}
	if got := st.idleOffsets(7); !slices.Equal(got, []int64{3}) {
		t.Fatalf("idle records: %v, want a's session record at 3", got)
	}
	// While a's commit appends, its decision and session stay too.
	st2 := newState()
	for off, e := range seq[:4] {
		st2.applyTxn(uint64(off), e, 1000)
	}
	if cut := st2.compactCut(4); cut != 0 {
		t.Fatalf("cut %d with a's commit appending, want 0", cut)
	}
}

// The snapshot written with an end carries how it ended: a replay from it
// alone (the end compacted away) answers a repeated EndTxn of that
// transaction as the live coordinator does.
func TestSnapshotAfterEndKeepsTheLastEnd(t *testing.T) {
	st := newState()
	st.applyTxn(0, &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Init{Init: &heraldpb.TxnInit{TransactionalId: "a", ProducerId: 7, Epoch: 4, SessionEpoch: 2}}}, 0)
	m := st.txns["a"]
	for _, c := range []struct {
		commit bool
		by     string
		code   heraldpb.ErrorCode
	}{{true, "producer", 0}, {false, "timeout", heraldpb.ErrorCode_TXN_TIMED_OUT}} {
		snap := m.sessionAfterEnd(c.commit, c.by)
		st2 := newState()
		st2.applyTxn(0, snap, 0)
		m2 := st2.txns["a"]
		if m2.epoch != m.epoch+1 || m2.session != 2 || !m2.hasLast || m2.lastEpoch != m.epoch || m2.lastCommit != c.commit {
			t.Fatalf("replayed from the snapshot: %+v", m2)
		}
		if e, ended := m2.checkEpoch(7, m.epoch); !ended || e.GetCode() != c.code {
			t.Fatalf("a repeated end of epoch %d after a replay: %v ended %v, want %v", m.epoch, e, ended, c.code)
		}
	}
}

// writtenOpen lists a session's transactions written once found open on
// partitions, one an epoch with their partitions and records, and leaves
// out what the coordinator lists itself (being completed or queued) and a
// zombie's (below the session).
func TestWrittenOpenListing(t *testing.T) {
	now := time.Now()
	m := &txnMeta{id: "etl", pid: 9, session: 100, epoch: 104, timeout: time.Minute,
		completing: []*commitJob{{epoch: 102}}, piped: []pipedEnd{{epoch: 103}}}
	open := []openOn{
		{tp: topicPart{"out", 1}, epoch: 104, records: 2, age: time.Second},
		{tp: topicPart{"out", 0}, epoch: 104, records: 3, age: 2 * time.Second},
		{tp: topicPart{"out", 0}, epoch: 105, records: 1, age: 0},
		{tp: topicPart{"out", 0}, epoch: 102, records: 4, age: 3 * time.Second}, // completing
		{tp: topicPart{"out", 1}, epoch: 103, records: 4, age: 3 * time.Second}, // queued
		{tp: topicPart{"out", 1}, epoch: 60, records: 1, age: time.Hour},        // a zombie's
	}
	got := m.writtenOpen(open, now)
	if len(got) != 2 {
		t.Fatalf("listed %v", got)
	}
	a, b := got[0], got[1]
	if a.ProducerEpoch != 104 || a.Records != 5 || strings.Join(a.Partitions, ",") != "out/0,out/1" || a.StartedMs != now.Add(-2*time.Second).UnixMilli() ||
		a.State != "open" || !a.WrittenOnce || a.TimeoutMs != 60000 {
		t.Fatalf("epoch 104 listed as %v", a)
	}
	if b.ProducerEpoch != 105 || b.Records != 1 || strings.Join(b.Partitions, ",") != "out/0" {
		t.Fatalf("epoch 105 listed as %v", b)
	}
	m.state = txnOpen // a staged transaction open: its own listing
	if got := m.writtenOpen(open, now); got != nil {
		t.Fatalf("listed with a staged transaction open: %v", got)
	}
}
