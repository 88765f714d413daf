package partition

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/internal/raftwire"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// coordFrame is a transaction coordinator's append of values, of epoch
// epoch, as idempotent producer pid from sequence seq.
func coordFrame(epoch, pid uint64, seq int64, values ...string) *heraldpb.Frame {
	f := idemFrame(pid, seq, heraldpb.Acks_ACKS_ALL, values...)
	f.GetProduce().TxnEpoch, f.GetProduce().SingleInFlight = epoch, true
	return f
}

// fenceFrame is a coordinator's fence of epoch epoch.
func fenceFrame(epoch uint64) *heraldpb.Frame {
	return &heraldpb.Frame{Id: frameIDs.Add(1), Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "t", Acks: heraldpb.Acks_ACKS_ALL, TxnEpoch: epoch,
	}}}
}

// mustFence checks f answers a fence at the high watermark hw.
func mustFence(t *testing.T, f *heraldpb.Frame, hw int64) {
	t.Helper()
	if r := f.GetProduceResponse(); r == nil || r.BaseOffset != hw || r.Count != 0 {
		t.Fatalf("fence answered %v, want a produce response at %d", f, hw)
	}
}

// TestTxnFence: once a coordinator of a newer epoch fenced the partition
// (or appended to it), appends of an older epoch are refused with
// PRODUCER_FENCED, from any producer id; the fence holds no offset and no
// reader sees it; a fence in flight refuses them already, and its retry
// waits for it; the epoch survives a restart, from the producer state file
// and from the log alone.
func TestTxnFence(t *testing.T) {
	sys := actor.NewActorSystem()
	ip := &idemPartition{t: t, sys: sys, topic: "txn-fence", dir: t.TempDir(), hold: &gate{}}
	ip.start()
	defer func() { ip.hold.open(); ip.stop() }()
	fenced0 := txnFencedCount()

	mustProduce(t, ip.ask(coordFrame(3, 50, 0, "a")), 0, false)
	mustFence(t, ip.ask(fenceFrame(5)), 1)
	mustFail(t, ip.ask(coordFrame(3, 50, 1, "late")), heraldpb.ErrorCode_PRODUCER_FENCED)
	mustFail(t, ip.ask(coordFrame(4, 51, 0, "late")), heraldpb.ErrorCode_PRODUCER_FENCED)
	mustFail(t, ip.ask(fenceFrame(4)), heraldpb.ErrorCode_PRODUCER_FENCED)
	mustProduce(t, ip.ask(coordFrame(5, 52, 0, "b")), 1, false) // the fence took no offset
	mustFence(t, ip.ask(fenceFrame(5)), 2)                      // again: applied already
	mustProduce(t, ip.ask(produceFrame("t", heraldpb.Acks_ACKS_ALL, "plain")), 2, false)

	// An append of a newer epoch fences like a fence does.
	mustProduce(t, ip.ask(coordFrame(9, 53, 0, "c")), 3, false)
	mustFail(t, ip.ask(coordFrame(8, 52, 1, "late")), heraldpb.ErrorCode_PRODUCER_FENCED)

	// A fence in flight: older appends are refused before it commits; its
	// retry is answered with it.
	ip.hold.close()
	first, retry := newInbox(sys), newInbox(sys)
	sys.Root.RequestWithCustomSender(ip.pid, fenceFrame(12), first.pid)
	sys.Root.RequestWithCustomSender(ip.pid, fenceFrame(12), retry.pid)
	mustFail(t, ip.ask(coordFrame(9, 53, 1, "late")), heraldpb.ErrorCode_PRODUCER_FENCED)
	select {
	case f := <-first.frames:
		t.Fatalf("a fence was answered before it committed: %v", f)
	default:
	}
	ip.hold.open()
	mustFence(t, first.next(t), 4)
	mustFence(t, retry.next(t), 4)
	if n := txnFencedCount() - fenced0; n != 5 {
		t.Fatalf("herald_partition_txn_fenced_total rose by %v, want 5", n)
	}

	checkFor(t, 5*time.Second, "hw 4", func() bool { return ip.stats.HighWatermark.Load() == 4 })
	if got := readAll(t, sys, ip.pid, 4); fmt.Sprint(got) != "[a b plain c]" {
		t.Fatalf("log holds %v", got)
	}

	check := func(stage string) {
		t.Helper()
		f := askRetrying(t, sys, ip.self, ip.in, func() *heraldpb.Frame { return coordFrame(11, 54, 0, "late") })
		if f.GetError().GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
			t.Fatalf("%s: an append of epoch 11 after a fence of 12: %v", stage, f)
		}
		mustFence(t, ip.ask(fenceFrame(12)), 4)
	}
	restartBothWays(t, ip, check)
	mustProduce(t, ip.ask(coordFrame(12, 55, 0, "d")), 4, false)
}

