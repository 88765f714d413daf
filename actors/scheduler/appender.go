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
// share the partition's group commits); one while it is remote, since the
// node forwarding it may reorder requests (single_in_flight). An append
// refused as out of sequence while an earlier one is open waits for that
// one (blocked) and is sent again when an open append settles. The oldest
// open append refused so is looked for and, if not found, sent again
// under the appender's next producer id (renewProducer): only an append
// refused under its id and sequence changes them, since another may
// still be written under its own. Chunks that fall due meanwhile queue,
// and go together as far as groupChunks lets them. The producer id lasts
// as long as the incarnation and the topic, so that a partition's table
// holds one scheduler producer, not one per burst.
type appender struct {
	key   appendKey
	e     *registry.Entry // the topic it appends to (registry.Same)
	pid   uint64
	seq   int64        // the sequence of the next append's first record
	queue []*fireChunk // due, not yet sent
	open  []*fireChunk // the first chunks of the appends sent and not settled, in order sent
}

// maxOpenLocal bounds the open appends to a partition led on this node.
// A retry of one of them that is committed but older than the partition
// remembers (partition.ProducerBatches) is refused as out of sequence, and
// then found by the look before a resend.
const maxOpenLocal = 64

// appendKey names a target partition. An appender of a topic deleted and
// created again under the same name is replaced (registry.Same); the
// appends open on the old one settle through it (fireChunk.app).
type appendKey struct {
	topic string
	part  uint32
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
	var kick []*appender
	for _, c := range cs {
		k := appendKey{c.entry.Name, c.part}
		a := s.appenders[k]
		if a == nil || !registry.Same(a.e, c.entry) {
			a = &appender{key: k, e: c.entry, pid: randomToken() >> 1}
			s.appenders[k] = a
		}
		if len(a.queue) == 0 {
			kick = append(kick, a)
		}
		a.queue = append(a.queue, c)
	}
	for _, a := range kick {
		s.kickAppender(ctx, a)
	}
}

// kickAppender sends a's queued appends as far as its open limit allows.
func (s *Scheduler) kickAppender(ctx actor.Context, a *appender) {
	cur := s.o.Topics.Get(a.key.topic)
	if !registry.Same(cur, a.e) || int(a.key.part) >= len(cur.Partitions) {
		// The topic is gone: what is queued is dropped at once, not
		// sent one by one to a partition that no longer answers; the
		// open appends settle as their answers come.
		if len(a.open) == 0 && s.appenders[a.key] == a {
			delete(s.appenders, a.key)
		}
		if q := a.queue; len(q) > 0 {
			a.queue = nil
			for _, c := range q {
				s.heldBytes -= len(c.records)
			}
			mHeldBytes.Set(float64(s.heldBytes))
			s.settleGroup(ctx, q, false, heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q was deleted", a.key.topic), 0)
		}
		return
	}
	limit := 1
	if w := cur.Writer(int(a.key.part)); w != nil && w.Equal(cur.Partitions[a.key.part]) {
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
			count += c.nrecs
		}
		c0 := g[0]
		c0.app, c0.group, c0.pid, c0.seq, c0.count = a, g, a.pid, a.seq, count
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
	a := c0.app
	if a == nil {
		return
	}
	i := slices.Index(a.open, c0)
	if i < 0 {
		return
	}
	a.open = slices.Delete(a.open, i, i+1)
	if !ok && !c0.retrying && c0.pid == a.pid && c0.seq+c0.count == a.seq {
		// The last one sent, refused at its only attempt: its sequence
		// is free again. (After an ambiguous attempt it may be written
		// yet: the gap is left to renewProducer.)
		a.seq = c0.seq
	}
	for _, h := range a.open {
		if h.blocked {
			h.blocked = false
			s.sendGroup(ctx, h.group)
		}
	}
	s.kickAppender(ctx, a)
}

// outOfSequence handles an append (sent as producer pid) that its
// partition refused as out of sequence.
func (s *Scheduler) outOfSequence(ctx actor.Context, g []*fireChunk, pid uint64, e *heraldpb.Error) {
	c0 := g[0]
	a := c0.app
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

// renewProducer gives c0's append, refused as out of sequence under its
// producer id and not found, the next sequence of a's producer id, a new
// one if c0 had the current one. The other open appends keep theirs: one
// may still be written under them.
func (s *Scheduler) renewProducer(c0 *fireChunk) {
	a := c0.app
	if c0.pid == a.pid {
		a.pid, a.seq = randomToken()>>1, 0
	}
	c0.pid, c0.seq = a.pid, a.seq
	a.seq += c0.count
}

// pruneAppenders forgets the idle appenders of deleted topics.
func (s *Scheduler) pruneAppenders() {
	for k, a := range s.appenders {
		if len(a.open) == 0 && len(a.queue) == 0 && !registry.Same(s.o.Topics.Get(k.topic), a.e) {
			delete(s.appenders, k)
		}
	}
}
