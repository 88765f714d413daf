// Package nemesis holds the faults of the chaos suite, each a building
// block with a name, a Start that applies it and a Stop that heals it,
// acting on a *cluster.Cluster of real herald processes:
//
//   - process (process.go): SIGKILL, SIGSTOP/SIGCONT, rolling restart;
//   - network (network.go): partitions of several shapes, flapping
//     links, a node's link down, latency and loss (tc netem);
//   - disk (disk.go): slow disk, fsync and write errors (the fault hooks
//     of a -tags chaos build), a full disk, damage to a partition's WAL;
//   - clock (disk.go): a node's clock jumping forward or back;
//   - membership (membership.go): a node added, a node removed, replicas
//     rebalanced.
//
// Whom a fault hits is a Target (a random node, a partition's leader,
// the controller's leader, a majority...), resolved at Start. Every
// action is reported as an Event to the Env's callback, so that the
// runner can record it in the history. A fault the machine or cluster
// cannot do (no namespaces, no netem, no tmpfs data dirs) fails with an
// error wrapping ErrUnsupported that says what is missing.
package nemesis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/heraldmq/herald/chaos/cluster"
)

// Errors, checked with errors.Is.
var (
	// ErrUnsupported is cluster.ErrUnsupported: the fault needs something
	// this machine or cluster lacks; the message says what.
	ErrUnsupported = cluster.ErrUnsupported
	// ErrActive: Start of a nemesis already started and not stopped.
	ErrActive = errors.New("nemesis: already started")
	// ErrNoTarget: no node fits the target (none running, no leader...).
	ErrNoTarget = errors.New("nemesis: no node fits the target")
)

// Op names what an Event reports.
type Op string

// The ops of every nemesis; long-running ones (Flap, RollingRestart)
// also report their steps.
const (
	OpStart Op = "start"
	OpStop  Op = "stop"
	OpStep  Op = "step"
)

// Event is one thing a nemesis did, for the history.
type Event struct {
	Nemesis string   // the nemesis's Name
	Op      Op       // start, stop or step
	Nodes   []uint64 // the nodes acted on
	// Begin and End bracket the action: the fault took effect (or was
	// healed) somewhere in between.
	Begin, End time.Time
	Detail     string // what was done, for people
	Err        error  // why it failed, wholly or partly; nil if it took effect
}

func (e Event) String() string {
	s := fmt.Sprintf("%s %s %s nodes %v: %s", e.End.Format("15:04:05.000"), e.Nemesis, e.Op, e.Nodes, e.Detail)
	if e.Err != nil {
		s += fmt.Sprintf(" (error: %v)", e.Err)
	}
	return s
}

// Nemesis is one fault. Start applies it and Stop heals it; Stop of a
// nemesis not started does nothing, and a nemesis can be started again
// once stopped. If Start fails part way, what it did apply stays
// applied until Stop. A failed Stop can be retried. Start and Stop are
// safe for concurrent use, but one nemesis does one thing at a time.
type Nemesis interface {
	Name() string
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// Env is what the nemeses of one run share: the cluster, the random
// source (seeded, so a run can be repeated) and the event callback.
type Env struct {
	Cluster *cluster.Cluster

	report func(Event)
	mu     sync.Mutex
	rnd    *rand.Rand
}

// NewEnv makes an Env. report, if not nil, receives every Event; it is
// called from the goroutine that acted (several at once when nemeses
// overlap or flap), so it must be safe for concurrent use.
func NewEnv(c *cluster.Cluster, seed uint64, report func(Event)) *Env {
	return &Env{Cluster: c, report: report, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (e *Env) emit(ev Event) {
	if e.report != nil {
		ev.Nodes = slices.Clone(ev.Nodes)
		e.report(ev)
	}
}

// shuffled returns ids in a random order.
func (e *Env) shuffled(ids []uint64) []uint64 {
	out := slices.Clone(ids)
	e.mu.Lock()
	e.rnd.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	e.mu.Unlock()
	return out
}

// float is a random number in [0, 1).
func (e *Env) float() float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rnd.Float64()
}

// running lists the nodes whose process runs.
func (e *Env) running() []uint64 {
	var out []uint64
	for _, id := range e.Cluster.IDs() {
		if e.Cluster.Running(id) {
			out = append(out, id)
		}
	}
	return out
}

// undoFunc heals what an apply did and says what it did.
type undoFunc func(ctx context.Context) (detail string, err error)

// applyFunc applies a fault: the nodes it acted on, what it did, and how
// to undo it (non-nil whenever something was applied, even with an
// error).
type applyFunc func(ctx context.Context) (nodes []uint64, detail string, undo undoFunc, err error)

// fault is a Nemesis made of an apply function.
type fault struct {
	env   *Env
	name  string
	apply applyFunc

	mu    sync.Mutex
	undo  undoFunc
	nodes []uint64
}

func newFault(e *Env, name string, apply applyFunc) *fault {
	return &fault{env: e, name: name, apply: apply}
}

func (f *fault) Name() string { return f.name }

func (f *fault) Start(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.undo != nil {
		return fmt.Errorf("%w: %s", ErrActive, f.name)
	}
	begin := time.Now()
	nodes, detail, undo, err := f.apply(ctx)
	f.env.emit(Event{Nemesis: f.name, Op: OpStart, Nodes: nodes, Begin: begin, End: time.Now(), Detail: detail, Err: err})
	f.undo, f.nodes = undo, nodes
	if err != nil {
		return fmt.Errorf("%s: %w", f.name, err)
	}
	return nil
}

func (f *fault) Stop(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.undo == nil {
		return nil
	}
	begin := time.Now()
	detail, err := f.undo(ctx)
	f.env.emit(Event{Nemesis: f.name, Op: OpStop, Nodes: f.nodes, Begin: begin, End: time.Now(), Detail: detail, Err: err})
	if err != nil {
		return fmt.Errorf("%s: %w", f.name, err)
	}
	f.undo, f.nodes = nil, nil
	return nil
}

// nothing is the undo of a fault that leaves nothing to heal.
func nothing(what string) undoFunc {
	return func(context.Context) (string, error) { return what, nil }
}
