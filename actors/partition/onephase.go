package partition

import (
	"fmt"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3/raftpb"
)

// Single-partition commits. A transaction that wrote only this partition
// may be committed by its last batch (ProduceRequest.commit_txn): once
// the batch is applied, the leader proposes the commit marker itself, as
// the coordinator's would be (txnlog.go), and answers the batch with the
// marker's offsets. Its coordinator is not asked: the session's fence
// (zombie.go) and the epochs and lease the coordinator grants (actors/txn
// onephase.go) keep a replaced session from committing so.
//
// A producer's transactions commit here in their order. The commit waits
// while an earlier transaction of its producer is open here with no end
// proposed, and, when the batch names the producer's previous
// transaction here (txn_commit_after), until that one's batches are here
// and it has ended or is ending; it is refused if that one did not
// commit. It waits parked, not refused, so that the producer's commits
// behind it keep flowing: at most maxParkedCommits, each at most
// parkedCommitWait, then answered THROTTLED (the producer sends it
// again). Its batch is written by then, so its sender is told at once
// (ProduceDrained) that its bytes are no longer held: admission stops
// counting them, and the commit it waits for, which may come on the same
// connection, is not refused over that connection's share.

// maxParkedCommits bounds the commits a partition's leader holds waiting.
const maxParkedCommits = 4096

// parkedCommitWait bounds how long a commit waits parked.
const parkedCommitWait = 10 * time.Second

// parkedCommit is a commit waiting, since when.
type parkedCommit struct {
	p     proposal
	since time.Time
}

// commitOnePhase commits k's transaction here once its last batch (p's)
// is applied, or parks it until it may.
func (a *Actor) commitOnePhase(ctx actor.Context, k pidEpoch, p proposal) {
	t := &a.txn
	fail := func(e *heraldpb.Error) {
		a.answer(ctx, p, func(id uint64, _ bool) *heraldpb.Frame { return heraldpb.ErrorFrame(id, e) })
	}
	if c := t.closing[k]; c != nil {
		// Its end is on its way already (a marker of its coordinator's):
		// answered with it if it commits, never a second end.
		if c.txnEnd == heraldpb.TxnMarker_TXN_MARKER_COMMIT {
			c.dups = append(c.dups, waiter{replyTo: p.replyTo, frameID: p.frameID})
			c.dups = append(c.dups, p.dups...)
			return
		}
		fail(a.txnError(heraldpb.ErrorCode_INVALID_TXN_STATE, "producer %d's transaction of epoch %d is ending here the other way", k.pid, k.epoch))
		return
	}
	o := t.open[k]
	switch {
	case o == nil:
		fail(a.txnError(heraldpb.ErrorCode_INVALID_TXN_STATE, "producer %d's transaction of epoch %d is not open here", k.pid, k.epoch))
		return
	case len(t.inflight[k]) > 0:
		fail(a.txnError(heraldpb.ErrorCode_INVALID_REQUEST, "producer %d's transaction of epoch %d has batches being written here after its commit batch", k.pid, k.epoch))
		return
	}
	if e := a.checkSession(k.pid, k.epoch); e != nil {
		fail(e)
		return
	}
	if wait, e := a.commitWaits(k, p.txnAfter); e != nil {
		fail(e)
		return
	} else if wait != "" {
		a.parkCommit(ctx, k, p, "%s", wait)
		return
	}
	a.closeAlone(k, p, o.records, a.cfg.Clock.Now().UnixMilli())
	a.queueMarker(ctx, queuedMarker{k: k, marker: heraldpb.TxnMarker_TXN_MARKER_COMMIT, count: o.records})
	a.unparkCommits(ctx, k.pid)
}

