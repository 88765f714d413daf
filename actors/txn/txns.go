package txn

// Transactions across partitions (the Kafka model, staged): a
// transactional producer's records are staged in __txn, in its open
// transaction, and appended to their partitions only when it commits, so
// no consumer can ever read an uncommitted or aborted record. Each
// transactional id has one session at a time: InitProducerId starts a new
// one with a higher epoch, aborting what the last one left open, and every
// request of an older epoch is refused (PRODUCER_FENCED). The epoch also
// goes up at the end of every transaction, so a delayed or repeated
// request of an earlier transaction never touches a later one.

import (
	"bytes"
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
)

// txnState is where a transactional id's current transaction is.
type txnState uint8

const (
	txnEmpty txnState = iota // no transaction open
	txnOpen                  // records staged
)

func (s txnState) String() string {
	if s == txnOpen {
		return "open"
	}
	return "empty"
}

// staged is one batch staged in a transaction: its TxnData's offset in
// __txn and where it goes.
type staged struct {
	ref   uint64
	topic string
	part  uint32
	seq   int64
	count uint32
	size  uint32
	// data is the batch's records kept in memory (stagedCacheBytes in
	// all), so that the commit need not read them back from __txn; nil:
	// read back.
	data []byte
}

// stagedCacheBytes bounds the staged records the coordinator keeps in
// memory (herald_txn_staged_cache_bytes); the rest is read back from
// __txn when its transaction commits.
var stagedCacheBytes int64 = 64 << 20

// cache keeps a copy of records for b if the budget allows.
func (st *state) cache(b *staged, records []byte) {
	if st.cached+int64(len(records)) > stagedCacheBytes {
		return
	}
	b.data = bytes.Clone(records)
	st.cached += int64(len(b.data))
	mStagedCache.Set(float64(st.cached))
}

// release forgets the cached records of batches.
func (st *state) release(batches []staged) {
	for i := range batches {
		if batches[i].data != nil {
			st.cached -= int64(len(batches[i].data))
			batches[i].data = nil
		}
	}
	mStagedCache.Set(float64(st.cached))
}

type topicPart struct {
	topic string
	part  uint32
}

func (tp topicPart) String() string { return fmt.Sprintf("%s/%d", tp.topic, tp.part) }

// txnMeta is a transactional id's session and its current transaction.
type txnMeta struct {
	id      string
	pid     uint64
	session uint32 // the session's first epoch: older ones are fenced
	epoch   uint32 // the current transaction's epoch
	timeout time.Duration
	used    int64  // ms: last request
	lastOff uint64 // offset of the newest event about it in __txn
	// sessionWanted: when an InitProducerId of a new session was last
	// told to wait for a decision (zero: none). For a while after it the
	// current session's ends are refused as fenced, so that a producer
	// committing back to back (pipelined) cannot keep the new session out.
	sessionWanted time.Time

	state   txnState
	started int64 // ms: first staged batch (this coordinator's clock)
	staged  []staged
	// written: the partitions the transaction wrote its batches to once,
	// as its EndTxn listed them (markers.go); with the decision from then.
	written []*heraldpb.TxnWritten
	// piped: commits of the next transactions, queued behind the one
	// being decided (markers.go); decidingThrough: while a commit is being
	// decided, the last epoch it decides (several when queued ones are
	// decided together).
	piped           []pipedEnd
	decidingThrough uint32
	nextSeq         int64 // durable
	seqs            int64 // staged or being staged
	bytes           uint64

	// a commit decision or an abort being written (decidingCommit: which)
	deciding       bool
	decidingCommit bool
	sessOff        uint64 // offset of its newest session record (init, abort, complete)

	// the EndTxn requests waiting for the decision being written (or, with
	// queuedCommit, for completing to end first)
	waiters      []endWaiter
	queuedCommit bool
	// initWaiters: InitProducerId answers held until completing is empty
	// (a new session reads its progress only once the last commit's
	// records are on their partitions).
	initWaiters []endWaiter
	initAnswer  *heraldpb.InitProducerIdResponse
	// completing: committed transactions (decided) whose appends are under
	// way or waiting, oldest first, appended one after the other; at most
	// maxCompleting outside a replay. The current transaction (epoch) is
	// the next one, which may stage and be decided meanwhile.
	completing []*commitJob

	// Single-partition commits (onephase.go): when the session's lease to
	// commit so may end at the latest, and whether its epoch is being
	// moved past the ones it ended so.
	leaseUntil time.Time
	jumping    bool
	afterJump  []func() // EndTxns that came meanwhile, handled after it
	// onePhase: what the session said (known once it did, to this
	// coordinator; memory only).
	onePhase, onePhaseKnown bool

	// the last transaction ended
	hasLast    bool
	lastEpoch  uint32
	lastCommit bool
	lastBy     string
}

// commitJob is a committed transaction being appended: what its decision
// (TxnEnd, commit) recorded.
type commitJob struct {
	epoch   uint32
	staged  []staged
	token   uint64
	from    map[topicPart]int64
	by      string
	sessOff uint64 // the session record its replay needs (compaction keeps it)
	// offsets: consumer group offsets committed with it, applied once
	// its records are appended (offsetsDone), before TxnComplete.
	offsets     []*heraldpb.TxnGroupOffsets
	offsetsDone bool
	// written: the partitions that get its commit marker (markers.go).
	written []*heraldpb.TxnWritten
	// started: its appends or markers are under way (or done); the next
	// job of a transaction written once starts as soon as this one's
	// markers are taken, before its complete record is written.
	started bool
	// live: decided by this coordinator, so none of it is on its
	// partitions before its appends start (a job found at load is
	// scanned for first).
	live bool
}

// maxCompleting bounds the committed transactions of one transactional id
// waiting for their appends: a commit beyond it is decided once the
// oldest completes. Deciding while earlier commits append lets a producer
// run its next transactions without waiting for the appends; the bound
// keeps the staged records held in memory for them bounded.
const maxCompleting = 4

// maxCompletingWritten bounds them instead while every one of them was
// written once (markers.go): such a commit holds no records, only where
// its markers go, and a producer keeping commits in flight needs room.
const maxCompletingWritten = 64

