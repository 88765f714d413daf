package broker

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/scheduler"
	"github.com/heraldmq/herald/actors/topic"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"github.com/heraldmq/herald/timewheel"
)

// startScheduler makes sure `__schedule` exists and starts the scheduler
// (on a single node; in a cluster coordinateInternal runs it on the leader
// of the replicated __schedule).
func (b *Broker) startScheduler(reg *registry.Registry, clustered bool) error {
	farDir := filepath.Join(b.cfg.DataDir, "scheduler-far")
	b.schedProps = scheduler.Props(scheduler.Options{
		Topics: reg, Logger: b.log, MaxDelay: b.cfg.MaxDelay, MaxPending: b.cfg.MaxScheduled, AppendAhead: appendAhead(b.cfg.ScheduleAhead), NoFence: !b.cfg.ScheduleFence,
		Now: b.clock.Now, Anchor: b.clusterNow(clustered),
		// Timers beyond the wheel's 65 s window wait on disk, one file per
		// 65 s bucket, rebuilt from __schedule at every start.
		NewFar: func() (timewheel.FarStore, error) {
			return timewheel.OpenDiskFar(farDir, timewheel.DiskFarOptions{FS: b.fs})
		},
	})
	if clustered {
		return nil
	}
	res, err := b.sys.Root.RequestFuture(b.manager, &topic.EnsureInternal{Name: scheduler.ScheduleTopic, Partitions: 1, MaxMessageBytes: b.scheduleMaxMessage()}, 30*time.Second).Result()
	if err == nil {
		err = res.(*topic.EnsureInternalResult).Err
	}
	if err != nil {
		return fmt.Errorf("internal topic %s: %w", scheduler.ScheduleTopic, err)
	}
	if b.sched, err = b.sys.Root.SpawnNamed(b.schedProps, scheduler.ActorName); err != nil {
		return fmt.Errorf("scheduler: %w", err)
	}
	return nil
}

// clusterNow is the scheduler's Anchor: in a cluster, the cluster's time
// (cluster.Node.ClusterNow: the median of the live nodes' clocks, asked
// for at most a second), so that a node whose clock was stepped before
// the scheduler moved to it does not run the pending delayed messages
// early; on a single node (nil) the node's own clock.
func (b *Broker) clusterNow(clustered bool) func() time.Time {
	if !clustered {
		return nil
	}
	return func() time.Time {
		if b.member == nil {
			return b.clock.Now()
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		now, offset, peers := b.member.ClusterNow(ctx)
		b.log.Info("the scheduler takes the cluster's time", "peers_answered", peers, "cluster_minus_node", offset.Round(time.Millisecond))
		return now
	}
}

// scheduleMaxMessage is __schedule's max message size: one write packs
// events up to 1 MiB, or one delayed batch of up to the max message size
// plus its envelope.
func (b *Broker) scheduleMaxMessage() uint32 {
	return uint32(max(1<<20, b.cfg.MaxMessageBytes) + 64<<10)
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

// SchedulerGroup is the name the active scheduler of a cluster is
// reachable under through the cluster transport.
const SchedulerGroup = "herald-scheduler"

// maxSchedForwards bounds the scheduler requests a node has forwarded to
// the node running the scheduler and not had answered.
const maxSchedForwards = 1024

// routeScheduled hands f to the scheduler: the local one on a single node
// or where it runs; else, in a cluster, forwards it to the node running it
// (the leader of __schedule) and relays the answer.
func (b *Broker) routeScheduled(f *heraldpb.Frame, replyTo *actor.PID) {
	if b.member == nil || b.schedHere.Load() {
		b.sys.Root.RequestWithCustomSender(actor.NewPID(b.sys.Address(), scheduler.ActorName), f, replyTo)
		return
	}
	leader := b.schedLeader.Load()
	if leader == 0 || leader == b.nodeID {
		e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "no node runs the scheduler right now (__schedule is electing a leader)")
		e.RetryAfterMs = 200
		b.sys.Root.Send(replyTo, heraldpb.ErrorFrame(f.Id, e))
		return
	}
	select {
	case b.schedForwards <- struct{}{}:
	default:
		e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "node %d has %d scheduler requests forwarded and unanswered", b.nodeID, maxSchedForwards)
		e.RetryAfterMs = 50
		b.sys.Root.Send(replyTo, heraldpb.ErrorFrame(f.Id, e))
		return
	}
	go func() {
		defer func() { <-b.schedForwards }()
		resp, err := b.member.Request(leader, SchedulerGroup, f)
		switch {
		case err != nil:
			resp = heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "the scheduler on node %d: %v", leader, err))
		case resp.GetError().GetCode() == heraldpb.ErrorCode_NOT_LEADER:
			// That node stopped running it (leadership of __schedule moved).
			e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "the scheduler is moving from node %d", leader)
			e.RetryAfterMs = 200
			resp = heraldpb.ErrorFrame(f.Id, e)
		}
		b.sys.Root.Send(replyTo, resp)
	}()
}

// appendAhead is the scheduler's AppendAhead for --schedule-ahead (0 there
// means at the time, which the scheduler spells negative).
func appendAhead(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
