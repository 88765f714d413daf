package partition

import (
	"bytes"
	"cmp"
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
	"google.golang.org/protobuf/proto"
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
// Its records are kept in memory while the partition's open batches keep
// at most txnCacheBytes (the commit then takes them from there); past
// that, and after a reopen, the commit reads them from the log.
type txnBatchRef struct {
	index   uint64 // its raft entry
	seq     int64
	count   uint32
	maxPrio uint32
	maxTs   int64
	bytes   int
	records []byte // nil: read from the log
}

// txnCacheBytes bounds the open batches' records a partition keeps in
// memory for their commit.
const txnCacheBytes = 4 << 20

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
	cached int               // of which kept in memory (txnCacheBytes)

	inflight  map[pidEpoch][]seqRange // proposed batches, oldest first
	inBytes   int                     // their records' bytes
	batchWait map[txnSeqKey]proposal  // their producers, answered at apply
	closing   map[pidEpoch]*proposal  // proposed (or queued) markers, answered at apply
	// markers are queued to be proposed together (flushMarkers), and
	// flushQueued is set while a flushMarkersMsg is on its way.
	markers     []queuedMarker
	flushQueued bool
	// parked: single-partition commits waiting for an earlier transaction
	// of their producer here to end or be ending (onephase.go);
	// unparking guards unparkCommits against itself.
	parked               map[pidEpoch]parkedCommit
	unparking, unparkRan bool

	// The state file (saveTxnState): the floors saved, newest last, and
	// whether ended changed since.
	floors     []txnFloor
	endedDirty bool
}

// txnFloor is a saved floor: the oldest batch open once the entries up
// to through were applied (through+1 when none was).
type txnFloor struct{ floor, through uint64 }

// maxEnded bounds the producers whose last end a partition remembers; a
// forgotten producer's late batch of an ended epoch is then taken as open,
// and never becomes readable (no second marker of that epoch comes).
const maxEnded = 100_000

