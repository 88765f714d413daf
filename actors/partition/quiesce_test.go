package partition

import (
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
)

// A 3-replica group with quiescence on: idle, all three quiesce (no
// ticks, no heartbeats); a produce wakes them and commits; idle again,
// they quiesce again. Then the leader's "node" goes down (its actor stops
// and the liveness function says so): the quiesced followers wake, elect
// a new leader and take writes; every acknowledged record is there. With
// min in-sync 2 throughout: a quiesced leader, which has heard nothing
// from its quiet followers, must not refuse the produce that wakes it.
func TestQuiescenceWakesAndFailsOver(t *testing.T) {
	sys := actor.NewActorSystem()
	var mu sync.Mutex
	down := map[uint64]bool{}
	alive := func(id uint64) bool { mu.Lock(); defer mu.Unlock(); return !down[id] }
	reps := spawnGroupWith(t, sys, 3, func(_ *replica, cfg *Config) {
		cfg.Liveness = alive
		cfg.ElectionTicks, cfg.QuiesceTicks = 10, 3
		cfg.MinInSync = 2
	})
	live := map[uint64]bool{1: true, 2: true, 3: true}
	allQuiesced := func(what string) {
		t.Helper()
		checkFor(t, 10*time.Second, what, func() bool {
			for _, r := range reps {
				if live[r.id] && !r.stats.Quiesced.Load() {
					return false
				}
			}
			return true
		})
	}
	leader := leaderOf(t, reps, live)
	in := newInbox(sys)
	acked := map[int64]string{}
	produce := func(to *replica, v string) {
		r := produceRetrying(t, sys, to.pid, in, heraldpb.Acks_ACKS_ALL, v)
		acked[r.BaseOffset] = v
	}
	produce(leader, "first")
	allQuiesced("the idle group quiesces")
	term := leader.stats.Term.Load()

	// The idle period under test: longer than the election timeout (10
	// ticks of 10 ms), past which a leader counts a follower it has not
	// heard from as out of sync.
	time.Sleep(300 * time.Millisecond)
	produce(leader, "second") // wakes the leader, whose append wakes the followers
	if leader.stats.Quiesced.Load() {
		t.Fatal("the leader stayed quiesced through a produce")
	}
	allQuiesced("quiesced again once idle")
	if lt := leaderOf(t, reps, live); lt != leader || leader.stats.Term.Load() != term {
		t.Fatalf("leadership changed while quiesced: node %d at term %d (was %d at %d)", lt.id, leader.stats.Term.Load(), leader.id, term)
	}

	sys.Root.StopFuture(leader.pid).Wait()
	mu.Lock()
	down[leader.id] = true
	mu.Unlock()
	delete(live, leader.id)
	next := leaderOf(t, reps, live)
	if next.id == leader.id {
		t.Fatal("the stopped replica still leads")
	}
	produce(next, "third")
	for _, r := range reps {
		if !live[r.id] {
			continue
		}
		checkFor(t, 10*time.Second, "replica has every record", func() bool { return r.stats.HighWatermark.Load() == 3 })
		got := readAll(t, sys, r.pid, 3)
		for off, v := range acked {
			if got[off] != v {
				t.Fatalf("replica %d: offset %d holds %q, acknowledged %q", r.id, off, got[off], v)
			}
		}
	}
}
