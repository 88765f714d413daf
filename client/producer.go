package client

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Producer batches messages per (topic, partition) and sends them with
// retries. It is safe for concurrent use. Create it with Client.NewProducer;
// Close it before closing the Client.
//
// Batching: a batch is sent when it reaches WithBatchBytes, when its linger
// (WithLinger) has passed, on Flush, or at once for a synchronous Send.
//
// Partitioning: by default the producer picks each message's partition
// and ignores Message.Partition: a keyed message goes to
// PartitionForKey(Key, partitions). A message without a key goes, with
// idempotence, to a partition the producer picks round-robin (a batch per
// partition in turn); without it, to the broker without a partition (it
// picks one round-robin). With WithManualPartitions every message goes to
// its Message.Partition.
//
// Ordering: messages to one partition (one key, or one Partition with
// WithManualPartitions) are written in the order SendAsync accepted them,
// also across retries, because each partition has at most one batch in
// flight (by default); the next batch waits until the previous one
// succeeded or finally failed. Messages the broker spreads (no key, no
// idempotence) go up to WithUnpartitionedInFlight batches per topic in
// flight, in no particular order.
//
// Delivery: the producer is idempotent by default (WithIdempotence): each
// batch carries the producer's id and the sequence of its first record in
// its partition, and the partition's leader writes it once however often it
// is retried. Without idempotence delivery is at least once: a batch
// retried after a lost connection or a timeout may be written twice.
//
// Memory is bounded by WithBufferBytes: SendAsync blocks (on its context)
// while the buffer is full, or fails with ErrBufferFull under
// WithNonBlocking.
type Producer struct {
	c   *Client
	cfg producerConfig
	pid uint64 // idempotence: the producer id, random, chosen at creation
	// txn: the producer writes one transaction's batches, once, to their
	// partitions (txnwrite.go); nil for a plain producer.
	txn *txnStamp

	ctx    context.Context // cancelled when Close gives up on flushing
	cancel context.CancelFunc

	mu       sync.Mutex
	batchers map[batchKey]*batcher
	seqs     map[batchKey]*seqState // idempotence: per partition, kept while the producer lives
	// Idempotence of delayed batches: the producer id they carry and the
	// sequence of the next one (one per batch, in no order: the
	// scheduler remembers a window of them, not a next sequence).
	delayedPid   uint64
	delayedSeq   int64
	delayedPlain atomic.Bool        // a broker refused them idempotent (an older version)
	sticky       map[string]*sticky // idempotence: partition of records without key, per topic
	buffered     int64              // estimated bytes of accepted, unfinished records
	records      int                // accepted, unfinished records
	freed        signal             // fired whenever records finish
	flushing     int                // Flush calls in progress: linger is ignored
	closed       bool

	// Counters for Stats.
	throttled, retries atomic.Uint64

	// bufs holds *[]byte batch buffers (length 0) of finished batches for
	// reuse: a batch buffer is not referenced any more once its produce
	// request has completed, since sending copies it into the connection's
	// write buffer. A transaction's writer shares its
	// TransactionalProducer's (txnwrite.go).
	bufs *sync.Pool
}

type batchKey struct {
	topic     string
	partition int32 // -1: let the broker choose
	at, delay int64 // delayed delivery (ms): one record per batch
}

func (k batchKey) delayed() bool { return k.at != 0 || k.delay != 0 }

// delayedRetrySpan bounds how long after its first attempt an idempotent
// delayed batch may still be answered by a retry: within the scheduler's
// dedup window (2 min by default), with a margin for the clocks of the
// nodes the scheduler moves between.
const delayedRetrySpan = 100 * time.Second

// maxIdempotentInFlight is how many batches per partition an idempotent
// producer keeps in flight at most: the partition remembers the producer's
// last 5 batches (partition.ProducerBatches), so a retry of any of them is
// recognised.
const maxIdempotentInFlight = 5

// seqState numbers an idempotent producer's records to one partition.
// Guarded by Producer.mu.
type seqState struct {
	pid  uint64 // the producer id this partition's batches carry
	next int64  // sequence of the next new batch's first record
	// acked: a batch with pid succeeded. Until then batches go one at a
	// time, so a first batch that must be retried cannot be overtaken by
	// the next one, which a partition that does not know pid would accept.
	acked bool
	// reset: a batch with pid failed for good, so its outcome is unknown
	// (or it was refused) and the sequence has a hole: the next batch sent
	// once nothing is in flight starts a new producer id at sequence 0.
	reset    bool
	inflight []int64 // base sequences of pid's batches sent and not finished, ascending
}

