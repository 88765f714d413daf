package topic

// The topic room's routes: client requests handed to partition actors and to the manager, on the network loops.

import (
	"reflect"

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
	routes  map[reflect.Type]Handler
}

// NewRouter routes through reg, sending admin requests to manager.
func NewRouter(sys *actor.ActorSystem, reg *registry.Registry, manager *actor.PID) *Router {
	r := &Router{sys: sys, reg: reg, manager: manager}
	r.routes = r.Routes()
	return r
}

// Handler serves one request type: it sends f to the actor that serves
// it (which answers replyTo) or answers replyTo itself. Handlers run on
// the network event loops and never block.
type Handler = func(f *heraldpb.Frame, replyTo *actor.PID)

// Routes is the topic room's part of the node's routing table: a handler
// per request body type (the broker merges every room's into one table).
func (r *Router) Routes() map[reflect.Type]Handler {
	admin := func(f *heraldpb.Frame, replyTo *actor.PID) { r.sys.Root.RequestWithCustomSender(r.manager, f, replyTo) }
	return map[reflect.Type]Handler{
		reflect.TypeOf(&heraldpb.Frame_Produce{}): r.produce,
		reflect.TypeOf(&heraldpb.Frame_Fetch{}): func(f *heraldpb.Frame, replyTo *actor.PID) {
			b := f.GetFetch()
			if b.IncludeHeld {
				r.fail(f, replyTo, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "include_held is internal to the broker"))
				return
			}
			r.toPartition(f, replyTo, b.Topic, b.Partition)
		},
		reflect.TypeOf(&heraldpb.Frame_ListOffsets{}): func(f *heraldpb.Frame, replyTo *actor.PID) {
			r.toPartition(f, replyTo, f.GetListOffsets().Topic, f.GetListOffsets().Partition)
		},
		// The node's own replica: a node without one answers through its
		// stand-in, which refuses (repair is per replica).
		reflect.TypeOf(&heraldpb.Frame_RepairPartition{}): func(f *heraldpb.Frame, replyTo *actor.PID) {
			r.toPartition(f, replyTo, f.GetRepairPartition().Topic, f.GetRepairPartition().Partition)
		},
		reflect.TypeOf(&heraldpb.Frame_Metadata{}):      admin,
		reflect.TypeOf(&heraldpb.Frame_CreateTopic{}):   admin,
		reflect.TypeOf(&heraldpb.Frame_DeleteTopic{}):   admin,
		reflect.TypeOf(&heraldpb.Frame_ListTopics{}):    admin,
		reflect.TypeOf(&heraldpb.Frame_DescribeTopic{}): admin,
		reflect.TypeOf(&heraldpb.Frame_ClusterAdmin{}):  admin,
	}
}

// Route serves f through Routes (tests; the broker routes through its
// merged table).
func (r *Router) Route(f *heraldpb.Frame, replyTo *actor.PID) {
	if h := r.routes[reflect.TypeOf(f.Body)]; h != nil {
		h(f, replyTo)
		return
	}
	r.fail(f, replyTo, heraldpb.NewError(heraldpb.ErrorCode_UNKNOWN_REQUEST, "no handler for %T", f.Body))
}

// produce routes a Produce on the network loop, through the registry's
// routing, straight to the partition's actor: no mailbox hop between the
// connection and the partition.
func (r *Router) produce(f *heraldpb.Frame, replyTo *actor.PID) {
	b := f.GetProduce()
	if registry.IsInternal(b.Topic) {
		r.fail(f, replyTo, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "topic %q is internal: clients cannot produce to it", b.Topic))
		return
	}
	if b.NotBeforeMs != 0 || b.HoldUs != 0 || b.ClockId != 0 || b.SingleInFlight || b.TxnEpoch != 0 || b.TxnEpochResetFrom != 0 || b.TxnEpochResetIndex != 0 ||
		b.TxnMarker != heraldpb.TxnMarker_TXN_MARKER_NONE || b.TxnRecords != 0 || b.Fencer != heraldpb.Fencer_FENCER_TXN_COORDINATOR {
		r.fail(f, replyTo, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "not_before_ms, hold_us, clock_id, single_in_flight, txn_epoch, fencer and txn_marker are internal to the broker: use deliver_at_ms or delay_ms, and transactional_id for transactions"))
		return
	}
	if b.TxnBatch && (b.TransactionalId == "" || b.ProducerId == 0) {
		// (A transaction's batch written once: its producer's session
		// checks, by the transactional id, were the ACL's; the partition
		// checks its epoch and sequence.)
		r.fail(f, replyTo, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "txn_batch needs a transactional_id and its session's producer_id"))
		return
	}
	e := r.reg.Get(b.Topic)
	if e == nil {
		r.fail(f, replyTo, r.missing(b.Topic))
		return
	}
	part, to, perr := e.Route(b)
	if perr != nil {
		r.fail(f, replyTo, perr)
		return
	}
	b.Partition = &part
	r.sys.Root.RequestWithCustomSender(to, f, replyTo)
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
