package consumer

// Dispatch and credits: pushing messages and calls to members while their credits and connections have room.

import (
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
)

// ackLatencySample: the ack latency histogram samples one offset in this
// many (a power of two), to keep the push path free of per-message
// bookkeeping.
const ackLatencySample = 32

// maxPushBatch bounds the messages one dispatch round hands one member.
const maxPushBatch = 4096

// dispatch pushes to every member with credits what the subscription
// gives it, calls first.
func (c *coordinator) dispatch(ctx actor.Context) {
	l := c.live
	if l == nil {
		return
	}
	order := l.sub.Members()
	if len(order) == 0 {
		return
	}
	now := c.o.Clock.Now()
	delivered := 0
	// Refill from the spilled reads (acks may have made room), deliver,
	// refill and deliver again while both make progress; then read more.
	c.offerSpills()
	for round := 0; round < 64; round++ {
		n := 0
		for i := range order {
			mb := l.members[order[(l.rr+i)%len(order)]]
			if mb == nil {
				continue
			}
			n += c.deliverTo(ctx, mb, now)
		}
		l.rr++
		delivered += n
		if n == 0 || !c.offerSpills() {
			break
		}
	}
	if delivered > 0 {
		c.pump(ctx)
		if !l.autoAck {
			c.armDeadlineAt(now, now.Add(l.ackTimeout))
		}
		if l.autoAck {
			c.scheduleFlush()
		}
	}
	if c.expiredSeen {
		c.expiredSeen = false
		c.pump(ctx) // expired messages made room
	}
	c.pumpDLQ(ctx) // nacks, timeouts, expiry and restored records make dead letters
}

// offerSpills offers every spilled read again and reports whether the
// subscription took any of it.
func (c *coordinator) offerSpills() bool {
	l := c.live
	took := false
	for k, sp := range l.spill {
		n := len(sp.msgs)
		c.offer(k, sp.msgs, sp.recs)
		if sp2 := l.spill[k]; sp2 == nil || len(sp2.msgs) < n {
			took = true
		}
	}
	return took
}

func (c *coordinator) deliverTo(ctx actor.Context, mb *member, now time.Time) int {
	l := c.live
	credits := l.sub.Credits(mb.id)
	if credits == 0 {
		return 0
	}
	var out []heraldpb.PushMessage
	for mb.responder && len(l.calls) > 0 && l.sub.TakeCredit(mb.id) {
		if out == nil {
			out = make([]heraldpb.PushMessage, 0, min(len(l.calls), credits))
		}
		call := l.calls[0]
		l.calls = l.calls[1:]
		out = append(out, heraldpb.PushMessage{Offset: -1, DeliveryCount: 1, Record: call.record, ReplyInbox: call.inbox, CorrelationID: call.corr})
		credits--
	}
	if len(l.calls) == 0 {
		l.calls = nil
	}
	// The breaker gates delivery: nothing while open, probes only (each
	// with a token for its outcome) while half-open; while closed outcomes
	// are recorded without tokens (Breaker.Record).
	var toks []BreakerToken
	budget := min(credits, maxPushBatch)
	switch mb.breaker.State() {
	case BreakerOpen:
		budget = 0
	case BreakerHalfOpen:
		for len(toks) < budget {
			tok, ok := mb.breaker.Allow()
			if !ok {
				break
			}
			toks = append(toks, tok)
		}
		budget = len(toks)
	}
	// The connection's pending output bounds delivery in bytes: with no
	// room, nothing is delivered (credits stay) and dispatch runs again
	// shortly; with room, messages go in steps of as many as fit in what
	// is left (at the size of the records last delivered; one to learn
	// it), at most pushStep, until it is used up, so one dispatch
	// overshoots it by about one record (a step of records counted, not
	// weighed, overshot a connection's 8 MiB by 16 MiB with 250 KiB records:
	// e2e TestNeverReadingClients).
	room, gated := 0, c.o.PushRoom != nil && mb.transit != nil
	if gated && budget > 0 {
		if room = c.o.PushRoom(mb.conn.Id) - int(mb.transit.Load()); room <= 0 {
			budget = 0
			c.armCongested()
		}
	}
	var ds []Delivery
	for budget > 0 {
		step := budget
		if gated {
			fit := 1
			if mb.recBytes > 0 {
				fit = max(room/mb.recBytes, 1)
			}
			step = min(step, pushStep, fit)
		}
		got, _ := l.sub.Deliver(mb.id, now, step)
		c.onExpired(l.sub.TakeExpired())
		ds = append(ds, got...)
		budget -= step
		if gated && len(got) > 0 {
			b := c.recordBytes(l, mb, got)
			mb.recBytes = max(b/len(got), 1)
			room -= b
		}
		if len(got) < step || !gated {
			break
		}
		if room <= 0 {
			c.armCongested()
			break
		}
	}
	if len(toks) > len(ds) {
		for _, t := range toks[len(ds):] {
			_ = mb.breaker.Forget(t)
		}
	}
	view := l.sub.ViewOf(mb.id)
	if len(ds) > 0 {
		out = slices.Grow(out, len(ds))
	}
	for j, d := range ds {
		id := msgID{view: view, part: d.Partition, off: d.Offset}
		hl := l.held(view, d.Partition)
		h, ok := hl.get(d.Offset)
		if !ok {
			// Cannot happen: every offered message is held until done.
			c.log.Error("no record held for delivery", "partition", d.Partition, "offset", d.Offset)
			continue
		}
		out = append(out, heraldpb.PushMessage{Partition: d.Partition, Offset: d.Offset, DeliveryCount: uint32(d.Count), AppendTimeMs: h.appendMs, Record: h.rec})
		switch {
		case l.autoAck:
			hl.del(d.Offset)
		case j < len(toks):
			l.toks[id] = tokEntry{tok: toks[j], member: mb.id, sent: now}
		case d.Offset&(ackLatencySample-1) == 0:
			l.toks[id] = tokEntry{member: mb.id, sent: now}
		}
		if d.Count > 1 {
			mb.redelivered++
			mRedelivered.WithLabelValues(c.group).Inc()
		}
	}
	if len(ds) > 0 {
		mb.delivered += uint64(len(ds))
		mDelivered.WithLabelValues(c.group).Add(float64(len(ds)))
		if l.autoAck {
			c.markDirty(view)
		}
	}
	if len(out) > 0 {
		if mb.transit != nil {
			var n int64
			for i := range out {
				n += int64(len(out[i].Record))
			}
			mb.transit.Add(n)
			ctx.Send(mb.session, &pushBatch{msgs: out, bytes: n})
		} else {
			ctx.Send(mb.session, &pushBatch{msgs: out})
		}
	}
	return len(ds)
}

