package partition

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/internal/raftwire"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.etcd.io/raft/v3/raftpb"
)

// moveReplica is one incarnation of a node's replica.
type moveReplica struct {
	node, id uint64 // node id, raft id
	pid      *actor.PID
	stats    *Stats
	stopped  bool
}

// moveGroup runs partition t-0 on nodes wired by a net, starting and
// stopping replica incarnations as a node's replica manager would.
type moveGroup struct {
	t       *testing.T
	sys     *actor.ActorSystem
	nw      *net
	base    string
	readers *ReaderPool
	reached atomic.Pointer[[]uint64] // the last target OnTargetReached reported
	live    map[uint64]*moveReplica  // by node id
	in      *inbox                   // answers to produce
}

func newMoveGroup(t *testing.T) *moveGroup {
	sys := actor.NewActorSystem()
	g := &moveGroup{t: t, sys: sys, nw: &net{sys: sys, pids: map[uint64]*actor.PID{}}, base: t.TempDir(),
		readers: NewReaderPool(sys, 2, 64), live: map[uint64]*moveReplica{}}
	t.Cleanup(func() {
		for _, r := range g.live {
			g.stop(r)
		}
		g.readers.Close()
	})
	return g
}

// start runs node's replica with raft id id: bootstrapping the group with
// voters 1-3 when joinAs is "", else joining it as a move's replica.
func (g *moveGroup) start(node, id uint64, joinAs string, announce ...uint64) *moveReplica {
	t := g.t
	t.Helper()
	r := &moveReplica{node: node, id: id, stats: &Stats{}}
	dir := filepath.Join(g.base, fmt.Sprintf("n%d-%x", node, id))
	cfg := Config{
		Topic: "t", Partition: 0, ReplicaID: id, Transport: transport{n: g.nw, from: id},
		Open: func() (Storage, error) {
			return persistence.Open(persistence.Options{Dir: dir, Group: "t-0"})
		},
		OnTargetReached: func(target []uint64) { g.reached.Store(&target) },
		TickInterval:    10 * time.Millisecond, Readers: g.readers,
	}
	if joinAs == "" {
		cfg.Peers = map[uint64]*actor.PID{1: nil, 2: nil, 3: nil}
	} else {
		cfg.Peers = map[uint64]*actor.PID{id: nil}
		cfg.Join, cfg.JoinAs, cfg.Announce = true, joinAs, announce
	}
	props, err := Props(g.sys, cfg, r.stats)
	if err != nil {
		t.Fatal(err)
	}
	if r.pid, err = g.sys.Root.SpawnNamed(props, fmt.Sprintf("p/t-0/n%d-%x", node, id)); err != nil {
		t.Fatal(err)
	}
	g.nw.set(node, r.pid)
	g.live[node] = r
	return r
}

// stop stops a replica and its node's routing to it (its node deletes it).
func (g *moveGroup) stop(r *moveReplica) {
	if r.stopped {
		return
	}
	r.stopped = true
	g.nw.set(r.node, nil)
	delete(g.live, r.node)
	g.sys.Root.StopFuture(r.pid).Wait()
}

// leader waits until the replicas on nodes agree on a leader among them,
// and returns it. Stats.Leader is a node id.
func (g *moveGroup) leader(nodes ...uint64) *moveReplica {
	g.t.Helper()
	var leader uint64
	checkFor(g.t, 10*time.Second, fmt.Sprintf("a leader nodes %v agree on", nodes), func() bool {
		leader = 0
		for _, n := range nodes {
			l := g.live[n].stats.Leader.Load()
			if !slices.Contains(nodes, l) || (leader != 0 && l != leader) {
				return false
			}
			leader = l
		}
		return true
	})
	return g.live[leader]
}

// setTarget tells every live replica the target (raft ids).
func (g *moveGroup) setTarget(target []uint64, joined map[uint64]string) {
	for _, r := range g.live {
		g.sys.Root.Send(r.pid, &SetTarget{Target: target, Joined: joined})
	}
}

// awaitTarget waits until a leader reports the group has target's
// membership, and every replica in it has applied it.
func (g *moveGroup) awaitTarget(target []uint64) {
	g.t.Helper()
	want := slices.Sorted(slices.Values(target))
	checkFor(g.t, 20*time.Second, fmt.Sprintf("the group moved to %#x", target), func() bool {
		got := g.reached.Load()
		if got == nil || !slices.Equal(*got, target) {
			return false
		}
		for _, r := range g.live {
			if cs := r.stats.Conf.Load(); slices.Contains(target, r.id) && (cs == nil || !slices.Equal(slices.Sorted(slices.Values(cs.Voters)), want) || len(cs.Learners) > 0) {
				return false
			}
		}
		return true
	})
}

