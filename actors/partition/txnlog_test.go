package partition

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
)

// txnBatchFrame is a transactional batch of producer pid's transaction of
// epoch, at sequence seq.
func txnBatchFrame(pid uint64, epoch uint32, seq int64, values ...string) *heraldpb.Frame {
	return &heraldpb.Frame{Id: frameIDs.Add(1), Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "t", Acks: heraldpb.Acks_ACKS_ALL, Records: batchOf(values...), ProducerId: pid, ProducerEpoch: epoch, BaseSequence: seq, TxnBatch: true,
	}}}
}

// markerFrame ends producer pid's transaction of epoch: commit (with the
// records it wrote here) or abort.
func markerFrame(pid uint64, epoch uint32, commit bool, records uint32) *heraldpb.Frame {
	m := heraldpb.TxnMarker_TXN_MARKER_ABORT
	if commit {
		m = heraldpb.TxnMarker_TXN_MARKER_COMMIT
	}
	return &heraldpb.Frame{Id: frameIDs.Add(1), Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "t", Acks: heraldpb.Acks_ACKS_ALL, ProducerId: pid, ProducerEpoch: epoch, TxnMarker: m, TxnRecords: records,
	}}}
}

// mustCommit checks a commit marker's answer: its records at base.
func mustCommit(t *testing.T, f *heraldpb.Frame, base int64, count uint32, dup bool) {
	t.Helper()
	r := f.GetProduceResponse()
	if r == nil || r.BaseOffset != base || r.Count != count || r.Duplicate != dup {
		t.Fatalf("commit answered %v; want %d records at %d (duplicate %v)", f, count, base, dup)
	}
}

// Transactional batches are written once and read by nobody until their
// commit marker gives them offsets, after the records committed before
// the marker; an abort drops them. Retries are answered as duplicates, a
// gap in sequences is refused, a marker ends only its own epoch (a late
// batch or a replayed marker of an ended epoch changes nothing), and a
// commit waits for as many records as its coordinator counted.
func TestTxnBatchesWrittenOnce(t *testing.T) {
	sys := actor.NewActorSystem()
	DeleteMetrics("txn-once", 0)
	ip := &idemPartition{t: t, sys: sys, topic: "txn-once", dir: t.TempDir()}
	ip.start()
	defer func() { ip.stop() }()
	const all = heraldpb.Acks_ACKS_ALL
	hw := func(want int64) {
		t.Helper()
		checkFor(t, 5*time.Second, fmt.Sprintf("hw %d", want), func() bool { return ip.stats.HighWatermark.Load() == want })
	}

	mustProduce(t, ip.ask(produceFrame("t", all, "p0")), 0, false)
	mustProduce(t, ip.ask(txnBatchFrame(7, 1, 0, "a", "b")), -1, false)
	mustProduce(t, ip.ask(txnBatchFrame(7, 1, 0, "a", "b")), -1, true) // a retry
	mustFail(t, ip.ask(txnBatchFrame(7, 1, 5, "z")), heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE)
	mustProduce(t, ip.ask(txnBatchFrame(8, 4, 0, "x")), -1, false) // another producer's, aborted below
	mustProduce(t, ip.ask(produceFrame("t", all, "p1")), 1, false)
	mustProduce(t, ip.ask(txnBatchFrame(7, 1, 2, "c")), -1, false)
	hw(2)
	if got := readAll(t, sys, ip.pid, 2); fmt.Sprint(got) != "[p0 p1]" {
		t.Fatalf("before the commit the log reads %v", got)
	}
	if n := ip.stats.HighWatermark.Load(); n != 2 {
		t.Fatalf("hw %d with two transactions open", n)
	}

	// The coordinator counted more records than are here: not yet.
	if e := mustFail(t, ip.ask(markerFrame(7, 1, true, 4)), heraldpb.ErrorCode_THROTTLED); !e.Retriable {
		t.Fatalf("a commit waiting for records is not retriable: %v", e)
	}
	mustFail(t, ip.ask(markerFrame(7, 1, true, 2)), heraldpb.ErrorCode_INVALID_TXN_STATE)
	mustCommit(t, ip.ask(markerFrame(7, 1, true, 3)), 2, 3, false)
	mustCommit(t, ip.ask(markerFrame(7, 1, true, 3)), 2, 3, true) // replayed
	mustFail(t, ip.ask(markerFrame(7, 1, false, 0)), heraldpb.ErrorCode_INVALID_TXN_STATE)
	mustFail(t, ip.ask(txnBatchFrame(7, 1, 3, "late")), heraldpb.ErrorCode_INVALID_TXN_STATE)
	mustProduce(t, ip.ask(markerFrame(8, 4, false, 0)), -1, false)
	mustProduce(t, ip.ask(markerFrame(8, 3, false, 0)), -1, true) // an earlier epoch's, delayed
	mustFail(t, ip.ask(txnBatchFrame(8, 4, 1, "late")), heraldpb.ErrorCode_INVALID_TXN_STATE)
	mustProduce(t, ip.ask(produceFrame("t", all, "p2")), 5, false)
	// The producer's next transaction: its own epoch, sequences from 0.
	mustProduce(t, ip.ask(txnBatchFrame(7, 2, 0, "d")), -1, false)
	mustCommit(t, ip.ask(markerFrame(7, 2, true, 1)), 6, 1, false)
	// A commit of nothing written here ends the epoch all the same.
	mustProduce(t, ip.ask(markerFrame(9, 1, true, 0)), -1, false)
	mustFail(t, ip.ask(txnBatchFrame(9, 1, 0, "late")), heraldpb.ErrorCode_INVALID_TXN_STATE)
	hw(7)
	want := "[p0 p1 a b c p2 d]"
	if got := readAll(t, sys, ip.pid, 7); fmt.Sprint(got) != want {
		t.Fatalf("the log reads %v, want %v", got, want)
	}
	// After a restart the window is empty: the reads come from the log,
	// which expands the markers.
	ip.stop()
	ip.start()
	hw(7)
	if got := readAll(t, sys, ip.pid, 7); fmt.Sprint(got) != want {
		t.Fatalf("after a restart the log reads %v, want %v", got, want)
	}
	mustProduce(t, ip.ask(produceFrame("t", all, "p3")), 7, false)
}