// roomToComplete is how many more committed transactions m may have
// waiting for their appends or markers, the next one written once or not.
func (m *txnMeta) roomToComplete(writtenOnce bool) int {
	limit := maxCompletingWritten
	if !writtenOnce || slices.ContainsFunc(m.completing, func(j *commitJob) bool { return len(j.written) == 0 }) {
		limit = maxCompleting
	}
	return limit - len(m.completing)
}

func (j *commitJob) partitions() []topicPart {
	return append(stagedPartitions(j.staged), writtenPartitions(j.written)...)
}
func (j *commitJob) records() uint32 { return stagedRecords(j.staged) + writtenRecords(j.written) }

type endWaiter struct {
	to *actor.PID
	id uint64
	// prod: the request was a transactional produce with commit_txn,
	// answered as this ProduceResponse carrying the EndTxnResponse.
	prod *heraldpb.ProduceResponse
	// offsets: consumer group offsets the commit carries.
	offsets []*heraldpb.TxnGroupOffsets
}

// answer sends w the end's answer r (once).
func (w endWaiter) answer(ctx actor.Context, r *heraldpb.EndTxnResponse) {
	if w.prod != nil {
		w.prod.TxnEnd = r
		respond(ctx, w.to, &heraldpb.Frame{Id: w.id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: w.prod}})
		return
	}
	respond(ctx, w.to, &heraldpb.Frame{Id: w.id, Body: &heraldpb.Frame_EndTxnResponse{EndTxnResponse: r}})
}

// fail sends w the error e.
func (w endWaiter) fail(ctx actor.Context, e *heraldpb.Error) {
	respond(ctx, w.to, heraldpb.ErrorFrame(w.id, e))
}

// endResponse is EndTxn's answer for a transaction of recs records on
// parts, m's epoch now the next one.
func endResponse(m *txnMeta, already bool, recs uint32, parts []topicPart) *heraldpb.EndTxnResponse {
	r := &heraldpb.EndTxnResponse{NextEpoch: m.epoch, Records: recs, AlreadyEnded: already}
	for _, tp := range parts {
		r.Partitions = append(r.Partitions, tp.String())
	}
	return r
}

// Limits of one transaction.
const (
	maxTxnBatches = 65536
	maxTxnBytes   = 256 << 20
	// maxTxnIDs bounds the transactional ids the coordinator keeps.
	maxTxnIDs = 100_000
	// txnIDExpiry: an id idle this long, with no transaction open, is
	// forgotten at the next compaction (Kafka's transactional.id
	// expiration).
	txnIDExpiry = 7 * 24 * time.Hour
)

// applyTxn adds one transaction event, at offset off, to the state.
func (st *state) applyTxn(off uint64, ev *heraldpb.TxnEvent, now int64) {
	switch e := ev.Event.(type) {
	case *heraldpb.TxnEvent_Init:
		in := e.Init
		m := st.txns[in.TransactionalId]
		if m == nil {
			m = &txnMeta{id: in.TransactionalId}
			st.txns[in.TransactionalId] = m
		}
		// (A session epoch of 0 is the first session's, not "unset": a
		// snapshot of it after an end has epoch 1 or more.)
		m.pid, m.epoch, m.session = in.ProducerId, in.Epoch, min(in.SessionEpoch, in.Epoch)
		if in.HasLast {
			m.hasLast, m.lastEpoch, m.lastCommit, m.lastBy = true, in.LastEpoch, in.LastCommit, in.LastBy
		}
		m.timeout = time.Duration(in.TimeoutMs) * time.Millisecond
		m.used = max(in.UsedMs, m.used)
		st.release(m.staged)
		m.resetTxn()
		m.lastOff, m.sessOff = off, off
	case *heraldpb.TxnEvent_Data:
		d := e.Data
		m := st.txns[d.TransactionalId]
		if m == nil || d.Epoch != m.epoch || d.BaseSequence != m.nextSeq {
			return // of a transaction that ended (or of an unknown id), or out of sequence: ignored
		}
		if m.state == txnEmpty {
			m.state, m.started = txnOpen, now
		}
		m.staged = append(m.staged, staged{ref: off, topic: d.Topic, part: d.Partition, seq: d.BaseSequence, count: d.Count, size: uint32(len(d.Records))})
		st.cache(&m.staged[len(m.staged)-1], d.Records)
		m.nextSeq = d.BaseSequence + int64(d.Count)
		m.seqs = max(m.seqs, m.nextSeq)
		m.bytes += uint64(len(d.Records))
		m.lastOff = off
	case *heraldpb.TxnEvent_End:
		en := e.End
		m := st.txns[en.TransactionalId]
		if m == nil || en.Epoch != m.epoch {
			return // the first decision counts: the epoch has moved on
		}
		m.lastOff = off
		if en.Commit {
			// Decided: the transaction is complete as far as its producer
			// is concerned (the epoch moves on, the next one may stage),
			// and its appends go on as a job until TxnComplete.
			j := &commitJob{epoch: m.epoch, staged: m.staged, token: en.Token, by: en.By, sessOff: m.sessOff, from: map[topicPart]int64{}, offsets: en.GroupOffsets,
				written: en.Written}
			for _, f := range en.From {
				j.from[topicPart{f.Topic, f.Partition}] = f.Offset
			}
			m.completing = append(m.completing, j)
		} else {
			st.release(m.staged)
		}
		// The session record stays the Init before it: an End cannot make
		// the id known again on a replay (the coordinator writes a
		// snapshot Init with each end, which becomes the session record).
		m.ended(en.Commit, en.By)
	case *heraldpb.TxnEvent_Complete:
		m := st.txns[e.Complete.TransactionalId]
		if m == nil {
			return
		}
		m.completing = slices.DeleteFunc(m.completing, func(j *commitJob) bool {
			if j.epoch == e.Complete.Epoch {
				st.release(j.staged)
				return true
			}
			return false
		})
		m.lastOff = off
	}
}

// ended closes the current transaction and moves to the next epoch.
func (m *txnMeta) ended(commit bool, by string) {
	m.hasLast, m.lastEpoch, m.lastCommit, m.lastBy = true, m.epoch, commit, by
	m.epoch++
	m.resetTxn()
}

func (m *txnMeta) resetTxn() {
	m.state, m.staged, m.nextSeq, m.seqs, m.bytes, m.started, m.written = txnEmpty, nil, 0, 0, 0, 0, nil
}

// partitions lists the partitions m's transaction touches, in order.
func (m *txnMeta) partitions() []topicPart { return stagedPartitions(m.staged) }