// A node that leaves a partition and is added back joins the group under
// a raft id of its own, not its earlier replica's, even when the leader
// changes while it is a learner: node 4 joins as incarnation 1 while node
// 3 leaves; then node 3 comes back as incarnation 2, its appends held
// until the leader that added it as a learner is cut off and another
// leads. The new replica ends with every record, Stats.Leader names nodes,
// and a message for node 3's earlier raft id is dropped by the later one
// (raft would have taken its commit index past the log for its own).
// produce appends n records through the leader of the replicas on nodes,
// following it if it moves, and records the acknowledged ones in acked.
func (g *moveGroup) produce(acked map[int64]string, round string, n int, nodes ...uint64) {
	t := g.t
	t.Helper()
	if g.in == nil {
		g.in = newInbox(g.sys)
	}
	for i := range n {
		v := fmt.Sprintf("%s-%d", round, i)
		deadline := time.Now().Add(10 * time.Second)
		for {
			g.sys.Root.RequestWithCustomSender(g.leader(nodes...).pid, produceFrame("t", heraldpb.Acks_ACKS_ALL, v), g.in.pid)
			f := g.in.next(t)
			if r := f.GetProduceResponse(); r != nil {
				acked[r.BaseOffset] = v
				break
			}
			if !f.GetError().GetRetriable() || time.Now().After(deadline) {
				t.Fatalf("produce %s: %v", v, f.GetError())
			}
			time.Sleep(5 * time.Millisecond) // as a client backs off
		}
	}
}

func TestReaddedReplicaGetsItsOwnRaftID(t *testing.T) {
	g := newMoveGroup(t)
	for n := uint64(1); n <= 3; n++ {
		g.start(n, n, "")
	}
	acked := map[int64]string{}
	produce := func(round string, n int, nodes ...uint64) { g.produce(acked, round, n, nodes...) }
	produce("before", 20, 1, 2, 3)

	// 1. Node 4 joins (incarnation 1), node 3 leaves.
	id4 := heraldpb.ReplicaRaftID(4, 1)
	g.start(4, id4, "m1", 1, 2, 3)
	joined := map[uint64]string{4: "m1"}
	target := []uint64{1, 2, id4}
	g.setTarget(target, joined)
	g.awaitTarget(target)
	g.setTarget(nil, joined)
	g.stop(g.live[3])
	produce("moved", 10, 1, 2, 4)

	// 2. Node 3 comes back as incarnation 2. Its appends are held until
	// the leader of the moment, once it has made it a learner, is cut off.
	id3 := heraldpb.ReplicaRaftID(3, 2)
	var hold, isolated atomic.Uint64 // raft ids; 0: none
	hold.Store(id3)
	g.nw.setCut(func(from, to uint64, m raftpb.Message) bool {
		if i := isolated.Load(); i != 0 && (from == i || to == i) {
			return true
		}
		return to == hold.Load() && (m.Type == raftpb.MsgApp || m.Type == raftpb.MsgSnap)
	})
	r3 := g.start(3, id3, "m2", 1, 2, 4)
	joined = map[uint64]string{4: "m1", 3: "m2"}
	target = []uint64{1, 2, id3}
	g.setTarget(target, joined)
	checkFor(t, 10*time.Second, "node 3's new replica added as a learner", func() bool {
		for _, n := range []uint64{1, 2, 4} {
			if cs := g.live[n].stats.Conf.Load(); cs == nil || !slices.Contains(cs.Learners, id3) {
				return false
			}
		}
		return true
	})
	old := g.leader(1, 2, 4)
	isolated.Store(old.id)
	if r3.stats.EndOffset.Load() != 0 {
		t.Fatalf("the learner holds records before its appends were let through: end %d", r3.stats.EndOffset.Load())
	}
	var others []uint64
	for _, n := range []uint64{1, 2, 4} {
		if n != old.node {
			others = append(others, n)
		}
	}
	next := g.leader(others...)
	t.Logf("leader moved from node %d to node %d while node 3's replica %#x was a learner", old.node, next.node, id3)
	hold.Store(0)
	isolated.Store(0)
	g.awaitTarget(target)
	g.setTarget(nil, joined)
	g.stop(g.live[4])
	produce("back", 10, 1, 2, 3)
	if cs := r3.stats.Conf.Load(); slices.Contains(cs.Voters, 3) || !slices.Contains(cs.Voters, id3) {
		t.Fatalf("node 3's replica sees voters %#x", cs.Voters)
	}

	// A heartbeat for node 3's earlier replica, reaching its later one.
	before := testutil.ToFloat64(raftMisaddressed)
	hb := raftpb.Message{Type: raftpb.MsgHeartbeat, To: 3, From: 1, Term: r3.stats.Term.Load(), Commit: 1 << 20}
	g.sys.Root.Send(r3.pid, &raftwire.Message{Group: "p/t-0", Raft: hb})
	checkFor(t, 10*time.Second, "the misaddressed heartbeat dropped", func() bool { return testutil.ToFloat64(raftMisaddressed) > before })
	produce("after", 5, 1, 2, 3)

	if len(acked) != 45 {
		t.Fatalf("%d records acknowledged, want 45", len(acked))
	}
	// The leader publishes its high watermark after answering the
	// produces of the entries it applied: polled, not read once.
	var end int64
	checkFor(t, 10*time.Second, "the leader's high watermark at 45", func() bool {
		end = g.leader(1, 2, 3).stats.HighWatermark.Load()
		return end >= 45
	})
	for _, r := range g.live {
		checkFor(t, 10*time.Second, fmt.Sprintf("node %d at hw %d", r.node, end), func() bool {
			return r.stats.HighWatermark.Load() == end
		})
		got := readAll(t, g.sys, r.pid, end)
		for off, v := range acked {
			if got[off] != v {
				t.Fatalf("node %d (raft id %#x): offset %d holds %q, acknowledged %q", r.node, r.id, off, got[off], v)
			}
		}
		if l := r.stats.Leader.Load(); l < 1 || l > 3 {
			t.Fatalf("node %d reports leader %d, not a node id of the group", r.node, l)
		}
	}
}

