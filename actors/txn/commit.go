package txn

// Committing: the decision is written first (HalfCommit, naming where the
// target partition's log ended), then the half's records are appended to
// their topic, tagged with the half's id and the commit's token, then the
// half is recorded done. After a crash, a half committed but not done is
// looked for on its partition from that offset, so it is appended once.

import (
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
)

// maxAppending bounds the committed halves being appended at once; the
// rest wait in the due queue.
const maxAppending = 256

// commit decides h committed and, once that is durable, appends it now
// (answering with its offset) or at its delivery time (answering at once
// with -1).
func (c *Coordinator) commit(ctx actor.Context, h *half, by string, answer func(int64, *heraldpb.Error)) {
	e := c.o.Topics.Get(h.topic)
	if e == nil || int(h.part) >= len(e.Partitions) {
		c.rollback(ctx, []*half{h}, "topic_gone", nil)
		answer(-1, heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "the topic %q of half message %d is gone; the half is rolled back", h.topic, h.ref))
		return
	}
	ev := &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Commit{Commit: &heraldpb.HalfCommit{
		Ref: h.ref, FromOffset: e.Stats[h.part].HighWatermark.Load(), Token: randomToken(), By: by,
	}}}
	h.ending = true // a second end waits until this one is durable (endTarget)
	c.write(writeOp{events: [][]byte{event(ev)}, client: true, done: func(_ int64, err *heraldpb.Error) {
		h.ending = false
		if err != nil {
			answer(-1, err)
			return
		}
		if c.halves[h.ref] != h {
			answer(-1, heraldpb.NewError(heraldpb.ErrorCode_TXN_NOT_FOUND, "half message %d ended meanwhile", h.ref))
			return
		}
		c.apply(0, ev, c.defaults)
		mHalfEnded.WithLabelValues("commit", by).Inc()
		if h.deliverAt > c.nowMs() {
			c.dueQ.add(h.deliverAt, h.ref)
			c.armDue()
			answer(-1, nil)
			return
		}
		c.appendHalf(ctx, h, answer)
	}})
	c.flushWrites(ctx)
}

// runDue appends the committed halves whose time has come.
func (c *Coordinator) runDue(ctx actor.Context) {
	now := c.nowMs()
	for c.appending < maxAppending {
		at, ok := c.dueQ.next()
		if !ok || at > now {
			break
		}
		te := c.dueQ.pop()
		if h := c.halves[te.ref]; h != nil && h.state == stateCommitted && !h.appending {
			c.appendHalf(ctx, h, nil)
		}
	}
	c.armDue()
}

func (c *Coordinator) armDue() {
	next, ok := c.dueQ.next()
	if !ok || c.appending >= maxAppending || c.dueTimerAt != 0 && c.dueTimerAt <= next {
		return
	}
	c.dueTimerGen++
	c.dueTimerAt = next
	c.after(max(time.Duration(next-c.nowMs())*time.Millisecond, 0), &dueTick{gen: c.dueTimerGen})
}

// appendHalf appends committed h to its partition, retrying until it is
// there (or its topic is gone), then records it done. answer, if not nil,
// gets the offset of its first record.
func (c *Coordinator) appendHalf(ctx actor.Context, h *half, answer func(int64, *heraldpb.Error)) {
	h.appending = true
	c.appending++
	finish := func(base int64, err *heraldpb.Error) {
		h.appending = false
		c.appending--
		if answer != nil {
			answer(base, err)
		}
		c.runDue(ctx)
	}
	c.readHalf(ctx, h.ref, func(hs *heraldpb.HalfStored, err *heraldpb.Error) {
		if err != nil {
			// The half's own record cannot be read: nothing can be appended.
			c.log.Error("a committed half message cannot be read from __txn; dropped", "id", h.ref, "err", err.Message)
			c.recordDone(ctx, h, "unreadable")
			finish(-1, err)
			return
		}
		hdr := heraldpb.EncodeHeaders(nil, [2]string{HeaderHalfID, FormatID(h.ref)}, [2]string{HeaderTxnToken, tokenText(h.token)})
		recs, aerr := heraldpb.AppendBatchWithHeaders(nil, hs.Records, hdr)
		if aerr != nil {
			c.log.Error("a committed half message is unreadable; dropped", "id", h.ref, "err", aerr)
			c.recordDone(ctx, h, "unreadable")
			finish(-1, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "half message %d is unreadable: %v", h.ref, aerr))
			return
		}
		find := func(found func(int64, bool)) {
			c.findTagged(ctx, h.topic, h.part, h.from, func(rec []byte) bool {
				v, ok := heraldpb.RecordHeader(rec, HeaderHalfID)
				tok, _ := heraldpb.RecordHeader(rec, HeaderTxnToken)
				return ok && string(v) == FormatID(h.ref) && string(tok) == tokenText(h.token)
			}, found)
		}
		c.appendUntilDone(ctx, h.topic, h.part, recs, find, func(base int64, gone bool) {
			if gone {
				c.log.Warn("the topic of a committed half message is gone; dropped", "id", h.ref, "topic", h.topic)
				c.recordDone(ctx, h, "topic_gone")
				finish(-1, heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q is gone", h.topic))
				return
			}
			mHalfAppended.Inc()
			if c.o.crashAfterAppend != nil && c.o.crashAfterAppend() {
				panic("txn: crash after append (test)")
			}
			c.recordDone(ctx, h, "")
			finish(base, nil)
		})
	})
}