func (m *txnMeta) records() uint32 { return stagedRecords(m.staged) }

// stagedPartitions lists the partitions of batches, in order.
func stagedPartitions(batches []staged) []topicPart {
	var out []topicPart
	seen := map[topicPart]bool{}
	for _, s := range batches {
		tp := topicPart{s.topic, s.part}
		if !seen[tp] {
			seen[tp] = true
			out = append(out, tp)
		}
	}
	slices.SortFunc(out, func(a, b topicPart) int { return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.part, b.part)) })
	return out
}

func stagedRecords(batches []staged) uint32 {
	n := uint32(0)
	for _, s := range batches {
		n += s.count
	}
	return n
}

// infos describes m's transactions: each committed one still appending
// (state "committing"), then the current one ("open"), or only "empty"
// when there is neither.
func (m *txnMeta) infos() []*heraldpb.TxnInfo {
	var out []*heraldpb.TxnInfo
	for _, j := range m.completing {
		ti := &heraldpb.TxnInfo{TransactionalId: m.id, ProducerId: m.pid, ProducerEpoch: j.epoch, State: "committing",
			Records: j.records(), TimeoutMs: uint32(m.timeout.Milliseconds())}
		for _, s := range j.staged {
			ti.Bytes += uint64(s.size)
		}
		for _, tp := range j.partitions() {
			ti.Partitions = append(ti.Partitions, tp.String())
		}
		out = append(out, ti)
	}
	if m.state == txnEmpty && len(out) > 0 {
		return out
	}
	ti := &heraldpb.TxnInfo{TransactionalId: m.id, ProducerId: m.pid, ProducerEpoch: m.epoch, State: m.state.String(),
		StartedMs: m.started, Records: m.records(), Bytes: m.bytes, TimeoutMs: uint32(m.timeout.Milliseconds())}
	for _, tp := range m.partitions() {
		ti.Partitions = append(ti.Partitions, tp.String())
	}
	return append(out, ti)
}

// busy reports whether m has a transaction open, being decided or still
// appending.
func (m *txnMeta) busy() bool { return m.state != txnEmpty || m.deciding || len(m.completing) > 0 }

// checkEpoch checks a request's producer id and epoch against m's
// session and current transaction. ended reports a request of the
// transaction that just ended (the caller decides what that means).
func (m *txnMeta) checkEpoch(pid uint64, epoch uint32) (e *heraldpb.Error, ended bool) {
	switch {
	case pid != m.pid || epoch < m.session:
		return heraldpb.NewError(heraldpb.ErrorCode_PRODUCER_FENCED,
			"transactional id %q: producer %d epoch %d is fenced by a newer session (producer %d, epoch %d)", m.id, pid, epoch, m.pid, m.session), false
	case epoch > m.epoch:
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_TXN_STATE,
			"transactional id %q: epoch %d is ahead of the coordinator's %d", m.id, epoch, m.epoch), false
	case epoch < m.epoch:
		if m.hasLast && m.lastEpoch == epoch {
			if m.lastBy == "timeout" {
				return heraldpb.NewError(heraldpb.ErrorCode_TXN_TIMED_OUT,
					"transactional id %q: the transaction of epoch %d was aborted after its timeout of %v", m.id, epoch, m.timeout), true
			}
			return nil, true
		}
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_TXN_STATE,
			"transactional id %q: the transaction of epoch %d ended; the current epoch is %d", m.id, epoch, m.epoch), false
	}
	return nil, false
}

// endedMeanwhile is the answer to a request of producer pid's
// transaction of epoch whose write completed after that transaction
// ended: PRODUCER_FENCED when a new session started meanwhile (an Init
// queued ahead of it), INVALID_TXN_STATE when the transaction ended
// otherwise (a timeout, a manual abort).
func (m *txnMeta) endedMeanwhile(pid uint64, epoch uint32) *heraldpb.Error {
	if pid != m.pid || epoch < m.session {
		mTxnFenced.Inc()
		return heraldpb.NewError(heraldpb.ErrorCode_PRODUCER_FENCED,
			"transactional id %q: producer %d epoch %d was fenced by a new session (producer %d, epoch %d) while its request was written", m.id, pid, epoch, m.pid, m.session)
	}
	if m.hasLast && m.lastEpoch == epoch && m.lastBy == "timeout" {
		return heraldpb.NewError(heraldpb.ErrorCode_TXN_TIMED_OUT,
			"transactional id %q: the transaction of epoch %d was aborted after its timeout of %v", m.id, epoch, m.timeout)
	}
	return heraldpb.NewError(heraldpb.ErrorCode_INVALID_TXN_STATE, "transactional id %q: the transaction of epoch %d ended meanwhile", m.id, epoch)
}

// ---- requests ----------------------------------------------------------

// txnTimeout resolves a requested transaction timeout.
func (c *Coordinator) txnTimeout(ms uint32) (time.Duration, *heraldpb.Error) {
	d := time.Duration(ms) * time.Millisecond
	if d == 0 {
		d = c.o.TxnTimeout
	}
	if d > c.o.MaxTxnTimeout {
		return 0, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "transaction_timeout_ms %d is above the broker's maximum %v", ms, c.o.MaxTxnTimeout)
	}
	return d, nil
}

func validTxnID(id string) *heraldpb.Error {
	if id == "" || len(id) > 255 {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "transactional_id must be 1 to 255 bytes, not %d", len(id))
	}
	return nil
}

