package nemesis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/heraldmq/herald/chaos/cluster"
)

// The network nemeses need a cluster started with NetNS (as root); on
// another they fail with ErrUnsupported. Cuts between nodes leave every
// node reachable from the host, so clients can still talk to a cut-off
// node (and see it refuse writes); Disconnect takes a node off the
// network altogether.

// shape is a network fault's layout: the directed links to block.
type shape struct {
	links []cluster.Link
	nodes []uint64 // the nodes the fault is about, for the Event
	desc  string
}

// between lists both directions of every link joining two groups.
func between(groups ...[]uint64) []cluster.Link {
	var out []cluster.Link
	for i, g := range groups {
		for _, h := range groups[i+1:] {
			for _, a := range g {
				for _, b := range h {
					out = append(out, cluster.Link{From: a, To: b}, cluster.Link{From: b, To: a})
				}
			}
		}
	}
	return out
}

// rest is every node of the cluster not in ids.
func rest(e *Env, ids []uint64) []uint64 {
	var out []uint64
	for _, id := range e.Cluster.IDs() {
		if !slices.Contains(ids, id) {
			out = append(out, id)
		}
	}
	return out
}

// block blocks links and returns the undo for those it blocked.
func block(nw *cluster.Network, links []cluster.Link) (undoFunc, error) {
	var done []cluster.Link
	undo := func(context.Context) (string, error) {
		var errs []error
		for _, l := range done {
			errs = append(errs, nw.Unblock(l.From, l.To))
		}
		return fmt.Sprintf("restored %d links", len(done)), errors.Join(errs...)
	}
	for _, l := range links {
		if err := nw.Block(l.From, l.To); err != nil {
			return undo, err
		}
		done = append(done, l)
	}
	return undo, nil
}

// partition is a network fault of the shape layout returns.
func partition(e *Env, name string, layout func(ctx context.Context) (shape, error)) Nemesis {
	return newFault(e, name, func(ctx context.Context) ([]uint64, string, undoFunc, error) {
		nw, err := e.Cluster.Net()
		if err != nil {
			return nil, "", nil, err
		}
		s, err := layout(ctx)
		if err != nil {
			return nil, "", nil, err
		}
		undo, err := block(nw, s.links)
		return s.nodes, s.desc, undo, err
	})
}

// Isolate cuts the target's nodes off from every other node (they still
// reach each other and the clients).
func Isolate(e *Env, t Target) Nemesis {
	return partition(e, "isolate "+t.String(), func(ctx context.Context) (shape, error) {
		ids, err := t.resolve(ctx, e)
		if err != nil {
			return shape{}, err
		}
		others := rest(e, ids)
		return shape{between(ids, others), ids, fmt.Sprintf("cut %v off from %v", ids, others)}, nil
	})
}

// IsolateLeader cuts the leader of topic's partition off from every
// other node.
func IsolateLeader(e *Env, topic string, partition int32) Nemesis {
	return Isolate(e, PartitionLeader(topic, partition))
}

// CutMinority cuts a random minority ((n-1)/2 nodes) off from the
// majority.
func CutMinority(e *Env) Nemesis { return Isolate(e, Minority()) }

// SplitMajority splits the nodes at random into groups of at most n/2
// (for 3 nodes: 1+1+1, 4: 2+2, 5: 2+2+1), cut off from each other: no
// side holds a majority.
func SplitMajority(e *Env) Nemesis {
	return partition(e, "split with no majority", func(context.Context) (shape, error) {
		ids := e.shuffled(e.Cluster.IDs())
		size := len(ids) / 2
		if size == 0 {
			return shape{}, fmt.Errorf("%w: one node cannot be split", ErrNoTarget)
		}
		var groups [][]uint64
		for len(ids) > 0 {
			n := min(size, len(ids))
			g := slices.Clone(ids[:n])
			slices.Sort(g)
			groups = append(groups, g)
			ids = ids[n:]
		}
		return shape{between(groups...), e.Cluster.IDs(), fmt.Sprintf("split into %v", groups)}, nil
	})
}

// Bridge splits the nodes at random into two sides and one bridge node
// that sees both; the two sides do not see each other (5 nodes: 2, 1,
// 2). Needs at least 3 nodes.
func Bridge(e *Env) Nemesis {
	return partition(e, "bridge", func(context.Context) (shape, error) {
		ids := e.shuffled(e.Cluster.IDs())
		if len(ids) < 3 {
			return shape{}, fmt.Errorf("%w: a bridge needs 3 nodes, there are %d", ErrNoTarget, len(ids))
		}
		bridge, others := ids[0], ids[1:]
		a, b := slices.Clone(others[:len(others)/2]), slices.Clone(others[len(others)/2:])
		slices.Sort(a)
		slices.Sort(b)
		return shape{between(a, b), e.Cluster.IDs(), fmt.Sprintf("%v and %v cut apart, node %d sees both", a, b, bridge)}, nil
	})
}

