package partition

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Transactions written once. A transactional batch (ProduceRequest.txn_batch)
// is written to its partition's log as its producer sends it, durably and
// replicated like any entry, but it holds no offset (LogEntry.txn_count): no
// reader, by any path, sees it. Its transaction's commit marker, which the
// coordinator sends once it has recorded the decision, is an entry that gives
// the transaction's batches on this partition the next offsets, in the order
// they were written, and names their entries (LogEntry.txn_refs); readers
// read the records from there (persistence expands the marker). An abort
// marker drops them. So records are written once, as in Kafka, and there is
// no last stable offset: a partition's readable end is its high watermark,
// and an open or a hung transaction holds no reader back.
//
// Every replica keeps the open transactions (their batches, by producer id
// and epoch) as it applies the log. The leader checks a batch's sequence
// against them (a retry is answered as a duplicate, a gap is
// OUT_OF_ORDER_SEQUENCE) and refuses batches of an epoch that ended here
// (INVALID_TXN_STATE): a marker ends only its own epoch, so a delayed
// marker or batch of an earlier transaction never touches a later one. The
// leader writes a commit marker only once it has applied as many records of
// the transaction as the coordinator says it wrote. The open batches hold
// the log's front (retention and compaction stop before the oldest), and
// their bytes are bounded (Config.MaxTxnOpenBytes; THROTTLED past it). At
// open, the open transactions are found again by reading the log from the
// oldest open batch a small file (Config.ProducerStatePath + ".txn")
// recorded, or from the log's start without it.

// pidEpoch is one transaction on a partition: its producer id and epoch.
type pidEpoch struct {
	pid   uint64
	epoch uint32
}

// txnBatchRef is one applied batch of an open transaction.
type txnBatchRef struct {
	index   uint64 // its raft entry
	seq     int64
	count   uint32
	maxPrio uint32
	bytes   int
	records []byte // nil once the actor reopened: read from the log at the commit
}

// openTxn is a transaction's batches on this partition, applied and not
// ended.
type openTxn struct {
	batches []txnBatchRef
	records uint32
	bytes   int
	since   time.Time // the first batch's apply, by this replica's clock
}

// nextSeq is the sequence the transaction's next batch must carry.
func (o *openTxn) nextSeq() int64 {
	if o == nil || len(o.batches) == 0 {
		return 0
	}
	b := o.batches[len(o.batches)-1]
	return b.seq + int64(b.count)
}

// txnEnd is how a producer's latest transaction on this partition ended.
type txnEnd struct {
	epoch     uint32
	committed bool
	base      int64
	count     uint32
}

// seqRange is a transactional batch the leader proposed and has not applied.
type seqRange struct {
	seq   int64
	count uint32
	bytes int
}

// txnSeqKey names one batch of one transaction.
type txnSeqKey struct {
	pidEpoch
	seq int64
}

// txnLog is a partition's transactions. open, ended and bytes follow the
// applied log (every replica); the rest is the leader's, for its term.
type txnLog struct {
	open   map[pidEpoch]*openTxn
	perPid map[uint64]int    // open transactions by producer id
	ended  map[uint64]txnEnd // by producer id, at most maxEnded
	bytes  int               // records held by open transactions

	inflight   map[pidEpoch][]seqRange // proposed batches, oldest first
	inBytes    int                     // their records' bytes
	batchWait  map[txnSeqKey]proposal  // their producers, answered at apply
	closing    map[pidEpoch]*proposal  // proposed markers, answered at apply
	savedFloor uint64                  // the floor the state file holds
}

// maxEnded bounds the producers whose last end a partition remembers; a
// forgotten producer's late batch of an ended epoch is then taken as open,
// and never becomes readable (no second marker of that epoch comes).
const maxEnded = 100_000

func newTxnLog() txnLog {
	return txnLog{open: map[pidEpoch]*openTxn{}, perPid: map[uint64]int{}, ended: map[uint64]txnEnd{}, inflight: map[pidEpoch][]seqRange{},
		batchWait: map[txnSeqKey]proposal{}, closing: map[pidEpoch]*proposal{}}
}

