package partition

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// commitBatchFrame is the last batch of producer pid's transaction of
// epoch, which commits it here (commit_txn), after its transaction of
// epoch after (if not nil).
func commitBatchFrame(pid uint64, epoch uint32, seq int64, after *uint32, values ...string) *heraldpb.Frame {
	f := txnBatchFrame(pid, epoch, seq, values...)
	f.GetProduce().CommitTxn, f.GetProduce().TxnCommitAfter = true, after
	return f
}

func epochPtr(e uint32) *uint32 { return &e }

// waitingCommits is the commits alone topic's partition 0 holds waiting.
func waitingCommits(topic string) float64 {
	return testutil.ToFloat64(txnCommitsWaiting.WithLabelValues(topic, "0"))
}

// A transaction that wrote one partition commits there with its last
// batch (commit_txn), without its coordinator: the answer carries its
// records' offsets, a retry is answered the same, and the epoch has ended
// (a late batch, an abort marker are refused). A producer's transactions
// commit on the partition in their order: a commit that names the
// transaction before it here (txn_commit_after) waits until that one has
// arrived and ended, and is refused if that one did not commit. What it
// committed outlives a restart.
func TestTxnCommitAlone(t *testing.T) {
	sys := actor.NewActorSystem()
	DeleteMetrics("txn-alone", 0)
	ip := &idemPartition{t: t, sys: sys, topic: "txn-alone", dir: t.TempDir()}
	ip.start()
	defer func() { ip.stop() }()
	const all = heraldpb.Acks_ACKS_ALL

	mustProduce(t, ip.ask(produceFrame("t", all, "p0")), 0, false)
	mustCommit(t, ip.ask(commitBatchFrame(7, 1, 0, nil, "a", "b")), 1, 2, false)
	mustCommit(t, ip.ask(commitBatchFrame(7, 1, 0, nil, "a", "b")), 1, 2, true) // a retry
	mustFail(t, ip.ask(txnBatchFrame(7, 1, 2, "late")), heraldpb.ErrorCode_INVALID_TXN_STATE)
	mustFail(t, ip.ask(markerFrame(7, 1, false, 0)), heraldpb.ErrorCode_INVALID_TXN_STATE) // (an abort that came too late)

	// Several batches: the last one commits them all.
	mustProduce(t, ip.ask(txnBatchFrame(7, 2, 0, "c")), -1, false)
	mustCommit(t, ip.ask(commitBatchFrame(7, 2, 1, epochPtr(1), "d")), 3, 2, false)

	// Epoch 4 comes before epoch 3, which it names: it waits (parked; a
	// retry joins it), then commits after it. Parked, its batch written,
	// each request's sender is told its bytes are held no more (the
	// session then stops counting them as admitted: epoch 3's commit may
	// come on the same connection).
	parked := newInbox(sys)
	first, retry := commitBatchFrame(7, 4, 0, epochPtr(3), "f"), commitBatchFrame(7, 4, 0, epochPtr(3), "f")
	sys.Root.RequestWithCustomSender(ip.pid, first, parked.pid)
	checkFor(t, 5*time.Second, "the commit of epoch 4 waiting", func() bool { return waitingCommits("txn-alone") == 1 })
	if id := parked.nextDrained(t); id != first.Id {
		t.Fatalf("drained frame %d, want %d", id, first.Id)
	}
	sys.Root.RequestWithCustomSender(ip.pid, retry, parked.pid)
	if id := parked.nextDrained(t); id != retry.Id {
		t.Fatalf("drained frame %d, want the retry's %d", id, retry.Id)
	}
	mustCommit(t, ip.ask(commitBatchFrame(7, 3, 0, epochPtr(2), "e")), 5, 1, false)
	mustCommit(t, parked.next(t), 6, 1, false)
	mustCommit(t, parked.next(t), 6, 1, true)

	// The transaction before it here aborted: the commit is refused.
	mustProduce(t, ip.ask(txnBatchFrame(7, 5, 0, "g")), -1, false)
	mustProduce(t, ip.ask(markerFrame(7, 5, false, 0)), -1, false)
	mustFail(t, ip.ask(commitBatchFrame(7, 6, 0, epochPtr(5), "h")), heraldpb.ErrorCode_INVALID_TXN_STATE)

	// An earlier transaction open here waits for its coordinator's marker.
	mustProduce(t, ip.ask(txnBatchFrame(8, 1, 0, "x")), -1, false)
	sys.Root.RequestWithCustomSender(ip.pid, commitBatchFrame(8, 2, 0, epochPtr(1), "y"), parked.pid)
	checkFor(t, 5*time.Second, "the commit of producer 8's epoch 2 waiting", func() bool { return waitingCommits("txn-alone") == 1 })
	mustCommit(t, ip.ask(markerFrame(8, 1, true, 1)), 7, 1, false)
	mustCommit(t, parked.next(t), 8, 1, false)
	// The coordinator aborts a transaction whose commit waits: the abort
	// wins.
	mustProduce(t, ip.ask(txnBatchFrame(10, 1, 0, "open")), -1, false)
	sys.Root.RequestWithCustomSender(ip.pid, commitBatchFrame(10, 2, 0, nil, "aborted"), parked.pid)
	checkFor(t, 5*time.Second, "the commit of producer 10's epoch 2 waiting", func() bool { return waitingCommits("txn-alone") == 1 })
	mustProduce(t, ip.ask(markerFrame(10, 2, false, 0)), -1, false)
	mustFail(t, parked.next(t), heraldpb.ErrorCode_INVALID_TXN_STATE)
	mustProduce(t, ip.ask(markerFrame(10, 1, false, 0)), -1, false)

	// Its coordinator's commit marker comes while a commit alone waits (for
	// the epoch before it, not here): one end, both answered with it.
	sys.Root.RequestWithCustomSender(ip.pid, commitBatchFrame(12, 2, 0, epochPtr(1), "m"), parked.pid)
	checkFor(t, 5*time.Second, "the commit of producer 12's epoch 2 waiting", func() bool { return waitingCommits("txn-alone") == 1 })
	mustCommit(t, ip.ask(markerFrame(12, 2, true, 1)), 9, 1, false)
	mustCommit(t, parked.next(t), 9, 1, true)

	// A replaced session's commit is refused.
	if f := ip.ask(sessionFenceFrame(9, 5)); f.GetListOpenTxnsResponse() == nil {
		t.Fatalf("fencing producer 9: %v", f)
	}
	mustFail(t, ip.ask(commitBatchFrame(9, 4, 0, nil, "zombie")), heraldpb.ErrorCode_PRODUCER_FENCED)

	// Bad requests.
	mustFail(t, ip.ask(commitBatchFrame(9, 6, 0, epochPtr(6), "z")), heraldpb.ErrorCode_INVALID_REQUEST) // names itself
	f := txnBatchFrame(9, 6, 0, "z")
	f.GetProduce().TxnCommitAfter = epochPtr(5) // without commit_txn
	mustFail(t, ip.ask(f), heraldpb.ErrorCode_INVALID_REQUEST)
	f = commitBatchFrame(9, 6, 0, nil, "z")
	f.GetProduce().TxnGroupOffsets = []*heraldpb.TxnGroupOffsets{{Group: "g", Topic: "t"}}
	mustFail(t, ip.ask(f), heraldpb.ErrorCode_INVALID_REQUEST)
	f = markerFrame(9, 6, true, 0)
	f.GetProduce().CommitTxn = true
	mustFail(t, ip.ask(f), heraldpb.ErrorCode_INVALID_REQUEST)

	want := "[p0 a b c d e f x y m]"
	checkFor(t, 5*time.Second, "hw 10", func() bool { return ip.stats.HighWatermark.Load() == 10 })
	if got := readAll(t, sys, ip.pid, 10); fmt.Sprint(got) != want {
		t.Fatalf("the log reads %v, want %v", got, want)
	}
	ip.stop()
	ip.start()
	checkFor(t, 5*time.Second, "hw 10 after a restart", func() bool { return ip.stats.HighWatermark.Load() == 10 })
	if got := readAll(t, sys, ip.pid, 10); fmt.Sprint(got) != want {
		t.Fatalf("after a restart the log reads %v, want %v", got, want)
	}
	mustCommit(t, askRetrying(t, sys, ip.self, ip.in, func() *heraldpb.Frame { return commitBatchFrame(8, 2, 0, epochPtr(1), "y") }), 8, 1, true)
	mustFail(t, ip.ask(txnBatchFrame(8, 2, 1, "late")), heraldpb.ErrorCode_INVALID_TXN_STATE)

	// Without the transaction state file, the log alone says how they
	// ended, those committed in their batch's own entry too (producer 11's
	// here, and producer 7's epochs 1 and 3): a retry of the last is
	// answered as before, an older one refused, and none is committed
	// again.
	mustCommit(t, ip.ask(commitBatchFrame(11, 1, 0, nil, "i")), 10, 1, false)
	ip.stop()
	if err := os.Remove(ip.statePath() + ".txn"); err != nil {
		t.Fatal(err)
	}
	ip.start()
	mustCommit(t, askRetrying(t, sys, ip.self, ip.in, func() *heraldpb.Frame { return commitBatchFrame(11, 1, 0, nil, "i") }), 10, 1, true)
	mustFail(t, ip.ask(commitBatchFrame(7, 1, 0, nil, "a", "b")), heraldpb.ErrorCode_INVALID_TXN_STATE)
	mustFail(t, ip.ask(commitBatchFrame(7, 3, 0, epochPtr(2), "e")), heraldpb.ErrorCode_INVALID_TXN_STATE)
	mustFail(t, ip.ask(txnBatchFrame(11, 1, 1, "late")), heraldpb.ErrorCode_INVALID_TXN_STATE)
	want = "[p0 a b c d e f x y m i]"
	checkFor(t, 5*time.Second, "hw 11 after a restart without the state file", func() bool { return ip.stats.HighWatermark.Load() == 11 })
	if got := readAll(t, sys, ip.pid, 11); fmt.Sprint(got) != want {
		t.Fatalf("after a restart without the state file the log reads %v, want %v", got, want)
	}
}

