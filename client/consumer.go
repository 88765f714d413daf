package client

import (
	"context"
	"fmt"
	"sync"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Offsets is the answer of ListOffsets.
type Offsets struct {
	Offset        int64 // the offset asked for
	LogStart      int64 // first offset still stored
	HighWatermark int64 // offset the next committed record will get
	// InSyncReplicas are the node ids of the replicas in sync with the
	// leader that answered (itself included), sorted; empty from a broker
	// that does not report them.
	InSyncReplicas []uint32
	// BytesOut is the record bytes the answering replica has served to
	// fetches since it started.
	BytesOut uint64
}

// ListOffsets looks up an offset of a partition: spec OffsetEarliest (the
// log start), OffsetLatest (the high watermark) or OffsetTimestamp (the
// first record with timestamp >= ts; the high watermark when there is
// none); ts is used only with OffsetTimestamp. It goes to the partition's
// leader, and to a new one when that leader does not answer, as Fetch does:
//
//	o, err := c.ListOffsets(ctx, "orders", 0, client.OffsetLatest, time.Time{})
func (c *Client) ListOffsets(ctx context.Context, topic string, partition int32, spec heraldpb.OffsetSpec, ts time.Time) (Offsets, error) {
	if partition < 0 {
		return Offsets{}, fmt.Errorf("herald: ListOffsets needs a partition, got %d", partition)
	}
	req := &heraldpb.ListOffsetsRequest{Topic: topic, Partition: uint32(partition), Spec: spec}
	if spec == OffsetTimestamp {
		req.TimestampMs = ts.UnixMilli()
	}
	f, err := c.callLeader(ctx, topic, partition, &heraldpb.Frame{Body: &heraldpb.Frame_ListOffsets{ListOffsets: req}}, 0)
	if err != nil {
		return Offsets{}, err
	}
	r := f.GetListOffsetsResponse()
	if r == nil {
		return Offsets{}, unexpected(f, "ListOffsetsResponse")
	}
	return Offsets{Offset: r.GetOffset(), LogStart: r.GetLogStartOffset(), HighWatermark: r.GetHighWatermark(), InSyncReplicas: r.GetInSyncReplicas(), BytesOut: r.GetBytesOut()}, nil
}

// FetchResult is the answer of Fetch.
type FetchResult struct {
	// Messages at offsets >= the requested offset, in offset order.
	Messages      []*Message
	HighWatermark int64
	LogStart      int64
	// NextOffset is the offset to fetch next: one past the last message, or
	// the requested offset when there were none.
	NextOffset int64
}

// Fetch reads committed messages of one partition from offset. When none are
// available it long-polls up to maxWait. maxBytes caps the response (the
// broker returns at least one batch). An offset outside [log start, high
// watermark] fails with an OFFSET_OUT_OF_RANGE *Error.
//
// Fetch goes to the partition's leader. A leader that does not answer
// within maxWait plus 500 ms (a frozen process, a stalled disk) is asked
// about at another broker every 500 ms; once that names a new leader, the
// fetch is sent there, in the same call (see callLeader). A request
// timeout or a lost connection does the same when another broker already
// names a new leader; otherwise Fetch returns the (retryable) error.
func (c *Client) Fetch(ctx context.Context, topic string, partition int32, offset int64, maxBytes int, maxWait time.Duration) (*FetchResult, error) {
	if partition < 0 {
		return nil, fmt.Errorf("herald: Fetch needs a partition, got %d", partition)
	}
	req := &heraldpb.FetchRequest{
		Topic:     topic,
		Partition: uint32(partition),
		Offset:    offset,
		MaxBytes:  uint32(max(maxBytes, 0)),
		MaxWaitMs: uint32(max(maxWait, 0) / time.Millisecond),
	}
	f, err := c.callLeader(ctx, topic, partition, &heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: req}}, maxWait)
	if err != nil {
		return nil, err
	}
	r := f.GetFetchResponse()
	if r == nil {
		return nil, unexpected(f, "FetchResponse")
	}
	res := &FetchResult{HighWatermark: r.GetHighWatermark(), LogStart: r.GetLogStartOffset(), NextOffset: offset}
	for _, b := range r.GetBatches() {
		if res.Messages, err = decodeBatch(topic, partition, b, offset, res.Messages); err != nil {
			return nil, err
		}
	}
	if n := len(res.Messages); n > 0 {
		res.NextOffset = res.Messages[n-1].Offset + 1
	}
	return res, nil
}

// StartPosition says where a consumer starts reading a partition. The zero
// StartPosition means "the default of whatever takes it": Earliest for the
// pull consumers (NewConsumer, NewPartitionConsumer), Latest for Subscribe.
type StartPosition struct {
	kind   int
	offset int64
	time   time.Time
}

const (
	startDefault = iota
	startEarliest
	startLatest
	startOffset
	startTime
)

// IsZero reports whether s is the zero StartPosition (no position chosen).
func (s StartPosition) IsZero() bool { return s.kind == startDefault }

