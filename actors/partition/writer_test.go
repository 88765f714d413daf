package partition

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
)

// stallingStore is a real log whose Flush (the fsync) waits while stall is
// set: a disk that stalls.
type stallingStore struct {
	Storage
	stall *atomic.Bool
}

func (s stallingStore) Flush() error {
	for s.stall.Load() {
		time.Sleep(time.Millisecond)
	}
	return s.Storage.Flush()
}

// The log writer's queue is bounded and the actor never waits on it (issue
// 15: Receive must not block). With the disk stalled and the queue full,
// produces get THROTTLED at once, reads and retention jobs are answered or
// queued, and once the disk moves the queued appends commit.
func TestStalledDiskDoesNotBlockTheActor(t *testing.T) {
	sys := actor.NewActorSystem()
	var stall atomic.Bool
	reps := spawnGroupWith(t, sys, 1, func(r *replica, cfg *Config) {
		dir := r.dir
		cfg.WriterQueue = 2
		cfg.RetentionAge = time.Hour
		cfg.RetentionCheck = 10 * time.Millisecond
		cfg.Open = func() (Storage, error) {
			l, err := persistence.Open(persistence.Options{Dir: dir, Group: "t-0"})
			if err != nil {
				return nil, err
			}
			return stallingStore{Storage: l, stall: &stall}, nil
		}
	})
	leader := leaderOf(t, reps, map[uint64]bool{1: true})
	in := newInbox(sys)
	produceRetrying(t, sys, leader.pid, in, heraldpb.Acks_ACKS_ALL, "before")

	stall.Store(true)
	t.Cleanup(func() { stall.Store(false) })
	// Produces, one Ready each, and the retention jobs fill the writer's
	// queue of 2 while its fsync waits.
	deadline := time.Now().Add(10 * time.Second)
	for throttled := false; !throttled; {
		if time.Now().After(deadline) {
			t.Fatal("no THROTTLED while the disk stalls with the writer's queue full")
		}
		sys.Root.RequestWithCustomSender(leader.pid, produceFrame("t", heraldpb.Acks_ACKS_ALL, "v"), in.pid)
		select {
		case f := <-in.frames:
			throttled = f.GetError().GetCode() == heraldpb.ErrorCode_THROTTLED
		case <-time.After(5 * time.Millisecond):
		}
	}
	// The actor still answers: a read, while the disk is stalled.
	sys.Root.RequestWithCustomSender(leader.pid, fetchFrame("t", 0, 0), in.pid)
	for f := in.next(t); f.GetFetchResponse() == nil; f = in.next(t) {
	}
	stall.Store(false)
	checkFor(t, 10*time.Second, "the stalled appends to commit", func() bool {
		return leader.stats.HighWatermark.Load() >= 2
	})
}
