package txn

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// writeOnce writes vs as a batch of s's transaction straight to partition
// t-0 (written once: no offset until the commit marker).
func (s *txnSession) writeOnce(vs ...string) *heraldpb.Frame {
	s.r.t.Helper()
	f := s.write(false, vs...)
	if f.GetError() == nil {
		s.seq += int64(len(vs))
	}
	return f
}

// write sends vs to t-0 as a batch of s's transaction written once, the
// last one that commits it there alone (commit_txn) if commit.
func (s *txnSession) write(commit bool, vs ...string) *heraldpb.Frame {
	s.r.t.Helper()
	b := &heraldpb.RecordBatch{}
	for _, v := range vs {
		b.Records = append(b.Records, &heraldpb.Record{Value: []byte(v)})
	}
	raw, _ := proto.Marshal(b)
	return s.r.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Partition: proto.Uint32(0), Records: raw,
		ProducerId: s.pid, ProducerEpoch: s.epoch, BaseSequence: s.seq, Acks: heraldpb.Acks_ACKS_ALL, TxnBatch: true, CommitTxn: commit}}}, s.r.reg.Get("t").Writer(0))
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

// A producer writing once sends its next commits while the first is being
// decided: they are queued, decided in order, each answered with its own
// next epoch, and their records are readable in transaction order. A
// commit sent while the one before it is being aborted is refused.
func TestPipelinedCommits(t *testing.T) {
	var hold atomic.Bool
	r := newRig(t, t.TempDir(), Options{holdWrites: hold.Load})
	s := r.session("pipe")
	first := s.epoch
	var futs []*actor.Future
	var want []string
	hold.Store(true) // the first commit's write waits: the others queue behind it
	for i := range 4 {
		v := fmt.Sprintf("t%d", i)
		s.writeOnce(v + "a")
		s.writeOnce(v + "b")
		want = append(want, v+"a", v+"b")
		futs = append(futs, r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{TransactionalId: s.id, ProducerId: s.pid,
			ProducerEpoch: s.epoch, Commit: true, Written: []*heraldpb.TxnWritten{{Topic: "t", Partition: 0, Records: 2}}}}}, 20*time.Second))
		s.epoch, s.seq = s.epoch+1, 0
	}
	hold.Store(false)
	for i, f := range futs {
		res, err := f.Result()
		if err != nil {
			t.Fatal(err)
		}
		if er := res.(*heraldpb.Frame).GetEndTxnResponse(); er == nil || er.NextEpoch != first+uint32(i)+1 || er.Records != 2 {
			t.Fatalf("commit %d: %v", i, res)
		}
	}
	r.waitValues("the four transactions in order", want)

	// Past an abort being written: refused, never committed.
	s.writeOnce("x")
	hold.Store(true)
	abort := r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{TransactionalId: s.id, ProducerId: s.pid,
		ProducerEpoch: s.epoch, Commit: false, Written: []*heraldpb.TxnWritten{{Topic: "t", Partition: 0, Records: 1}}}}}, 20*time.Second)
	aborted := s.epoch
	s.epoch, s.seq = s.epoch+1, 0
	s.writeOnce("y")
	if f := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{TransactionalId: s.id, ProducerId: s.pid,
		ProducerEpoch: s.epoch, Commit: true, Written: []*heraldpb.TxnWritten{{Topic: "t", Partition: 0, Records: 1}}}}}, r.txn); f.GetError().GetCode() != heraldpb.ErrorCode_INVALID_TXN_STATE {
		t.Fatalf("a commit past an abort: %v", f)
	}
	hold.Store(false)
	if res, err := abort.Result(); err != nil || res.(*heraldpb.Frame).GetEndTxnResponse().GetNextEpoch() != aborted+1 {
		t.Fatalf("the abort: %v %v", res, err)
	}
	// The producer's current transaction is now y's: it commits normally.
	s.endWritten(true)
	r.waitValues("y after the abort", append(want, "y"))
}

