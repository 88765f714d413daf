package txn

import (
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Transactions written once (actors/partition txnlog.go): the producer
// writes its batches straight to their partitions, where they hold no
// offset, and lists the partitions with its EndTxn (written). The decision
// records them; then the coordinator writes the decision's marker to each
// partition, which gives a commit's records their offsets or drops an
// abort's. A marker is idempotent (a partition answers a repeated one as
// it did the first), so after a failover the next coordinator writes them
// all again, with no scan and no fence: nothing it writes can land twice.

// checkWritten validates an EndTxn's written partitions.
func (c *Coordinator) checkWritten(written []*heraldpb.TxnWritten) *heraldpb.Error {
	seen := map[topicPart]bool{}
	for _, w := range written {
		tp := topicPart{w.GetTopic(), w.GetPartition()}
		e := c.o.Topics.Get(tp.topic)
		switch {
		case e == nil:
			return heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q does not exist", tp.topic)
		case int(tp.part) >= len(e.Partitions):
			return heraldpb.NewError(heraldpb.ErrorCode_PARTITION_NOT_FOUND, "topic %q has no partition %d", tp.topic, tp.part)
		case w.GetRecords() == 0:
			return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "written partition %s lists no records", tp)
		case seen[tp]:
			return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "written partition %s is listed twice", tp)
		}
		seen[tp] = true
	}
	return nil
}

// writeMarkers writes the marker of producer pid's transaction of epoch
// (commit or abort) to every partition in written, each retried until its
// partition has it, and calls done once all have.
func (c *Coordinator) writeMarkers(ctx actor.Context, pid uint64, epoch uint32, commit bool, written []*heraldpb.TxnWritten, done func()) {
	waiting := len(written)
	if waiting == 0 {
		done()
		return
	}
	for _, w := range written {
		c.writeMarker(ctx, pid, epoch, commit, w, func() {
			if waiting--; waiting == 0 {
				done()
			}
		})
	}
}

// writeMarker writes one partition's marker; see writeMarkers.
func (c *Coordinator) writeMarker(ctx actor.Context, pid uint64, epoch uint32, commit bool, w *heraldpb.TxnWritten, done func()) {
	tp := topicPart{w.GetTopic(), w.GetPartition()}
	marker, records := heraldpb.TxnMarker_TXN_MARKER_ABORT, uint32(0)
	if commit {
		marker, records = heraldpb.TxnMarker_TXN_MARKER_COMMIT, w.GetRecords()
	}
	backoff := 20 * time.Millisecond
	var send func()
	retry := func(e *heraldpb.Error, why string) {
		wait := backoff
		if e.GetCode() == heraldpb.ErrorCode_THROTTLED {
			// The partition waits for an earlier transaction's marker or
			// for this one's records to be applied: soon, and the
			// producer's later markers queue behind this one, so it is
			// asked again at once rather than later and later.
			wait = max(time.Duration(e.GetRetryAfterMs())*time.Millisecond, markerThrottledRetry)
			wait = min(wait, 4*markerThrottledRetry)
		} else {
			backoff = min(backoff*2, markerMaxBackoff)
		}
		c.log.Debug("writing a transaction marker; retrying", "topic", tp.topic, "partition", tp.part, "producer", pid, "epoch", epoch, "err", why, "in", wait)
		c.after(wait, &retryStep{fn: send})
	}
	send = func() {
		e := c.o.Topics.Get(tp.topic)
		if e == nil || int(tp.part) >= len(e.Partitions) {
			c.log.Warn("the topic of a transaction's marker is gone", "topic", tp.topic, "partition", tp.part, "producer", pid, "epoch", epoch)
			done()
			return
		}
		if !c.leadsTxn() {
			// (the next coordinator writes it; held until this replica
			// leads again, as the broker stops this actor when it does not)
			retry(nil, "__txn's leadership is moving")
			return
		}
		part := tp.part
		req := &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
			Topic: tp.topic, Partition: &part, Acks: heraldpb.Acks_ACKS_ALL,
			ProducerId: pid, ProducerEpoch: epoch, TxnMarker: marker, TxnRecords: records,
		}}}
		to := e.Writer(int(part))
		if c.o.interceptAppend != nil && c.o.interceptAppend(to, req) {
			return // held by the test
		}
		c.request(ctx, to, req, callTimeout, func(f *heraldpb.Frame) {
			if f.GetProduceResponse() != nil {
				mTxnMarkers.WithLabelValues(markerResult(commit)).Inc()
				done()
				return
			}
			switch f.GetError().GetCode() {
			case heraldpb.ErrorCode_INVALID_TXN_STATE, heraldpb.ErrorCode_INVALID_REQUEST, heraldpb.ErrorCode_TOPIC_NOT_FOUND, heraldpb.ErrorCode_PARTITION_NOT_FOUND:
				// Never accepted as it is: the partition holds a different
				// count of the transaction's records, or ended it the
				// other way. Logged and counted, not retried for ever.
				if !commit && f.GetError().GetCode() == heraldpb.ErrorCode_INVALID_TXN_STATE {
					// (An abort of a transaction its partition committed
					// alone first: onephase.go.)
					c.log.Warn("a transaction's abort marker refused: its partition ended it otherwise", "topic", tp.topic, "partition", part, "producer", pid, "epoch", epoch,
						"err", f.GetError().GetMessage())
					mTxnMarkers.WithLabelValues("refused").Inc()
					done()
					return
				}
				c.log.Error("a transaction's marker refused for good by its partition", "topic", tp.topic, "partition", part, "producer", pid, "epoch", epoch,
					"commit", commit, "err", f.GetError().GetMessage())
				mTxnMarkers.WithLabelValues("refused").Inc()
				done()
				return
			}
			retry(f.GetError(), f.GetError().GetMessage())
		})
	}
	send()
}