func txnFencedCount() float64 { return testutil.ToFloat64(txnFenced) }

// TestTxnEpochOutlivesTheLogItCameFrom: the coordinator epoch survives
// what replaces the entries that carried it: a snapshot a lagging
// follower installs carries the leader's epoch (epochSnapshots), and the
// table a snapshot install empties keeps it (resetProducers).
func TestTxnEpochOutlivesTheLogItCameFrom(t *testing.T) {
	a := &Actor{cfg: Config{MaxProducers: 10}, producers: newProducerTable(10), stats: &Stats{}, m: newPartMetrics("txn-epoch-snap", 0)}
	a.producers.raiseEpochs(epochList{41, 7})
	mem := raft.NewMemoryStorage()
	data, _ := proto.Marshal(&heraldpb.SnapshotData{NextOffset: 500})
	if err := mem.ApplySnapshot(raftpb.Snapshot{Data: data, Metadata: raftpb.SnapshotMetadata{Index: 9, Term: 2}}); err != nil {
		t.Fatal(err)
	}
	snap, err := epochSnapshots{Storage: mem, a: a}.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sd heraldpb.SnapshotData
	if err := proto.Unmarshal(snap.Data, &sd); err != nil || sd.NextOffset != 500 || sd.TxnEpoch != 41 || sd.SchedulerEpoch != 7 || snap.Metadata.Index != 9 {
		t.Fatalf("snapshot %+v carries %+v (%v), want next offset 500 and epoch 41", snap.Metadata, &sd, err)
	}
	a.resetProducers()
	if a.producers.epochList() != (epochList{41, 7}) || a.producers.len() != 0 {
		t.Fatalf("after a reset: epochs %v, %d producers; want [41 7] and none", a.producers.epochList(), a.producers.len())
	}
}