// Transactions written once that nobody ends are found on their
// partitions and ended: the current one past its timeout is aborted (the
// producer's commit then gets TXN_TIMED_OUT); an older session's (a
// zombie's) is aborted, and its later writes are refused; a committed
// transaction's records on a partition its commit did not list are
// committed there.
func TestOpenTxnSweep(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{OpenTxnSweep: 50 * time.Millisecond})
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "t2", Config: &heraldpb.TopicConfig{Partitions: 1}}}}, r.mgr)
	open := func(topic string) int {
		f := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_ListOpenTxns{ListOpenTxns: &heraldpb.ListOpenTxnsRequest{Topic: topic}}}, r.reg.Get(topic).Writer(0))
		if f.GetListOpenTxnsResponse() == nil {
			return -1
		}
		return len(f.GetListOpenTxnsResponse().Txns)
	}
	none := func(what, topic string) {
		t.Helper()
		waitFor(t, what, func() error {
			if n := open(topic); n != 0 {
				return fmt.Errorf("%d open on %s", n, topic)
			}
			return nil
		})
	}

	// Past its timeout.
	init := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{TransactionalId: "slow", TransactionTimeoutMs: 200}}}, r.txn).GetInitProducerIdResponse()
	slow := &txnSession{r: r, id: "slow", pid: init.ProducerId, epoch: init.ProducerEpoch}
	slow.writeOnce("late")
	none("the transaction past its timeout aborted", "t")
	if f := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{TransactionalId: "slow", ProducerId: slow.pid, ProducerEpoch: slow.epoch, Commit: true,
		Written: []*heraldpb.TxnWritten{{Topic: "t", Partition: 0, Records: 1}}}}}, r.txn); f.GetError().GetCode() != heraldpb.ErrorCode_TXN_TIMED_OUT {
		t.Fatalf("the commit after the timeout: %v", f)
	}

	// A zombie: a new session of its id starts.
	zombie := r.session("z")
	zombie.writeOnce("zombie")
	r.session("z")
	none("the zombie's transaction aborted", "t")
	if f := zombie.writeOnce("more"); f.GetError().GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
		t.Fatalf("the zombie's write after the sweep: %v", f)
	}
	// Refused on a partition it had not written to either: the sweep
	// fenced its session there too.
	b, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte("elsewhere")}}})
	if f := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t2", Partition: proto.Uint32(0), Records: b,
		ProducerId: zombie.pid, ProducerEpoch: zombie.epoch, Acks: heraldpb.Acks_ACKS_ALL, TxnBatch: true}}}, r.reg.Get("t2").Writer(0)); f.GetError().GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
		t.Fatalf("the zombie's write to a partition it had not written to: %v", f)
	}

	// A partition the commit did not list.
	s := r.session("c")
	s.writeOnce("listed")
	b, _ = proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte("unlisted")}}})
	if f := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t2", Partition: proto.Uint32(0), Records: b,
		ProducerId: s.pid, ProducerEpoch: s.epoch, Acks: heraldpb.Acks_ACKS_ALL, TxnBatch: true}}}, r.reg.Get("t2").Writer(0)); f.GetError() != nil {
		t.Fatal(f)
	}
	s.endWritten(true)
	r.waitValues("the listed partition committed", []string{"listed"})
	none("the unlisted partition's records committed by the sweep", "t2")
	if got := r.valuesOf("t2"); !slices.Equal(got, []string{"unlisted"}) {
		t.Fatalf("t2 holds %v", got)
	}
}

// A new session of a transactional id aborts the old session's
// transactions written once at once (not at the next sweep, an hour away
// here): the zombie's next write is refused (PRODUCER_FENCED: the sweep
// told the partition of the new session), its transaction is no longer
// open, and none of its records is ever readable.
func TestNewSessionAbortsTheZombiesTransactions(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{OpenTxnSweep: time.Hour})
	zombie := r.session("z")
	zombie.writeOnce("zombie")
	fresh := r.session("z")
	waitFor(t, "the zombie's transaction aborted and its write refused", func() error {
		f := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_ListOpenTxns{ListOpenTxns: &heraldpb.ListOpenTxnsRequest{Topic: "t"}}}, r.reg.Get("t").Writer(0))
		if n := len(f.GetListOpenTxnsResponse().GetTxns()); f.GetListOpenTxnsResponse() == nil || n != 0 {
			return fmt.Errorf("%d open (%v)", n, f.GetError())
		}
		if f := zombie.writeOnce("more"); f.GetError().GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
			return fmt.Errorf("answered %v", f)
		}
		return nil
	})
	fresh.writeOnce("fresh")
	fresh.endWritten(true)
	r.waitValues("only the new session's record", []string{"fresh"})
}

// TestFenceSweepIsRetried: the sweep that tells a partition of a new
// session is sent again until the partition answers it (which it does once
// the fence is in its log), and the new session's InitProducerId is
// answered only then, so the zombie's next write is refused at once. The
// first attempts fail here before reaching the partition: without the
// retry the zombie's next write was taken, and without the wait it was
// taken right after the Init. If a partition never answers, the Init is
// answered after FenceWait.
func TestFenceSweepIsRetried(t *testing.T) {
	var failed atomic.Int32
	var always atomic.Bool
	r := newRig(t, t.TempDir(), Options{OpenTxnSweep: time.Hour, FenceWait: 500 * time.Millisecond, failSweep: func(req *heraldpb.ListOpenTxnsRequest) bool {
		return req.FenceProducerId != 0 && (failed.Add(1) <= 3 || always.Load())
	}})
	zombie := r.session("z")
	zombie.writeOnce("zombie")
	fresh := r.session("z")
	if f := zombie.writeOnce("more"); f.GetError().GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
		t.Fatalf("right after the new session's Init the zombie's write is answered %v", f)
	}
	if n := failed.Load(); n < 4 {
		t.Fatalf("the fence went through after %d attempts; the test fails the first 3", n)
	}
	fresh.writeOnce("fresh")
	fresh.endWritten(true)
	r.waitValues("only the new session's record", []string{"fresh"})

	// A partition that never takes the fence holds the Init up to
	// FenceWait, not longer.
	always.Store(true)
	start := time.Now()
	r.session("z")
	if d := time.Since(start); d < 400*time.Millisecond || d > 5*time.Second {
		t.Fatalf("the Init with a partition that never answers took %v; FenceWait is 500ms", d)
	}
}