// sticky is the partition records without key (and without manual
// partitions) go to, an open batch at a time. Guarded by Producer.mu.
type sticky struct {
	part int32
	cur  *batch // the open batch they went into last
}

// newProducerID returns a random non-zero producer id.
func newProducerID() uint64 {
	var b [8]byte
	for {
		if _, err := crand.Read(b[:]); err != nil {
			panic(fmt.Sprintf("herald: crypto/rand: %v", err)) // never fails on supported platforms
		}
		if id := binary.LittleEndian.Uint64(b[:]); id != 0 {
			return id
		}
	}
}

type pendingRecord struct {
	size int64
	cb   func(Result, error)
}

type batch struct {
	data []byte // encoded RecordBatch
	recs []pendingRecord
	// Idempotence: the producer id (0: none) and the sequence of the first
	// record, fixed when the batch is first sent and kept on every retry.
	pid uint64
	seq int64
	// Idempotence: the batches of a partition reach the connection in
	// sequence order (each is sent by its own goroutine): a batch's first
	// attempt waits for turn, closed once the previous batch's first
	// attempt is queued on its connection, and closes queued once its
	// own is (or once it failed before that).
	turn, queued chan struct{}
	queuedOnce   sync.Once
	// commit: a transaction's last batch, which commits it on its only
	// partition (ProduceRequest.commit_txn; markCommitLast), after the
	// producer's transaction of epoch after (if not nil) there; onQueued
	// runs once it is on the connection.
	commit   bool
	after    *uint32
	onQueued func()
}

// markQueued lets the partition's next batch go to the connection.
func (bt *batch) markQueued() {
	if bt.queued != nil || bt.onQueued != nil {
		bt.queuedOnce.Do(func() {
			if bt.queued != nil {
				close(bt.queued)
			}
			if bt.onQueued != nil {
				bt.onQueued()
			}
		})
	}
}

// batcher queues the batches of one (topic, partition). All fields are
// guarded by Producer.mu.
type batcher struct {
	key         batchKey
	maxInFlight int
	inFlight    int
	ready       []*batch      // sealed batches, sent in order
	lastQueued  chan struct{} // idempotence: closed once the last batch sent is queued on its connection
	cur         *batch        // open batch, still taking records
	lingerDue   bool          // cur may be sent now
	timer       *time.Timer
	// Bytes and records of the last sealed batch: a new batch starts with
	// about that much room, so that steady full batches do not grow their
	// buffers record by record.
	lastBytes, lastRecs int
}

// NewProducer returns a producer sending through c.
func (c *Client) NewProducer(opts ...ProducerOpt) *Producer {
	cfg := defaultProducerConfig()
	for _, o := range opts {
		o.applyProducer(&cfg)
	}
	return c.newProducer(cfg, &sync.Pool{})
}