// A marker refused THROTTLED is asked again after markerThrottledRetry (or
// the partition's hint, at most 4 times it); after other errors (a leader
// moving, a timeout) the wait doubles from 20 ms up to markerMaxBackoff,
// about a leader election.
const (
	markerThrottledRetry = 20 * time.Millisecond
	markerMaxBackoff     = time.Second
)

func markerResult(commit bool) string {
	if commit {
		return "commit"
	}
	return "abort"
}

// writtenRecords sums the records of written.
func writtenRecords(written []*heraldpb.TxnWritten) uint32 {
	var n uint32
	for _, w := range written {
		n += w.GetRecords()
	}
	return n
}

// writtenPartitions lists the partitions of written, in order.
func writtenPartitions(written []*heraldpb.TxnWritten) []topicPart {
	out := make([]topicPart, 0, len(written))
	for _, w := range written {
		out = append(out, topicPart{w.GetTopic(), w.GetPartition()})
	}
	return out
}

// Pipelined commits. A producer writing transactions once may send the
// commit of its next transaction (epoch+1, +2, ...) while the one before
// is being decided: it is queued (txnMeta.piped) and decided as soon as
// the one before is committed, together with every other queued one, in
// one write to __txn (their ends in epoch order, then the session record
// after the last), so a producer's commits per second grow with the
// commits it keeps in flight rather than being one per synced write. A
// queued commit is decided only after the one before it committed: if
// that one ends otherwise (an abort, a timeout, a new session, a failed
// write), every queued one fails, so no transaction commits past one that
// did not.

// pipedEnd is a queued commit of epoch.
type pipedEnd struct {
	epoch   uint32
	written []*heraldpb.TxnWritten
	offsets []*heraldpb.TxnGroupOffsets
	waiters []endWaiter
}

// maxPiped bounds the commits of one transactional id queued behind the
// one being decided (client.MaxTxnCommitsInFlight must not exceed it).
const maxPiped = 64

// sessionEpochGap is how far a new session's epoch is past the current
// one: past the epochs the old session may commit on a partition alone
// (onePhaseEpochs, onephase.go), of its commits in flight (maxPiped) and
// of the transaction it writes behind them, so that none of its late
// requests carries the new session's epoch.
const sessionEpochGap = onePhaseEpochs + maxPiped + 2

// pipeEnd queues req, a commit of a transaction written once whose epoch
// is past m's current one, behind the commit being decided; it reports
// whether it took the request (false: the caller answers it as before).
func (c *Coordinator) pipeEnd(ctx actor.Context, m *txnMeta, req *heraldpb.EndTxnRequest, w endWaiter) bool {
	if !req.Commit || len(req.Written) == 0 || req.ProducerId != m.pid || req.ProducerEpoch < m.session {
		return false
	}
	for i := range m.piped {
		if m.piped[i].epoch == req.ProducerEpoch { // a retry (queued: even the current epoch's, waiting for room)
			m.piped[i].waiters = append(m.piped[i].waiters, w)
			return true
		}
	}
	if req.ProducerEpoch <= m.epoch {
		return false
	}
	switch n := len(m.piped); {
	case n > 0 && req.ProducerEpoch == m.piped[n-1].epoch+1: // after the last one queued
	case n == 0 && m.deciding && m.decidingCommit && req.ProducerEpoch == max(m.decidingThrough, m.epoch)+1: // after the ones being decided
	default:
		return false
	}
	if e := c.checkWritten(req.Written); e != nil {
		w.fail(ctx, e)
		return true
	}
	if len(m.piped) >= maxPiped {
		w.fail(ctx, throttledErr("too many commits of the transactional id queued"))
		return true
	}
	m.used = c.nowMs()
	m.piped = append(m.piped, pipedEnd{epoch: req.ProducerEpoch, written: req.Written, offsets: req.GroupOffsets, waiters: []endWaiter{w}})
	c.decidePiped(ctx, m)
	return true
}

