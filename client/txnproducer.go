package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Transactions across partitions, as Kafka has them (staged): a
// TransactionalProducer's records go to the transaction coordinator, which
// keeps them in __txn, invisible to every consumer, until Commit appends
// all of them to their partitions, or Abort drops them. Each transactional
// id has one live session: NewTransactionalProducer starts one (the
// broker's InitProducerId), which aborts what an earlier session left open
// and fences it (PRODUCER_FENCED from then on). See docs/sdk.md,
// "Transactions".

// TxnOpt configures a TransactionalProducer (NewTransactionalProducer);
// a ProducerOpt cannot be passed in its place.
type TxnOpt interface{ applyTxn(*txnConfig) }

type txnOpt func(*txnConfig)

func (f txnOpt) applyTxn(c *txnConfig) { f(c) }

type txnConfig struct {
	timeout     time.Duration // 0: the broker's default
	batchBytes  int
	bufferBytes int64
	linger      time.Duration
	writeOnce   bool // WithTxnWrittenOnce (txnwrite.go)
}

// DefaultTxnLinger is how long a transactional producer lets a batch
// that is not full wait for more records before staging it
// (WithTxnLinger).
const DefaultTxnLinger = 5 * time.Millisecond

// WithTxnLinger sets how long a batch that is not full waits for more
// records before it is staged (default 5 ms, DefaultTxnLinger). A batch
// is staged at once when it is full, on Flush, and for Send; Commit
// stages what is left and sends the last batch with the commit itself,
// so a transaction sent faster than the linger is one write to __txn.
func WithTxnLinger(d time.Duration) TxnOpt {
	return txnOpt(func(c *txnConfig) {
		if d >= 0 {
			c.linger = d
		}
	})
}

// defaultTxnTimeout is the broker's default transaction timeout: how long
// a batch is retried when the producer did not set one.
const defaultTxnTimeout = time.Minute

// WithTransactionTimeout sets how long a transaction may stay open: the
// coordinator aborts one open longer (from its first record), and the
// producer's next call fails with ErrTxnTimedOut. Rounded up to a
// millisecond. Default 0: the broker's (60 s; at most its
// max-txn-timeout, 15 min by default). It also bounds how long a batch is
// retried.
func WithTransactionTimeout(d time.Duration) TxnOpt {
	return txnOpt(func(c *txnConfig) { c.timeout = d })
}

// WithTxnBatchBytes caps the encoded size of one staged batch (default
// 256 KiB, DefaultBatchBytes). A record larger than that goes alone.
func WithTxnBatchBytes(n int) TxnOpt {
	return txnOpt(func(c *txnConfig) {
		if n > 0 {
			c.batchBytes = n
		}
	})
}

// WithTxnBufferBytes bounds the bytes of records sent and not yet staged
// (default 32 MiB, DefaultBufferBytes): SendAsync blocks on its context
// while it is full.
func WithTxnBufferBytes(n int64) TxnOpt {
	return txnOpt(func(c *txnConfig) {
		if n > 0 {
			c.bufferBytes = n
		}
	})
}

// txnPhase is where the producer's current transaction is.
type txnPhase uint8

const (
	txnNone       txnPhase = iota // no transaction begun
	txnActive                     // begun: Send, Commit, Abort
	txnFailed                     // a record failed to stage: Abort only
	txnCommitting                 // Commit under way, or its outcome unknown: Commit again or Abort
	txnAborting                   // Abort under way, or its outcome unknown: Abort again
)

