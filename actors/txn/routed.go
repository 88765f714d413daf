package txn

// Publishes through an exchange that reach several partitions. The broker
// routes the publish and hands the coordinator its batches; the
// coordinator makes them one decision: a single Routed event in __txn
// holds every batch, so once it is durable each batch will be appended,
// and if it is not, none is. Then each batch is appended to its
// partition through the partition's idempotent appender (commit.go),
// each record tagged with the decision's offset and token, and the
// decision is recorded done. After a crash, the next coordinator looks
// for each batch on its partition from where the log ended at the
// decision, and appends only those it does not find.

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// HeaderRouteRef tags each record of a routed publish with the offset of
// its decision in __txn (with HeaderTxnToken, the decision's token).
const HeaderRouteRef = "herald-route-ref"

// maxRoutedBytes bounds the records of decided publishes kept in memory
// until appended; past it, publishes to several partitions are answered
// THROTTLED.
const maxRoutedBytes = 64 << 20

// answerWithin bounds the wait for a decided publish's appends before it
// is answered anyway (its offsets -1): it is decided, so it will be whole.
const answerWithin = 5 * time.Second

var (
	mRouted = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_txn_routed_total",
		Help: "Publishes routed to several partitions, by outcome: decided (stored as one decision in __txn), appended (every batch on its partition), dropped (a batch's topic gone before its append).",
	}, []string{"outcome"})
	mRoutedBytes = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_txn_routed_pending_bytes",
		Help: "Records of decided routed publishes held in memory until appended (at most 64 MiB; past it, THROTTLED).",
	})
)

// maxPublishers bounds the idempotent publishers remembered; past it the
// least recently used is forgotten (a retry of its last publish would
// then be stored again). publisherExpiry forgets idle ones.
const (
	maxPublishers   = 100_000
	publisherExpiry = 7 * 24 * time.Hour
)

// publisher is an idempotent publisher's last decided sequence.
type publisher struct {
	seq     int64
	off     uint64 // offset of the newest event that names it
	used    int64  // ms
	last    *heraldpb.PublishResponse
	lastSeq int64
	pending int64 // the highest sequence being written, while writing > 0
	writing int
}

// notePublisher records that publisher id decided sequence seq in the
// event at off.
func (st *state) notePublisher(id uint64, seq int64, off uint64, used int64) {
	p := st.publishers[id]
	if p == nil {
		if len(st.publishers) >= maxPublishers {
			st.forgetOldestPublisher()
		}
		p = &publisher{seq: -1}
		st.publishers[id] = p
	}
	p.seq = max(p.seq, seq)
	p.off = max(p.off, off)
	p.used = max(p.used, used)
}

func (st *state) forgetOldestPublisher() {
	var oldest uint64
	at := int64(-1)
	for id, p := range st.publishers {
		if p.writing == 0 && (at < 0 || p.used < at) {
			oldest, at = id, p.used
		}
	}
	delete(st.publishers, oldest)
}

// publishersBelow returns the publishers whose newest event is below cut
// and the event that writes their sequences again (compact decides when);
// those idle past publisherExpiry are forgotten instead.
func (st *state) publishersBelow(cut, nowMs int64) ([]*publisher, *heraldpb.TxnEvent) {
	var out []*publisher
	ev := &heraldpb.RoutedPublishers{}
	for id, p := range st.publishers {
		if int64(p.off) >= cut || p.writing > 0 {
			continue
		}
		if p.used < nowMs-publisherExpiry.Milliseconds() {
			delete(st.publishers, id)
			continue
		}
		out = append(out, p)
		ev.ProducerIds = append(ev.ProducerIds, id)
		ev.Sequences = append(ev.Sequences, p.seq)
		ev.UsedMs = append(ev.UsedMs, p.used)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Publishers{Publishers: ev}}
}

// duplicate answers an idempotent publish at or below its publisher's
// last decided sequence (or being decided), reporting whether it did.
func (c *Coordinator) duplicate(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.PublishRequest, to *actor.PID) bool {
	p := c.publishers[req.ProducerId]
	switch {
	case p == nil:
		return false
	case p.writing > 0 && req.Sequence <= p.pending:
		// Its first send is being written: the retry learns the outcome
		// when it comes again.
		e := throttledErr("the publish of this sequence is being decided")
		e.RetryAfterMs = 50
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, e))
		return true
	case req.Sequence > p.seq:
		return false
	}
	resp := &heraldpb.PublishResponse{Duplicate: true}
	if p.last != nil && p.lastSeq == req.Sequence {
		resp.Destinations = p.last.Destinations
	}
	mRouted.WithLabelValues("duplicate").Inc()
	respond(ctx, to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_PublishResponse{PublishResponse: resp}})
	return true
}