// failPiped answers every queued commit of m with e.
func (c *Coordinator) failPiped(ctx actor.Context, m *txnMeta, e *heraldpb.Error) {
	for _, p := range m.piped {
		for _, w := range p.waiters {
			w.fail(ctx, e)
		}
	}
	m.piped = nil
}

// decidePiped decides the queued commits that follow m's last committed
// transaction, as many as roomToComplete leaves room for, in one write.
func (c *Coordinator) decidePiped(ctx actor.Context, m *txnMeta) {
	if len(m.piped) == 0 || m.deciding || c.initing[m.id] || m.seqs != m.nextSeq || len(m.waiters) > 0 || m.state != txnEmpty {
		return
	}
	if m.piped[0].epoch != m.epoch || !m.hasLast || !m.lastCommit || m.lastEpoch+1 != m.epoch {
		c.failPiped(ctx, m, heraldpb.NewError(heraldpb.ErrorCode_INVALID_TXN_STATE,
			"transactional id %q: the transaction before epoch %d did not commit (the current epoch is %d)", m.id, m.piped[0].epoch, m.epoch))
		return
	}
	n := min(len(m.piped), m.roomToComplete(true))
	if n <= 0 {
		return // (completeTxn calls again)
	}
	batch := m.piped[:n:n]
	m.piped = m.piped[n:]
	pid, first, last := m.pid, batch[0].epoch, batch[n-1].epoch
	ends := make([]*heraldpb.TxnEvent, n)
	events := make([][]byte, 0, n+1)
	for i, p := range batch {
		ends[i] = &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_End{End: &heraldpb.TxnEnd{TransactionalId: m.id, Epoch: p.epoch, Commit: true, By: "producer",
			Token: randomToken(), GroupOffsets: p.offsets, Written: p.written}}}
		events = append(events, event(ends[i]))
	}
	snap := m.snapshotEvent()
	in := snap.GetInit()
	in.Epoch = last + 1
	in.HasLast, in.LastEpoch, in.LastCommit, in.LastBy = true, last, true, "producer"
	events = append(events, event(snap))
	m.deciding, m.decidingCommit, m.decidingThrough = true, true, last
	c.write(writeOp{events: events, client: true, done: func(base int64, err *heraldpb.Error) {
		m.deciding = false
		if err == nil && m.epoch != first {
			err = m.endedMeanwhile(pid, first)
		}
		if err != nil {
			for _, p := range batch {
				for _, w := range p.waiters {
					w.fail(ctx, err)
				}
			}
			c.failPiped(ctx, m, heraldpb.NewError(heraldpb.ErrorCode_INVALID_TXN_STATE, "transactional id %q: a commit before this one failed: %s", m.id, err.Message))
			return
		}
		now := c.nowMs()
		for i, ev := range ends {
			c.applyTxn(uint64(base)+uint64(i), ev, now)
		}
		c.applyTxn(uint64(base)+uint64(n), snap, now)
		jobs := m.completing[len(m.completing)-n:]
		for i, j := range jobs {
			j.live = true
			recs, parts := j.records(), j.partitions()
			mTxnEnded.WithLabelValues("commit", "producer").Inc()
			mTxnCommitted.Add(float64(recs))
			r := &heraldpb.EndTxnResponse{NextEpoch: batch[i].epoch + 1, Records: recs}
			for _, tp := range parts {
				r.Partitions = append(r.Partitions, tp.String())
			}
			for _, w := range batch[i].waiters {
				w.answer(ctx, r)
			}
		}
		c.gaugeOpen()
		if len(m.completing) == n {
			c.appendTxn(ctx, m, m.completing[0], nil)
		} else {
			c.kickWritten(ctx, m) // (else appended when the ones before complete: completeTxn)
		}
		c.decidePiped(ctx, m)
	}})
	c.flushWrites(ctx)
}

