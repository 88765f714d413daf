package partition

import heraldpb "github.com/heraldmq/herald/proto"

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
}

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
		s.order = s.order[1:]
	}
	s.floor[pid] = epoch
	s.order = append(s.order, pid)
	a.m.sessionFences.Set(float64(len(s.floor)))
	return true
}

// onSessionFence is the sweep's news of a new session of producer pid's
// transactional id: its batches below epoch are refused here at once,
// and a leader writes the floor, so that every replica keeps it.
func (a *Actor) onSessionFence(pid uint64, epoch uint32) {
	if !a.fenceSession(pid, epoch) || !a.isLeader || a.rn == nil || !a.stampReady {
		return // (a replica that is not the leader learns it from the leader's entry)
	}
	if e := a.proposeEntry(&heraldpb.LogEntry{ProducerId: pid, SessionFence: epoch, BaseOffset: a.tail, AppendTimeMs: a.cfg.Clock.Now().UnixMilli()}); e != nil {
		// Kept in memory: the next leader may not know it (as before
		// floors were written).
		a.log.Warn("writing a session fence", "producer", pid, "epoch", epoch, "err", e.GetMessage())
	}
}

// applySessionFence applies a session fence entry.
func (a *Actor) applySessionFence(h heraldpb.LogEntryHeader) {
	a.fenceSession(h.ProducerID, h.SessionFence)
	a.txn.endedDirty = true // (saved with the state file, even if this replica knew it: the log's copy may be cut)
}

// sessionList is the session fences, oldest first (the state file's and
// the snapshots' form).
func (a *Actor) sessionList() []*heraldpb.TxnSessionFence {
	s := &a.sessions
	out := make([]*heraldpb.TxnSessionFence, 0, len(s.order))
	for _, pid := range s.order {
		out = append(out, &heraldpb.TxnSessionFence{ProducerId: pid, Epoch: s.floor[pid]})
	}
	return out
}

// restoreSessions adds fences (oldest first) to the session fences.
func (a *Actor) restoreSessions(fences []*heraldpb.TxnSessionFence) {
	for _, f := range fences {
		if f.GetProducerId() != 0 {
			a.fenceSession(f.GetProducerId(), f.GetEpoch())
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