// onInit starts a new session of a transactional id.
func (c *Coordinator) onInit(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.InitProducerIdRequest, to *actor.PID) {
	if e := validTxnID(req.TransactionalId); e != nil {
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, e))
		return
	}
	timeout, e := c.txnTimeout(req.TransactionTimeoutMs)
	if e != nil {
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, e))
		return
	}
	m := c.txns[req.TransactionalId]
	switch {
	case m == nil && len(c.txns) >= maxTxnIDs:
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, throttledErr("too many transactional ids")))
		return
	case m != nil && m.jumping:
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, throttledErr(fmt.Sprintf("transactional id %q: the last session's epoch is being written", req.TransactionalId))))
		return
	case m != nil && m.deciding && !m.queuedCommit:
		// Once this decision is written the new session goes first: the
		// commits queued behind it are fenced now, and the ones sent
		// meanwhile too (newSessionWaits).
		m.sessionWanted = time.Now()
		c.failPiped(ctx, m, heraldpb.NewError(heraldpb.ErrorCode_PRODUCER_FENCED, "transactional id %q: a new session is starting", m.id))
		e := throttledErr(fmt.Sprintf("transactional id %q: the last session's transaction is being ended", req.TransactionalId))
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, e))
		return
	case c.initing[req.TransactionalId]:
		e := throttledErr(fmt.Sprintf("transactional id %q: another session is starting", req.TransactionalId))
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, e))
		return
	case c.queued >= c.o.MaxQueued:
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, throttledErr("too many requests waiting for __txn")))
		return
	}
	var events []*heraldpb.TxnEvent
	pid, epoch := randomToken()>>1, uint32(0)
	if m != nil && m.queuedCommit {
		// A commit of the old session waits behind an append: it is
		// fenced with the rest of that session (its transaction aborted
		// below), so that a zombie committing back to back cannot keep a
		// new session out.
		m.queuedCommit, m.deciding = false, false
		c.answerWaiters(ctx, m, heraldpb.NewError(heraldpb.ErrorCode_PRODUCER_FENCED, "transactional id %q: a new session started while this commit waited", m.id))
	}
	if m != nil {
		c.failPiped(ctx, m, heraldpb.NewError(heraldpb.ErrorCode_PRODUCER_FENCED, "transactional id %q: a new session started while this commit was queued", m.id))
	}
	if m != nil {
		pid, epoch = m.pid, m.epoch
		if m.state == txnOpen {
			// The last session's transaction: aborted, and fenced.
			events = append(events, &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_End{End: &heraldpb.TxnEnd{
				TransactionalId: m.id, Epoch: m.epoch, By: "fenced"}}})
			epoch++
		}
		// The new session's, past every epoch the old session may be
		// using: with commits in flight (pipelined, markers.go) a producer
		// writes and commits transactions of epochs up to maxPiped past
		// the current one before it hears of them, and one of those must
		// never pass for the new session's. Every request of the old one
		// is fenced.
		epoch += sessionEpochGap
		if epoch >= 1<<31 {
			pid, epoch = randomToken()>>1, 0 // a new producer id rather than an epoch that wraps
		}
	}
	init := &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Init{Init: &heraldpb.TxnInit{
		TransactionalId: req.TransactionalId, ProducerId: pid, Epoch: epoch, SessionEpoch: epoch,
		TimeoutMs: uint32(timeout.Milliseconds()), UsedMs: c.nowMs(),
	}}}
	events = append(events, init)
	raw := make([][]byte, len(events))
	for i, ev := range events {
		raw[i] = event(ev)
	}
	if c.initing == nil {
		c.initing = map[string]bool{}
	}
	c.initing[req.TransactionalId] = true
	var oldPid uint64 // the previous session's producer (its transactions written once are swept)
	var oldLease time.Duration
	if m != nil {
		oldPid, oldLease = m.pid, c.leaseLeft(m)
	}
	c.write(writeOp{events: raw, client: true, done: func(base int64, err *heraldpb.Error) {
		delete(c.initing, req.TransactionalId)
		if err != nil {
			respond(ctx, to, heraldpb.ErrorFrame(f.Id, err))
			return
		}
		if m != nil {
			m.sessionWanted = time.Time{}
		}
		for i, ev := range events {
			if ev.GetEnd() != nil {
				mTxnEnded.WithLabelValues("abort", "fenced").Inc()
			}
			c.applyTxn(uint64(base)+uint64(i), ev, c.nowMs())
		}
		mTxnIDs.Set(float64(len(c.txns)))
		c.gaugeOpen()
		res := &heraldpb.InitProducerIdResponse{ProducerId: pid, ProducerEpoch: epoch}
		if req.OnePhase {
			granted, _ := c.lease()
			res.OnePhaseEpochs, res.OnePhaseLeaseMs = onePhaseEpochs, uint32(granted.Milliseconds())
		}
		if m := c.txns[req.TransactionalId]; m != nil {
			c.renewLease(m) // (the new session's)
			m.onePhase, m.onePhaseKnown = req.OnePhase, true
		}
		answer := func() {
			if m := c.txns[req.TransactionalId]; m != nil && len(m.completing) > 0 {
				// The old session's last commit is still appending: the
				// answer waits for it (completeTxn).
				m.initWaiters = append(m.initWaiters, endWaiter{to: to, id: f.Id})
				m.initAnswer = res
				return
			}
			respond(ctx, to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_InitProducerIdResponse{InitProducerIdResponse: res}})
		}
		if oldPid == 0 {
			answer()
			return
		}
		fence := uint32(math.MaxUint32) // a new producer id: every epoch of the old one
		if oldPid == pid {
			fence = epoch
		}
		// Answered once every partition holds the fence (or after
		// fenceWait): from then on the old session's batches written once
		// are refused everywhere, as its staged writes are here.
		c.sweepProducer(ctx, oldPid, fence, oldLease, answer)
	}})
	c.flushWrites(ctx)
}