// Transactions nobody ends. The coordinator learns a written-once
// transaction's partitions only from its EndTxn, so one whose producer
// died, whose id started a new session, or that outlived its timeout would
// stay open on its partitions (unread, but holding their log's front). So
// every OpenTxnSweep the coordinator asks each partition's leader for the
// transactions open there longer than a sweep period, and ends each:
//   - one being decided or committed (a pending commit, a queued one):
//     left to its markers;
//   - the id's current transaction: aborted once older than its timeout
//     (the producer's next request gets TXN_TIMED_OUT), then marked;
//   - the id's last transaction, committed in this session, on a partition
//     its commit did not list: committed there with the records found;
//   - anything else (an earlier epoch that did not commit, an older
//     session's, a producer the coordinator does not know): aborted, which
//     also refuses that epoch's later writes there (a zombie's).
// A transaction of an epoch past the id's current one (a producer writing
// its next transaction while the one before is decided) is left alone
// until older than its timeout.

type openSweep struct{}

func (c *Coordinator) armOpenSweep() {
	if !c.openSweeping {
		c.openSweeping = true
		c.after(c.o.OpenTxnSweep, &openSweep{})
	}
}

// sweepOpen asks every partition's leader for its open transactions.
func (c *Coordinator) sweepOpen(ctx actor.Context) {
	c.openSweeping = false
	defer c.armOpenSweep()
	if !c.loaded || !c.leadsTxn() {
		return
	}
	c.sweepPartitions(ctx, uint32(min(c.o.OpenTxnSweep.Milliseconds(), 1<<31)), 0, 0, nil)
}

// sweepProducer ends, at once, the transactions of producer pid open on
// any partition that nobody will end: a new session of its id started, so
// the old session's (a zombie's) are aborted, and their later writes
// refused, without waiting for the next sweep. Every partition's leader
// also refuses pid's batches of an epoch below fence from then on, on
// partitions the old session had not written to as well (zombie.go in
// the partition package).
//
// fenced runs once every partition's leader has answered (so holds the
// fence in its log), or after FenceWait and lease (the old session's
// time left to commit on a partition alone, onephase.go), whichever is
// first.
func (c *Coordinator) sweepProducer(ctx actor.Context, pid uint64, fence uint32, lease time.Duration, fenced func()) {
	if !c.leadsTxn() {
		fenced()
		return
	}
	done := false
	once := func() {
		if !done {
			done = true
			fenced()
		}
	}
	sending, early, left := true, 0, 0
	n := c.sweepPartitions(ctx, 0, pid, fence, func() {
		if sending {
			early++ // (answered while the others were being sent)
			return
		}
		if left--; left == 0 {
			once()
		}
	})
	sending, left = false, n-early
	if left <= 0 {
		once()
		return
	}
	c.after(max(c.o.FenceWait, lease), &retryStep{fn: once})
}

// sweepPartitions asks every partition's leader for the transactions open
// there for at least minAge ms (of producer pid only, when not 0) and
// resolves each; with pid, the leader fences pid's epochs below fence.
// It returns how many partitions it asked; answered (if not nil) runs as
// each answers.
func (c *Coordinator) sweepPartitions(ctx actor.Context, minAge uint32, pid uint64, fence uint32, answered func()) int {
	n := 0
	byPid := make(map[uint64]*txnMeta, len(c.txns)) // (checked again when an answer comes)
	for _, m := range c.txns {
		byPid[m.pid] = m
	}
	for _, e := range c.o.Topics.All() {
		if len(e.Name) >= 2 && e.Name[:2] == "__" {
			continue // internal topics take no transactions
		}
		for p := range e.Partitions {
			c.sweepPartition(ctx, topicPart{e.Name, uint32(p)}, minAge, pid, fence, byPid, 20*time.Millisecond, answered)
			n++
		}
	}
	return n
}

