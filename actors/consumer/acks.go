package consumer

// Acks, nacks and commits, ack deadlines, and the progress writes to __groups that make them durable.

import (
	"maps"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// ackTarget checks an ack or nack request (kind names it) and returns its
// member, or answers the request with the error and returns nil.
func (c *coordinator) ackTarget(ctx actor.Context, f *heraldpb.Frame, kind string, subID uint64, parts []uint32, offs []int64) *member {
	mb := c.memberOf(subID)
	if mb == nil {
		respond(ctx, ctx.Sender(), errFrame(f.Id, heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND, "subscription %d is not active", subID))
		return nil
	}
	if len(parts) != len(offs) {
		respond(ctx, ctx.Sender(), errFrame(f.Id, heraldpb.ErrorCode_INVALID_REQUEST, "%s has %d partitions and %d offsets", kind, len(parts), len(offs)))
		return nil
	}
	return mb
}

func (c *coordinator) onAck(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.AckRequest) {
	mb := c.ackTarget(ctx, f, "ack", req.SubscriptionId, req.Partitions, req.Offsets)
	if mb == nil {
		return
	}
	l := c.live
	now := c.o.Clock.Now()
	view := l.sub.ViewOf(mb.id)
	acked, stale := 0, 0
	for i, p := range req.Partitions {
		off := req.Offsets[i]
		if err := l.sub.Ack(mb.id, p, off); err != nil {
			stale++
			continue
		}
		id := msgID{view: view, part: p, off: off}
		if te, ok := l.toks[id]; ok {
			if owner := l.members[te.member]; owner != nil && te.tok != 0 {
				_ = owner.breaker.Success(te.tok)
			}
			mAckLatency.WithLabelValues(c.group).Observe(now.Sub(te.sent).Seconds())
			delete(l.toks, id)
		}
		l.held(view, p).del(off)
		acked++
	}
	if acked > 0 {
		mb.breaker.Record(0)
	}
	if stale > 0 {
		mStaleAcks.WithLabelValues(c.group).Add(float64(stale))
	}
	if acked > 0 {
		mAcked.WithLabelValues(c.group).Add(float64(acked))
	}
	_ = l.sub.Request(mb.id, int(req.Credits))
	defer c.refill(mb) // after dispatch has served queued calls
	ok := &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_AckResponse{AckResponse: &heraldpb.AckResponse{}}}
	if acked == 0 {
		respond(ctx, ctx.Sender(), ok)
	} else {
		c.markDirty(view)
		c.waiters = append(c.waiters, waiter{to: ctx.Sender(), f: ok})
	}
	c.checkRevocations(ctx)
	c.dispatch(ctx)
	c.pump(ctx)
	c.flush(ctx)
}

// onNack fails the named deliveries: each is retried after the request's
// delay (absent: the retry policy's) or, after its last allowed delivery,
// dead-lettered. The answer waits until the retries are durable in
// `__groups`, as acks do, so a broker restart keeps their delays and
// delivery counts.
func (c *coordinator) onNack(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.NackRequest) {
	mb := c.ackTarget(ctx, f, "nack", req.SubscriptionId, req.Partitions, req.Offsets)
	if mb == nil {
		return
	}
	l := c.live
	now := c.o.Clock.Now()
	view := l.sub.ViewOf(mb.id)
	delay := PolicyDelay
	if req.DelayMs != nil {
		delay = time.Duration(*req.DelayMs) * time.Millisecond
	}
	stale, failed, dead, untokened := 0, 0, false, false
	next := time.Time{}
	for i, p := range req.Partitions {
		r, err := l.sub.Nack(mb.id, p, req.Offsets[i], delay, req.Reason, now)
		if err != nil {
			stale++
			continue
		}
		failed++
		id := msgID{view: view, part: p, off: req.Offsets[i]}
		if te, ok := l.toks[id]; ok && te.tok != 0 {
			_ = mb.breaker.Failure(te.tok, FailNack)
		} else {
			untokened = true
		}
		delete(l.toks, id)
		mNacked.WithLabelValues(c.group).Inc()
		if r.Dead {
			dead = true
		} else {
			mRetries.WithLabelValues(c.group, "nack").Inc()
			if next.IsZero() || r.At.Before(next) {
				next = r.At
			}
		}
	}
	// One request is one failure for the closed breaker, as one AckRequest
	// is one success, however many messages it names: the SDK batches and
	// pipelines its settlements, so the messages of a NackRequest are not
	// failures in a row (acks settled between them travel apart), and
	// counting them one by one tripped members that fail one message in
	// five.
	if untokened {
		mb.breaker.Record(FailNack)
	}
	if stale > 0 {
		mStaleAcks.WithLabelValues(c.group).Add(float64(stale))
	}
	_ = l.sub.Request(mb.id, int(req.Credits))
	defer c.refill(mb)
	ok := &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_NackResponse{NackResponse: &heraldpb.NackResponse{}}}
	if failed == 0 {
		respond(ctx, ctx.Sender(), ok)
	} else {
		c.markDirty(view)
		c.waiters = append(c.waiters, waiter{to: ctx.Sender(), f: ok})
	}
	c.checkRevocations(ctx)
	if dead {
		c.pumpDLQ(ctx)
	}
	c.dispatch(ctx)
	if !next.IsZero() {
		c.armDeadlineAt(now, next)
	}
	c.flush(ctx)
}

