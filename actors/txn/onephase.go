package txn

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Single-partition commits. A producer writing once may commit a
// transaction that wrote one partition on that partition alone: its last
// batch carries commit_txn, and the partition commits it as a marker
// would once the batch is applied (actors/partition txnlog.go), one
// synced write instead of three (batch, decision, marker) and no request
// to the coordinator. The coordinator is not asked, so two bounds keep a
// replaced session from committing that way after the new one started:
//   - Epochs. The producer commits so only epochs below the one the
//     coordinator last answered plus onePhaseEpochs; a new session's epoch
//     is sessionEpochGap past the current one, past all of those, and the
//     new session's sweep fences every partition below it (markers.go).
//   - Time. It commits so only for onePhaseLease from when it sent the
//     request the coordinator last answered. A new session whose fence has
//     not reached every partition waits for the old session's lease to run
//     out (leaseLeft) rather than FenceWait alone, so a partition that the
//     sweep could not reach cannot take the old session's commit after the
//     new session started.
// The producer tells the coordinator of the epochs so ended with its next
// EndTxn (one_phase_from): the coordinator moves the id's epoch to that
// EndTxn's (jumpOnePhase), then handles it as any.

// onePhaseEpochs is how many epochs past the one the coordinator last
// answered a session may commit alone; onePhaseLease how long after it
// sent that request (Options.onePhaseLease in tests).
const (
	onePhaseEpochs = 1024
	onePhaseLease  = 10 * time.Second
)

// lease is the lease granted; the coordinator counts it with half again
// as margin: the producer's clock may run slower, and its last commit may
// still be on its way to the partition.
func (c *Coordinator) lease() (granted, counted time.Duration) {
	granted = onePhaseLease
	if c.o.onePhaseLease > 0 {
		granted = c.o.onePhaseLease
	}
	return granted, granted + granted/2
}

// renewLease notes that m's session sent a request now: its lease (a
// producer counts it from when it sent the request) ends at most the
// lease counted from now.
func (c *Coordinator) renewLease(m *txnMeta) {
	_, counted := c.lease()
	m.leaseUntil = c.o.Now().Add(counted)
}

// leaseLeft is how long m's session may still commit on a partition
// alone: 0 for a session that said it would not (InitProducerIdRequest.
// one_phase). A coordinator that loaded recently does not know when the
// session last asked, nor what it said, so counts from its load.
func (c *Coordinator) leaseLeft(m *txnMeta) time.Duration {
	if !m.onePhase && m.onePhaseKnown {
		return 0
	}
	until := m.leaseUntil
	_, counted := c.lease()
	if l := c.loadedAt.Add(counted); l.After(until) {
		until = l
	}
	return until.Sub(c.o.Now())
}

// jumpOnePhase handles req's one_phase_from: the transactions from that
// epoch up to req's ended on their partitions, so m's epoch moves to
// req's (one write to __txn), and req is then handled as any EndTxn. It
// reports whether it took req.
func (c *Coordinator) jumpOnePhase(ctx actor.Context, m *txnMeta, f *heraldpb.Frame, req *heraldpb.EndTxnRequest, to *actor.PID, w endWaiter) bool {
	from := req.GetOnePhaseFrom()
	switch {
	case req.ProducerId != m.pid || req.ProducerEpoch < m.session || req.ProducerEpoch <= m.epoch:
		return false // fenced, or a retry once moved: answered as any
	case req.Manual || len(req.GroupOffsets) > 0 && len(req.Written) == 0:
		w.fail(ctx, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "one_phase_from goes with a producer's end of a transaction written once"))
		return true
	case from != m.epoch:
		w.fail(ctx, heraldpb.NewError(heraldpb.ErrorCode_INVALID_TXN_STATE,
			"transactional id %q: its transactions from epoch %d ended on their partitions, but its current epoch here is %d", m.id, from, m.epoch))
		return true
	case req.ProducerEpoch-from > onePhaseEpochs+maxPiped:
		w.fail(ctx, heraldpb.NewError(heraldpb.ErrorCode_INVALID_TXN_STATE,
			"transactional id %q: epoch %d is more than %d past its current epoch %d", m.id, req.ProducerEpoch, onePhaseEpochs+maxPiped, m.epoch))
		return true
	case m.state != txnEmpty:
		w.fail(ctx, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "transactional id %q: a transaction stages its records or writes them once, not both", m.id))
		return true
	case m.deciding || m.jumping || len(m.piped) > 0 || len(m.waiters) > 0 || c.initing[m.id]:
		w.fail(ctx, throttledErr("the transactional id's last end is being written"))
		return true
	case c.queued >= c.o.MaxQueued:
		w.fail(ctx, throttledErr("too many requests waiting for __txn"))
		return true
	}
	ev := m.snapshotEvent()
	in := ev.GetInit()
	in.Epoch, in.UsedMs = req.ProducerEpoch, c.nowMs()
	in.HasLast, in.LastEpoch, in.LastCommit, in.LastBy = true, req.ProducerEpoch-1, true, "one-phase"
	m.jumping = true
	c.write(writeOp{events: [][]byte{event(ev)}, client: true, done: func(base int64, err *heraldpb.Error) {
		m.jumping = false
		parked := m.afterJump
		m.afterJump = nil
		if err != nil {
			w.fail(ctx, err)
		} else {
			if c.txns[m.id] == m && m.pid == req.ProducerId && m.epoch == from {
				c.applyTxn(uint64(base), ev, c.nowMs())
			}
			req.OnePhaseFrom = nil
			c.onEndTxn(ctx, f, req, to)
		}
		for _, next := range parked {
			next()
		}
	}})
	c.flushWrites(ctx)
	return true
}