// TestNewSessionEpochIsPastThePipelinedOnes: a producer with commits in
// flight writes and commits transactions of epochs past the current one
// before it hears of them. A new session of its id must get an epoch
// none of those can carry: before, it got the current epoch + 1, and the
// zombie's next pipelined commit (that same epoch) was taken as the new
// session's (e2e/TestTxnSDKCommitAsync found zombie commits answered as
// committed). Also, a producer committing back to back cannot keep the
// new session out: once the new session was told to wait, the old
// session's next end is fenced.
func TestNewSessionEpochIsPastThePipelinedOnes(t *testing.T) {
	var hold atomic.Bool
	r := newRig(t, t.TempDir(), Options{OpenTxnSweep: time.Hour, holdWrites: hold.Load})
	zombie := r.session("z")
	zombie.writeOnce("a")
	zombie.endWritten(true)
	fresh := r.session("z")
	if fresh.epoch <= zombie.epoch+maxPiped {
		t.Fatalf("the new session's epoch %d is within %d of the old one's %d", fresh.epoch, maxPiped, zombie.epoch)
	}
	for k := range uint32(maxPiped + 1) { // every epoch the zombie may use next
		f := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{TransactionalId: "z", ProducerId: zombie.pid,
			ProducerEpoch: zombie.epoch + k, Commit: true, Written: []*heraldpb.TxnWritten{{Topic: "t", Partition: 0, Records: 1}}}}}, r.txn)
		if f.GetError().GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
			t.Fatalf("the zombie's commit of epoch %d: %v", zombie.epoch+k, f)
		}
	}

	// A commit being decided: the next session waits, and the old
	// session's next end is fenced meanwhile.
	fresh.writeOnce("b")
	hold.Store(true)
	deciding := r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{TransactionalId: "z", ProducerId: fresh.pid,
		ProducerEpoch: fresh.epoch, Commit: true, Written: []*heraldpb.TxnWritten{{Topic: "t", Partition: 0, Records: 1}}}}}, 20*time.Second)
	waitFor(t, "the commit being decided", func() error {
		f := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{TransactionalId: "z"}}}, r.txn)
		if f.GetError().GetCode() != heraldpb.ErrorCode_THROTTLED {
			return fmt.Errorf("InitProducerId answered %v", f)
		}
		return nil
	})
	if f := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{TransactionalId: "z", ProducerId: fresh.pid,
		ProducerEpoch: fresh.epoch + 1, Commit: true}}}, r.txn); f.GetError().GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
		t.Fatalf("the old session's next commit while a new session waits: %v", f)
	}
	hold.Store(false)
	if res, err := deciding.Result(); err != nil || res.(*heraldpb.Frame).GetEndTxnResponse() == nil {
		t.Fatalf("the commit being decided: %v %v", res, err)
	}
	third := r.session("z")
	third.writeOnce("c")
	third.endWritten(true)
	r.waitValues("a, b and c once each", []string{"a", "b", "c"})
}

// A session's transaction written once is listed from its partitions'
// leaders (open, written once), unless the request says not to ask them
// (no_partitions, the dashboard's count).
func TestListWrittenOnceFromPartitions(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{})
	s := r.session("w")
	if f := s.writeOnce("a", "b"); f.GetProduceResponse() == nil {
		t.Fatalf("batch: %v", f)
	}
	list := func(noPartitions bool) []*heraldpb.TxnInfo {
		t.Helper()
		return r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_ListTxn{ListTxn: &heraldpb.ListTxnRequest{Transactions: true, NoPartitions: noPartitions}}}, r.txn).
			GetListTxnResponse().GetTransactions()
	}
	if infos := list(false); len(infos) != 1 || infos[0].State != "open" || !infos[0].WrittenOnce || infos[0].Records != 2 ||
		!slices.Equal(infos[0].Partitions, []string{"t/0"}) || infos[0].ProducerEpoch != s.epoch {
		t.Fatalf("listed %v", infos)
	}
	if infos := list(true); len(infos) != 1 || infos[0].State != "empty" || infos[0].WrittenOnce {
		t.Fatalf("listed without the partitions: %v", infos)
	}
	s.endWritten(true)
	r.waitValues("the commit's records readable", []string{"a", "b"})
	// (Readable once the partition applied the marker; the coordinator
	// completes the commit when the marker's answer reaches it.)
	waitFor(t, "listed as empty after the commit", func() error {
		if infos := list(false); len(infos) != 1 || infos[0].State != "empty" {
			return fmt.Errorf("listed %v", infos)
		}
		return nil
	})
}
