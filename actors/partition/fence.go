package partition

import (
	"go.etcd.io/raft/v3"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Fencing the appends of the broker's own writers: the transaction
// coordinator's and the scheduler's.
//
// The transaction coordinator (actors/txn) appends committed records to
// their partitions and, after a failover of __txn, its successor looks for
// them by scanning the partitions before appending what it does not find.
// An append the deposed coordinator had already sent could land after
// that scan and be written twice. So each coordinator stamps its appends
// with its epoch (ProduceRequest.txn_epoch: the term in which its node's
// replica of __txn was elected), and before it scans a partition it sends
// a fence: a produce with its epoch and no records. The leader writes the
// fence as an entry without records (it holds no offset), answers once it
// is applied, and from then on refuses every append of an older epoch with
// PRODUCER_FENCED. An older append is therefore either in the log before
// the fence, where the scan that follows finds it, or never written.
//
// Every replica keeps the highest epoch it applied in its producer table
// (saved with it, and rebuilt from the log like it), and the leader checks
// against that and against what it proposed and has not applied yet
// (txnProposed). Like idempotent produces, fences and epoch checks wait
// until a new leader has applied its log (idempotentReady): only then does
// its table hold every fence of earlier terms.
//
// The scheduler (actors/scheduler) has the same window: after __schedule's
// leadership moves, its successor looks for the fires the last one had
// announced, and one of those still on its way could land after the look
// and be appended twice. It fences the same way, with the term of
// __schedule as its epoch. Each such writer is a fencer
// (ProduceRequest.fencer) with epochs, fences and resets of its own.

// txnEpochNow is the highest epoch of fencer f this leader knows of.
func (a *Actor) txnEpochNow(f heraldpb.Fencer) uint64 {
	return max(a.producers.epochs[f].epoch, a.txnProposed[f])
}

// checkTxnEpoch refuses an append of fencer f of an epoch older than the
// partition's (nil: it may go on). The caller checked idempotentReady.
func (a *Actor) checkTxnEpoch(f heraldpb.Fencer, epoch uint64) *heraldpb.Error {
	if epoch == 0 {
		return nil
	}
	if now := a.txnEpochNow(f); epoch < now {
		return a.fencedErr(f, epoch, now)
	}
	return nil
}

func (a *Actor) fencedErr(f heraldpb.Fencer, epoch, now uint64) *heraldpb.Error {
	a.m.txnFenced.Inc()
	who := "a transaction coordinator"
	if f == heraldpb.Fencer_FENCER_SCHEDULER {
		who = "a scheduler"
	}
	e := heraldpb.NewError(heraldpb.ErrorCode_PRODUCER_FENCED,
		"partition %s-%d: %s of epoch %d was fenced by epoch %d", a.cfg.Topic, a.cfg.Partition, who, epoch, now)
	e.Epoch = now
	if cur := a.producers.epochs[f]; now == cur.epoch {
		e.EpochIndex = cur.index
	}
	return e
}

// validFencer refuses a fencer the partition does not know.
func validFencer(f heraldpb.Fencer) *heraldpb.Error {
	if f < 0 || f >= heraldpb.NumFencers {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "unknown fencer %d", f)
	}
	return nil
}

// onFence serves a fence (a produce with txn_epoch and no records): it is
// answered once its entry is applied.
func (a *Actor) onFence(ctx actor.Context, replyTo *actor.PID, id uint64, req *heraldpb.ProduceRequest) {
	fail := func(e *heraldpb.Error) { a.reply(ctx, replyTo, heraldpb.ErrorFrame(id, e)) }
	if e := a.notIdempotentReady(); e != nil {
		fail(e)
		return
	}
	if req.Acks != heraldpb.Acks_ACKS_ALL {
		fail(heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "a fence needs acks=all"))
		return
	}
	fr := req.Fencer // (checked by onProduce)
	if from := req.TxnEpochResetFrom; from > req.TxnEpoch {
		// A reset: only over exactly the epoch the coordinator was
		// refused with, set by the entry it was told of; a fence or an
		// append of that epoch since wins (its apply checks the same).
		// (One that would not lower the epoch is a plain fence.)
		now := a.txnEpochNow(fr)
		if now == req.TxnEpoch && now == a.producers.epochs[fr].epoch {
			a.reply(ctx, replyTo, fenced(id, a.cfg.Partition, a.hw)) // done already: a retry
			return
		}
		if a.fencing[fr] != nil {
			e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "partition %s-%d: a fence is being written", a.cfg.Topic, a.cfg.Partition)
			e.RetryAfterMs = 100
			fail(e)
			return
		}
		if now != from || a.producers.epochs[fr].index != req.TxnEpochResetIndex {
			fail(a.fencedErr(fr, req.TxnEpoch, now))
			return
		}
		if a.proposeFence(ctx, replyTo, id, fr, req.TxnEpoch, from, req.TxnEpochResetIndex) {
			// Proposals before it are applied before it; the ones after
			// it raise the epoch again from what it sets.
			a.txnProposed[fr] = 0
		}
		return
	}
	if e := a.checkTxnEpoch(fr, req.TxnEpoch); e != nil {
		fail(e)
		return
	}
	// Written even when the partition has the epoch already: the entry
	// marks that a live coordinator of this epoch fenced it, which a reset
	// (over the same epoch, left by a lost __txn) must not undo.
	if k := a.fencing[fr]; k != nil && k.fence == req.TxnEpoch {
		// The same fence again (a retry): answered with the one proposed.
		p := a.pending[*k]
		p.dups = append(p.dups, waiter{replyTo: replyTo, frameID: id})
		a.pending[*k] = p
		return
	}
	if a.proposeFence(ctx, replyTo, id, fr, req.TxnEpoch, 0, 0) {
		a.txnProposed[fr] = max(a.txnProposed[fr], req.TxnEpoch)
	}
}

