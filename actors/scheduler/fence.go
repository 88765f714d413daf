package scheduler

// Fencing a deposed scheduler: the epoch, the fence before a recovery scan, and the reset after a lost __schedule.

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
)

// When __schedule's leadership moves, the next scheduler looks on each
// target partition for the fires the last one had announced (recover) and
// appends again what it does not find. An append the deposed scheduler
// had already sent (from a node that was paused, on the wire, in a
// mailbox, or sent from a timer that fired before its node heard of the
// new term) could land after that look and be stored twice. So every
// scheduler has an epoch, the term in which its node's replica of
// __schedule was elected, and stamps it on its fire appends
// (ProduceRequest.txn_epoch with fencer FENCER_SCHEDULER); before it looks
// at a partition it fences it: a produce with its epoch and no records,
// which the partition writes and answers once applied. From then on the
// partition refuses the scheduler's appends of an older epoch
// (PRODUCER_FENCED): a late append is either before the fence, where the
// look finds it, or never written (actors/partition/fence.go). The
// transaction coordinator fences the same way with epochs of its own.
//
// A scheduler refused as fenced whose replica of __schedule leads in a
// later term than its epoch restarts and loads again under the new term.
// One whose replica still leads in its own term has either not heard of
// its successor yet (its append is retried, refused, until the broker
// stops it), or meets the epoch of a __schedule whose state was lost (its
// term started again from 1): a write to __schedule tells the two apart,
// as for the coordinator (onFenced).

// errStale makes the actor restart: its epoch is over.
type errStale string

func (e errStale) Error() string { return "scheduler: " + string(e) }

// fenceKey names a target partition.
type fenceKey struct {
	topic string
	part  uint32
}

// readEpoch is the scheduler's epoch: the term of e's replica while it
// leads (0: it does not lead now).
func (s *Scheduler) readEpoch(e *registry.Entry) uint64 {
	if s.o.epochOf != nil {
		return s.o.epochOf()
	}
	return e.LeadTerm()
}

// staleEpoch reports whether the replica of __schedule leads in a term
// after the scheduler's epoch.
func (s *Scheduler) staleEpoch() bool {
	t := s.readEpoch(s.o.Topics.Get(ScheduleTopic))
	return t != 0 && t != s.epoch
}

// fenceReq is the scheduler's fence of partition p of topic (a reset from
// epoch `from`, set by the entry at fromIndex, when from is not 0).
func (s *Scheduler) fenceReq(topic string, p uint32, from, fromIndex uint64) *heraldpb.Frame {
	return &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: topic, Partition: &p, Acks: heraldpb.Acks_ACKS_ALL, TxnEpoch: s.epoch, Fencer: heraldpb.Fencer_FENCER_SCHEDULER,
		TxnEpochResetFrom: from, TxnEpochResetIndex: fromIndex,
	}}}
}

// fence makes sure partition p of e refuses the appends of older
// schedulers before then runs: at most once per partition and
// incarnation, retried until the partition answers (then runs when the
// topic is gone too).
func (s *Scheduler) fence(ctx actor.Context, e *registry.Entry, p uint32, then func()) {
	k := fenceKey{e.Name, p}
	if done := s.fenced[k]; s.epoch == 0 || done != nil && registry.Same(done, e) {
		then() // (epoch 0: Options.NoFence)
		return
	}
	backoff, warned := 100*time.Millisecond, time.Time{}
	var try func()
	try = func() {
		cur := s.o.Topics.Get(e.Name)
		if !registry.Same(cur, e) || int(p) >= len(cur.Partitions) {
			then()
			return
		}
		s.call(ctx, s.o.Topics.Current(cur).Writer(int(p)), s.fenceReq(e.Name, p, 0, 0), func(f *heraldpb.Frame) {
			if f.GetProduceResponse() != nil {
				s.fenced[k] = cur
				then()
				return
			}
			switch f.GetError().GetCode() {
			case heraldpb.ErrorCode_PRODUCER_FENCED:
				s.onFenced(ctx, cur, p, f.GetError())
			case heraldpb.ErrorCode_TOPIC_NOT_FOUND, heraldpb.ErrorCode_PARTITION_NOT_FOUND:
				then()
				return
			}
			if time.Since(warned) > time.Minute {
				warned = time.Now()
				s.log.Warn("fencing a partition before looking for the fires announced there; retrying until it answers",
					"topic", e.Name, "partition", p, "err", f.GetError().GetMessage())
			}
			s.after(backoff, &scanStep{fn: try})
			backoff = min(2*backoff, 5*time.Second)
		})
	}
	try()
}

// onFenced handles a PRODUCER_FENCED answer to a fire append to, or a
// fence of, partition p of e (the caller retries with backoff). When the
// replica of __schedule leads in a later term than the epoch, the
// scheduler restarts. Else either a scheduler of a later term runs and
// this node has not heard of it yet, or the partition's epoch came from a
// __schedule whose state was lost. A write to __schedule tells them
// apart: it commits in this term only if no later term was elected. If it
// commits, the partition's epoch is reset to this scheduler's, over
// exactly the epoch it was refused with and the entry that set it (a
// fence of a live scheduler since, even of the same epoch, wins).
func (s *Scheduler) onFenced(ctx actor.Context, e *registry.Entry, p uint32, fe *heraldpb.Error) {
	if s.staleEpoch() {
		s.log.Warn("the scheduler's epoch is over; reloading", "epoch", s.epoch, "why", fe.GetMessage())
		mEpochRestarts.Inc()
		panic(errStale(fe.GetMessage()))
	}
	k := fenceKey{e.Name, p}
	from, fromIndex := fe.GetEpoch(), fe.GetEpochIndex()
	if from <= s.epoch || s.resetting[k] {
		return
	}
	s.log.Warn("a partition refused this scheduler as fenced while its replica of __schedule still leads in its epoch; "+
		"writing to __schedule to learn whether a newer scheduler runs", "topic", e.Name, "partition", p, "epoch", s.epoch, "partition_epoch", from)
	s.resetting[k] = true
	s.write(ctx, writeOp{events: [][]byte{firedEvent(nil)}, done: func(_ int64, err *heraldpb.Error) { // changes nothing
		cur := s.o.Topics.Get(e.Name)
		if err != nil || s.staleEpoch() || !registry.Same(cur, e) || int(p) >= len(cur.Partitions) {
			delete(s.resetting, k) // a newer scheduler, most likely: asked again at the next refusal
			return
		}
		s.call(ctx, s.o.Topics.Current(cur).Writer(int(p)), s.fenceReq(e.Name, p, from, fromIndex), func(f *heraldpb.Frame) {
			delete(s.resetting, k)
			if f.GetProduceResponse() == nil {
				return
			}
			s.fenced[k] = cur // the reset is a fence of this epoch
			mEpochResets.Inc()
			s.log.Warn("reset a partition's scheduler epoch: it was above this scheduler's, whose term is the latest "+
				"(a write to __schedule in it committed), so __schedule's state was lost", "topic", e.Name, "partition", p, "was", from, "epoch", s.epoch)
		})
	}})
	s.flushWrites(ctx)
}