// onTxnProduce stages a transactional produce.
func (c *Coordinator) onTxnProduce(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.ProduceRequest, to *actor.PID) {
	fail := func(e *heraldpb.Error) { respond(ctx, to, heraldpb.ErrorFrame(f.Id, e)) }
	invalid := func(format string, args ...any) {
		fail(heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, format, args...))
	}
	switch {
	case req.Half != nil, req.DelayMs != 0, req.DeliverAtMs != 0:
		invalid("a transactional produce cannot be a half or a delayed message")
		return
	case req.Acks != heraldpb.Acks_ACKS_ALL:
		invalid("a transactional produce needs acks=all")
		return
	case req.BaseSequence < 0:
		invalid("base_sequence %d is negative", req.BaseSequence)
		return
	case len(req.TxnGroupOffsets) > 0 && !req.CommitTxn:
		invalid("group offsets go with commit_txn only")
		return
	}
	offs := req.TxnGroupOffsets
	if e := c.checkOffsets(offs); e != nil {
		fail(e)
		return
	}
	m := c.txns[req.TransactionalId]
	if m == nil {
		fail(heraldpb.NewError(heraldpb.ErrorCode_INVALID_TXN_STATE, "transactional id %q has no session: call InitProducerId first", req.TransactionalId))
		return
	}
	if e, ended := m.checkEpoch(req.ProducerId, req.ProducerEpoch); e != nil || ended {
		if e.GetCode() == heraldpb.ErrorCode_PRODUCER_FENCED {
			mTxnFenced.Inc()
		}
		if e == nil && req.CommitTxn && m.lastCommit {
			// A retry of a commit_txn produce whose commit was decided
			// (the answer was lost): answered again, as EndTxn is.
			info, _ := heraldpb.ScanBatch(req.Records)
			w := endWaiter{to: to, id: f.Id, offsets: offs, prod: &heraldpb.ProduceResponse{BaseOffset: -1, Count: uint32(info.Count), Duplicate: true}}
			w.answer(ctx, endResponse(m, true, 0, nil))
			return
		}
		if e == nil {
			e = heraldpb.NewError(heraldpb.ErrorCode_INVALID_TXN_STATE, "transactional id %q: the transaction of epoch %d has ended", m.id, req.ProducerEpoch)
		}
		fail(e)
		return
	}
	if newSessionWaits(m) {
		mTxnFenced.Inc()
		fail(heraldpb.NewError(heraldpb.ErrorCode_PRODUCER_FENCED, "transactional id %q: a new session is starting", m.id))
		return
	}
	part, n, e := c.routeBatch(req, c.o.Topics.Get(req.Topic), txnTagBytes, "transactional batch")
	if e != nil {
		fail(e)
		return
	}
	if req.CommitTxn && c.initing[m.id] {
		// (A decision written behind a new session's Init would bring
		// the old session back on a replay.)
		fail(throttledErr("a new session of the transactional id is starting"))
		return
	}
	// Sequences: a retry of a staged batch is answered again; a batch
	// still being staged is waited for by the client's retry, and so is
	// the next one (one staging in flight, so that a failed one cannot
	// leave a gap behind a later one).
	switch {
	case m.deciding && req.CommitTxn && m.decidingCommit && req.BaseSequence < m.seqs:
		// A retry of the commit_txn produce being decided: answered with it.
		c.endTxn(ctx, m, true, endWaiter{to: to, id: f.Id, offsets: offs, prod: &heraldpb.ProduceResponse{Partition: part, BaseOffset: -1, Count: uint32(n), Duplicate: true}})
		return
	case m.deciding:
		fail(heraldpb.NewError(heraldpb.ErrorCode_INVALID_TXN_STATE, "transactional id %q: the transaction of epoch %d is being ended", m.id, m.epoch))
		return
	case req.BaseSequence >= m.nextSeq && m.seqs != m.nextSeq:
		fail(throttledErr("a batch of the transaction is being staged"))
		return
	case req.BaseSequence < m.nextSeq:
		for _, s := range m.staged {
			if s.seq == req.BaseSequence && s.count == uint32(n) {
				pr := &heraldpb.ProduceResponse{Partition: s.part, BaseOffset: -1, Count: s.count, Duplicate: true}
				if req.CommitTxn {
					c.endTxn(ctx, m, true, endWaiter{to: to, id: f.Id, offsets: offs, prod: pr})
					return
				}
				respond(ctx, to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: pr}})
				return
			}
		}
		fail(heraldpb.NewError(heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE, "transactional id %q: sequence %d overlaps the staged records (next %d)", m.id, req.BaseSequence, m.nextSeq))
		return
	case req.BaseSequence < m.seqs:
		fail(throttledErr("the batch is being staged"))
		return
	case req.BaseSequence > m.seqs:
		fail(heraldpb.NewError(heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE, "transactional id %q: sequence %d, expected %d", m.id, req.BaseSequence, m.seqs))
		return
	case len(m.staged) >= maxTxnBatches || m.bytes+uint64(len(req.Records)) > maxTxnBytes:
		fail(heraldpb.NewError(heraldpb.ErrorCode_INVALID_TXN_STATE, "transactional id %q: the transaction holds %d batches and %d bytes, at its limit (%d batches, %d bytes)",
			m.id, len(m.staged), m.bytes, maxTxnBatches, maxTxnBytes))
		return
	case c.queued >= c.o.MaxQueued:
		fail(throttledErr("too many requests waiting for __txn"))
		return
	}
	ev := &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Data{Data: &heraldpb.TxnData{
		TransactionalId: m.id, Epoch: m.epoch, Topic: req.Topic, Partition: part, BaseSequence: req.BaseSequence, Count: uint32(n), Records: req.Records,
	}}}
	staged := &heraldpb.ProduceResponse{Partition: part, BaseOffset: -1, Count: uint32(n)}
	if req.CommitTxn && c.decidesNow(m) {
		// The batch and the commit decision in one write.
		m.used = c.nowMs()
		m.waiters = append(m.waiters, endWaiter{to: to, id: f.Id, offsets: offs, prod: staged})
		c.commitTxn(ctx, m, "producer", ev)
		return
	}
	m.seqs = req.BaseSequence + int64(n)
	epoch := m.epoch
	c.write(writeOp{events: [][]byte{event(ev)}, client: true, done: func(base int64, err *heraldpb.Error) {
		if err != nil {
			if m.epoch == epoch {
				m.seqs = m.nextSeq // not staged: the retry stages it
			}
			fail(err)
			return
		}
		c.applyTxn(uint64(base), ev, c.nowMs())
		m.used = c.nowMs()
		if m.epoch != epoch || m.nextSeq != req.BaseSequence+int64(n) {
			// The transaction ended while this was written: not staged.
			fail(m.endedMeanwhile(req.ProducerId, epoch))
			return
		}
		c.armTxnTimeouts()
		c.gaugeOpen()
		mTxnStaged.Add(float64(n))
		staged.AppendTimeMs = c.nowMs()
		if req.CommitTxn {
			// Staged behind another write of the transaction: now the
			// commit, as EndTxn.
			c.endTxn(ctx, m, true, endWaiter{to: to, id: f.Id, offsets: offs, prod: staged})
			return
		}
		respond(ctx, to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: staged}})
	}})
	c.flushWrites(ctx)
}

// txnTagBytes bounds the headers a committed transaction's records get
// (herald-txn-id with an id of up to 255 bytes, herald-txn-ref and
// herald-txn-token with their values).
const txnTagBytes = 384

