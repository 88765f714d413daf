package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Transactions written once (WithTxnWrittenOnce): the records of a
// transaction go straight to their partitions' leaders as transactional
// batches (ProduceRequest.txn_batch), numbered from 0 in each partition
// under the session's producer id and the transaction's epoch, and
// retried with the same sequences, as an idempotent producer's. The
// partition stores them durably and shows them to no reader. EndTxn then
// lists the partitions written and how many records each holds
// (EndTxnRequest.written): the coordinator records its decision, and its
// marker gives the records their offsets on every partition, or drops
// them (actors/txn markers.go). Each record is written once, instead of
// to __txn first and to its partition at the commit.
//
// A transaction's writer is a Producer (txnStamp) with the producer's
// batching, partitioning (a keyed record by its key; one without by a
// partition a batch at a time), up to 5 batches in flight per partition
// and leader failover; a failed record fails the transaction.

// txnStamp makes a Producer one transaction's writer.
type txnStamp struct {
	id    string // the transactional id
	epoch uint32 // the transaction's
	// commitLast: the last batch commits the transaction, after the
	// producer's transaction of epoch after there (markCommitLast).
	commitLast bool
	after      *uint32
	onQueued   func()
}

// WithTxnWrittenOnce writes the transaction's records once, straight to
// their partitions, instead of staging them with the transaction
// coordinator (the default, staged: each record is written twice). The
// commit then lists the partitions written, and the coordinator writes a
// commit marker to each. Unkeyed records get their partition from the
// producer (a batch at a time), and Send's Result names it.
func WithTxnWrittenOnce() TxnOpt {
	return txnOpt(func(c *txnConfig) { c.writeOnce = true })
}

// onceTxn is the transaction a producer writing once has open. Its
// counts are guarded by TransactionalProducer.mu.
type onceTxn struct {
	w      *Producer
	counts map[txnPart]uint32 // records written, per partition
	failed error              // the first record that failed
	// committed: a record was answered with an offset, which only a
	// commit gives (commitAlone).
	committed bool
	// quiet is the callback of its last topic's records sent without one
	// (recordDone).
	quiet      func(Result, error)
	quietTopic string
}

type txnPart struct {
	topic string
	part  int32
}

// written lists o's partitions and their records, for EndTxn.
func (o *onceTxn) written() []*heraldpb.TxnWritten {
	if o == nil {
		return nil
	}
	out := make([]*heraldpb.TxnWritten, 0, len(o.counts))
	for k, n := range o.counts {
		out = append(out, &heraldpb.TxnWritten{Topic: k.topic, Partition: uint32(k.part), Records: n})
	}
	slices.SortFunc(out, func(a, b *heraldpb.TxnWritten) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition) - int(b.Partition)
	})
	return out
}

// holdForCommit is the linger of a writer whose transaction may commit
// on its partition alone: a batch goes when it is full, or at the commit.
const holdForCommit = time.Hour

// newTxnWriter is the writer of the transaction of epoch (p.mu held).
func (p *TransactionalProducer) newTxnWriter(pid uint64, epoch uint32) *Producer {
	linger := p.cfg.linger
	if p.op.epochs > 0 {
		linger = holdForCommit // (a partition's last batch may carry the commit: onephase.go)
	}
	cfg := defaultProducerConfig()
	cfg.linger, cfg.batchBytes, cfg.bufferBytes, cfg.partInFlight = linger, p.cfg.batchBytes, p.cfg.bufferBytes, maxIdempotentInFlight
	w := p.c.newProducer(cfg, &p.bufs) // (a new writer per transaction: its batches reuse the last ones' buffers)
	w.pid, w.txn = pid, &txnStamp{id: p.id, epoch: epoch}
	return w
}

// sendOnce writes m in the open transaction; now: at once (Send). cb may
// be nil.
func (p *TransactionalProducer) sendOnce(ctx context.Context, m *Message, cb func(Result, error), now bool) {
	if err := p.ensureSession(ctx); err != nil {
		p.mu.Lock()
		p.failLocked(err)
		p.mu.Unlock()
		if cb != nil {
			cb(Result{}, err)
		}
		return
	}
	p.mu.Lock()
	if err := p.acceptErrLocked(); err != nil {
		p.mu.Unlock()
		if cb != nil {
			cb(Result{}, err)
		}
		return
	}
	o := p.once
	if o == nil {
		o = &onceTxn{w: p.newTxnWriter(p.pid, p.epoch), counts: map[txnPart]uint32{}}
		p.once = o
	}
	done := o.recordDone(p, m.Topic, cb)
	p.mu.Unlock()
	o.w.send(ctx, m, done, now)
}

