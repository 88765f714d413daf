package scheduler

import (
	"bytes"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// delayedOf is an idempotent producer's delayed batch, without partition
// (the scheduler's round robin picks one).
func delayedOf(pid uint64, seq int64, delay time.Duration, vals ...string) *heraldpb.Frame {
	return &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "t", DelayMs: uint64(delay / time.Millisecond), ProducerId: pid, BaseSequence: seq, Records: batchOf(vals...)}}}
}

// unknownOutcome is a proxy override: the writes to __schedule that hit
// says are written, and answered with code, their outcome unknown (as a
// leader that stopped leading, or a failing disk, answers).
func unknownOutcome(code heraldpb.ErrorCode, hit func(*heraldpb.ProduceRequest) bool) func(msg, res any) any {
	return func(msg, res any) any {
		f, ok := msg.(*heraldpb.Frame)
		if ok && f.GetProduce() != nil && hit(f.GetProduce()) {
			e := heraldpb.NewError(code, "the write's outcome is unknown")
			e.OutcomeUnknown = true
			return heraldpb.ErrorFrame(res.(*heraldpb.Frame).Id, e)
		}
		return res
	}
}

// restartScheduler stops the scheduler actor and starts another on the
// same __schedule, as a move to another node does.
func (r *rig) restartScheduler() {
	r.t.Helper()
	if _, err := r.sys.Root.StopFuture(r.sched).Result(); err != nil {
		r.t.Fatal(err)
	}
	r.sched = r.sys.Root.Spawn(Props(r.o))
}

// count returns how often v is in t's two partitions.
func (r *rig) count(v string) int {
	a, _ := r.read(0)
	b, _ := r.read(1)
	return len(slices.DeleteFunc(append(a, b...), func(x string) bool { return x != v }))
}

// A producer that retries a delayed batch (its answer was lost, or the
// scheduler moved to another node meanwhile) gets the first attempt's
// answer, from the same scheduler and from the next one, which rebuilds
// what it remembers from __schedule; the batch fires once. Found by the
// chaos scenario clock-jump-delayed: d-573 stored twice, on chaos/0 and
// chaos/2, each attempt given its own partition by the round robin.
func TestRetryOfAnIdempotentDelayedBatchIsStoredOnce(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{Lead: 5 * time.Millisecond})
	defer r.stop()
	first := r.ok(delayedOf(7, 0, 700*time.Millisecond, "A"), r.sched).GetProduceResponse()
	again := r.ok(delayedOf(7, 0, 700*time.Millisecond, "A"), r.sched).GetProduceResponse()
	if again.ScheduleId != first.ScheduleId || again.Partition != first.Partition || again.DeliverAtMs != first.DeliverAtMs {
		t.Fatalf("retry answered %v, first attempt %v", again, first)
	}
	r.restartScheduler()
	moved := r.ok(delayedOf(7, 0, 700*time.Millisecond, "A"), r.sched).GetProduceResponse()
	if moved.ScheduleId != first.ScheduleId || moved.Partition != first.Partition {
		t.Fatalf("retry to the next scheduler answered %v, first attempt %v", moved, first)
	}
	// Another batch of the producer, and the same sequence of another
	// producer, are new.
	b := r.ok(delayedOf(7, 1, 10*time.Millisecond, "B"), r.sched).GetProduceResponse()
	c := r.ok(delayedOf(8, 0, 10*time.Millisecond, "C"), r.sched).GetProduceResponse()
	if b.ScheduleId == first.ScheduleId || c.ScheduleId == first.ScheduleId || b.ScheduleId == c.ScheduleId {
		t.Fatalf("distinct batches share a schedule id: %s %s %s", first.ScheduleId, b.ScheduleId, c.ScheduleId)
	}
	r.settle(time.Second) // after A's time
	for _, v := range []string{"A", "B", "C"} {
		if n := r.count(v); n != 1 {
			t.Errorf("%s stored %d times, want once", v, n)
		}
	}
}