// Earliest starts at the oldest stored record.
func Earliest() StartPosition { return StartPosition{kind: startEarliest} }

// Latest starts at the high watermark: only records written from now on.
func Latest() StartPosition { return StartPosition{kind: startLatest} }

// AtOffset starts at offset n. An n below the log start starts at the log
// start; an n past the high watermark starts at the high watermark.
func AtOffset(n int64) StartPosition { return StartPosition{kind: startOffset, offset: n} }

// AtTime starts at the first record with a timestamp at or after t.
func AtTime(t time.Time) StartPosition { return StartPosition{kind: startTime, time: t} }

func (s StartPosition) String() string {
	switch s.kind {
	case startDefault:
		return "default"
	case startEarliest:
		return "earliest"
	case startLatest:
		return "latest"
	case startOffset:
		return fmt.Sprintf("offset %d", s.offset)
	default:
		return s.time.Format(time.RFC3339Nano)
	}
}

// PartitionConsumer reads one partition in order with long-polling fetches.
// It is not safe for concurrent use: one goroutine calls Poll.
type PartitionConsumer struct {
	c         *Client
	cfg       consumerConfig
	topic     string
	partition int32
	from      StartPosition

	resolved bool
	next     int64 // offset of the next record to return
	hw       int64 // high watermark from the last fetch
	logStart int64
}

// NewPartitionConsumer returns a consumer of one partition starting at from.
// The start is resolved on the first Poll (or by Seek).
func (c *Client) NewPartitionConsumer(topic string, partition int32, from StartPosition, opts ...ConsumerOpt) *PartitionConsumer {
	cfg := defaultConsumerConfig()
	for _, o := range opts {
		o.applyConsumer(&cfg)
	}
	return &PartitionConsumer{c: c, cfg: cfg, topic: topic, partition: partition, from: from, hw: -1}
}

// Topic and Partition say what the consumer reads.
func (pc *PartitionConsumer) Topic() string    { return pc.topic }
func (pc *PartitionConsumer) Partition() int32 { return pc.partition }

// Position returns the offset of the next message Poll returns, and false
// while the start position has not been resolved yet.
func (pc *PartitionConsumer) Position() (int64, bool) { return pc.next, pc.resolved }

// HighWatermark returns the high watermark seen by the last fetch, or -1.
func (pc *PartitionConsumer) HighWatermark() int64 { return pc.hw }

// Resolve looks up the start position now, if it was not resolved yet.
func (pc *PartitionConsumer) Resolve(ctx context.Context) error {
	if pc.resolved {
		return nil
	}
	var (
		o   Offsets
		err error
	)
	switch pc.from.kind {
	case startEarliest, startDefault:
		o, err = pc.c.ListOffsets(ctx, pc.topic, pc.partition, OffsetEarliest, time.Time{})
	case startLatest:
		o, err = pc.c.ListOffsets(ctx, pc.topic, pc.partition, OffsetLatest, time.Time{})
	case startTime:
		o, err = pc.c.ListOffsets(ctx, pc.topic, pc.partition, OffsetTimestamp, pc.from.time)
	case startOffset:
		o.Offset = pc.from.offset
	}
	if err != nil {
		return err
	}
	pc.next, pc.resolved = o.Offset, true
	if o.HighWatermark > 0 || pc.from.kind != startOffset {
		pc.hw, pc.logStart = o.HighWatermark, o.LogStart
	}
	return nil
}

// Poll returns the next messages, long-polling up to the fetch max wait
// (WithFetchMaxWait) when there are none; it may return no messages and no
// error. When the position has fallen below the log start (retention) or
// past the high watermark, it moves to the nearer end and polls again.
func (pc *PartitionConsumer) Poll(ctx context.Context) ([]*Message, error) {
	if err := pc.Resolve(ctx); err != nil {
		return nil, err
	}
	res, err := pc.c.Fetch(ctx, pc.topic, pc.partition, pc.next, pc.cfg.maxBytes, pc.cfg.maxWait)
	if IsCode(err, heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE) {
		o, lerr := pc.c.ListOffsets(ctx, pc.topic, pc.partition, OffsetEarliest, time.Time{})
		if lerr != nil {
			return nil, lerr
		}
		switch {
		case pc.next < o.LogStart:
			pc.next = o.LogStart
		case pc.next > o.HighWatermark:
			pc.next = o.HighWatermark
		default:
			return nil, err
		}
		res, err = pc.c.Fetch(ctx, pc.topic, pc.partition, pc.next, pc.cfg.maxBytes, pc.cfg.maxWait)
	}
	if err != nil {
		return nil, err
	}
	pc.hw, pc.logStart = res.HighWatermark, res.LogStart
	pc.next = res.NextOffset
	return res.Messages, nil
}