// Open transactions outlive a restart: from the transaction state file's
// floor, or from the whole log without it. Their batches stay unreadable
// until the commit, which then reads them from the log.
func TestTxnOpenSurvivesRestart(t *testing.T) {
	for _, withFile := range []bool{true, false} {
		t.Run(fmt.Sprintf("state file %v", withFile), func(t *testing.T) {
			sys := actor.NewActorSystem()
			ip := &idemPartition{t: t, sys: sys, topic: "txn-restart", dir: t.TempDir()}
			ip.start()
			defer func() { ip.stop() }()
			const all = heraldpb.Acks_ACKS_ALL
			mustProduce(t, ip.ask(produceFrame("t", all, "p0")), 0, false)
			mustProduce(t, ip.ask(txnBatchFrame(7, 1, 0, "a")), -1, false)
			mustProduce(t, ip.ask(produceFrame("t", all, "p1")), 1, false)
			mustProduce(t, ip.ask(txnBatchFrame(8, 1, 0, "gone")), -1, false)
			mustProduce(t, ip.ask(markerFrame(8, 1, false, 0)), -1, false)
			mustProduce(t, ip.ask(txnBatchFrame(7, 1, 1, "b")), -1, false)
			ip.stop()
			path := ip.statePath() + ".txn"
			if _, err := os.Stat(path); err != nil {
				t.Fatalf("no transaction state file after a stop: %v", err)
			}
			if !withFile {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
			}
			ip.start()
			mustProduce(t, ip.ask(txnBatchFrame(7, 1, 1, "b")), -1, true) // still known
			mustFail(t, ip.ask(txnBatchFrame(8, 1, 1, "late")), heraldpb.ErrorCode_INVALID_TXN_STATE)
			mustProduce(t, ip.ask(txnBatchFrame(7, 1, 2, "c")), -1, false)
			mustCommit(t, ip.ask(markerFrame(7, 1, true, 3)), 2, 3, false)
			checkFor(t, 5*time.Second, "hw 5", func() bool { return ip.stats.HighWatermark.Load() == 5 })
			if got := readAll(t, sys, ip.pid, 5); fmt.Sprint(got) != "[p0 p1 a b c]" {
				t.Fatalf("the log reads %v", got)
			}
			// How the transactions ended outlives a restart too (from the
			// file, or from the log): a replayed marker is answered as
			// before, a late retry of a batch is refused, never opened
			// again (a second commit would show its records twice).
			ip.stop()
			if !withFile {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				// and the idempotent table, rebuilt from the log, takes no
				// marker for a batch
				if err := os.Remove(ip.statePath()); err != nil {
					t.Fatal(err)
				}
			}
			ip.start()
			mustCommit(t, askRetrying(t, sys, ip.self, ip.in, func() *heraldpb.Frame { return markerFrame(7, 1, true, 3) }), 2, 3, true)
			mustProduce(t, ip.ask(markerFrame(8, 1, false, 0)), -1, true)
			mustFail(t, ip.ask(txnBatchFrame(7, 1, 0, "a")), heraldpb.ErrorCode_INVALID_TXN_STATE)
			mustFail(t, ip.ask(txnBatchFrame(8, 1, 0, "gone")), heraldpb.ErrorCode_INVALID_TXN_STATE)
			mustProduce(t, ip.ask(idemFrame(7, 0, all, "i")), 5, false)
		})
	}
}

