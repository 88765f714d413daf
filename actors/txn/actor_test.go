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
	"github.com/heraldmq/herald/actors/topic"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
)

// rig is a topic manager with real partitions on disk, and a coordinator.
type rig struct {
	t   testing.TB
	sys *actor.ActorSystem
	mgr *actor.PID
	reg *registry.Registry
	txn *actor.PID
}

type noPush struct{}

func (noPush) SendRaw(*actor.PID, []byte) {}

func newRig(t testing.TB, dir string, o Options) *rig {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
	mgr, reg, err := topic.Spawn(sys, topic.Config{DataDir: dir, NodeID: 1, Advertise: "x", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, sys: sys, mgr: mgr, reg: reg}
	res, err := sys.Root.RequestFuture(mgr, &topic.EnsureInternal{Name: Topic, Partitions: 1, MaxMessageBytes: 2 << 20}, 10*time.Second).Result()
	if err != nil || res.(*topic.EnsureInternalResult).Err != nil {
		t.Fatal(err, res)
	}
	if reg.Get("t") == nil {
		r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "t", Config: &heraldpb.TopicConfig{Partitions: 1}}}}, mgr)
	}
	o.Topics, o.Logger, o.Push = reg, quiet, noPush{}
	r.txn = sys.Root.Spawn(Props(o))
	t.Cleanup(func() {
		_, _ = sys.Root.StopFuture(r.txn).Result()
		_, _ = sys.Root.StopFuture(mgr).Result()
		sys.Shutdown()
	})
	return r
}

func (r *rig) call(f *heraldpb.Frame, to *actor.PID) *heraldpb.Frame {
	r.t.Helper()
	res, err := r.sys.Root.RequestFuture(to, f, 20*time.Second).Result()
	if err != nil {
		r.t.Fatalf("%T: %v", f.Body, err)
	}
	return res.(*heraldpb.Frame)
}

func (r *rig) ok(f *heraldpb.Frame, to *actor.PID) *heraldpb.Frame {
	r.t.Helper()
	res := r.call(f, to)
	if e := res.GetError(); e != nil {
		r.t.Fatalf("%T: %v", f.Body, e)
	}
	return res
}

func (r *rig) half(v string) string {
	r.t.Helper()
	b, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte(v)}}})
	return r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "t", Records: b, Half: &heraldpb.HalfOptions{ProducerGroup: "g", CheckIntervalMs: 60_000},
	}}}, r.txn).GetProduceResponse().HalfId
}

func (r *rig) values() []string {
	r.t.Helper()
	return r.valuesOf("t")
}

func (r *rig) pending() int {
	r.t.Helper()
	return int(r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_ListTxn{ListTxn: &heraldpb.ListTxnRequest{}}}, r.txn).GetListTxnResponse().Total)
}

func waitFor(t testing.TB, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A crash of the coordinator between appending a committed half and
// recording it done (a panic there; the supervisor restarts the actor,
// which rebuilds from __txn) leaves the half on its topic once: recovery
// finds it by its id and token and records it done without appending it
// again.
func TestCrashAfterAppendAppendsOnce(t *testing.T) {
	var crashes atomic.Int32
	r := newRig(t, t.TempDir(), Options{crashAfterAppend: func() bool { return crashes.Add(1) <= 2 }})
	a, b, c := r.half("a"), r.half("b"), r.half("c")
	for _, id := range []string{a, b} {
		// The commit's answer is lost to the crash (the requester times
		// out or gets TIMEOUT); the half is still committed.
		_, _ = r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{Id: id, Action: heraldpb.HalfAction_HALF_COMMIT}}}, 3*time.Second).Result()
	}
	waitFor(t, "two crashes, then both halves done", func() error {
		if n := crashes.Load(); n < 2 {
			return fmt.Errorf("%d crashes", n)
		}
		if n := r.pending(); n != 1 {
			return fmt.Errorf("%d pending", n)
		}
		return nil
	})
	if e := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{Id: c, Action: heraldpb.HalfAction_HALF_COMMIT}}}, r.txn).GetEndHalfResponse(); e == nil || e.BaseOffset != 2 {
		t.Fatalf("commit of the third: %v", e)
	}
	if got := r.values(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("topic holds %v, want a, b, c once each", got)
	}
	// Ending a recovered half again says it ended.
	if res := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{Id: a, Action: heraldpb.HalfAction_HALF_COMMIT}}}, r.txn); !res.GetEndHalfResponse().AlreadyEnded {
		t.Fatalf("second commit of %s: %v", a, res)
	}
}

// A recovery scan that cannot read its partition (here: three reads fail
// with a non-retryable error) retries until it can, rather than treating
// the rest of the partition as not appended and appending again. It gave
// up at once on such errors (and after 5 minutes on retryable ones).
func TestRecoveryScanDoesNotGiveUp(t *testing.T) {
	var crashes, fails atomic.Int32
	r := newRig(t, t.TempDir(), Options{
		crashAfterAppend: func() bool { return crashes.Add(1) == 1 },
		failScan:         func() bool { return crashes.Load() >= 1 && fails.Add(1) <= 3 },
	})
	a := r.half("a")
	_, _ = r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{Id: a, Action: heraldpb.HalfAction_HALF_COMMIT}}}, 3*time.Second).Result()
	waitFor(t, "the crash, then the half done", func() error {
		if n := crashes.Load(); n < 1 {
			return fmt.Errorf("%d crashes", n)
		}
		if n := r.pending(); n != 0 {
			return fmt.Errorf("%d pending", n)
		}
		return nil
	})
	if got := r.values(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("topic holds %v, want a once", got)
	}
	if n := fails.Load(); n < 4 {
		t.Fatalf("%d reads failed, want the scan to have read again after 3", n)
	}
}