// TransactionalProducer sends records in transactions: every record sent
// between Begin and Commit becomes visible once Commit has returned (on
// every partition it went to, within milliseconds), or never (Abort, a
// failure, a crash).
// Create it with Client.NewTransactionalProducer; it is safe for
// concurrent use, but a transaction is one sequence Begin, sends, Commit
// or Abort. Close it before closing the Client.
//
// Partitioning is the Producer's: a keyed message goes to
// PartitionForKey(Key, partitions), one without a key to the partition
// the broker picks; Message.Partition is ignored. Records are batched per
// partition and staged one batch at a time, in order: a batch is sealed
// when it is full, when it has waited the linger (WithTxnLinger), on
// Flush and for Send, and batches grow while the coordinator is busy.
// Commit seals what is left, stages all but the last batch, and sends the
// last one with the commit (ProduceRequest.commit_txn): the coordinator
// writes it and the commit decision together.
//
// Failures: the producer retries a batch after retryable errors
// (NOT_COORDINATOR, which it follows to the transaction coordinator, a
// lost connection, a timeout, THROTTLED) with the same base sequence, so
// that the coordinator stages it once, for at most the transaction
// timeout. Any other failure of a record sent in the transaction fails
// the transaction: Send, Flush and Commit then return ErrTxnFailed with
// the cause, and only Abort ends it. PRODUCER_FENCED is final
// (ErrProducerFenced from every call). After TXN_TIMED_OUT
// (ErrTxnTimedOut) Abort ends the transaction without a request and the
// next transaction starts a new session first, as
// NewTransactionalProducer does (so it, too, fences any other session of
// the id).
type TransactionalProducer struct {
	c   *Client
	id  string
	cfg txnConfig

	ctx    context.Context // ended by Close (and the client's Close): staging stops
	cancel context.CancelFunc

	initMu sync.Mutex // one InitProducerId at a time

	mu       sync.Mutex
	pid      uint64
	epoch    uint32
	needInit bool // the session's current transaction ended unexpectedly: start a new session first
	phase    txnPhase
	failure  error // txnFailed: the first failure
	fenced   error // final
	closed   bool
	seq      int64 // base sequence of the next batch sealed
	open     map[txnKey]*txnBatch
	order    []txnKey    // keys of open, in the order they were opened
	queue    []*txnBatch // sealed, staged in order by run
	sending  bool        // run is working
	pending  int         // records accepted and not yet staged, failed or dropped
	buffered int64       // their estimated bytes
	changed  signal
	// last: the batch Commit sends with the commit, kept while its
	// outcome is unknown (Commit sends it again, Abort drops it).
	last      *txnBatch
	lingering bool // a linger timer is armed
	// offsets: consumer group offsets the commit carries (SendOffsets).
	offsets map[offsetsKey]map[int32]int64
	// once: the open transaction's records written once (txnwrite.go);
	// commitQ: commits CommitAsync queued, ended in order by runCommits
	// while committer is set.
	once      *onceTxn
	commitQ   []*pendingCommit
	committer bool
	// commitCtx is the context the commits CommitAsync queues until
	// commitCtxUntil share (commitCtxLocked).
	commitCtx      context.Context
	commitCtxUntil time.Time
	op             onePhase  // single-partition commits (onephase.go)
	bufs           sync.Pool // the writers' batch buffers
}

type offsetsKey struct{ group, topic string }

type txnKey struct {
	topic string
	part  int32 // -1: the broker picks
}

// txnBatch is records of one transaction for one partition, staged in
// one produce request.
type txnBatch struct {
	key  txnKey
	data []byte
	cbs  []func(Result, error)
	size int64
	seq  int64 // set when sealed
}

// TxnEnd is what ending a transaction did.
type TxnEnd struct {
	// Records and Partitions ("topic/partition") are what the transaction
	// held.
	Records    int
	Partitions []string
	// AlreadyEnded: the transaction had been ended the same way already (a
	// Commit retried after its outcome was unknown); nothing changed.
	AlreadyEnded bool
}

// NewTransactionalProducer starts a session of transactionalID (1 to 255
// bytes) on the transaction coordinator and returns its producer. Starting
// a session aborts the transaction an earlier session of the id left
// open, and fences that session: its every later request fails with
// PRODUCER_FENCED. It waits (retrying THROTTLED) while an earlier
// session's transaction is being committed, for as long as ctx lasts.
func (c *Client) NewTransactionalProducer(ctx context.Context, transactionalID string, opts ...TxnOpt) (*TransactionalProducer, error) {
	cfg := txnConfig{batchBytes: DefaultBatchBytes, bufferBytes: DefaultBufferBytes, linger: DefaultTxnLinger}
	for _, o := range opts {
		o.applyTxn(&cfg)
	}
	switch {
	case transactionalID == "" || len(transactionalID) > 255:
		return nil, fmt.Errorf("herald: transactional id must be 1 to 255 bytes, not %d", len(transactionalID))
	case cfg.timeout < 0 || cfg.timeout/time.Millisecond >= math.MaxUint32:
		return nil, fmt.Errorf("herald: transaction timeout %s out of range", cfg.timeout)
	}
	p := &TransactionalProducer{c: c, id: transactionalID, cfg: cfg, open: map[txnKey]*txnBatch{}}
	p.ctx, p.cancel = context.WithCancel(c.ctx)
	if err := p.initSession(ctx); err != nil {
		p.cancel()
		return nil, err
	}
	return p, nil
}

// TransactionalID returns the producer's transactional id.
func (p *TransactionalProducer) TransactionalID() string { return p.id }

// initSession sends InitProducerId and takes the session it answers.
func (p *TransactionalProducer) initSession(ctx context.Context) error {
	ms := uint32((p.cfg.timeout + time.Millisecond - 1) / time.Millisecond)
	sent := time.Now()
	f, err := p.c.callTxn(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{
		TransactionalId: p.id, TransactionTimeoutMs: ms, OnePhase: p.cfg.writeOnce,
	}}}, true)
	if err != nil {
		return err
	}
	r := f.GetInitProducerIdResponse()
	if r == nil {
		return unexpected(f, "InitProducerIdResponse")
	}
	p.mu.Lock()
	p.pid, p.epoch, p.needInit = r.GetProducerId(), r.GetProducerEpoch(), false
	p.op.reset(p.epoch, r.GetOnePhaseEpochs(), r.GetOnePhaseLeaseMs(), sent)
	p.mu.Unlock()
	return nil
}

