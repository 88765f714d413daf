package txn

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// writeOnce writes vs as a batch of s's transaction straight to partition
// t-0 (written once: no offset until the commit marker).
func (s *txnSession) writeOnce(vs ...string) *heraldpb.Frame {
	s.r.t.Helper()
	b := &heraldpb.RecordBatch{}
	for _, v := range vs {
		b.Records = append(b.Records, &heraldpb.Record{Value: []byte(v)})
	}
	raw, _ := proto.Marshal(b)
	f := s.r.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Partition: proto.Uint32(0), Records: raw,
		ProducerId: s.pid, ProducerEpoch: s.epoch, BaseSequence: s.seq, Acks: heraldpb.Acks_ACKS_ALL, TxnBatch: true}}}, s.r.reg.Get("t").Writer(0))
	if f.GetError() == nil {
		s.seq += int64(len(vs))
	}
	return f
}

// endWritten ends s's transaction, listing t-0 with its records.
func (s *txnSession) endWritten(commit bool) *heraldpb.EndTxnResponse {
	s.r.t.Helper()
	res := s.r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{TransactionalId: s.id, ProducerId: s.pid, ProducerEpoch: s.epoch, Commit: commit,
		Written: []*heraldpb.TxnWritten{{Topic: "t", Partition: 0, Records: uint32(s.seq)}}}}}, s.r.txn).GetEndTxnResponse()
	s.epoch, s.seq = res.NextEpoch, 0
	return res
}

// A transaction written once: its batches go straight to the partition,
// where nobody reads them; the commit lists the partition, and the
// coordinator's marker makes them readable, after what was committed
// before. An abort's marker drops them, and a late batch of its epoch is
// refused. A commit decided before a restart (its markers held) gets them
// from the next coordinator.
func TestWrittenOnceCommitAbortAndRecovery(t *testing.T) {
	var hold atomic.Bool
	r := newRig(t, t.TempDir(), Options{interceptAppend: func(_ *actor.PID, f *heraldpb.Frame) bool {
		return hold.Load() && f.GetProduce().GetTxnMarker() != heraldpb.TxnMarker_TXN_MARKER_NONE
	}})
	s := r.session("w")
	for _, vs := range [][]string{{"a", "b"}, {"c"}} {
		if f := s.writeOnce(vs...); f.GetProduceResponse() == nil {
			t.Fatalf("batch %v: %v", vs, f)
		}
	}
	if got := r.values(); len(got) != 0 {
		t.Fatalf("before the commit the topic reads %v", got)
	}
	epoch := s.epoch
	if res := s.endWritten(true); res.Records != 3 || res.NextEpoch != epoch+1 || !slices.Equal(res.Partitions, []string{"t/0"}) {
		t.Fatalf("commit: %v", res)
	}
	r.waitValues("the commit's records readable", []string{"a", "b", "c"})

	// An abort: its batch is dropped, and never gets an offset.
	s.writeOnce("x")
	aborted := *s
	s.endWritten(false)
	waitFor(t, "the abort's marker applied: a late batch of its epoch refused", func() error {
		if f := aborted.writeOnce("late"); f.GetError().GetCode() != heraldpb.ErrorCode_INVALID_TXN_STATE {
			return fmt.Errorf("late batch answered %v", f)
		}
		return nil
	})
	// A mixed transaction is refused.
	s.stage("staged")
	if f := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{TransactionalId: s.id, ProducerId: s.pid, ProducerEpoch: s.epoch, Commit: true,
		Written: []*heraldpb.TxnWritten{{Topic: "t", Partition: 0, Records: 1}}}}}, r.txn); f.GetError().GetCode() != heraldpb.ErrorCode_INVALID_REQUEST {
		t.Fatalf("a commit that stages and writes once: %v", f)
	}
	s.end(true)
	r.waitValues("the staged commit after the abort", []string{"a", "b", "c", "staged"})

	// Decided, markers held, coordinator restarted: the next one writes them.
	hold.Store(true)
	s.writeOnce("r1", "r2")
	s.endWritten(true)
	_, _ = r.sys.Root.StopFuture(r.txn).Result()
	if got := r.values(); !slices.Equal(got, []string{"a", "b", "c", "staged"}) {
		t.Fatalf("with the markers held the topic reads %v", got)
	}
	hold.Store(false)
	r.txn = r.sys.Root.Spawn(Props(Options{Topics: r.reg, Push: noPush{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	r.waitValues("the commit recovered by the next coordinator", []string{"a", "b", "c", "staged", "r1", "r2"})
	// And a commit after it.
	s.writeOnce("n")
	s.endWritten(true)
	r.waitValues("the next commit", []string{"a", "b", "c", "staged", "r1", "r2", "n"})
}