// onEndTxn commits or aborts a transaction.
// sessionWait is how long the ends of a session are refused after an
// InitProducerId of a new one was told to wait (its client retries within
// a fraction of it).
const sessionWait = 5 * time.Second

// newSessionWaits reports whether a new session of m's id waits for the
// decision being written, so that m's current session may end nothing
// more.
func newSessionWaits(m *txnMeta) bool {
	return !m.sessionWanted.IsZero() && time.Since(m.sessionWanted) < sessionWait
}

func (c *Coordinator) onEndTxn(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.EndTxnRequest, to *actor.PID) {
	w := endWaiter{to: to, id: f.Id, offsets: req.GroupOffsets}
	if len(req.GroupOffsets) > 0 {
		e := c.checkOffsets(req.GroupOffsets)
		if e == nil && (!req.Commit || req.Manual) {
			e = heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "group offsets go with a producer's commit only")
		}
		if e != nil {
			w.fail(ctx, e)
			return
		}
	}
	m := c.txns[req.TransactionalId]
	if m == nil {
		w.fail(ctx, heraldpb.NewError(heraldpb.ErrorCode_TXN_NOT_FOUND, "transactional id %q is not known", req.TransactionalId))
		return
	}
	if m.jumping {
		// Behind the session's EndTxn that moves its epoch (onephase.go):
		// handled in order once it is written.
		if len(m.afterJump) >= maxPiped {
			w.fail(ctx, throttledErr("too many ends of the transactional id queued"))
			return
		}
		m.afterJump = append(m.afterJump, func() { c.onEndTxn(ctx, f, req, to) })
		return
	}
	if req.Manual {
		switch m.state {
		case txnEmpty:
			c.abortWrittenOpen(ctx, m, w)
		default:
			c.abortTxn(ctx, m, "manual", w.abortDone(ctx, m))
		}
		return
	}
	if newSessionWaits(m) {
		mTxnFenced.Inc()
		w.fail(ctx, heraldpb.NewError(heraldpb.ErrorCode_PRODUCER_FENCED, "transactional id %q: a new session is starting", m.id))
		return
	}
	if req.ProducerId == m.pid && req.ProducerEpoch >= m.session {
		c.renewLease(m)
	}
	if req.OnePhaseFrom != nil && c.jumpOnePhase(ctx, m, f, req, to, w) {
		return
	}
	if c.pipeEnd(ctx, m, req, w) {
		return
	}
	e, ended := m.checkEpoch(req.ProducerId, req.ProducerEpoch)
	switch {
	case e != nil:
		if e.Code == heraldpb.ErrorCode_PRODUCER_FENCED {
			mTxnFenced.Inc()
		}
		w.fail(ctx, e)
		return
	case ended:
		if m.lastCommit != req.Commit {
			w.fail(ctx, heraldpb.NewError(heraldpb.ErrorCode_INVALID_TXN_STATE, "transactional id %q: the transaction of epoch %d was already %s", m.id, req.ProducerEpoch, map[bool]string{true: "committed", false: "aborted"}[m.lastCommit]))
			return
		}
		w.answer(ctx, endResponse(m, true, 0, nil))
		return
	}
	if len(req.Written) > 0 {
		if e := c.checkWritten(req.Written); e != nil {
			w.fail(ctx, e)
			return
		}
		if len(m.staged) > 0 || m.seqs > 0 {
			w.fail(ctx, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "transactional id %q: a transaction stages its records or writes them once, not both", m.id))
			return
		}
		if !m.deciding {
			m.written = req.Written
		}
	}
	c.endTxn(ctx, m, req.Commit, w)
}

// abortDone answers w once an abort is durable.
// abortWrittenOpen aborts by hand m's current transaction written once,
// found open on its partitions (none staged): the abort decision lists
// them, and its markers drop their records.
func (c *Coordinator) abortWrittenOpen(ctx actor.Context, m *txnMeta, w endWaiter) {
	c.listWrittenOpen(ctx, func(open map[uint64][]openOn) {
		if c.txns[m.id] != m {
			w.fail(ctx, heraldpb.NewError(heraldpb.ErrorCode_TXN_NOT_FOUND, "transactional id %q is not known", m.id))
			return
		}
		var written []*heraldpb.TxnWritten
		ahead := map[uint32][]*heraldpb.TxnWritten{} // (a session committing alone: onephase.go)
		for _, ti := range m.writtenOpen(open[m.pid], time.Now()) {
			e := ti.ProducerEpoch
			if e != m.epoch && (len(m.piped) > 0 || m.deciding || e < m.epoch || e-m.epoch > onePhaseEpochs+maxPiped) {
				continue // (a transaction after the current one: ended with it, see decidePiped)
			}
			for _, o := range open[m.pid] {
				if o.epoch != e {
					continue
				}
				tw := &heraldpb.TxnWritten{Topic: o.tp.topic, Partition: o.tp.part, Records: o.records}
				if e == m.epoch {
					written = append(written, tw)
				} else {
					ahead[e] = append(ahead[e], tw)
				}
			}
		}
		if len(written) == 0 && len(ahead) > 0 && m.state == txnEmpty {
			// Transactions past the coordinator's epoch, which their
			// partitions would commit alone: their abort markers end them
			// there (the producer's commit is then refused).
			left := len(ahead)
			res := &heraldpb.EndTxnResponse{NextEpoch: m.epoch}
			for e, tws := range ahead {
				for _, tw := range tws {
					res.Records += tw.Records
					res.Partitions = append(res.Partitions, topicPart{tw.Topic, tw.Partition}.String())
				}
				c.log.Warn("aborting by hand a transaction its partition would commit alone", "transactional_id", m.id, "epoch", e)
				mTxnEnded.WithLabelValues("abort", "manual").Inc()
				c.writeMarkers(ctx, m.pid, e, false, tws, func() {
					if left--; left == 0 {
						slices.Sort(res.Partitions)
						w.answer(ctx, res)
					}
				})
			}
			return
		}
		switch {
		case len(written) == 0 || m.state != txnEmpty:
			w.fail(ctx, heraldpb.NewError(heraldpb.ErrorCode_TXN_NOT_FOUND, "transactional id %q has no transaction open", m.id))
			return
		case m.deciding || len(m.written) > 0 || c.initing[m.id]:
			w.fail(ctx, throttledErr("the transaction is being ended"))
			return
		}
		m.written = written
		c.abortTxn(ctx, m, "manual", w.abortDone(ctx, m))
	})
}