// ensureSession starts a new session if the last one's transaction ended
// unexpectedly (needInit).
func (p *TransactionalProducer) ensureSession(ctx context.Context) error {
	p.initMu.Lock()
	defer p.initMu.Unlock()
	p.mu.Lock()
	need := p.needInit
	p.mu.Unlock()
	if !need {
		return nil
	}
	return p.initSession(ctx)
}

// Begin starts a transaction. It sends nothing: the first record (or
// Commit) does. It fails while a transaction is open, after Close, and
// with ErrProducerFenced once fenced.
func (p *TransactionalProducer) Begin() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return err
	}
	if p.phase != txnNone {
		return errors.New("herald: a transaction is open already: Commit or Abort it first")
	}
	p.phase, p.failure = txnActive, nil
	return nil
}

// usableLocked is the error every call returns once fenced or closed.
func (p *TransactionalProducer) usableLocked() error {
	switch {
	case p.fenced != nil:
		return p.fenced
	case p.closed:
		return ErrClosed
	}
	return nil
}

var errNoTxn = errors.New("herald: no transaction begun: call Begin first")

// acceptErrLocked says why a record cannot join the transaction now.
func (p *TransactionalProducer) acceptErrLocked() error {
	if err := p.usableLocked(); err != nil {
		return err
	}
	switch p.phase {
	case txnNone:
		return errNoTxn
	case txnFailed:
		return p.failedErrLocked()
	case txnCommitting, txnAborting:
		return errors.New("herald: the transaction is ending: Begin the next one first")
	}
	return nil
}

func (p *TransactionalProducer) failedErrLocked() error {
	return fmt.Errorf("%w: %w", ErrTxnFailed, p.failure)
}

// Send stages m in the open transaction and waits until the coordinator
// has it. It returns the partition m will be appended to (Result.Offset
// is -1: offsets are known at commit), and sets m.Partition and m.Offset
// the same way. If ctx ends first Send returns ctx.Err(), and m may still
// be staged: Commit then waits for it. An error fails the transaction
// (see TransactionalProducer).
func (p *TransactionalProducer) Send(ctx context.Context, m *Message) (Result, error) {
	return sendSync(ctx, m, func(cb func(Result, error)) { p.send(ctx, m, cb, true) })
}

// SendAsync adds m to the open transaction and calls cb once with the
// outcome of staging it: its partition (Offset -1), or the error. cb runs
// on the producer's goroutine (or the caller's when m is refused at
// once); keep it short. SendAsync blocks while the producer's buffer is
// full (WithTxnBufferBytes), until ctx ends; a keyed message may also
// wait on ctx for the topic's metadata. A refused message, like one that
// failed to stage, fails the transaction. Do not modify m until cb runs.
func (p *TransactionalProducer) SendAsync(ctx context.Context, m *Message, cb func(Result, error)) {
	p.send(ctx, m, cb, false)
}

// send adds m to its batch; now: seal the batch at once (Send). cb may be
// nil.
func (p *TransactionalProducer) send(ctx context.Context, m *Message, userCb func(Result, error), now bool) {
	cb := userCb
	if cb == nil {
		cb = func(Result, error) {}
	}
	refuse := func(err error) {
		p.mu.Lock()
		p.failLocked(err)
		p.mu.Unlock()
		cb(Result{}, err)
	}
	p.mu.Lock()
	err := p.acceptErrLocked()
	p.mu.Unlock()
	switch {
	case err != nil:
		cb(Result{}, err)
		return
	case m == nil || m.Topic == "":
		refuse(errors.New("herald: message without topic"))
		return
	case !m.DeliverAt.IsZero() || m.Delay != 0:
		refuse(errors.New("herald: a message in a transaction cannot be delayed (DeliverAt, Delay)"))
		return
	case p.cfg.writeOnce:
		p.sendOnce(ctx, m, userCb, now)
		return
	}
	part := int32(-1)
	if len(m.Key) > 0 {
		n, err := p.c.Partitions(ctx, m.Topic)
		if err == nil && n == 0 {
			err = &Error{Code: heraldpb.ErrorCode_PARTITION_NOT_FOUND, Message: fmt.Sprintf("topic %q has no partitions", m.Topic)}
		}
		if err != nil {
			refuse(err)
			return
		}
		part = int32(PartitionForKey(m.Key, uint32(n)))
	}
	rec, err := encodeRecord(nil, m)
	if err != nil {
		refuse(err)
		return
	}
	size := int64(len(rec))
	p.mu.Lock()
	for {
		if err := p.acceptErrLocked(); err != nil {
			p.mu.Unlock()
			cb(Result{}, err)
			return
		}
		if p.buffered == 0 || p.buffered+size <= p.cfg.bufferBytes {
			break
		}
		p.sealAllLocked() // what fills the buffer goes now
		p.kickLocked()
		changed := p.changed.wait()
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			refuse(ctx.Err())
			return
		case <-changed:
		}
		p.mu.Lock()
	}
	k := txnKey{topic: m.Topic, part: part}
	b := p.open[k]
	if b != nil && len(b.data)+len(rec) > p.cfg.batchBytes {
		p.sealLocked(k)
		b = nil
	}
	if b == nil {
		b = &txnBatch{key: k}
		p.open[k] = b
		p.order = append(p.order, k)
	}
	b.data = append(b.data, rec...)
	b.cbs = append(b.cbs, cb)
	b.size += size
	p.pending++
	p.buffered += size
	if now || p.cfg.linger == 0 {
		p.sealLocked(k)
	} else if !p.lingering {
		p.lingering = true
		time.AfterFunc(p.cfg.linger, p.lingered)
	}
	p.kickLocked()
	p.mu.Unlock()
}