// The coordinator stops and a new one starts on the same data (a broker
// restart): pending halves, their check counts and committed ones carry
// over; __txn below the oldest pending half is compacted away.
func TestReloadAndCompact(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, dir, Options{CompactCheck: 50 * time.Millisecond})
	var ids []string
	for i := range 5 {
		ids = append(ids, r.half(fmt.Sprint(i)))
	}
	for _, id := range ids[:3] {
		r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{Id: id, Action: heraldpb.HalfAction_HALF_ROLLBACK}}}, r.txn)
	}
	e := r.reg.Get(Topic)
	waitFor(t, "compaction below the oldest pending half", func() error {
		if s := e.Stats[0].StartOffset.Load(); s != 3 {
			return fmt.Errorf("__txn starts at %d", s)
		}
		return nil
	})
	if _, err := r.sys.Root.StopFuture(r.txn).Result(); err != nil {
		t.Fatal(err)
	}
	r.txn = r.sys.Root.Spawn(Props(Options{Topics: r.reg, Push: noPush{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	if n := r.pending(); n != 2 {
		t.Fatalf("%d pending after the reload, want 2", n)
	}
	if e := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{Id: ids[0], Action: heraldpb.HalfAction_HALF_COMMIT}}}, r.txn).GetError(); e.GetCode() != heraldpb.ErrorCode_TXN_NOT_FOUND {
		t.Fatalf("commit of a rolled-back half after the reload: %v", e)
	}
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{Id: ids[4], Action: heraldpb.HalfAction_HALF_COMMIT}}}, r.txn)
	if got := r.values(); !slices.Equal(got, []string{"4"}) {
		t.Fatalf("topic holds %v", got)
	}
}

// FuzzDecodeEvent: any bytes as a __txn record decode or fail, never
// panic; what decodes applies (three times over, as a replay would) to a
// state holding a half and a session without panicking.
func FuzzDecodeEvent(f *testing.F) {
	for _, ev := range []*heraldpb.TxnEvent{
		{Event: &heraldpb.TxnEvent_Half{Half: &heraldpb.HalfStored{ProducerGroup: "g", Topic: "t", Count: 1, Records: []byte{10, 3, 18, 1, 'x'}}}},
		{Event: &heraldpb.TxnEvent_Commit{Commit: &heraldpb.HalfCommit{Ref: 0, FromOffset: 5, Token: 7, By: "producer"}}},
		{Event: &heraldpb.TxnEvent_Rollback{Rollback: &heraldpb.HalfRollback{Refs: []uint64{0, 1}, By: "check"}}},
		{Event: &heraldpb.TxnEvent_Done{Done: &heraldpb.HalfDone{Refs: []uint64{0}}}},
		{Event: &heraldpb.TxnEvent_Checks{Checks: &heraldpb.HalfChecks{Refs: []uint64{0, 3}, Counts: []uint32{2}}}},
	} {
		v, _ := proto.Marshal(ev)
		rec, _ := proto.Marshal(&heraldpb.Record{Value: v})
		f.Add(rec)
	}
	f.Fuzz(func(t *testing.T, rec []byte) {
		ev, err := decodeEvent(rec)
		if err != nil {
			return
		}
		st := newState()
		def := func(*heraldpb.HalfStored) (time.Duration, uint32, bool) { return time.Second, 2, true }
		st.apply(0, &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Half{Half: &heraldpb.HalfStored{}}}, def)
		st.applyTxn(0, &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Init{Init: &heraldpb.TxnInit{TransactionalId: "t1", Epoch: 3}}}, 0)
		for off := uint64(1); off < 4; off++ {
			st.apply(off, ev, def)
			st.applyTxn(off, ev, 0)
		}
		for _, m := range st.txns {
			_ = m.infos()
		}
	})
}

// Review findings, each a regression test: two ends of one half in flight
// at once (a retried commit, a check-back's answer, a rollback) end it
// once: it is on its topic once, or not at all.
func TestHalfEndsRacing(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{})
	end := func(id string, a heraldpb.HalfAction) *actor.Future {
		return r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{Id: id, Action: a}}}, 20*time.Second)
	}
	a, b := r.half("a"), r.half("b")
	fs := []*actor.Future{end(a, heraldpb.HalfAction_HALF_COMMIT), end(a, heraldpb.HalfAction_HALF_COMMIT), end(b, heraldpb.HalfAction_HALF_COMMIT), end(b, heraldpb.HalfAction_HALF_ROLLBACK)}
	var bCommitted bool
	for i, f := range fs {
		res, err := f.Result()
		if err != nil {
			t.Fatal(err)
		}
		fr := res.(*heraldpb.Frame)
		if i == 2 && fr.GetEndHalfResponse() != nil {
			bCommitted = true
		}
		if e := fr.GetError(); e != nil && e.Code != heraldpb.ErrorCode_THROTTLED && e.Code != heraldpb.ErrorCode_TXN_NOT_FOUND {
			t.Fatalf("end %d: %v", i, e)
		}
	}
	waitFor(t, "nothing pending", func() error {
		if n := r.pending(); n != 0 {
			return fmt.Errorf("%d pending", n)
		}
		return nil
	})
	want := []string{"a"}
	if bCommitted {
		want = append(want, "b")
	}
	if got := r.values(); !slices.Equal(got, want) {
		t.Fatalf("topic holds %v, want %v", got, want)
	}
}