// newProducer is NewProducer with its configuration made and its batch
// buffers' pool (a transaction's writer shares its producer's).
func (c *Client) newProducer(cfg producerConfig, bufs *sync.Pool) *Producer {
	p := &Producer{
		c:        c,
		cfg:      cfg,
		batchers: make(map[batchKey]*batcher),
		seqs:     make(map[batchKey]*seqState),
		sticky:   make(map[string]*sticky),
		bufs:     bufs,
	}
	if cfg.idempotent {
		p.pid = newProducerID()
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p
}

// Send produces m and waits for the broker's acknowledgement. It does not
// wait for the linger. On success it sets m.Partition and m.Offset and
// returns them. If ctx ends first Send returns ctx.Err(), and m may still be
// written.
func (p *Producer) Send(ctx context.Context, m *Message) (Result, error) {
	return sendSync(ctx, m, func(cb func(Result, error)) { p.send(ctx, m, cb, true) })
}

// sendSync runs send with a callback and waits for it (or ctx): the
// synchronous Send of the producers. On success m gets its partition and
// offset.
func sendSync(ctx context.Context, m *Message, send func(cb func(Result, error))) (Result, error) {
	type outcome struct {
		r   Result
		err error
	}
	ch := make(chan outcome, 1)
	send(func(r Result, err error) { ch <- outcome{r, err} })
	select {
	case o := <-ch:
		if o.err == nil {
			m.Partition, m.Offset = o.r.Partition, o.r.Offset
		}
		return o.r, o.err
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
}

// SendAsync buffers m for sending and calls cb exactly once with the
// outcome. cb runs on a producer goroutine (or, when m is rejected at once,
// on the caller's); callbacks of one partition run in order, and the
// partition's next batch is not sent until they return, so keep them short.
//
// SendAsync blocks while the producer's buffer is full, until space frees
// up or ctx ends (then cb gets ctx.Err()); with WithNonBlocking it fails
// with ErrBufferFull instead. Without WithManualPartitions a message may
// also wait on ctx for the topic's metadata (one with a key, or any not
// delayed with idempotence). With WithManualPartitions a negative
// Partition fails at once with ErrInvalidPartition. Once buffered, m is no
// longer tied to ctx: it is delivered or fails after the producer's
// retries. The producer does not modify m; do not modify m until cb runs.
func (p *Producer) SendAsync(ctx context.Context, m *Message, cb func(Result, error)) {
	if cb == nil {
		cb = func(Result, error) {}
	}
	p.send(ctx, m, cb, false)
}

// deliveryTime checks m's DeliverAt and Delay and returns them as a
// produce request's deliver_at_ms and delay_ms (both 0: not delayed).
func deliveryTime(m *Message) (at, delay int64, err error) {
	switch {
	case !m.DeliverAt.IsZero() && m.Delay != 0:
		return 0, 0, errors.New("herald: set DeliverAt or Delay, not both")
	case m.Delay < 0:
		return 0, 0, fmt.Errorf("herald: negative delay %v", m.Delay)
	case m.Delay > 0:
		delay = int64(max((m.Delay+time.Millisecond-1)/time.Millisecond, 1))
	case !m.DeliverAt.IsZero():
		if at = m.DeliverAt.UnixMilli(); at <= 0 {
			return 0, 0, fmt.Errorf("herald: DeliverAt %v before 1970", m.DeliverAt)
		}
	}
	return at, delay, nil
}

func (p *Producer) send(ctx context.Context, m *Message, cb func(Result, error), urgent bool) {
	if m == nil || m.Topic == "" {
		cb(Result{}, errors.New("herald: message without topic"))
		return
	}
	delayed := !m.DeliverAt.IsZero() || m.Delay != 0
	part := int32(-1) // any: picked below, or by the broker
	if p.cfg.manual {
		if m.Partition < 0 {
			cb(Result{}, fmt.Errorf("%w %d: with WithManualPartitions, Partition must be 0 or more", ErrInvalidPartition, m.Partition))
			return
		}
		part = m.Partition
	}
	nparts := 0 // partitions to spread records without key over (idempotence)
	if part < 0 {
		if len(m.Key) > 0 || p.cfg.idempotent && !delayed {
			n, err := p.c.Partitions(ctx, m.Topic)
			if err != nil {
				cb(Result{}, err)
				return
			}
			if n == 0 {
				cb(Result{}, &Error{Code: heraldpb.ErrorCode_PARTITION_NOT_FOUND, Message: fmt.Sprintf("topic %q has no partitions", m.Topic)})
				return
			}
			if len(m.Key) > 0 {
				part = int32(PartitionForKey(m.Key, uint32(n)))
			} else {
				nparts = n
			}
		}
	}
	at, delay, err := deliveryTime(m)
	if err != nil {
		cb(Result{}, err)
		return
	}
	size := estimateSize(m)
	if err := p.reserve(ctx, size); err != nil {
		cb(Result{}, err)
		return
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		p.releaseLocked(size, 1)
		p.mu.Unlock()
		cb(Result{}, ErrClosed)
		p.mu.Lock()
		return
	}
	var st *sticky
	if nparts > 0 {
		st = p.stickyLocked(m.Topic, nparts, size)
		part = st.part
	}
	key := batchKey{topic: m.Topic, partition: part, at: at, delay: delay}
	b := p.batchers[key]
	if b == nil {
		b = &batcher{key: key, maxInFlight: p.cfg.partInFlight}
		if part < 0 {
			b.maxInFlight = p.cfg.anyInFlight
		} else if p.idempotent(key) {
			b.maxInFlight = min(b.maxInFlight, maxIdempotentInFlight)
		}
		p.batchers[key] = b
	}
	if b.cur == nil {
		p.openLocked(b)
	}
	start := len(b.cur.data)
	data, err := encodeRecord(b.cur.data, m)
	if err != nil {
		b.cur.data = data[:start]
		p.releaseLocked(size, 1)
		p.mu.Unlock()
		cb(Result{}, err)
		p.mu.Lock()
		return
	}
	b.cur.data = data
	rec := pendingRecord{size: size, cb: cb}
	if len(b.cur.data) > p.cfg.batchBytes && start > 0 {
		// The record overflows the open batch: seal the batch without it
		// and start the next batch with it.
		// The record's bytes stay in the sealed batch's buffer, past its
		// length, until they are copied: nothing writes there before the
		// batch is sent, and that needs p.mu.
		tail := b.cur.data[start:]
		b.cur.data = b.cur.data[:start]
		p.sealLocked(b)
		p.openLocked(b)
		b.cur.data = append(b.cur.data, tail...)
	}
	b.cur.recs = append(b.cur.recs, rec)
	if st != nil {
		st.cur = b.cur
	}
	if len(b.cur.data) >= p.cfg.batchBytes || key.delayed() {
		p.sealLocked(b)
	} else if urgent {
		b.lingerDue = true
	}
	p.drainLocked(b)
}

// idempotent reports whether the batches of key carry sequences: those of
// one partition, not delayed, of an idempotent producer.
func (p *Producer) idempotent(key batchKey) bool {
	return p.cfg.idempotent && key.partition >= 0 && !key.delayed()
}

// stickyLocked returns the partition state for the next record of topic
// without key (and without manual partitions), of about size bytes: the
// partition of the open batch the previous such record joined, or the
// next partition once that batch was sealed or would overflow with this
// record (it is sealed then). The first partition is random, so that
// producers spread.
func (p *Producer) stickyLocked(topic string, n int, size int64) *sticky {
	st := p.sticky[topic]
	if st == nil {
		st = &sticky{part: int32(rand.IntN(n))}
		p.sticky[topic] = st
	}
	if int(st.part) >= n {
		st.part, st.cur = 0, nil // the topic has fewer partitions now
	}
	if st.cur != nil {
		b := p.batchers[batchKey{topic: topic, partition: st.part}]
		if b != nil && b.cur == st.cur && len(b.cur.data)+int(size) > p.cfg.batchBytes {
			p.sealLocked(b)
			p.drainLocked(b)
		}
		if b == nil || b.cur != st.cur {
			st.part, st.cur = (st.part+1)%int32(n), nil
		}
	}
	return st
}

func estimateSize(m *Message) int64 {
	n := len(m.Key) + len(m.Value) + 16
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value) + 4
	}
	for _, t := range m.Tags {
		n += len(t) + 2
	}
	return int64(n)
}