// lingered seals the open batches once the linger has passed.
func (p *TransactionalProducer) lingered() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lingering = false
	if p.phase == txnActive {
		p.sealAllLocked()
		p.kickLocked()
	}
}

// sealLocked moves the open batch of k to the queue, numbering it.
func (p *TransactionalProducer) sealLocked(k txnKey) {
	b := p.open[k]
	if b == nil {
		return
	}
	delete(p.open, k)
	for i, o := range p.order {
		if o == k {
			p.order = append(p.order[:i], p.order[i+1:]...)
			break
		}
	}
	b.seq = p.seq
	p.seq += int64(len(b.cbs))
	p.queue = append(p.queue, b)
}

// sealAllLocked seals every open batch, oldest first.
func (p *TransactionalProducer) sealAllLocked() {
	for len(p.order) > 0 {
		p.sealLocked(p.order[0])
	}
}

// kickLocked starts run when there is something to stage.
func (p *TransactionalProducer) kickLocked() {
	if !p.sending && len(p.queue) > 0 {
		p.sending = true
		go p.run()
	}
}

// run stages the queued batches one at a time, in order; when the queue
// is empty and the buffer is half full it seals the open batches and
// goes on, and it returns once there is nothing sealed left.
func (p *TransactionalProducer) run() {
	for {
		p.mu.Lock()
		if len(p.queue) == 0 && 2*p.buffered >= p.cfg.bufferBytes {
			p.sealAllLocked()
		}
		if len(p.queue) == 0 {
			p.sending = false
			p.mu.Unlock()
			return
		}
		b := p.queue[0]
		p.queue[0] = nil
		p.queue = p.queue[1:]
		err := p.usableLocked()
		if err == nil && p.phase == txnFailed {
			err = p.failedErrLocked()
		}
		p.mu.Unlock()
		var r *heraldpb.ProduceResponse
		if err == nil {
			r, err = p.stage(b)
		}
		p.finish(b, r, err)
	}
}

// retryFor is how long a batch is retried: the transaction timeout, past
// which the coordinator has aborted the transaction anyway.
func (p *TransactionalProducer) retryFor() time.Duration {
	if p.cfg.timeout > 0 {
		return p.cfg.timeout
	}
	return defaultTxnTimeout
}

// stage sends b to the coordinator, again with the same base sequence
// after retryable failures, until it is staged, refused, or retryFor has
// passed.
func (p *TransactionalProducer) stage(b *txnBatch) (*heraldpb.ProduceResponse, error) {
	ctx, cancel := context.WithTimeout(p.ctx, p.retryFor())
	defer cancel()
	if err := p.ensureSession(ctx); err != nil {
		if p.ctx.Err() != nil {
			return nil, ErrClosed
		}
		return nil, err
	}
	p.mu.Lock()
	pid, epoch := p.pid, p.epoch
	p.mu.Unlock()
	f := &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: p.stageRequest(b, pid, epoch)}}
	for backoff := 10 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		resp, err := p.c.callTxn(ctx, f, true)
		if err == nil {
			r := resp.GetProduceResponse()
			if r == nil {
				return nil, unexpected(resp, "ProduceResponse")
			}
			return r, nil
		}
		if p.ctx.Err() != nil {
			return nil, ErrClosed // the producer or its client was closed
		}
		if !IsRetryable(err) || ctx.Err() != nil || sleepCtx(ctx, max(backoff, retryAfter(err))) != nil {
			return nil, err
		}
	}
}

// stageRequest is the produce that stages b in the transaction of pid
// and epoch.
func (p *TransactionalProducer) stageRequest(b *txnBatch, pid uint64, epoch uint32) *heraldpb.ProduceRequest {
	req := &heraldpb.ProduceRequest{Topic: b.key.topic, Acks: AcksAll, Records: b.data,
		TransactionalId: p.id, ProducerId: pid, ProducerEpoch: epoch, BaseSequence: b.seq}
	if b.key.part >= 0 {
		part := uint32(b.key.part)
		req.Partition = &part
	}
	if t := p.c.cfg.requestTimeout; t > 0 {
		req.TimeoutMs = uint32(min(t/time.Millisecond, math.MaxUint32))
	}
	return req
}

// finish records b's outcome and runs its callbacks.
func (p *TransactionalProducer) finish(b *txnBatch, r *heraldpb.ProduceResponse, err error) {
	res := Result{Partition: -1, Offset: -1}
	p.mu.Lock()
	p.pending -= len(b.cbs)
	p.buffered -= b.size
	p.changedLocked()
	if err == nil {
		res.Partition = int32(r.GetPartition())
	} else {
		p.failLocked(err)
	}
	p.mu.Unlock()
	for _, cb := range b.cbs {
		cb(res, err)
	}
}