func (w endWaiter) abortDone(ctx actor.Context, m *txnMeta) func(*heraldpb.Error, uint32, []topicPart) {
	return func(err *heraldpb.Error, recs uint32, parts []topicPart) {
		if err != nil {
			w.fail(ctx, err)
			return
		}
		w.answer(ctx, endResponse(m, false, recs, parts))
	}
}

// decidesNow reports whether a commit of m's transaction can be decided
// at once: nothing of it is being staged or ended, no new session of its
// id is starting (a decision written behind that Init would bring the old
// session back on a replay), and its earlier commits leave room
// (maxCompleting).
func (c *Coordinator) decidesNow(m *txnMeta) bool {
	return !m.deciding && m.seqs == m.nextSeq && !c.initing[m.id] && m.roomToComplete(len(m.written) > 0) > 0 && len(m.waiters) == 0
}

// endTxn commits or aborts m's current transaction (its epoch checked)
// and answers w when that is durable.
func (c *Coordinator) endTxn(ctx actor.Context, m *txnMeta, commit bool, w endWaiter) {
	m.used = c.nowMs()
	switch {
	case len(m.waiters) >= 16:
		w.fail(ctx, throttledErr("too many requests waiting for the transaction's commit"))
	case c.initing[m.id]:
		w.fail(ctx, throttledErr("a new session of the transactional id is starting"))
	case m.deciding && !(commit && m.decidingCommit):
		w.fail(ctx, throttledErr("the transaction is being ended"))
	case m.deciding:
		m.waiters = append(m.waiters, w)
	case m.seqs != m.nextSeq:
		w.fail(ctx, throttledErr("a batch of the transaction is still being staged"))
	case !commit:
		c.abortTxn(ctx, m, "producer", w.abortDone(ctx, m))
	case m.roomToComplete(len(m.written) > 0) <= 0:
		// Earlier commits are still appending, as many as may wait: this
		// one is decided when the oldest completes. Nothing stages
		// meanwhile. (Below the bound it is decided now and appended
		// after them, so the records of one producer keep their order
		// on every partition.)
		m.waiters = append(m.waiters, w)
		m.deciding, m.decidingCommit, m.queuedCommit = true, true, true
	default:
		m.waiters = append(m.waiters, w)
		c.commitTxn(ctx, m, "producer", nil)
	}
}

// abortTxn aborts m's transaction (or, with nothing staged, just ends
// it): once durable, its staged records are forgotten and the epoch moves
// on.
func (c *Coordinator) abortTxn(ctx actor.Context, m *txnMeta, by string, done func(*heraldpb.Error, uint32, []topicPart)) {
	pid, epoch, recs, parts := m.pid, m.epoch, m.records()+writtenRecords(m.written), append(m.partitions(), writtenPartitions(m.written)...)
	written := m.written
	if m.deciding || c.initing[m.id] {
		// (Behind a new session's Init, the abort's session record would
		// bring the old session back on a replay; the Init aborts it.)
		if done != nil {
			done(throttledErr("the transaction is being ended"), recs, parts)
		}
		return
	}
	m.deciding, m.decidingCommit = true, false
	ev := &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_End{End: &heraldpb.TxnEnd{TransactionalId: m.id, Epoch: epoch, By: by, Written: written}}}
	snap := m.sessionAfterEnd(false, by)
	c.write(writeOp{events: [][]byte{event(ev), event(snap)}, client: done != nil, done: func(base int64, err *heraldpb.Error) {
		m.deciding = false
		if err == nil {
			if m.epoch != epoch {
				err = m.endedMeanwhile(pid, epoch)
			} else {
				c.applyTxn(uint64(base), ev, c.nowMs())
				c.applyTxn(uint64(base)+1, snap, c.nowMs())
				mTxnEnded.WithLabelValues("abort", by).Inc()
				c.gaugeOpen()
				c.decidePiped(ctx, m) // (fails them: the one before did not commit)
				// The batches written once are dropped by the abort's
				// markers (answered now: nothing of it is readable either
				// way).
				c.writeMarkers(ctx, pid, epoch, false, written, func() {})
			}
		}
		if done != nil {
			done(err, recs, parts)
		}
	}})
	c.flushWrites(ctx)
}

// gaugeOpen sets the open-transactions gauge.
func (c *Coordinator) gaugeOpen() {
	n := 0
	committing := 0
	for _, m := range c.txns {
		if m.state != txnEmpty || len(m.completing) > 0 {
			n++
		}
		committing += len(m.completing)
	}
	mTxnOpen.Set(float64(n))
	mTxnCommitting.Set(float64(committing))
}

// armTxnTimeouts arms the timeout sweep while transactions are open.
func (c *Coordinator) armTxnTimeouts() {
	if !c.txnSweepArmed {
		c.txnSweepArmed = true
		c.after(c.o.TxnSweep, &txnSweep{})
	}
}

// sweepTxns aborts the transactions open longer than their timeout.
func (c *Coordinator) sweepTxns(ctx actor.Context) {
	c.txnSweepArmed = false
	now := c.nowMs()
	open := false
	for _, m := range c.txns {
		if m.state != txnOpen || m.deciding {
			open = open || m.state != txnEmpty
			continue
		}
		open = true
		if now-m.started > m.timeout.Milliseconds() {
			c.log.Warn("aborting a transaction open longer than its timeout", "transactional_id", m.id, "epoch", m.epoch, "timeout", m.timeout)
			c.abortTxn(ctx, m, "timeout", nil)
		}
	}
	if open {
		c.armTxnTimeouts()
	}
}

// onListTxns lists the transactional ids (one, with req.id), open ones
// first.
func (c *Coordinator) onListTxns(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.ListTxnRequest, to *actor.PID) {
	var all []*txnMeta
	for _, m := range c.txns {
		if req.Id == "" || m.id == req.Id {
			all = append(all, m)
		}
	}
	if req.Id != "" && len(all) == 0 {
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_TXN_NOT_FOUND, "transactional id %q is not known", req.Id)))
		return
	}
	if req.NoPartitions || !slices.ContainsFunc(all, func(m *txnMeta) bool { return m.state == txnEmpty }) {
		c.answerList(ctx, f, req, to, all, nil)
		return
	}
	// A session with no staged transaction may have one written once,
	// open on its partitions only: their leaders list them.
	c.listWrittenOpen(ctx, func(open map[uint64][]openOn) { c.answerList(ctx, f, req, to, all, open) })
}