func (c *coordinator) onCommit(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.CommitRequest) {
	mb := c.memberOf(req.SubscriptionId)
	if mb == nil {
		respond(ctx, ctx.Sender(), errFrame(f.Id, heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND, "subscription %d is not active", req.SubscriptionId))
		return
	}
	l := c.live
	if int(req.Partition) < len(l.entry.Stats) {
		if hw := c.partitionStats(l.entry, int(req.Partition)).HighWatermark.Load(); req.Offset > hw || req.Offset < 0 {
			respond(ctx, ctx.Sender(), errFrame(f.Id, heraldpb.ErrorCode_INVALID_REQUEST, "commit offset %d is outside [0, %d] (the high watermark) of partition %d", req.Offset, hw, req.Partition))
			return
		}
	}
	if err := l.sub.Commit(mb.id, req.Partition, req.Offset); err != nil {
		respond(ctx, ctx.Sender(), errFrame(f.Id, heraldpb.ErrorCode_INVALID_REQUEST, "commit: %v", err))
		return
	}
	c.doneBelowFloor(req.Partition)
	c.markDirty("")
	c.waiters = append(c.waiters, waiter{to: ctx.Sender(), f: &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_CommitResponse{CommitResponse: &heraldpb.CommitResponse{}}}})
	c.checkRevocations(ctx)
	c.dispatch(ctx)
	c.pump(ctx)
	c.flush(ctx)
}

// doneBelowFloor settles what the live group had out below its floor in
// partition p after a commit moved it: each delivery there counts as a
// success of its member, and its held records are dropped.
func (c *coordinator) doneBelowFloor(p uint32) {
	l := c.live
	floor := l.sub.Progress("", p).Floor()
	for id, te := range l.toks {
		if id.part == p && id.off < floor {
			if owner := l.members[te.member]; owner != nil && te.tok != 0 {
				_ = owner.breaker.Success(te.tok)
			}
			delete(l.toks, id)
		}
	}
	l.held("", p).trim(floor)
}

// ---- time ------------------------------------------------------------------

// armDeadline arms the timer for the subscription's next deadline (after
// the timer fires: NextDeadline takes the timers that went stale out of
// the subscription's timing wheel).
func (c *coordinator) armDeadline(now time.Time) {
	if l := c.live; l != nil {
		if t, ok := l.sub.NextDeadline(now); ok {
			c.armDeadlineAt(now, t)
		}
	}
}

// armDeadlineAt makes sure the timer fires no later than t. Deliveries
// call it with now+ack timeout, which is never earlier than a deadline
// already pending, so the push path never scans the flights.
func (c *coordinator) armDeadlineAt(now, t time.Time) {
	if !c.deadlineAt.IsZero() && !t.Before(c.deadlineAt) {
		return
	}
	c.deadlineAt = t
	c.after(max(t.Sub(now), time.Millisecond), &deadlineMsg{})
}