// Flap cuts the target's nodes off from every other node and restores
// the links, again and again, each state lasting a random time between
// period/2 and 3*period/2, until Stop. Start makes the first cut; each
// later change is reported as a step.
func Flap(e *Env, t Target, period time.Duration) Nemesis {
	name := fmt.Sprintf("flap %s every ~%v", t, period)
	return newFault(e, name, func(ctx context.Context) ([]uint64, string, undoFunc, error) {
		nw, err := e.Cluster.Net()
		if err != nil {
			return nil, "", nil, err
		}
		if period <= 0 {
			return nil, "", nil, fmt.Errorf("nemesis: flap period %v must be positive", period)
		}
		ids, err := t.resolve(ctx, e)
		if err != nil {
			return nil, "", nil, err
		}
		links := between(ids, rest(e, ids))
		var mu sync.Mutex // guards heal
		heal, err := block(nw, links)
		if err != nil {
			return ids, "", heal, err
		}
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			for {
				wait := time.Duration(float64(period) * (0.5 + e.float()))
				select {
				case <-stop:
					return
				case <-time.After(wait): // the fault's schedule, not a synchronisation
				}
				begin := time.Now()
				mu.Lock()
				var detail string
				var serr error
				if heal != nil {
					detail, serr = heal(context.Background())
					heal = nil
				} else {
					detail = fmt.Sprintf("cut %v off", ids)
					heal, serr = block(nw, links)
				}
				mu.Unlock()
				e.emit(Event{Nemesis: name, Op: OpStep, Nodes: ids, Begin: begin, End: time.Now(), Detail: detail, Err: serr})
			}
		}()
		undo := func(ctx context.Context) (string, error) {
			if stop != nil {
				close(stop)
				<-done
				stop = nil
			}
			mu.Lock()
			defer mu.Unlock()
			if heal == nil {
				return "stopped flapping (links up)", nil
			}
			d, err := heal(ctx)
			if err == nil {
				heal = nil
			}
			return "stopped flapping, " + d, err
		}
		return ids, fmt.Sprintf("cut %v off, flapping every ~%v", ids, period), undo, nil
	})
}

// Disconnect takes the target's nodes off the network (their veth down):
// they reach no node and no client.
func Disconnect(e *Env, t Target) Nemesis {
	return newFault(e, "disconnect "+t.String(), func(ctx context.Context) ([]uint64, string, undoFunc, error) {
		nw, err := e.Cluster.Net()
		if err != nil {
			return nil, "", nil, err
		}
		ids, err := t.resolve(ctx, e)
		if err != nil {
			return nil, "", nil, err
		}
		var down []uint64
		undo := func(context.Context) (string, error) {
			var errs []error
			for _, id := range down {
				errs = append(errs, nw.LinkUp(id))
			}
			return fmt.Sprintf("links of %v up", down), errors.Join(errs...)
		}
		for _, id := range ids {
			if err := nw.LinkDown(id); err != nil {
				return down, "", undo, err
			}
			down = append(down, id)
		}
		return down, fmt.Sprintf("links of %v down", down), undo, nil
	})
}

// netem applies a tc netem discipline to the target's nodes' outgoing
// traffic; ErrUnsupported where netem is missing (these machines).
func netem(e *Env, name string, t Target, args ...string) Nemesis {
	return newFault(e, name, func(ctx context.Context) ([]uint64, string, undoFunc, error) {
		nw, err := e.Cluster.Net()
		if err != nil {
			return nil, "", nil, err
		}
		if err := nw.NetemSupported(); err != nil {
			return nil, "", nil, err
		}
		ids, err := t.resolve(ctx, e)
		if err != nil {
			return nil, "", nil, err
		}
		var set []uint64
		undo := func(context.Context) (string, error) {
			var errs []error
			for _, id := range set {
				errs = append(errs, nw.ClearNetem(id))
			}
			return fmt.Sprintf("netem removed from %v", set), errors.Join(errs...)
		}
		for _, id := range ids {
			if err := nw.Netem(id, args...); err != nil {
				return set, "", undo, err
			}
			set = append(set, id)
		}
		return set, fmt.Sprintf("netem %v on %v", args, set), undo, nil
	})
}

// Latency delays every packet the target's nodes send by delay ± jitter
// (tc netem; ErrUnsupported where it is missing).
func Latency(e *Env, t Target, delay, jitter time.Duration) Nemesis {
	return netem(e, fmt.Sprintf("latency %v±%v on %s", delay, jitter, t), t, "delay", delay.String(), jitter.String())
}

// Loss drops the given percentage of the packets the target's nodes send
// (tc netem; ErrUnsupported where it is missing).
func Loss(e *Env, t Target, percent float64) Nemesis {
	p := strconv.FormatFloat(percent, 'f', -1, 64) + "%"
	return netem(e, fmt.Sprintf("loss %s on %s", p, t), t, "loss", p)
}
