package consumer

import (
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
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
	// push writes a frame straight to the connection (netio.Server.Push),
	// skipping the connection's session actor; nil: through it. It is used
	// once the session actor has written hello; frames before that wait in
	// early.
	push func(id string, frame []byte) bool
	// writer writes through the connection's session actor.
	writer SessionWriter
	// transit is the coordinator's count of record bytes on their way
	// through this session (member.transit); nil when not counted.
	transit *atomic.Int64
	ready   bool
	early   [][]byte
}

// Messages between the coordinator and its member sessions.
type (
	// pushBatch: messages to push to the member, in order.
	// bytes is what the coordinator added to member.transit for it.
	pushBatch struct {
		msgs  []heraldpb.PushMessage
		bytes int64
	}
	// pushFrame: a control push (AssignmentChange) to the member.
	pushFrame struct{ f *heraldpb.Frame }
	// memberReady: the member's SubscribeResponse is written; pushes may
	// now go straight to its connection.
	memberReady struct {
		member MemberID
		subID  uint64
	}
	// helloWritten: the connection wrote the SubscribeResponse.
	helloWritten struct{}
	// memberGone: the member's connection closed.
	memberGone struct {
		member MemberID
		subID  uint64
	}
)

func (s *memberSession) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		s.writer.WriteThen(s.conn, s.hello, ctx.Self(), &helloWritten{})
		ctx.Watch(s.conn)
	case *helloWritten:
		s.ready = true
		ctx.Send(ctx.Parent(), &memberReady{member: s.member, subID: s.subID})
		for _, f := range s.early {
			s.write(ctx, f)
		}
		s.early = nil
	case *pushBatch:
		s.pushMsgs(ctx, m.msgs)
		if s.transit != nil {
			s.transit.Add(-m.bytes)
		}
	case *pushFrame:
		b, err := heraldpb.AppendFrame(nil, m.f)
		if err == nil {
			s.write(ctx, b)
		}
	case *actor.Terminated:
		if m.Who.Equal(s.conn) {
			ctx.Send(ctx.Parent(), &memberGone{member: s.member, subID: s.subID})
			ctx.Stop(ctx.Self())
		}
	}
}

// write sends one encoded push frame, in order.
func (s *memberSession) write(ctx actor.Context, frame []byte) {
	switch {
	case !s.ready:
		s.early = append(s.early, frame)
	case s.push != nil:
		s.push(s.conn.Id, frame)
	default:
		s.writer.SendRaw(s.conn, frame)
	}
}

// push writes msgs as Delivery frames within the max frame. A single
// message too big for the frame cannot be delivered to this connection; it
// goes alone and netio drops it (counted), and the ack timeout redelivers it
// — to another member with a bigger frame, or never (see README: max frame).
func (s *memberSession) pushMsgs(ctx actor.Context, msgs []heraldpb.PushMessage) {
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
		s.write(ctx, heraldpb.AppendDelivery(make([]byte, 0, size), s.subID, msgs[:n]))
		msgs = msgs[n:]
	}
}
