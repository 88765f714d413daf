package client

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// Single-partition commits. A producer writing once commits a transaction
// that wrote one partition, with no group offsets, on that partition
// alone: its last batch carries commit_txn, and the partition commits it
// once the batch is written (one synced write instead of three: batch,
// decision, marker; no EndTxn). The transaction's last batch on each
// partition waits for the commit unless it fills up, so that it can carry
// it.
//
// The coordinator does not see those commits, so the producer keeps to
// what InitProducerId granted (actors/txn onephase.go): epochs below the
// one the coordinator last answered plus one_phase_epochs, for
// one_phase_lease_ms from when it sent that request. Past half of either,
// the next commit goes through the coordinator (EndTxn), which renews
// both; it tells the coordinator of the epochs ended alone
// (one_phase_from) once every commit before it is answered.
//
// A producer's transactions commit on a partition in their order: the
// commit batch names the producer's previous transaction on its partition
// (txn_commit_after), and the partition commits it only after that one.

// onePhase is a session's state of single-partition commits; guarded by
// TransactionalProducer.mu.
type onePhase struct {
	epochs uint32        // granted (0: none, a broker without them)
	lease  time.Duration // granted
	known  uint32        // the epoch the coordinator last answered
	since  time.Time     // when the request it answered was sent
	// from is the epoch the coordinator will be at once every EndTxn sent
	// is decided: a later EndTxn of another epoch tells it of the ones
	// ended alone since.
	from uint32
	// lastAt is the epoch of the last transaction that wrote each
	// partition, set in epoch order as commits go out.
	lastAt map[txnPart]uint32
	// outstanding counts commits sent (EndTxn, or a commit batch) and not
	// answered; failed is set once a single-partition commit failed.
	outstanding int
	failed      error
}

// reset starts a session's state from InitProducerId's answer.
func (o *onePhase) reset(epoch, epochs, leaseMs uint32, sent time.Time) {
	*o = onePhase{epochs: epochs, lease: time.Duration(leaseMs) * time.Millisecond, known: epoch, since: sent, from: epoch, lastAt: map[txnPart]uint32{}}
}

// allowed reports whether the transaction of epoch may commit alone:
// within half of the epochs and of the lease granted (the other half is
// the room the commits in flight and the renewal take).
func (o *onePhase) allowed(epoch uint32) bool {
	return o.epochs > 0 && o.failed == nil && epoch >= o.known && epoch-o.known < o.epochs/2 && time.Since(o.since) < o.lease/2
}

// answered notes the coordinator's answer to an EndTxn sent at sent:
// its epoch is now next.
func (o *onePhase) answered(next uint32, sent time.Time) {
	if next > o.known {
		o.known, o.since = next, sent
	}
}

// commitAlone commits w's transaction of epoch on its only partition, if
// it can (allowed, and its last batch not sent yet), once prev (the
// commit before it, if any) is on its way. It reports whether it did; if
// so, err is the commit's outcome. queued (if not nil) is called once the
// commit batch is on the connection.
func (p *TransactionalProducer) commitAlone(ctx context.Context, o *onceTxn, epoch uint32, queued func()) (done bool, end TxnEnd, err error) {
	p.mu.Lock()
	if !p.op.allowed(epoch) {
		p.mu.Unlock()
		return false, TxnEnd{}, nil
	}
	part, ok := o.w.onlyPartition()
	if !ok {
		p.mu.Unlock()
		return false, TxnEnd{}, nil
	}
	after, has := p.op.lastAt[part]
	var afterp *uint32
	if has {
		afterp = &after
	}
	if !o.w.markCommitLast(afterp, queued) {
		p.mu.Unlock()
		return false, TxnEnd{}, nil
	}
	p.op.lastAt[part] = epoch
	p.op.outstanding++
	p.mu.Unlock()
	ferr := o.w.Flush(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.op.outstanding--
	p.changedLocked()
	switch {
	case ferr != nil:
		err = ferr
	case o.failed != nil:
		err = o.failed
	case !o.committed:
		// Written, not committed: a partition on a broker without
		// single-partition commits took the batch as any (a rolling
		// upgrade). The transaction fails; the next session aborts it.
		err = fmt.Errorf("herald: partition %s wrote the transaction's last batch without committing it (a broker without single-partition commits?)", part)
	}
	if err != nil {
		if p.op.failed == nil {
			p.op.failed = err
		}
		return true, TxnEnd{}, err
	}
	return true, TxnEnd{Records: int(o.counts[part]), Partitions: []string{part.String()}}, nil
}

// String names the partition as EndTxnResponse.partitions do.
func (t txnPart) String() string { return t.topic + "/" + strconv.Itoa(int(t.part)) }
