package topic

import (
	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
)

// Router hands decoded client requests to actors. It implements
// netio.Router: Route runs on a network event loop and never blocks.
type Router struct {
	sys     *actor.ActorSystem
	reg     *registry.Registry
	manager *actor.PID
}

// NewRouter routes through reg, sending admin requests to manager.
func NewRouter(sys *actor.ActorSystem, reg *registry.Registry, manager *actor.PID) *Router {
	return &Router{sys: sys, reg: reg, manager: manager}
}

// Route sends f to the actor that serves it; that actor answers replyTo.
func (r *Router) Route(f *heraldpb.Frame, replyTo *actor.PID) {
	switch b := f.Body.(type) {
	case *heraldpb.Frame_Produce:
		if registry.IsInternal(b.Produce.Topic) {
			r.fail(f, replyTo, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "topic %q is internal: clients cannot produce to it", b.Produce.Topic))
			return
		}
		if b.Produce.NotBeforeMs != 0 {
			r.fail(f, replyTo, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "not_before_ms is internal to the broker: use deliver_at_ms or delay_ms"))
			return
		}
		e := r.reg.Get(b.Produce.Topic)
		if e == nil {
			r.fail(f, replyTo, r.missing(b.Produce.Topic))
			return
		}
		// The routing table decides on the network loop: no mailbox hop
		// between the connection and the partition.
		part, to, perr := e.Route(b.Produce)
		if perr != nil {
			r.fail(f, replyTo, perr)
			return
		}
		b.Produce.Partition = &part
		r.sys.Root.RequestWithCustomSender(to, f, replyTo)
	case *heraldpb.Frame_Fetch:
		if b.Fetch.IncludeHeld {
			r.fail(f, replyTo, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "include_held is internal to the broker"))
			return
		}
		r.toPartition(f, replyTo, b.Fetch.Topic, b.Fetch.Partition)
	case *heraldpb.Frame_ListOffsets:
		r.toPartition(f, replyTo, b.ListOffsets.Topic, b.ListOffsets.Partition)
	case *heraldpb.Frame_RepairPartition:
		// The node's own replica: a node without one answers through its
		// stand-in, which refuses (repair is per replica).
		r.toPartition(f, replyTo, b.RepairPartition.Topic, b.RepairPartition.Partition)
	case *heraldpb.Frame_Metadata, *heraldpb.Frame_CreateTopic, *heraldpb.Frame_DeleteTopic,
		*heraldpb.Frame_ListTopics, *heraldpb.Frame_DescribeTopic, *heraldpb.Frame_ClusterAdmin:
		r.sys.Root.RequestWithCustomSender(r.manager, f, replyTo)
	default:
		r.fail(f, replyTo, heraldpb.NewError(heraldpb.ErrorCode_UNKNOWN_REQUEST, "no handler for %T", f.Body))
	}
}

func (r *Router) toPartition(f *heraldpb.Frame, replyTo *actor.PID, topic string, part uint32) {
	e := r.reg.Get(topic)
	if e == nil {
		r.fail(f, replyTo, r.missing(topic))
		return
	}
	if int(part) >= len(e.Partitions) {
		r.fail(f, replyTo, partitionNotFound(topic, part, len(e.Partitions)))
		return
	}
	r.sys.Root.RequestWithCustomSender(e.Partitions[part], f, replyTo)
}

// missing is the answer for a topic the registry does not list:
// TOPIC_NOT_FOUND once the node has caught up with the cluster's
// metadata, NOT_READY before.
func (r *Router) missing(topic string) *heraldpb.Error {
	if !r.reg.Synced() {
		return registry.NotReady(topic)
	}
	return topicNotFound(topic)
}

func (r *Router) fail(f *heraldpb.Frame, replyTo *actor.PID, e *heraldpb.Error) {
	r.sys.Root.Send(replyTo, heraldpb.ErrorFrame(f.Id, e))
}

func topicNotFound(name string) *heraldpb.Error {
	return heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q does not exist", name)
}

func partitionNotFound(topic string, part uint32, n int) *heraldpb.Error {
	return heraldpb.NewError(heraldpb.ErrorCode_PARTITION_NOT_FOUND, "topic %q has %d partitions; there is no partition %d", topic, n, part)
}

func clusterStarting() *heraldpb.Error {
	e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "the node is joining its cluster; try again shortly")
	e.RetryAfterMs = 500
	return e
}
