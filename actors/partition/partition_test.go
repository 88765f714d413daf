package partition

import (
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// checkFor polls cond every few milliseconds until it holds or total passes.
func checkFor(t *testing.T, total time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(total)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", total, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// inbox is a test session: an actor that collects the frames sent to it,
// and the frame ids it is told are drained (ProduceDrained).
type inbox struct {
	pid     *actor.PID
	frames  chan *heraldpb.Frame
	drained chan uint64
}

func newInbox(sys *actor.ActorSystem) *inbox {
	in := &inbox{frames: make(chan *heraldpb.Frame, 4096), drained: make(chan uint64, 4096)}
	in.pid = sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case *heraldpb.Frame:
			in.frames <- m
		case *heraldpb.ProduceDrained:
			in.drained <- m.FrameId
		}
	}))
	return in
}

func (in *inbox) next(t *testing.T) *heraldpb.Frame {
	t.Helper()
	return within(t, in.frames, "reply")
}

// nextDrained is the next frame id the inbox is told is drained.
func (in *inbox) nextDrained(t *testing.T) uint64 {
	t.Helper()
	return within(t, in.drained, "ProduceDrained")
}

// within receives what from ch within 10 s.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10s", what)
		var zero T
		return zero
	}
}

var frameIDs atomic.Uint64

func batchOf(values ...string) []byte {
	b := &heraldpb.RecordBatch{}
	for _, v := range values {
		b.Records = append(b.Records, &heraldpb.Record{Value: []byte(v)})
	}
	raw, err := proto.Marshal(b)
	if err != nil {
		panic(err)
	}
	return raw
}

// produceRetrying sends a produce to pid until it is not answered with a
// retriable error (a new leader may answer THROTTLED until its log is
// written), as a client would.
func produceRetrying(t *testing.T, sys *actor.ActorSystem, pid *actor.PID, in *inbox, acks heraldpb.Acks, values ...string) *heraldpb.ProduceResponse {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		sys.Root.RequestWithCustomSender(pid, produceFrame("t", acks, values...), in.pid)
		f := in.next(t)
		if r := f.GetProduceResponse(); r != nil {
			return r
		}
		if !f.GetError().GetRetriable() || time.Now().After(deadline) {
			t.Fatalf("produce %v: %v", values, f.GetError())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func produceFrame(topic string, acks heraldpb.Acks, values ...string) *heraldpb.Frame {
	return &heraldpb.Frame{Id: frameIDs.Add(1), Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: topic, Acks: acks, Records: batchOf(values...),
	}}}
}

func fetchFrame(topic string, offset int64, maxWait uint32) *heraldpb.Frame {
	return &heraldpb.Frame{Id: frameIDs.Add(1), Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
		Topic: topic, Offset: offset, MaxBytes: 1 << 20, MaxWaitMs: maxWait,
	}}}
}

type replica struct {
	id    uint64
	name  string
	dir   string
	pid   *actor.PID
	stats *Stats
	props *actor.Props // (to start it again: restartReplica)
}

// spawnGroup starts n replicas of partition t-0 in one actor system, wired
// through their PIDs, each with its own real log in a temp dir.
func spawnGroup(t *testing.T, sys *actor.ActorSystem, n int) []*replica {
	t.Helper()
	return spawnGroupWith(t, sys, n, nil)
}

