package cluster

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/internal/raftwire"
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
		Help: "Raft messages dropped by the transport: to a node with no address (unknown_node), for a group with no local replica (unknown_group), or undecodable (undecodable).",
	}, []string{"reason"})
	mRaftReceived = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_cluster_raft_messages_received_total",
		Help: "Raft messages from other nodes handed to local replicas.",
	})
	mForwarded = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_cluster_forwarded_requests_total",
		Help: "Client requests another node forwarded to a local replica, by outcome (answered, no_replica, timeout, throttled).",
	}, []string{"outcome"})
	mForwardedInFlight = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_cluster_forwarded_in_flight",
		Help: "Forwarded client requests waiting for a local replica's answer (at most MaxForwardedInFlight).",
	})
)

// MaxForwardedInFlight bounds the forwarded requests a node serves at
// once; past it they are answered THROTTLED.
const MaxForwardedInFlight = 1024

// ErrUnknownNode is returned for a node with no known address.
var ErrUnknownNode = errors.New("herald: no address known for the node")

// ForwardTimeout is how long a forwarded request may take on the node
// that serves it: a fetch's long poll plus 5 s, else 10 s.
func ForwardTimeout(f *heraldpb.Frame) time.Duration {
	if fe := f.GetFetch(); fe != nil {
		return time.Duration(fe.MaxWaitMs)*time.Millisecond + 5*time.Second
	}
	return 10 * time.Second
}

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
func (n *Node) deliver(m *raftwire.Message) {
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
// replica: with no one to answer, or (a request) answering the sender,
// off the relay's mailbox.
func (n *Node) deliverFrame(ctx actor.Context, m *heraldpb.Forward) {
	n.groups.mu.RLock()
	pid := n.groups.pids[m.Group]
	n.groups.mu.RUnlock()
	sender, sys := ctx.Sender(), ctx.ActorSystem()
	if !m.Request || sender == nil {
		if pid == nil || n.groups.local == nil || m.Frame == nil {
			mRaftDropped.WithLabelValues("unknown_group").Inc()
			return
		}
		n.groups.local.Root.Send(pid, m.Frame)
		return
	}
	if m.Frame == nil {
		return
	}
	if pid == nil || n.groups.local == nil {
		mForwarded.WithLabelValues("no_replica").Inc()
		ctx.Respond(heraldpb.ErrorFrame(m.Frame.Id, heraldpb.NewError(heraldpb.ErrorCode_NOT_LEADER, "node %d holds no replica of %s", n.cfg.NodeID, m.Group)))
		return
	}
	select {
	case n.forwardSlots <- struct{}{}:
	default:
		mForwarded.WithLabelValues("throttled").Inc()
		e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "node %d has %d forwarded requests in flight", n.cfg.NodeID, MaxForwardedInFlight)
		e.RetryAfterMs = 50
		ctx.Respond(heraldpb.ErrorFrame(m.Frame.Id, e))
		return
	}
	mForwardedInFlight.Inc()
	local := n.groups.local
	go func() {
		defer func() { <-n.forwardSlots; mForwardedInFlight.Dec() }()
		res, err := local.Root.RequestFuture(pid, m.Frame, ForwardTimeout(m.Frame)).Result()
		f, ok := res.(*heraldpb.Frame)
		if err != nil || !ok {
			mForwarded.WithLabelValues("timeout").Inc()
			f = heraldpb.ErrorFrame(m.Frame.Id, heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "%s on node %d did not answer in time", m.Group, n.cfg.NodeID))
		} else {
			mForwarded.WithLabelValues("answered").Inc()
		}
		sys.Root.Send(sender, f)
	}()
}

// Request sends a client frame to the replica of group on node to and
// waits for its answer (at most ForwardTimeout plus a second). At most
// once: after a timeout the request may or may not have been served.
func (n *Node) Request(to uint64, group string, f *heraldpb.Frame) (*heraldpb.Frame, error) {
	addr := n.addressOf(to)
	if addr == "" {
		return nil, fmt.Errorf("%w: node %d", ErrUnknownNode, to)
	}
	n.mu.Lock()
	sys := n.inc.sys
	n.mu.Unlock()
	res, err := sys.Root.RequestFuture(actor.NewPID(addr, RelayName), &heraldpb.Forward{Group: group, Frame: f, Request: true},
		ForwardTimeout(f)+time.Second).Result()
	if err != nil {
		return nil, fmt.Errorf("request to node %d: %w", to, err)
	}
	out, ok := res.(*heraldpb.Frame)
	if !ok {
		return nil, fmt.Errorf("request to node %d: answer %T", to, res)
	}
	return out, nil
}

// Forward sends a client frame to the replica of group on node to, fire
// and forget: the caller watches for its effect and sends again if need
// be. It never blocks.
func (n *Node) Forward(to uint64, group string, f *heraldpb.Frame) {
	n.sendTo(to, &heraldpb.Forward{Group: group, Frame: f})
}

// Send sends m to the relay of the node holding the replica with raft id
// to (partition.Transport): heraldpb.ReplicaNode(to), since a replica a
// move added has a raft id of its own. It never blocks.
func (n *Node) Send(to uint64, m *raftwire.Message) {
	n.sendTo(heraldpb.ReplicaNode(to), m)
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
		case *raftwire.Message: // decoded by raftwire's serializer
			n.deliver(m)
		case *heraldpb.RaftMessage: // decoded by protoactor's
			rm, err := raftwire.Decode(m)
			if err != nil {
				mRaftDropped.WithLabelValues("undecodable").Inc()
				n.log.Debug("dropping undecodable raft message", "group", m.Group, "err", err)
				return
			}
			n.deliver(rm)
		case *heraldpb.Forward:
			n.deliverFrame(ctx, m)
		}
	}), RelayName)
	return err
}
