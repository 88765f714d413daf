package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Consume-transform-produce, exactly once. Every transaction holds the
// outputs of a run of input records and the progress (the next input
// offset), committed together or not at all: either as a consumer
// group's position (Group: SendOffsets, applied by the broker with the
// commit) or as a progress record in ProgressTopic, keyed by the
// transactional id. A transformer starting (or recovering from any
// failure) first starts a session of its transactional id, which fences
// the previous one and waits for or aborts its last transaction (a
// committed one's group offsets applied), and then reads the progress: no
// committed output is produced again, and no input is skipped.

// TransformFunc maps one input record to the records to produce for it
// (none, one or more, to any topics). It runs inside the transaction that
// will hold its outputs, and again for the same input when that
// transaction does not commit (after a failure or a restart), so it must
// not have effects outside its outputs that matter twice. An error stops
// TransformExactlyOnce (the transaction is aborted).
type TransformFunc func(ctx context.Context, in *Message) ([]*Message, error)

// TransformConfig configures TransformExactlyOnce.
type TransformConfig struct {
	// TransactionalID (required) names this transformer of one input
	// partition, for as long as its progress is kept: one process at a
	// time runs it (a new one fences the old). Give each input partition
	// its own, e.g. "enrich-orders-3".
	TransactionalID string
	// Topic and Partition (required) are the input.
	Topic     string
	Partition int32
	// Group or ProgressTopic (one of them, required) keeps the progress.
	//
	// Group: the progress is the consumer group's position in Partition
	// of Topic, committed with each transaction (SendOffsets), as Kafka's
	// consume-transform-produce keeps it. The group's lag shows how far
	// the transformer is behind; the group must not be consumed otherwise
	// (a member acknowledging records would move the position the
	// transformer resumes from). GroupTransform uses it.
	Group string
	// ProgressTopic holds progress records instead: one per transaction,
	// keyed by TransactionalID, value JSON {"topic","partition","next"}.
	// It must exist and keep its records (no retention_ms or
	// retention_bytes): the last progress record of a transactional id is
	// where it resumes. Many transformers may share one.
	ProgressTopic string
	// From is where to start when there is no progress yet (the zero
	// value: Earliest).
	From StartPosition
	// MaxRecords bounds the input records per transaction (default 500).
	MaxRecords int
	// MaxWait is the input fetches' long-poll wait (default
	// DefaultFetchMaxWait).
	MaxWait time.Duration
	// TransactionTimeout is the transactions' timeout
	// (WithTransactionTimeout; 0: the broker's).
	TransactionTimeout time.Duration
	// WrittenOnce writes the outputs once, straight to their partitions
	// (WithTxnWrittenOnce), instead of staging them.
	WrittenOnce bool
	// OnCommit, if set, is called after each transaction commits.
	OnCommit func(TransformCommit)
	// OnError, if set, is told of each failure TransformExactlyOnce
	// recovers from by starting over from the committed progress.
	OnError func(error)
}

// TransformCommit describes one committed transaction of
// TransformExactlyOnce.
type TransformCommit struct {
	// Partition is the input partition.
	Partition int32
	// From and To: the input offsets [From, To) it covered.
	From, To int64
	// Outputs is how many records it produced, the progress record not
	// counted.
	Outputs int
}

// Transform progress records.
const (
	// transformProgressScan is how many offsets of the progress partition
	// are read at a time, from the end backwards, to find the last
	// progress record of a transactional id.
	transformProgressScan = 256
	transformMaxBackoff   = 5 * time.Second
)

// transformProgress is the value of a progress record.
type transformProgress struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Next      int64  `json:"next"`
}

// transformStop marks an error that ends TransformExactlyOnce rather than
// being recovered from.
type transformStop struct{ err error }

func (e transformStop) Error() string { return e.err.Error() }
func (e transformStop) Unwrap() error { return e.err }