func (p *TransactionalProducer) changedLocked() { p.changed.fire() }

// failLocked notes that a record of the transaction failed with err.
func (p *TransactionalProducer) failLocked(err error) {
	if errors.Is(err, ErrProducerFenced) && p.fenced == nil {
		p.fenced = err
	}
	if errors.Is(err, ErrTxnTimedOut) {
		p.needInit = true
	}
	if (p.phase == txnActive || p.phase == txnCommitting) && !errors.Is(err, ErrClosed) {
		p.phase, p.failure = txnFailed, err
	}
}

// waitLocked waits, releasing p.mu meanwhile, until no record is
// pending or ctx ends.
func (p *TransactionalProducer) waitLocked(ctx context.Context) error {
	return p.waitUntilLocked(ctx, func() bool { return p.pending == 0 })
}

// waitUntilLocked waits, releasing p.mu meanwhile, until done (called
// with p.mu held) or ctx ends.
func (p *TransactionalProducer) waitUntilLocked(ctx context.Context, done func() bool) error {
	for !done() {
		changed := p.changed.wait()
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			p.mu.Lock()
			return ctx.Err()
		case <-changed:
		}
		p.mu.Lock()
	}
	return nil
}

// Flush sends the records of the open transaction not sent yet and waits
// until every record sent so far is staged, or ctx ends. It returns
// ErrTxnFailed (with the cause) when one failed.
func (p *TransactionalProducer) Flush(ctx context.Context) error {
	if p.cfg.writeOnce {
		return p.flushOnce(ctx)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sealAllLocked()
	p.kickLocked()
	if err := p.waitLocked(ctx); err != nil {
		return err
	}
	if err := p.usableLocked(); err != nil {
		return err
	}
	if p.phase == txnFailed {
		return p.failedErrLocked()
	}
	return nil
}

// Commit commits the open transaction: it flushes its records, then asks
// the coordinator to commit, which answers once the commit decision is
// durable. From then on the transaction will be whole on every partition
// it touched, whatever fails; the coordinator appends its records right
// after (consumers see them within milliseconds, as after a Kafka commit
// its markers). Then the producer is ready for the next Begin: the next
// transaction stages while this one is appended, and its Commit waits
// for this one's records to be on their partitions, so one producer's
// records keep their order.
//
// It fails with ErrTxnFailed (with the cause) when a record failed: only
// Abort ends the transaction then. When the answer does not come (a lost
// connection, a timeout, ctx ending; the error is marked
// ErrOutcomeUnknown), the transaction may or may not be committed: call
// Commit again (the coordinator answers a repeated commit with
// TxnEnd.AlreadyEnded) or Abort (which fails with INVALID_TXN_STATE if it
// was committed). After ErrTxnTimedOut, Abort and begin again.
func (p *TransactionalProducer) Commit(ctx context.Context) (TxnEnd, error) {
	p.mu.Lock()
	if err := p.usableLocked(); err != nil {
		p.mu.Unlock()
		return TxnEnd{}, err
	}
	switch p.phase {
	case txnNone:
		p.mu.Unlock()
		return TxnEnd{}, errNoTxn
	case txnFailed:
		if p.cfg.writeOnce {
			p.mu.Unlock()
			return p.endOnce(ctx, true) // (it asks why a partition ended it)
		}
		err := p.failedErrLocked()
		p.mu.Unlock()
		return TxnEnd{}, err
	case txnAborting:
		p.mu.Unlock()
		return TxnEnd{}, errors.New("herald: the transaction is being aborted: call Abort again")
	}
	p.phase = txnCommitting
	if p.cfg.writeOnce {
		p.mu.Unlock()
		return p.endOnce(ctx, true)
	}
	p.sealAllLocked()
	if n := len(p.queue); n > 0 && p.last == nil {
		// The last batch goes with the commit; the others are staged
		// first, in order.
		p.last = p.queue[n-1]
		p.queue = p.queue[:n-1]
		p.pending -= len(p.last.cbs)
		p.buffered -= p.last.size
		p.changedLocked()
	}
	p.kickLocked()
	if err := p.waitLocked(ctx); err != nil {
		p.mu.Unlock()
		return TxnEnd{}, err
	}
	if err := p.usableLocked(); err != nil {
		p.mu.Unlock()
		return TxnEnd{}, err
	}
	if p.phase == txnFailed {
		err := p.failedErrLocked()
		p.mu.Unlock()
		return TxnEnd{}, err
	}
	last := p.last
	p.mu.Unlock()
	if last != nil {
		return p.commitWith(ctx, last)
	}
	return p.end(ctx, true)
}

// commitWith sends the last batch of the transaction with the commit
// (commit_txn) and takes the answer as end does; when the answer does not
// come the batch is kept, and Commit sends it again with the same base
// sequence.
func (p *TransactionalProducer) commitWith(ctx context.Context, b *txnBatch) (TxnEnd, error) {
	if err := p.ensureSession(ctx); err != nil {
		return TxnEnd{}, err
	}
	p.mu.Lock()
	pid, epoch, offs := p.pid, p.epoch, p.offsetsLocked()
	p.mu.Unlock()
	req := p.stageRequest(b, pid, epoch)
	req.CommitTxn, req.TxnGroupOffsets = true, offs
	resp, err := p.c.callTxn(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: req}}, true)
	var pr *heraldpb.ProduceResponse
	if err == nil {
		if pr = resp.GetProduceResponse(); pr == nil || pr.GetTxnEnd() == nil {
			err = unexpected(resp, "ProduceResponse with txn_end")
		}
	}
	res := Result{Partition: -1, Offset: -1}
	p.mu.Lock()
	if p.epoch != epoch || p.pid != pid {
		p.mu.Unlock()
		return TxnEnd{}, fmt.Errorf("herald: the session of transactional id %q changed while committing its transaction", p.id)
	}
	switch {
	case err == nil:
		r := pr.GetTxnEnd()
		if next := r.GetNextEpoch(); next > epoch {
			p.epoch = next
		} else {
			p.needInit = true
		}
		if !r.GetAlreadyEnded() {
			res.Partition = int32(pr.GetPartition())
		}
		p.last = nil
		p.resetLocked()
		p.mu.Unlock()
		b.run(res, nil)
		return TxnEnd{Records: int(r.GetRecords()), Partitions: r.GetPartitions(), AlreadyEnded: r.GetAlreadyEnded()}, nil
	case errors.Is(err, ErrOutcomeUnknown) || IsRetryable(err) || ctx.Err() != nil:
		// Commit again (it sends this batch again) or Abort.
		p.mu.Unlock()
		return TxnEnd{}, err
	}
	// Refused: the batch, and with it the transaction, failed.
	p.last = nil
	p.failLocked(err)
	if errors.Is(err, ErrTxnTimedOut) || IsCode(err, heraldpb.ErrorCode_INVALID_TXN_STATE) || IsCode(err, heraldpb.ErrorCode_TXN_NOT_FOUND) {
		// The coordinator ended it otherwise: the next transaction
		// starts a new session.
		p.needInit = true
	}
	if p.fenced == nil && p.phase == txnFailed {
		err = p.failedErrLocked()
	}
	p.mu.Unlock()
	b.run(res, err)
	return TxnEnd{}, err
}