// proposeFence proposes a fence entry of fencer fr and epoch (resetting
// from resetFrom when not 0); its producer is answered when it is
// applied. It reports whether the proposal was made.
func (a *Actor) proposeFence(ctx actor.Context, replyTo *actor.PID, id uint64, fr heraldpb.Fencer, epoch, resetFrom, resetIndex uint64) bool {
	a.flushMarkers(ctx) // (queued markers take their offsets first)
	base := a.tail
	if e := a.proposeEntry(&heraldpb.LogEntry{BaseOffset: base, TxnEpoch: epoch, TxnEpochResetFrom: resetFrom, TxnEpochResetIndex: resetIndex, Fencer: fr}); e != nil {
		a.reply(ctx, replyTo, heraldpb.ErrorFrame(id, e))
		return false
	}
	k := proposalKey{term: a.term, base: base, fence: epoch, fencer: fr}
	a.pending[k] = proposal{replyTo: replyTo, frameID: id, acks: heraldpb.Acks_ACKS_ALL}
	a.fencing[fr] = &k
	return true
}

// applyFence answers the fence's producer, if this replica proposed it
// (its epoch is in the table already).
func (a *Actor) applyFence(ctx actor.Context, e raftpb.Entry, h heraldpb.LogEntryHeader) {
	k := proposalKey{term: e.Term, base: h.BaseOffset, fence: h.TxnEpoch, fencer: h.Fencer}
	if f := a.fencing[h.Fencer]; f != nil && *f == k {
		a.fencing[h.Fencer] = nil
	}
	p, ok := a.pending[k]
	if !ok {
		return
	}
	delete(a.pending, k)
	hw := a.hw
	a.answer(ctx, p, func(id uint64, _ bool) *heraldpb.Frame { return fenced(id, a.cfg.Partition, hw) })
}

// fenced is the answer to a fence: no records, at the high watermark.
func fenced(id uint64, part uint32, hw int64) *heraldpb.Frame {
	return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{Partition: part, BaseOffset: hw}}}
}

// epochSnapshots adds the replica's epochs to the snapshots raft sends a
// follower that fell behind the log's start (SnapshotData.txn_epoch,
// scheduler_epoch), so that the fences in the entries the snapshot
// replaces still hold there. Raft calls Snapshot on the actor's goroutine.
type epochSnapshots struct {
	raft.Storage
	a *Actor
}

func (s epochSnapshots) Snapshot() (raftpb.Snapshot, error) {
	snap, err := s.Storage.Snapshot()
	if err != nil || s.a.producers == nil {
		return snap, err
	}
	var sd heraldpb.SnapshotData
	if err := proto.Unmarshal(snap.Data, &sd); err != nil {
		return snap, err
	}
	seen := s.a.txnEpochSeen()
	sd.TxnEpoch = max(sd.TxnEpoch, seen[heraldpb.Fencer_FENCER_TXN_COORDINATOR])
	sd.SchedulerEpoch = max(sd.SchedulerEpoch, seen[heraldpb.Fencer_FENCER_SCHEDULER])
	sd.TxnEnded = s.a.txn.endedList()    // (txnlog.go)
	sd.SessionFences = s.a.sessionList() // (zombie.go)
	if snap.Data, err = proto.Marshal(&sd); err != nil {
		return raftpb.Snapshot{}, err
	}
	return snap, nil
}

// txnEpochSeen is the highest epoch of each fencer this replica has
// applied: the table's, and while the table is rebuilt, the one it had
// before.
func (a *Actor) txnEpochSeen() epochList {
	l := a.producers.epochList()
	for i, e := range a.prodEpochFloor {
		l[i] = max(l[i], e)
	}
	return l
}