// minOpenIndex is the raft index of the oldest open batch (^0: none).
func (t *txnLog) minOpenIndex() uint64 {
	m := ^uint64(0)
	for _, o := range t.open {
		if len(o.batches) > 0 {
			m = min(m, o.batches[0].index)
		}
	}
	return m
}

// openOf counts the open transactions of producer pid: applied, or with
// batches proposed.
func (t *txnLog) openOf(pid uint64) int {
	n := t.perPid[pid]
	for k := range t.inflight { // (the leader's proposals not applied: few)
		if k.pid == pid && t.open[k] == nil {
			n++
		}
	}
	return n
}

// opened and closed keep open and perPid in step.
func (t *txnLog) opened(k pidEpoch, o *openTxn) {
	t.open[k] = o
	t.perPid[k.pid]++
}

func (t *txnLog) closed(k pidEpoch) {
	if t.open[k] == nil {
		return
	}
	delete(t.open, k)
	if t.perPid[k.pid]--; t.perPid[k.pid] <= 0 {
		delete(t.perPid, k.pid)
	}
}

// noteEnd records how a producer's transaction ended, keeping the latest
// epoch.
func (t *txnLog) noteEnd(pid uint64, e txnEnd) {
	if cur, ok := t.ended[pid]; ok && cur.epoch > e.epoch {
		return
	}
	if _, ok := t.ended[pid]; !ok && len(t.ended) >= maxEnded {
		// Forget the lowest producer id: the same one on every replica,
		// which applies the same log.
		lowest := ^uint64(0)
		for k := range t.ended {
			lowest = min(lowest, k)
		}
		delete(t.ended, lowest)
	}
	t.ended[pid] = e
}

// txnError builds a transactional produce's error.
func (a *Actor) txnError(code heraldpb.ErrorCode, format string, args ...any) *heraldpb.Error {
	e := heraldpb.NewError(code, "partition %s-%d: %s", a.cfg.Topic, a.cfg.Partition, fmt.Sprintf(format, args...))
	if code == heraldpb.ErrorCode_THROTTLED {
		e.RetryAfterMs = uint32(a.cfg.ThrottleRetryAfter / time.Millisecond)
		a.m.throttled.Inc()
	}
	return e
}

// onTxnProduce handles a transactional batch or marker at the leader.
func (a *Actor) onTxnProduce(ctx actor.Context, replyTo *actor.PID, id uint64, req *heraldpb.ProduceRequest, fail func(*heraldpb.Error)) {
	switch {
	case req.ProducerId == 0:
		fail(a.txnError(heraldpb.ErrorCode_INVALID_REQUEST, "a transactional write needs a producer_id"))
		return
	case req.Acks != heraldpb.Acks_ACKS_ALL:
		fail(a.txnError(heraldpb.ErrorCode_INVALID_REQUEST, "a transactional write needs acks=all"))
		return
	case req.TxnBatch && req.TxnMarker != heraldpb.TxnMarker_TXN_MARKER_NONE:
		fail(a.txnError(heraldpb.ErrorCode_INVALID_REQUEST, "a write is a transactional batch or a marker, not both"))
		return
	case req.TxnEpoch != 0 || req.NotBeforeMs != 0 || req.HoldUs != 0 || req.DeliverAtMs != 0 || req.DelayMs != 0:
		fail(a.txnError(heraldpb.ErrorCode_INVALID_REQUEST, "a transactional write cannot be held, delayed or a coordinator's append"))
		return
	case !a.termApplied:
		// Only once it applied its log does a new leader know the open
		// transactions.
		fail(a.txnError(heraldpb.ErrorCode_THROTTLED, "new leader has not applied its log yet"))
		return
	}
	if req.TxnBatch {
		a.onTxnBatch(ctx, replyTo, id, req, fail)
		return
	}
	a.onTxnMarker(ctx, replyTo, id, req, fail)
}