// TransformExactlyOnce reads cfg.Topic/cfg.Partition and produces fn's
// outputs for every input record exactly once: each transaction holds the
// outputs of up to cfg.MaxRecords input records and a progress record,
// committed together; on start and after any failure it resumes from the
// last committed progress (see TransformConfig.ProgressTopic).
//
// It runs until ctx ends (it then aborts the open transaction and returns
// ctx.Err()), fn returns an error (returned, wrapped), another process
// starts the same TransactionalID (ErrProducerFenced), or a failure it
// does not recover from: a configuration error, or a refusal that is not
// retryable (a missing output topic, a record too large). It recovers,
// with backoff up to 5 s, from retryable failures, a commit whose outcome
// is unknown and a transaction that timed out.
//
// Consumers of the outputs see each once whatever they read with: records
// of transactions that did not commit are never appended.
func (c *Client) TransformExactlyOnce(ctx context.Context, cfg TransformConfig, fn TransformFunc) error {
	switch {
	case fn == nil:
		return errors.New("herald: TransformExactlyOnce: nil function")
	case cfg.TransactionalID == "" || cfg.Topic == "":
		return errors.New("herald: TransformExactlyOnce: TransactionalID and Topic are required")
	case (cfg.Group == "") == (cfg.ProgressTopic == ""):
		return errors.New("herald: TransformExactlyOnce: one of Group and ProgressTopic is required")
	case cfg.Partition < 0:
		return fmt.Errorf("herald: TransformExactlyOnce: partition %d", cfg.Partition)
	case cfg.MaxRecords < 0:
		return fmt.Errorf("herald: TransformExactlyOnce: MaxRecords %d", cfg.MaxRecords)
	}
	if cfg.MaxRecords == 0 {
		cfg.MaxRecords = 500
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultFetchMaxWait
	}
	if cfg.From.IsZero() {
		cfg.From = Earliest()
	}
	for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, transformMaxBackoff) {
		progressed, err := c.transformSession(ctx, &cfg, fn)
		var stop transformStop
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &stop):
			return stop.err
		case errors.Is(err, ErrProducerFenced):
			return err
		case !IsRetryable(err) && !IsOutcomeUnknown(err) && !errors.Is(err, ErrTxnTimedOut):
			return err
		}
		if cfg.OnError != nil {
			cfg.OnError(err)
		}
		if progressed {
			backoff = 50 * time.Millisecond
		}
		if sleepCtx(ctx, backoff) != nil {
			return ctx.Err()
		}
	}
}

// transformSession runs one session: it starts the transactional id's
// session, reads its progress and transforms until an error. progressed
// reports whether a transaction committed.
func (c *Client) transformSession(ctx context.Context, cfg *TransformConfig, fn TransformFunc) (progressed bool, err error) {
	opts := []TxnOpt{WithTransactionTimeout(cfg.TransactionTimeout)}
	if cfg.WrittenOnce {
		opts = append(opts, WithTxnWrittenOnce())
	}
	tp, err := c.NewTransactionalProducer(ctx, cfg.TransactionalID, opts...)
	if err != nil {
		return false, err
	}
	defer func() {
		// Abort what is open, bounded: ctx may have ended.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tp.Close(cctx)
	}()
	// The session started: no earlier session can commit any more, and
	// what it committed is on its partitions.
	from, err := c.transformProgress(ctx, cfg)
	if err != nil {
		return false, err
	}
	pc := c.NewPartitionConsumer(cfg.Topic, cfg.Partition, from, WithFetchMaxWait(cfg.MaxWait))
	var batch []*Message
	for {
		if len(batch) == 0 {
			msgs, err := pc.Poll(ctx)
			if err != nil {
				return progressed, err
			}
			batch = msgs
			continue
		}
		n := min(len(batch), cfg.MaxRecords)
		if err := c.transformOnce(ctx, cfg, tp, batch[:n], fn); err != nil {
			return progressed, err
		}
		progressed = true
		batch = batch[n:]
	}
}

// transformOnce transforms ins, consecutive records of the input, in one
// transaction with their progress record.
func (c *Client) transformOnce(ctx context.Context, cfg *TransformConfig, tp *TransactionalProducer, ins []*Message, fn TransformFunc) error {
	if err := tp.Begin(); err != nil {
		return err
	}
	outputs := 0
	for _, in := range ins {
		outs, err := fn(ctx, in)
		if err != nil {
			_ = tp.Abort(ctx)
			return transformStop{fmt.Errorf("herald: transform of %s/%d at offset %d: %w", in.Topic, in.Partition, in.Offset, err)}
		}
		for _, out := range outs {
			tp.SendAsync(ctx, out, nil) // a failure fails the transaction: Commit says so
		}
		outputs += len(outs)
	}
	last := ins[len(ins)-1]
	if cfg.Group != "" {
		if err := tp.SendOffsets(cfg.Group, cfg.Topic, map[int32]int64{cfg.Partition: last.Offset + 1}); err != nil {
			_ = tp.Abort(ctx)
			return err
		}
	} else {
		v, err := json.Marshal(transformProgress{Topic: cfg.Topic, Partition: cfg.Partition, Next: last.Offset + 1})
		if err != nil {
			return transformStop{err}
		}
		tp.SendAsync(ctx, &Message{Topic: cfg.ProgressTopic, Key: []byte(cfg.TransactionalID), Value: v}, nil)
	}
	if _, err := tp.Commit(ctx); err != nil {
		return err
	}
	if cfg.OnCommit != nil {
		cfg.OnCommit(TransformCommit{Partition: cfg.Partition, From: ins[0].Offset, To: last.Offset + 1, Outputs: outputs})
	}
	return nil
}