// __schedule keeps the records of the batches remembered, so that the
// next scheduler remembers them too, and is truncated past them once the
// window is over; a retry after that is a new batch (the window's limit).
// The scheduler's clock jumps past the window instead of the test waiting.
func TestDedupWindowHoldsBackTruncation(t *testing.T) {
	clk := &jumpClock{}
	r := newRig(t, t.TempDir(), Options{Now: clk.now, Lead: 5 * time.Millisecond, CompactCheck: 20 * time.Millisecond, DedupWindow: time.Minute})
	defer r.stop()
	st := r.reg.Get(ScheduleTopic).Stats[0]
	// A batch without producer id first: compaction may cut past it, and
	// stops at A.
	r.schedule(0, 10*time.Millisecond, "plain")
	first := r.ok(delayedOf(9, 0, 10*time.Millisecond, "A"), r.sched).GetProduceResponse()
	ref, _ := ParseID(first.ScheduleId)
	r.settle(20 * time.Millisecond) // both fired, and their fires recorded
	waitFor(t, "__schedule truncated up to A", func() bool { return st.StartOffset.Load() == int64(ref) })
	r.restartScheduler()
	again := r.ok(delayedOf(9, 0, 10*time.Millisecond, "A"), r.sched).GetProduceResponse()
	if again.ScheduleId != first.ScheduleId {
		t.Fatalf("retry within the window after a restart got id %s, first %s", again.ScheduleId, first.ScheduleId)
	}
	clk.jump(2 * time.Minute)
	waitFor(t, "__schedule truncated past A once the window is over", func() bool { return st.StartOffset.Load() > int64(ref) })
	r.restartScheduler()
	late := r.ok(delayedOf(9, 0, 10*time.Millisecond, "A"), r.sched).GetProduceResponse()
	if late.ScheduleId == first.ScheduleId {
		t.Fatalf("a retry after the window still answered with the first id %s", first.ScheduleId)
	}
	r.settle(20 * time.Millisecond)
	if n := r.count("A"); n != 2 {
		t.Fatalf("A stored %d times, want twice (once in the window, once after)", n)
	}
}

// A write to __schedule refused before it reached the log lets the retry
// store the batch; one whose outcome is unknown (its partition stopped
// leading with it in raft, here landed) makes retries wait, and the next
// scheduler answers them from the log. Each batch fires once.
func TestDedupAfterAFailedWrite(t *testing.T) {
	var refusals, unknowns atomic.Int32
	p := &proxy{}
	p.intercept = func(msg any) any {
		f, ok := msg.(*heraldpb.Frame)
		if ok && f.GetProduce() != nil && bytes.Contains(f.GetProduce().Records, []byte("REFUSED")) && refusals.Add(1) == 1 {
			return heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_NOT_LEADER, "not the leader"))
		}
		return nil
	}
	p.override = unknownOutcome(heraldpb.ErrorCode_NOT_LEADER, func(w *heraldpb.ProduceRequest) bool {
		return bytes.Contains(w.Records, []byte("UNKNOWN")) && unknowns.Add(1) == 1
	})
	r := newProxyRig(t, t.TempDir(), Options{Lead: 5 * time.Millisecond}, ScheduleTopic, 0, p)
	defer r.stop()

	if e := r.call(delayedOf(5, 0, 10*time.Millisecond, "REFUSED"), r.sched).GetError(); e.GetCode() != heraldpb.ErrorCode_NOT_LEADER {
		t.Fatalf("first attempt answered %v", e)
	}
	if e := r.call(delayedOf(5, 0, 10*time.Millisecond, "REFUSED"), r.sched).GetError(); e != nil {
		t.Fatalf("retry after a refusal answered %v", e)
	}

	if e := r.call(delayedOf(5, 1, 300*time.Millisecond, "UNKNOWN"), r.sched).GetError(); !e.GetOutcomeUnknown() {
		t.Fatalf("first attempt answered %v", e)
	}
	// The scheduler reloads from the log, where the batch is: retries
	// wait (THROTTLED, or TIMEOUT while it restarts), then get its id.
	var res *heraldpb.ProduceResponse
	waitFor(t, "a retry answered from the log", func() bool {
		f := r.call(delayedOf(5, 1, 300*time.Millisecond, "UNKNOWN"), r.sched)
		if c := f.GetError().GetCode(); f.GetError() != nil && c != heraldpb.ErrorCode_THROTTLED && c != heraldpb.ErrorCode_TIMEOUT && c != heraldpb.ErrorCode_NOT_READY {
			t.Fatalf("retry while the outcome is unknown answered %v", f.GetError())
		}
		res = f.GetProduceResponse()
		return res != nil
	})
	if res.ScheduleId == "" {
		t.Fatalf("retry answered %v", res)
	}
	// Pending again without any other restart: it fires at its time.
	r.settle(500 * time.Millisecond)
	for _, v := range []string{"REFUSED", "UNKNOWN"} {
		if n := r.count(v); n != 1 {
			t.Errorf("%s stored %d times, want once", v, n)
		}
	}
	if d := testutil.ToFloat64(mDuplicates.WithLabelValues("stored")); d == 0 {
		t.Error("no retry counted as answered from the log")
	}
}

