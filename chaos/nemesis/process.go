package nemesis

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/heraldmq/herald/chaos/cluster"
)

// Kill SIGKILLs the target's nodes at Start and starts them again at
// Stop (Stop waits until they serve, not until they are ready: see
// Cluster.WaitReady). Nodes already down are left alone.
func Kill(e *Env, t Target) Nemesis {
	return newFault(e, "kill "+t.String(), func(ctx context.Context) ([]uint64, string, undoFunc, error) {
		ids, err := t.resolve(ctx, e)
		if err != nil {
			return nil, "", nil, err
		}
		var killed []uint64
		var errs []error
		for _, id := range ids {
			switch err := e.Cluster.Kill(id); {
			case err == nil:
				killed = append(killed, id)
			case !errors.Is(err, cluster.ErrNotRunning):
				errs = append(errs, err)
			}
		}
		var undo undoFunc
		if len(killed) > 0 {
			undo = func(ctx context.Context) (string, error) {
				var errs []error
				for _, id := range killed {
					if err := e.Cluster.StartNode(ctx, id); err != nil && !errors.Is(err, cluster.ErrRunning) {
						errs = append(errs, err)
					}
				}
				return fmt.Sprintf("restarted nodes %v", killed), errors.Join(errs...)
			}
		}
		return killed, fmt.Sprintf("SIGKILL to nodes %v (%s)", killed, t), undo, errors.Join(errs...)
	})
}

// Pause freezes the target's nodes with SIGSTOP at Start and thaws them
// with SIGCONT at Stop.
func Pause(e *Env, t Target) Nemesis {
	return newFault(e, "pause "+t.String(), func(ctx context.Context) ([]uint64, string, undoFunc, error) {
		ids, err := t.resolve(ctx, e)
		if err != nil {
			return nil, "", nil, err
		}
		var paused []uint64
		var errs []error
		for _, id := range ids {
			if err := e.Cluster.Pause(id); err != nil {
				errs = append(errs, err)
				continue
			}
			paused = append(paused, id)
		}
		var undo undoFunc
		if len(paused) > 0 {
			undo = func(context.Context) (string, error) {
				var errs []error
				for _, id := range paused {
					// A node killed meanwhile is not paused any more.
					if err := e.Cluster.Resume(id); err != nil && !errors.Is(err, cluster.ErrNotRunning) {
						errs = append(errs, err)
					}
				}
				return fmt.Sprintf("SIGCONT to nodes %v", paused), errors.Join(errs...)
			}
		}
		return paused, fmt.Sprintf("SIGSTOP to nodes %v (%s)", paused, t), undo, errors.Join(errs...)
	})
}

// RollingRestart restarts every running node in turn at Start, in a
// random order: it stops one (gracefully with SIGTERM if graceful, else
// SIGKILL), starts it again and waits until it is ready before the next.
// Each restart is reported as a step. Stop starts any node a failed
// step left down.
func RollingRestart(e *Env, graceful bool) Nemesis {
	how := "SIGKILL"
	if graceful {
		how = "SIGTERM"
	}
	name := "rolling restart (" + how + ")"
	return newFault(e, name, func(ctx context.Context) ([]uint64, string, undoFunc, error) {
		order := e.shuffled(e.running())
		// Heal: start any node a failed step left down.
		undo := func(ctx context.Context) (string, error) {
			var started []uint64
			var errs []error
			for _, id := range order {
				if e.Cluster.Running(id) {
					continue
				}
				if err := e.Cluster.StartNode(ctx, id); err != nil {
					errs = append(errs, err)
					continue
				}
				started = append(started, id)
			}
			return fmt.Sprintf("started nodes left down: %v", started), errors.Join(errs...)
		}
		var done []uint64
		for _, id := range order {
			begin := time.Now()
			var err error
			if graceful {
				err = e.Cluster.Shutdown(ctx, id)
			} else {
				err = e.Cluster.Kill(id)
			}
			if err == nil || errors.Is(err, cluster.ErrNotRunning) {
				err = e.Cluster.StartNode(ctx, id)
			}
			if err == nil {
				err = e.Cluster.WaitReady(ctx, id)
			}
			e.emit(Event{Nemesis: name, Op: OpStep, Nodes: []uint64{id}, Begin: begin, End: time.Now(),
				Detail: fmt.Sprintf("%s and restart of node %d", how, id), Err: err})
			if err != nil {
				return done, fmt.Sprintf("restarted nodes %v of %v", done, order), undo, err
			}
			done = append(done, id)
		}
		return done, fmt.Sprintf("restarted nodes %v in turn", done), undo, nil
	})
}