func (c *coordinator) onDeadline(ctx actor.Context) {
	l := c.live
	if l == nil {
		return
	}
	now := c.o.Clock.Now()
	expired := l.sub.Tick(now)
	dead := false
	for _, d := range expired {
		id := msgID{view: l.sub.ViewOf(d.Member), part: d.Partition, off: d.Offset}
		c.dirty[id.view] = true // the retry's delay and count, written lazily
		if d.Dead {
			dead = true
		} else {
			mRetries.WithLabelValues(c.group, "timeout").Inc()
		}
		te, ok := l.toks[id]
		delete(l.toks, id)
		switch owner := l.members[d.Member]; {
		case owner == nil:
		case ok && te.tok != 0:
			_ = owner.breaker.Failure(te.tok, FailAckTimeout)
		default:
			owner.breaker.Record(FailAckTimeout)
		}
	}
	if len(expired) > 0 {
		mAckTimeouts.WithLabelValues(c.group).Add(float64(len(expired)))
		c.checkRevocations(ctx)
		c.scheduleFlush()
	}
	if dead {
		c.pumpDLQ(ctx)
	}
	c.dispatch(ctx)
	c.armDeadline(now)
}

func (c *coordinator) markDirty(v MemberID) {
	c.dirty[v] = true
	c.scheduleFlush()
}

func (c *coordinator) scheduleFlush() {
	if !c.flushArmed {
		c.flushArmed = true
		c.after(c.o.FlushDelay, &flushMsg{})
	}
}

// maxMemberName bounds a member's name (it is stored in `__groups` as a
// broadcast member's position key).
const maxMemberName = 256

// maxWriteBytes bounds one progress write (a batch of GroupProgress
// records), well under the broker's max message size.
const maxWriteBytes = 256 << 10

// flush writes the dirty progress to __groups unless a write is in flight;
// the acks waiting are answered when it is durable. One write at a time
// keeps the records in order and batches the acks that arrive meanwhile.
func (c *coordinator) flush(ctx actor.Context) {
	if c.writing {
		return
	}
	if c.live != nil {
		for _, v := range slices.Sorted(maps.Keys(c.dirty)) {
			if c.live.sub.Progress(v, 0) != nil {
				c.toWrite = append(c.toWrite, c.encode(v))
			}
		}
	}
	clear(c.dirty)
	if len(c.toWrite) == 0 {
		for _, w := range c.waiters {
			respond(ctx, w.to, w.f)
		}
		c.waiters = nil
		return
	}
	if c.groupsLog == nil {
		e := c.o.Topics.Get(GroupsTopic)
		if e == nil {
			c.failWaiters(ctx, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "internal topic %s is missing", GroupsTopic))
			return
		}
		c.groupsLog = e.Partitions[0]
	}
	batch := &heraldpb.RecordBatch{}
	size, n := 0, 0
	for _, r := range c.toWrite {
		v, err := proto.Marshal(r)
		if err != nil {
			c.log.Error("encoding progress", "err", err)
			n++
			continue
		}
		if n > 0 && size+len(v) > maxWriteBytes {
			break
		}
		batch.Records = append(batch.Records, &heraldpb.Record{Key: []byte(c.group), Value: v})
		size += len(v)
		n++
	}
	c.writeRecs = c.toWrite[:n:n]
	c.toWrite = slices.Clone(c.toWrite[n:])
	if len(c.toWrite) == 0 {
		c.writeWaiters, c.waiters = c.waiters, nil
	}
	recs, err := proto.Marshal(batch)
	if err != nil || len(batch.Records) == 0 {
		c.log.Error("encoding progress batch", "err", err)
		c.writeRecs = nil
		return
	}
	c.writing = true
	c.writeID = c.id()
	ctx.Request(c.groupsLog, &heraldpb.Frame{Id: c.writeID, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: GroupsTopic, Partition: proto.Uint32(0), Acks: heraldpb.Acks_ACKS_ALL, Records: recs,
	}}})
}

