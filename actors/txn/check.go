package txn

// Check-backs: a half nobody ended is asked about, over the connection of
// a live producer of its group; and the producers' registrations.

import (
	"container/heap"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
)

// producers are the connections registered as producers of each group.
type producers struct {
	groups map[string]*groupRegs
	conns  map[string]map[string]bool // connection (PID id) -> its groups
	n      int
}

type groupRegs struct {
	regs []*registration
	next int // round robin
}

type registration struct {
	conn *actor.PID
	seen time.Time
	// out: the check-backs sent to it and not answered (half ref -> when
	// sent, ms), at most maxOutstandingChecks: a producer is not sent
	// more than it has answered (flow control).
	out    map[uint64]int64
	pruned int64 // ms: the last sweep of out for answers lost
	gone   bool  // unregistered (its connection closed, or lapsed)
}

// maxGroupsPerConn bounds the producer groups one connection registers.
const maxGroupsPerConn = 64

// maxOutstandingChecks bounds the unanswered check-backs of one
// registration; outstandingFor is how long one counts unanswered.
const (
	maxOutstandingChecks = 1024
	outstandingFor       = 30 * time.Second
)

func newProducers() producers {
	return producers{groups: map[string]*groupRegs{}, conns: map[string]map[string]bool{}}
}

// add registers conn as a producer of group (or renews it). It reports
// whether conn is new (to be watched), and false when the limit is reached.
func (p *producers) add(conn *actor.PID, group string, now time.Time, limit int) (newConn, ok bool) {
	g := p.groups[group]
	if g != nil {
		for _, r := range g.regs {
			if r.conn.Equal(conn) {
				r.seen = now
				return false, true
			}
		}
	}
	if p.n >= limit || len(p.conns[conn.Id]) >= maxGroupsPerConn {
		return false, false
	}
	if g == nil {
		g = &groupRegs{}
		p.groups[group] = g
	}
	g.regs = append(g.regs, &registration{conn: conn, seen: now, out: map[uint64]int64{}})
	p.n++
	gs := p.conns[conn.Id]
	if gs == nil {
		gs = map[string]bool{}
		p.conns[conn.Id] = gs
		newConn = true
	}
	gs[group] = true
	return newConn, true
}

// remove ends conn's registration in group.
func (p *producers) remove(conn *actor.PID, group string) {
	g := p.groups[group]
	if g == nil {
		return
	}
	for i, r := range g.regs {
		if r.conn.Equal(conn) {
			r.gone = true
			g.regs = append(g.regs[:i], g.regs[i+1:]...)
			p.n--
			break
		}
	}
	if len(g.regs) == 0 {
		delete(p.groups, group)
	}
	if gs := p.conns[conn.Id]; gs != nil {
		delete(gs, group)
		if len(gs) == 0 {
			delete(p.conns, conn.Id)
		}
	}
}

// dropConn ends every registration of a closed connection.
func (p *producers) dropConn(conn *actor.PID) {
	for g := range p.conns[conn.Id] {
		p.remove(conn, g)
	}
	mProducers.Set(float64(p.n))
}

// pick is the next producer of group in turn with room for another
// check-back; none reports whether the group has no producer at all (nil
// with none false: every producer has maxOutstandingChecks unanswered).
// live says whether a half is still pending, for pruning.
func (p *producers) pick(group string, now int64, live func(ref uint64) bool) (r *registration, none bool) {
	g := p.groups[group]
	if g == nil || len(g.regs) == 0 {
		return nil, true
	}
	for range len(g.regs) {
		g.next = (g.next + 1) % len(g.regs)
		r := g.regs[g.next]
		if len(r.out) >= maxOutstandingChecks && now-r.pruned >= 1000 {
			r.pruned = now
			for ref, at := range r.out {
				if !live(ref) || now-at > outstandingFor.Milliseconds() {
					delete(r.out, ref)
				}
			}
		}
		if len(r.out) < maxOutstandingChecks {
			return r, false
		}
	}
	return nil, false
}

// release forgets h's check-back as outstanding.
func (h *half) release() {
	if h.checkReg != nil {
		delete(h.checkReg.out, h.ref)
		h.checkReg = nil
	}
}

// lapse ends the registrations not renewed since cut.
func (p *producers) lapse(cut time.Time) {
	for group, g := range p.groups {
		for _, r := range append([]*registration(nil), g.regs...) {
			if r.seen.Before(cut) {
				p.remove(r.conn, group)
			}
		}
	}
	mProducers.Set(float64(p.n))
}

func (c *Coordinator) lapseProducers(_ actor.Context) {
	c.producers.lapse(c.o.Now().Add(-3 * c.o.Heartbeat))
	c.after(c.o.Heartbeat, &lapseTick{})
}

