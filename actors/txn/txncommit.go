package txn

// Committing a transaction: the decision (TxnEnd, commit) is written
// first, with where each partition's log ended and a random token, and
// the producer is answered once it is durable: from then on the
// transaction will be whole on its partitions. Then, as a commitJob, the
// staged batches are read back from __txn and appended to their
// partitions, each record tagged with the transactional id, its staged
// batch's ref and the token; then TxnComplete. The producer's next
// transactions stage and are decided meanwhile (up to maxCompleting
// waiting); their appends start when this one's TxnComplete is written. After a crash between the decision and TxnComplete, the
// next coordinator looks for the token on each partition from the
// recorded offset and appends only the staged batches not found, so every
// record of a committed transaction is on its topic once.

import (
	"slices"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
)

// Headers the coordinator adds to every record of a committed transaction.
const (
	HeaderTxnID  = "herald-txn-id"
	HeaderTxnRef = "herald-txn-ref" // the staged batch's offset in __txn
)

// commitTxn decides m's transaction committed, answers the waiters once
// the decision is durable, and appends it. data, if not nil, is the
// transaction's last batch (its sequence next, nothing else of it being
// staged): it is written in the same batch as the decision, so that both
// are stored or neither.
func (c *Coordinator) commitTxn(ctx actor.Context, m *txnMeta, by string, data *heraldpb.TxnEvent) {
	pid, epoch := m.pid, m.epoch
	end := &heraldpb.TxnEnd{TransactionalId: m.id, Epoch: epoch, Commit: true, By: by, Token: randomToken(), GroupOffsets: waitersOffsets(m), Written: m.written}
	parts := m.partitions()
	if d := data.GetData(); d != nil {
		if tp := (topicPart{d.Topic, d.Partition}); !slices.Contains(parts, tp) {
			parts = append(parts, tp)
		}
	}
	for _, tp := range parts {
		off := int64(0)
		if e := c.o.Topics.Get(tp.topic); e != nil && int(tp.part) < len(e.Stats) {
			off = e.Stats[tp.part].HighWatermark.Load()
		}
		end.From = append(end.From, &heraldpb.TxnAppendFrom{Topic: tp.topic, Partition: tp.part, Offset: off})
	}
	ev := &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_End{End: end}}
	snap := m.sessionAfterEnd(true, by)
	m.deciding, m.decidingCommit, m.queuedCommit = true, true, false
	m.decidingThrough = epoch
	events := [][]byte{event(ev), event(snap)}
	if data != nil {
		d := data.GetData()
		m.seqs = d.BaseSequence + int64(d.Count)
		events = append([][]byte{event(data)}, events...)
	}
	c.write(writeOp{events: events, client: true, done: func(base int64, err *heraldpb.Error) {
		m.deciding = false
		if err != nil {
			if data != nil && m.epoch == epoch {
				m.seqs = m.nextSeq // not staged: the retry stages it
			}
			c.answerWaiters(ctx, m, err)
			c.failPiped(ctx, m, heraldpb.NewError(heraldpb.ErrorCode_INVALID_TXN_STATE, "transactional id %q: the commit before this one failed: %s", m.id, err.Message))
			return
		}
		if m.epoch != epoch {
			e := m.endedMeanwhile(pid, epoch)
			c.answerWaiters(ctx, m, e)
			c.failPiped(ctx, m, e)
			return
		}
		defer c.decidePiped(ctx, m)
		if data != nil {
			// Staged before the decision, here as on every replay: its
			// sequence was the next one and nothing else of the
			// transaction was written meanwhile (deciding).
			c.applyTxn(uint64(base), data, c.nowMs())
			base++
			mTxnStaged.Add(float64(data.GetData().GetCount()))
		}
		c.applyTxn(uint64(base), ev, c.nowMs())
		c.applyTxn(uint64(base)+1, snap, c.nowMs())
		j := m.completing[len(m.completing)-1]
		j.live = true
		recs, parts := j.records(), j.partitions()
		mTxnEnded.WithLabelValues("commit", by).Inc()
		mTxnCommitted.Add(float64(recs))
		c.gaugeOpen()
		ws := m.waiters
		m.waiters = nil
		for _, w := range ws {
			w.answer(ctx, endResponse(m, false, recs, parts))
		}
		if len(m.completing) == 1 {
			c.appendTxn(ctx, m, j, nil)
		} else {
			c.kickWritten(ctx, m) // (else appended when the ones before it complete: completeTxn)
		}
	}})
	c.flushWrites(ctx)
}

