package consumer

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/netio"
	heraldpb "github.com/heraldmq/herald/proto"
)

// memberSession is the consumer-session actor of one subscription of one
// connection, a child of its group's coordinator. It watches the
// connection's session actor (the member dies with its connection) and does
// the push path's encoding off the coordinator: the coordinator chooses what
// to deliver, the session encodes Delivery frames no bigger than the
// connection's max frame and hands them to the connection. Its mailbox holds
// at most the member's credits' worth of messages, as pushBatches.
type memberSession struct {
	member   MemberID
	subID    uint64
	conn     *actor.PID
	maxFrame int
	// hello is the SubscribeResponse, sent first: the client learns its
	// subscription id before any push for it.
	hello *heraldpb.Frame
}

// Messages between the coordinator and its member sessions.
type (
	// pushBatch: messages to push to the member, in order.
	pushBatch struct{ msgs []heraldpb.PushMessage }
	// pushFrame: a control push (AssignmentChange) to the member.
	pushFrame struct{ f *heraldpb.Frame }
	// memberGone: the member's connection closed.
	memberGone struct {
		member MemberID
		subID  uint64
	}
)

func (s *memberSession) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		ctx.Send(s.conn, s.hello)
		ctx.Watch(s.conn)
	case *pushBatch:
		s.push(ctx, m.msgs)
	case *pushFrame:
		ctx.Send(s.conn, m.f)
	case *actor.Terminated:
		if m.Who.Equal(s.conn) {
			ctx.Send(ctx.Parent(), &memberGone{member: s.member, subID: s.subID})
			ctx.Stop(ctx.Self())
		}
	}
}

// push writes msgs as Delivery frames within the max frame. A single
// message too big for the frame cannot be delivered to this connection; it
// goes alone and netio drops it (counted), and the ack timeout redelivers it
// — to another member with a bigger frame, or never (see README: max frame).
func (s *memberSession) push(ctx actor.Context, msgs []heraldpb.PushMessage) {
	const overhead = 64
	for len(msgs) > 0 {
		n, size := 0, heraldpb.HeaderLen+16
		for n < len(msgs) {
			ms := msgs[n].Size() + overhead
			if n > 0 && size+ms > s.maxFrame {
				break
			}
			size += ms
			n++
		}
		frame := heraldpb.AppendDelivery(make([]byte, 0, size), s.subID, msgs[:n])
		ctx.Send(s.conn, netio.RawPush(frame))
		msgs = msgs[n:]
	}
}
