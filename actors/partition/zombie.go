package partition

import (
	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Zombie writes, written once. A transactional batch is written to its
// partition by its producer, without the coordinator (txnlog.go), so a
// partition learns that a session of a transactional id was replaced
// only when told. The coordinator tells every partition's leader when a
// new session starts: its sweep of the old session's producer
// (ListOpenTxnsRequest.fence_producer_id) carries the first epoch of the
// new session, and the partition refuses the producer's batches of an
// older epoch with PRODUCER_FENCED from then on, as a staged write is
// refused by the coordinator. The leader refuses them at once and writes
// the floor to the log (LogEntry.session_fence), so every replica applies
// it: a replica that becomes leader later knows it, and so does one that
// restarts (the transaction state file keeps the floors, and the log
// after the file's point holds the rest), or installs a snapshot (which
// carries them). A zombie's batch that reaches a partition before the
// sweep does is taken, and is never readable: the sweep aborts its
// transaction.

// maxSessionFences bounds the producers a partition keeps a floor for;
// past it the oldest is forgotten.
const maxSessionFences = 10_000

// sessionFences holds, per producer id, the epoch below which its
// transactional batches are refused; order is the ids, oldest first.
type sessionFences struct {
	floor map[uint64]uint32
	order []uint64
	// logged: the floors known to be in the log (applied from it, or
	// restored from the state file or a snapshot), which every later leader
	// knows; floor may be ahead of it (set by a sweep, not written yet).
	logged map[uint64]uint32
	// The leader's: the floors it proposed and has not applied, and the
	// sweeps that wait for them (answered once applied, so that a sweep
	// answered is a fence every later leader knows).
	proposed map[uint64]uint32
	waiting  []fenceWaiter
}

// fenceWaiter is a sweep waiting for its session fence to be applied.
type fenceWaiter struct {
	replyTo     *actor.PID
	frameID     uint64
	pid         uint64
	epoch       uint32
	olderThanMs uint32
}

// maxFenceWaiters bounds the sweeps waiting for their fence (and so the
// fences proposed and not applied); past it a sweep is answered THROTTLED
// (the coordinator sends it again).
const maxFenceWaiters = 10_000

// fenceSession refuses producer pid's batches of epochs below epoch, and
// reports whether that raised its floor.
func (a *Actor) fenceSession(pid uint64, epoch uint32) bool {
	s := &a.sessions
	if s.floor == nil {
		s.floor = map[uint64]uint32{}
	}
	if old, ok := s.floor[pid]; ok {
		s.floor[pid] = max(old, epoch)
		return epoch > old
	}
	if len(s.order) >= maxSessionFences {
		delete(s.floor, s.order[0])
		delete(s.logged, s.order[0])
		s.order = s.order[1:]
	}
	s.floor[pid] = epoch
	s.order = append(s.order, pid)
	a.m.sessionFences.Set(float64(len(s.floor)))
	return true
}

// awaitSessionFence writes the floor of a sweep's new session (req) to
// the log unless the log holds it (or a proposal of it is on its way),
// and reports whether the sweep waits for it: until the entry that holds
// it is applied. A leader that loses its term answers the waiting sweeps
// NOT_LEADER (failTxnPending), and the coordinator asks the next.
func (a *Actor) awaitSessionFence(ctx actor.Context, replyTo *actor.PID, id uint64, req *heraldpb.ListOpenTxnsRequest) bool {
	s := &a.sessions
	pid, epoch := req.FenceProducerId, req.FenceEpoch
	if s.logged[pid] >= epoch {
		return false // (in the log already)
	}
	if len(s.waiting) >= maxFenceWaiters {
		a.reply(ctx, replyTo, heraldpb.ErrorFrame(id, a.txnError(heraldpb.ErrorCode_THROTTLED, "%d sweeps wait for their session fences", len(s.waiting))))
		return true
	}
	if s.proposed[pid] < epoch {
		e := a.proposeEntry(&heraldpb.LogEntry{ProducerId: pid, SessionFence: epoch, BaseOffset: a.tail, AppendTimeMs: a.cfg.Clock.Now().UnixMilli()})
		if e != nil {
			a.reply(ctx, replyTo, heraldpb.ErrorFrame(id, e)) // (the coordinator sends it again)
			return true
		}
		if s.proposed == nil {
			s.proposed = map[uint64]uint32{}
		}
		s.proposed[pid] = epoch
	}
	s.waiting = append(s.waiting, fenceWaiter{replyTo: replyTo, frameID: id, pid: pid, epoch: epoch, olderThanMs: req.OlderThanMs})
	a.m.fenceWaiting.Set(float64(len(s.waiting)))
	return true
}

// applySessionFence applies a session fence entry, and answers the sweeps
// that waited for it.
func (a *Actor) applySessionFence(ctx actor.Context, h heraldpb.LogEntryHeader) {
	a.logSessionFence(h.ProducerID, h.SessionFence)
	a.txn.endedDirty = true // (saved with the state file, even if this replica knew it: the log's copy may be cut)
	s := &a.sessions
	if p, ok := s.proposed[h.ProducerID]; ok && p <= h.SessionFence {
		delete(s.proposed, h.ProducerID)
	}
	kept := s.waiting[:0]
	for _, w := range s.waiting {
		if w.pid == h.ProducerID && w.epoch <= h.SessionFence {
			a.reply(ctx, w.replyTo, a.openTxnsFrame(w.frameID, w.olderThanMs))
			continue
		}
		kept = append(kept, w)
	}
	clear(s.waiting[len(kept):])
	s.waiting = kept
	a.m.fenceWaiting.Set(float64(len(s.waiting)))
}

// sessionList is the session fences the log holds, oldest first (the
// state file's and the snapshots' form). A floor a sweep set and no entry
// holds yet is left out: it is the leader's to write, and a replica that
// restarts with it must not take it for written.
func (a *Actor) sessionList() []*heraldpb.TxnSessionFence {
	s := &a.sessions
	out := make([]*heraldpb.TxnSessionFence, 0, len(s.logged))
	for _, pid := range s.order {
		if e, ok := s.logged[pid]; ok {
			out = append(out, &heraldpb.TxnSessionFence{ProducerId: pid, Epoch: e})
		}
	}
	return out
}

// logSessionFence sets a floor the log holds.
func (a *Actor) logSessionFence(pid uint64, epoch uint32) {
	a.fenceSession(pid, epoch)
	s := &a.sessions
	if _, ok := s.floor[pid]; !ok {
		return // (forgotten at once: the bound is full of newer ones)
	}
	if s.logged == nil {
		s.logged = map[uint64]uint32{}
	}
	s.logged[pid] = max(s.logged[pid], epoch)
}

// restoreSessions adds fences (oldest first) that the log holds to the
// session fences.
func (a *Actor) restoreSessions(fences []*heraldpb.TxnSessionFence) {
	for _, f := range fences {
		if f.GetProducerId() != 0 {
			a.logSessionFence(f.GetProducerId(), f.GetEpoch())
		}
	}
	a.m.sessionFences.Set(float64(len(a.sessions.floor)))
}

// checkSession refuses a batch of producer pid's epoch when a newer
// session of its transactional id started.
func (a *Actor) checkSession(pid uint64, epoch uint32) *heraldpb.Error {
	floor, ok := a.sessions.floor[pid]
	if !ok || epoch >= floor {
		return nil
	}
	a.m.zombieRefused.Inc()
	return a.txnError(heraldpb.ErrorCode_PRODUCER_FENCED, "producer %d's session was replaced by a newer one of its transactional id (epochs below %d are fenced; this batch is of epoch %d)", pid, floor, epoch)
}