// transformProgress returns where cfg's transformer resumes: after the
// last progress record of its transactional id, or cfg.From without one.
// It reads the progress partition backwards from its high watermark,
// transformProgressScan offsets at a time.
func (c *Client) transformProgress(ctx context.Context, cfg *TransformConfig) (StartPosition, error) {
	if cfg.Group != "" {
		return c.groupProgress(ctx, cfg)
	}
	ti, err := c.DescribeTopic(ctx, cfg.ProgressTopic)
	if err != nil {
		if IsCode(err, heraldpb.ErrorCode_TOPIC_NOT_FOUND) {
			return StartPosition{}, transformStop{fmt.Errorf("herald: progress topic %q: %w", cfg.ProgressTopic, err)}
		}
		return StartPosition{}, err
	}
	if rc := ti.GetConfig(); rc.GetRetentionMs() != 0 || rc.GetRetentionBytes() != 0 {
		return StartPosition{}, transformStop{fmt.Errorf("herald: progress topic %q has retention (%d ms, %d bytes): it must keep its records, or a transformer would start over",
			cfg.ProgressTopic, rc.GetRetentionMs(), rc.GetRetentionBytes())}
	}
	n := len(ti.GetPartitions())
	if n == 0 {
		return StartPosition{}, transformStop{fmt.Errorf("herald: progress topic %q has no partitions", cfg.ProgressTopic)}
	}
	part := int32(PartitionForKey([]byte(cfg.TransactionalID), uint32(n)))
	o, err := c.ListOffsets(ctx, cfg.ProgressTopic, part, OffsetLatest, time.Time{})
	if err != nil {
		return StartPosition{}, err
	}
	for hi := o.HighWatermark; hi > o.LogStart; {
		lo := max(o.LogStart, hi-transformProgressScan)
		var found *Message
		for off := lo; off < hi; {
			res, err := c.Fetch(ctx, cfg.ProgressTopic, part, off, DefaultFetchMaxBytes, 0)
			if err != nil {
				return StartPosition{}, err
			}
			if len(res.Messages) == 0 {
				break
			}
			for _, m := range res.Messages {
				if m.Offset < hi && string(m.Key) == cfg.TransactionalID {
					found = m
				}
			}
			off = res.NextOffset
		}
		if found != nil {
			var pr transformProgress
			if err := json.Unmarshal(found.Value, &pr); err != nil {
				return StartPosition{}, transformStop{fmt.Errorf("herald: progress record %s/%d@%d of %q: %w", cfg.ProgressTopic, part, found.Offset, cfg.TransactionalID, err)}
			}
			if pr.Topic != cfg.Topic || pr.Partition != cfg.Partition {
				return StartPosition{}, transformStop{fmt.Errorf("herald: transactional id %q holds the progress of %s/%d, not of %s/%d: give each input partition its own id",
					cfg.TransactionalID, pr.Topic, pr.Partition, cfg.Topic, cfg.Partition)}
			}
			return AtOffset(pr.Next), nil
		}
		hi = lo
	}
	return cfg.From, nil
}

// groupProgress returns where cfg's transformer resumes when its progress
// is cfg.Group's position: the group's ack floor of the partition, or
// cfg.From when the group has none. (Its session started first: the
// offsets of the last committed transaction are applied.)
func (c *Client) groupProgress(ctx context.Context, cfg *TransformConfig) (StartPosition, error) {
	gi, err := c.DescribeGroup(ctx, cfg.Group)
	switch {
	case IsCode(err, heraldpb.ErrorCode_GROUP_NOT_FOUND):
		return cfg.From, nil
	case err != nil:
		return StartPosition{}, err
	case gi.GetTopic() != "" && gi.GetTopic() != cfg.Topic:
		return StartPosition{}, transformStop{fmt.Errorf("herald: group %q consumes topic %q, not %q", cfg.Group, gi.GetTopic(), cfg.Topic)}
	}
	for _, p := range gi.GetPartitions() {
		if int32(p.GetPartition()) == cfg.Partition {
			return AtOffset(p.GetAckFloor()), nil
		}
	}
	return cfg.From, nil
}
