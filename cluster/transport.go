package cluster

import (
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Raft transport: the replicas of a raft group on different nodes talk
// through their nodes' cluster actor systems. Each incarnation runs a relay
// actor under the fixed name RelayName; Send addresses the peer node's
// relay, which hands the message to the local replica registered for its
// group (Register) in the node's local actor system. Delivery is at most
// once, as protoactor remote's is: raft retransmits what is lost.
// protoactor's endpoint writer batches the messages to one node.

// RelayName is the relay actor's name in every cluster actor system.
const RelayName = "herald-relay"

var (
	mRaftSent = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_cluster_raft_messages_sent_total",
		Help: "Raft messages handed to the cluster transport for another node.",
	})
	mRaftDropped = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_cluster_raft_messages_dropped_total",
		Help: "Raft messages dropped by the transport: to a node with no address (unknown_node), or for a group with no local replica (unknown_group).",
	}, []string{"reason"})
	mRaftReceived = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_cluster_raft_messages_received_total",
		Help: "Raft messages from other nodes handed to local replicas.",
	})
)

// groups maps raft group names to their local replicas.
type groups struct {
	mu    sync.RWMutex
	local *actor.ActorSystem
	pids  map[string]*actor.PID
}

// Register routes group's messages from other nodes to pid, in the local
// actor system given in Config.Local.
func (n *Node) Register(group string, pid *actor.PID) {
	n.groups.mu.Lock()
	defer n.groups.mu.Unlock()
	n.groups.pids[group] = pid
}

// Unregister stops routing group's messages (the replica stopped).
func (n *Node) Unregister(group string) {
	n.groups.mu.Lock()
	defer n.groups.mu.Unlock()
	delete(n.groups.pids, group)
}

// deliver hands a message from another node to its group's local replica.
func (n *Node) deliver(m *heraldpb.RaftMessage) {
	n.groups.mu.RLock()
	pid := n.groups.pids[m.Group]
	n.groups.mu.RUnlock()
	if pid == nil || n.groups.local == nil {
		mRaftDropped.WithLabelValues("unknown_group").Inc()
		return
	}
	mRaftReceived.Inc()
	n.groups.local.Root.Send(pid, m)
}

// deliverFrame hands a forwarded client frame to its group's local
// replica, with no one to answer.
func (n *Node) deliverFrame(m *heraldpb.Forward) {
	n.groups.mu.RLock()
	pid := n.groups.pids[m.Group]
	n.groups.mu.RUnlock()
	if pid == nil || n.groups.local == nil || m.Frame == nil {
		mRaftDropped.WithLabelValues("unknown_group").Inc()
		return
	}
	n.groups.local.Root.Send(pid, m.Frame)
}

// Forward sends a client frame to the replica of group on node to, fire
// and forget: the caller watches for its effect and sends again if need
// be. It never blocks.
func (n *Node) Forward(to uint64, group string, f *heraldpb.Frame) {
	n.sendTo(to, &heraldpb.Forward{Group: group, Frame: f})
}

// Send sends m to node to's relay (partition.Transport). It never blocks.
func (n *Node) Send(to uint64, m *heraldpb.RaftMessage) {
	n.sendTo(to, m)
}

func (n *Node) sendTo(to uint64, m interface{}) {
	addr := n.addressOf(to)
	if addr == "" {
		mRaftDropped.WithLabelValues("unknown_node").Inc()
		return
	}
	n.mu.Lock()
	sys := n.inc.sys
	n.mu.Unlock()
	mRaftSent.Inc()
	sys.Root.Send(actor.NewPID(addr, RelayName), m)
}

// addressOf is node id's cluster address: from the view, else from Peers.
func (n *Node) addressOf(id uint64) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, m := range n.view.Members {
		if m.NodeID == id {
			return m.Address
		}
	}
	if a, ok := n.cfg.Peers[id]; ok {
		return a
	}
	return n.learned[id].cluster
}

// spawnRelay starts the relay actor of an incarnation.
func (n *Node) spawnRelay(sys *actor.ActorSystem) error {
	_, err := sys.Root.SpawnNamed(actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case *heraldpb.RaftMessage:
			n.deliver(m)
		case *heraldpb.Forward:
			n.deliverFrame(m)
		}
	}), RelayName)
	return err
}