// Compaction keeps the session record of an id whose transaction is
// open: after a reload the staged batch is still there, and commits.
func TestCompactionKeepsOpenTransactions(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, dir, Options{CompactCheck: 50 * time.Millisecond})
	init := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{TransactionalId: "x"}}}, r.txn).GetInitProducerIdResponse()
	// Halves ended after the session record, so that compaction has
	// something to cut.
	for i := range 3 {
		id := r.half(fmt.Sprint("h", i))
		r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{Id: id, Action: heraldpb.HalfAction_HALF_ROLLBACK}}}, r.txn)
	}
	b, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte("staged")}}})
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Partition: proto.Uint32(0), Records: b,
		TransactionalId: "x", ProducerId: init.ProducerId, ProducerEpoch: init.ProducerEpoch}}}, r.txn)
	e := r.reg.Get(Topic)
	if v := testutil.ToFloat64(mTxnOpen); v != 1 {
		t.Fatalf("open transactions: %v", v)
	}
	// Ten compaction rounds (every 50 ms) watched: none may cut below the
	// open transaction's session record (offset 0). Without it, the cut
	// went to the staged batch.
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if s := e.Stats[0].StartOffset.Load(); s > 0 {
			t.Fatalf("__txn compacted to %d, past the open transaction's session record at 0", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := r.sys.Root.StopFuture(r.txn).Result(); err != nil {
		t.Fatal(err)
	}
	r.txn = r.sys.Root.Spawn(Props(Options{Topics: r.reg, Push: noPush{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	res := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{TransactionalId: "x", ProducerId: init.ProducerId, ProducerEpoch: init.ProducerEpoch, Commit: true}}}, r.txn)
	if res.GetEndTxnResponse().GetRecords() != 1 {
		t.Fatalf("commit after the reload: %v", res)
	}
	// Answered once decided: the append follows.
	waitFor(t, "the committed record on its topic", func() error {
		if got := r.values(); !slices.Equal(got, []string{"staged"}) {
			return fmt.Errorf("topic holds %v", got)
		}
		return nil
	})
}

// txnSession starts a session of id and returns a stager of its records
// and its commit/abort.
type txnSession struct {
	r     *rig
	id    string
	pid   uint64
	epoch uint32
	seq   int64
}

func (r *rig) session(id string) *txnSession {
	init := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{TransactionalId: id}}}, r.txn).GetInitProducerIdResponse()
	return &txnSession{r: r, id: id, pid: init.ProducerId, epoch: init.ProducerEpoch}
}

func (s *txnSession) stage(v string) {
	s.r.t.Helper()
	b, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte(v)}}})
	s.r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Partition: proto.Uint32(0), Records: b,
		TransactionalId: s.id, ProducerId: s.pid, ProducerEpoch: s.epoch, BaseSequence: s.seq, Acks: heraldpb.Acks_ACKS_ALL}}}, s.r.txn)
	s.seq++
}

func (s *txnSession) end(commit bool) *heraldpb.EndTxnResponse {
	s.r.t.Helper()
	res := s.r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{TransactionalId: s.id, ProducerId: s.pid, ProducerEpoch: s.epoch, Commit: commit}}}, s.r.txn).GetEndTxnResponse()
	s.epoch, s.seq = res.NextEpoch, 0
	return res
}

// A commit is answered once decided; the producer's next transaction
// stages (and commits) while the first one's records are appended, and
// the records of the two keep their order on the partition.
func TestCommitAnsweredAtDecision(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{})
	s := r.session("p")
	for round := range 20 {
		for i := range 3 {
			s.stage(fmt.Sprintf("%02d-%d", round, i))
		}
		if res := s.end(true); res.Records != 3 {
			t.Fatalf("commit %d: %v", round, res)
		}
	}
	var want []string
	for round := range 20 {
		for i := range 3 {
			want = append(want, fmt.Sprintf("%02d-%d", round, i))
		}
	}
	waitFor(t, "every committed record, in order", func() error {
		if got := r.values(); !slices.Equal(got, want) {
			return fmt.Errorf("topic holds %v", got)
		}
		return nil
	})
	waitFor(t, "no commit appending", func() error {
		infos := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_ListTxn{ListTxn: &heraldpb.ListTxnRequest{Transactions: true}}}, r.txn).GetListTxnResponse().GetTransactions()
		if len(infos) != 1 || infos[0].GetState() != "empty" {
			return fmt.Errorf("transactions: %v", infos)
		}
		return nil
	})
}

