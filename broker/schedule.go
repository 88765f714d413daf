package broker

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/scheduler"
	"github.com/heraldmq/herald/actors/topic"
	heraldpb "github.com/heraldmq/herald/proto"
)

// startScheduler makes sure `__schedule` exists and starts the scheduler
// actor on it.
func (b *Broker) startScheduler(reg *topic.Registry) error {
	// One write packs events up to 1 MiB, or one delayed batch of up to
	// the max message size plus its envelope.
	limit := uint32(max(1<<20, b.cfg.MaxMessageBytes) + 64<<10)
	res, err := b.sys.Root.RequestFuture(b.manager, &topic.EnsureInternal{Name: scheduler.ScheduleTopic, Partitions: 1, MaxMessageBytes: limit}, 30*time.Second).Result()
	if err == nil {
		err = res.(*topic.EnsureInternalResult).Err
	}
	if err != nil {
		return fmt.Errorf("internal topic %s: %w", scheduler.ScheduleTopic, err)
	}
	farDir := filepath.Join(b.cfg.DataDir, "scheduler-far")
	b.sched, err = b.sys.Root.SpawnNamed(scheduler.Props(scheduler.Options{
		Topics: reg, Logger: b.log, MaxDelay: b.cfg.MaxDelay, MaxPending: b.cfg.MaxScheduled,
		// Timers beyond the wheel's 65 s window wait on disk, one file per
		// 65 s bucket, rebuilt from __schedule at every start.
		NewFar: func() (scheduler.FarStore, error) { return scheduler.OpenDiskFar(farDir, scheduler.DiskFarOptions{}) },
	}), scheduler.ActorName)
	if err != nil {
		return fmt.Errorf("scheduler: %w", err)
	}
	return nil
}

// toScheduler reports whether f is the scheduler's: a delayed produce, or
// a cancel or list of delayed batches.
func toScheduler(f *heraldpb.Frame) bool {
	switch b := f.Body.(type) {
	case *heraldpb.Frame_Produce:
		return b.Produce.GetDeliverAtMs() != 0 || b.Produce.GetDelayMs() != 0
	case *heraldpb.Frame_CancelScheduled, *heraldpb.Frame_ListScheduled:
		return true
	}
	return false
}

// routeScheduled hands f to the scheduler.
func routeScheduled(sys *actor.ActorSystem, sched *actor.PID, f *heraldpb.Frame, replyTo *actor.PID) {
	sys.Root.RequestWithCustomSender(sched, f, replyTo)
}