// reserve takes size bytes of the buffer, waiting while it is full. A record
// larger than the whole buffer is admitted when the buffer is empty.
func (p *Producer) reserve(ctx context.Context, size int64) error {
	p.mu.Lock()
	for {
		if p.closed {
			p.mu.Unlock()
			return ErrClosed
		}
		if p.buffered == 0 || p.buffered+size <= p.cfg.bufferBytes {
			p.buffered += size
			p.records++
			p.mu.Unlock()
			return nil
		}
		if p.cfg.nonBlocking {
			p.mu.Unlock()
			return ErrBufferFull
		}
		if p.txn != nil {
			// A transaction's writer holds its last batches for the commit
			// (holdForCommit): a full buffer sends them.
			for _, b := range p.batchers {
				if b.cur != nil && len(b.cur.recs) > 0 {
					b.lingerDue = true
					p.drainLocked(b)
				}
			}
		}
		freed := p.freed.wait()
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-freed:
		}
		p.mu.Lock()
	}
}

func (p *Producer) releaseLocked(size int64, records int) {
	p.buffered -= size
	p.records -= records
	p.freed.fire()
}

// signal tells its waiters that something changed: a waiter takes wait's
// channel, and fire closes it. The channel is made only when someone
// waits (most changes have no one waiting), under its owner's lock.
type signal struct{ ch chan struct{} }

