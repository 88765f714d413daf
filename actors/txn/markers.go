package txn

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Transactions written once (actors/partition txnlog.go): the producer
// writes its batches straight to their partitions, where they hold no
// offset, and lists the partitions with its EndTxn (written). The decision
// records them; then the coordinator writes the decision's marker to each
// partition, which gives a commit's records their offsets or drops an
// abort's. A marker is idempotent (a partition answers a repeated one as
// it did the first), so after a failover the next coordinator writes them
// all again, with no scan and no fence: nothing it writes can land twice.

// checkWritten validates an EndTxn's written partitions.
func (c *Coordinator) checkWritten(written []*heraldpb.TxnWritten) *heraldpb.Error {
	seen := map[topicPart]bool{}
	for _, w := range written {
		tp := topicPart{w.GetTopic(), w.GetPartition()}
		e := c.o.Topics.Get(tp.topic)
		switch {
		case e == nil:
			return heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q does not exist", tp.topic)
		case int(tp.part) >= len(e.Partitions):
			return heraldpb.NewError(heraldpb.ErrorCode_PARTITION_NOT_FOUND, "topic %q has no partition %d", tp.topic, tp.part)
		case w.GetRecords() == 0:
			return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "written partition %s lists no records", tp)
		case seen[tp]:
			return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "written partition %s is listed twice", tp)
		}
		seen[tp] = true
	}
	return nil
}

// writeMarkers writes the marker of producer pid's transaction of epoch
// (commit or abort) to every partition in written, each retried until its
// partition has it, and calls done once all have.
func (c *Coordinator) writeMarkers(ctx actor.Context, pid uint64, epoch uint32, commit bool, written []*heraldpb.TxnWritten, done func()) {
	waiting := len(written)
	if waiting == 0 {
		done()
		return
	}
	for _, w := range written {
		c.writeMarker(ctx, pid, epoch, commit, w, func() {
			if waiting--; waiting == 0 {
				done()
			}
		})
	}
}

// writeMarker writes one partition's marker; see writeMarkers.
func (c *Coordinator) writeMarker(ctx actor.Context, pid uint64, epoch uint32, commit bool, w *heraldpb.TxnWritten, done func()) {
	tp := topicPart{w.GetTopic(), w.GetPartition()}
	marker, records := heraldpb.TxnMarker_TXN_MARKER_ABORT, uint32(0)
	if commit {
		marker, records = heraldpb.TxnMarker_TXN_MARKER_COMMIT, w.GetRecords()
	}
	backoff := 20 * time.Millisecond
	var send func()
	retry := func(why string) {
		c.log.Debug("writing a transaction marker; retrying", "topic", tp.topic, "partition", tp.part, "producer", pid, "epoch", epoch, "err", why, "in", backoff)
		c.after(backoff, &retryStep{fn: send})
		backoff = min(backoff*2, 5*time.Second)
	}
	send = func() {
		e := c.o.Topics.Get(tp.topic)
		if e == nil || int(tp.part) >= len(e.Partitions) {
			c.log.Warn("the topic of a transaction's marker is gone", "topic", tp.topic, "partition", tp.part, "producer", pid, "epoch", epoch)
			done()
			return
		}
		if !c.leadsTxn() {
			// (the next coordinator writes it; held until this replica
			// leads again, as the broker stops this actor when it does not)
			retry("__txn's leadership is moving")
			return
		}
		part := tp.part
		req := &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
			Topic: tp.topic, Partition: &part, Acks: heraldpb.Acks_ACKS_ALL,
			ProducerId: pid, ProducerEpoch: epoch, TxnMarker: marker, TxnRecords: records,
		}}}
		to := e.Writer(int(part))
		if c.o.interceptAppend != nil && c.o.interceptAppend(to, req) {
			return // held by the test
		}
		c.request(ctx, to, req, callTimeout, func(f *heraldpb.Frame) {
			if f.GetProduceResponse() != nil {
				mTxnMarkers.WithLabelValues(markerResult(commit)).Inc()
				done()
				return
			}
			switch f.GetError().GetCode() {
			case heraldpb.ErrorCode_INVALID_TXN_STATE, heraldpb.ErrorCode_INVALID_REQUEST, heraldpb.ErrorCode_TOPIC_NOT_FOUND, heraldpb.ErrorCode_PARTITION_NOT_FOUND:
				// Never accepted as it is: the partition holds a different
				// count of the transaction's records, or ended it the
				// other way. Logged and counted, not retried for ever.
				c.log.Error("a transaction's marker refused for good by its partition", "topic", tp.topic, "partition", part, "producer", pid, "epoch", epoch,
					"commit", commit, "err", f.GetError().GetMessage())
				mTxnMarkers.WithLabelValues("refused").Inc()
				done()
				return
			}
			retry(f.GetError().GetMessage())
		})
	}
	send()
}

func markerResult(commit bool) string {
	if commit {
		return "commit"
	}
	return "abort"
}

// writtenRecords sums the records of written.
func writtenRecords(written []*heraldpb.TxnWritten) uint32 {
	var n uint32
	for _, w := range written {
		n += w.GetRecords()
	}
	return n
}

// writtenPartitions lists the partitions of written, in order.
func writtenPartitions(written []*heraldpb.TxnWritten) []topicPart {
	out := make([]topicPart, 0, len(written))
	for _, w := range written {
		out = append(out, topicPart{w.GetTopic(), w.GetPartition()})
	}
	return out
}
