package txn

// Consumer group offsets committed with a transaction (Kafka's
// SendOffsetsToTransaction): the commit (EndTxn, or a produce with
// commit_txn) carries them, the decision (TxnEnd) records them, and once
// the transaction's records are on their partitions they are applied at
// the groups coordinator, before TxnComplete. All of them, or none when
// the transaction aborts; applying them again after a crash or a failover
// is harmless (a group's position only moves forward). A new session of
// the transactional id starts only once its earlier commits completed,
// offsets included, so a consumer-transform-producer that takes over a
// partition reads the group's position after the last committed
// transaction.

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
)

// Limits of the offsets one commit carries.
const (
	maxOffsetGroups = 64
	maxOffsetParts  = 16384
)

// checkOffsets validates the group offsets of a commit: each names a
// valid group and an existing topic, with as many offsets as partitions,
// each partition of the topic once and each offset at least 0.
func (c *Coordinator) checkOffsets(offs []*heraldpb.TxnGroupOffsets) *heraldpb.Error {
	invalid := func(format string, args ...any) *heraldpb.Error {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, format, args...)
	}
	if len(offs) > maxOffsetGroups {
		return invalid("a commit carries the offsets of %d groups, at most %d", len(offs), maxOffsetGroups)
	}
	n := 0
	for _, o := range offs {
		if e := registry.CheckGroupName(o.Group); e != nil {
			return e
		}
		e := c.o.Topics.Get(o.Topic)
		if e == nil || registry.IsInternal(o.Topic) {
			if !c.o.Topics.Synced() && e == nil {
				return registry.NotReady(o.Topic)
			}
			return heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "group offsets: topic %s does not exist", registry.QuoteName(o.Topic))
		}
		if len(o.Partitions) != len(o.Offsets) || len(o.Partitions) == 0 {
			return invalid("group offsets of %s: %d partitions and %d offsets", registry.QuoteName(o.Group), len(o.Partitions), len(o.Offsets))
		}
		if n += len(o.Partitions); n > maxOffsetParts {
			return invalid("a commit carries %d group offsets or more, at most %d", n, maxOffsetParts)
		}
		seen := map[uint32]bool{}
		for i, p := range o.Partitions {
			switch {
			case int(p) >= len(e.Partitions):
				return heraldpb.NewError(heraldpb.ErrorCode_PARTITION_NOT_FOUND, "group offsets: topic %s has no partition %d", registry.QuoteName(o.Topic), p)
			case seen[p]:
				return invalid("group offsets of %s: partition %d twice", registry.QuoteName(o.Group), p)
			case o.Offsets[i] < 0:
				return invalid("group offsets of %s: offset %d of partition %d is negative", registry.QuoteName(o.Group), o.Offsets[i], p)
			}
			seen[p] = true
		}
	}
	return nil
}

// waitersOffsets is the group offsets of the commit being decided: those
// of the first of m's waiters that carries any (its retries carry the
// same).
func waitersOffsets(m *txnMeta) []*heraldpb.TxnGroupOffsets {
	for _, w := range m.waiters {
		if len(w.offsets) > 0 {
			return w.offsets
		}
	}
	return nil
}

// applyOffsets applies j's group offsets from the i-th on, one group
// after the other, then runs done. A refusal that may pass (no groups
// coordinator reachable, a timeout, a group busy) is retried until it
// succeeds; one that cannot (a broadcast group, a group of another
// topic) is logged and counted, and the others go on: the transaction is
// committed whatever its offsets.
func (c *Coordinator) applyOffsets(ctx actor.Context, m *txnMeta, j *commitJob, i int, backoff time.Duration, done func()) {
	if i == len(j.offsets) {
		done()
		return
	}
	o := j.offsets[i]
	if c.o.GroupOffsets == nil {
		c.log.Error("no groups coordinator to apply a committed transaction's group offsets to; dropped", "transactional_id", m.id, "group", o.Group)
		mTxnOffsets.WithLabelValues("dropped").Inc()
		c.applyOffsets(ctx, m, j, i+1, 0, done)
		return
	}
	f := &heraldpb.Frame{Body: &heraldpb.Frame_CommitTxnOffsets{CommitTxnOffsets: &heraldpb.CommitTxnOffsetsRequest{
		TransactionalId: m.id, Epoch: j.epoch, Offsets: o}}}
	self, sys, apply := c.self, c.sys, c.o.GroupOffsets
	go func() {
		res, err := apply(f)
		sys.Root.Send(self, &timed{to: c, msg: &retryStep{fn: func() {
			e := res.GetError()
			switch {
			case err == nil && e == nil:
				mTxnOffsets.WithLabelValues("applied").Inc()
				c.applyOffsets(ctx, m, j, i+1, 0, done)
			case err != nil || offsetsRetriable(e.Code):
				why := fmt.Sprint(err)
				if e != nil {
					why = e.Message
				}
				backoff = min(max(2*backoff, 50*time.Millisecond), time.Second)
				c.log.Warn("applying a committed transaction's group offsets; retrying", "transactional_id", m.id, "group", o.Group, "err", why, "in", backoff)
				c.after(backoff, &retryStep{fn: func() { c.applyOffsets(ctx, m, j, i, backoff, done) }})
			default:
				c.log.Error("a committed transaction's group offsets were refused; dropped", "transactional_id", m.id, "group", o.Group, "topic", o.Topic, "err", e.Message)
				mTxnOffsets.WithLabelValues("dropped").Inc()
				c.applyOffsets(ctx, m, j, i+1, 0, done)
			}
		}}})
	}()
}

// offsetsRetriable reports whether a groups coordinator's refusal of
// offsets may pass on a retry.
func offsetsRetriable(code heraldpb.ErrorCode) bool {
	switch code {
	case heraldpb.ErrorCode_INVALID_REQUEST, heraldpb.ErrorCode_TOPIC_NOT_FOUND, heraldpb.ErrorCode_PARTITION_NOT_FOUND:
		return false
	}
	return true
}
