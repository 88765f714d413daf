package client

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Consume-transform-produce exactly once in a consumer group, in the
// style of franz-go's GroupTransactSession and of Kafka Streams'
// per-partition producers: the group (Clustering mode, AssignOnly) shares
// the input's partitions among the live transformers, and each assigned
// partition is transformed by TransformExactlyOnce under a transactional
// id of its own, "<TransactionalPrefix>-<topic>-<partition>". A member
// that takes a partition over starts that id's session, which fences the
// previous owner (its open transaction is aborted, its commit refused
// with ErrProducerFenced) and waits for its last committed transaction to
// be complete, its group offsets applied, before the new owner reads the
// progress. So whichever member holds a partition, and however often
// members die, each input record's outputs are committed once.
//
// The progress is the group's own position (DescribeGroup, the group's
// lag): each transaction commits the partition's next input offset with
// its outputs (SendOffsets), and the broker moves the group's position
// with the commit, never without it.

// GroupTransformConfig configures GroupTransform.
type GroupTransformConfig struct {
	// Group (required) is the consumer group the transformers share.
	Group string
	// Topic (required) is the input.
	Topic string
	// TransactionalPrefix (required) prefixes the partitions'
	// transactional ids. Every member of the group must use the same.
	TransactionalPrefix string
	// Name is the member's name in DescribeGroup (default: the broker's
	// name for the connection).
	Name string
	// From, MaxRecords, MaxWait, TransactionTimeout and WrittenOnce apply
	// to each partition, as in TransformConfig.
	From               StartPosition
	MaxRecords         int
	MaxWait            time.Duration
	TransactionTimeout time.Duration
	WrittenOnce        bool
	// OnCommit, if set, is called after each transaction commits, from
	// the goroutine of its partition.
	OnCommit func(TransformCommit)
	// OnError, if set, is told of each failure recovered from, with the
	// partition (-1 for the group membership).
	OnError func(partition int32, err error)
}

// groupTransformPoll is how often GroupTransform looks at its assignment;
// groupTransformFencedWait how long a partition whose transactional id
// another member took waits before it is started again (if still assigned).
const (
	groupTransformPoll       = 100 * time.Millisecond
	groupTransformFencedWait = time.Second
)

// TransactionalIDFor is the transactional id GroupTransform gives input
// partition p of topic.
func TransactionalIDFor(prefix, topic string, p int32) string {
	return fmt.Sprintf("%s-%s-%d", prefix, topic, p)
}

// GroupTransform joins cfg.Group and transforms, exactly once, every
// partition of cfg.Topic the group assigns to it, until ctx ends (it
// returns ctx.Err()), fn returns an error, or a failure it does not
// recover from (as TransformExactlyOnce). A partition taken away from
// this member, or whose transactional id another member took, is given
// up; the group's membership is re-established after a lost connection.
func (c *Client) GroupTransform(ctx context.Context, cfg GroupTransformConfig, fn TransformFunc) error {
	switch {
	case fn == nil:
		return errors.New("herald: GroupTransform: nil function")
	case cfg.Group == "" || cfg.Topic == "" || cfg.TransactionalPrefix == "":
		return errors.New("herald: GroupTransform: Group, Topic and TransactionalPrefix are required")
	case cfg.MaxRecords < 0:
		return fmt.Errorf("herald: GroupTransform: MaxRecords %d", cfg.MaxRecords)
	}
	sub, err := c.Subscribe(ctx, SubscribeOptions{Group: cfg.Group, Topic: cfg.Topic, Mode: Clustering, AssignOnly: true,
		From: cfg.From, Name: cfg.Name}, nil)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = sub.Close(cctx)
	}()
	type run struct {
		cancel context.CancelFunc
		done   chan error
	}
	runs := map[int32]*run{}
	notBefore := map[int32]time.Time{} // fenced partitions rest until then
	stopAll := func() {
		for p, r := range runs {
			r.cancel()
			<-r.done
			delete(runs, p)
		}
	}
	defer stopAll()
	tick := time.NewTicker(groupTransformPoll)
	defer tick.Stop()
	for {
		assigned := map[int32]bool{}
		for _, p := range sub.Assigned() {
			assigned[p] = true
		}
		for p, r := range runs {
			select {
			case err := <-r.done:
				delete(runs, p)
				switch {
				case err == nil || ctx.Err() != nil:
				case errors.Is(err, ErrProducerFenced):
					notBefore[p] = time.Now().Add(groupTransformFencedWait)
					if cfg.OnError != nil {
						cfg.OnError(p, err)
					}
				default:
					return err
				}
				continue
			default:
			}
			if !assigned[p] {
				r.cancel()
				<-r.done
				delete(runs, p)
			}
		}
		for p := range assigned {
			if runs[p] != nil || time.Now().Before(notBefore[p]) {
				continue
			}
			pctx, cancel := context.WithCancel(ctx)
			r := &run{cancel: cancel, done: make(chan error, 1)}
			runs[p] = r
			go func() {
				r.done <- c.transformPartition(pctx, &cfg, p, fn)
			}()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// transformPartition runs TransformExactlyOnce on partition p until ctx
// ends (nil) or it stops.
func (c *Client) transformPartition(ctx context.Context, cfg *GroupTransformConfig, p int32, fn TransformFunc) error {
	tc := TransformConfig{
		TransactionalID: TransactionalIDFor(cfg.TransactionalPrefix, cfg.Topic, p),
		Topic:           cfg.Topic, Partition: p, Group: cfg.Group, From: cfg.From,
		MaxRecords: cfg.MaxRecords, MaxWait: cfg.MaxWait, TransactionTimeout: cfg.TransactionTimeout,
		WrittenOnce: cfg.WrittenOnce, OnCommit: cfg.OnCommit,
	}
	if cfg.OnError != nil {
		tc.OnError = func(err error) { cfg.OnError(p, err) }
	}
	err := c.TransformExactlyOnce(ctx, tc, fn)
	if ctx.Err() != nil {
		return nil
	}
	return err
}