func (a *Actor) onTxnBatch(ctx actor.Context, replyTo *actor.PID, id uint64, req *heraldpb.ProduceRequest, fail func(*heraldpb.Error)) {
	if len(req.Records) > a.cfg.MaxMessageBytes {
		fail(heraldpb.NewError(heraldpb.ErrorCode_MESSAGE_TOO_LARGE, "batch of %d bytes exceeds max message size %d", len(req.Records), a.cfg.MaxMessageBytes))
		return
	}
	info, err := heraldpb.ScanBatch(req.Records)
	switch {
	case err != nil:
		fail(heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "%v", err))
		return
	case info.Count == 0:
		fail(heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "empty record batch"))
		return
	case req.BaseSequence < 0 || req.BaseSequence > maxInt64-int64(info.Count):
		fail(a.txnError(heraldpb.ErrorCode_INVALID_REQUEST, "base_sequence %d is out of range", req.BaseSequence))
		return
	}
	t := &a.txn
	k := pidEpoch{req.ProducerId, req.ProducerEpoch}
	count := uint32(info.Count)
	o := t.open[k]
	if o == nil {
		if end, ok := t.ended[k.pid]; ok && k.epoch <= end.epoch {
			fail(a.txnError(heraldpb.ErrorCode_INVALID_TXN_STATE, "producer %d's transaction of epoch %d ended here (its latest end: epoch %d)", k.pid, k.epoch, end.epoch))
			return
		}
	}
	if t.closing[k] != nil {
		fail(a.txnError(heraldpb.ErrorCode_INVALID_TXN_STATE, "producer %d's transaction of epoch %d is ending here", k.pid, k.epoch))
		return
	}
	if o != nil {
		for _, b := range o.batches {
			if b.seq == req.BaseSequence && b.count == count {
				a.m.duplicates.Inc()
				a.reply(ctx, replyTo, produced(id, a.cfg.Partition, -1, proposal{count: count, duplicate: true}))
				return
			}
		}
	}
	expected := o.nextSeq()
	for _, r := range t.inflight[k] {
		if r.seq == req.BaseSequence && r.count == count {
			key := txnSeqKey{k, r.seq}
			if p, ok := t.batchWait[key]; ok {
				p.dups = append(p.dups, waiter{replyTo: replyTo, frameID: id})
				t.batchWait[key] = p
				a.m.duplicates.Inc()
				return
			}
		}
		expected = r.seq + int64(r.count)
	}
	if req.BaseSequence != expected {
		a.m.outOfOrder.Inc()
		fail(a.txnError(heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE, "producer %d's transaction of epoch %d expects sequence %d here, got %d", k.pid, k.epoch, expected, req.BaseSequence))
		return
	}
	switch {
	case o == nil && len(t.inflight[k]) == 0 && t.openOf(k.pid) >= a.cfg.MaxTxnOpenPerProducer:
		fail(a.txnError(heraldpb.ErrorCode_THROTTLED, "producer %d has %d transactions open here", k.pid, a.cfg.MaxTxnOpenPerProducer))
		return
	case t.bytes+t.inBytes+len(req.Records) > a.cfg.MaxTxnOpenBytes:
		fail(a.txnError(heraldpb.ErrorCode_THROTTLED, "open transactions hold %d bytes here (at most %d)", t.bytes+t.inBytes, a.cfg.MaxTxnOpenBytes))
		return
	case uint64(o.recordsOrZero())+uint64(t.inflightRecords(k))+uint64(count) > 1<<31:
		fail(a.txnError(heraldpb.ErrorCode_INVALID_REQUEST, "a transaction writes at most 2^31 records to one partition"))
		return
	}
	now := a.cfg.Clock.Now().UnixMilli()
	maxTs := info.MaxTimestamp
	if maxTs == 0 {
		maxTs = now
	}
	if e := a.proposeEntry(&heraldpb.LogEntry{TxnCount: count, ProducerId: k.pid, ProducerEpoch: k.epoch, BaseSequence: req.BaseSequence,
		AppendTimeMs: now, MaxTimestampMs: maxTs, MaxPriority: uint32(info.MaxPriority), Records: req.Records}); e != nil {
		fail(e)
		return
	}
	t.inflight[k] = append(t.inflight[k], seqRange{seq: req.BaseSequence, count: count, bytes: len(req.Records)})
	t.inBytes += len(req.Records)
	t.batchWait[txnSeqKey{k, req.BaseSequence}] = proposal{replyTo: replyTo, frameID: id, acks: req.Acks, count: count, appendTime: now, bytes: len(req.Records)}
}