// A log whose only transaction was committed in its batch's own entry:
// that entry counts as transactional, so that a restart without the
// transaction state file reads it and knows the epoch ended (a retry is
// answered as a duplicate, not committed again).
func TestTxnCommitInlineSurvivesRestart(t *testing.T) {
	sys := actor.NewActorSystem()
	DeleteMetrics("txn-inline", 0)
	ip := &idemPartition{t: t, sys: sys, topic: "txn-inline", dir: t.TempDir()}
	ip.start()
	defer func() { ip.stop() }()
	mustProduce(t, ip.ask(produceFrame("t", heraldpb.Acks_ACKS_ALL, "p0")), 0, false)
	mustCommit(t, ip.ask(commitBatchFrame(7, 1, 0, nil, "a", "b")), 1, 2, false)
	mustProduce(t, ip.ask(produceFrame("t", heraldpb.Acks_ACKS_ALL, "p1")), 3, false)
	ip.stop()
	if err := os.Remove(ip.statePath() + ".txn"); err != nil {
		t.Fatal(err)
	}
	ip.start()
	mustCommit(t, askRetrying(t, sys, ip.self, ip.in, func() *heraldpb.Frame { return commitBatchFrame(7, 1, 0, nil, "a", "b") }), 1, 2, true)
	mustProduce(t, ip.ask(produceFrame("t", heraldpb.Acks_ACKS_ALL, "p2")), 4, false)
	if got := readAll(t, sys, ip.pid, 5); fmt.Sprint(got) != "[p0 a b p1 p2]" {
		t.Fatalf("the log reads %v", got)
	}
}