// TestEmptyRestartedReplicaIsAddedAgain: a replica a move added (with a
// raft id of its own, or its node id) that restarts with its log lost
// announces itself empty; the leader, which counts entries on it, removes
// it and adds it again, and it catches up. Without that, raft never lowers
// its record of the replica's log and the replica never catches up.
func TestEmptyRestartedReplicaIsAddedAgain(t *testing.T) {
	for _, id4 := range []uint64{heraldpb.ReplicaRaftID(4, 1), 4} {
		t.Run(fmt.Sprintf("raft id %#x", id4), func(t *testing.T) {
			g := newMoveGroup(t)
			for n := uint64(1); n <= 3; n++ {
				g.start(n, n, "")
			}
			acked := map[int64]string{}
			g.produce(acked, "before", 20, 1, 2, 3)
			g.start(4, id4, "m1", 1, 2, 3)
			joined := map[uint64]string{4: "m1"}
			target := []uint64{1, 2, id4}
			g.setTarget(target, joined)
			g.awaitTarget(target)
			g.stop(g.live[3])
			g.produce(acked, "moved", 10, 1, 2, 4)
			// Node 4 loses its log and restarts under the same raft id
			// while the move is still recorded (its end not yet applied).
			g.stop(g.live[4])
			if err := os.RemoveAll(filepath.Join(g.base, fmt.Sprintf("n%d-%x", 4, id4))); err != nil {
				t.Fatal(err)
			}
			r4 := g.start(4, id4, "m1", 1, 2)
			end := g.leader(1, 2).stats.HighWatermark.Load()
			checkFor(t, 15*time.Second, fmt.Sprintf("the emptied replica %#x at hw %d", id4, end), func() bool {
				return r4.stats.HighWatermark.Load() >= end
			})
		})
	}
}

// TestDroppedSnapshotIsSentAgain: a learner whose first snapshot is lost
// (the transport gives no receipt) gets another. Raft holds a replica in
// StateSnapshot until the snapshot is reported; without the report the
// leader waited for one forever, as node 4 of TestControllerCheckpoints
// did once after refusing a snapshot that did not name it.
func TestDroppedSnapshotIsSentAgain(t *testing.T) {
	g := newMoveGroup(t)
	for n := uint64(1); n <= 3; n++ {
		g.start(n, n, "")
	}
	acked := map[int64]string{}
	g.produce(acked, "before", 20, 1, 2, 3)
	for n := uint64(1); n <= 3; n++ {
		res, err := g.sys.Root.RequestFuture(g.live[n].pid, &DeleteBefore{Offset: 15}, 10*time.Second).Result()
		if err != nil || res.(*DeleteBeforeResult).Err != nil {
			t.Fatalf("DeleteBefore on node %d: %v %v", n, err, res)
		}
	}
	checkFor(t, 10*time.Second, "the log truncated on every replica", func() bool {
		for n := uint64(1); n <= 3; n++ {
			if g.live[n].stats.StartOffset.Load() == 0 {
				return false
			}
		}
		return true
	})
	id4 := heraldpb.ReplicaRaftID(4, 1)
	var dropped atomic.Int64
	g.nw.setCut(func(from, to uint64, m raftpb.Message) bool {
		return to == id4 && m.Type == raftpb.MsgSnap && dropped.CompareAndSwap(0, 1)
	})
	r4 := g.start(4, id4, "m1", 1, 2, 3)
	joined := map[uint64]string{4: "m1"}
	target := []uint64{1, 2, id4}
	g.setTarget(target, joined)
	g.awaitTarget(target)
	if dropped.Load() != 1 {
		t.Fatal("no snapshot was sent to the learner: the test did not exercise a lost snapshot")
	}
	g.produce(acked, "moved", 5, 1, 2, 4)
	end := g.leader(1, 2, 4).stats.HighWatermark.Load()
	checkFor(t, 15*time.Second, fmt.Sprintf("the new replica at hw %d", end), func() bool {
		return r4.stats.HighWatermark.Load() >= end
	})
}
