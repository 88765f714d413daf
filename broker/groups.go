package broker

import (
	"context"
	"time"

	"github.com/heraldmq/herald/actors/consumer"
	"github.com/heraldmq/herald/actors/topic"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Consumer groups in a cluster. `__groups` is a replicated topic (one
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

// coordinateGroups follows the leadership of __groups (every 100 ms).
func (b *Broker) coordinateGroups(reg *topic.Registry) {
	defer b.coordDone.Done()
	var lastCreate time.Time
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-b.coordStop:
			return
		case <-tick.C:
		}
		md := b.ctrl.Metadata()
		if md.Topics[consumer.GroupsTopic] == nil {
			if b.ctrl.Leader() == b.nodeID && len(md.Nodes) >= min(3, len(b.cfg.peers)) && time.Since(lastCreate) > 2*time.Second {
				lastCreate = time.Now()
				b.createGroupsTopic(len(md.Nodes))
			}
			continue
		}
		e := reg.Get(consumer.GroupsTopic)
		var leader uint64
		lead := false
		if e != nil && e.Record != nil && len(e.Stats) == 1 {
			leader = e.Stats[0].Leader.Load()
			lead = e.Dirs[0] != "" && leader == b.nodeID && e.Stats[0].Writable.Load()
		}
		b.groupsLeader.Store(leader)
		b.groupsMu.Lock()
		switch running := b.groups != nil; {
		case lead && !running:
			pid, err := b.sys.Root.SpawnNamed(b.groupsProps, consumer.ManagerName)
			if err != nil {
				b.log.Error("starting the groups manager", "err", err)
				break
			}
			b.groups = pid
			b.groupsHere.Store(true)
			b.log.Info("coordinating consumer groups: this node leads __groups")
		case !lead && running:
			b.resignGroups(leader)
		}
		b.groupsMu.Unlock()
	}
}

// createGroupsTopic has the controller create __groups.
func (b *Broker) createGroupsTopic(nodes int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := b.ctrl.CreateTopic(ctx, consumer.GroupsTopic, &heraldpb.TopicConfig{
		Partitions: 1, ReplicationFactor: uint32(min(3, nodes)), MaxMessageBytes: uint32(b.cfg.MaxMessageBytes),
	})
	if err != nil {
		if e, ok := err.(*heraldpb.Error); !ok || e.Code != heraldpb.ErrorCode_TOPIC_ALREADY_EXISTS {
			b.log.Warn("creating the replicated __groups topic", "err", err)
		}
		return
	}
	b.log.Info("created the replicated __groups topic", "replication", min(3, nodes))
}

// resignGroups ends this node's group coordination: new requests are
// refused at once, every subscription ends with NOT_COORDINATOR (naming
// the new leader when known), and the manager stops. Called with
// groupsMu held.
func (b *Broker) resignGroups(leader uint64) {
	b.groupsHere.Store(false)
	why := heraldpb.NewError(heraldpb.ErrorCode_NOT_COORDINATOR, "node %d no longer coordinates consumer groups", b.nodeID)
	why.Leader = uint32(leader)
	if res, err := b.sys.Root.RequestFuture(b.groups, &consumer.Coordinators{}, 5*time.Second).Result(); err == nil {
		for _, pid := range res.(*consumer.CoordinatorsList).PIDs {
			_, _ = b.sys.Root.RequestFuture(pid, &consumer.EndSessions{Reason: why}, 5*time.Second).Result()
		}
	}
	if _, err := b.sys.Root.StopFuture(b.groups).Result(); err != nil {
		b.log.Error("stopping the groups manager", "err", err)
	}
	b.groups = nil
	b.log.Info("stopped coordinating consumer groups: this node no longer leads __groups", "leader", leader)
}
