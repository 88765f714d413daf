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
// refused by the coordinator. The floor is kept in memory: a replica that
// becomes leader without having been told (or after forgetting it) takes
// such a batch, which is never readable (the sweep aborted its
// transaction, or the next one does) and fails its producer's Commit.

// maxSessionFences bounds the producers a partition keeps a floor for;
// past it the oldest is forgotten.
const maxSessionFences = 10_000

// sessionFences holds, per producer id, the epoch below which its
// transactional batches are refused; order is the ids, oldest first.
type sessionFences struct {
	floor map[uint64]uint32
	order []uint64
}

// fenceSession refuses producer pid's batches of epochs below epoch.
func (a *Actor) fenceSession(pid uint64, epoch uint32) {
	s := &a.sessions
	if s.floor == nil {
		s.floor = map[uint64]uint32{}
	}
	if old, ok := s.floor[pid]; ok {
		s.floor[pid] = max(old, epoch)
		return
	}
	if len(s.order) >= maxSessionFences {
		delete(s.floor, s.order[0])
		s.order = s.order[1:]
	}
	s.floor[pid] = epoch
	s.order = append(s.order, pid)
	a.m.sessionFences.Set(float64(len(s.floor)))
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
