package broker

import (
	"fmt"
	"github.com/heraldmq/herald/registry"
	"sync"
	"time"

	"github.com/heraldmq/herald/actors/partition"
)

// readiness tracks whether the node has caught up after its start: it
// turns ready once, when the node knows the cluster's topics (the
// controller's metadata is applied) and every local partition replica is
// readable up to its high watermark, and stays ready until shutdown.
// /healthz stays the liveness check (the process serves); /readyz and the
// /cluster JSON report readiness, and "herald ready" is logged when it
// turns.
//
// A replica is readable to its high watermark when it knows its leader
// and
//   - it leads: it accepts idempotent produces (Stats.Idempotent), so its
//     whole log is written, every entry of earlier terms applied and its
//     producer table loaded; or
//   - it follows: its high watermark reached the end its log had when it
//     was first seen open (entries written before the restart that the
//     leader committed), or its whole log (the leader discarded an
//     uncommitted tail).
type readiness struct {
	mu      sync.Mutex
	ready   bool
	why     string                     // what is not ready yet
	targets map[*partition.Stats]int64 // a follower's log end when first seen open
	started time.Time
}

// check re-evaluates readiness and reports it; once ready it stays so.
func (r *readiness) check(reg *registry.Registry, self uint64) (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ready {
		return true, ""
	}
	if r.targets == nil {
		r.targets = map[*partition.Stats]int64{}
	}
	why := ""
	if !reg.Synced() {
		why = "the cluster's metadata is not loaded yet"
	}
	waiting := 0
	for _, e := range reg.All() {
		for i, st := range e.Stats {
			if e.Record != nil && (i >= len(e.Dirs) || e.Dirs[i] == "") {
				continue // no local replica
			}
			if st.Conf.Load() == nil {
				waiting++ // not open yet
				if why == "" {
					why = fmt.Sprintf("partition %s-%d is opening its log", e.Name, i)
				}
				continue
			}
			if ok, what := r.replicaReady(st, self); !ok {
				waiting++
				if why == "" {
					why = fmt.Sprintf("partition %s-%d %s", e.Name, i, what)
				}
			}
		}
	}
	if why != "" {
		if waiting > 1 {
			why = fmt.Sprintf("%s (%d partitions not ready)", why, waiting)
		}
		r.why = why
		return false, why
	}
	r.ready, r.why, r.targets = true, "", nil
	return true, ""
}

func (r *readiness) replicaReady(st *partition.Stats, self uint64) (bool, string) {
	end := st.EndOffset.Load()
	target, seen := r.targets[st]
	if !seen {
		target = end
		r.targets[st] = target
	}
	leader := st.Leader.Load()
	switch {
	case leader == 0:
		return false, "has no leader yet"
	case leader == self:
		if !st.Idempotent.Load() {
			return false, "leads and is still replaying its log"
		}
	default:
		if hw := st.HighWatermark.Load(); hw < target && hw < end {
			return false, fmt.Sprintf("is readable to offset %d of %d", hw, min(target, end))
		}
	}
	return true, ""
}

// Ready reports whether the node is ready (see readiness) and, when not,
// what it waits for.
func (b *Broker) Ready() (bool, string) {
	if b.closing.Load() {
		return false, "shutting down"
	}
	return b.readiness.check(b.reg, b.nodeID)
}

// watchReady logs "herald ready" once the node turns ready.
func (b *Broker) watchReady(stop <-chan struct{}) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	last := time.Now()
	for {
		ok, why := b.Ready()
		if ok {
			b.log.Info("herald ready", "node", b.nodeID, "after", time.Since(b.readiness.started).Round(time.Millisecond))
			return
		}
		if time.Since(last) >= 5*time.Second {
			last = time.Now()
			b.log.Info("herald not ready yet", "waiting_for", why)
		}
		select {
		case <-t.C:
		case <-stop:
			return
		}
	}
}