// recordDone is the callback of a record of o's to topic: it counts the
// record in o, then calls cb (if not nil). Records without cb share one
// per topic (p.mu held).
func (o *onceTxn) recordDone(p *TransactionalProducer, topic string, cb func(Result, error)) func(Result, error) {
	if cb == nil && o.quiet != nil && o.quietTopic == topic {
		return o.quiet
	}
	done := func(r Result, err error) {
		p.mu.Lock()
		switch {
		case err == nil:
			o.counts[txnPart{topic, r.Partition}]++
			o.committed = o.committed || r.Offset >= 0
		case o.failed == nil:
			o.failed = err
		}
		if err != nil && p.once == o {
			p.failLocked(err)
		}
		p.mu.Unlock()
		if cb != nil {
			cb(Result{Partition: r.Partition, Offset: -1}, err)
		}
	}
	if cb == nil {
		o.quiet, o.quietTopic = done, topic
	}
	return done
}

// flushOnce waits until every record sent in the open transaction is
// written (or failed), or ctx ends.
func (p *TransactionalProducer) flushOnce(ctx context.Context) error {
	p.mu.Lock()
	o := p.once
	p.mu.Unlock()
	if o != nil {
		if err := o.w.Flush(ctx); err != nil {
			return err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return err
	}
	if p.phase == txnFailed {
		return p.failedErrLocked()
	}
	return nil
}

// endOnce ends the open transaction (commit or abort) once its records
// are written: EndTxn with the partitions written. The phase is set
// (committing or aborting) by the caller.
func (p *TransactionalProducer) endOnce(ctx context.Context, commit bool) (TxnEnd, error) {
	p.mu.Lock()
	err := p.waitCommitsLocked(ctx, 0) // the coordinator takes a producer's ends in order
	o := p.once
	p.mu.Unlock()
	if err != nil {
		return TxnEnd{}, err
	}
	p.mu.Lock()
	alone := commit && o != nil && p.phase == txnCommitting && len(p.offsets) == 0
	epoch := p.epoch
	p.mu.Unlock()
	if alone {
		if done, end, err := p.commitAlone(ctx, o, epoch, nil); done {
			p.mu.Lock()
			if err != nil {
				// (Its outcome may be unknown: a new session aborts it
				// if it was not committed.)
				p.needInit = true
				p.failLocked(err)
				p.mu.Unlock()
				return TxnEnd{}, fmt.Errorf("%w: %w", ErrTxnFailed, err)
			}
			p.epoch++
			p.resetLocked()
			p.mu.Unlock()
			p.dropOnce(o)
			return end, nil
		}
	}
	if o != nil {
		if err := o.w.Flush(ctx); err != nil {
			return TxnEnd{}, err // (ctx ended: Commit or Abort again)
		}
	}
	p.mu.Lock()
	if err := p.usableLocked(); err != nil {
		p.mu.Unlock()
		return TxnEnd{}, err
	}
	written := o.written()
	if commit && p.phase == txnFailed {
		err := p.failedErrLocked()
		ended := IsCode(p.failure, heraldpb.ErrorCode_INVALID_TXN_STATE)
		if ended {
			p.phase = txnAborting
		}
		p.mu.Unlock()
		if ended {
			// A partition had the transaction ended already: the
			// coordinator aborted it (a timeout, or a new session of the
			// id). Its abort answer says which.
			switch _, aerr := p.endWith(ctx, false, written); {
			case errors.Is(aerr, ErrProducerFenced):
				err = aerr
			case aerr == nil && p.sessionEnded():
				err = ErrTxnTimedOut
			}
			p.dropOnce(o)
		}
		return TxnEnd{}, err
	}
	if !commit && p.needInit {
		// The coordinator timed it out and aborted it already.
		p.resetLocked()
		p.mu.Unlock()
		return TxnEnd{}, nil
	}
	p.mu.Unlock()
	end, err := p.endWith(ctx, commit, written)
	p.dropOnce(o)
	return end, err
}

// dropOnce lets o's writer go once its transaction ended (it has nothing
// left to send).
func (p *TransactionalProducer) dropOnce(o *onceTxn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.phase == txnNone && p.once == o && o != nil {
		p.once = nil
		o.w.cancel()
	}
}

// sessionEnded reports whether the session's transaction ended otherwise
// than asked (timed out): the next one starts a new session.
func (p *TransactionalProducer) sessionEnded() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.needInit
}

// closeOnceLocked drops the open transaction's writer (Close).
func (p *TransactionalProducer) closeOnceLocked() {
	if o := p.once; o != nil {
		p.once = nil
		o.w.cancel()
	}
}

