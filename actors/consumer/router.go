package consumer

import (
	"reflect"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// SessionLookup finds a live client connection by its session actor id: its
// session PID and negotiated max frame (netio.Server.Session).
type SessionLookup func(id string) (pid *actor.PID, maxFrame int, ok bool)

// Router routes the consumer-group and request-reply requests. It runs on
// the network event loops and never blocks.
type Router struct {
	sys     *actor.ActorSystem
	dir     *Directory
	manager *actor.PID
	lookup  SessionLookup
	push    func(id string, frame []byte) bool
	remote  func(id string) string
	inbox   func(id string) string                  // a connection's inbox name
	resolve func(inbox string) (id string, ok bool) // an inbox's connection
	raw     func(conn *actor.PID, frame []byte)     // an encoded push through the session actor
	gate    func() (coordinator uint64, here bool)  // nil: groups are always here
}

// SetGate makes the router refuse the requests that need the groups
// manager (subscribe, group admin, calls) with NOT_COORDINATOR while gate
// reports that groups are coordinated on another node (in a cluster: the
// leader of __groups); before the first request.
func (r *Router) SetGate(gate func() (coordinator uint64, here bool)) { r.gate = gate }

// elsewhere answers f with NOT_COORDINATOR if groups are not coordinated
// on this node, and reports whether it did.
func (r *Router) elsewhere(f *heraldpb.Frame, replyTo *actor.PID) bool {
	if r.gate == nil {
		return false
	}
	coord, here := r.gate()
	if here {
		return false
	}
	e := heraldpb.NewError(heraldpb.ErrorCode_NOT_COORDINATOR, "consumer groups are coordinated by node %d", coord)
	if coord == 0 {
		e.Message = "no node coordinates consumer groups right now (an election is under way)"
		e.RetryAfterMs = 200
	}
	e.Leader = uint32(coord)
	r.fail(f, replyTo, e)
	return true
}

// NewRouter routes to the groups manager and the coordinators in dir.
// SetConnections must be called before the first request.
func NewRouter(sys *actor.ActorSystem, dir *Directory, manager *actor.PID) *Router {
	return &Router{sys: sys, dir: dir, manager: manager}
}

// Connections is what the router needs of the network server
// (netio.Server): finding live connections, their peer addresses and
// request-reply inboxes, and writing pushes straight to them.
type Connections interface {
	Session(id string) (pid *actor.PID, maxFrame int, ok bool)
	RemoteAddr(id string) string
	Inbox(id string) string
	InboxSession(inbox string) (id string, ok bool)
	Push(id string, frame []byte) bool
	SessionWriter
}

// SetConnections sets how the router reaches client connections; before
// the first request.
func (r *Router) SetConnections(cs Connections) {
	r.lookup, r.remote, r.push, r.inbox, r.resolve, r.raw = cs.Session, cs.RemoteAddr, cs.Push, cs.Inbox, cs.InboxSession, cs.SendRaw
}

// subscribeMsg is a SubscribeRequest with what the coordinator needs to
// know of the subscribing connection.
type subscribeMsg struct {
	f        *heraldpb.Frame
	replyTo  *actor.PID
	maxFrame int
	addr     string // the client's address, for describe
}

// refillMsg asks a coordinator to top up a responder's call budget.
type refillMsg struct{ lm *laneMember }

// callMsg is a CallRequest for a coordinator with responders.
type callMsg struct {
	topic  string
	record []byte
	inbox  string
	corr   uint64
}

// Routes is the consumer room's part of the node's routing table: a
// handler per request body type (the broker merges every room's into one
// table). Handlers run on the network event loops and never block.
func (r *Router) Routes() map[reflect.Type]func(f *heraldpb.Frame, replyTo *actor.PID) {
	// Requests that need the groups manager go to the coordinating node.
	here := func(h func(f *heraldpb.Frame, replyTo *actor.PID)) func(f *heraldpb.Frame, replyTo *actor.PID) {
		return func(f *heraldpb.Frame, replyTo *actor.PID) {
			if !r.elsewhere(f, replyTo) {
				h(f, replyTo)
			}
		}
	}
	admin := here(func(f *heraldpb.Frame, replyTo *actor.PID) { r.sys.Root.RequestWithCustomSender(r.manager, f, replyTo) })
	return map[reflect.Type]func(f *heraldpb.Frame, replyTo *actor.PID){
		reflect.TypeOf(&heraldpb.Frame_Subscribe{}): here(r.subscribe),
		reflect.TypeOf(&heraldpb.Frame_Ack{}): func(f *heraldpb.Frame, replyTo *actor.PID) {
			r.toSub(f, replyTo, f.GetAck().SubscriptionId)
		},
		reflect.TypeOf(&heraldpb.Frame_Nack{}): func(f *heraldpb.Frame, replyTo *actor.PID) {
			r.toSub(f, replyTo, f.GetNack().SubscriptionId)
		},
		reflect.TypeOf(&heraldpb.Frame_Commit{}): func(f *heraldpb.Frame, replyTo *actor.PID) {
			r.toSub(f, replyTo, f.GetCommit().SubscriptionId)
		},
		reflect.TypeOf(&heraldpb.Frame_Unsubscribe{}): func(f *heraldpb.Frame, replyTo *actor.PID) {
			r.toSub(f, replyTo, f.GetUnsubscribe().SubscriptionId)
		},
		reflect.TypeOf(&heraldpb.Frame_ListGroups{}):    admin,
		reflect.TypeOf(&heraldpb.Frame_DescribeGroup{}): admin,
		reflect.TypeOf(&heraldpb.Frame_ResetGroup{}):    admin,
		reflect.TypeOf(&heraldpb.Frame_Call{}): here(func(f *heraldpb.Frame, replyTo *actor.PID) {
			r.call(f, f.GetCall(), replyTo)
		}),
		reflect.TypeOf(&heraldpb.Frame_Reply{}): func(f *heraldpb.Frame, replyTo *actor.PID) {
			r.reply(f, f.GetReply(), replyTo)
		},
	}
}

// subscribe hands a Subscribe to the groups manager with what it needs of
// the connection.
func (r *Router) subscribe(f *heraldpb.Frame, replyTo *actor.PID) {
	maxFrame := heraldpb.DefaultMaxFrameBytes
	if r.lookup != nil {
		if _, mf, ok := r.lookup(replyTo.Id); ok {
			maxFrame = mf
		}
	}
	addr := ""
	if r.remote != nil {
		addr = r.remote(replyTo.Id)
	}
	r.sys.Root.Send(r.manager, &subscribeMsg{f: f, replyTo: replyTo, maxFrame: maxFrame, addr: addr})
}

func (r *Router) toSub(f *heraldpb.Frame, replyTo *actor.PID, id uint64) {
	coord, ok := r.dir.lookup(id, replyTo.Id)
	if !ok {
		r.fail(f, replyTo, heraldpb.NewError(heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND, "subscription %d is not active on this connection", id))
		return
	}
	r.sys.Root.RequestWithCustomSender(coord, f, replyTo)
}

func (r *Router) call(f *heraldpb.Frame, req *heraldpb.CallRequest, replyTo *actor.PID) {
	groups := r.dir.Responders(req.Topic)
	if len(groups) == 0 {
		r.fail(f, replyTo, heraldpb.NewError(heraldpb.ErrorCode_NO_RESPONDERS, "no responder subscribes to topic %q", req.Topic))
		return
	}
	rec, err := proto.Marshal(req.GetRecord())
	if err != nil {
		r.fail(f, replyTo, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "call record: %v", err))
		return
	}
	inbox := replyTo.Id
	if r.inbox != nil {
		inbox = r.inbox(replyTo.Id)
	}
	m := &callMsg{topic: req.Topic, record: rec, inbox: inbox, corr: req.CorrelationId}
	for _, g := range groups {
		if !r.callDirect(g, m) {
			r.sys.Root.Send(g.Coord, m) // queued by the coordinator until a responder has credit
		}
	}
	mCalls.Inc()
	r.sys.Root.Send(replyTo, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_CallResponse{CallResponse: &heraldpb.CallResponse{
		Inbox: inbox, Responders: uint32(len(groups)),
	}}})
}