// recordDone writes h done and forgets it once that is durable.
func (c *Coordinator) recordDone(ctx actor.Context, h *half, dropped string) {
	c.writeDone(ctx, h.ref, "a half message", func() {
		mHalfPending.Set(float64(len(c.halves)))
		if dropped != "" {
			mHalfEnded.WithLabelValues("dropped", dropped).Inc()
		}
	})
}

// writeDone writes the event at ref done (a half message appended, or a
// routed publish), retrying until that is durable, applies it, then runs
// then.
func (c *Coordinator) writeDone(ctx actor.Context, ref uint64, what string, then func()) {
	ev := &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Done{Done: &heraldpb.HalfDone{Refs: []uint64{ref}}}}
	c.write(writeOp{events: [][]byte{event(ev)}, done: func(_ int64, err *heraldpb.Error) {
		if err != nil {
			c.log.Warn("recording "+what+" appended; retrying", "ref", ref, "err", err.Message)
			c.after(100*time.Millisecond, &retryStep{fn: func() { c.writeDone(ctx, ref, what, then) }})
			return
		}
		c.apply(0, ev, c.defaults)
		if then != nil {
			then()
		}
	}})
	c.flushWrites(ctx)
}

// appendUntilDone appends recs (an encoded RecordBatch) to partition part
// of topic with acks=all, retrying whatever the error (a follower's
// NOT_LEADER, a busy or electing partition, a full disk) with backoff: a
// committed append must get there, once. Appends go through the
// partition's appender (one batch in flight per partition), as an
// idempotent producer of its own: a retry of an append whose leader died
// after replicating it and before answering is answered with the
// original offsets by the next leader, not written twice. find looks for
// an append on the partition by its headers, for the one case where the
// partition no longer knows the appender's producer
// (OUT_OF_ORDER_SEQUENCE: it starts again as a new producer). done gets
// the offset of its first record (-1 when found by find), or gone when
// the topic (or partition) no longer exists.
func (c *Coordinator) appendUntilDone(ctx actor.Context, topic string, part uint32, recs []byte, find func(found func(base int64, ok bool)), done func(base int64, gone bool)) {
	tp := topicPart{topic, part}
	a := c.appenders[tp]
	if a == nil {
		a = &appender{tp: tp, pid: randomToken() >> 1}
		c.appenders[tp] = a
	}
	a.queue = append(a.queue, appendJob{recs: recs, find: find, done: done})
	c.kickAppender(ctx, a)
}

// appender sends one partition's appends, one batch in flight, packing
// the queued ones up to the topic's max message size, as an idempotent
// producer (pid) whose sequence counts the records it appended.
type appender struct {
	tp      topicPart
	pid     uint64
	seq     int64
	queue   []appendJob
	sending bool
}

type appendJob struct {
	recs  []byte
	count int
	find  func(found func(base int64, ok bool))
	done  func(base int64, gone bool)
}