// spawnGroupWith is spawnGroup with each replica's config passed through
// tune (when not nil) before it starts.
func spawnGroupWith(t testing.TB, sys *actor.ActorSystem, n int, tune func(r *replica, cfg *Config)) []*replica {
	t.Helper()
	base := t.TempDir()
	peers := map[uint64]*actor.PID{}
	var reps []*replica
	for i := 1; i <= n; i++ {
		r := &replica{id: uint64(i), name: fmt.Sprintf("p/t-0/r%d", i), dir: filepath.Join(base, fmt.Sprintf("r%d", i)), stats: &Stats{}}
		peers[r.id] = actor.NewPID(sys.Address(), r.name)
		reps = append(reps, r)
	}
	readers := NewReaderPool(sys, 2, 64)
	t.Cleanup(readers.Close)
	for _, r := range reps {
		dir := r.dir
		cfg := Config{
			Topic: "t", Partition: 0, ReplicaID: r.id, Peers: peers,
			Open: func() (Storage, error) {
				return persistence.Open(persistence.Options{Dir: dir, Group: "t-0"})
			},
			TickInterval: 10 * time.Millisecond, Readers: readers,
		}
		if tune != nil {
			tune(r, &cfg)
		}
		props, err := Props(sys, cfg, r.stats)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := sys.Root.SpawnNamed(props, r.name)
		if err != nil {
			t.Fatal(err)
		}
		r.pid, r.props = pid, props
	}
	t.Cleanup(func() {
		for _, r := range reps {
			sys.Root.StopFuture(r.pid).Wait()
		}
	})
	return reps
}

// leaderOf waits until every live replica agrees on one leader.
func leaderOf(t *testing.T, reps []*replica, live map[uint64]bool) *replica {
	t.Helper()
	var leader uint64
	checkFor(t, 10*time.Second, "a leader all live replicas agree on", func() bool {
		leader = 0
		for _, r := range reps {
			if !live[r.id] {
				continue
			}
			l := r.stats.Leader.Load()
			if l == 0 || !live[l] || (leader != 0 && l != leader) {
				return false
			}
			leader = l
		}
		return leader != 0
	})
	return reps[leader-1]
}

func readAll(t *testing.T, sys *actor.ActorSystem, pid *actor.PID, hw int64) []string {
	t.Helper()
	in := newInbox(sys)
	var out []string
	for off := int64(0); off < hw; {
		sys.Root.RequestWithCustomSender(pid, fetchFrame("t", off, 0), in.pid)
		f := in.next(t)
		resp := f.GetFetchResponse()
		if resp == nil {
			t.Fatalf("fetch at %d: %v", off, f.GetError())
		}
		if len(resp.Batches) == 0 {
			t.Fatalf("fetch at %d below hw %d returned nothing", off, hw)
		}
		for _, b := range resp.Batches {
			var rb heraldpb.RecordBatch
			if err := proto.Unmarshal(b.Records, &rb); err != nil {
				t.Fatal(err)
			}
			for i, r := range rb.Records {
				o := b.BaseOffset + int64(i)
				if o < off {
					continue
				}
				if o != int64(len(out)) {
					t.Fatalf("offset %d where %d was expected", o, len(out))
				}
				out = append(out, string(r.Value))
			}
			off = b.BaseOffset + int64(b.Count)
		}
	}
	return out
}

// TestReplicatedGroupSurvivesLeaderLoss runs a 3-replica raft group wired
// through actor PIDs, produces with acks=all, stops the leader actor, and
// checks a follower takes over with every acknowledged record at its offset.
func TestReplicatedGroupSurvivesLeaderLoss(t *testing.T) {
	sys := actor.NewActorSystem()
	reps := spawnGroup(t, sys, 3)
	live := map[uint64]bool{1: true, 2: true, 3: true}
	leader := leaderOf(t, reps, live)
	in := newInbox(sys)

	acked := map[int64]string{}
	produce := func(to *replica, round string, n int) {
		for i := 0; i < n; i++ {
			v := fmt.Sprintf("%s-%d", round, i)
			r := produceRetrying(t, sys, to.pid, in, heraldpb.Acks_ACKS_ALL, v)
			acked[r.BaseOffset] = v
		}
	}
	produce(leader, "before", 50)

	sys.Root.StopFuture(leader.pid).Wait()
	delete(live, leader.id)
	next := leaderOf(t, reps, live)
	if next.id == leader.id {
		t.Fatal("stopped replica still leads")
	}
	produce(next, "after", 50)

	for _, r := range reps {
		if !live[r.id] {
			continue
		}
		checkFor(t, 10*time.Second, "replica catches up", func() bool { return r.stats.HighWatermark.Load() == 100 })
		got := readAll(t, sys, r.pid, 100)
		for off, v := range acked {
			if got[off] != v {
				t.Fatalf("replica %d: offset %d holds %q, acknowledged %q", r.id, off, got[off], v)
			}
		}
	}
	if len(acked) != 100 {
		t.Fatalf("%d distinct offsets acknowledged, want 100", len(acked))
	}
}