// Consumer reads every partition of a topic (or a chosen subset) with one
// fetch loop per partition, and hands their messages out through Poll.
// Each partition loop holds at most one unconsumed fetch result, so memory
// is bounded by partitions × WithFetchMaxBytes. Retryable fetch errors are
// retried with backoff inside the loops; other errors are returned by Poll.
// Poll must be called from one goroutine; Close may be called from any.
type Consumer struct {
	c          *Client
	cfg        consumerConfig
	topic      string
	from       StartPosition
	partitions []int32 // nil: all

	startMu sync.Mutex
	started bool
	ctx     context.Context
	cancel  context.CancelFunc
	results chan partResult
	wg      sync.WaitGroup

	mu  sync.Mutex
	pos map[int32]int64 // next offset per partition, as delivered by Poll
}

type partResult struct {
	partition int32
	msgs      []*Message
	next      int64
	err       error
}

// NewConsumer returns a consumer of topic starting every partition at from.
// With partitions given it reads only those; otherwise all partitions the
// topic has when the first Poll runs.
func (c *Client) NewConsumer(topic string, from StartPosition, partitions []int32, opts ...ConsumerOpt) *Consumer {
	cfg := defaultConsumerConfig()
	for _, o := range opts {
		o.applyConsumer(&cfg)
	}
	cs := &Consumer{c: c, cfg: cfg, topic: topic, from: from, partitions: partitions, pos: map[int32]int64{}}
	cs.ctx, cs.cancel = context.WithCancel(context.Background())
	return cs
}

func (cs *Consumer) start(ctx context.Context) error {
	cs.startMu.Lock()
	defer cs.startMu.Unlock()
	if cs.started {
		return nil
	}
	parts := cs.partitions
	if parts == nil {
		n, err := cs.c.Partitions(ctx, cs.topic)
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			parts = append(parts, int32(i))
		}
	}
	pcs := make([]*PartitionConsumer, len(parts))
	for i, p := range parts {
		pcs[i] = &PartitionConsumer{c: cs.c, cfg: cs.cfg, topic: cs.topic, partition: p, from: cs.from, hw: -1}
		// Resolve now, so that Latest means the time of the first Poll. A
		// retryable failure is resolved again by the partition's loop.
		if err := pcs[i].Resolve(ctx); err != nil && !IsRetryable(err) {
			return err
		}
	}
	cs.started = true
	cs.results = make(chan partResult, len(parts))
	for _, pc := range pcs {
		if pc.resolved {
			cs.mu.Lock()
			cs.pos[pc.partition] = pc.next
			cs.mu.Unlock()
		}
		cs.wg.Add(1)
		go cs.loop(pc)
	}
	return nil
}

// loop fetches one partition until the consumer closes. It blocks on the
// results channel, so a partition is at most one result ahead of Poll.
func (cs *Consumer) loop(pc *PartitionConsumer) {
	defer cs.wg.Done()
	backoff := cs.cfg.backoffMin
	for cs.ctx.Err() == nil {
		msgs, err := pc.Poll(cs.ctx)
		if cs.ctx.Err() != nil {
			return
		}
		if err != nil && IsRetryable(err) {
			wait := max(backoff, retryAfter(err))
			backoff = min(2*backoff, cs.cfg.backoffMax)
			if IsCode(err, heraldpb.ErrorCode_NOT_LEADER) {
				cs.c.invalidate(cs.topic)
			}
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-cs.ctx.Done():
				t.Stop()
				return
			}
			continue
		}
		backoff = cs.cfg.backoffMin
		if err == nil && len(msgs) == 0 {
			continue
		}
		select {
		case cs.results <- partResult{partition: pc.partition, msgs: msgs, next: pc.next, err: err}:
		case <-cs.ctx.Done():
			return
		}
		if err != nil {
			return // a final error stops this partition
		}
	}
}

// Poll waits for messages from any partition and returns all that are ready,
// partition by partition in offset order. It returns when ctx ends (with
// ctx.Err()) and fails with ErrClosed after Close.
func (cs *Consumer) Poll(ctx context.Context) ([]*Message, error) {
	if cs.ctx.Err() != nil {
		return nil, ErrClosed
	}
	if err := cs.start(ctx); err != nil {
		return nil, err
	}
	var out []*Message
	take := func(r partResult) error {
		if r.err != nil {
			return fmt.Errorf("partition %d: %w", r.partition, r.err)
		}
		out = append(out, r.msgs...)
		cs.mu.Lock()
		cs.pos[r.partition] = r.next
		cs.mu.Unlock()
		return nil
	}
	select {
	case r := <-cs.results:
		if err := take(r); err != nil {
			return nil, err
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-cs.ctx.Done():
		return nil, ErrClosed
	}
	for {
		select {
		case r := <-cs.results:
			if err := take(r); err != nil {
				return out, err
			}
		default:
			return out, nil
		}
	}
}

// Positions returns the next offset per partition after the messages Poll
// has returned. Partitions whose start is not resolved yet are missing.
func (cs *Consumer) Positions() map[int32]int64 {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	m := make(map[int32]int64, len(cs.pos))
	for p, o := range cs.pos {
		m[p] = o
	}
	return m
}

// Close stops the fetch loops and waits for them.
func (cs *Consumer) Close() error {
	cs.cancel()
	cs.wg.Wait()
	return nil
}