// Retention never removes an open transaction's batches: the log's front
// stops before the oldest, and the commit that comes after retention ran
// reads every record.
func TestRetentionKeepsOpenTxnBatches(t *testing.T) {
	sys := actor.NewActorSystem()
	reps := spawnGroupWith(t, sys, 1, func(_ *replica, cfg *Config) {
		cfg.RetentionBytes = 1
		cfg.RetentionCheck = 20 * time.Millisecond
	})
	p := reps[0]
	in := newInbox(sys)
	checkFor(t, 10*time.Second, "leader", func() bool { return p.stats.Idempotent.Load() })
	askT := func(f *heraldpb.Frame) *heraldpb.Frame { t.Helper(); return ask(t, sys, p.pid, in, f) }
	mustProduce(t, askT(produceFrame("t", heraldpb.Acks_ACKS_ALL, "old")), 0, false)
	mustProduce(t, askT(txnBatchFrame(7, 1, 0, "kept")), -1, false)
	for i := 0; i < 20; i++ {
		mustProduce(t, askT(produceFrame("t", heraldpb.Acks_ACKS_ALL, fmt.Sprintf("p%d", i))), int64(1+i), false)
	}
	// Retention (1 byte) would remove every applied entry in one pass; it
	// stops before the open batch, after the record before it.
	checkFor(t, 10*time.Second, "retention removes the record before the open batch", func() bool { return p.stats.StartOffset.Load() >= 1 })
	if s := p.stats.StartOffset.Load(); s != 1 {
		t.Fatalf("retention moved the log's start to %d, past the open batch", s)
	}
	mustCommit(t, askT(markerFrame(7, 1, true, 1)), 21, 1, false)
	checkFor(t, 10*time.Second, "hw 22", func() bool { return p.stats.HighWatermark.Load() == 22 })
	f := askT(fetchFrame("t", 21, 0))
	if bs := f.GetFetchResponse().GetBatches(); len(bs) != 1 || bs[0].BaseOffset != 21 || bs[0].Count != 1 {
		t.Fatalf("the committed record reads %v", f)
	}
	checkFor(t, 10*time.Second, "retention passes the committed transaction", func() bool { return p.stats.StartOffset.Load() >= 21 })
}