// After an abort, the id's session record is the snapshot written with
// the abort: compaction may cut below the first session record, and a
// reload still knows the id and the next transaction's staged batch.
// Before, the abort's TxnEnd became the session record, compaction cut
// the TxnInit, and the reload ignored the staged batch (and would have
// ignored a commit decision).
func TestCompactionAfterAnAbortKeepsTheSession(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, dir, Options{CompactCheck: 20 * time.Millisecond})
	s := r.session("x")
	s.stage("aborted")
	s.end(false)
	s.stage("kept")
	e := r.reg.Get(Topic)
	waitFor(t, "a compaction past the first session record", func() error {
		if st := e.Stats[0].StartOffset.Load(); st == 0 {
			return fmt.Errorf("__txn starts at %d", st)
		}
		return nil
	})
	if _, err := r.sys.Root.StopFuture(r.txn).Result(); err != nil {
		t.Fatal(err)
	}
	r.txn = r.sys.Root.Spawn(Props(Options{Topics: r.reg, Push: noPush{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	if res := s.end(true); res.Records != 1 {
		t.Fatalf("commit after the reload: %v", res)
	}
	waitFor(t, "the staged record on its topic", func() error {
		if got := r.values(); !slices.Equal(got, []string{"kept"}) {
			return fmt.Errorf("topic holds %v", got)
		}
		return nil
	})
}

// Staged records past the in-memory budget are read back from __txn when
// their transaction commits.
func TestCommitReadsBackUncachedBatches(t *testing.T) {
	old := stagedCacheBytes
	stagedCacheBytes = 0
	t.Cleanup(func() { stagedCacheBytes = old })
	r := newRig(t, t.TempDir(), Options{})
	s := r.session("p")
	s.stage("a")
	s.stage("b")
	s.end(true)
	waitFor(t, "the records read back and appended", func() error {
		if got := r.values(); !slices.Equal(got, []string{"a", "b"}) {
			return fmt.Errorf("topic holds %v", got)
		}
		return nil
	})
}

// A new session of an id whose last commits are still appending (as many
// as may wait, maxCompleting) fences a commit of the old session queued
// behind them (PRODUCER_FENCED, so a zombie
// committing back to back cannot keep it out); it is answered once the
// appends are done, and the fenced commit's records never appear.
func TestNewSessionWaitsForTheAppendsAndFencesAQueuedCommit(t *testing.T) {
	var hold atomic.Bool
	hold.Store(true)
	r := newRig(t, t.TempDir(), Options{holdAppends: hold.Load})
	old := r.session("p")
	var committed []string
	for i := range maxCompleting {
		v := fmt.Sprintf("first-%d", i)
		old.stage(v)
		old.end(true) // answered at the decision; its appends are held
		committed = append(committed, v)
	}
	old.stage("second")
	queued := r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{
		TransactionalId: "p", ProducerId: old.pid, ProducerEpoch: old.epoch, Commit: true}}}, 20*time.Second)
	waitFor(t, "the second commit queued", func() error {
		infos := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_ListTxn{ListTxn: &heraldpb.ListTxnRequest{Transactions: true}}}, r.txn).GetListTxnResponse().GetTransactions()
		if len(infos) != maxCompleting+1 || infos[0].GetState() != "committing" || infos[maxCompleting-1].GetState() != "committing" || infos[maxCompleting].GetState() != "open" {
			return fmt.Errorf("transactions: %v", infos)
		}
		return nil
	})
	init := r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{TransactionalId: "p"}}}, 20*time.Second)
	res, err := queued.Result()
	if err != nil {
		t.Fatal(err)
	}
	if e := res.(*heraldpb.Frame).GetError(); e.GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
		t.Fatalf("the queued commit of the old session: %v", res)
	}
	hold.Store(false)
	res, err = init.Result()
	if err != nil || res.(*heraldpb.Frame).GetInitProducerIdResponse() == nil {
		t.Fatalf("the new session: %v %v", res, err)
	}
	if got := r.values(); !slices.Equal(got, committed) {
		t.Fatalf("when the new session was answered the topic held %v, want %v, in order (and not second)", got, committed)
	}
}

