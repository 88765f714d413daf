package scheduler

// The appenders: each target partition's fire appends, as an idempotent producer.

import (
	"slices"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
)

// appender sends one target partition's appends as an idempotent producer
// of its own (pid), whose sequence counts the records of its appends: a
// retry of an append whose first attempt is still on its way (in a
// leader's log not yet committed, or held by the node forwarding it when
// the leader moved) is answered by the partition with that attempt's
// outcome, never written twice. The look before a resend
// (verifyThenResend) cannot tell such an attempt from one that never
// landed.
//
// Up to maxOpenLocal appends are open (sent and not settled) while the
// partition's leader is local, its mailbox keeping their order (sent
// ahead of their time, each its own append when their times differ, they
// share the partition's group commits); one while it is remote, since the node forwarding it may reorder
// requests (single_in_flight). An append refused as out of sequence
// while an earlier one is open waits for that one (blocked) and is sent
// again when an open append settles; the oldest open append refused so
// is looked for, then sent with the later open ones under a new producer
// id (renewProducer). Chunks that fall due meanwhile queue, and go
// together as far as groupChunks lets them. The producer id lasts as long
// as the incarnation, so that a partition's table holds one scheduler
// producer, not one per burst.
type appender struct {
	pid   uint64
	seq   int64        // the sequence of the next append's first record
	queue []*fireChunk // due, not yet sent
	open  []*fireChunk // the first chunks of the appends sent and not settled, by sequence
}

// maxOpenLocal bounds the open appends to a partition led on this node.
// A retry of one of them that is committed but older than the partition
// remembers (partition.ProducerBatches) is refused as out of sequence, and
// then found by the look before a resend.
const maxOpenLocal = 64

type appendKey struct {
	e    *registry.Entry
	part uint32
}

// oldest is the first chunk of the oldest open append (nil: none).
func (a *appender) oldest() *fireChunk {
	if len(a.open) == 0 {
		return nil
	}
	return a.open[0]
}

// sendChunks queues due chunks on their partitions' appenders.
func (s *Scheduler) sendChunks(ctx actor.Context, cs []*fireChunk) {
	var kick []appendKey
	for _, c := range cs {
		k := appendKey{c.entry, c.part}
		a := s.appenders[k]
		if a == nil {
			a = &appender{pid: randomToken() >> 1}
			s.appenders[k] = a
		}
		if len(a.queue) == 0 {
			kick = append(kick, k)
		}
		a.queue = append(a.queue, c)
	}
	for _, k := range kick {
		s.kickAppender(ctx, k)
	}
}

// kickAppender sends k's queued appends as far as its open limit allows.
func (s *Scheduler) kickAppender(ctx actor.Context, k appendKey) {
	a := s.appenders[k]
	if a == nil {
		return
	}
	cur := s.o.Topics.Get(k.e.Name)
	if !registry.Same(cur, k.e) || int(k.part) >= len(cur.Partitions) {
		// The topic is gone: what is queued is dropped at once, not
		// sent one by one to a partition that no longer answers.
		delete(s.appenders, k)
		if q := a.queue; len(q) > 0 {
			a.queue = nil
			for _, c := range q {
				s.heldBytes -= len(c.records)
			}
			mHeldBytes.Set(float64(s.heldBytes))
			s.settleGroup(ctx, q, false, heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q was deleted", k.e.Name), 0)
		}
		return
	}
	limit := 1
	if w := cur.Writer(int(k.part)); w != nil && w.Equal(cur.Partitions[k.part]) {
		limit = maxOpenLocal
	}
	if len(a.open) >= limit || len(a.queue) == 0 {
		return
	}
	nowUs := s.now().UnixMicro()
	ahead := s.o.AppendAhead.Microseconds()
	sent := 0
	for _, g := range groupChunks(a.queue, nowUs) {
		if len(a.open) >= limit {
			break
		}
		var count int64
		for _, c := range g {
			s.heldBytes -= len(c.records)
			for _, at := range c.ats {
				mSendLateness.Observe(float64(max(nowUs-(at*1000-ahead), 0)) / 1e6)
			}
			info, _ := heraldpb.ScanBatch(c.records) // (built by buildRound: valid)
			count += int64(info.Count)
		}
		c0 := g[0]
		c0.group, c0.pid, c0.seq, c0.count = g, a.pid, a.seq, count
		a.seq += count
		a.open = append(a.open, c0)
		sent += len(g)
		s.sendGroup(ctx, g)
	}
	clear(a.queue[:sent])
	a.queue = a.queue[sent:]
	mHeldBytes.Set(float64(s.heldBytes))
}

// appendSettled closes g's append: appended (ok), or refused for good.
// The appends that waited for it are sent again, and the queue goes on.
func (s *Scheduler) appendSettled(ctx actor.Context, g []*fireChunk, ok bool) {
	c0 := g[0]
	k := appendKey{c0.entry, c0.part}
	a := s.appenders[k]
	if a == nil {
		return
	}
	i := slices.Index(a.open, c0)
	if i < 0 {
		return
	}
	a.open = slices.Delete(a.open, i, i+1)
	if !ok && c0.pid == a.pid && c0.seq+c0.count == a.seq {
		a.seq = c0.seq // the last one sent: its sequence is free again
	}
	for _, h := range a.open {
		if h.blocked {
			h.blocked = false
			s.sendGroup(ctx, h.group)
		}
	}
	s.kickAppender(ctx, k)
}

// outOfSequence handles an append (sent as producer pid) that its
// partition refused as out of sequence.
func (s *Scheduler) outOfSequence(ctx actor.Context, g []*fireChunk, pid uint64, e *heraldpb.Error) {
	c0 := g[0]
	a := s.appenders[appendKey{c0.entry, c0.part}]
	switch {
	case a == nil || !slices.Contains(a.open, c0):
		s.verifyThenResend(ctx, g, false) // (not expected: as any refusal)
	case pid != c0.pid:
		s.sendGroup(ctx, g) // it has a new producer id since it was sent
	case a.oldest() != c0:
		c0.blocked = true // an earlier append is not written yet
	default:
		// The partition does not know where this producer stands: an
		// append was refused for good before this one (a gap), or its
		// table lost the producer. Not written under this sequence.
		s.log.Warn("a delayed batches' append was refused as out of sequence; looking for it, then appending as a new producer",
			"topic", c0.entry.Name, "partition", c0.part, "err", e.GetMessage())
		s.verifyThenResend(ctx, g, true)
	}
}

// renewProducer gives a's open appends, oldest first, the sequences of a
// new producer id. None of them can be written under the old one any
// more: the oldest was refused and not found, and the others follow it.
func (s *Scheduler) renewProducer(a *appender) {
	a.pid, a.seq = randomToken()>>1, 0
	for _, h := range a.open {
		h.pid, h.seq = a.pid, a.seq
		a.seq += h.count
	}
}