// routed is a decided publish whose batches are not all appended.
type routed struct {
	ref     uint64
	token   uint64
	created int64
	batches []*heraldpb.RoutedBatch // records held only by the deciding incarnation
	bytes   int64                   // of records held in memory
}

// onPublish decides a routed publish: checks every batch against its
// partition (so that no append is refused for good once decided), then
// writes the decision, appends, and answers.
func (c *Coordinator) onPublish(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.PublishRequest, to *actor.PID) {
	if len(req.Routed) == 0 {
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "a publish reaches the coordinator routed")))
		return
	}
	if req.ProducerId != 0 && (req.Sequence < 0 || c.duplicate(ctx, f, req, to)) {
		if req.Sequence < 0 {
			respond(ctx, to, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "publish: sequence %d is negative", req.Sequence)))
		}
		return
	}
	if c.queued >= c.o.MaxQueued {
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, throttledErr("too many requests waiting for __txn")))
		return
	}
	size := int64(0)
	tag := len(heraldpb.EncodeHeaders(nil, [2]string{HeaderRouteRef, "18446744073709551615"}, [2]string{HeaderTxnToken, "ffffffffffffffff"})) + 8
	ev := &heraldpb.Routed{Token: randomToken(), CreatedMs: c.nowMs(), ProducerId: req.ProducerId, Sequence: req.Sequence}
	for _, b := range req.Routed {
		e := c.o.Topics.Get(b.Topic)
		if e == nil || int(b.Partition) >= len(e.Partitions) {
			respond(ctx, to, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q (partition %d) does not exist; nothing was published", b.Topic, b.Partition)))
			return
		}
		limit := 1 << 20
		if l := int(e.Config.GetMaxMessageBytes()); l > 0 {
			limit = l
		}
		if n := len(b.Records) + int(b.Count)*tag; n > limit {
			respond(ctx, to, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_MESSAGE_TOO_LARGE,
				"the publish's %d records for topic %q take %d bytes with their routing tags, over its max message size of %d; nothing was published", b.Count, b.Topic, n, limit)))
			return
		}
		size += int64(len(b.Records))
		ev.Batches = append(ev.Batches, &heraldpb.RoutedBatch{Topic: b.Topic, Partition: b.Partition, Records: b.Records, Count: b.Count,
			FromOffset: e.Stats[b.Partition].HighWatermark.Load()})
	}
	if c.routedHeld+size > maxRoutedBytes {
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, throttledErr("too many routed publishes waiting for their appends")))
		return
	}
	tev := &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Routed{Routed: ev}}
	var pub *publisher
	if req.ProducerId != 0 {
		if pub = c.publishers[req.ProducerId]; pub == nil {
			if len(c.publishers) >= maxPublishers {
				c.forgetOldestPublisher()
			}
			pub = &publisher{seq: -1, used: ev.CreatedMs}
			c.publishers[req.ProducerId] = pub
		}
		if pub.writing == 0 || req.Sequence > pub.pending {
			pub.pending = req.Sequence
		}
		pub.writing++
	}
	c.write(writeOp{events: [][]byte{event(tev)}, client: true, done: func(base int64, e *heraldpb.Error) {
		if pub != nil {
			pub.writing--
		}
		if e != nil {
			respond(ctx, to, heraldpb.ErrorFrame(f.Id, e))
			return
		}
		ref := uint64(base)
		c.apply(ref, tev, c.defaults)
		r := c.routed[ref]
		for i, b := range ev.Batches {
			r.batches[i].Records = b.Records
		}
		r.bytes = size
		c.routedHeld += size
		mRoutedBytes.Set(float64(c.routedHeld))
		mRouted.WithLabelValues("decided").Inc()
		answered := false
		answer := func(offsets []int64) {
			if answered {
				return
			}
			answered = true
			resp := &heraldpb.PublishResponse{}
			for i, b := range ev.Batches {
				off := int64(-1)
				if offsets != nil {
					off = offsets[i]
				}
				resp.Destinations = append(resp.Destinations, &heraldpb.PublishedTo{Topic: b.Topic, Partition: b.Partition, BaseOffset: off, Count: b.Count})
			}
			if pub != nil && pub.seq == req.Sequence {
				pub.last, pub.lastSeq = resp, req.Sequence
			}
			respond(ctx, to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_PublishResponse{PublishResponse: resp}})
		}
		wait := answerWithin
		if t := time.Duration(req.TimeoutMs) * time.Millisecond / 2; t > 0 && t < wait {
			wait = t
		}
		c.after(wait, &retryStep{fn: func() { answer(nil) }})
		c.appendRouted(ctx, r, nil, answer)
	}})
	c.flushWrites(ctx)
}