// appendTxn appends the staged batches of j, a committed transaction of
// m, that are not in found (refs already on their partitions), partition
// by partition in parallel, then completes it.
func (c *Coordinator) appendTxn(ctx actor.Context, m *txnMeta, j *commitJob, found map[uint64]bool) {
	if c.o.holdAppends != nil && c.o.holdAppends() {
		c.after(10*time.Millisecond, &retryStep{fn: func() { c.appendTxn(ctx, m, j, found) }})
		return
	}
	j.started = true
	if len(j.written) > 0 {
		// Written once: its commit markers make the records readable. The
		// next commit's markers go right behind them: a partition takes a
		// producer's commits in epoch order (it refuses one while an
		// earlier transaction of the producer is open there without its
		// marker), so they keep their order on every partition.
		c.writeMarkers(ctx, m.pid, j.epoch, true, j.written, func() { c.completeTxn(ctx, m, j) })
		c.kickWritten(ctx, m)
		return
	}
	groups := map[topicPart][]staged{}
	var order []topicPart
	for _, s := range j.staged {
		if found[s.ref] {
			continue
		}
		tp := topicPart{s.topic, s.part}
		if groups[tp] == nil {
			order = append(order, tp)
		}
		groups[tp] = append(groups[tp], s)
	}
	waiting := len(order)
	if waiting == 0 {
		c.completeTxn(ctx, m, j)
		return
	}
	for _, tp := range order {
		c.appendStaged(ctx, m, j, tp, groups[tp], func() {
			if waiting--; waiting == 0 {
				c.completeTxn(ctx, m, j)
			}
		})
	}
}

// appendStaged appends refs (one partition's staged batches, in order),
// packed into appends of up to the topic's max message size.
func (c *Coordinator) appendStaged(ctx actor.Context, m *txnMeta, j *commitJob, tp topicPart, refs []staged, done func()) {
	limit := 1 << 20
	if e := c.o.Topics.Get(tp.topic); e != nil && e.Config.GetMaxMessageBytes() > 0 {
		limit = int(e.Config.GetMaxMessageBytes())
	}
	token := tokenText(j.token)
	var chunk []byte
	i := 0
	var next func()
	from := j.from[tp]
	flush := func(then func()) {
		recs := chunk
		chunk = nil
		// The chunk is one append (one log entry): its first record
		// tells whether it got there.
		var first string
		_ = heraldpb.ForEachRawRecord(recs, func(_ int, rec []byte) bool {
			v, _ := heraldpb.RecordHeader(rec, HeaderTxnRef)
			first = string(v)
			return false
		})
		find := func(found func(int64, bool)) {
			c.findTagged(ctx, tp.topic, tp.part, from, func(rec []byte) bool {
				tok, _ := heraldpb.RecordHeader(rec, HeaderTxnToken)
				ref, _ := heraldpb.RecordHeader(rec, HeaderTxnRef)
				return string(tok) == token && string(ref) == first
			}, found)
		}
		c.appendUntilDone(ctx, tp.topic, tp.part, recs, find, func(_ int64, gone bool) {
			if gone {
				c.log.Warn("the topic of a committed transaction is gone; its records there are dropped", "transactional_id", m.id, "topic", tp.topic, "partition", tp.part)
				mTxnDropped.Inc()
			}
			then()
		})
	}
	// add packs one staged batch's records into the chunk; it reports
	// false when it flushed the chunk first (next is then called when
	// that append is done).
	add := func(s staged, records []byte) bool {
		hdr := heraldpb.EncodeHeaders(nil, [2]string{HeaderTxnID, m.id}, [2]string{HeaderTxnRef, strconv.FormatUint(s.ref, 10)}, [2]string{HeaderTxnToken, token})
		recs, aerr := heraldpb.AppendBatchWithHeaders(nil, records, hdr)
		if aerr != nil {
			c.log.Error("a staged batch of a committed transaction is unreadable; dropped", "transactional_id", m.id, "ref", s.ref, "err", aerr)
			mTxnDropped.Inc()
			return true
		}
		if len(chunk) > 0 && len(chunk)+len(recs) > limit {
			flush(func() {
				chunk = recs
				next()
			})
			return false
		}
		chunk = append(chunk, recs...)
		return true
	}
	next = func() {
		// The batches kept in memory since they were staged, in a loop;
		// the others are read back from __txn.
		for i < len(refs) && refs[i].data != nil {
			s := refs[i]
			i++
			if !add(s, s.data) {
				return
			}
		}
		if i == len(refs) {
			if len(chunk) > 0 {
				flush(done)
				return
			}
			done()
			return
		}
		s := refs[i]
		i++
		c.readEvent(ctx, s.ref, func(ev *heraldpb.TxnEvent, err *heraldpb.Error) {
			d := ev.GetData()
			if err != nil || d == nil {
				c.log.Error("a staged batch of a committed transaction cannot be read from __txn; dropped", "transactional_id", m.id, "ref", s.ref, "err", err.GetMessage())
				mTxnDropped.Inc()
				next()
				return
			}
			if add(s, d.Records) {
				next()
			}
		})
	}
	next()
}