func (o *openTxn) recordsOrZero() uint32 {
	if o == nil {
		return 0
	}
	return o.records
}

func (t *txnLog) inflightRecords(k pidEpoch) uint32 {
	var n uint32
	for _, r := range t.inflight[k] {
		n += r.count
	}
	return n
}

func (a *Actor) onTxnMarker(ctx actor.Context, replyTo *actor.PID, id uint64, req *heraldpb.ProduceRequest, fail func(*heraldpb.Error)) {
	commit := req.TxnMarker == heraldpb.TxnMarker_TXN_MARKER_COMMIT
	switch {
	case len(req.Records) != 0:
		fail(a.txnError(heraldpb.ErrorCode_INVALID_REQUEST, "a transaction marker has no records"))
		return
	case req.TxnMarker != heraldpb.TxnMarker_TXN_MARKER_COMMIT && req.TxnMarker != heraldpb.TxnMarker_TXN_MARKER_ABORT:
		fail(a.txnError(heraldpb.ErrorCode_INVALID_REQUEST, "unknown transaction marker %d", req.TxnMarker))
		return
	case !commit && req.TxnRecords != 0:
		fail(a.txnError(heraldpb.ErrorCode_INVALID_REQUEST, "an abort marker counts no records"))
		return
	}
	t := &a.txn
	k := pidEpoch{req.ProducerId, req.ProducerEpoch}
	if p := t.closing[k]; p != nil {
		p.dups = append(p.dups, waiter{replyTo: replyTo, frameID: id})
		return
	}
	o := t.open[k]
	if o == nil && len(t.inflight[k]) == 0 {
		if end, ok := t.ended[k.pid]; ok && k.epoch <= end.epoch {
			switch {
			case k.epoch == end.epoch && end.committed != commit:
				fail(a.txnError(heraldpb.ErrorCode_INVALID_TXN_STATE, "producer %d's transaction of epoch %d ended here the other way", k.pid, k.epoch))
			case k.epoch == end.epoch && commit:
				a.reply(ctx, replyTo, produced(id, a.cfg.Partition, end.base, proposal{count: end.count, duplicate: true}))
			default:
				a.reply(ctx, replyTo, produced(id, a.cfg.Partition, -1, proposal{duplicate: true}))
			}
			return
		}
	}
	if len(t.inflight[k]) > 0 {
		fail(a.txnError(heraldpb.ErrorCode_THROTTLED, "producer %d's transaction of epoch %d has batches being written here", k.pid, k.epoch))
		return
	}
	have := o.recordsOrZero()
	if commit && req.TxnRecords != have {
		if req.TxnRecords > have {
			fail(a.txnError(heraldpb.ErrorCode_THROTTLED, "producer %d's transaction of epoch %d has %d of its %d records here", k.pid, k.epoch, have, req.TxnRecords))
		} else {
			fail(a.txnError(heraldpb.ErrorCode_INVALID_TXN_STATE, "producer %d's transaction of epoch %d wrote %d records here, not %d", k.pid, k.epoch, have, req.TxnRecords))
		}
		return
	}
	now := a.cfg.Clock.Now().UnixMilli()
	le := &heraldpb.LogEntry{ProducerId: k.pid, ProducerEpoch: k.epoch, TxnMarker: req.TxnMarker, AppendTimeMs: now, MaxTimestampMs: now}
	if commit && have > 0 {
		le.BaseOffset, le.Count = a.tail, have
		for _, b := range o.batches {
			le.TxnRefs = append(le.TxnRefs, b.index)
			le.MaxPriority = max(le.MaxPriority, b.maxPrio)
		}
	}
	if e := a.proposeEntry(le); e != nil {
		fail(e)
		return
	}
	a.tail += int64(le.Count)
	t.closing[k] = &proposal{replyTo: replyTo, frameID: id, acks: req.Acks, count: le.Count, appendTime: now}
}