// openOn is a transaction written once found open on a partition.
type openOn struct {
	tp      topicPart
	epoch   uint32
	records uint32
	age     time.Duration
}

// listWrittenOpen asks every partition's leader for the transactions
// written once open there, and calls done with them by producer id once
// all have answered (or timed out).
func (c *Coordinator) listWrittenOpen(ctx actor.Context, done func(map[uint64][]openOn)) {
	open := map[uint64][]openOn{}
	waiting := 1
	answered := func() {
		if waiting--; waiting == 0 {
			done(open)
		}
	}
	for _, e := range c.o.Topics.All() {
		if len(e.Name) >= 2 && e.Name[:2] == "__" {
			continue // internal topics take no transactions
		}
		for p := range e.Partitions {
			tp := topicPart{e.Name, uint32(p)}
			waiting++
			req := &heraldpb.Frame{Body: &heraldpb.Frame_ListOpenTxns{ListOpenTxns: &heraldpb.ListOpenTxnsRequest{Topic: tp.topic, Partition: tp.part}}}
			c.request(ctx, e.Writer(p), req, callTimeout, func(f *heraldpb.Frame) {
				for _, o := range f.GetListOpenTxnsResponse().GetTxns() {
					open[o.ProducerId] = append(open[o.ProducerId], openOn{tp: tp, epoch: o.Epoch, records: o.Records, age: time.Duration(o.AgeMs) * time.Millisecond})
				}
				answered()
			})
		}
	}
	answered()
}

// answerList answers a ListTxnRequest with the sessions in all, open
// ones first; open holds the transactions written once found open on
// partitions, by producer id (nil: not asked).
func (c *Coordinator) answerList(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.ListTxnRequest, to *actor.PID, all []*txnMeta, open map[uint64][]openOn) {
	written := make(map[*txnMeta][]*heraldpb.TxnInfo, len(open))
	for _, m := range all {
		if c.txns[m.id] != m {
			continue // (forgotten while the partitions answered)
		}
		if infos := m.writtenOpen(open[m.pid], time.Now()); len(infos) > 0 {
			written[m] = infos
		}
	}
	state := func(m *txnMeta) txnState {
		if written[m] != nil {
			return txnOpen
		}
		return m.state
	}
	slices.SortFunc(all, func(a, b *txnMeta) int {
		return cmp.Or(cmp.Compare(state(b), state(a)), cmp.Compare(a.started, b.started), cmp.Compare(a.id, b.id))
	})
	limit := int(req.Limit)
	if limit == 0 {
		limit = 100
	}
	limit = min(limit, 10000)
	resp := &heraldpb.ListTxnResponse{Total: uint32(len(all))}
	for _, m := range all[:min(limit, len(all))] {
		infos := m.infos()
		if w := written[m]; w != nil {
			infos = append(infos[:len(m.completing)], w...) // (in place of the session's "empty")
		}
		resp.Transactions = append(resp.Transactions, infos...)
	}
	respond(ctx, to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListTxnResponse{ListTxnResponse: resp}})
}

// writtenOpen is m's transactions written once among open (found on their
// partitions), one TxnInfo an epoch: those of its session that its
// coordinator is not deciding or completing already (listed by infos).
// A session with a staged transaction open has none.
func (m *txnMeta) writtenOpen(open []openOn, now time.Time) []*heraldpb.TxnInfo {
	if m.state != txnEmpty || len(open) == 0 {
		return nil
	}
	byEpoch := map[uint32]*heraldpb.TxnInfo{}
	var out []*heraldpb.TxnInfo
	for _, o := range open {
		pending := slices.ContainsFunc(m.completing, func(j *commitJob) bool { return j.epoch == o.epoch }) ||
			slices.ContainsFunc(m.piped, func(p pipedEnd) bool { return p.epoch == o.epoch }) ||
			(m.deciding && o.epoch >= m.epoch && o.epoch <= max(m.decidingThrough, m.epoch))
		if pending || o.epoch < m.session {
			continue // (a zombie's, below the session: the sweep aborts it)
		}
		ti := byEpoch[o.epoch]
		if ti == nil {
			ti = &heraldpb.TxnInfo{TransactionalId: m.id, ProducerId: m.pid, ProducerEpoch: o.epoch, State: "open", WrittenOnce: true,
				StartedMs: now.Add(-o.age).UnixMilli(), TimeoutMs: uint32(m.timeout.Milliseconds())}
			byEpoch[o.epoch] = ti
			out = append(out, ti)
		}
		ti.StartedMs = min(ti.StartedMs, now.Add(-o.age).UnixMilli())
		ti.Records += o.records
		ti.Partitions = append(ti.Partitions, o.tp.String())
	}
	for _, ti := range out {
		slices.Sort(ti.Partitions)
	}
	slices.SortFunc(out, func(a, b *heraldpb.TxnInfo) int { return cmp.Compare(a.ProducerEpoch, b.ProducerEpoch) })
	return out
}

// sessionAfterEnd is the session record written with an end of m's
// current transaction (abort or commit decision), right after it: the
// session as it is once the epoch has moved on. It is what a replay from
// there needs to know the id, so compaction may drop what came before
// (once no commit of the id is still appending).
func (m *txnMeta) sessionAfterEnd(commit bool, by string) *heraldpb.TxnEvent {
	ev := m.snapshotEvent()
	in := ev.GetInit()
	in.Epoch = m.epoch + 1
	in.HasLast, in.LastEpoch, in.LastCommit, in.LastBy = true, m.epoch, commit, by
	return ev
}

// snapshotEvent is a session's state as one TxnInit, written by
// compaction when the session's newest event is about to be removed.
func (m *txnMeta) snapshotEvent() *heraldpb.TxnEvent {
	return &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Init{Init: &heraldpb.TxnInit{
		TransactionalId: m.id, ProducerId: m.pid, Epoch: m.epoch, SessionEpoch: m.session,
		TimeoutMs: uint32(m.timeout.Milliseconds()), UsedMs: m.used,
		HasLast: m.hasLast, LastEpoch: m.lastEpoch, LastCommit: m.lastCommit, LastBy: m.lastBy,
	}}}
}
