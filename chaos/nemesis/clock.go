package nemesis

import (
	"context"
	"fmt"
	"time"
)

// scheduleTopic is the scheduler's internal topic: the node leading its
// partition runs the scheduler.
const scheduleTopic = "__schedule"

// SteppedScheduler steps the clock of a node that does not run the
// scheduler by offset ({"clock_offset": offset}), then moves the
// scheduler to that node: it pauses (SIGSTOP) the node leading
// __schedule until another node leads it, resumes it, and again, until
// the stepped node leads (at most moveFor). So the scheduler starts on a
// node whose clock was stepped before it started, with the delayed
// messages the scheduler before it took still pending. Stop sets the
// clock back to 0s; the scheduler stays where it is.
func SteppedScheduler(e *Env, offset time.Duration) Nemesis {
	on := map[string]any{"clock_offset": offset.String()}
	off := map[string]any{"clock_offset": "0s"}
	return newFault(e, fmt.Sprintf("clock %v on a node, then the scheduler moved to it", offset), func(ctx context.Context) ([]uint64, string, undoFunc, error) {
		sched, err := e.Cluster.Leader(ctx, scheduleTopic, 0)
		if err != nil {
			return nil, "", nil, err
		}
		var target uint64
		for _, id := range e.shuffled(e.running()) {
			if id != sched && !e.Cluster.Paused(id) {
				target = id
				break
			}
		}
		if target == 0 {
			return nil, "", nil, fmt.Errorf("%w: no running node other than the scheduler's (node %d)", ErrNoTarget, sched)
		}
		undo := func(ctx context.Context) (string, error) {
			return fmt.Sprintf("POST /debug/faults clock_offset 0s to node %d", target), e.Cluster.Faults(ctx, target, off)
		}
		if err := e.Cluster.Faults(ctx, target, on); err != nil {
			return nil, "", undo, err
		}
		moved, err := moveLeader(ctx, e, scheduleTopic, target)
		detail := fmt.Sprintf("clock %v on node %d; the scheduler moved to it from node %d (paused in turn: %v)", offset, target, sched, moved)
		return []uint64{target}, detail, undo, err
	})
}

// moveFor bounds how long moveLeader tries.
const moveFor = 60 * time.Second

// moveLeader makes node target the leader of topic's partition 0 by
// pausing whichever node leads it until another one does, then resuming
// it. It returns the nodes it paused, in order.
func moveLeader(ctx context.Context, e *Env, topic string, target uint64) ([]uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, moveFor)
	defer cancel()
	var paused []uint64
	for {
		l, err := e.Cluster.Leader(ctx, topic, 0)
		if err != nil {
			return paused, err
		}
		if l == target {
			return paused, nil
		}
		if err := e.Cluster.Pause(l); err != nil {
			return paused, err
		}
		paused = append(paused, l)
		err = waitFor(ctx, func(ctx context.Context) bool {
			now, err := e.Cluster.Leader(ctx, topic, 0)
			return err == nil && now != l
		})
		if rerr := e.Cluster.Resume(l); rerr != nil && err == nil {
			err = rerr
		}
		if err != nil {
			return paused, fmt.Errorf("moving %s's leadership to node %d: %w", topic, target, err)
		}
	}
}

// waitFor polls ok every 100 ms until it holds or ctx ends.
func waitFor(ctx context.Context, ok func(context.Context) bool) error {
	for {
		if ok(ctx) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