// armChecks arms the check timer for the earliest check due. A queue
// grown mostly of stale entries (halves ended before their check) is
// rebuilt from the pending halves first, so it stays bounded by them.
func (c *Coordinator) armChecks() {
	if len(c.checkQ) > 4*len(c.halves)+1024 {
		q := make(timeQ, 0, len(c.halves))
		for _, h := range c.halves {
			if h.state == statePending && h.nextCheck != 0 {
				q = append(q, timeEntry{at: h.nextCheck, ref: h.ref})
			}
		}
		heap.Init(&q)
		c.checkQ = q
	}
	next, ok := c.checkQ.next()
	if !ok || c.checkTimerAt != 0 && c.checkTimerAt <= next {
		return
	}
	c.checkTimerGen++
	c.checkTimerAt = next
	c.after(max(time.Duration(next-c.nowMs())*time.Millisecond, 0), &checkTick{gen: c.checkTimerGen})
}

// runChecks checks back the halves due: each is asked about (or, past its
// last check, gets its policy), and its next check is armed.
func (c *Coordinator) runChecks(ctx actor.Context) {
	now := c.nowMs()
	var exhausted []*half
	full := map[string]bool{} // groups whose producers are all at their limit, this round
	for {
		at, ok := c.checkQ.next()
		if !ok || at > now {
			break
		}
		if c.checking >= c.o.MaxChecksInFlight {
			// Busy reading halves: the rest go in 100 ms.
			c.checkTimerGen++
			c.checkTimerAt = now + 100
			c.after(100*time.Millisecond, &checkTick{gen: c.checkTimerGen})
			break
		}
		te := c.checkQ.pop()
		h := c.halves[te.ref]
		if h == nil || h.state != statePending || h.nextCheck != te.at {
			continue // ended, or its timer moved
		}
		if h.ending {
			h.nextCheck = now + 100 // being ended: looked at again once that is written
			c.checkQ.add(h.nextCheck, h.ref)
			continue
		}
		if h.checks >= h.maxChecks {
			h.nextCheck = 0
			if h.keep {
				h.state = stateKept
				mExhausted.WithLabelValues("keep").Inc()
				c.log.Warn("half message unresolved after its last check; kept until ended by hand", "id", h.ref, "group", h.group, "checks", h.checks)
				continue
			}
			mExhausted.WithLabelValues("rollback").Inc()
			c.log.Warn("half message unresolved after its last check; rolled back", "id", h.ref, "group", h.group, "checks", h.checks)
			exhausted = append(exhausted, h)
			continue
		}
		var reg *registration
		none := false
		switch {
		case h.checkReg != nil && !h.checkReg.gone:
			reg = h.checkReg // its last check is unanswered: asked again there, in the same slot
		case !full[h.group]:
			h.release()
			reg, none = c.producers.pick(h.group, now, func(ref uint64) bool { return c.halves[ref] != nil })
		default:
			h.release()
		}
		if reg == nil && !none {
			full[h.group] = true
			// Every producer of the group has its fill of unanswered
			// checks: this one waits, without counting as a check.
			mChecks.WithLabelValues("postponed").Inc()
			h.nextCheck = now + 100
			c.checkQ.add(h.nextCheck, h.ref)
			continue
		}
		h.checks++
		c.pendingChecks[h.ref] = h.checks
		h.nextCheck = now + backoff(h.interval, h.checks).Milliseconds()
		c.checkQ.add(h.nextCheck, h.ref)
		if reg == nil {
			mChecks.WithLabelValues("no_producer").Inc()
			continue
		}
		mChecks.WithLabelValues("sent").Inc()
		reg.out[h.ref] = now
		h.checkReg = reg
		c.sendCheck(ctx, h, reg.conn)
	}
	if len(exhausted) > 0 {
		c.rollback(ctx, exhausted, "exhausted", nil)
	}
	c.writeChecks(ctx)
	c.armChecks()
}

// sendCheck reads h's records and pushes a HalfCheck to conn.
func (c *Coordinator) sendCheck(ctx actor.Context, h *half, conn *actor.PID) {
	c.checking++
	check := h.checks
	c.readHalf(ctx, h.ref, func(hs *heraldpb.HalfStored, err *heraldpb.Error) {
		c.checking--
		if err != nil {
			c.log.Warn("reading a half message for its check-back", "id", h.ref, "err", err.Message)
			return
		}
		buf, perr := heraldpb.AppendFrame(nil, &heraldpb.Frame{Body: &heraldpb.Frame_HalfCheck{HalfCheck: &heraldpb.HalfCheck{
			Id: FormatID(h.ref), ProducerGroup: h.group, Topic: h.topic, Partition: h.part, Records: hs.Records,
			Check: check, MaxChecks: h.maxChecks, CreatedMs: h.created,
		}}})
		if perr != nil {
			c.log.Error("encoding a check-back", "id", h.ref, "err", perr)
			return
		}
		c.o.Push.SendRaw(conn, buf)
	})
}

// writeChecks records the checks done since the last write (best effort:
// a count lost to a crash means one more check).
func (c *Coordinator) writeChecks(ctx actor.Context) {
	if len(c.pendingChecks) == 0 {
		return
	}
	ev := &heraldpb.HalfChecks{}
	for ref, n := range c.pendingChecks {
		ev.Refs = append(ev.Refs, ref)
		ev.Counts = append(ev.Counts, n)
	}
	clear(c.pendingChecks)
	c.write(writeOp{events: [][]byte{event(&heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Checks{Checks: ev}})}, done: func(int64, *heraldpb.Error) {}})
	c.flushWrites(ctx)
}