func (c *Coordinator) kickAppender(ctx actor.Context, a *appender) {
	if a.sending || len(a.queue) == 0 {
		return
	}
	e := c.o.Topics.Get(a.tp.topic)
	if e == nil || int(a.tp.part) >= len(e.Partitions) {
		q := a.queue
		a.queue = nil
		delete(c.appenders, a.tp)
		for _, j := range q {
			j.done(-1, true)
		}
		return
	}
	limit := 1 << 20
	if l := int(e.Config.GetMaxMessageBytes()); l > 0 {
		limit = l
	}
	n, size := 0, 0
	for _, j := range a.queue {
		if n > 0 && size+len(j.recs) > limit {
			break
		}
		size += len(j.recs)
		n++
	}
	jobs := a.queue[:n:n]
	a.queue = a.queue[n:]
	var batch []byte
	count := 0
	for i := range jobs {
		if jobs[i].count == 0 {
			if info, err := heraldpb.ScanBatch(jobs[i].recs); err == nil {
				jobs[i].count = info.Count
			}
		}
		count += jobs[i].count
		batch = append(batch, jobs[i].recs...)
	}
	a.sending = true
	backoff := 50 * time.Millisecond
	pid, seq := a.pid, a.seq
	finish := func(base int64, gone bool) {
		a.sending = false
		for _, j := range jobs {
			j.done(base, gone)
			if base >= 0 {
				base += int64(j.count)
			}
		}
		c.kickAppender(ctx, a)
	}
	var send func()
	send = func() {
		e := c.o.Topics.Get(a.tp.topic)
		if e == nil || int(a.tp.part) >= len(e.Partitions) {
			delete(c.appenders, a.tp)
			finish(-1, true)
			return
		}
		if !c.leadsTxn() {
			// __txn's leadership is moving away: the next coordinator
			// recovers this commit (and fences this one's appends).
			// Held until the replica leads again (the broker stops this
			// actor when it does not).
			c.after(backoff, &retryStep{fn: send})
			backoff = min(backoff*2, 5*time.Second)
			return
		}
		if c.staleEpoch() {
			c.restartStale("__txn's replica leads in a later term")
		}
		part := a.tp.part
		req := &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
			Topic: a.tp.topic, Partition: &part, Acks: heraldpb.Acks_ACKS_ALL, Records: batch,
			ProducerId: pid, BaseSequence: seq, SingleInFlight: true, TxnEpoch: c.epoch,
		}}}
		to := e.Writer(int(part))
		if c.o.interceptAppend != nil && c.o.interceptAppend(to, req) {
			return // held by the test
		}
		// The next incarnation (after a panic) waits for the answer too
		// before it loads: its recovery scan then sees this append.
		var fut *actor.Future
		fut = c.request(ctx, to, req, callTimeout, func(f *heraldpb.Frame) {
			c.sh.forget(fut)
			if f.GetError().GetCode() == heraldpb.ErrorCode_PRODUCER_FENCED {
				c.onFenced(ctx, a.tp, f.GetError())
			}
			if pr := f.GetProduceResponse(); pr != nil {
				if a.pid == pid {
					a.seq = seq + int64(count)
				}
				finish(pr.BaseOffset, false)
				return
			}
			if f.GetError().GetCode() == heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE {
				// The partition does not know where this producer stands
				// (its table lost it): a new producer, and the jobs looked
				// for before they are sent again.
				c.log.Warn("an append's sequence was refused; appending as a new producer", "topic", a.tp.topic, "partition", part, "err", f.GetError().GetMessage())
				a.pid, a.seq = randomToken()>>1, 0
				a.sending = false
				c.refind(ctx, a, jobs)
				return
			}
			switch f.GetError().GetCode() {
			case heraldpb.ErrorCode_MESSAGE_TOO_LARGE, heraldpb.ErrorCode_INVALID_REQUEST, heraldpb.ErrorCode_PARTITION_NOT_FOUND, heraldpb.ErrorCode_TOPIC_NOT_FOUND:
				// Never accepted as it is (the topic's limits changed, or
				// it is gone): dropped, counted and logged, rather than
				// blocking the partition's later appends for good.
				c.log.Error("committed records refused for good by their partition; dropped", "topic", a.tp.topic, "partition", part, "err", f.GetError().GetMessage())
				mTxnDropped.Inc()
				finish(-1, false)
				return
			}
			c.log.Warn("appending committed records; retrying", "topic", a.tp.topic, "partition", part,
				"err", f.GetError().GetMessage(), "in", backoff)
			c.after(backoff, &retryStep{fn: send})
			backoff = min(backoff*2, 5*time.Second)
		})
		c.sh.writes = append(c.sh.writes, fut)
	}
	send()
}