// Abort drops the open transaction: records not sent yet fail with
// ErrTxnAborted, it waits for the one batch being staged, and asks the
// coordinator to abort, which drops everything staged. After
// ErrTxnTimedOut (the coordinator aborted already) it sends nothing. With
// no transaction open it does nothing. An error marked ErrOutcomeUnknown
// leaves the transaction aborting: call Abort again (a transaction left
// open is aborted at its timeout, or by the id's next session). One that
// fails with INVALID_TXN_STATE was committed (by a Commit whose outcome
// was unknown) or is being committed; the producer is ready for the next
// Begin either way.
func (p *TransactionalProducer) Abort(ctx context.Context) error {
	p.mu.Lock()
	if err := p.usableLocked(); err != nil {
		p.mu.Unlock()
		return err
	}
	if p.phase == txnNone {
		p.mu.Unlock()
		return nil
	}
	p.phase = txnAborting
	if p.cfg.writeOnce {
		p.mu.Unlock()
		_, err := p.endOnce(ctx, false)
		return err
	}
	dropped := p.dropLocked()
	p.mu.Unlock()
	for _, cb := range dropped {
		cb(Result{}, ErrTxnAborted)
	}
	p.mu.Lock()
	if err := p.waitLocked(ctx); err != nil {
		p.mu.Unlock()
		return err
	}
	if err := p.usableLocked(); err != nil {
		p.mu.Unlock()
		return err
	}
	last := p.last
	p.last = nil
	if p.needInit {
		// Timed out: the coordinator aborted it, and the next
		// transaction starts a new session.
		p.resetLocked()
		p.mu.Unlock()
		last.run(Result{}, ErrTxnAborted)
		return nil
	}
	p.mu.Unlock()
	_, err := p.end(ctx, false)
	switch {
	case err == nil:
		last.run(Result{}, ErrTxnAborted)
	case IsCode(err, heraldpb.ErrorCode_INVALID_TXN_STATE):
		// Committed, by a Commit whose answer was lost.
		last.run(Result{Partition: -1, Offset: -1}, nil)
	default:
		p.mu.Lock()
		if p.last == nil && p.phase == txnAborting {
			p.last = last // Abort again
		} else {
			defer last.run(Result{}, err)
		}
		p.mu.Unlock()
	}
	return err
}

// run calls b's callbacks (none for a nil b).
func (b *txnBatch) run(r Result, err error) {
	if b == nil {
		return
	}
	for _, cb := range b.cbs {
		cb(r, err)
	}
}

