package txn

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
)

// Fencing a deposed coordinator.
//
// When __txn's leadership moves, the next coordinator finishes the commits
// the last one left: it scans each target partition for the records and
// appends what it does not find. An append the deposed coordinator had
// already sent (on the wire, in a mailbox, or sent in its last moments
// before it heard of its successor) could land after that scan and be
// written twice. So every coordinator has an epoch, the term in which its
// node's replica of __txn was elected, and stamps it on its appends
// (ProduceRequest.txn_epoch); and before its first scan of a partition it
// fences it: a produce with its epoch and no records, which the partition
// writes and answers once applied. From then on the partition refuses
// appends of an older epoch (PRODUCER_FENCED): the deposed coordinator's
// late append is either before the fence, where the scan finds it, or
// never written (actors/partition/fence.go).
//
// A coordinator that finds the term of its replica moved on while it
// still leads (it lost the leadership and got it back before the broker
// stopped it) holds state a newer coordinator may have changed: it
// restarts, and loads again under the new term. One refused as fenced
// while its replica still leads in its own term has either not heard of
// its successor yet (it retries with backoff, refused, until the broker
// stops it), or meets the epoch of a __txn whose state was lost: onFenced
// tells the two apart and resets the partition in the second case.

// errStale makes the actor restart: its epoch is over.
type errStale string

func (e errStale) Error() string { return "txn: " + string(e) }

// readEpoch is the coordinator's epoch: the term of e's replica while it
// leads (0: it does not lead now).
func (c *Coordinator) readEpoch(e *registry.Entry) uint64 {
	if c.o.epochOf != nil {
		return c.o.epochOf()
	}
	return e.LeadTerm()
}

// staleEpoch reports whether the replica of __txn leads in a term after
// the coordinator's epoch.
func (c *Coordinator) staleEpoch() bool {
	t := c.readEpoch(c.o.Topics.Get(Topic))
	return t != 0 && t != c.epoch
}

// restartStale restarts the actor (a panic its supervisor answers with a
// restart): a newer coordinator may have run.
func (c *Coordinator) restartStale(why string) {
	c.log.Warn("the transaction coordinator's epoch is over; reloading", "epoch", c.epoch, "why", why)
	mTxnEpochRestarts.Inc()
	panic(errStale(why))
}

// onFenced handles a PRODUCER_FENCED answer to an append to, or a fence
// of, tp (the caller retries with backoff). When the replica of __txn
// leads in a later term than the epoch, the coordinator restarts. Else
// either a coordinator of a later term runs and this node has not heard of
// it yet, or the partition's epoch came from a __txn whose state was lost
// (its term started again from 1). A write to __txn tells them apart: it
// commits in this term only if no later term was elected. If it commits,
// the partition's epoch is reset to this coordinator's, over exactly the
// epoch it was refused with and the entry that set it (a fence of a live
// coordinator since, even of the same epoch, wins).
func (c *Coordinator) onFenced(ctx actor.Context, tp topicPart, e *heraldpb.Error) {
	if c.staleEpoch() {
		c.restartStale(e.GetMessage())
	}
	from, fromIndex := e.GetEpoch(), e.GetEpochIndex()
	if from <= c.epoch || c.resetting[tp] {
		return
	}
	c.log.Warn("a partition refused this transaction coordinator as fenced while its replica of __txn still leads in its epoch; "+
		"writing to __txn to learn whether a newer coordinator runs", "topic", tp.topic, "partition", tp.part, "epoch", c.epoch, "partition_epoch", from)
	c.resetting[tp] = true
	probe := &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Done{Done: &heraldpb.HalfDone{}}} // changes nothing
	c.write(writeOp{events: [][]byte{event(probe)}, done: func(_ int64, err *heraldpb.Error) {
		ent := c.o.Topics.Get(tp.topic)
		if err != nil || c.staleEpoch() || ent == nil || int(tp.part) >= len(ent.Partitions) {
			delete(c.resetting, tp) // a newer coordinator, most likely: asked again at the next refusal
			return
		}
		part := tp.part
		c.request(ctx, ent.Writer(int(part)), &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
			Topic: tp.topic, Partition: &part, Acks: heraldpb.Acks_ACKS_ALL, TxnEpoch: c.epoch, TxnEpochResetFrom: from, TxnEpochResetIndex: fromIndex,
		}}}, callTimeout, func(f *heraldpb.Frame) {
			delete(c.resetting, tp)
			if f.GetProduceResponse() == nil {
				return
			}
			c.fenced[tp] = ent // the reset is a fence of this epoch
			mTxnEpochResets.Inc()
			c.log.Warn("reset a partition's transaction coordinator epoch: it was above this coordinator's, whose term is the latest "+
				"(a write to __txn in it committed), so __txn's state was lost", "topic", tp.topic, "partition", part, "was", from, "epoch", c.epoch)
		})
	}})
	c.flushWrites(ctx)
}

// fence makes sure partition p of e refuses appends of older coordinators
// before then runs: at most once per partition and coordinator, retried
// until the partition answers (then runs when the topic is gone too).
func (c *Coordinator) fence(ctx actor.Context, e *registry.Entry, p uint32, then func()) {
	tp := topicPart{e.Name, p}
	if done := c.fenced[tp]; done != nil && registry.Same(done, e) {
		then()
		return
	}
	backoff, warned := 100*time.Millisecond, time.Time{}
	var try func()
	try = func() {
		cur := c.o.Topics.Get(e.Name)
		if !registry.Same(cur, e) || int(p) >= len(cur.Partitions) {
			then()
			return
		}
		c.request(ctx, cur.Writer(int(p)), &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
			Topic: e.Name, Partition: &p, Acks: heraldpb.Acks_ACKS_ALL, TxnEpoch: c.epoch,
		}}}, callTimeout, func(f *heraldpb.Frame) {
			if f.GetProduceResponse() != nil {
				c.fenced[tp] = cur
				then()
				return
			}
			switch f.GetError().GetCode() {
			case heraldpb.ErrorCode_PRODUCER_FENCED:
				c.onFenced(ctx, tp, f.GetError())
			case heraldpb.ErrorCode_TOPIC_NOT_FOUND, heraldpb.ErrorCode_PARTITION_NOT_FOUND:
				then()
				return
			}
			if time.Since(warned) > time.Minute {
				warned = time.Now()
				c.log.Warn("fencing a partition before recovering its commits; retrying until it answers",
					"topic", e.Name, "partition", p, "err", f.GetError().GetMessage())
			}
			c.after(backoff, &retryStep{fn: try})
			backoff = min(2*backoff, 5*time.Second)
		})
	}
	try()
}