// Two InitProducerId of one transactional id racing (two GroupTransform
// members both assigned a partition during a rebalance) start two
// sessions, each fencing the one before: the second is not given the
// first one's producer id and epoch while the first one's Init is being
// written. Before the fix both were answered the same session, and the
// two producers ran unfenced, one failing later with "the transaction of
// epoch 5 ended; the current epoch is 7" (e2e TestGroupTransformExactlyOnceKills).
func TestConcurrentInitsStartTwoSessions(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{})
	first := r.session("p")
	first.stage("a")
	first.end(true)
	init := func() *actor.Future {
		return r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{TransactionalId: "p"}}}, 20*time.Second)
	}
	// Both in the coordinator's mailbox before the first Init is written;
	// THROTTLED is retried, as the SDK does.
	futures := []*actor.Future{init(), init()}
	var sessions []*txnSession
	for _, f := range futures {
		for {
			res, err := f.Result()
			if err != nil {
				t.Fatal(err)
			}
			fr := res.(*heraldpb.Frame)
			if e := fr.GetError(); e.GetCode() == heraldpb.ErrorCode_THROTTLED {
				f = init()
				continue
			} else if e != nil {
				t.Fatalf("InitProducerId: %v", e)
			}
			in := fr.GetInitProducerIdResponse()
			sessions = append(sessions, &txnSession{r: r, id: "p", pid: in.ProducerId, epoch: in.ProducerEpoch})
			break
		}
	}
	a, b := sessions[0], sessions[1]
	if a.pid == b.pid && a.epoch == b.epoch {
		t.Fatalf("both InitProducerId were answered the same session (producer %d epoch %d)", a.pid, a.epoch)
	}
	older := a
	if b.epoch < a.epoch {
		older = b
	}
	res := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{TransactionalId: "p", ProducerId: older.pid, ProducerEpoch: older.epoch, Commit: true}}}, r.txn)
	if res.GetError().GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
		t.Fatalf("the older of the two sessions is not fenced: %v", res)
	}
}

// A transactional produce queued behind another session's InitProducerId
// (both in the coordinator before the Init is written) is answered
// PRODUCER_FENCED, as it would be had the Init been written first, not
// INVALID_TXN_STATE "the transaction of epoch 0 ended": GroupTransform
// rests a fenced partition but stops on any other refusal (e2e
// TestGroupTransformExactlyOnceKills lost a transformer this way). The
// same holds for an EndTxn queued behind the Init.
func TestRequestQueuedBehindANewSessionIsFenced(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{})
	for round := range 20 {
		old := r.session("p")
		old.stage("a")
		b, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte("b")}}})
		init := r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{TransactionalId: "p"}}}, 20*time.Second)
		produce := r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Partition: proto.Uint32(0), Records: b,
			TransactionalId: "p", ProducerId: old.pid, ProducerEpoch: old.epoch, BaseSequence: old.seq, Acks: heraldpb.Acks_ACKS_ALL}}}, 20*time.Second)
		end := r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{
			TransactionalId: "p", ProducerId: old.pid, ProducerEpoch: old.epoch, Commit: round%2 == 0}}}, 20*time.Second)
		for what, f := range map[string]*actor.Future{"produce": produce, "end": end} {
			res, err := f.Result()
			if err != nil {
				t.Fatal(err)
			}
			switch e := res.(*heraldpb.Frame).GetError(); e.GetCode() {
			case heraldpb.ErrorCode_PRODUCER_FENCED:
			case heraldpb.ErrorCode_THROTTLED:
				// The end found the produce still being staged: retried
				// by the SDK, and fenced then.
				if what != "end" {
					t.Fatalf("round %d: the old session's %s: %v", round, what, e)
				}
			default:
				t.Fatalf("round %d: the old session's %s, queued behind a new session's Init: %v, want PRODUCER_FENCED", round, what, res)
			}
		}
		if res, err := init.Result(); err != nil || res.(*heraldpb.Frame).GetInitProducerIdResponse() == nil {
			t.Fatalf("round %d: the new session: %v %v", round, res, err)
		}
	}
	if got := r.values(); len(got) != 0 {
		t.Fatalf("the topic holds %v; every transaction was fenced", got)
	}
}

// Commits are decided (and answered) while earlier commits of the same
// producer still append, up to maxCompleting of them; the records land in
// commit order, and a restart with decided commits not yet appended
// appends each once, in order.
func TestCommitsDecidedWhileEarlierOnesAppend(t *testing.T) {
	dir := t.TempDir()
	var hold atomic.Bool
	hold.Store(true)
	r := newRig(t, dir, Options{holdAppends: hold.Load})
	s := r.session("p")
	var want []string
	for i := range maxCompleting {
		for k := range 3 {
			v := fmt.Sprintf("t%d-%d", i, k)
			s.stage(v)
			want = append(want, v)
		}
		s.end(true)
	}
	infos := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_ListTxn{ListTxn: &heraldpb.ListTxnRequest{Transactions: true}}}, r.txn).GetListTxnResponse().GetTransactions()
	if len(infos) != maxCompleting || infos[maxCompleting-1].GetState() != "committing" {
		t.Fatalf("%d commits decided with their appends held: transactions %v", maxCompleting, infos)
	}
	if got := r.values(); len(got) != 0 {
		t.Fatalf("appends held, yet the topic holds %v", got)
	}
	hold.Store(false)
	r.waitValues("the commits appended", want)

	// Decided, not appended, then a restart: the reloaded coordinator
	// appends them, each once and in order.
	hold.Store(true)
	for i := range maxCompleting - 1 {
		v := fmt.Sprintf("u%d", i)
		s.stage(v)
		s.end(true)
		want = append(want, v)
	}
	_, _ = r.sys.Root.StopFuture(r.txn).Result()
	hold.Store(false)
	r.txn = r.sys.Root.Spawn(Props(Options{Topics: r.reg, Push: noPush{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	r.waitValues("the reloaded commits appended", want)
}

// routedPublish hands the coordinator a publish routed to t/0 and u/0.
func (r *rig) routedPublish(v string, timeout time.Duration) (*heraldpb.Frame, error) {
	b, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte(v)}}})
	res, err := r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_Publish{Publish: &heraldpb.PublishRequest{
		Exchange: "x", Routed: []*heraldpb.RoutedBatch{{Topic: "t", Partition: 0, Records: b, Count: 1}, {Topic: "u", Partition: 0, Records: b, Count: 1}},
	}}}, timeout).Result()
	if err != nil {
		return nil, err
	}
	return res.(*heraldpb.Frame), nil
}