// fire wakes the waiters, if any.
func (s *signal) fire() {
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// wait is the channel the next fire closes.
func (s *signal) wait() <-chan struct{} {
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// getBuf returns an empty batch buffer, reused when one is available, or
// else new with room for about hint bytes.
func (p *Producer) getBuf(hint int) []byte {
	if bp, ok := p.bufs.Get().(*[]byte); ok {
		return (*bp)[:0]
	}
	if hint <= 0 {
		return nil
	}
	return make([]byte, 0, hint+hint/8)
}

// putBuf makes buf, no longer referenced, available to later batches. A
// buffer grown far beyond the batch size by a large record is dropped.
func (p *Producer) putBuf(buf []byte) {
	if buf == nil || cap(buf) > 2*p.cfg.batchBytes+64<<10 {
		return
	}
	buf = buf[:0]
	p.bufs.Put(&buf)
}

// openLocked starts a new open batch in b and arms its linger timer.
func (p *Producer) openLocked(b *batcher) {
	bt := &batch{data: p.getBuf(b.lastBytes)}
	if b.lastRecs > 0 {
		bt.recs = make([]pendingRecord, 0, b.lastRecs+b.lastRecs/8)
	} else {
		bt.recs = make([]pendingRecord, 0, 16) // (a new batcher: one allocation for a small batch)
	}
	b.cur = bt
	b.lingerDue = p.cfg.linger <= 0
	if p.cfg.linger > 0 && p.cfg.linger < holdForCommit { // (held for the commit: no timer)
		b.timer = time.AfterFunc(p.cfg.linger, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if b.cur == bt {
				b.lingerDue = true
				p.drainLocked(b)
			}
		})
	}
}

// sealLocked moves the open batch to the ready queue.
func (p *Producer) sealLocked(b *batcher) {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	if b.cur != nil && len(b.cur.recs) > 0 {
		b.ready = append(b.ready, b.cur)
		b.lastBytes, b.lastRecs = len(b.cur.data), len(b.cur.recs)
	}
	b.cur = nil
	b.lingerDue = false
}

// drainLocked starts sending b's batches while its in-flight limit allows.
// An idempotent batch gets its producer id and sequence here, when it is
// first sent.
func (p *Producer) drainLocked(b *batcher) {
	var st *seqState
	if p.idempotent(b.key) {
		if st = p.seqs[b.key]; st == nil {
			st = &seqState{pid: p.pid}
			p.seqs[b.key] = st
		}
	}
	for b.inFlight < b.maxInFlight {
		if st != nil && (st.reset || !st.acked) && b.inFlight > 0 {
			return // one at a time until the producer id has a batch through
		}
		if len(b.ready) == 0 {
			if b.cur == nil || len(b.cur.recs) == 0 || !(b.lingerDue || p.flushing > 0) {
				return
			}
			p.sealLocked(b)
			if len(b.ready) == 0 {
				return
			}
		}
		bt := b.ready[0]
		b.ready[0] = nil
		b.ready = b.ready[1:]
		if st != nil {
			if st.reset {
				st.pid, st.next, st.acked, st.reset = newProducerID(), 0, false, false
				st.inflight = st.inflight[:0] // empty: nothing is in flight
			}
			bt.pid, bt.seq = st.pid, st.next
			st.next += int64(len(bt.recs))
			st.inflight = append(st.inflight, bt.seq)
			bt.turn, bt.queued = b.lastQueued, make(chan struct{})
			b.lastQueued = bt.queued
		} else if p.cfg.idempotent && b.key.delayed() && p.txn == nil && !p.delayedPlain.Load() {
			if p.delayedPid == 0 {
				p.delayedPid = newProducerID()
			}
			bt.pid, bt.seq = p.delayedPid, p.delayedSeq
			p.delayedSeq++
		}
		if t := p.txn; t != nil && t.commitLast && len(b.ready) == 0 && (b.cur == nil || len(b.cur.recs) == 0) {
			bt.commit, bt.after, bt.onQueued = true, t.after, t.onQueued
		}
		b.inFlight++
		go p.run(b, bt)
	}
}

// settleLocked records the outcome of an idempotent batch in its
// partition's sequence state.
func (p *Producer) settleLocked(key batchKey, bt *batch, err error) {
	st := p.seqs[key]
	if st == nil || bt.pid == 0 || bt.pid != st.pid {
		return // of a producer id since replaced
	}
	if i := slices.Index(st.inflight, bt.seq); i >= 0 {
		st.inflight = append(st.inflight[:i], st.inflight[i+1:]...)
	}
	if err != nil {
		// (A transaction's writer keeps its producer id: the failure
		// fails the transaction, which its next batch cannot mend.)
		st.reset = p.txn == nil
	} else {
		st.acked = true
	}
}

// earlierInFlight reports whether a batch of key's producer id bt.pid with
// a lower sequence than bt's is still unresolved: bt may then have been
// refused as out of order only because that one has not been written yet.
func (p *Producer) earlierInFlight(key batchKey, bt *batch) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.seqs[key]
	return st != nil && st.pid == bt.pid && len(st.inflight) > 0 && st.inflight[0] < bt.seq
}