// txnGroup starts a group of n replicas and its leader, with an inbox and
// askRetry, which asks a replica until it can answer (not while it is
// electing or applying).
func txnGroup(t *testing.T, n int) (*actor.ActorSystem, []*replica, map[uint64]bool, *replica, *inbox, func(*replica, func() *heraldpb.Frame) *heraldpb.Frame) {
	sys := actor.NewActorSystem()
	reps := spawnGroup(t, sys, n)
	live := map[uint64]bool{}
	for _, r := range reps {
		live[r.id] = true
	}
	leader := leaderOf(t, reps, live)
	in := newInbox(sys)
	askRetry := func(to *replica, mk func() *heraldpb.Frame) *heraldpb.Frame {
		t.Helper()
		return askRetrying(t, sys, func() *actor.PID { return to.pid }, in, mk)
	}
	return sys, reps, live, leader, in, askRetry
}

// In a replicated group every replica holds the open transactions as it
// applies the log: after the leader is lost, the new leader knows the
// batches written before (a retry is a duplicate, a late batch of an ended
// epoch is refused) and commits them; every live replica then reads the
// same records at the same offsets.
func TestTxnAcrossLeaderLoss(t *testing.T) {
	sys, reps, live, leader, in, askRetry := txnGroup(t, 3)
	produceRetrying(t, sys, leader.pid, in, heraldpb.Acks_ACKS_ALL, "p0")
	mustProduce(t, askRetry(leader, func() *heraldpb.Frame { return txnBatchFrame(7, 1, 0, "a", "b") }), -1, false)
	mustProduce(t, askRetry(leader, func() *heraldpb.Frame { return txnBatchFrame(8, 1, 0, "x") }), -1, false)
	mustProduce(t, askRetry(leader, func() *heraldpb.Frame { return markerFrame(8, 1, false, 0) }), -1, false)

	sys.Root.StopFuture(leader.pid).Wait()
	delete(live, leader.id)
	next := leaderOf(t, reps, live)
	mustProduce(t, askRetry(next, func() *heraldpb.Frame { return txnBatchFrame(7, 1, 0, "a", "b") }), -1, true)
	mustFail(t, askRetry(next, func() *heraldpb.Frame { return txnBatchFrame(8, 1, 1, "late") }), heraldpb.ErrorCode_INVALID_TXN_STATE)
	mustProduce(t, askRetry(next, func() *heraldpb.Frame { return txnBatchFrame(7, 1, 2, "c") }), -1, false)
	produceRetrying(t, sys, next.pid, in, heraldpb.Acks_ACKS_ALL, "p1")
	mustCommit(t, askRetry(next, func() *heraldpb.Frame { return markerFrame(7, 1, true, 3) }), 2, 3, false)
	for _, r := range reps {
		if !live[r.id] {
			continue
		}
		checkFor(t, 10*time.Second, "replica has every record", func() bool { return r.stats.HighWatermark.Load() == 5 })
		if got := readAll(t, sys, r.pid, 5); fmt.Sprint(got) != "[p0 p1 a b c]" {
			t.Fatalf("replica %d reads %v", r.id, got)
		}
	}
}

// FuzzDecodeTxnState: the transaction state file's decoder never panics,
// and what it accepts encodes back to a file that decodes the same
// (testdata/fuzz/FuzzDecodeTxnState).
func FuzzDecodeTxnState(f *testing.F) {
	b, _ := encodeTxnState([]txnFloor{{3, 10}, {12, 40}}, []*heraldpb.TxnEnded{{ProducerId: 7, Epoch: 2, Committed: true, BaseOffset: 5, Count: 3}},
		[]*heraldpb.TxnSessionFence{{ProducerId: 7, Epoch: 40}, {ProducerId: 9, Epoch: 3}})
	f.Add(b)
	f.Add([]byte("HTXN"))
	f.Fuzz(func(t *testing.T, b []byte) {
		floors, ended, fences, err := decodeTxnState(b)
		if err != nil {
			return
		}
		again, err := encodeTxnState(floors, ended, fences)
		if err != nil {
			t.Fatal(err)
		}
		floors2, ended2, fences2, err := decodeTxnState(again)
		if err != nil || !slices.Equal(floors, floors2) || len(ended) != len(ended2) || len(fences) != len(fences2) {
			t.Fatalf("%x decodes to %v %v %v, which encodes to a file that decodes to %v %v %v (%v)", b, floors, ended, fences, floors2, ended2, fences2, err)
		}
	})
}