// dropLocked takes the records not sent yet out of the transaction and
// returns their callbacks.
func (p *TransactionalProducer) dropLocked() []func(Result, error) {
	var cbs []func(Result, error)
	drop := func(b *txnBatch) {
		cbs = append(cbs, b.cbs...)
		p.pending -= len(b.cbs)
		p.buffered -= b.size
	}
	for _, b := range p.queue {
		drop(b)
	}
	for _, k := range p.order {
		drop(p.open[k])
		delete(p.open, k)
	}
	if p.last != nil && p.phase != txnAborting {
		// (Abort takes it itself: its fate is the abort's.)
		cbs = append(cbs, p.last.cbs...)
		p.last = nil
	}
	p.queue, p.order = nil, nil
	if len(cbs) > 0 {
		p.changedLocked()
	}
	return cbs
}

// resetLocked ends the transaction locally: the next one starts at
// sequence 0.
func (p *TransactionalProducer) resetLocked() {
	p.phase, p.failure, p.seq = txnNone, nil, 0
	p.offsets = nil
}

// SendOffsets adds consumer group progress to the open transaction
// (Kafka's SendOffsetsToTransaction): when the transaction commits, the
// group's position in each partition of topic moves up to its offset in
// offsets (the next offset to consume: every offset below it is done),
// together with the transaction's records: both, or neither if it
// aborts. A new session of this transactional id (a process taking over
// after a crash) starts only once the offsets of the last commit are
// applied, so it reads the group's position after it (the ack floors of
// Client.DescribeGroup). The group must be a clustering or shared
// group of topic (or have no progress yet); the position never moves
// back. It sends nothing: Commit carries the offsets (a later call for
// the same group and partition replaces the offset). The connection
// needs the right to consume as the group.
func (p *TransactionalProducer) SendOffsets(group, topic string, offsets map[int32]int64) error {
	switch {
	case group == "" || topic == "":
		return errors.New("herald: SendOffsets needs a group and a topic")
	case len(offsets) == 0:
		return errors.New("herald: SendOffsets needs offsets")
	}
	for part, off := range offsets {
		if part < 0 || off < 0 {
			return fmt.Errorf("herald: SendOffsets: partition %d, offset %d", part, off)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return err
	}
	switch p.phase {
	case txnNone:
		return errNoTxn
	case txnActive:
	default:
		return errors.New("herald: SendOffsets: the transaction is being ended")
	}
	k := offsetsKey{group, topic}
	if p.offsets == nil {
		p.offsets = map[offsetsKey]map[int32]int64{}
	}
	if p.offsets[k] == nil {
		p.offsets[k] = map[int32]int64{}
	}
	maps.Copy(p.offsets[k], offsets)
	return nil
}

// offsetsLocked is the commit's group offsets, in a stable order.
func (p *TransactionalProducer) offsetsLocked() []*heraldpb.TxnGroupOffsets {
	if len(p.offsets) == 0 {
		return nil
	}
	var out []*heraldpb.TxnGroupOffsets
	keys := slices.SortedFunc(maps.Keys(p.offsets), func(a, b offsetsKey) int {
		return cmp.Or(cmp.Compare(a.group, b.group), cmp.Compare(a.topic, b.topic))
	})
	for _, k := range keys {
		o := &heraldpb.TxnGroupOffsets{Group: k.group, Topic: k.topic}
		for _, part := range slices.Sorted(maps.Keys(p.offsets[k])) {
			o.Partitions = append(o.Partitions, uint32(part))
			o.Offsets = append(o.Offsets, p.offsets[k][part])
		}
		out = append(out, o)
	}
	return out
}

// end sends EndTxn (commit or abort) for the current epoch and takes the
// answer.
func (p *TransactionalProducer) end(ctx context.Context, commit bool) (TxnEnd, error) {
	return p.endWith(ctx, commit, nil)
}

// endWith is end for a transaction written once to the partitions in
// written (txnwrite.go).
func (p *TransactionalProducer) endWith(ctx context.Context, commit bool, written []*heraldpb.TxnWritten) (TxnEnd, error) {
	if err := p.ensureSession(ctx); err != nil {
		return TxnEnd{}, err // only after a Begin that followed a timeout: nothing was staged
	}
	p.mu.Lock()
	pid, epoch := p.pid, p.epoch
	var offs []*heraldpb.TxnGroupOffsets
	if commit {
		offs = p.offsetsLocked()
	}
	req := &heraldpb.EndTxnRequest{
		TransactionalId: p.id, ProducerId: pid, ProducerEpoch: epoch, Commit: commit, GroupOffsets: offs, Written: written,
	}
	if p.cfg.writeOnce && epoch != p.op.from {
		// (No commit is in flight: Commit and Abort wait for them.)
		from := p.op.from
		req.OnePhaseFrom = &from
	}
	p.mu.Unlock()
	sent := time.Now()
	f, err := p.c.callTxn(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: req}}, true)
	var r *heraldpb.EndTxnResponse
	if err == nil {
		if r = f.GetEndTxnResponse(); r == nil {
			err = unexpected(f, "EndTxnResponse")
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.epoch != epoch || p.pid != pid {
		return TxnEnd{}, fmt.Errorf("herald: the session of transactional id %q changed while ending its transaction", p.id)
	}
	what := map[bool]string{true: "committing", false: "aborting"}[commit]
	switch {
	case err == nil:
		if next := r.GetNextEpoch(); next > epoch {
			p.epoch = next
			p.op.from = next
			p.op.answered(next, sent)
			for _, w := range written {
				if commit { // (a later commit there comes after this one; an abort leaves nothing to wait for)
					p.op.lastAt[txnPart{w.Topic, int32(w.Partition)}] = epoch
				}
			}
		} else {
			p.needInit = true
		}
		p.resetLocked()
		return TxnEnd{Records: int(r.GetRecords()), Partitions: r.GetPartitions(), AlreadyEnded: r.GetAlreadyEnded()}, nil
	case errors.Is(err, ErrProducerFenced):
		p.fenced = err
		return TxnEnd{}, err
	case errors.Is(err, ErrTxnTimedOut):
		p.needInit = true
		if !commit {
			p.resetLocked()
			return TxnEnd{}, nil // aborted by the coordinator
		}
		p.phase, p.failure = txnFailed, err
		return TxnEnd{}, err
	case IsCode(err, heraldpb.ErrorCode_INVALID_TXN_STATE), IsCode(err, heraldpb.ErrorCode_TXN_NOT_FOUND):
		// The coordinator ended it otherwise (committed, aborted by hand)
		// or does not know it: the next transaction starts a new session.
		p.needInit = true
		p.resetLocked()
		return TxnEnd{}, fmt.Errorf("herald: %s the transaction of %q (epoch %d): %w", what, p.id, epoch, err)
	}
	return TxnEnd{}, err // the outcome is unknown, or nothing was done: Commit or Abort again
}

// Close aborts the open transaction, if any (within ctx, as Abort), and
// releases the producer: every call fails with ErrClosed from then on.
// It returns the Abort's error. It does not close the Client.
func (p *TransactionalProducer) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	_ = p.waitCommitsLocked(ctx, 0) // (CommitAsync's: they fail once closed)
	open := p.phase != txnNone && p.fenced == nil
	p.mu.Unlock()
	var err error
	if open {
		err = p.Abort(ctx)
	}
	p.mu.Lock()
	p.closed = true
	p.closeOnceLocked()
	dropped := p.dropLocked()
	if p.last != nil {
		dropped = append(dropped, p.last.cbs...)
		p.last = nil
	}
	p.mu.Unlock()
	for _, cb := range dropped {
		cb(Result{}, ErrClosed)
	}
	p.cancel() // the batch being staged, if any, fails at once
	p.mu.Lock()
	_ = p.waitLocked(context.Background())
	p.mu.Unlock()
	return err
}