// appendRouted appends r's batches not in found (recovery: already on
// their partition), then records r done and hands done the offset of
// each batch's first record (-1 for one found or dropped).
func (c *Coordinator) appendRouted(ctx actor.Context, r *routed, found []bool, done func(offsets []int64)) {
	offsets := make([]int64, len(r.batches))
	left := len(r.batches)
	finish := func(i int, base int64) {
		if base >= 0 && c.o.crashAfterRoutedAppend != nil && c.o.crashAfterRoutedAppend() {
			panic("txn: crash after a routed append (test)")
		}
		offsets[i] = base
		if left--; left > 0 {
			return
		}
		c.routedHeld -= r.bytes
		r.bytes = 0
		mRoutedBytes.Set(float64(c.routedHeld))
		mRouted.WithLabelValues("appended").Inc()
		c.writeDone(ctx, r.ref, "a routed publish", nil)
		if done != nil {
			done(offsets)
		}
	}
	hdr := heraldpb.EncodeHeaders(nil, [2]string{HeaderRouteRef, FormatID(r.ref)}, [2]string{HeaderTxnToken, tokenText(r.token)})
	for i, b := range r.batches {
		if found != nil && found[i] {
			finish(i, -1)
			continue
		}
		recs, err := heraldpb.AppendBatchWithHeaders(nil, b.Records, hdr)
		if err != nil {
			// Checked before the decision; only a damaged __txn gets here.
			c.log.Error("a routed publish's batch is unreadable; dropped", "ref", r.ref, "topic", b.Topic, "err", err)
			mRouted.WithLabelValues("dropped").Inc()
			finish(i, -1)
			continue
		}
		b.Records = nil // the tagged copy is what is held now
		find := func(found func(int64, bool)) {
			c.findTagged(ctx, b.Topic, b.Partition, b.FromOffset, r.match, found)
		}
		c.appendUntilDone(ctx, b.Topic, b.Partition, recs, find, func(base int64, gone bool) {
			if gone {
				c.log.Warn("the topic of a routed publish is gone; its batch is dropped", "ref", r.ref, "topic", b.Topic)
				mRouted.WithLabelValues("dropped").Inc()
			}
			finish(i, base)
		})
	}
}

// match reports whether rec is one of r's appended records.
func (r *routed) match(rec []byte) bool {
	v, ok := heraldpb.RecordHeader(rec, HeaderRouteRef)
	if !ok || string(v) != FormatID(r.ref) {
		return false
	}
	tok, _ := heraldpb.RecordHeader(rec, HeaderTxnToken)
	return string(tok) == tokenText(r.token)
}

// recoverRouted completes the publishes decided before a crash (or a
// failover): each batch is looked for on its partition from where its log
// ended at the decision, and the ones not there are appended from the
// decision's records in __txn.
func (c *Coordinator) recoverRouted(ctx actor.Context) {
	for _, r := range c.routed {
		c.readEvent(ctx, r.ref, func(ev *heraldpb.TxnEvent, err *heraldpb.Error) {
			stored := ev.GetRouted()
			if err != nil || stored == nil || len(stored.Batches) != len(r.batches) {
				c.log.Error("a decided routed publish cannot be read from __txn; dropped", "ref", r.ref, "err", err.GetMessage())
				mRouted.WithLabelValues("dropped").Inc()
				c.writeDone(ctx, r.ref, "a routed publish", nil)
				return
			}
			found := make([]bool, len(r.batches))
			left := len(r.batches)
			for i, b := range r.batches {
				c.findTagged(ctx, b.Topic, b.Partition, b.FromOffset, r.match, func(_ int64, ok bool) {
					found[i] = ok
					if left--; left > 0 {
						return
					}
					for j, sb := range stored.Batches {
						r.batches[j].Records = sb.Records
						r.bytes += int64(len(sb.Records))
					}
					c.routedHeld += r.bytes
					mRoutedBytes.Set(float64(c.routedHeld))
					c.log.Info("completing a publish decided before a restart", "ref", r.ref, "batches", len(r.batches))
					c.appendRouted(ctx, r, found, nil)
				})
			}
		})
	}
}