// commitWaits reports why k's commit must wait (an earlier transaction
// of its producer open here with no end proposed, or the one it names
// with after, its txn_commit_after + 1, not here or not ended yet), or
// the error that refuses it (the one it names did not commit); neither:
// it may commit now.
func (a *Actor) commitWaits(k pidEpoch, after uint64) (string, *heraldpb.Error) {
	t := &a.txn
	if e := t.earlierOpen(k); e != nil {
		return fmt.Sprintf("producer %d's transaction of epoch %d is still open here, before epoch %d", k.pid, *e, k.epoch), nil
	}
	if after == 0 {
		return "", nil
	}
	// The producer's transaction before it here: its batches must be
	// here, and it ended (committed) or is ending, so that a late batch of
	// it is never refused as of an epoch that ended after it.
	prev := pidEpoch{k.pid, uint32(after - 1)}
	end, ended := t.ended[k.pid]
	switch c := t.closing[prev]; {
	case c != nil && c.txnEnd == heraldpb.TxnMarker_TXN_MARKER_COMMIT:
	case c != nil || ended && end.epoch == prev.epoch && !end.committed:
		return "", a.txnError(heraldpb.ErrorCode_INVALID_TXN_STATE, "producer %d's transaction of epoch %d, before epoch %d here, did not commit", k.pid, prev.epoch, k.epoch)
	case !ended || end.epoch < prev.epoch:
		return fmt.Sprintf("producer %d's transaction of epoch %d waits for its epoch %d here", k.pid, k.epoch, prev.epoch), nil
	}
	return "", nil
}

// commitInline commits k's transaction in one entry with its only batch
// (req's records, info), as a plain produce's records take offsets
// (LogEntry.txn_commit_inline), when it may commit now: one synced write
// for the whole transaction. It reports whether it did (or failed it);
// false: the batch goes as any, and commits once applied.
func (a *Actor) commitInline(ctx actor.Context, k pidEpoch, p proposal, req *heraldpb.ProduceRequest, info heraldpb.BatchInfo) bool {
	t := &a.txn
	if t.open[k] != nil || len(t.inflight[k]) > 0 || req.BaseSequence != 0 || t.closing[k] != nil {
		return false
	}
	if _, ok := t.parked[k]; ok {
		return false
	}
	if wait, e := a.commitWaits(k, p.txnAfter); e != nil || wait != "" {
		return false // (waits, or is refused, once its batch is applied)
	}
	a.flushMarkers(ctx) // (queued markers take their offsets first)
	now := a.cfg.Clock.Now().UnixMilli()
	maxTs := info.MaxTimestamp
	if maxTs == 0 {
		maxTs = now
	}
	base := a.tail
	if e := a.proposeEntry(&heraldpb.LogEntry{BaseOffset: base, Count: uint32(info.Count), AppendTimeMs: now, MaxTimestampMs: maxTs, MaxPriority: uint32(info.MaxPriority),
		Records: req.Records, ProducerId: k.pid, ProducerEpoch: k.epoch, TxnCommitInline: true}); e != nil {
		a.answer(ctx, p, func(id uint64, _ bool) *heraldpb.Frame { return heraldpb.ErrorFrame(id, e) })
		return true
	}
	a.tail = base + int64(info.Count)
	a.closeAlone(k, p, uint32(info.Count), now)
	return true
}

// closeAlone notes p, k's commit alone of count records at now, as the
// end on its way (closing): its apply answers it.
func (a *Actor) closeAlone(k pidEpoch, p proposal, count uint32, now int64) {
	p.count, p.appendTime, p.txnEnd = count, now, heraldpb.TxnMarker_TXN_MARKER_COMMIT
	a.txn.closing[k] = &p
	a.m.commitsAlone.Inc()
}

// applyTxnInline applies a transaction committed with its records: they
// become readable as a plain produce's, and its epoch has ended here,
// committed.
func (a *Actor) applyTxnInline(ctx actor.Context, e raftpb.Entry, h heraldpb.LogEntryHeader, records []byte) {
	t := &a.txn
	k := pidEpoch{h.ProducerID, h.ProducerEpoch}
	if end, ok := t.ended[k.pid]; ok && end.epoch >= k.epoch {
		a.log.Error("a transaction committed inline of an epoch that ended already", "index", e.Index, "producer", k.pid, "epoch", k.epoch, "ended", end.epoch)
	}
	t.noteEnd(k.pid, txnEnd{epoch: k.epoch, committed: true, base: h.BaseOffset, count: h.Count})
	a.m.marker(true)
	a.applyRecords(e, h, records)
	q := t.closing[k]
	delete(t.closing, k)
	if q != nil && e.Term == a.term {
		a.answer(ctx, *q, func(id uint64, dup bool) *heraldpb.Frame {
			r := *q
			r.duplicate = dup
			return produced(id, a.cfg.Partition, h.BaseOffset, r)
		})
	}
	a.publishTxn()
	a.unparkCommits(ctx, k.pid)
}