// callDirect pushes call m straight from the network loop to a responder
// of group g that has call budget (two actor hops fewer than through the
// coordinator), and asks the coordinator for more budget when it runs low.
func (r *Router) callDirect(g *Responders, m *callMsg) bool {
	if r.push == nil || g.lane == nil {
		return false
	}
	lm := g.lane.take()
	if lm == nil {
		return false
	}
	if lm.budget.Load() < callBudget/2 && lm.refilling.CompareAndSwap(false, true) {
		r.sys.Root.Send(g.Coord, &refillMsg{lm: lm})
	}
	frame := heraldpb.AppendDelivery(nil, lm.subID, []heraldpb.PushMessage{{
		Offset: -1, DeliveryCount: 1, Record: m.record, ReplyInbox: m.inbox, CorrelationID: m.corr,
	}})
	return r.push(lm.conn, frame) // false: the member's connection is gone
}

func (r *Router) reply(f *heraldpb.Frame, req *heraldpb.ReplyRequest, replyTo *actor.PID) {
	var pid *actor.PID
	maxFrame, ok := 0, false
	id := ""
	if r.resolve != nil && r.lookup != nil {
		if id, ok = r.resolve(req.Inbox); ok {
			pid, maxFrame, ok = r.lookup(id)
		}
	}
	if !ok {
		mReplies.WithLabelValues("no_inbox").Inc()
		r.fail(f, replyTo, heraldpb.NewError(heraldpb.ErrorCode_INBOX_NOT_FOUND, "inbox %q is gone (the caller disconnected) or unknown", req.Inbox))
		return
	}
	rec, err := proto.Marshal(req.GetRecord())
	if err != nil {
		r.fail(f, replyTo, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "reply record: %v", err))
		return
	}
	push := heraldpb.AppendReplyDelivery(nil, req.CorrelationId, rec)
	if len(push)-heraldpb.HeaderLen > maxFrame {
		r.fail(f, replyTo, heraldpb.NewError(heraldpb.ErrorCode_MESSAGE_TOO_LARGE, "reply of %d bytes exceeds the caller's max frame %d", len(push), maxFrame))
		return
	}
	if r.push == nil || !r.push(id, push) {
		r.raw(pid, push)
	}
	mReplies.WithLabelValues("ok").Inc()
	r.sys.Root.Send(replyTo, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ReplyResponse{ReplyResponse: &heraldpb.ReplyResponse{}}})
}

func (r *Router) fail(f *heraldpb.Frame, replyTo *actor.PID, e *heraldpb.Error) {
	r.sys.Root.Send(replyTo, heraldpb.ErrorFrame(f.Id, e))
}
