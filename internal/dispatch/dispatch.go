// Package dispatch runs actors' mailboxes on a pool of long-lived
// goroutines instead of a new goroutine per run.
//
// protoactor's default dispatcher starts a goroutine each time a mailbox
// that was idle gets a message. A new goroutine starts with a small stack,
// and a partition's or a session's run grows it several times (each time
// copying it): 5-8 % of the broker's processor in a run of small
// produces, most of it runtime.newstack and runtime.copystack. A worker of
// the pool keeps its grown stack from one run to the next.
//
// Schedule never blocks: a run goes to an idle worker if one waits, or
// starts a new worker while fewer than the pool's bound exist, or else
// runs on a goroutine of its own, as protoactor's default dispatcher does
// (so a run that blocks, waiting on another actor, never keeps another
// from running). Workers stay once started: at most the bound of them,
// each parked on a channel while idle.
package dispatch

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

var (
	workersGauge = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_dispatch_workers",
		Help: "Goroutines of the actors' dispatcher pool (each kept once started, at most herald_dispatch_workers_limit).",
	})
	limitGauge = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_dispatch_workers_limit",
		Help: "The bound on the actors' dispatcher pool; past it a mailbox run starts a goroutine of its own.",
	})
	overflowTotal = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_dispatch_overflow_total",
		Help: "Mailbox runs started on a goroutine of their own because every worker of the pool was busy and the pool was at its bound.",
	})
)

// DefaultThroughput is how many messages a mailbox run processes before
// it yields (protoactor's default).
const DefaultThroughput = 300

// Pool is an actor.Dispatcher (Schedule, Throughput) backed by at most
// Max long-lived goroutines.
type Pool struct {
	throughput int
	max        int32
	work       chan func() // unbuffered: a send succeeds only to a worker waiting
	workers    atomic.Int32
	idle       atomic.Int32 // workers parked on work
	overflow   atomic.Int64
}

// New returns a pool of at most max workers whose mailbox runs process up
// to throughput messages each.
func New(max, throughput int) *Pool {
	if max < 1 {
		max = 1
	}
	if throughput < 1 {
		throughput = DefaultThroughput
	}
	return &Pool{throughput: throughput, max: int32(max), work: make(chan func())}
}

// Shared is the process's pool, which every actor of every broker in the
// process shares: at most 32 workers per processor (GOMAXPROCS at first
// use). Mailbox runs busy at once past that (many connections' sessions
// at a time) get goroutines of their own, counted by
// herald_dispatch_overflow_total; the bound caps the goroutines parked
// when idle.
var Shared = sync.OnceValue(func() *Pool {
	p := New(32*runtime.GOMAXPROCS(0), DefaultThroughput)
	limitGauge.Set(float64(p.max))
	return p
})

// Schedule runs fn on an idle worker, a new worker, or (the pool full and
// busy) a goroutine of its own. It never blocks.
func (p *Pool) Schedule(fn func()) {
	select {
	case p.work <- fn:
		return
	default:
	}
	for {
		n := p.workers.Load()
		if n >= p.max {
			break
		}
		if p.workers.CompareAndSwap(n, n+1) {
			workersGauge.Inc()
			go p.worker(fn)
			return
		}
	}
	p.overflow.Add(1)
	overflowTotal.Inc()
	go fn()
}

// Throughput is the messages a mailbox run processes before yielding.
func (p *Pool) Throughput() int { return p.throughput }

// Workers is how many workers the pool has started.
func (p *Pool) Workers() int { return int(p.workers.Load()) }

// Idle is how many workers wait for a run.
func (p *Pool) Idle() int { return int(p.idle.Load()) }

// Overflow is how many runs went to a goroutine of their own.
func (p *Pool) Overflow() int64 { return p.overflow.Load() }

func (p *Pool) worker(fn func()) {
	for {
		fn()
		p.idle.Add(1)
		fn = <-p.work
		p.idle.Add(-1)
	}
}