func (r *rig) valuesOf(topic string) []string {
	r.t.Helper()
	res := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{Topic: topic, MaxBytes: 16 << 20}}}, r.reg.Get(topic).Partitions[0])
	var out []string
	for _, b := range res.GetFetchResponse().Batches {
		_ = heraldpb.ForEachRawRecord(b.Records, func(_ int, rec []byte) bool {
			var m heraldpb.Record
			_ = proto.Unmarshal(rec, &m)
			out = append(out, string(m.Value))
			return true
		})
	}
	return out
}

// TestRoutedPublishCrashBetweenAppends: a publish routed to two
// partitions is one decision; the coordinator crashes (twice) after
// appending one batch and before the other. The restarted coordinator
// finds the appended batch by its tags and appends the other once: each
// topic holds each publish once, and the publish after them too.
func TestRoutedPublishCrashBetweenAppends(t *testing.T) {
	var crashes atomic.Int32
	r := newRig(t, t.TempDir(), Options{crashAfterRoutedAppend: func() bool { return crashes.Add(1)%2 == 1 && crashes.Load() <= 3 }})
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "u", Config: &heraldpb.TopicConfig{Partitions: 1}}}}, r.mgr)
	for _, v := range []string{"a", "b"} {
		// The answer may be lost to the crash; the publish is decided.
		_, _ = r.routedPublish(v, 3*time.Second)
	}
	waitFor(t, "both publishes on both topics", func() error {
		for _, topic := range []string{"t", "u"} {
			if got := r.valuesOf(topic); len(got) < 2 {
				return fmt.Errorf("%s holds %v", topic, got)
			}
		}
		return nil
	})
	if n := crashes.Load(); n < 3 {
		t.Fatalf("%d appends asked, want the crashes to have happened", n)
	}
	f, err := r.routedPublish("c", 10*time.Second)
	if err != nil || f.GetPublishResponse() == nil {
		t.Fatalf("publish after the crashes: %v %v", f, err)
	}
	for _, d := range f.GetPublishResponse().Destinations {
		if d.BaseOffset != 2 {
			t.Errorf("c went to %s at %d, want offset 2", d.Topic, d.BaseOffset)
		}
	}
	for _, topic := range []string{"t", "u"} {
		if got := r.valuesOf(topic); !slices.Equal(got, []string{"a", "b", "c"}) {
			t.Errorf("%s holds %v, want a, b, c once each", topic, got)
		}
	}
}

// TestRoutedPublishChecksEveryBatchFirst: a batch whose topic is missing
// or too large for its partition refuses the whole publish before any
// decision: nothing reaches any topic.
func TestRoutedPublishChecksEveryBatchFirst(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{})
	b, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte("v")}}})
	f := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_Publish{Publish: &heraldpb.PublishRequest{
		Routed: []*heraldpb.RoutedBatch{{Topic: "t", Records: b, Count: 1}, {Topic: "missing", Records: b, Count: 1}},
	}}}, r.txn)
	if f.GetError().GetCode() != heraldpb.ErrorCode_TOPIC_NOT_FOUND {
		t.Fatalf("publish with a missing topic: %v", f)
	}
	if got := r.valuesOf("t"); len(got) != 0 {
		t.Fatalf("t holds %v after a refused publish", got)
	}
}

func (r *rig) idemPublish(v string, pid uint64, seq int64) *heraldpb.PublishResponse {
	r.t.Helper()
	b, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte(v)}}})
	return r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Publish{Publish: &heraldpb.PublishRequest{
		Exchange: "x", ProducerId: pid, Sequence: seq,
		Routed: []*heraldpb.RoutedBatch{{Topic: "t", Partition: 0, Records: b, Count: 1}, {Topic: "u", Partition: 0, Records: b, Count: 1}},
	}}}, r.txn).GetPublishResponse()
}