// leadsTxn reports whether this node's replica of __txn still leads. A
// deposed leader that has not heard of its successor yet still answers
// true; the successor's fences refuse what it appends then (fence.go).
func (c *Coordinator) leadsTxn() bool {
	e := c.o.Topics.Get(Topic)
	if e == nil || len(e.Stats) != 1 {
		return false
	}
	return e.Stats[0].Writable.Load()
}

// refind looks for each of jobs on its partition and queues again, at the
// front, the ones not found.
func (c *Coordinator) refind(ctx actor.Context, a *appender, jobs []appendJob) {
	waiting := len(jobs)
	var again []appendJob
	for _, j := range jobs {
		j.find(func(base int64, ok bool) {
			if ok {
				j.done(base, false)
			} else {
				again = append(again, j)
			}
			if waiting--; waiting == 0 {
				a.queue = append(again, a.queue...)
				c.kickAppender(ctx, a)
			}
		})
	}
}

// findTagged scans partition part of topic from offset from for a record
// match accepts, and reports the offset of the first one.
func (c *Coordinator) findTagged(ctx actor.Context, topic string, part uint32, from int64, match func(rec []byte) bool, found func(base int64, ok bool)) {
	e := c.o.Topics.Get(topic)
	if e == nil || int(part) >= len(e.Partitions) {
		found(-1, false) // the append finds the topic gone
		return
	}
	at := int64(-1)
	c.scanFor(ctx, e, part, from, func(off int64, rec []byte) bool {
		if match(rec) {
			at = off
			return true
		}
		return false
	}, func() { found(at, at >= 0) })
}

// readHalf reads the HalfStored event at ref in __txn.
func (c *Coordinator) readHalf(ctx actor.Context, ref uint64, fn func(*heraldpb.HalfStored, *heraldpb.Error)) {
	c.readEvent(ctx, ref, func(ev *heraldpb.TxnEvent, err *heraldpb.Error) {
		if err == nil && ev.GetHalf() == nil {
			err = heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "no half message at offset %d of __txn", ref)
		}
		fn(ev.GetHalf(), err)
	})
}

// readEvent reads the event at ref in __txn.
func (c *Coordinator) readEvent(ctx actor.Context, ref uint64, fn func(*heraldpb.TxnEvent, *heraldpb.Error)) {
	e := c.o.Topics.Get(Topic)
	if e == nil {
		fn(nil, heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "internal topic %s is missing", Topic))
		return
	}
	tries := 0
	var read func()
	read = func() {
		c.request(ctx, e.Partitions[0], &heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
			Topic: Topic, Offset: int64(ref), MaxBytes: 1,
		}}}, callTimeout, func(f *heraldpb.Frame) {
			fr := f.GetFetchResponse()
			if fr == nil {
				if tries++; heraldpb.IsRetriableCode(f.GetError().GetCode()) && tries < 50 {
					c.after(100*time.Millisecond, &retryStep{fn: read})
					return
				}
				fn(nil, f.GetError())
				return
			}
			var got *heraldpb.TxnEvent
			for _, b := range fr.Batches {
				if int64(ref) < b.BaseOffset || int64(ref) >= b.BaseOffset+int64(b.Count) {
					continue
				}
				_ = heraldpb.ForEachRawRecord(b.Records, func(i int, rec []byte) bool {
					if b.BaseOffset+int64(i) != int64(ref) {
						return true
					}
					if ev, err := decodeEvent(rec); err == nil {
						got = ev
					}
					return false
				})
			}
			if got == nil {
				fn(nil, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "no readable event at offset %d of __txn", ref))
				return
			}
			fn(got, nil)
		})
	}
	read()
}

func tokenText(t uint64) string { return strconv.FormatUint(t, 16) }

// ---- recovery ------------------------------------------------------------

