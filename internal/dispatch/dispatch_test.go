package dispatch

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

var _ actor.Dispatcher = (*Pool)(nil)

// A run that finds a worker idle reuses it: a pool of one serves runs one
// after another with one worker and no overflow.
func TestIdleWorkerIsReused(t *testing.T) {
	p := New(1, 10)
	for i := 0; i < 100; i++ {
		done := make(chan struct{})
		p.Schedule(func() { close(done) })
		<-done
		waitParked(t, p)
	}
	if p.Workers() != 1 || p.Overflow() != 0 {
		t.Fatalf("workers %d overflow %d, want 1 and 0", p.Workers(), p.Overflow())
	}
}

// Runs that block never keep another from running: past the bound, a run
// gets a goroutine of its own, and Schedule does not wait.
func TestBusyPoolOverflowsWithoutBlocking(t *testing.T) {
	p := New(2, 10)
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(5)
	for i := 0; i < 5; i++ {
		p.Schedule(func() { started.Done(); <-release })
	}
	waited := make(chan struct{})
	go func() { started.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("five blocking runs did not all start")
	}
	if p.Workers() != 2 || p.Overflow() != 3 {
		t.Fatalf("workers %d overflow %d, want 2 and 3", p.Workers(), p.Overflow())
	}
	close(release)
}

// An actor system's actors run on the pool: every message is processed,
// in order per actor, under -race.
func TestActorsRunOnThePool(t *testing.T) {
	p := New(4, 5)
	sys := actor.NewActorSystem()
	const actors, msgs = 8, 500
	var got [actors]atomic.Int64
	var bad atomic.Int64
	var wg sync.WaitGroup
	wg.Add(actors * msgs)
	pids := make([]*actor.PID, actors)
	for i := range pids {
		i := i
		next := 0
		pids[i] = sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			if n, ok := c.Message().(int); ok {
				if n != next {
					bad.Add(1)
				}
				next++
				got[i].Add(1)
				wg.Done()
			}
		}, actor.WithDispatcher(p)))
	}
	for n := 0; n < msgs; n++ {
		for _, pid := range pids {
			sys.Root.Send(pid, n)
		}
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d messages out of order", bad.Load())
	}
	for i := range got {
		if got[i].Load() != msgs {
			t.Fatalf("actor %d got %d messages, want %d", i, got[i].Load(), msgs)
		}
	}
	if w := p.Workers(); w < 1 || w > 4 {
		t.Fatalf("%d workers, want 1-4", w)
	}
}

// waitParked waits until p's workers are all parked (the last run's
// worker went back to wait, and stayed so over a poll: a worker counts
// itself idle just before it parks), polling with a deadline.
func waitParked(t *testing.T, p *Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for seen := 0; seen < 2; {
		if p.Idle() == p.Workers() {
			seen++
		} else {
			seen = 0
		}
		if time.Now().After(deadline) {
			t.Fatal("the worker never went back to wait")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func BenchmarkSchedule(b *testing.B) {
	for _, c := range []struct {
		name string
		d    actor.Dispatcher
	}{{"pool", New(64, 300)}, {"goroutine", actor.NewDefaultDispatcher(300)}} {
		b.Run(c.name, func(b *testing.B) {
			var wg sync.WaitGroup
			for i := 0; i < b.N; i++ {
				wg.Add(1)
				c.d.Schedule(func() { grow(64); wg.Done() })
				wg.Wait()
			}
		})
	}
}

// grow uses about depth KiB of stack, as a mailbox run deep in a
// partition's handlers does.
//
//go:noinline
func grow(depth int) byte {
	var buf [1024]byte
	if depth == 0 {
		return buf[0]
	}
	buf[depth%1024] = byte(depth)
	return grow(depth-1) + buf[depth%1024]
}