// completeTxn records j, a committed transaction of m, complete; a
// commit of m's next transaction waiting for it is decided then.
func (c *Coordinator) completeTxn(ctx actor.Context, m *txnMeta, j *commitJob) {
	if len(j.offsets) > 0 && !j.offsetsDone {
		c.applyOffsets(ctx, m, j, 0, 0, func() {
			j.offsetsDone = true
			c.completeTxn(ctx, m, j)
		})
		return
	}
	ev := &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Complete{Complete: &heraldpb.TxnComplete{TransactionalId: m.id, Epoch: j.epoch}}}
	c.write(writeOp{events: [][]byte{event(ev)}, done: func(base int64, err *heraldpb.Error) {
		if err != nil {
			c.log.Warn("recording a committed transaction complete; retrying", "transactional_id", m.id, "err", err.Message)
			c.after(100*time.Millisecond, &retryStep{fn: func() { c.completeTxn(ctx, m, j) }})
			return
		}
		c.applyTxn(uint64(base), ev, c.nowMs())
		c.gaugeOpen()
		if len(m.completing) > 0 {
			// The next one (they append one at a time, in order).
			if next := m.completing[0]; next.started {
				// (written once: started behind this one's markers)
			} else if next.live {
				c.appendTxn(ctx, m, next, nil)
			} else {
				c.recoverTxn(ctx, m, next) // found at load
			}
		}
		if m.queuedCommit && m.roomToComplete(len(m.written) > 0) > 0 {
			c.commitTxn(ctx, m, "producer", nil)
		}
		c.decidePiped(ctx, m)
		if len(m.completing) > 0 {
			return // a new session waits for all of them
		}
		if ws := m.initWaiters; len(ws) > 0 {
			m.initWaiters = nil
			res := m.initAnswer
			if res.ProducerEpoch != m.session {
				res = nil // a later session started meanwhile: these were fenced
			}
			for _, w := range ws {
				if res == nil {
					respond(ctx, w.to, heraldpb.ErrorFrame(w.id, heraldpb.NewError(heraldpb.ErrorCode_PRODUCER_FENCED, "transactional id %q: a newer session started", m.id)))
					continue
				}
				respond(ctx, w.to, &heraldpb.Frame{Id: w.id, Body: &heraldpb.Frame_InitProducerIdResponse{InitProducerIdResponse: res}})
			}
		}
	}})
	c.flushWrites(ctx)
}

// answerWaiters fails the EndTxn requests waiting on m.
func (c *Coordinator) answerWaiters(ctx actor.Context, m *txnMeta, e *heraldpb.Error) {
	ws := m.waiters
	m.waiters = nil
	for _, w := range ws {
		w.fail(ctx, e)
	}
}

// recoverTxn finishes the commit j of m found appending at load: each of
// its partitions is scanned from where its log ended at the decision for
// records carrying the commit's token, and the staged batches not found
// are appended.
func (c *Coordinator) recoverTxn(ctx actor.Context, m *txnMeta, j *commitJob) {
	j.started = true
	if len(j.written) > 0 {
		// Markers are idempotent: all written again, nothing to look for.
		c.log.Info("finishing a transaction committed before a restart", "transactional_id", m.id, "epoch", j.epoch, "partitions", len(j.written))
		c.appendTxn(ctx, m, j, nil)
		return
	}
	token := tokenText(j.token)
	found := map[uint64]bool{}
	type scan struct {
		tp topicPart
		e  *registry.Entry
	}
	var scans []scan
	for _, tp := range j.partitions() {
		e := c.o.Topics.Get(tp.topic)
		if e == nil || int(tp.part) >= len(e.Partitions) {
			continue // appended again, and dropped then: the topic is gone
		}
		scans = append(scans, scan{tp, e})
	}
	if len(scans) == 0 {
		c.appendTxn(ctx, m, j, found)
		return
	}
	// (A scan may finish at once, inside the loop: the last one to
	// finish appends, once.)
	waiting := len(scans)
	for _, sc := range scans {
		tp, e := sc.tp, sc.e
		c.scanFor(ctx, e, tp.part, j.from[tp], func(_ int64, rec []byte) bool {
			if tok, ok := heraldpb.RecordHeader(rec, HeaderTxnToken); ok && string(tok) == token {
				if v, ok := heraldpb.RecordHeader(rec, HeaderTxnRef); ok {
					if ref, err := strconv.ParseUint(string(v), 10, 64); err == nil {
						found[ref] = true
					}
				}
			}
			return false
		}, func() {
			if waiting--; waiting == 0 {
				c.log.Info("finishing a transaction committed before a restart", "transactional_id", m.id, "epoch", j.epoch, "batches_found", len(found), "batches", len(j.staged))
				c.appendTxn(ctx, m, j, found)
			}
		})
	}
}

// recoverJobs finishes m's commits found appending at load, one after
// the other, oldest first (completeTxn starts the next).
func (c *Coordinator) recoverJobs(ctx actor.Context, m *txnMeta) {
	if len(m.completing) > 0 {
		c.recoverTxn(ctx, m, m.completing[0])
	}
}