// recover settles the halves committed but not recorded done: each is
// looked for on its partition from where the log ended when the commit
// was written, by its herald-half-id and herald-txn-token headers. Found
// ones are recorded done; the others are appended when due.
func (c *Coordinator) recover(ctx actor.Context) {
	type key struct {
		topic string
		part  uint32
	}
	scans := map[key]map[string]*half{}
	from := map[key]int64{}
	for _, h := range c.halves {
		if h.state != stateCommitted {
			continue
		}
		k := key{h.topic, h.part}
		if scans[k] == nil {
			scans[k] = map[string]*half{}
			from[k] = h.from
		}
		scans[k][FormatID(h.ref)+"/"+tokenText(h.token)] = h
		from[k] = min(from[k], h.from)
	}
	if len(scans) == 0 {
		c.finishLoad(ctx)
		return
	}
	waiting := len(scans)
	var found []*half
	for k, want := range scans {
		e := c.o.Topics.Get(k.topic)
		if e == nil || int(k.part) >= len(e.Partitions) {
			waiting-- // appended again when due; the topic is gone, so it is dropped then
			continue
		}
		c.scanFor(ctx, e, k.part, from[k], func(_ int64, rec []byte) bool {
			if v, ok := heraldpb.RecordHeader(rec, HeaderHalfID); ok {
				tok, _ := heraldpb.RecordHeader(rec, HeaderTxnToken)
				key := string(v) + "/" + string(tok)
				if h, ok := want[key]; ok {
					found = append(found, h)
					delete(want, key)
				}
			}
			return len(want) == 0
		}, func() {
			if waiting--; waiting == 0 {
				c.settleRecovered(ctx, found)
			}
		})
	}
	if waiting == 0 {
		c.settleRecovered(ctx, found)
	}
}

func (c *Coordinator) settleRecovered(ctx actor.Context, found []*half) {
	if len(found) > 0 {
		c.log.Info("committed half messages found appended after a crash; recorded done", "count", len(found))
	}
	for _, h := range found {
		h.appending = true // not appended again while its done is written
		c.recordDone(ctx, h, "")
	}
	c.finishLoad(ctx)
}

// scanFor reads partition p of e from offset from to its end, handing
// each record to visit until visit says it has found all it looks for.
func (c *Coordinator) scanFor(ctx actor.Context, e *registry.Entry, p uint32, from int64, visit func(off int64, rec []byte) (all bool), done func()) {
	// Fenced first: an append of an older coordinator then either is in
	// the log before the fence, where this scan sees it, or is refused.
	c.fence(ctx, e, p, func() { c.scanFenced(ctx, e, p, from, visit, done) })
}

func (c *Coordinator) scanFenced(ctx actor.Context, e *registry.Entry, p uint32, from int64, visit func(off int64, rec []byte) (all bool), done func()) {
	all := false
	backoff, warned := 100*time.Millisecond, time.Time{}
	var step func(off int64)
	step = func(off int64) {
		cur := c.o.Topics.Get(e.Name)
		if all || !registry.Same(cur, e) {
			done()
			return
		}
		// From the leader (a follower may lack committed entries): the
		// local replica when it leads, else the node's stand-in.
		c.request(ctx, cur.Writer(int(p)), &heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
			Topic: e.Name, Partition: p, Offset: off, MaxBytes: 4 << 20, IncludeHeld: true,
		}}}, callTimeout, func(f *heraldpb.Frame) {
			if c.o.failScan != nil && c.o.failScan() {
				f = heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "test: a failed read"))
			}
			fr := f.GetFetchResponse()
			if fr == nil {
				if start := cur.Stats[p].StartOffset.Load(); f.GetError().GetCode() == heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE && off < start {
					step(start) // retention removed the start: what it removed was appended before
					return
				}
				if f.GetError().GetCode() == heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE && off >= cur.Stats[p].HighWatermark.Load() {
					done() // nothing at or past off: the log ends before it
					return
				}
				// Never given up while the topic exists: treating the rest
				// as not appended would append again what may be there.
				// The commits wait; a warning a minute says why.
				if time.Since(warned) > time.Minute {
					warned = time.Now()
					c.log.Warn("recovering commits: reading the target partition failed; retrying until it answers",
						"topic", e.Name, "partition", p, "err", f.GetError().GetMessage())
				}
				c.after(backoff, &retryStep{fn: func() { step(off) }})
				backoff = min(2*backoff, 5*time.Second)
				return
			}
			next := off
			for _, b := range fr.Batches {
				next = max(next, b.BaseOffset+int64(b.Count))
				_ = heraldpb.ForEachRawRecord(b.Records, func(i int, rec []byte) bool {
					if b.BaseOffset+int64(i) < off {
						return true
					}
					all = all || visit(b.BaseOffset+int64(i), rec)
					return !all
				})
			}
			if all || next == off || next >= fr.HighWatermark {
				done()
				return
			}
			step(next)
		})
	}
	step(from)
}