// run sends one batch with retries, completes its records in order, then
// lets the batcher send its next batch.
func (p *Producer) run(b *batcher, bt *batch) {
	resp, err := p.produce(b.key, bt)
	var size int64
	for i, r := range bt.recs {
		size += r.size
		if err != nil {
			r.cb(Result{}, err)
			continue
		}
		off := int64(-1)
		if resp.GetBaseOffset() >= 0 && p.cfg.acks != AcksNone {
			off = resp.GetBaseOffset() + int64(i)
		}
		res := Result{Partition: int32(resp.GetPartition()), Offset: off, ScheduleID: resp.GetScheduleId()}
		if resp.GetScheduleId() != "" {
			res.DeliverAt = time.UnixMilli(resp.GetDeliverAtMs())
		}
		r.cb(res, nil)
	}
	p.putBuf(bt.data)
	bt.data = nil
	p.mu.Lock()
	defer p.mu.Unlock()
	p.settleLocked(b.key, bt, err)
	b.inFlight--
	p.releaseLocked(size, len(bt.recs))
	p.drainLocked(b)
	if b.inFlight == 0 && b.cur == nil && len(b.ready) == 0 && p.batchers[b.key] == b {
		delete(p.batchers, b.key)
	}
}

// produce sends one batch, retrying retryable errors with exponential
// backoff (at least the broker's retry-after) up to MaxRetries times.
func (p *Producer) produce(key batchKey, bt *batch) (*heraldpb.ProduceResponse, error) {
	req := &heraldpb.ProduceRequest{
		Topic:       key.topic,
		Acks:        p.cfg.acks,
		Records:     bt.data,
		DeliverAtMs: key.at,
		DelayMs:     uint64(key.delay),
	}
	if key.partition >= 0 {
		part := uint32(key.partition)
		req.Partition = &part
	}
	if bt.pid != 0 {
		// Every attempt carries the same sequence: the partition writes
		// the batch once.
		req.ProducerId, req.BaseSequence = bt.pid, bt.seq
	}
	if t := p.txn; t != nil {
		req.TxnBatch, req.TransactionalId, req.ProducerEpoch = true, t.id, t.epoch
		req.CommitTxn, req.TxnCommitAfter = bt.commit, bt.after
	}
	if t := p.c.cfg.requestTimeout; t > 0 {
		req.TimeoutMs = uint32(t / time.Millisecond)
	}
	backoff := p.cfg.backoffMin
	var waitingSince time.Time // the first failure of a leader move or a wait
	unknown := false           // an attempt may have been written
	// An idempotent delayed batch is retried only while the scheduler
	// remembers its first attempt (its dedup window).
	delayedIdem, first := bt.pid != 0 && key.delayed(), time.Now()
	for attempt := 0; ; attempt++ {
		// An earlier batch of the partition unresolved when this attempt
		// leaves may make the partition refuse it as out of order.
		earlier := bt.pid != 0 && p.earlierInFlight(key, bt)
		if attempt == 0 && bt.turn != nil {
			select {
			case <-bt.turn:
			case <-p.ctx.Done():
				bt.markQueued()
				return nil, ErrClosed
			}
		}
		resp, sent, err := p.produceOnce(req, key, bt.markQueued)
		if err == nil {
			return resp, nil
		}
		if sent && (IsOutcomeUnknown(err) || errors.Is(err, ErrRequestTimeout) || errors.Is(err, ErrConnectionLost)) {
			unknown = true
		}
		if p.ctx.Err() != nil {
			return nil, p.final(ErrClosed, unknown)
		}
		moving := leaderMoving(err)
		waiting := moving || waitOut(err)
		if waiting && waitingSince.IsZero() {
			waitingSince = time.Now()
		}
		if delayedIdem && IsCode(err, heraldpb.ErrorCode_INVALID_REQUEST) && strings.Contains(err.Error(), "cannot be idempotent") {
			// A broker from before delayed batches were idempotent
			// (a rolling upgrade): this producer's delayed batches go
			// without producer id to it from now on, at least once.
			p.delayedPlain.Store(true)
			req.ProducerId, req.BaseSequence = 0, 0
			delayedIdem = false
			attempt--
			continue
		}
		if earlier && IsCode(err, heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE) {
			// It follows that batch once it is written. Not counted as a
			// retry: the earlier batch's own retries bound the wait, and
			// an attempt sent when none is left unresolved fails for good.
			attempt--
		} else if !IsRetryable(err) || (attempt >= p.cfg.maxRetries && !(waiting && time.Since(waitingSince) < p.cfg.failover)) {
			return nil, p.final(err, unknown)
		}
		if IsCode(err, heraldpb.ErrorCode_NOT_LEADER) {
			p.c.notLeader(key.topic, key.partition, err)
		}
		wait := backoff
		if moving {
			wait = min(wait, failoverBackoff)
		}
		ra := retryAfter(err)
		if ra > wait {
			wait = ra
		}
		// THROTTLED with a hint: the hint is the broker's measure of
		// when this connection is within its share again, so wait that,
		// not a backoff that grows with each refusal.
		hinted := IsCode(err, heraldpb.ErrorCode_THROTTLED) && ra > 0
		if hinted {
			wait = ra
		}
		if delayedIdem && time.Since(first)+wait+p.c.cfg.requestTimeout > delayedRetrySpan {
			// A later attempt might come after the scheduler forgot the
			// first, and be stored a second time.
			return nil, p.final(err, unknown)
		}
		p.retries.Add(1)
		p.c.cfg.logger.Debug("herald: produce retry", "topic", key.topic, "partition", key.partition, "attempt", attempt+1, "wait", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-p.ctx.Done():
			t.Stop()
			return nil, p.final(ErrClosed, unknown)
		}
		if !hinted {
			backoff = min(2*backoff, p.cfg.backoffMax)
		}
	}
}