// parkCommit holds p, k's commit, until an earlier transaction of its
// producer ends or is ending (unparkCommits); THROTTLED (why) when too
// many wait.
func (a *Actor) parkCommit(ctx actor.Context, k pidEpoch, p proposal, why string, args ...any) {
	t := &a.txn
	if w, ok := t.parked[k]; ok {
		// (a retry that was not joined to it: answered with it)
		a.drained(ctx, p)
		w.p.dups = append(w.p.dups, waiter{replyTo: p.replyTo, frameID: p.frameID})
		w.p.dups = append(w.p.dups, p.dups...)
		t.parked[k] = w
		return
	}
	if len(t.parked) >= maxParkedCommits {
		e := a.txnError(heraldpb.ErrorCode_THROTTLED, why, args...)
		a.answer(ctx, p, func(id uint64, _ bool) *heraldpb.Frame { return heraldpb.ErrorFrame(id, e) })
		return
	}
	a.drained(ctx, p)
	p.drained = true // (retries joining it from now on are told as they join)
	t.parked[k] = parkedCommit{p: p, since: a.cfg.Clock.Now()}
	a.m.commitsWaiting.Set(float64(len(t.parked)))
}

// drained tells p's senders (its own and its dups', unless told already)
// that their requests' bytes are held no more (ProduceDrained): p parks.
func (a *Actor) drained(ctx actor.Context, p proposal) {
	if p.drained {
		return
	}
	tellDrained(ctx, waiter{replyTo: p.replyTo, frameID: p.frameID})
	for _, w := range p.dups {
		tellDrained(ctx, w)
	}
}

// tellDrained sends ProduceDrained to w. Only a connection's session
// gets it: a commit batch comes from a client's connection alone (the
// cluster relay, whose futures take any answer as the answer, refuses
// produces with a producer id: actors/topic cluster.go).
func tellDrained(ctx actor.Context, w waiter) {
	if w.replyTo != nil {
		ctx.Send(w.replyTo, &heraldpb.ProduceDrained{FrameId: w.frameID})
	}
}

// unparkCommits tries again the commits of producer pid that wait,
// oldest epoch first, until none moves.
func (a *Actor) unparkCommits(ctx actor.Context, pid uint64) {
	t := &a.txn
	if len(t.parked) == 0 {
		return
	}
	if t.unparking {
		t.unparkRan = true // (the loop below goes round again)
		return
	}
	t.unparking = true
	defer func() { t.unparking = false }()
	for {
		t.unparkRan = false
		var ks []pidEpoch
		for k := range t.parked {
			if k.pid == pid {
				ks = append(ks, k)
			}
		}
		slices.SortFunc(ks, func(x, y pidEpoch) int { return int(int64(x.epoch) - int64(y.epoch)) })
		for _, k := range ks {
			w, ok := t.parked[k]
			if !ok {
				continue
			}
			delete(t.parked, k)
			a.commitOnePhase(ctx, k, w.p) // (parks it again if it still waits)
		}
		a.m.commitsWaiting.Set(float64(len(t.parked)))
		if !t.unparkRan {
			return
		}
	}
}

// expireParked answers THROTTLED the commits parked longer than
// parkedCommitWait (the producer sends them again), and, with all, every
// one (the leader lost its term).
func (a *Actor) expireParked(ctx actor.Context, all *heraldpb.Error) {
	t := &a.txn
	now := a.cfg.Clock.Now()
	for k, w := range t.parked {
		e := all
		if e == nil {
			if now.Sub(w.since) < parkedCommitWait {
				continue
			}
			e = a.txnError(heraldpb.ErrorCode_THROTTLED, "producer %d's transaction of epoch %d waited %v here for an earlier one to end", k.pid, k.epoch, parkedCommitWait)
		}
		delete(t.parked, k)
		a.answer(ctx, w.p, func(id uint64, _ bool) *heraldpb.Frame { return heraldpb.ErrorFrame(id, e) })
	}
	a.m.commitsWaiting.Set(float64(len(t.parked)))
}