// ListTransactions returns up to limit (0: the broker's default, 100) of
// the transactional ids the coordinator knows, those with a transaction
// open or committing first, and how many it knows in all; a non-empty id
// asks for that one only (TXN_NOT_FOUND when it is not known).
func (c *Client) ListTransactions(ctx context.Context, id string, limit int) ([]*heraldpb.TxnInfo, int, error) {
	r, err := c.listTxn(ctx, &heraldpb.ListTxnRequest{Transactions: true, Id: id, Limit: uint32(min(int64(max(limit, 0)), math.MaxUint32))})
	if err != nil {
		return nil, 0, err
	}
	return r.GetTransactions(), int(r.GetTotal()), nil
}

// TransactionCount is how many transactional ids the coordinator knows,
// without asking the partitions for the transactions written once open
// there (as ListTransactions does): cheap enough to poll.
func (c *Client) TransactionCount(ctx context.Context) (int, error) {
	r, err := c.listTxn(ctx, &heraldpb.ListTxnRequest{Transactions: true, Limit: 1, NoPartitions: true})
	if err != nil {
		return 0, err
	}
	return int(r.GetTotal()), nil
}

// AbortTransaction aborts the open transaction of transactionalID by hand
// (`herald txn abort ID`, EndTxnRequest.manual): its staged records are
// dropped, and its producer's next request fails (its Abort then
// succeeds). It fails with TXN_NOT_FOUND when the id is unknown or has no
// transaction open, and with INVALID_TXN_STATE while it is committing. It
// is not sent again after a lost answer: a second abort would fail with
// TXN_NOT_FOUND.
func (c *Client) AbortTransaction(ctx context.Context, transactionalID string) (TxnEnd, error) {
	if transactionalID == "" {
		return TxnEnd{}, errors.New("herald: AbortTransaction: empty transactional id")
	}
	f, err := c.callTxn(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{
		TransactionalId: transactionalID, Manual: true,
	}}}, false)
	if err != nil {
		return TxnEnd{}, err
	}
	r := f.GetEndTxnResponse()
	if r == nil {
		return TxnEnd{}, unexpected(f, "EndTxnResponse")
	}
	return TxnEnd{Records: int(r.GetRecords()), Partitions: r.GetPartitions(), AlreadyEnded: r.GetAlreadyEnded()}, nil
}
