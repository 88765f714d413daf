package partition

import (
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Idempotent produce.
//
// Every replica keeps a table of the recent batches of each idempotent
// producer (producerTable), built when committed entries are applied: each
// entry carries the producer id and base sequence the leader stamped, so
// replicas that apply the same log build the same table. The leader checks
// a produce against that table plus its own proposals not applied yet
// (Actor.inflight): an exact retry of a committed batch is answered with
// the original offsets, a retry of one in flight waits for that proposal's
// outcome, a batch that does not follow the producer's last one gets
// OUT_OF_ORDER_SEQUENCE, and a producer the table does not know may start
// anywhere.
//
// A new leader may hold entries of earlier terms it has not applied; one of
// them may be the batch a producer now retries, proposed by the old leader.
// So it answers idempotent produces THROTTLED until it has applied an entry
// of its own term: raft's empty entry at the start of the term, committed
// after all of them. Its in-flight list starts empty and is dropped
// whenever leadership changes.
//
// The table survives a restart through a file (Config.ProducerStatePath)
// saved with the index and term of the entry it covers; at open the
// entries after it are read from the log off the actor
// (rebuildProducers), and applies that happen meanwhile go to a table of
// their own, replayed on top when the read is done. A file that does not
// match the log (missing, damaged, ahead of the log, of another term, or
// older than the log's first entry) is ignored, and the table is rebuilt
// from the whole log: producers whose batches are all gone are then
// unknown, which is safe. A follower that installs a raft snapshot starts
// with an empty table.

// producersLoaded reports the end of a rebuild of the producer table.
type producersLoaded struct {
	gen, run uint64
	table    *producerTable
	err      error
}

// producersSaved reports the end of a save of the producer state file.
type producersSaved struct {
	gen uint64
	err error
}

// rebuildChunkBytes bounds the entries one step of a rebuild reads.
var rebuildChunkBytes uint64 = 4 << 20

// errRebuildStopped ends a rebuild whose actor reopened or stopped.
var errRebuildStopped = errors.New("rebuild stopped")

// recordEntry adds the batch of a committed entry to t, if an idempotent
// producer wrote it. It reports the producer id and the entry's header.
func recordEntry(t *producerTable, e raftpb.Entry) (heraldpb.LogEntryHeader, bool) {
	if e.Type != raftpb.EntryNormal || len(e.Data) == 0 {
		return heraldpb.LogEntryHeader{}, false
	}
	h, _, err := heraldpb.ScanLogEntry(e.Data)
	if err != nil {
		return h, false
	}
	t.applyTxnEpoch(h, e.Index)
	if !validSeq(h) {
		return h, false
	}
	t.record(h.ProducerID, seqBatch{seq: h.BaseSequence, count: h.Count, offset: h.BaseOffset})
	return h, true
}

// validSeq reports whether h is an idempotent batch with a sane sequence
// range (the leader checked it before stamping it). A transaction's commit
// marker has a producer id and records too, but is not one (apply never
// records it: txnlog.go).
func validSeq(h heraldpb.LogEntryHeader) bool {
	return h.ProducerID != 0 && h.Count > 0 && h.TxnMarker == heraldpb.TxnMarker_TXN_MARKER_NONE &&
		h.BaseSequence >= 0 && h.BaseSequence <= maxInt64-int64(h.Count)
}

// rebuildProducers records into t the idempotent batches of the entries
// [from, to] of store, and returns it. Entries that retention removes
// meanwhile make it start over from the log's new first entry with an
// empty table (a table of a log suffix is safe; one with a hole is not).
// It runs on its own goroutine; closing stop ends it.
func rebuildProducers(store Storage, t *producerTable, from, to uint64, stop <-chan struct{}) (*producerTable, error) {
	for from <= to {
		select {
		case <-stop:
			return nil, errRebuildStopped
		default:
		}
		ents, err := store.Entries(from, to+1, rebuildChunkBytes)
		if errors.Is(err, raft.ErrCompacted) {
			first, ferr := store.FirstIndex()
			if ferr != nil {
				return nil, ferr
			}
			// The epoch stays: the fences that go with the entries hold.
			nt := newProducerTable(t.limit)
			nt.raiseEpochs(t.epochList())
			t, from = nt, first
			continue
		}
		if err != nil {
			return nil, err
		}
		if len(ents) == 0 {
			return nil, fmt.Errorf("no entries at index %d of a log ending at %d or later", from, to)
		}
		for _, e := range ents {
			recordEntry(t, e)
		}
		from = ents[len(ents)-1].Index + 1
	}
	return t, nil
}

// openProducers loads the producer table for the log just opened, whose
// entries up to applied are applied, and starts the read of what the saved
// file lacks.
func (a *Actor) openProducers(applied uint64) {
	var prev epochList // a reopen keeps the epochs it had (the file may be older)
	if a.producers != nil {
		prev = a.txnEpochSeen()
	}
	a.stopProducerLoad()
	a.inflight = make(map[uint64][]inflightSeq)
	a.termApplied = false
	a.producers = newProducerTable(a.cfg.MaxProducers)
	a.prodLoading, a.prodDirty = false, true
	a.appliedTerm, _ = a.store.Term(applied)
	first, _ := a.store.FirstIndex()
	base, index, term, err := loadProducers(a.cfg.ProducerStatePath, a.cfg.MaxProducers)
	if err != nil {
		a.log.Warn("producer state file unusable; rebuilding the producer table from the log", "path", a.cfg.ProducerStatePath, "err", err)
	}
	// The file's epochs hold even when its batches do not match the log:
	// every epoch this partition applied was a fence.
	a.prodEpochFloor = prev
	if base != nil {
		for i, e := range base.epochList() {
			a.prodEpochFloor[i] = max(prev[i], e)
		}
	}
	from := first
	if base != nil {
		t, terr := a.store.Term(index)
		switch {
		case index > applied:
			a.log.Warn("producer state file is ahead of the log; rebuilding the producer table from the log", "file_index", index, "applied", applied)
			base = nil
		case index+1 < first:
			a.log.Info("producer state file is older than the log's first entry; rebuilding the producer table from the log", "file_index", index, "first", first)
			base = nil
		case terr != nil || t != term:
			a.log.Warn("producer state file does not match the log; rebuilding the producer table from the log", "file_index", index, "file_term", term, "log_term", t, "err", terr)
			base = nil
		default:
			from = index + 1
			a.prodSavedIndex, a.prodDirty = index, false
		}
	}
	if base == nil {
		base = newProducerTable(a.cfg.MaxProducers)
	}
	base.raiseEpochs(a.prodEpochFloor)
	if from > applied {
		a.producers = base
		a.publishProducers()
		return
	}
	// Until the read ends, a.producers holds only what is applied from now
	// on, to be replayed on top of the table read.
	a.prodLoading = true
	a.prodRun++
	stop := make(chan struct{})
	a.prodStop = stop
	store, gen, run, sys, self := a.store, a.gen, a.prodRun, a.sys, a.self
	a.log.Info("rebuilding the producer table from the log", "from_index", from, "to_index", applied)
	go func() {
		t, err := rebuildProducers(store, base, from, applied, stop)
		if !errors.Is(err, errRebuildStopped) {
			sys.Root.Send(self, producersLoaded{gen: gen, run: run, table: t, err: err})
		}
	}()
}

func (a *Actor) stopProducerLoad() {
	if a.prodStop != nil {
		close(a.prodStop)
		a.prodStop = nil
	}
}

func (a *Actor) onProducersLoaded(ctx actor.Context, m producersLoaded) {
	if m.gen != a.gen || m.run != a.prodRun || !a.prodLoading || a.store == nil {
		return // of a log since reopened, or replaced by a snapshot
	}
	a.prodStop = nil
	if m.err != nil {
		a.storageFailed(ctx, fmt.Errorf("rebuilding the producer table: %w", m.err))
		return
	}
	a.producers.replayOnto(m.table)
	a.producers, a.prodLoading, a.prodDirty = m.table, false, true
	a.log.Info("producer table rebuilt", "producers", a.producers.len())
	a.publishProducers()
}

// resetProducers empties the table after a snapshot replaced the log: the
// batches before it are not in the log, so their producers are unknown.
func (a *Actor) resetProducers() {
	a.stopProducerLoad()
	a.prodRun++
	epoch := a.txnEpochSeen() // the fences of the entries that go still hold
	a.producers = newProducerTable(a.cfg.MaxProducers)
	a.producers.raiseEpochs(epoch)
	a.prodEpochFloor = epoch
	a.prodLoading, a.prodDirty = false, true
	a.publishProducers()
}

// applyProducerBatch records a committed idempotent batch and drops the
// proposal it settles from the in-flight list.
func (a *Actor) applyProducerBatch(e raftpb.Entry, h heraldpb.LogEntryHeader) {
	if !validSeq(h) {
		return
	}
	ev := a.producers.evictions
	a.producers.record(h.ProducerID, seqBatch{seq: h.BaseSequence, count: h.Count, offset: h.BaseOffset})
	if n := a.producers.evictions - ev; n > 0 && !a.prodLoading {
		a.m.idemEvictions.Add(float64(n))
	}
	a.prodDirty = true
	fl := a.inflight[h.ProducerID]
	for i, f := range fl {
		if f.term == e.Term && f.offset == h.BaseOffset {
			fl = append(fl[:i], fl[i+1:]...)
			break
		}
	}
	if len(fl) == 0 {
		delete(a.inflight, h.ProducerID)
	} else {
		a.inflight[h.ProducerID] = fl
	}
}

// idempotentReady reports whether the leader may check idempotent produces:
// the table is complete and every entry of earlier terms is applied.
func (a *Actor) idempotentReady() bool {
	return a.isLeader && a.stampReady && a.termApplied && !a.prodLoading
}

// notIdempotentReady is the THROTTLED answer to an idempotent produce or
// a fence while the leader may not check them (nil: it may).
func (a *Actor) notIdempotentReady() *heraldpb.Error {
	if a.idempotentReady() {
		return nil
	}
	e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "partition %s-%d: new leader is still applying its log", a.cfg.Topic, a.cfg.Partition)
	e.RetryAfterMs = uint32(a.cfg.ThrottleRetryAfter / time.Millisecond)
	if a.prodLoading {
		e.Message = fmt.Sprintf("partition %s-%d: the producer table is being rebuilt from the log", a.cfg.Topic, a.cfg.Partition)
		e.RetryAfterMs = uint32(max(a.cfg.ThrottleRetryAfter, 100*time.Millisecond) / time.Millisecond)
	}
	a.m.throttled.Inc()
	return e
}