// pushStep is how many messages deliverTo hands a member between checks
// of its connection's room; congestedRetry how soon a dispatch held for
// want of room runs again.
const (
	pushStep       = 64
	congestedRetry = 10 * time.Millisecond
)

// recordBytes sums the held records of ds.
func (c *coordinator) recordBytes(l *live, mb *member, ds []Delivery) int {
	view := l.sub.ViewOf(mb.id)
	n := 0
	for _, d := range ds {
		if h, ok := l.held(view, d.Partition).get(d.Offset); ok {
			n += len(h.rec)
		}
	}
	return n
}

// armCongested runs dispatch again after congestedRetry.
func (c *coordinator) armCongested() {
	if !c.congestedArmed {
		c.congestedArmed = true
		c.after(congestedRetry, &congestedMsg{})
	}
}

// congestedMsg: a dispatch held for a connection's room runs again.
type congestedMsg struct{}

// onExpired accounts for messages Deliver ended by their time-to-live:
// dropped ones are done (their records go, their progress is written
// lazily); dead-lettered ones wait for pumpDLQ.
func (c *coordinator) onExpired(es []Expired) {
	if len(es) == 0 {
		return
	}
	l := c.live
	dropped := 0
	for _, e := range es {
		delete(l.toks, msgID{view: e.View, part: e.Partition, off: e.Offset})
		if !e.Dead {
			l.held(e.View, e.Partition).del(e.Offset)
			c.dirty[e.View] = true
			dropped++
		}
	}
	c.st.expired += uint64(len(es))
	c.expiredSeen = true
	if dropped > 0 {
		mExpired.WithLabelValues(c.group, "drop").Add(float64(dropped))
		c.scheduleFlush()
	}
	if n := len(es) - dropped; n > 0 {
		mExpired.WithLabelValues(c.group, "dead_letter").Add(float64(n))
	}
}

// refill tops up a responder's call budget from its subscription credits,
// after any queued calls have had theirs.
func (c *coordinator) refill(mb *member) {
	lm := mb.lane
	if lm == nil || c.live == nil {
		return
	}
	lm.refilling.Store(false)
	if len(c.live.calls) > 0 {
		return // the queued calls take the credits first
	}
	// At most half the member's credits: the rest stay for the topic's
	// messages, which a responder receives too.
	n := int64(0)
	for lm.budget.Load()+n < callBudget && int64(c.live.sub.Credits(mb.id)) > n+1 && c.live.sub.TakeCredit(mb.id) {
		n++
	}
	lm.budget.Add(n)
}

func (c *coordinator) onCall(ctx actor.Context, m *callMsg) {
	l := c.live
	if l == nil || l.responders == 0 || l.topic != m.topic {
		return
	}
	if len(l.calls) >= c.o.MaxCallQueue {
		mCallsDropped.WithLabelValues(c.group).Inc()
		return
	}
	l.calls = append(l.calls, m)
	c.dispatch(ctx)
	mCallQueue.WithLabelValues(c.group).Set(float64(len(l.calls)))
}