// TestProduceFetchSingleReplica covers acks modes, long-poll fetch, offsets
// and restart recovery on one replica.
func TestProduceFetchSingleReplica(t *testing.T) {
	sys := actor.NewActorSystem()
	reps := spawnGroup(t, sys, 1)
	leader := leaderOf(t, reps, map[uint64]bool{1: true})
	in := newInbox(sys)

	// A long poll parked at the tail is answered when data arrives.
	poller := newInbox(sys)
	sys.Root.RequestWithCustomSender(leader.pid, fetchFrame("t", 0, 10_000), poller.pid)

	for i, acks := range []heraldpb.Acks{heraldpb.Acks_ACKS_ALL, heraldpb.Acks_ACKS_LEADER, heraldpb.Acks_ACKS_NONE} {
		r := produceRetrying(t, sys, leader.pid, in, acks, fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i))
		if acks != heraldpb.Acks_ACKS_NONE && r.BaseOffset != int64(2*i) {
			t.Fatalf("acks %v: base offset %d, want %d", acks, r.BaseOffset, 2*i)
		}
	}
	f := poller.next(t)
	if resp := f.GetFetchResponse(); resp == nil || len(resp.Batches) == 0 || resp.Batches[0].BaseOffset != 0 {
		t.Fatalf("long poll answered %v", f)
	}
	checkFor(t, 5*time.Second, "hw 6", func() bool { return leader.stats.HighWatermark.Load() == 6 })
	if got := readAll(t, sys, leader.pid, 6); fmt.Sprint(got) != "[a0 b0 a1 b1 a2 b2]" {
		t.Fatalf("read %v", got)
	}
	// Out of range.
	sys.Root.RequestWithCustomSender(leader.pid, fetchFrame("t", 7, 0), in.pid)
	if e := in.next(t).GetError(); e.GetCode() != heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE {
		t.Fatalf("fetch past hw: %v", e)
	}
	// An invalid batch is refused with a typed error.
	bad := produceFrame("t", heraldpb.Acks_ACKS_ALL)
	bad.GetProduce().Records = []byte{0xff, 0xff, 0xff}
	sys.Root.RequestWithCustomSender(leader.pid, bad, in.pid)
	if e := in.next(t).GetError(); e.GetCode() != heraldpb.ErrorCode_INVALID_REQUEST {
		t.Fatalf("garbage batch: %v", e)
	}

	// Restart: stop the actor and start it again on the same log.
	sys.Root.StopFuture(leader.pid).Wait()
	props, err := Props(sys, Config{
		Topic: "t", ReplicaID: 1, Peers: map[uint64]*actor.PID{1: leader.pid},
		Open: func() (Storage, error) {
			return persistence.Open(persistence.Options{Dir: leader.dir, Group: "t-0"})
		},
		TickInterval: 10 * time.Millisecond,
	}, leader.stats)
	if err != nil {
		t.Fatal(err)
	}
	leader.stats.Leader.Store(0)
	if _, err := sys.Root.SpawnNamed(props, leader.name); err != nil {
		t.Fatal(err)
	}
	leaderOf(t, reps, map[uint64]bool{1: true})
	if r := produceRetrying(t, sys, leader.pid, in, heraldpb.Acks_ACKS_ALL, "c"); r.BaseOffset != 6 {
		t.Fatalf("produce after restart: %v", r)
	}
	checkFor(t, 5*time.Second, "hw 7", func() bool { return leader.stats.HighWatermark.Load() == 7 })
	if got := readAll(t, sys, leader.pid, 7); fmt.Sprint(got) != "[a0 b0 a1 b1 a2 b2 c]" {
		t.Fatalf("after restart read %v", got)
	}
}
