package consumer

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/retry"
	"google.golang.org/protobuf/proto"
)

// dlqState is a live subscription's side of its dead-letter queue: one
// request (CreateTopic or Produce) in flight at a time, retried with
// backoff until it succeeds.
//
// The queue is the Sub's dead letters (Sub.DeadLetters): messages whose
// last allowed delivery failed, or which expired with DeadLetterExpired.
// Each is appended to the dead-letter topic with acks=all, and only then
// acknowledged in the group (Sub.DeadLettered), so a crash between the two
// may append a message twice but never loses one. A dead letter is never
// dropped: while appends fail, the dead letters wait, count against the
// partition's MaxPending window, and once it is full the group reads no
// new records of that partition.
type dlqState struct {
	topic    string
	reqID    uint64  // the request in flight; 0 = none
	creating bool    // it is a CreateTopic
	sent     []msgID // the dead letters of the Produce in flight
	backoff  time.Duration
	waiting  bool // a retry is armed (dlqRetryMsg)
}

// Dead-letter timers: a retry after backoff, and the timeout of a request
// (a deleted topic's partitions never answer).
type (
	dlqRetryMsg   struct{ l *live }
	dlqTimeoutMsg struct {
		l  *live
		id uint64
	}
)

const (
	dlqMinBackoff = 100 * time.Millisecond
	dlqMaxBackoff = 30 * time.Second
)

// pumpDLQ starts the next dead-letter request, unless one is in flight or
// waiting for its backoff, or nothing waits.
func (c *coordinator) pumpDLQ(ctx actor.Context) {
	l := c.live
	if l == nil || l.dlq.reqID != 0 || l.dlq.waiting {
		return
	}
	dls := l.sub.DeadLetters()
	if len(dls) == 0 {
		return
	}
	entry := c.o.Topics.Get(l.dlq.topic)
	if entry == nil {
		if c.o.TopicManager == nil {
			c.dlqFailed(ctx, heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "dead-letter topic %q does not exist", l.dlq.topic))
			return
		}
		c.dlqRequest(ctx, c.o.TopicManager, true, &heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{
			Name: l.dlq.topic, Config: &heraldpb.TopicConfig{Partitions: 1},
		}}})
		return
	}
	now := c.o.Clock.Now()
	batch := &heraldpb.RecordBatch{}
	size := 0
	var sent []msgID
	for _, d := range dls {
		h, ok := l.held(d.View, d.Partition).get(d.Offset)
		if !ok {
			// Cannot happen: a loaded dead letter's record is held until
			// DeadLettered.
			c.log.Error("no record held for a dead letter", "partition", d.Partition, "offset", d.Offset)
			continue
		}
		var rec heraldpb.Record
		if err := proto.Unmarshal(h.rec, &rec); err != nil {
			rec = heraldpb.Record{Value: h.rec} // the log's bytes, as they are
		}
		out := retry.DeadLetter(&rec, retry.Origin{Topic: l.topic, Partition: d.Partition, Offset: d.Offset,
			Deliveries: d.Deliveries, Reason: d.Reason, Time: now})
		n := proto.Size(out)
		if len(sent) > 0 && size+n > maxWriteBytes {
			break
		}
		batch.Records = append(batch.Records, out)
		size += n
		sent = append(sent, msgID{view: d.View, part: d.Partition, off: d.Offset})
	}
	if len(sent) == 0 {
		return
	}
	recs, err := proto.Marshal(batch)
	if err != nil {
		c.dlqFailed(ctx, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "encoding dead letters: %v", err))
		return
	}
	l.dlq.sent = sent
	c.dlqRequest(ctx, entry.Topic, false, &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: l.dlq.topic, Acks: heraldpb.Acks_ACKS_ALL, Records: recs,
	}}})
}