// The coordinator's view of what is open: each open transaction with its
// records, oldest first, none once ended; an age filter leaves out the
// younger ones.
func TestListOpenTxns(t *testing.T) {
	sys := actor.NewActorSystem()
	ip := &idemPartition{t: t, sys: sys, topic: "txn-list", dir: t.TempDir()}
	ip.start()
	defer ip.stop()
	list := func(olderThanMs uint32) []*heraldpb.OpenTxn {
		t.Helper()
		f := ip.ask(&heraldpb.Frame{Id: frameIDs.Add(1), Body: &heraldpb.Frame_ListOpenTxns{ListOpenTxns: &heraldpb.ListOpenTxnsRequest{Topic: "t", OlderThanMs: olderThanMs}}})
		if f.GetListOpenTxnsResponse() == nil {
			t.Fatalf("list: %v", f)
		}
		return f.GetListOpenTxnsResponse().Txns
	}
	mustProduce(t, ip.ask(txnBatchFrame(7, 1, 0, "a", "b")), -1, false)
	mustProduce(t, ip.ask(txnBatchFrame(9, 3, 0, "c")), -1, false)
	got := list(0)
	if len(got) != 2 || got[0].ProducerId != 7 || got[0].Epoch != 1 || got[0].Records != 2 || got[1].ProducerId != 9 || got[1].Records != 1 {
		t.Fatalf("open: %v", got)
	}
	if got := list(1 << 30); len(got) != 0 {
		t.Fatalf("open for 12 days: %v", got)
	}
	mustCommit(t, ip.ask(markerFrame(7, 1, true, 2)), 0, 2, false)
	mustProduce(t, ip.ask(markerFrame(9, 3, false, 0)), -1, false)
	if got := list(0); len(got) != 0 {
		t.Fatalf("open after their ends: %v", got)
	}
}

// A producer's commits keep their order on a partition: a commit marker
// waits (THROTTLED) while an earlier transaction of the producer is open
// there without its marker; an abort does not.
func TestTxnCommitsInEpochOrder(t *testing.T) {
	sys := actor.NewActorSystem()
	ip := &idemPartition{t: t, sys: sys, topic: "txn-order", dir: t.TempDir()}
	ip.start()
	defer ip.stop()
	mustProduce(t, ip.ask(txnBatchFrame(7, 1, 0, "a")), -1, false)
	mustProduce(t, ip.ask(txnBatchFrame(7, 2, 0, "b")), -1, false)
	mustProduce(t, ip.ask(txnBatchFrame(7, 3, 0, "c")), -1, false)
	mustFail(t, ip.ask(markerFrame(7, 2, true, 1)), heraldpb.ErrorCode_THROTTLED)
	mustCommit(t, ip.ask(markerFrame(7, 1, true, 1)), 0, 1, false)
	mustCommit(t, ip.ask(markerFrame(7, 2, true, 1)), 1, 1, false)
	mustProduce(t, ip.ask(markerFrame(7, 3, false, 0)), -1, false)
	checkFor(t, 5*time.Second, "hw 2", func() bool { return ip.stats.HighWatermark.Load() == 2 })
	if got := readAll(t, sys, ip.pid, 2); fmt.Sprint(got) != "[a b]" {
		t.Fatalf("the log reads %v", got)
	}
}