// applyTxnBatch applies a transactional batch: its transaction holds it,
// without an offset.
func (a *Actor) applyTxnBatch(ctx actor.Context, e raftpb.Entry, h heraldpb.LogEntryHeader, records []byte) {
	t := &a.txn
	k := pidEpoch{h.ProducerID, h.ProducerEpoch}
	key := txnSeqKey{k, h.BaseSequence}
	p, waiting := t.batchWait[key]
	if waiting && e.Term == a.term {
		delete(t.batchWait, key)
	} else {
		waiting = false
	}
	if q := t.inflight[k]; len(q) > 0 && q[0].seq == h.BaseSequence {
		t.inBytes -= q[0].bytes
		if len(q) == 1 {
			delete(t.inflight, k)
		} else {
			t.inflight[k] = q[1:]
		}
	}
	o := t.open[k]
	if o == nil {
		if end, ok := t.ended[k.pid]; ok && k.epoch <= end.epoch {
			// Proposed before its epoch's marker was applied, by a leader
			// that did not know of it: never readable.
			a.log.Warn("dropped a transactional batch of an ended epoch", "producer", k.pid, "epoch", k.epoch, "index", e.Index)
			if waiting {
				a.answer(ctx, p, func(id uint64, _ bool) *heraldpb.Frame {
					return heraldpb.ErrorFrame(id, a.txnError(heraldpb.ErrorCode_INVALID_TXN_STATE, "producer %d's transaction of epoch %d ended here", k.pid, k.epoch))
				})
			}
			return
		}
		o = &openTxn{since: a.cfg.Clock.Now()}
		t.opened(k, o)
	}
	o.batches = append(o.batches, txnBatchRef{index: e.Index, seq: h.BaseSequence, count: h.TxnCount, maxPrio: h.MaxPriority, bytes: len(records), records: records})
	o.records += h.TxnCount
	o.bytes += len(records)
	t.bytes += len(records)
	a.publishTxn()
	if waiting {
		a.answer(ctx, p, func(id uint64, dup bool) *heraldpb.Frame {
			q := p
			q.duplicate = dup
			return produced(id, a.cfg.Partition, -1, q)
		})
	}
}

// applyTxnMarker applies a transaction's end: a commit's batches get their
// offsets and become readable; an abort's are dropped.
func (a *Actor) applyTxnMarker(ctx actor.Context, e raftpb.Entry, h heraldpb.LogEntryHeader) {
	t := &a.txn
	k := pidEpoch{h.ProducerID, h.ProducerEpoch}
	o := t.open[k]
	if o != nil {
		t.closed(k)
		t.bytes -= o.bytes
	}
	commit := h.TxnMarker == heraldpb.TxnMarker_TXN_MARKER_COMMIT
	t.noteEnd(k.pid, txnEnd{epoch: k.epoch, committed: commit, base: h.BaseOffset, count: h.Count})
	a.m.txnMarkers.WithLabelValues(append(a.m.lv, markerLabel(commit))...).Inc()
	var p *proposal
	if q := t.closing[k]; q != nil && e.Term == a.term {
		p = q
	}
	delete(t.closing, k)
	a.publishTxn()
	if commit && h.Count > 0 {
		a.commitTxnRecords(e, h, o)
	}
	if p != nil {
		base := int64(-1)
		if commit && h.Count > 0 {
			base = h.BaseOffset
		}
		a.answer(ctx, *p, func(id uint64, dup bool) *heraldpb.Frame {
			q := *p
			q.duplicate = dup
			return produced(id, a.cfg.Partition, base, q)
		})
	}
}

func markerLabel(commit bool) string {
	if commit {
		return "commit"
	}
	return "abort"
}