func newTxnLog() txnLog {
	return txnLog{open: map[pidEpoch]*openTxn{}, perPid: map[uint64]int{}, ended: map[uint64]txnEnd{}, inflight: map[pidEpoch][]seqRange{},
		batchWait: map[txnSeqKey]proposal{}, closing: map[pidEpoch]*proposal{}, parked: map[pidEpoch]parkedCommit{}}
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

// earlierOpen is the epoch of an open transaction of k's producer earlier
// than k's with no marker proposed yet (nil: none).
func (t *txnLog) earlierOpen(k pidEpoch) *uint32 {
	var found *uint32
	check := func(o pidEpoch) {
		if o.pid == k.pid && o.epoch < k.epoch && t.closing[o] == nil && (found == nil || o.epoch < *found) {
			e := o.epoch
			found = &e
		}
	}
	if t.perPid[k.pid] > 1 || (t.perPid[k.pid] == 1 && t.open[k] == nil) {
		for o := range t.open {
			check(o)
		}
	}
	for o := range t.inflight {
		check(o)
	}
	return found
}

// addBatch adds the applied batch at raft index i to k's open
// transaction (opened now if it was not), keeping its records in memory
// when keep and the cache has room.
func (t *txnLog) addBatch(k pidEpoch, i uint64, h heraldpb.LogEntryHeader, records []byte, keep bool, now time.Time) {
	o := t.open[k]
	if o == nil {
		o = &openTxn{since: now}
		t.opened(k, o)
	}
	ref := txnBatchRef{index: i, seq: h.BaseSequence, count: h.TxnCount, maxPrio: h.MaxPriority, maxTs: h.MaxTimestampMs, bytes: len(records)}
	if keep && t.cached+len(records) <= txnCacheBytes {
		ref.records = records // (aliases the applied entry)
		t.cached += len(records)
	}
	o.batches = append(o.batches, ref)
	o.records += h.TxnCount
	o.bytes += len(records)
	t.bytes += len(records)
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
		// Forget the lowest tenth of the producer ids at once (a sort
		// every maxEnded/10 new producers).
		ids := make([]uint64, 0, len(t.ended))
		for k := range t.ended {
			ids = append(ids, k)
		}
		slices.Sort(ids)
		for _, k := range ids[:maxEnded/10] {
			delete(t.ended, k)
		}
	}
	t.ended[pid] = e
	t.endedDirty = true
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
	case req.CommitTxn && !req.TxnBatch, len(req.TxnGroupOffsets) > 0:
		fail(a.txnError(heraldpb.ErrorCode_INVALID_REQUEST, "commit_txn goes with a transactional batch, and group offsets with EndTxn"))
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
	if e := a.checkSession(req.ProducerId, req.ProducerEpoch); e != nil {
		fail(e)
		return
	}
	t := &a.txn
	k := pidEpoch{req.ProducerId, req.ProducerEpoch}
	count := uint32(info.Count)
	var after uint64
	if req.TxnCommitAfter != nil {
		if !req.CommitTxn || *req.TxnCommitAfter >= k.epoch {
			fail(a.txnError(heraldpb.ErrorCode_INVALID_REQUEST, "txn_commit_after %d goes with commit_txn, and names an epoch before %d", *req.TxnCommitAfter, k.epoch))
			return
		}
		after = uint64(*req.TxnCommitAfter) + 1
	}
	o := t.open[k]
	if o == nil {
		if end, ok := t.ended[k.pid]; ok && k.epoch <= end.epoch {
			if req.CommitTxn && k.epoch == end.epoch && end.committed && len(t.inflight[k]) == 0 {
				// A retry of a commit batch that committed (its answer lost).
				a.m.duplicates.Inc()
				a.reply(ctx, replyTo, produced(id, a.cfg.Partition, end.base, proposal{count: end.count, duplicate: true}))
				return
			}
			fail(a.txnError(heraldpb.ErrorCode_INVALID_TXN_STATE, "producer %d's transaction of epoch %d ended here (its latest end: epoch %d)", k.pid, k.epoch, end.epoch))
			return
		}
	}
	if p := t.closing[k]; p != nil {
		if req.CommitTxn && p.txnEnd == heraldpb.TxnMarker_TXN_MARKER_COMMIT {
			// A retry of a commit batch whose commit is on its way.
			p.dups = append(p.dups, waiter{replyTo: replyTo, frameID: id})
			a.m.duplicates.Inc()
			return
		}
		fail(a.txnError(heraldpb.ErrorCode_INVALID_TXN_STATE, "producer %d's transaction of epoch %d is ending here", k.pid, k.epoch))
		return
	}
	if _, ok := t.parked[k]; ok && req.CommitTxn {
		// A retry of a commit batch that waits for an earlier transaction:
		// it joins it.
		a.parkCommit(ctx, k, proposal{replyTo: replyTo, frameID: id}, "")
		a.m.duplicates.Inc()
		return
	}
	if o != nil && req.BaseSequence < o.nextSeq() {
		// A retry of an applied batch? (sorted by sequence)
		i, found := slices.BinarySearchFunc(o.batches, req.BaseSequence, func(b txnBatchRef, seq int64) int { return cmp.Compare(b.seq, seq) })
		if found && o.batches[i].count == count {
			a.m.duplicates.Inc()
			if req.CommitTxn && i == len(o.batches)-1 {
				// A commit batch written, its commit not: the commit
				// again (it was refused, or its answer lost).
				a.commitOnePhase(ctx, k, proposal{replyTo: replyTo, frameID: id, acks: req.Acks, count: count, duplicate: true, txnCommit: true, txnAfter: after})
				return
			}
			a.reply(ctx, replyTo, produced(id, a.cfg.Partition, -1, proposal{count: count, duplicate: true}))
			return
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
	if req.CommitTxn && a.commitInline(ctx, k, proposal{replyTo: replyTo, frameID: id, acks: req.Acks, bytes: len(req.Records), txnCommit: true, txnAfter: after}, req, info) {
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
	t.batchWait[txnSeqKey{k, req.BaseSequence}] = proposal{replyTo: replyTo, frameID: id, acks: req.Acks, count: count, appendTime: now, bytes: len(req.Records),
		txnCommit: req.CommitTxn, txnAfter: after}
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
		if p.txnEnd != req.TxnMarker {
			// (A single-partition commit came first: the abort is refused,
			// as it is once that commit is applied.)
			fail(a.txnError(heraldpb.ErrorCode_INVALID_TXN_STATE, "producer %d's transaction of epoch %d is ending here the other way", k.pid, k.epoch))
			return
		}
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
	if commit {
		if e := t.earlierOpen(k); e != nil {
			// A producer's commits keep their order here: an earlier
			// transaction's marker comes first (or its abort).
			fail(a.txnError(heraldpb.ErrorCode_THROTTLED, "producer %d's transaction of epoch %d is still open here, before epoch %d", k.pid, *e, k.epoch))
			return
		}
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
	count := uint32(0)
	if commit {
		count = have
	}
	// Queued, and proposed with the markers that reach the partition
	// with it (flushMarkers): one entry for all of them.
	if w, ok := t.parked[k]; ok && !commit {
		// The coordinator ends it (a timeout, a new session) while its
		// commit alone waits: the abort wins.
		delete(t.parked, k)
		a.m.commitsWaiting.Set(float64(len(t.parked)))
		a.answer(ctx, w.p, func(id uint64, _ bool) *heraldpb.Frame {
			return heraldpb.ErrorFrame(id, a.txnError(heraldpb.ErrorCode_INVALID_TXN_STATE, "producer %d's transaction of epoch %d was aborted here while its commit waited", k.pid, k.epoch))
		})
	}
	t.closing[k] = &proposal{replyTo: replyTo, frameID: id, acks: req.Acks, count: count, appendTime: a.cfg.Clock.Now().UnixMilli(), txnEnd: req.TxnMarker}
	a.queueMarker(ctx, queuedMarker{k: k, marker: req.TxnMarker, count: count})
	a.unparkCommits(ctx, k.pid)
}

// queueMarker queues q (its proposal in closing) to be proposed with the
// markers that reach the partition with it.
func (a *Actor) queueMarker(ctx actor.Context, q queuedMarker) {
	t := &a.txn
	t.markers = append(t.markers, q)
	switch {
	case len(t.markers) >= maxMarkersPerEntry:
		a.flushMarkers(ctx)
	case !t.flushQueued:
		// After the messages already in the mailbox: the markers among
		// them join this entry.
		t.flushQueued = true
		ctx.Send(ctx.Self(), flushMarkersMsg{})
	}
}

// maxMarkersPerEntry bounds the transaction ends one marker entry holds.
const maxMarkersPerEntry = 256

// queuedMarker is a transaction end the leader accepted and has not
// proposed yet (txnLog.markers).
type queuedMarker struct {
	k      pidEpoch
	marker heraldpb.TxnMarker
	count  uint32
}

// flushMarkersMsg proposes the queued markers (sent to self).
type flushMarkersMsg struct{}

// flushMarkers proposes the queued markers as one entry (LogEntry.txn_markers):
// the first in the entry's own fields, the rest after it. It runs before
// any other entry that takes offsets is proposed, so that the markers'
// records keep the offsets that follow the entries proposed before them.
// A marker whose transaction changed since it was queued (an earlier
// term's marker of it was applied) is answered THROTTLED, to be sent again
// and answered as the end it already is.
func (a *Actor) flushMarkers(ctx actor.Context) {
	t := &a.txn
	queued := t.markers
	t.markers = t.markers[:0]
	if len(queued) == 0 {
		return
	}
	now := a.cfg.Clock.Now().UnixMilli()
	le := &heraldpb.LogEntry{AppendTimeMs: now, MaxTimestampMs: now}
	var ks []pidEpoch
	for _, q := range queued {
		p := t.closing[q.k]
		if p == nil {
			continue // (answered since)
		}
		o := t.open[q.k]
		if q.count > 0 && (o == nil || o.records != q.count) {
			delete(t.closing, q.k)
			a.answer(ctx, *p, func(id uint64, _ bool) *heraldpb.Frame {
				return heraldpb.ErrorFrame(id, a.txnError(heraldpb.ErrorCode_THROTTLED, "producer %d's transaction of epoch %d changed here while its marker waited", q.k.pid, q.k.epoch))
			})
			continue
		}
		if le.TxnMarker == heraldpb.TxnMarker_TXN_MARKER_NONE {
			le.ProducerId, le.ProducerEpoch, le.TxnMarker = q.k.pid, q.k.epoch, q.marker
		} else {
			le.TxnMarkers = append(le.TxnMarkers, &heraldpb.TxnMarkerItem{ProducerId: q.k.pid, ProducerEpoch: q.k.epoch, Marker: q.marker, Count: q.count})
		}
		if q.count > 0 {
			if le.Count == 0 {
				le.MaxTimestampMs = 0
			}
			le.Count += q.count
			for _, b := range o.batches {
				le.TxnRefs = append(le.TxnRefs, b.index)
				le.MaxPriority = max(le.MaxPriority, b.maxPrio)
				le.MaxTimestampMs = max(le.MaxTimestampMs, b.maxTs) // (a time lookup finds the records by their own times)
			}
			if n := len(le.TxnMarkers); n > 0 {
				le.TxnMarkers[n-1].Refs = uint32(len(o.batches))
			}
		}
		ks = append(ks, q.k)
	}
	if len(ks) == 0 {
		return
	}
	if le.Count > 0 {
		le.BaseOffset = a.tail
	}
	if e := a.proposeEntry(le); e != nil {
		for _, k := range ks {
			p := t.closing[k]
			delete(t.closing, k)
			a.answer(ctx, *p, func(id uint64, _ bool) *heraldpb.Frame { return heraldpb.ErrorFrame(id, e) })
		}
		return
	}
	a.tail += int64(le.Count)
	a.m.markersPerEntry.Observe(float64(len(ks)))
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
	}
	t.addBatch(k, e.Index, h, records, true, a.cfg.Clock.Now())
	a.publishTxn()
	if waiting && p.txnCommit {
		a.commitOnePhase(ctx, k, p)
		return
	}
	if waiting {
		a.answer(ctx, p, func(id uint64, dup bool) *heraldpb.Frame {
			q := p
			q.duplicate = dup
			return produced(id, a.cfg.Partition, -1, q)
		})
	}
}

// applyTxnMarker applies a marker entry, each of its transaction ends in
// order: a commit's batches get their offsets and become readable; an
// abort's are dropped.
func (a *Actor) applyTxnMarker(ctx actor.Context, e raftpb.Entry, h heraldpb.LogEntryHeader) {
	refs := h.AppendRefs(make([]uint64, 0, h.RefCount))
	base := h.BaseOffset
	for _, m := range h.Markers() {
		a.applyTxnEnd(ctx, e, h.AppendTimeMs, m, base, refs[:m.Refs])
		base += int64(m.Count)
		refs = refs[m.Refs:]
	}
	a.publishTxn()
}

// applyTxnEnd applies one transaction end m of a marker entry: its records
// (a commit's) take the offsets from base, in its batches refs.
func (a *Actor) applyTxnEnd(ctx actor.Context, e raftpb.Entry, appendMs int64, m heraldpb.MarkerItem, base int64, refs []uint64) {
	t := &a.txn
	k := pidEpoch{m.ProducerID, m.ProducerEpoch}
	o := t.open[k]
	if o != nil {
		t.closed(k)
		t.bytes -= o.bytes
		for _, b := range o.batches {
			if b.records != nil {
				t.cached -= len(b.records)
			}
		}
	}
	commit := m.Marker == heraldpb.TxnMarker_TXN_MARKER_COMMIT
	t.noteEnd(k.pid, txnEnd{epoch: k.epoch, committed: commit, base: base, count: m.Count})
	defer a.unparkCommits(ctx, k.pid)
	a.m.marker(commit)
	var p *proposal
	if q := t.closing[k]; q != nil && e.Term == a.term {
		p = q
	}
	delete(t.closing, k)
	if commit && m.Count > 0 {
		a.commitTxnRecords(e, appendMs, k, base, m.Count, refs, o)
	}
	if p != nil {
		at := int64(-1)
		if commit && m.Count > 0 {
			at = base
		}
		a.answer(ctx, *p, func(id uint64, dup bool) *heraldpb.Frame {
			q := *p
			q.duplicate = dup
			return produced(id, a.cfg.Partition, at, q)
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
func (a *Actor) commitTxnRecords(e raftpb.Entry, appendMs int64, k pidEpoch, base int64, count uint32, refs []uint64, o *openTxn) {
	end := base + int64(count)
	if end <= a.hw {
		return // below a snapshot this replica installed (the log started after it)
	}
	if base != a.hw && !a.acceptedGap(a.hw, base) {
		a.log.Error("committed entry's base offset does not follow the high watermark",
			"index", e.Index, "base", base, "hw", a.hw)
	}
	if o == nil || len(o.batches) != len(refs) {
		a.log.Error("commit marker does not match its open transaction", "index", e.Index, "producer", k.pid, "epoch", k.epoch, "refs", len(refs))
	}
	a.hw = end
	prio := false
	for i, r := range refs {
		var b txnBatchRef
		var records []byte
		if o != nil && i < len(o.batches) && o.batches[i].index == r && o.batches[i].records != nil {
			b, records = o.batches[i], o.batches[i].records
		} else {
			b, records = a.readTxnBatch(r)
		}
		if records == nil {
			// (logged by readTxnBatch) The window cannot hold the rest in
			// order: readers read them from the log.
			a.win.reset()
			break
		}
		a.win.add(&heraldpb.StoredBatch{BaseOffset: base, Count: b.count, AppendTimeMs: appendMs, Records: records})
		if b.maxPrio > 0 && a.prio.add(base, records) != 0 {
			prio = true
		}
		a.m.produceRecords.Add(float64(b.count))
		a.m.produceBytes.Add(float64(len(records)))
		base += int64(b.count)
	}
	if prio {
		a.publishPrio()
	}
}

// readTxnBatch reads the transactional batch at raft index i from the log;
// records is nil if it cannot.
func (a *Actor) readTxnBatch(i uint64) (txnBatchRef, []byte) {
	ents, err := a.store.Entries(i, i+1, 1<<62)
	if err != nil || len(ents) != 1 {
		a.log.Error("reading a committed transactional batch", "index", i, "err", err)
		return txnBatchRef{}, nil
	}
	h, records, err := heraldpb.ScanLogEntry(ents[0].Data)
	if err != nil || !h.TxnBatch() {
		a.log.Error("a commit marker names an entry that is not a transactional batch", "index", i, "err", err)
		return txnBatchRef{}, nil
	}
	return txnBatchRef{index: i, seq: h.BaseSequence, count: h.TxnCount, maxPrio: h.MaxPriority, maxTs: h.MaxTimestampMs, bytes: len(records)}, records
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
	t.markers = t.markers[:0]
	a.expireParked(ctx, why)
	clear(t.inflight)
	t.inBytes = 0
	for _, w := range a.sessions.waiting {
		a.reply(ctx, w.replyTo, heraldpb.ErrorFrame(w.frameID, why))
	}
	a.sessions.waiting = nil
	a.m.fenceWaiting.Set(0)
	clear(a.sessions.proposed)
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
// entries up to applied are applied: it restores how producers last ended
// theirs from the state file, and applies the transactional entries from
// the newest floor the file saved for an applied index at or below this
// one (the log's first transactional entry without one) to applied.
func (a *Actor) openTxnLog(applied uint64) error {
	a.txn = newTxnLog()
	first, err := a.store.FirstIndex()
	if err != nil {
		return err
	}
	from := first
	floors, ended, fences, err := loadTxnState(a.txnStatePath())
	if err != nil {
		a.log.Warn("transaction state file unusable; reading the log for open transactions", "err", err)
	}
	a.restoreSessions(fences)
	for _, e := range ended {
		a.txn.noteEnd(e.GetProducerId(), txnEnd{epoch: e.GetEpoch(), committed: e.GetCommitted(), base: e.GetBaseOffset(), count: e.GetCount()})
	}
	for i := len(floors) - 1; i >= 0; i-- {
		if floors[i].through <= applied {
			from = max(floors[i].floor, first)
			break
		}
	}
	// Nothing transactional below the log's first such entry.
	if low := a.store.TxnFloor(); low == 0 {
		from = applied + 1
	} else {
		from = max(from, low)
	}
	for from <= applied {
		ents, err := a.store.Entries(from, applied+1, rebuildChunkBytes)
		if errors.Is(err, raft.ErrCompacted) {
			if from, err = a.store.FirstIndex(); err != nil {
				return err
			}
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
			case h.SessionFence > 0:
				a.logSessionFence(h.ProducerID, h.SessionFence)
			case h.TxnCommitInline:
				a.txn.noteEnd(k.pid, txnEnd{epoch: k.epoch, committed: true, base: h.BaseOffset, count: h.Count})
			case h.TxnBatch():
				if end, ok := a.txn.ended[k.pid]; ok && k.epoch <= end.epoch && a.txn.open[k] == nil {
					continue
				}
				// (records not kept: the commit reads them from the log)
				a.txn.addBatch(k, e.Index, h, records, false, a.cfg.Clock.Now())
			case h.TxnMarker != heraldpb.TxnMarker_TXN_MARKER_NONE:
				base := h.BaseOffset
				for _, m := range h.Markers() {
					k := pidEpoch{m.ProducerID, m.ProducerEpoch}
					if o := a.txn.open[k]; o != nil {
						a.txn.bytes -= o.bytes
					}
					a.txn.closed(k)
					a.txn.noteEnd(k.pid, txnEnd{epoch: k.epoch, committed: m.Marker == heraldpb.TxnMarker_TXN_MARKER_COMMIT, base: base, count: m.Count})
					base += int64(m.Count)
				}
			}
		}
		from = ents[len(ents)-1].Index + 1
	}
	a.txn.floors = floors
	a.publishTxn()
	return nil
}

// endedList is how the producers last ended their transactions here, by
// producer id (the state file's and the snapshots' form).
func (t *txnLog) endedList() []*heraldpb.TxnEnded {
	out := make([]*heraldpb.TxnEnded, 0, len(t.ended))
	for pid, e := range t.ended {
		out = append(out, &heraldpb.TxnEnded{ProducerId: pid, Epoch: e.epoch, Committed: e.committed, BaseOffset: e.base, Count: e.count})
	}
	slices.SortFunc(out, func(x, y *heraldpb.TxnEnded) int { return cmp.Compare(x.ProducerId, y.ProducerId) })
	return out
}

// txnStatePath is the transaction state file ("": none).
func (a *Actor) txnStatePath() string {
	if a.cfg.ProducerStatePath == "" {
		return ""
	}
	return a.cfg.ProducerStatePath + ".txn"
}

// saveTxnState saves the floor (the oldest open batch, or the next entry
// when none is open) for the applied index, with the last 4 saved before
// it, and how producers last ended their transactions, when either moved.
// After a crash the log's commit index may be below the last save's
// applied index: an earlier floor then serves.
func (a *Actor) saveTxnState() {
	path := a.txnStatePath()
	t := &a.txn
	if path == "" || a.store == nil {
		return
	}
	f := txnFloor{floor: min(t.minOpenIndex(), a.applied+1), through: a.applied}
	if n := len(t.floors); n > 0 && t.floors[n-1].floor == f.floor && !t.endedDirty {
		return
	}
	floors := append(slices.Clone(t.floors), f)
	if len(floors) > maxTxnFloors {
		floors = floors[len(floors)-maxTxnFloors:]
	}
	data, err := encodeTxnState(floors, t.endedList(), a.sessionList())
	if err == nil {
		err = replaceFile(path, data)
	}
	if err != nil {
		a.log.Warn("saving the transaction state file", "err", err)
		return
	}
	t.floors, t.endedDirty = floors, false
}

const maxTxnFloors = 5

// The transaction state file: magic, version 2, the CRC32C (little-endian)
// of the rest, then a heraldpb.TxnState.
var txnStateMagic = []byte("HTXN")

func encodeTxnState(floors []txnFloor, ended []*heraldpb.TxnEnded, fences []*heraldpb.TxnSessionFence) ([]byte, error) {
	st := &heraldpb.TxnState{Ended: ended, SessionFences: fences}
	for _, f := range floors {
		st.Floors = append(st.Floors, &heraldpb.TxnFloor{Floor: f.floor, Through: f.through})
	}
	body, err := proto.Marshal(st)
	if err != nil {
		return nil, err
	}
	b := append(slices.Clone(txnStateMagic), 2)
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(body, castagnoli))
	return append(b, body...), nil
}

// decodeTxnState reads a transaction state file; a damaged one is an
// error, never a panic. Floors come oldest first, each with a through
// above the one before; session fences oldest first.
func decodeTxnState(b []byte) ([]txnFloor, []*heraldpb.TxnEnded, []*heraldpb.TxnSessionFence, error) {
	if len(b) < 9 || !bytes.Equal(b[:4], txnStateMagic) || b[4] != 2 || crc32.Checksum(b[9:], castagnoli) != binary.LittleEndian.Uint32(b[5:]) {
		return nil, nil, nil, fmt.Errorf("bad transaction state file (%d bytes)", len(b))
	}
	var st heraldpb.TxnState
	if err := proto.Unmarshal(b[9:], &st); err != nil {
		return nil, nil, nil, fmt.Errorf("bad transaction state file: %w", err)
	}
	var floors []txnFloor
	for _, f := range st.Floors {
		if n := len(floors); f.GetFloor() == 0 || n > 0 && f.GetThrough() <= floors[n-1].through {
			return nil, nil, nil, fmt.Errorf("bad transaction state file: floor %d through %d", f.GetFloor(), f.GetThrough())
		}
		floors = append(floors, txnFloor{floor: f.GetFloor(), through: f.GetThrough()})
	}
	if len(floors) > maxTxnFloors || len(st.Ended) > maxEnded || len(st.SessionFences) > maxSessionFences {
		return nil, nil, nil, fmt.Errorf("bad transaction state file: %d floors, %d producers, %d session fences", len(floors), len(st.Ended), len(st.SessionFences))
	}
	return floors, st.Ended, st.SessionFences, nil
}

// loadTxnState reads the file at path ("" or missing: nothing, no error).
func loadTxnState(path string) ([]txnFloor, []*heraldpb.TxnEnded, []*heraldpb.TxnSessionFence, error) {
	if path == "" {
		return nil, nil, nil, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil, nil
	}
	if err != nil {
		return nil, nil, nil, err
	}
	return decodeTxnState(b)
}

// maxListedTxns bounds a ListOpenTxns answer.
const maxListedTxns = 10_000

// onListOpenTxns answers the transaction coordinator with the transactions
// open here for at least the asked age, oldest first. Only a leader that
// has applied its log knows them all.
func (a *Actor) onListOpenTxns(ctx actor.Context, f *heraldpb.Frame) {
	req := f.GetListOpenTxns()
	if req.FenceProducerId != 0 {
		a.fenceSession(req.FenceProducerId, req.FenceEpoch) // (true on any replica: sessions only move on)
	}
	switch {
	case a.rn == nil:
		a.reply(ctx, ctx.Sender(), heraldpb.ErrorFrame(f.Id, storageError(a.failure)))
		return
	case !a.isLeader:
		a.reply(ctx, ctx.Sender(), heraldpb.ErrorFrame(f.Id, notLeader(a.cfg.Topic, a.cfg.Partition, a.leader)))
		return
	case !a.termApplied:
		a.reply(ctx, ctx.Sender(), heraldpb.ErrorFrame(f.Id, a.txnError(heraldpb.ErrorCode_THROTTLED, "new leader has not applied its log yet")))
		return
	}
	if req.FenceProducerId != 0 && a.awaitSessionFence(ctx, ctx.Sender(), f.Id, req) {
		return // answered once the fence is applied (zombie.go)
	}
	a.reply(ctx, ctx.Sender(), a.openTxnsFrame(f.Id, req.OlderThanMs))
}

// openTxnsFrame is the answer to a ListOpenTxns: the transactions open here
// for at least olderThanMs, oldest first.
func (a *Actor) openTxnsFrame(id uint64, olderThanMs uint32) *heraldpb.Frame {
	now := a.cfg.Clock.Now()
	minAge := time.Duration(olderThanMs) * time.Millisecond
	var out []*heraldpb.OpenTxn
	for k, o := range a.txn.open {
		if age := now.Sub(o.since); age >= minAge {
			out = append(out, &heraldpb.OpenTxn{ProducerId: k.pid, Epoch: k.epoch, Records: o.records, AgeMs: uint64(max(age, 0) / time.Millisecond)})
		}
	}
	slices.SortFunc(out, func(x, y *heraldpb.OpenTxn) int {
		if c := cmp.Compare(y.AgeMs, x.AgeMs); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(x.ProducerId, y.ProducerId), cmp.Compare(x.Epoch, y.Epoch))
	})
	if len(out) > maxListedTxns {
		out = out[:maxListedTxns]
	}
	return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_ListOpenTxnsResponse{ListOpenTxnsResponse: &heraldpb.ListOpenTxnsResponse{Txns: out}}}
}