// TestTxnEpochReset: a resetting fence lowers the partition's epoch, but
// only over exactly the epoch and the entry it names: a fence that came
// since wins, even one of the same epoch (a live coordinator whose term
// equals the lost epoch). After it, the lower epoch appends and anything
// older is still refused; the reset survives a restart, from the state
// file and from the log.
func TestTxnEpochReset(t *testing.T) {
	sys := actor.NewActorSystem()
	ip := &idemPartition{t: t, sys: sys, topic: "txn-reset", dir: t.TempDir()}
	ip.start()
	defer ip.stop()
	reset := func(epoch, from, index uint64) *heraldpb.Frame {
		f := fenceFrame(epoch)
		f.GetProduce().TxnEpochResetFrom, f.GetProduce().TxnEpochResetIndex = from, index
		return ip.ask(f)
	}

	mustProduce(t, ip.ask(coordFrame(12, 60, 0, "a")), 0, false)
	e := mustFail(t, reset(3, 11, 0), heraldpb.ErrorCode_PRODUCER_FENCED)
	if e.Epoch != 12 || e.EpochIndex == 0 {
		t.Fatalf("a reset over the wrong epoch: %v, want the partition's epoch 12 and its entry named", e)
	}
	lost := e.EpochIndex
	if e := mustFail(t, ip.ask(coordFrame(3, 61, 0, "b")), heraldpb.ErrorCode_PRODUCER_FENCED); e.Epoch != 12 || e.EpochIndex != lost {
		t.Fatalf("an append of epoch 3: %v, want epoch 12 at index %d named", e, lost)
	}
	// A live coordinator of epoch 12 fences the partition: the reset over
	// the entry the refusal named no longer applies.
	mustFence(t, ip.ask(fenceFrame(12)), 1)
	e = mustFail(t, reset(3, 12, lost), heraldpb.ErrorCode_PRODUCER_FENCED)
	if e.Epoch != 12 || e.EpochIndex <= lost {
		t.Fatalf("a reset over a superseded entry: %v", e)
	}
	mustFence(t, reset(3, 12, e.EpochIndex), 1)
	mustFence(t, reset(3, 12, e.EpochIndex), 1) // again: done already
	mustProduce(t, ip.ask(coordFrame(3, 61, 0, "b")), 1, false)
	mustFail(t, ip.ask(coordFrame(2, 62, 0, "c")), heraldpb.ErrorCode_PRODUCER_FENCED)
	mustFence(t, ip.ask(fenceFrame(5)), 2)
	mustFail(t, reset(4, 3, 0), heraldpb.ErrorCode_PRODUCER_FENCED) // a newer fence came since
	mustFail(t, ip.ask(coordFrame(4, 63, 0, "c")), heraldpb.ErrorCode_PRODUCER_FENCED)

	for _, stage := range []string{"restart with the state file", "restart from the log alone"} {
		ip.stop()
		if stage == "restart from the log alone" {
			if err := os.Remove(ip.statePath()); err != nil {
				t.Fatal(err)
			}
		}
		ip.start()
		f := askRetrying(t, sys, ip.self, ip.in, func() *heraldpb.Frame { return coordFrame(4, 64, 0, "late") })
		if f.GetError().GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED || f.GetError().Epoch != 5 {
			t.Fatalf("%s: an append of epoch 4 after the reset to 3 and a fence of 5: %v", stage, f)
		}
	}
	mustProduce(t, ip.ask(coordFrame(5, 65, 0, "d")), 2, false)
}

// TestSteppedDownLeaderRefusesProduce: a leader whose raft has just
// stepped down (a message of a later term) but whose actor has not yet
// handled that Ready refuses a produce already in its mailbox with
// NOT_LEADER. It used to propose it, and raft forwarded the proposal to
// the new leader, which appended it without its own sequence or
// coordinator-epoch checks, at an offset the old leader had stamped.
func TestSteppedDownLeaderRefusesProduce(t *testing.T) {
	sys := actor.NewActorSystem()
	nw := &net{sys: sys, pids: map[uint64]*actor.PID{}}
	var forwarded atomic.Int32
	reps := spawnGroupWith(t, sys, 3, func(r *replica, cfg *Config) {
		nw.pids[r.id] = actor.NewPID(sys.Address(), r.name)
		cfg.Transport = transport{n: nw, from: r.id}
	})
	nw.setCut(func(from, to uint64, m raftpb.Message) bool {
		if m.Type == raftpb.MsgProp {
			forwarded.Add(1)
		}
		return false
	})
	all := map[uint64]bool{1: true, 2: true, 3: true}
	leader := leaderOf(t, reps, all)
	checkFor(t, 10*time.Second, "a writable leader", func() bool { return leader.stats.Writable.Load() })
	other := reps[leader.id%3]
	in := newInbox(sys)
	mustProduce(t, ask(t, sys, leader.pid, in, produceFrame("t", heraldpb.Acks_ACKS_ALL, "a")), 0, false)

	// A heartbeat of a later term, then a produce, in the leader's mailbox.
	term := leader.stats.Term.Load()
	sys.Root.Send(leader.pid, &raftwire.Message{Group: Name("t", 0), Raft: raftpb.Message{
		Type: raftpb.MsgHeartbeat, From: other.id, To: leader.id, Term: term + 1}})
	f := ask(t, sys, leader.pid, in, produceFrame("t", heraldpb.Acks_ACKS_ALL, "b"))
	if e := f.GetError(); e.GetCode() != heraldpb.ErrorCode_NOT_LEADER || e.GetOutcomeUnknown() {
		t.Fatalf("a produce behind the step-down was answered %v, want NOT_LEADER (not proposed)", f)
	}
	if n := forwarded.Load(); n != 0 {
		t.Fatalf("%d proposals were forwarded to another replica", n)
	}
}