// Commits in flight (CommitAsync).

// MaxTxnCommitsInFlight is how many transactions CommitAsync lets wait for
// their commit at once (the coordinator queues as many behind the one it
// decides).
const MaxTxnCommitsInFlight = 64

// pendingCommit is a transaction CommitAsync queued. Its commit runs on
// its own goroutine (commitOne): it waits for its records, then for the
// commit before it to be sent, and sends its EndTxn right behind it, so
// the coordinator gets a producer's commits in order and decides those
// queued behind one together. runCommits reports them in order.
type pendingCommit struct {
	o       *onceTxn // nil: it wrote nothing
	epoch   uint32
	offsets []*heraldpb.TxnGroupOffsets
	cb      func(TxnEnd, error)
	prev    *pendingCommit // the commit before it, if still queued
	queued  chan struct{}  // closed once its EndTxn is on the connection, or will never be
	unsent  bool           // set before queued closes: its EndTxn was not sent
	done    chan struct{}  // closed once end and err are set
	end     TxnEnd
	err     error
}

// CommitAsync commits the open transaction without waiting for it
// (WithTxnWrittenOnce only): the producer is ready for the next Begin at
// once, and cb gets what Commit would have returned, from the producer's
// goroutine, once the commit decision is durable. The records still being
// written are waited for first. Up to MaxTxnCommitsInFlight commits wait
// at a time; past that CommitAsync blocks (on ctx) until one is done.
// Commits end, and are reported, in the order they were made; the
// coordinator decides those that wait behind one together. If one fails,
// none after it commits, the open transaction fails (Abort it), and the
// next one starts a new session, which aborts what the failed ones wrote.
// Commit, Abort and Close wait for the queued commits first, so cb must
// not call them.
func (p *TransactionalProducer) CommitAsync(ctx context.Context, cb func(TxnEnd, error)) error {
	if cb == nil {
		cb = func(TxnEnd, error) {}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cfg.writeOnce {
		return errors.New("herald: CommitAsync needs a producer writing once (WithTxnWrittenOnce)")
	}
	if err := p.waitCommitsLocked(ctx, MaxTxnCommitsInFlight-1); err != nil {
		return err
	}
	if err := p.acceptErrLocked(); err != nil {
		return err
	}
	pc := &pendingCommit{o: p.once, epoch: p.epoch, offsets: p.offsetsLocked(), cb: cb, queued: make(chan struct{}), done: make(chan struct{})}
	if n := len(p.commitQ); n > 0 {
		pc.prev = p.commitQ[n-1]
	}
	p.commitQ = append(p.commitQ, pc)
	p.once = nil
	p.epoch++ // the next transaction's: the coordinator moves one epoch per commit
	p.resetLocked()
	go p.commitOne(p.commitCtxLocked(), pc, p.pid)
	if !p.committer {
		p.committer = true
		go p.runCommits()
	}
	return nil
}

// waitCommitsLocked waits, releasing p.mu meanwhile, until at most limit
// commits are queued, or ctx ends.
func (p *TransactionalProducer) waitCommitsLocked(ctx context.Context, limit int) error {
	return p.waitUntilLocked(ctx, func() bool { return len(p.commitQ) <= limit })
}

// commitCtxLocked is the context of a commit queued now: it ends with the
// producer (Close), or no sooner than retryFor from now and at most a
// sixteenth of it later. The commits queued within a sixteenth of retryFor
// share one, each sparing a context and a timer of its own (6 % of the
// client's processor with 10-record transactions). Each lives until its
// deadline: at most about 17 at a time.
func (p *TransactionalProducer) commitCtxLocked() context.Context {
	now := time.Now()
	if p.commitCtx == nil || now.After(p.commitCtxUntil) {
		d := p.retryFor()
		ctx, cancel := context.WithDeadline(p.ctx, now.Add(d+d/16))
		_ = cancel // (it ends at its deadline: commits still use it until then)
		p.commitCtx, p.commitCtxUntil = ctx, now.Add(d/16)
	}
	return p.commitCtx
}

// runCommits reports the queued commits, in order, until none is left.
func (p *TransactionalProducer) runCommits() {
	for {
		p.mu.Lock()
		if len(p.commitQ) == 0 {
			p.committer = false
			p.mu.Unlock()
			return
		}
		pc := p.commitQ[0]
		p.mu.Unlock()
		<-pc.done
		if pc.err != nil {
			p.mu.Lock()
			if errors.Is(pc.err, ErrProducerFenced) {
				p.fenced = pc.err
			} else {
				// The transactions after it cannot commit: a new session
				// aborts what they wrote.
				p.needInit = true
				p.failLocked(pc.err)
			}
			p.mu.Unlock()
		}
		if pc.o != nil {
			pc.o.w.cancel()
		}
		pc.cb(pc.end, pc.err)
		// Dequeued once its callback ran: Close and Commit wait for it.
		p.mu.Lock()
		p.commitQ = p.commitQ[1:]
		p.changedLocked()
		p.mu.Unlock()
	}
}

// commitOne waits for pc's records, then commits it, right behind the
// commit before it, within ctx (commitCtxLocked).
func (p *TransactionalProducer) commitOne(ctx context.Context, pc *pendingCommit, pid uint64) {
	defer close(pc.done)
	prev := pc.prev
	pc.prev = nil // (only this goroutine reads it: the chain of commits is not kept)
	unsent := func(err error) {
		pc.err, pc.unsent = err, true
		close(pc.queued)
	}
	// afterPrev waits until the commit before it is on its way; false: pc
	// failed (answered unsent).
	afterPrev := func() bool {
		if prev == nil {
			return true
		}
		select {
		case <-prev.queued:
		case <-ctx.Done():
			unsent(ctx.Err())
			return false
		}
		if prev.unsent {
			unsent(fmt.Errorf("%w: the transaction committed before it failed", ErrTxnFailed))
			return false
		}
		return true
	}
	if pc.o != nil && len(pc.offsets) == 0 {
		// Alone on its partition if it can: right behind the commit
		// before it.
		if !afterPrev() {
			return
		}
		var once sync.Once
		queued := func() { once.Do(func() { close(pc.queued) }) }
		done, end, err := p.commitAlone(ctx, pc.o, pc.epoch, queued)
		if done {
			queued() // (if its batch never reached the connection: the next commit need not wait for it)
			if err != nil {
				pc.err = fmt.Errorf("%w: %w", ErrTxnFailed, err)
			}
			pc.end = end
			return
		}
	}
	var written []*heraldpb.TxnWritten
	if pc.o != nil {
		if err := pc.o.w.Flush(ctx); err != nil {
			unsent(err)
			return
		}
		p.mu.Lock()
		failed, w := pc.o.failed, pc.o.written()
		p.mu.Unlock()
		if failed != nil {
			unsent(fmt.Errorf("%w: %w", ErrTxnFailed, failed))
			return
		}
		written = w
	}
	var turn <-chan struct{}
	if !afterPrev() {
		return
	}
	if prev != nil {
		turn = prev.queued
	}
	req := &heraldpb.EndTxnRequest{
		TransactionalId: p.id, ProducerId: pid, ProducerEpoch: pc.epoch, Commit: true, GroupOffsets: pc.offsets, Written: written,
	}
	p.mu.Lock()
	if pc.epoch != p.op.from {
		// Transactions committed alone since the last EndTxn: the
		// coordinator hears of them once every commit before is answered.
		if err := p.waitUntilLocked(ctx, func() bool { return p.op.outstanding == 0 }); err != nil {
			p.mu.Unlock()
			unsent(err)
			return
		}
		if err := p.op.failed; err != nil {
			p.mu.Unlock()
			unsent(fmt.Errorf("%w: a transaction committed before it failed: %w", ErrTxnFailed, err))
			return
		}
		from := p.op.from
		req.OnePhaseFrom = &from
	}
	for _, w := range written {
		p.op.lastAt[txnPart{w.Topic, int32(w.Partition)}] = pc.epoch
	}
	p.op.from = pc.epoch + 1
	p.op.outstanding++
	p.mu.Unlock()
	sent := time.Now()
	f, err := p.c.callTxnTurn(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: req}}, true, turn, pc.queued)
	p.mu.Lock()
	p.op.outstanding--
	p.changedLocked()
	p.mu.Unlock()
	if err != nil {
		pc.err = err
		return
	}
	switch r := f.GetEndTxnResponse(); {
	case r == nil:
		pc.err = unexpected(f, "EndTxnResponse")
	case r.GetNextEpoch() != pc.epoch+1:
		pc.err = fmt.Errorf("herald: the commit of %q (epoch %d) moved the epoch to %d, not %d", p.id, pc.epoch, r.GetNextEpoch(), pc.epoch+1)
	default:
		p.mu.Lock()
		p.op.answered(r.GetNextEpoch(), sent)
		p.mu.Unlock()
		pc.end = TxnEnd{Records: int(r.GetRecords()), Partitions: r.GetPartitions(), AlreadyEnded: r.GetAlreadyEnded()}
	}
}