// checkIdempotent applies the sequence rules to an idempotent produce of
// count records. It returns true when the request was answered (a
// duplicate, a wait for an in-flight proposal, or an error) and must not be
// proposed.
func (a *Actor) checkIdempotent(ctx actor.Context, replyTo *actor.PID, id uint64, req *heraldpb.ProduceRequest, count uint32) bool {
	fail := func(e *heraldpb.Error) bool { a.reply(ctx, replyTo, heraldpb.ErrorFrame(id, e)); return true }
	if e := a.notIdempotentReady(); e != nil {
		return fail(e)
	}
	if e := a.checkTxnEpoch(req.Fencer, req.TxnEpoch); e != nil {
		return fail(e)
	}
	seq := req.BaseSequence
	if seq < 0 || seq > maxInt64-int64(count) {
		return fail(heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "base_sequence %d is out of range for %d records", seq, count))
	}
	v, match, expected := checkSequence(a.producers.get(req.ProducerId), a.inflight[req.ProducerId], seq, count)
	switch v {
	case seqDuplicate:
		a.m.duplicates.Inc()
		a.reply(ctx, replyTo, produced(id, a.cfg.Partition, match.offset, proposal{count: count, duplicate: true}))
		return true
	case seqInFlight:
		a.m.duplicates.Inc()
		a.awaitInFlight(ctx, replyTo, id, req.Acks, match)
		return true
	case seqOutOfOrder:
		a.m.outOfOrder.Inc()
		return fail(heraldpb.NewError(heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE,
			"partition %s-%d: producer %016x sent sequence %d (%d records); the next expected is %d", a.cfg.Topic, a.cfg.Partition, req.ProducerId, seq, count, expected))
	}
	return false
}