// TestIdempotentPublish: an idempotent publish sent again (same
// publisher, same sequence) is answered duplicate with the first
// answer's destinations and stored nowhere again; so is an older
// sequence. The publishers' sequences survive a reload and a compaction
// of the events that named them (written again before the cut).
func TestIdempotentPublish(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{CompactCheck: 50 * time.Millisecond})
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "u", Config: &heraldpb.TopicConfig{Partitions: 1}}}}, r.mgr)
	first := r.idemPublish("a", 7, 0)
	if first.Duplicate || len(first.Destinations) != 2 {
		t.Fatalf("first publish: %v", first)
	}
	again := r.idemPublish("a", 7, 0)
	if !again.Duplicate || !proto.Equal(again.Destinations[0], first.Destinations[0]) {
		t.Fatalf("the retry: %v, first %v", again, first)
	}
	if r := r.idemPublish("b", 7, 1); r.Duplicate {
		t.Fatalf("the next sequence: %v", r)
	}
	if r := r.idemPublish("a", 7, 0); !r.Duplicate {
		t.Fatalf("an older sequence: %v", r)
	}
	if r := r.idemPublish("c", 8, 0); r.Duplicate {
		t.Fatalf("another publisher's sequence 0: %v", r)
	}
	// Everything is appended and done: the compaction writes the
	// publishers' sequences again and cuts the Routed events.
	e := r.reg.Get(Topic)
	waitFor(t, "the Routed events compacted away", func() error {
		if s := e.Stats[0].StartOffset.Load(); s < 6 {
			return fmt.Errorf("__txn starts at %d", s)
		}
		return nil
	})
	if _, err := r.sys.Root.StopFuture(r.txn).Result(); err != nil {
		t.Fatal(err)
	}
	r.txn = r.sys.Root.Spawn(Props(Options{Topics: r.reg, Push: noPush{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	if r := r.idemPublish("b", 7, 1); !r.Duplicate {
		t.Fatalf("a retry after the reload: %v", r)
	}
	if r := r.idemPublish("c", 8, 0); !r.Duplicate {
		t.Fatalf("publisher 8's retry after the reload: %v", r)
	}
	for _, topic := range []string{"t", "u"} {
		if got := r.valuesOf(topic); !slices.Equal(got, []string{"a", "b", "c"}) {
			t.Errorf("%s holds %v, want a, b, c once each", topic, got)
		}
	}
}

// TestIdleLogIsNotRewritten: an idle transactional id and an idle
// idempotent publisher are written again once so that compaction can cut
// the log before them, and then not again round after round: an idle
// __txn stops growing.
func TestIdleLogIsNotRewritten(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{CompactCheck: 20 * time.Millisecond})
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "u", Config: &heraldpb.TopicConfig{Partitions: 1}}}}, r.mgr)
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{TransactionalId: "idle"}}}, r.txn)
	r.idemPublish("p", 3, 0)
	for i := range 3 {
		id := r.half(fmt.Sprint("h", i))
		r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{Id: id, Action: heraldpb.HalfAction_HALF_ROLLBACK}}}, r.txn)
	}
	e := r.reg.Get(Topic)
	var hw int64
	waitFor(t, "__txn settled (its high watermark still for 300 ms)", func() error {
		before := e.Stats[0].HighWatermark.Load()
		time.Sleep(300 * time.Millisecond)
		hw = e.Stats[0].HighWatermark.Load()
		if hw != before {
			return fmt.Errorf("grew from %d to %d", before, hw)
		}
		return nil
	})
	if s := e.Stats[0].StartOffset.Load(); s == 0 {
		t.Fatalf("nothing compacted (start %d, high watermark %d)", s, hw)
	}
	if r := r.idemPublish("p", 3, 0); !r.Duplicate {
		t.Fatalf("the publisher was forgotten: %v", r)
	}
}

// waitValues waits until topic t holds want, in order.
func (r *rig) waitValues(what string, want []string) {
	r.t.Helper()
	waitFor(r.t, what, func() error {
		if got := r.values(); !slices.Equal(got, want) {
			return fmt.Errorf("topic holds %v, want %v", got, want)
		}
		return nil
	})
}

// commitWith sends v as the transaction's last batch with commit_txn.
func (s *txnSession) commitWith(v string) *actor.Future {
	b, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte(v)}}})
	return s.r.sys.Root.RequestFuture(s.r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Partition: proto.Uint32(0), Records: b,
		TransactionalId: s.id, ProducerId: s.pid, ProducerEpoch: s.epoch, BaseSequence: s.seq, Acks: heraldpb.Acks_ACKS_ALL, CommitTxn: true}}}, 20*time.Second)
}

// committed takes the answer of commitWith and moves s to the next
// transaction.
func (s *txnSession) committed(f *actor.Future) *heraldpb.ProduceResponse {
	s.r.t.Helper()
	res, err := f.Result()
	if err != nil {
		s.r.t.Fatal(err)
	}
	pr := res.(*heraldpb.Frame).GetProduceResponse()
	if pr.GetTxnEnd() == nil {
		s.r.t.Fatalf("commit_txn answered %v", res)
	}
	s.epoch, s.seq = pr.TxnEnd.NextEpoch, 0
	return pr
}

