package partition

import (
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
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
// again).

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
	if e := t.earlierOpen(k); e != nil {
		a.parkCommit(ctx, k, p, "producer %d's transaction of epoch %d is still open here, before epoch %d", k.pid, *e, k.epoch)
		return
	}
	if p.txnAfter > 0 {
		// The producer's transaction before it here: its batches must be
		// here, and it ended (committed) or is ending, so that a late
		// batch of it is never refused as of an epoch that ended after it.
		prev := pidEpoch{k.pid, uint32(p.txnAfter - 1)}
		end, ended := t.ended[k.pid]
		switch c := t.closing[prev]; {
		case c != nil && c.txnEnd == heraldpb.TxnMarker_TXN_MARKER_COMMIT:
		case c != nil || ended && end.epoch == prev.epoch && !end.committed:
			fail(a.txnError(heraldpb.ErrorCode_INVALID_TXN_STATE, "producer %d's transaction of epoch %d, before epoch %d here, did not commit", k.pid, prev.epoch, k.epoch))
			return
		case !ended || end.epoch < prev.epoch:
			a.parkCommit(ctx, k, p, "producer %d's transaction of epoch %d waits for its epoch %d here", k.pid, k.epoch, prev.epoch)
			return
		}
	}
	p.count, p.appendTime, p.txnEnd = o.records, a.cfg.Clock.Now().UnixMilli(), heraldpb.TxnMarker_TXN_MARKER_COMMIT
	t.closing[k] = &p
	a.m.commitsAlone.Inc()
	a.queueMarker(ctx, queuedMarker{k: k, marker: heraldpb.TxnMarker_TXN_MARKER_COMMIT, count: o.records})
	a.unparkCommits(ctx, k.pid)
}

// parkCommit holds p, k's commit, until an earlier transaction of its
// producer ends or is ending (unparkCommits); THROTTLED (why) when too
// many wait.
func (a *Actor) parkCommit(ctx actor.Context, k pidEpoch, p proposal, why string, args ...any) {
	t := &a.txn
	if w, ok := t.parked[k]; ok {
		// (a retry that was not joined to it: answered with it)
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
	t.parked[k] = parkedCommit{p: p, since: a.cfg.Clock.Now()}
	a.m.commitsWaiting.Set(float64(len(t.parked)))
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