// awaitInFlight answers a retry of a batch this leader proposed and has
// not applied yet together with the proposal: with its offsets, or with
// its error.
func (a *Actor) awaitInFlight(ctx actor.Context, replyTo *actor.PID, id uint64, acks heraldpb.Acks, f inflightSeq) {
	if acks == heraldpb.Acks_ACKS_NONE {
		a.reply(ctx, replyTo, produced(id, a.cfg.Partition, -1, proposal{count: f.count, duplicate: true}))
		return
	}
	k := proposalKey{term: f.term, base: f.offset}
	if p, ok := a.pending[k]; ok {
		p.dups = append(p.dups, waiter{replyTo: replyTo, frameID: id})
		a.pending[k] = p
		return
	}
	// The proposal's own producer was answered already (acks=leader) or
	// wanted no answer: this retry waits for the commit.
	a.pending[k] = proposal{replyTo: replyTo, frameID: id, acks: heraldpb.Acks_ACKS_ALL, count: f.count, duplicate: true}
}

// saveProducers saves the producer table when it changed or the log moved
// since the last save: at once (the actor is stopping) or on a goroutine of
// its own.
func (a *Actor) saveProducers(now bool) {
	a.prodLastSave = a.ticks
	if a.cfg.ProducerStatePath == "" || a.prodSaving || a.prodLoading || a.producers == nil || (!a.prodDirty && a.prodSavedIndex == a.applied) {
		return
	}
	data := a.producers.encode(a.applied, a.appliedTerm)
	a.prodDirty, a.prodSavedIndex = false, a.applied
	if now {
		if err := replaceFile(a.cfg.ProducerStatePath, data); err != nil {
			a.log.Warn("saving the producer table", "err", err)
		}
		return
	}
	a.prodSaving = true
	path, gen, sys, self := a.cfg.ProducerStatePath, a.gen, a.sys, a.self
	go func() { sys.Root.Send(self, producersSaved{gen: gen, err: replaceFile(path, data)}) }()
}

func (a *Actor) onProducersSaved(m producersSaved) {
	a.prodSaving = false
	if m.err != nil {
		a.log.Warn("saving the producer table", "err", m.err)
		a.prodDirty = true
	}
}

// publishProducers publishes the table's size and whether the leader takes
// idempotent produces.
func (a *Actor) publishProducers() {
	if a.producers != nil {
		a.m.producers.Set(float64(a.producers.len()))
	}
	a.stats.Idempotent.Store(a.idempotentReady())
}