// The last batch sent with commit_txn is staged and decided in one write
// to __txn (its batch, the decision and the session record, together);
// a retry after a lost answer is answered as already committed, and a
// reload sees the commit whole.
func TestCommitWithTheLastBatch(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{})
	s := r.session("p")
	e := r.reg.Get(Topic)
	var want []string
	for round := range 10 {
		a, b := fmt.Sprintf("%d-a", round), fmt.Sprintf("%d-b", round)
		s.stage(a)
		before := e.Stats[0].HighWatermark.Load()
		pid, epoch, seq := s.pid, s.epoch, s.seq
		pr := s.committed(s.commitWith(b))
		want = append(want, a, b)
		if pr.TxnEnd.Records != 2 || pr.TxnEnd.AlreadyEnded || pr.Duplicate || pr.TxnEnd.NextEpoch != epoch+1 || !slices.Equal(pr.TxnEnd.Partitions, []string{"t/0"}) {
			t.Fatalf("round %d: %v", round, pr)
		}
		waitFor(t, fmt.Sprintf("round %d: __txn grown by the batch, the decision and the session record", round), func() error {
			if after := e.Stats[0].HighWatermark.Load(); after-before < 3 {
				return fmt.Errorf("__txn grew by %d records", after-before)
			}
			return nil
		})
		// The retry of a commit whose answer was lost.
		again := &txnSession{r: r, id: "p", pid: pid, epoch: epoch, seq: seq}
		if pr := again.committed(again.commitWith(b)); !pr.TxnEnd.AlreadyEnded || !pr.Duplicate {
			t.Fatalf("round %d: the retry: %v", round, pr)
		}
	}
	r.waitValues("every committed record once, in order", want)
	_, _ = r.sys.Root.StopFuture(r.txn).Result()
	r.txn = r.sys.Root.Spawn(Props(Options{Topics: r.reg, Push: noPush{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	s.stage("last-a")
	s.committed(s.commitWith("last-b"))
	want = append(want, "last-a", "last-b")
	r.waitValues("the commit after the reload", want)
}

// A commit_txn that cannot be decided at once (earlier commits of the
// producer fill maxCompleting) is staged, then decided when the oldest
// completes; its answer carries the commit.
func TestCommitWithTheLastBatchWaitsItsTurn(t *testing.T) {
	var hold atomic.Bool
	hold.Store(true)
	r := newRig(t, t.TempDir(), Options{holdAppends: hold.Load})
	s := r.session("p")
	var want []string
	for i := range maxCompleting {
		v := fmt.Sprint(i)
		s.committed(s.commitWith(v))
		want = append(want, v)
	}
	f := s.commitWith("queued")
	want = append(want, "queued")
	waitFor(t, "the queued commit's batch staged", func() error {
		infos := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_ListTxn{ListTxn: &heraldpb.ListTxnRequest{Transactions: true, Id: "p"}}}, r.txn).GetListTxnResponse().GetTransactions()
		for _, in := range infos {
			if in.GetProducerEpoch() == s.epoch && in.GetRecords() == 1 {
				return nil
			}
		}
		return fmt.Errorf("transactions: %v", infos)
	})
	if got := r.values(); len(got) != 0 {
		t.Fatalf("appends held, yet the topic holds %v", got)
	}
	hold.Store(false)
	if pr := s.committed(f); pr.TxnEnd.Records != 1 {
		t.Fatalf("the queued commit: %v", pr)
	}
	r.waitValues("every commit appended", want)
}

// An end of the old session that arrives while a new session's Init is
// being written is refused (THROTTLED: the SDK retries and is fenced
// then), so that no decision or session record of the old session lands
// behind the Init, where a reload would apply it and bring the old
// session back: before, the reloaded coordinator fenced the new session
// and took the old one's requests.
func TestEndBehindANewSessionSurvivesAReload(t *testing.T) {
	var hold atomic.Bool
	r := newRig(t, t.TempDir(), Options{holdWrites: hold.Load})
	for round := range 6 {
		old := r.session("p")
		old.stage("a")
		// The Init stays in the write queue until the end is answered.
		hold.Store(true)
		init := r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{TransactionalId: "p"}}}, 20*time.Second)
		var end *actor.Future
		switch round % 3 {
		case 0, 1:
			end = r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{
				TransactionalId: "p", ProducerId: old.pid, ProducerEpoch: old.epoch, Commit: round%3 == 0}}}, 20*time.Second)
		default:
			end = old.commitWith("b")
		}
		res, err := end.Result()
		hold.Store(false)
		if err != nil || res.(*heraldpb.Frame).GetError().GetCode() != heraldpb.ErrorCode_THROTTLED {
			t.Fatalf("round %d: the old session's end behind a new session's Init: %v %v, want THROTTLED", round, res, err)
		}
		res, err = init.Result()
		if err != nil || res.(*heraldpb.Frame).GetInitProducerIdResponse() == nil {
			t.Fatalf("round %d: the new session: %v %v", round, res, err)
		}
		in := res.(*heraldpb.Frame).GetInitProducerIdResponse()
		_, _ = r.sys.Root.StopFuture(r.txn).Result()
		// (The reloaded coordinator holds its writes too: without the
		// hold, the next round's Init could be written before its end
		// arrived, on a machine that delayed the test between the two.)
		r.txn = r.sys.Root.Spawn(Props(Options{Topics: r.reg, Push: noPush{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), holdWrites: hold.Load}))
		s := &txnSession{r: r, id: "p", pid: in.ProducerId, epoch: in.ProducerEpoch}
		s.stage(fmt.Sprint(round))
		s.end(true)
		if e := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{
			TransactionalId: "p", ProducerId: old.pid, ProducerEpoch: old.epoch, Commit: true}}}, r.txn).GetError(); e.GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
			t.Fatalf("round %d: the old session after the reload: %v, want PRODUCER_FENCED", round, e)
		}
	}
	want := []string{"0", "1", "2", "3", "4", "5"}
	r.waitValues("the new sessions' commits only", want)
}