// sweepPartition is sweepPartitions' request to one partition's leader. A
// sweep that fences is asked again, with backoff, until the leader
// answers (it answers once the fence is in its log, so that a later
// leader knows it too), while this coordinator leads __txn and the topic
// is there; the periodic sweep is not (the next one comes anyway).
func (c *Coordinator) sweepPartition(ctx actor.Context, tp topicPart, minAge uint32, pid uint64, fence uint32, byPid map[uint64]*txnMeta, backoff time.Duration, answered func()) {
	e := c.o.Topics.Get(tp.topic)
	if e == nil || int(tp.part) >= len(e.Partitions) || !c.leadsTxn() {
		if answered != nil {
			answered() // (nobody to fence there, or no longer this coordinator's to do)
		}
		return
	}
	req := &heraldpb.Frame{Body: &heraldpb.Frame_ListOpenTxns{ListOpenTxns: &heraldpb.ListOpenTxnsRequest{Topic: tp.topic, Partition: tp.part, OlderThanMs: minAge,
		FenceProducerId: pid, FenceEpoch: fence}}}
	answer := func(f *heraldpb.Frame) {
		r := f.GetListOpenTxnsResponse()
		if r == nil && pid != 0 {
			c.log.Debug("fencing a replaced session's producer on a partition; retrying", "topic", tp.topic, "partition", tp.part, "producer", pid,
				"err", f.GetError().GetMessage(), "in", backoff)
			c.after(backoff, &retryStep{fn: func() {
				c.sweepPartition(ctx, tp, minAge, pid, fence, byPid, min(2*backoff, markerMaxBackoff), answered)
			}})
			return
		}
		if answered != nil {
			answered()
		}
		for _, o := range r.GetTxns() {
			if pid == 0 || o.ProducerId == pid {
				c.resolveOpen(ctx, tp, o, byPid[o.ProducerId])
			}
		}
	}
	if c.o.failSweep != nil && c.o.failSweep(req.GetListOpenTxns()) {
		answer(heraldpb.ErrorFrame(0, heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "failed by the test")))
		return
	}
	c.request(ctx, e.Writer(int(tp.part)), req, callTimeout, answer)
}

// resolveOpen ends (or leaves) one transaction found open on tp.
func (c *Coordinator) resolveOpen(ctx actor.Context, tp topicPart, o *heraldpb.OpenTxn, m *txnMeta) {
	if m != nil && (m.pid != o.ProducerId || c.txns[m.id] != m) {
		m = nil // (a new producer id, or forgotten, since the sweep began)
		for _, x := range c.txns {
			if x.pid == o.ProducerId {
				m = x
				break
			}
		}
	}
	age := time.Duration(o.AgeMs) * time.Millisecond
	w := []*heraldpb.TxnWritten{{Topic: tp.topic, Partition: tp.part, Records: o.Records}}
	abort := func(why string) {
		c.log.Warn("aborting a transaction written once that nobody ends", "topic", tp.topic, "partition", tp.part, "producer", o.ProducerId, "epoch", o.Epoch, "age", age, "why", why)
		mTxnOrphans.WithLabelValues("aborted").Inc()
		c.writeMarkers(ctx, o.ProducerId, o.Epoch, false, w, func() {})
	}
	if m == nil {
		if age > c.o.MaxTxnTimeout {
			abort("its producer id is not known")
		}
		return
	}
	pending := m.jumping || slices.ContainsFunc(m.completing, func(j *commitJob) bool { return j.epoch == o.Epoch }) ||
		slices.ContainsFunc(m.piped, func(p pipedEnd) bool { return p.epoch == o.Epoch }) ||
		(m.deciding && o.Epoch >= m.epoch && o.Epoch <= max(m.decidingThrough, m.epoch))
	switch {
	case pending:
	case o.Epoch == m.epoch:
		if age <= m.timeout || c.initing[m.id] {
			return
		}
		c.log.Warn("aborting a transaction open longer than its timeout", "transactional_id", m.id, "epoch", m.epoch, "timeout", m.timeout)
		c.abortTxn(ctx, m, "timeout", func(err *heraldpb.Error, _ uint32, _ []topicPart) {
			if err == nil {
				abort("open longer than its timeout")
			}
		})
	case o.Epoch > m.epoch:
		if age > m.timeout {
			abort("an epoch past its id's current one, open longer than its timeout")
		}
	case m.hasLast && m.lastCommit && m.lastEpoch == o.Epoch && o.Epoch >= m.session:
		c.log.Warn("committing a transaction's records on a partition its commit did not list", "transactional_id", m.id, "topic", tp.topic, "partition", tp.part, "epoch", o.Epoch, "records", o.Records)
		mTxnOrphans.WithLabelValues("committed").Inc()
		c.writeMarkers(ctx, o.ProducerId, o.Epoch, true, w, func() {})
	default:
		abort("its epoch ended without committing, or belongs to an older session")
	}
}

// kickWritten starts the markers of m's decided commits written once that
// follow a started one written once, in order: they need not wait for the
// ones before to complete (see appendTxn). Staged commits still start one
// after the other.
func (c *Coordinator) kickWritten(ctx actor.Context, m *txnMeta) {
	for i := 1; i < len(m.completing); i++ {
		prev, j := m.completing[i-1], m.completing[i]
		if j.started {
			continue
		}
		if !prev.started || len(prev.written) == 0 || len(j.written) == 0 || !j.live {
			return
		}
		c.appendTxn(ctx, m, j, nil) // (which kicks the ones after it)
		return
	}
}
