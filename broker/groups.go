package broker

import (
	"context"
	"github.com/heraldmq/herald/registry"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/consumer"
	"github.com/heraldmq/herald/actors/scheduler"
	"github.com/heraldmq/herald/actors/txn"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Consumer groups and the scheduler in a cluster. `__groups` is a replicated topic (one
// partition, replication factor min(3, nodes)) that the controller's
// leader creates once enough nodes have registered. The groups manager,
// with every group's coordinator, runs on the node whose replica leads
// it: the manager rebuilds the groups' progress from that replica, and
// writes progress to it (committed on a majority before it counts).
// Every other node answers subscriptions, group admin requests and
// request-reply calls with NOT_COORDINATOR naming the leader, and the
// client goes there. When leadership moves, the old node ends its
// subscriptions (SubscriptionEnded, reason NOT_COORDINATOR) and stops its
// manager; the new leader starts one, and the clients subscribe again
// there, resuming from the progress in the log.
//
// `__schedule` likewise: the scheduler runs on its leader, which indexes
// every pending delayed batch from its replica; any other node forwards
// delayed produces, cancels and lists to it through the cluster transport
// (SchedulerGroup) and relays the answer.

// coordinateInternal follows the leadership of __groups and __schedule
// (every 100 ms): the groups manager and the scheduler run where their
// topic's leader is.
func (b *Broker) coordinateInternal(reg *registry.Registry) {
	defer b.coordDone.Done()
	lastCreate := map[string]time.Time{}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-b.coordStop:
			return
		case <-tick.C:
		}
		md := b.ctrl.Metadata()
		for _, it := range []struct {
			name       string
			maxMessage uint32
		}{{consumer.GroupsTopic, uint32(b.cfg.MaxMessageBytes)}, {scheduler.ScheduleTopic, b.scheduleMaxMessage()}, {txn.Topic, b.scheduleMaxMessage()}} {
			if md.Topics[it.name] == nil && b.ctrl.Leader() == b.nodeID && len(md.Nodes) >= min(3, len(b.cfg.peers)) &&
				time.Since(lastCreate[it.name]) > 2*time.Second {
				lastCreate[it.name] = time.Now()
				b.createInternal(it.name, len(md.Nodes), it.maxMessage)
			}
		}
		gLeader, gLead := b.leads(reg, consumer.GroupsTopic)
		sLeader, sLead := b.leads(reg, scheduler.ScheduleTopic)
		b.groupsLeader.Store(gLeader)
		b.schedLeader.Store(sLeader)
		b.groupsMu.Lock()
		switch running := b.groups != nil; {
		case gLead && !running:
			pid, err := b.sys.Root.SpawnNamed(b.groupsProps, consumer.ManagerName)
			if err != nil {
				b.log.Error("starting the groups manager", "err", err)
				break
			}
			b.groups = pid
			b.member.Register(GroupsGroup, pid)
			b.groupsHere.Store(true)
			b.log.Info("coordinating consumer groups: this node leads __groups")
		case !gLead && running:
			b.resignGroups(gLeader)
		}
		switch running := b.sched != nil; {
		case sLead && !running:
			pid, err := b.sys.Root.SpawnNamed(b.schedProps, scheduler.ActorName)
			if err != nil {
				b.log.Error("starting the scheduler", "err", err)
				break
			}
			b.sched = pid
			b.member.Register(SchedulerGroup, pid)
			b.schedHere.Store(true)
			b.log.Info("running the scheduler: this node leads __schedule")
		case !sLead && running:
			b.schedHere.Store(false)
			b.member.Unregister(SchedulerGroup)
			if _, err := b.sys.Root.StopFuture(b.sched).Result(); err != nil {
				b.log.Error("stopping the scheduler", "err", err)
			}
			b.sched = nil
			b.log.Info("stopped the scheduler: this node no longer leads __schedule", "leader", sLeader)
		}
		b.followTxn(reg)
		b.groupsMu.Unlock()
	}
}

// leads reports the leader of an internal cluster topic's partition 0 as
// this node knows it, and whether it is this node (with its replica
// accepting writes and caught up with its log).
func (b *Broker) leads(reg *registry.Registry, name string) (uint64, bool) {
	e := reg.Get(name)
	if e == nil || e.Record == nil || len(e.Stats) != 1 {
		return 0, false
	}
	leader := e.Stats[0].Leader.Load()
	// Idempotent: the leader applied an entry of its own term, so it holds
	// (and has applied) every committed entry the room loads its state from.
	return leader, e.Dirs[0] != "" && leader == b.nodeID && e.Stats[0].Writable.Load() && e.Stats[0].Idempotent.Load()
}

// createInternal has the controller create an internal topic of one
// partition, replicated on up to three nodes.
func (b *Broker) createInternal(name string, nodes int, maxMessage uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := b.ctrl.CreateTopic(ctx, name, &heraldpb.TopicConfig{
		Partitions: 1, ReplicationFactor: uint32(min(3, nodes)), MaxMessageBytes: maxMessage,
	})
	if err != nil {
		if e, ok := err.(*heraldpb.Error); !ok || e.Code != heraldpb.ErrorCode_TOPIC_ALREADY_EXISTS {
			b.log.Warn("creating a replicated internal topic", "topic", name, "err", err)
		}
		return
	}
	b.log.Info("created a replicated internal topic", "topic", name, "replication", min(3, nodes))
}

// resignGroups ends this node's group coordination: new requests are
// refused at once, every subscription ends with NOT_COORDINATOR (naming
// the new leader when known), and the manager stops. Called with
// groupsMu held.
func (b *Broker) resignGroups(leader uint64) {
	b.groupsHere.Store(false)
	b.member.Unregister(GroupsGroup)
	why := heraldpb.NewError(heraldpb.ErrorCode_NOT_COORDINATOR, "node %d no longer coordinates consumer groups", b.nodeID)
	why.Leader = uint32(leader)
	if res, err := b.sys.Root.RequestFuture(b.groups, &consumer.Coordinators{}, 5*time.Second).Result(); err == nil {
		var ends []*actor.Future // all at once: one slow group does not hold up the others
		for _, pid := range res.(*consumer.CoordinatorsList).PIDs {
			ends = append(ends, b.sys.Root.RequestFuture(pid, &consumer.EndSessions{Reason: why}, 5*time.Second))
		}
		for _, f := range ends {
			_, _ = f.Result()
		}
	}
	if _, err := b.sys.Root.StopFuture(b.groups).Result(); err != nil {
		b.log.Error("stopping the groups manager", "err", err)
	}
	b.groups = nil
	b.log.Info("stopped coordinating consumer groups: this node no longer leads __groups", "leader", leader)
}