// The window is bounded: past DedupMax the oldest batches are forgotten.
func TestDedupBound(t *testing.T) {
	d := newDedup(time.Minute, 3)
	for s := range int64(5) {
		d.add(dedupKey{1, s}, &dedupEntry{state: dedupStored, created: s, loc: s})
	}
	if len(d.byKey) != 3 || d.lookup(dedupKey{1, 0}) != nil || d.lookup(dedupKey{1, 1}) != nil || d.lookup(dedupKey{1, 4}) == nil {
		t.Fatalf("kept %v", d.byKey)
	}
	if c := d.cut(100); c != 2 {
		t.Fatalf("cut %d, want 2 (the oldest kept)", c)
	}
	d.expire(time.Minute.Milliseconds() + 4)
	if len(d.byKey) != 1 || d.lookup(dedupKey{1, 4}) == nil {
		t.Fatalf("after expiry kept %v", d.byKey)
	}
	if c := d.cut(100); c != 4 {
		t.Fatalf("cut %d, want 4", c)
	}
	// Batches forgotten (their writes refused) and stored again leave no
	// slots behind without bound.
	for i := range 100_000 {
		k, e := dedupKey{2, int64(i % 2)}, &dedupEntry{created: int64(time.Minute.Milliseconds() + 5)}
		d.add(k, e)
		d.forget(k, e)
	}
	if len(d.order) > 2*1024+1 {
		t.Fatalf("%d order slots kept for %d batches", len(d.order), len(d.byKey))
	}
}

// BenchmarkDedupMemory measures the heap a full dedup window takes
// (DedupMax batches remembered), per batch.
func BenchmarkDedupMemory(b *testing.B) {
	const n = 100_000
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		d := newDedup(time.Hour, n)
		for i := range n {
			d.add(dedupKey{uint64(i%64 + 1), int64(i)}, &dedupEntry{state: dedupStored, created: int64(i), loc: int64(i)})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heapB/batch")
		runtime.KeepAlive(d)
	}
}

// A __schedule failing every write with an unknown outcome (a failing
// disk) does not restart the scheduler more often than its supervisor
// allows (10 in 10 s, then it stops it for good): it reloads at most every
// reloadMinAge, and serves again once the writes succeed.
func TestUnknownWritesDoNotStopTheScheduler(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	p := &proxy{}
	p.override = unknownOutcome(heraldpb.ErrorCode_STORAGE_ERROR, func(*heraldpb.ProduceRequest) bool { return failing.Load() })
	r := newProxyRig(t, t.TempDir(), Options{Lead: 5 * time.Millisecond}, ScheduleTopic, 0, p)
	defer r.stop()
	for i := range 15 {
		if e := r.call(delayedOf(6, int64(i), time.Hour, "F"), r.sched).GetError(); e == nil {
			t.Fatalf("write %d through a failing __schedule answered without error", i)
		}
	}
	failing.Store(false)
	var id string
	waitFor(t, "the scheduler serving again", func() bool {
		f := r.call(delayedOf(7, 0, 10*time.Millisecond, "OK"), r.sched)
		id = f.GetProduceResponse().GetScheduleId()
		return id != ""
	})
	r.settle(20 * time.Millisecond)
	if n := r.count("OK"); n != 1 {
		t.Fatalf("OK stored %d times, want once", n)
	}
}