// final is the error a batch fails with: err, marked ErrOutcomeUnknown
// when an attempt may have been written.
func (p *Producer) final(err error, unknown bool) error {
	if unknown && !IsOutcomeUnknown(err) {
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	return err
}

// leaderCheck is how long a produce waits for its answer before the
// producer asks another broker whether the partition's leader changed,
// and how often it asks again while the answer does not come. A leader
// that is frozen (a stopped process, a stalled disk) does not answer, and
// its followers elect another within about a second.
const leaderCheck = 500 * time.Millisecond

// produceOnce sends one attempt; queued runs once the request is queued on
// its connection, or once the attempt failed before that. sent reports
// whether the request was queued on a connection.
//
// While the answer does not come, the producer asks another broker for
// the partition's leader every leaderCheck: once that names another node,
// the attempt gives up with a NOT_LEADER *Error (OutcomeUnknown) naming
// it, and the frozen broker is tried last for a while (markSuspect). A
// request timeout marks its broker the same way and drops the topic's
// metadata, so the retry asks another broker where the leader is. A
// NOT_LEADER naming no leader asks another broker at once
// (unknownLeaderMoved): a leader cut off from the other nodes steps down
// and knows no leader while they have elected one. NOT_READY does the
// same (notReadyMoved): a node still starting leads nothing, while the
// metadata cached from before its restart names it.
func (p *Producer) produceOnce(req *heraldpb.ProduceRequest, key batchKey, queued func()) (_ *heraldpb.ProduceResponse, sent bool, _ error) {
	defer queued()
	cn, err := p.c.leaderConn(p.ctx, key.topic, key.partition)
	if err != nil {
		return nil, false, err
	}
	// A transaction's commit batch does not wait at the gate: a partition
	// may hold it, written, until the producer's commit before it there
	// arrives, and held it would keep the gate's last slot from that one
	// after a THROTTLED (both then waited for the partition to give up on
	// it, 10 s). The transactions a producer has in flight bound them.
	gated := !req.CommitTxn
	if gated {
		if err := cn.gate.acquire(p.ctx); err != nil {
			return nil, false, ErrClosed
		}
	}
	throttled := false
	defer func() {
		if gated {
			cn.gate.release(throttled, retryAfter(err))
		}
	}()
	frame := &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: req}}
	ch, err := cn.send(p.ctx, func(dst []byte, id uint64) ([]byte, error) {
		frame.Id = id
		return heraldpb.AppendFrame(dst, frame)
	}, nil)
	queued()
	if err != nil {
		return nil, false, err
	}
	timeout := p.c.cfg.requestTimeout
	var f *heraldpb.Frame
	if key.partition < 0 {
		f, err = cn.await(p.ctx, ch, timeout)
	} else {
		f, err = cn.awaitWatched(p.ctx, ch, timeout, leaderCheck, func() error {
			leader := p.c.leaderMovedFrom(p.ctx, cn, key.topic, key.partition)
			if leader == 0 {
				return nil // no news: keep waiting
			}
			return &Error{Code: heraldpb.ErrorCode_NOT_LEADER, Retriable: true, Leader: leader, OutcomeUnknown: true,
				Message: fmt.Sprintf("node %d (%s) has not answered a produce to %s-%d; node %d leads it now", cn.nodeID, cn.addr, key.topic, key.partition, leader)}
		})
	}
	if errors.Is(err, ErrRequestTimeout) {
		p.c.markSuspect(cn.addr, suspectFor)
		p.c.invalidate(key.topic)
	}
	p.c.unknownLeaderMoved(p.ctx, cn, key.topic, key.partition, err)
	if IsCode(err, heraldpb.ErrorCode_NOT_READY) {
		err = p.c.notReadyMoved(p.ctx, cn, key.topic, key.partition, err)
	}
	if IsCode(err, heraldpb.ErrorCode_THROTTLED) {
		p.throttled.Add(1)
		throttled = true
	}
	if err != nil {
		return nil, true, err
	}
	r := f.GetProduceResponse()
	if r == nil {
		return nil, true, unexpected(f, "ProduceResponse")
	}
	return r, true, nil
}