// Markers that reach the partition together are written as one entry
// (LogEntry.txn_markers): each commit's records take the next offsets in
// the order the markers came, an abort's are dropped, each marker is
// answered with its own records, and a plain batch that came after them
// follows their records. After a restart (the log read again) the ends
// are known: replays are answered as before.
func TestTxnMarkersTogether(t *testing.T) {
	sys := actor.NewActorSystem()
	dir := t.TempDir()
	ip := &idemPartition{t: t, sys: sys, topic: "txn-together", dir: dir}
	ip.start()
	defer func() { ip.stop() }()
	const all = heraldpb.Acks_ACKS_ALL
	mustProduce(t, ip.ask(produceFrame("t", all, "p0")), 0, false)
	mustProduce(t, ip.ask(txnBatchFrame(7, 1, 0, "a", "b")), -1, false)
	mustProduce(t, ip.ask(txnBatchFrame(8, 1, 0, "x")), -1, false)
	mustProduce(t, ip.ask(txnBatchFrame(9, 1, 0, "y")), -1, false)
	mustProduce(t, ip.ask(txnBatchFrame(9, 1, 1, "z")), -1, false)
	mustProduce(t, ip.ask(txnBatchFrame(10, 1, 0, "w")), -1, false)

	// Held in the mailbox until all are there: they reach the actor together.
	proc, ok := sys.ProcessRegistry.Get(ip.pid)
	if !ok {
		t.Fatal("no partition process")
	}
	proc.SendSystemMessage(ip.pid, &actor.SuspendMailbox{})
	frames := []*heraldpb.Frame{markerFrame(9, 1, true, 2), markerFrame(10, 1, false, 0), markerFrame(7, 1, true, 2), markerFrame(8, 1, true, 1),
		produceFrame("t", all, "p1")}
	for _, f := range frames {
		sys.Root.RequestWithCustomSender(ip.pid, f, ip.in.pid)
	}
	proc.SendSystemMessage(ip.pid, &actor.ResumeMailbox{})
	got := map[uint64]*heraldpb.Frame{}
	for range frames {
		f := ip.in.next(t)
		got[f.Id] = f
	}
	mustCommit(t, got[frames[0].Id], 1, 2, false)
	mustProduce(t, got[frames[1].Id], -1, false)
	mustCommit(t, got[frames[2].Id], 3, 2, false)
	mustCommit(t, got[frames[3].Id], 5, 1, false)
	mustProduce(t, got[frames[4].Id], 6, false)
	want := "[p0 y z a b x p1]"
	checkFor(t, 5*time.Second, "hw 7", func() bool { return ip.stats.HighWatermark.Load() == 7 })
	if got := readAll(t, sys, ip.pid, 7); fmt.Sprint(got) != want {
		t.Fatalf("the log reads %v, want %v", got, want)
	}

	ip.stop()
	// One marker entry holds the four ends, in the order they came.
	log, err := persistence.Open(persistence.Options{Dir: dir, Group: "t-0"})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := log.FirstIndex()
	last, _ := log.LastIndex()
	ents, err := log.Entries(first, last+1, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	var markers [][]heraldpb.MarkerItem
	for _, e := range ents {
		if h, _, err := heraldpb.ScanLogEntry(e.Data); err == nil && len(e.Data) > 0 && h.TxnMarker != heraldpb.TxnMarker_TXN_MARKER_NONE {
			markers = append(markers, h.Markers())
		}
	}
	_ = log.Close()
	if len(markers) != 1 || len(markers[0]) != 4 || markers[0][0].ProducerID != 9 || markers[0][1].ProducerID != 10 || markers[0][3].ProducerID != 8 {
		t.Fatalf("marker entries %+v; want one of 4, in the order they came", markers)
	}

	ip.start()
	checkFor(t, 5*time.Second, "hw 7 after a restart", func() bool { return ip.stats.HighWatermark.Load() == 7 })
	if got := readAll(t, sys, ip.pid, 7); fmt.Sprint(got) != want {
		t.Fatalf("after a restart the log reads %v, want %v", got, want)
	}
	mustCommit(t, askRetrying(t, sys, ip.self, ip.in, func() *heraldpb.Frame { return markerFrame(7, 1, true, 2) }), 3, 2, true)
	mustCommit(t, ip.ask(markerFrame(8, 1, true, 1)), 5, 1, true)
	mustProduce(t, ip.ask(markerFrame(10, 1, false, 0)), -1, true)
	mustFail(t, ip.ask(txnBatchFrame(9, 1, 2, "late")), heraldpb.ErrorCode_INVALID_TXN_STATE)
	mustProduce(t, ip.ask(produceFrame("t", all, "p2")), 7, false)
}
