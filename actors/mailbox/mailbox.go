// Package mailbox provides Herald's bounded actor mailbox: a wrapper over
// protoactor's Unbounded mailbox that sheds load instead of blocking.
//
// protoactor's own Bounded mailbox blocks the sender and spins a core while
// full, and BoundedDropping drops silently (see DESIGN.md). Shedding instead
// hands a message that arrives while the mailbox holds Limit or more user
// messages to a Shed function, which answers the sender (for example with a
// THROTTLED error) and reports whether it consumed the message. Messages the
// Shed function does not consume (raft traffic, timers, lifecycle) are always
// queued: they are bounded by their own protocols.
package mailbox

import (
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// Shed is called, on the sender's goroutine, for a user message that arrives
// while the mailbox is full. msg is what was posted: often an
// *actor.MessageEnvelope carrying the sender. It returns true when it answered
// and dropped the message, false to queue it anyway. It must not block.
type Shed func(msg interface{}) bool

// Shedding is a bounded mailbox factory. One Shedding serves one actor: Depth
// reads the mailbox of the last actor spawned from its Producer.
type Shedding struct {
	limit int
	shed  Shed
	shedN atomic.Int64
	cur   atomic.Pointer[shedMailbox]
}

// New returns a Shedding mailbox factory that keeps at most limit user
// messages before offering new ones to shed.
func New(limit int, shed Shed) *Shedding {
	if limit <= 0 {
		limit = 1
	}
	return &Shedding{limit: limit, shed: shed}
}

// Producer is the actor.MailboxProducer to pass to actor.WithMailbox.
func (s *Shedding) Producer() actor.MailboxProducer {
	inner := actor.Unbounded()
	return func() actor.Mailbox {
		mb := &shedMailbox{Mailbox: inner(), owner: s}
		s.cur.Store(mb)
		return mb
	}
}

// Depth is the number of user messages waiting in the mailbox.
func (s *Shedding) Depth() int {
	if mb := s.cur.Load(); mb != nil {
		return mb.UserMessageCount()
	}
	return 0
}

// Shed is the number of messages shed so far.
func (s *Shedding) Shed() int64 { return s.shedN.Load() }

// Limit is the mailbox's configured bound.
func (s *Shedding) Limit() int { return s.limit }

type shedMailbox struct {
	actor.Mailbox
	owner *Shedding
}

func (m *shedMailbox) PostUserMessage(msg interface{}) {
	if m.Mailbox.UserMessageCount() >= m.owner.limit && m.owner.shed != nil && m.owner.shed(msg) {
		m.owner.shedN.Add(1)
		return
	}
	m.Mailbox.PostUserMessage(msg)
}
