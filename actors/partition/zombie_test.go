package partition

import (
	"fmt"
	"os"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
)

// A replaced session's epochs are refused, the new session's taken, a
// floor only rises, and past maxSessionFences producers the oldest floor
// is forgotten. (End to end: e2e/TestTxnSDKFencing/written-once.)
func TestSessionFences(t *testing.T) {
	a := &Actor{cfg: Config{Topic: "t"}, m: newPartMetrics("zombie-test", 0)}
	defer DeleteMetrics("zombie-test", 0)
	if e := a.checkSession(7, 3); e != nil {
		t.Fatalf("a producer never fenced: %v", e)
	}
	a.fenceSession(7, 10)
	if e := a.checkSession(7, 9); e.GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
		t.Fatalf("epoch 9 below the floor 10: %v", e)
	}
	for _, ep := range []uint32{10, 11} {
		if e := a.checkSession(7, ep); e != nil {
			t.Fatalf("the new session's epoch %d: %v", ep, e)
		}
	}
	a.fenceSession(7, 5) // (a late sweep of an older session)
	if e := a.checkSession(7, 9); e == nil {
		t.Fatal("the floor went down")
	}
	for pid := uint64(100); pid < 100+maxSessionFences; pid++ {
		a.fenceSession(pid, 1)
	}
	if len(a.sessions.floor) != maxSessionFences || len(a.sessions.order) != maxSessionFences {
		t.Fatalf("%d floors (%d in order), want %d", len(a.sessions.floor), len(a.sessions.order), maxSessionFences)
	}
	if e := a.checkSession(7, 9); e != nil {
		t.Fatalf("the oldest floor is still kept past the bound: %v", e)
	}
	if e := a.checkSession(100+maxSessionFences-1, 0); e == nil {
		t.Fatal("the newest floor was forgotten")
	}
}

// sessionFenceFrame is the coordinator's sweep telling the partition that a new
// session of producer pid's transactional id starts at epoch.
func sessionFenceFrame(pid uint64, epoch uint32) *heraldpb.Frame {
	return &heraldpb.Frame{Id: frameIDs.Add(1), Body: &heraldpb.Frame_ListOpenTxns{ListOpenTxns: &heraldpb.ListOpenTxnsRequest{
		Topic: "t", FenceProducerId: pid, FenceEpoch: epoch}}}
}

// A session fence is written to the log, and the sweep that brought it
// is answered once it is applied: it holds after a restart (from the
// transaction state file, or from the log without it), and on a replica
// that becomes the leader after the one told. Before it was written, a
// new leader, or the same one restarted, took the zombie's batches.
func TestSessionFencesAreDurable(t *testing.T) {
	t.Run("restarts", func(t *testing.T) {
		for _, withFile := range []bool{true, false} {
			t.Run(fmt.Sprintf("state file %v", withFile), func(t *testing.T) {
				sys := actor.NewActorSystem()
				ip := &idemPartition{t: t, sys: sys, topic: "fence-durable", dir: t.TempDir()}
				ip.start()
				defer func() { ip.stop() }()
				mustProduce(t, ip.ask(txnBatchFrame(7, 5, 0, "a")), -1, false)
				if f := ip.ask(sessionFenceFrame(7, 40)); f.GetListOpenTxnsResponse() == nil {
					t.Fatalf("the sweep answered %v", f)
				}
				mustFail(t, ip.ask(txnBatchFrame(7, 5, 1, "b")), heraldpb.ErrorCode_PRODUCER_FENCED)
				mustProduce(t, ip.ask(txnBatchFrame(7, 40, 0, "n")), -1, false)
				mustProduce(t, ip.ask(markerFrame(7, 5, false, 0)), -1, false) // (the sweep's abort)
				mustProduce(t, ip.ask(produceFrame("t", heraldpb.Acks_ACKS_ALL, "p0")), 0, false)
				for round := range 2 {
					ip.stop()
					if !withFile {
						if err := os.Remove(ip.statePath() + ".txn"); err != nil {
							t.Fatal(err)
						}
					}
					ip.start()
					mustFail(t, askRetrying(t, sys, ip.self, ip.in, func() *heraldpb.Frame { return txnBatchFrame(7, 6, 0, "z") }),
						heraldpb.ErrorCode_PRODUCER_FENCED)
					mustProduce(t, ip.ask(txnBatchFrame(7, 40, 0, "n")), -1, true)
					mustProduce(t, ip.ask(txnBatchFrame(7, 40, int64(1+round), fmt.Sprint("n", round))), -1, false)
				}
			})
		}
	})
	t.Run("leader loss", func(t *testing.T) {
		sys, reps, live, leader, _, askRetry := txnGroup(t, 3)
		mustProduce(t, askRetry(leader, func() *heraldpb.Frame { return txnBatchFrame(7, 5, 0, "a") }), -1, false)
		if f := askRetry(leader, func() *heraldpb.Frame { return sessionFenceFrame(7, 40) }); f.GetListOpenTxnsResponse() == nil {
			t.Fatalf("the sweep answered %v", f)
		}
		// The sweep is answered once its fence is applied, so committed:
		// the leader stopped right after, the next one has it.
		sys.Root.StopFuture(leader.pid).Wait()
		delete(live, leader.id)
		next := leaderOf(t, reps, live)
		mustFail(t, askRetry(next, func() *heraldpb.Frame { return txnBatchFrame(7, 5, 1, "b") }), heraldpb.ErrorCode_PRODUCER_FENCED)
		mustFail(t, askRetry(next, func() *heraldpb.Frame { return txnBatchFrame(7, 6, 0, "z") }), heraldpb.ErrorCode_PRODUCER_FENCED)
		mustProduce(t, askRetry(next, func() *heraldpb.Frame { return txnBatchFrame(7, 40, 0, "n") }), -1, false)
	})
}

// A floor a sweep set on a replica that was not the leader is not taken
// for written: when that replica leads and the sweep comes again, it
// writes the floor before answering, so the leader after it knows it too.
// (Five replicas, the sweep told to one follower first; the check bites
// when that follower is the one elected.)
func TestSessionFenceToldToAFollower(t *testing.T) {
	sys, reps, live, leader, in, askRetry := txnGroup(t, 5)
	mustProduce(t, askRetry(leader, func() *heraldpb.Frame { return txnBatchFrame(7, 5, 0, "a") }), -1, false)
	var told *replica
	for _, r := range reps {
		if r != leader {
			told = r
			break
		}
	}
	if f := ask(t, sys, told.pid, in, sessionFenceFrame(7, 40)); f.GetError().GetCode() != heraldpb.ErrorCode_NOT_LEADER {
		t.Fatalf("a follower answered the sweep %v", f)
	}
	sys.Root.StopFuture(leader.pid).Wait()
	delete(live, leader.id)
	next := leaderOf(t, reps, live)
	if f := askRetry(next, func() *heraldpb.Frame { return sessionFenceFrame(7, 40) }); f.GetListOpenTxnsResponse() == nil {
		t.Fatalf("the sweep answered %v", f)
	}
	t.Logf("the follower told first (%d) leads: %v", told.id, next == told)
	sys.Root.StopFuture(next.pid).Wait()
	delete(live, next.id)
	last := leaderOf(t, reps, live)
	mustFail(t, askRetry(last, func() *heraldpb.Frame { return txnBatchFrame(7, 6, 0, "z") }), heraldpb.ErrorCode_PRODUCER_FENCED)
}