// schedFrame is a scheduler's fire append of values (no producer id), of
// epoch epoch; with no values, its fence.
func schedFrame(epoch uint64, values ...string) *heraldpb.Frame {
	f := produceFrame("t", heraldpb.Acks_ACKS_ALL, values...)
	if len(values) == 0 {
		f.GetProduce().Records = nil
	}
	f.GetProduce().TxnEpoch, f.GetProduce().Fencer = epoch, heraldpb.Fencer_FENCER_SCHEDULER
	return f
}

// TestSchedulerFenceIsItsOwn: the scheduler's epochs (the term of
// __schedule) are fenced like the transaction coordinator's and apart from
// them: a scheduler fence refuses older fire appends and leaves the
// coordinator's appends alone, and the other way round; both survive a
// restart, from the state file and from the log alone. An unknown fencer
// is refused.
func TestSchedulerFenceIsItsOwn(t *testing.T) {
	sys := actor.NewActorSystem()
	ip := &idemPartition{t: t, sys: sys, topic: "sched-fence", dir: t.TempDir(), hold: &gate{}}
	ip.start()
	defer func() { ip.hold.open(); ip.stop() }()

	mustProduce(t, ip.ask(schedFrame(2, "s1")), 0, false)
	mustFence(t, ip.ask(schedFrame(7)), 1)
	mustFail(t, ip.ask(schedFrame(2, "late")), heraldpb.ErrorCode_PRODUCER_FENCED)
	mustProduce(t, ip.ask(coordFrame(3, 50, 0, "c1")), 1, false) // a coordinator of epoch 3 is not fenced by the scheduler's 7
	mustFence(t, ip.ask(fenceFrame(9)), 2)
	mustProduce(t, ip.ask(schedFrame(7, "s2")), 2, false) // nor the scheduler by the coordinator's 9
	mustFail(t, ip.ask(coordFrame(3, 50, 1, "late")), heraldpb.ErrorCode_PRODUCER_FENCED)
	bad := schedFrame(7, "x")
	bad.GetProduce().Fencer = heraldpb.NumFencers
	mustFail(t, ip.ask(bad), heraldpb.ErrorCode_INVALID_REQUEST)

	check := func(stage string) {
		t.Helper()
		f := askRetrying(t, sys, ip.self, ip.in, func() *heraldpb.Frame { return schedFrame(6, "late") })
		if f.GetError().GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
			t.Fatalf("%s: a fire of epoch 6 after a fence of 7: %v", stage, f)
		}
		mustFail(t, ip.ask(coordFrame(8, 51, 0, "late")), heraldpb.ErrorCode_PRODUCER_FENCED)
		mustFence(t, ip.ask(schedFrame(7)), 3)
		mustFence(t, ip.ask(fenceFrame(9)), 3)
	}
	restartBothWays(t, ip, check)
	checkFor(t, 5*time.Second, "hw 3", func() bool { return ip.stats.HighWatermark.Load() == 3 })
	if got := readAll(t, sys, ip.pid, 3); fmt.Sprint(got) != "[s1 c1 s2]" {
		t.Fatalf("log holds %v", got)
	}
}

// restartBothWays restarts the partition with its producer state file,
// then without it (from the log alone), running check after each.
func restartBothWays(t *testing.T, ip *idemPartition, check func(stage string)) {
	t.Helper()
	ip.stop()
	ip.start()
	check("restart with the state file")
	ip.stop()
	if err := os.Remove(ip.statePath()); err != nil {
		t.Fatal(err)
	}
	ip.start()
	check("restart from the log alone")
}