// Flush sends every buffered message at once and waits until all messages
// accepted before the call have completed (their callbacks have returned),
// or ctx ends. Messages accepted during Flush are waited for too.
func (p *Producer) Flush(ctx context.Context) error {
	p.mu.Lock()
	p.flushing++
	for _, b := range p.batchers {
		p.drainLocked(b)
	}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.flushing--
		p.mu.Unlock()
	}()
	for {
		p.mu.Lock()
		if p.records == 0 {
			p.mu.Unlock()
			return nil
		}
		freed := p.freed.wait()
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-freed:
		}
	}
}

// Close stops accepting messages (SendAsync then fails with ErrClosed),
// flushes, and returns when every buffered message has completed. If ctx
// ends first, the messages still buffered or in flight fail with ErrClosed
// (in-flight batches may nevertheless be written) and Close returns
// ctx.Err(). Close does not close the Client.
func (p *Producer) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.Flush(ctx)
	if err != nil {
		p.cancel()
		_ = p.Flush(context.Background()) // bounded: every send now fails fast
	}
	p.cancel()
	return err
}

// ProducerStats are a producer's counters since it was created.
type ProducerStats struct {
	// Throttled counts produce attempts the broker answered THROTTLED
	// (overload: admission control, a saturated partition). The producer
	// retries them after the broker's retry-after, holding its other
	// produces to the same broker meanwhile; they fail only if still
	// throttled after WithFailoverTimeout.
	Throttled uint64
	// Retries counts produce attempts sent again after a retryable error
	// (THROTTLED included).
	Retries uint64
}

// Stats returns the producer's counters. Safe for concurrent use.
func (p *Producer) Stats() ProducerStats {
	return ProducerStats{Throttled: p.throttled.Load(), Retries: p.retries.Load()}
}

// Buffered returns the number of messages accepted and not yet completed.
func (p *Producer) Buffered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.records
}

// onlyPartition is the one partition a transaction's writer has records
// for (sent or not), if there is exactly one.
func (p *Producer) onlyPartition() (txnPart, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var key batchKey
	n := 0
	for k := range p.seqs {
		key, n = k, n+1
	}
	for k := range p.batchers {
		if _, ok := p.seqs[k]; !ok {
			key, n = k, n+1
		}
	}
	if n != 1 || key.partition < 0 {
		return txnPart{}, false
	}
	return txnPart{key.topic, key.partition}, true
}

// markCommitLast makes the transaction's last batch commit it (a
// transaction's writer, with one partition: onlyPartition), after the
// producer's transaction of epoch after there (if not nil); queued (if
// not nil) runs once that batch is on the connection. It reports whether
// it could: not once that partition's last batch was sent.
func (p *Producer) markCommitLast(after *uint32, queued func()) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.batchers) != 1 {
		return false
	}
	for _, b := range p.batchers {
		if len(b.ready) == 0 && (b.cur == nil || len(b.cur.recs) == 0) {
			return false
		}
	}
	p.txn.commitLast, p.txn.after, p.txn.onQueued = true, after, queued
	return true
}