// commitTxnRecords makes a commit marker's records readable: the high
// watermark moves past them, the window and the priority sub-queues take
// its batches.
func (a *Actor) commitTxnRecords(e raftpb.Entry, h heraldpb.LogEntryHeader, o *openTxn) {
	end := h.BaseOffset + int64(h.Count)
	if end <= a.hw {
		return // below a snapshot this replica installed (the log started after it)
	}
	if h.BaseOffset != a.hw && !a.acceptedGap(a.hw, h.BaseOffset) {
		a.log.Error("committed entry's base offset does not follow the high watermark",
			"index", e.Index, "base", h.BaseOffset, "hw", a.hw)
	}
	refs := h.AppendRefs(make([]uint64, 0, h.RefCount))
	if o == nil || len(o.batches) != len(refs) {
		a.log.Error("commit marker does not match its open transaction", "index", e.Index, "producer", h.ProducerID, "epoch", h.ProducerEpoch, "refs", len(refs))
	}
	a.hw = end
	base := h.BaseOffset
	prio := false
	for i, r := range refs {
		var b txnBatchRef
		if o != nil && i < len(o.batches) && o.batches[i].index == r {
			b = o.batches[i]
		}
		if b.records == nil {
			b = a.readTxnBatch(r)
		}
		if b.records == nil {
			// (logged by readTxnBatch) The window cannot hold the rest in
			// order: readers read them from the log.
			a.win.reset()
			break
		}
		a.win.add(&heraldpb.StoredBatch{BaseOffset: base, Count: b.count, AppendTimeMs: h.AppendTimeMs, Records: b.records})
		if b.maxPrio > 0 && a.prio.add(base, b.records) != 0 {
			prio = true
		}
		a.m.produceRecords.Add(float64(b.count))
		a.m.produceBytes.Add(float64(len(b.records)))
		base += int64(b.count)
	}
	if prio {
		a.publishPrio()
	}
}

// readTxnBatch reads the transactional batch at raft index i from the log
// (a batch applied before the actor reopened); records is nil if it cannot.
func (a *Actor) readTxnBatch(i uint64) txnBatchRef {
	ents, err := a.store.Entries(i, i+1, 1<<62)
	if err != nil || len(ents) != 1 {
		a.log.Error("reading a committed transactional batch", "index", i, "err", err)
		return txnBatchRef{}
	}
	h, records, err := heraldpb.ScanLogEntry(ents[0].Data)
	if err != nil || !h.TxnBatch() {
		a.log.Error("a commit marker names an entry that is not a transactional batch", "index", i, "err", err)
		return txnBatchRef{}
	}
	return txnBatchRef{index: i, seq: h.BaseSequence, count: h.TxnCount, maxPrio: h.MaxPriority, bytes: len(records), records: records}
}

// failTxnPending answers the leader's unapplied transactional proposals
// with why (outcome unknown), and forgets them.
func (a *Actor) failTxnPending(ctx actor.Context, why *heraldpb.Error) {
	t := &a.txn
	for k, p := range t.batchWait {
		a.answer(ctx, p, func(id uint64, _ bool) *heraldpb.Frame { return heraldpb.ErrorFrame(id, why) })
		delete(t.batchWait, k)
	}
	for k, p := range t.closing {
		a.answer(ctx, *p, func(id uint64, _ bool) *heraldpb.Frame { return heraldpb.ErrorFrame(id, why) })
		delete(t.closing, k)
	}
	clear(t.inflight)
	t.inBytes = 0
}

// publishTxn updates the transaction metrics.
func (a *Actor) publishTxn() {
	a.m.txnOpen.Set(float64(len(a.txn.open)))
	a.m.txnOpenBytes.Set(float64(a.txn.bytes))
}

// retainUpTo is the raft index the log's front may be truncated up to
// (exclusive): the applied index, and never the oldest open batch.
func (a *Actor) retainUpTo() uint64 {
	return min(a.applied, a.txn.minOpenIndex())
}