func (c *coordinator) onWritten(ctx actor.Context, id uint64, e *heraldpb.Error) {
	if !c.writing || id != c.writeID {
		return
	}
	c.writing = false
	if e != nil {
		mProgressWrites.WithLabelValues("failed").Inc()
		if !e.Retriable {
			// Retrying cannot help (say, a record over the log's max
			// message size): the acks waiting for it fail, and the records
			// are dropped rather than wedging every later write. The views'
			// next records carry their progress again.
			c.log.Error("dropping group progress records that cannot be written", "records", len(c.writeRecs), "err", e.Message)
			for _, w := range c.writeWaiters {
				respond(ctx, w.to, heraldpb.ErrorFrame(w.f.Id, e))
			}
			c.writeRecs, c.writeWaiters = nil, nil
			if c.live != nil {
				for _, v := range c.live.sub.Views() {
					c.dirty[v] = true
				}
			}
			c.scheduleFlush()
			c.answerFlushed(ctx)
			return
		}
		c.log.Warn("writing group progress", "err", e.Message)
		c.toWrite = append(c.writeRecs, c.toWrite...)
		c.waiters = append(c.writeWaiters, c.waiters...)
		c.writeRecs, c.writeWaiters = nil, nil
		c.after(time.Duration(max(e.RetryAfterMs, 50))*time.Millisecond, &flushMsg{})
		c.flushArmed = true
		return
	}
	mProgressWrites.WithLabelValues("ok").Add(float64(len(c.writeRecs)))
	for _, r := range c.writeRecs {
		c.st.stored[keyOf(r)] = r
		c.st.lastTop = r.Topic
	}
	for _, w := range c.writeWaiters {
		respond(ctx, w.to, w.f)
	}
	c.writeRecs, c.writeWaiters = nil, nil
	if c.live == nil {
		c.updateSummary()
	}
	if len(c.toWrite) > 0 || len(c.waiters) > 0 || len(c.dirty) > 0 {
		c.flush(ctx)
	}
	c.answerFlushed(ctx)
}

// checkpoint asks a coordinator to rewrite all its records (compaction
// round round); it answers FlushGroupDone{Round: round} like FlushGroup.
type checkpoint struct{ round int }

// FlushGroup asks a coordinator to write all its progress; it answers
// FlushGroupDone once nothing is left unwritten. Graceful shutdown uses it.
type FlushGroup struct{}

// EndSessions ends every member's subscription with a SubscriptionEnded
// push giving Reason (this node stops coordinating groups: its clients
// subscribe again where groups are coordinated now). The answer is
// EndSessionsDone.
type EndSessions struct{ Reason *heraldpb.Error }

// EndSessionsDone answers EndSessions.
type EndSessionsDone struct{}

// FlushGroupDone answers FlushGroup (Round 0) and the compaction
// checkpoints (their round).
type FlushGroupDone struct{ Round int }

type flushCaller struct {
	pid   *actor.PID
	round int
}

// flushAll writes every view's progress and answers the sender with
// FlushGroupDone{Round: round} once nothing is left unwritten.
func (c *coordinator) flushAll(ctx actor.Context, round int) {
	if c.live != nil {
		for _, v := range c.live.sub.Views() {
			c.dirty[v] = true
		}
	}
	c.flushDone = append(c.flushDone, flushCaller{pid: ctx.Sender(), round: round})
	c.flush(ctx)
	c.answerFlushed(ctx)
}

func (c *coordinator) answerFlushed(ctx actor.Context) {
	if c.writing || len(c.toWrite) > 0 || len(c.dirty) > 0 {
		return
	}
	for _, p := range c.flushDone {
		ctx.Send(p.pid, &FlushGroupDone{Round: p.round})
	}
	c.flushDone = nil
}

func (c *coordinator) failWaiters(ctx actor.Context, e *heraldpb.Error) {
	for _, w := range c.waiters {
		respond(ctx, w.to, heraldpb.ErrorFrame(w.f.Id, e))
	}
	c.waiters = nil
}