func (c *coordinator) dlqRequest(ctx actor.Context, to *actor.PID, creating bool, f *heraldpb.Frame) {
	l := c.live
	f.Id = c.id()
	l.dlq.reqID, l.dlq.creating = f.Id, creating
	ctx.Request(to, f)
	id := f.Id
	c.after(c.o.DeadLetterTimeout, &dlqTimeoutMsg{l: l, id: id})
}

// isDLQ reports whether f answers the live subscription's dead-letter
// request. Clients' requests reach the coordinator's mailbox too, with
// ids of the client's own numbering: only an answer (a produce or create
// response, or an error) may be taken for the dead-letter request's, or a
// client's DescribeGroup or Ack with the same id would be swallowed and
// would count dead letters appended before their append was acknowledged.
func (c *coordinator) isDLQ(f *heraldpb.Frame) bool {
	if c.live == nil || f.Id == 0 || f.Id != c.live.dlq.reqID {
		return false
	}
	switch f.Body.(type) {
	case *heraldpb.Frame_ProduceResponse, *heraldpb.Frame_CreateTopicResponse, *heraldpb.Frame_Error:
		return true
	}
	return false
}

// onDLQ handles the answer to the dead-letter request in flight.
func (c *coordinator) onDLQ(ctx actor.Context, f *heraldpb.Frame) {
	l := c.live
	creating, sent := l.dlq.creating, l.dlq.sent
	l.dlq.reqID, l.dlq.creating, l.dlq.sent = 0, false, nil
	if e := f.GetError(); e != nil && !(creating && e.Code == heraldpb.ErrorCode_TOPIC_ALREADY_EXISTS) {
		c.dlqFailed(ctx, e)
		return
	}
	l.dlq.backoff = 0
	if !creating {
		n := 0
		for _, id := range sent {
			if l.sub.DeadLettered(id.view, id.part, id.off) {
				l.held(id.view, id.part).del(id.off)
				c.dirty[id.view] = true
				n++
			}
		}
		if n > 0 {
			var offs []int64
			for _, id := range sent[:min(len(sent), 8)] {
				offs = append(offs, id.off)
			}
			c.log.Info("dead letters appended", "topic", l.dlq.topic, "count", n, "offsets", offs)
			c.st.deadLettered += uint64(n)
			mDeadLettered.WithLabelValues(c.group).Add(float64(n))
			c.scheduleFlush()
		}
	}
	c.pumpDLQ(ctx)
	c.dispatch(ctx) // the dead letters freed room
	c.pump(ctx)
}

// dlqFailed retries the dead-letter queue after a backoff (doubling from
// 100 ms to 30 s, at least the error's retry-after): dead letters are
// never dropped.
func (c *coordinator) dlqFailed(ctx actor.Context, e *heraldpb.Error) {
	l := c.live
	l.dlq.backoff = min(max(l.dlq.backoff*2, dlqMinBackoff, time.Duration(e.RetryAfterMs)*time.Millisecond), dlqMaxBackoff)
	if l.dlq.backoff >= time.Second {
		c.log.Warn("appending dead letters failed; retrying", "topic", l.dlq.topic, "err", e.Message, "retry_in", l.dlq.backoff)
	}
	mDeadLetterErrors.WithLabelValues(c.group).Inc()
	l.dlq.waiting = true
	c.after(l.dlq.backoff, &dlqRetryMsg{l: l})
}

func (c *coordinator) onDLQTimer(ctx actor.Context, msg any) {
	switch m := msg.(type) {
	case *dlqRetryMsg:
		if c.live == m.l {
			m.l.dlq.waiting = false
			c.pumpDLQ(ctx)
		}
	case *dlqTimeoutMsg:
		if c.live == m.l && m.l.dlq.reqID == m.id {
			m.l.dlq.reqID, m.l.dlq.creating, m.l.dlq.sent = 0, false, nil
			c.dlqFailed(ctx, heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "no answer from the dead-letter topic %q within %v", m.l.dlq.topic, c.o.DeadLetterTimeout))
		}
	}
}