// openTxnLog finds the open transactions of a log just opened, whose
// entries up to applied are applied: it applies the transactional entries
// from the floor the state file recorded (the oldest batch then open, or
// the log's first entry) to applied.
func (a *Actor) openTxnLog(applied uint64) error {
	a.txn = newTxnLog()
	first, err := a.store.FirstIndex()
	if err != nil {
		return err
	}
	from := first
	if floor, through, err := loadTxnFloor(a.txnStatePath()); err != nil {
		a.log.Warn("transaction state file unusable; reading the whole log for open transactions", "err", err)
	} else if floor != 0 && through <= applied {
		from = max(floor, first)
	}
	a.txn.savedFloor = from
	for from <= applied {
		ents, err := a.store.Entries(from, applied+1, rebuildChunkBytes)
		if errors.Is(err, raft.ErrCompacted) {
			if from, err = a.store.FirstIndex(); err != nil {
				return err
			}
			a.txn = newTxnLog() // (retention ran meanwhile: from the new start)
			continue
		}
		if err != nil {
			return err
		}
		if len(ents) == 0 {
			return fmt.Errorf("no entries at index %d of a log ending at %d or later", from, applied)
		}
		for _, e := range ents {
			if e.Type != raftpb.EntryNormal || len(e.Data) == 0 {
				continue
			}
			h, records, err := heraldpb.ScanLogEntry(e.Data)
			if err != nil {
				continue
			}
			k := pidEpoch{h.ProducerID, h.ProducerEpoch}
			switch {
			case h.TxnBatch():
				if end, ok := a.txn.ended[k.pid]; ok && k.epoch <= end.epoch && a.txn.open[k] == nil {
					continue
				}
				o := a.txn.open[k]
				if o == nil {
					o = &openTxn{since: a.cfg.Clock.Now()}
					a.txn.opened(k, o)
				}
				// (records not kept: the commit reads them from the log)
				o.batches = append(o.batches, txnBatchRef{index: e.Index, seq: h.BaseSequence, count: h.TxnCount, maxPrio: h.MaxPriority, bytes: len(records)})
				o.records += h.TxnCount
				o.bytes += len(records)
				a.txn.bytes += len(records)
			case h.TxnMarker != heraldpb.TxnMarker_TXN_MARKER_NONE:
				if o := a.txn.open[k]; o != nil {
					a.txn.bytes -= o.bytes
				}
				a.txn.closed(k)
				a.txn.noteEnd(k.pid, txnEnd{epoch: k.epoch, committed: h.TxnMarker == heraldpb.TxnMarker_TXN_MARKER_COMMIT, base: h.BaseOffset, count: h.Count})
			}
		}
		from = ents[len(ents)-1].Index + 1
	}
	a.publishTxn()
	return nil
}

// txnStatePath is the transaction state file ("": none).
func (a *Actor) txnStatePath() string {
	if a.cfg.ProducerStatePath == "" {
		return ""
	}
	return a.cfg.ProducerStatePath + ".txn"
}

// saveTxnFloor records the oldest open batch (or the next entry when none
// is open) and the applied index it is true of, when it moved.
func (a *Actor) saveTxnFloor() {
	path := a.txnStatePath()
	if path == "" || a.store == nil {
		return
	}
	floor := min(a.txn.minOpenIndex(), a.applied+1)
	if floor == a.txn.savedFloor {
		return
	}
	if err := replaceFile(path, encodeTxnFloor(floor, a.applied)); err != nil {
		a.log.Warn("saving the transaction state file", "err", err)
		return
	}
	a.txn.savedFloor = floor
}

// The transaction state file: magic, version, the floor and the applied
// index it is true of, then the CRC32C of what precedes. Little-endian.
var txnStateMagic = []byte("HTXN")

const txnStateLen = 4 + 1 + 8 + 8 + 4

func encodeTxnFloor(floor, through uint64) []byte {
	b := append(slices.Clone(txnStateMagic), 1)
	b = binary.LittleEndian.AppendUint64(b, floor)
	b = binary.LittleEndian.AppendUint64(b, through)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// decodeTxnFloor reads a transaction state file; a damaged one is an
// error, never a panic.
func decodeTxnFloor(b []byte) (floor, through uint64, err error) {
	if len(b) != txnStateLen || !bytes.Equal(b[:4], txnStateMagic) || b[4] != 1 ||
		crc32.Checksum(b[:txnStateLen-4], castagnoli) != binary.LittleEndian.Uint32(b[txnStateLen-4:]) {
		return 0, 0, fmt.Errorf("bad transaction state file (%d bytes)", len(b))
	}
	return binary.LittleEndian.Uint64(b[5:]), binary.LittleEndian.Uint64(b[13:]), nil
}

// loadTxnFloor reads the file at path ("" or missing: 0, no error).
func loadTxnFloor(path string) (floor, through uint64, err error) {
	if path == "" {
		return 0, 0, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	return decodeTxnFloor(b)
}
