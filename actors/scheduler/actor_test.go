package scheduler

import (
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	"github.com/heraldmq/herald/actors/topic"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"github.com/heraldmq/herald/timewheel"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
)

// rig is a topic manager with real partitions on disk, and a scheduler.
type rig struct {
	t     *testing.T
	sys   *actor.ActorSystem
	mgr   *actor.PID
	reg   *registry.Registry
	sched *actor.PID
	o     Options
}

func newRig(t *testing.T, dir string, o Options) *rig {
	t.Helper()
	return newRigClock(t, dir, o, nil, 0)
}

// newRigClock is newRig with the partitions on clock (nil: the system's)
// named clockID (partition.Config.ClockID), the scheduler on o.Now.
func newRigClock(t *testing.T, dir string, o Options, clock partition.Clock, clockID uint64) *rig {
	t.Helper()
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
	mgr, reg, err := topic.Spawn(sys, topic.Config{DataDir: dir, NodeID: 1, Advertise: "x", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Clock: clock, ClockID: clockID})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, sys: sys, mgr: mgr, reg: reg}
	res, err := sys.Root.RequestFuture(mgr, &topic.EnsureInternal{Name: ScheduleTopic, Partitions: 1, MaxMessageBytes: 2 << 20}, 10*time.Second).Result()
	if err != nil || res.(*topic.EnsureInternalResult).Err != nil {
		t.Fatal(err, res)
	}
	if reg.Get("t") == nil {
		r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "t", Config: &heraldpb.TopicConfig{Partitions: 2}}}}, mgr)
	}
	o.Topics, o.Logger = reg, slog.New(slog.NewTextHandler(io.Discard, nil))
	r.o = o
	r.sched = sys.Root.Spawn(Props(o))
	return r
}

func (r *rig) stop() {
	_, _ = r.sys.Root.StopFuture(r.sched).Result()
	_, _ = r.sys.Root.StopFuture(r.mgr).Result()
	r.sys.Shutdown()
}

func (r *rig) call(f *heraldpb.Frame, to *actor.PID) *heraldpb.Frame {
	r.t.Helper()
	res, err := r.sys.Root.RequestFuture(to, f, 10*time.Second).Result()
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

func batchOf(vals ...string) []byte {
	b := &heraldpb.RecordBatch{}
	for _, v := range vals {
		b.Records = append(b.Records, &heraldpb.Record{Value: []byte(v)})
	}
	out, _ := proto.Marshal(b)
	return out
}

// schedule stores a delayed batch and returns its id.
func (r *rig) schedule(part uint32, delay time.Duration, vals ...string) string {
	r.t.Helper()
	res := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "t", Partition: proto.Uint32(part), DelayMs: uint64(delay / time.Millisecond), Records: batchOf(vals...),
	}}}, r.sched)
	return res.GetProduceResponse().ScheduleId
}

// read returns every record of partition p of t: value -> schedule id.
func (r *rig) read(p uint32) (vals []string, idOf map[string]string) {
	r.t.Helper()
	idOf = map[string]string{}
	e := r.reg.Get("t")
	res := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{Topic: "t", Partition: p, MaxBytes: 16 << 20}}}, e.Partitions[p])
	for _, b := range res.GetFetchResponse().Batches {
		_ = heraldpb.ForEachRawRecord(b.Records, func(_ int, rec []byte) bool {
			var m heraldpb.Record
			_ = proto.Unmarshal(rec, &m)
			id, _ := heraldpb.RecordHeader(rec, HeaderScheduleID)
			vals = append(vals, string(m.Value))
			idOf[string(m.Value)] = string(id)
			return true
		})
	}
	return vals, idOf
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A crash of the scheduler between appending due batches and recording
// their fire (injected as a panic there; the supervisor restarts the
// actor, which rebuilds from __schedule) appends each batch once.
func TestSchedulerCrashBetweenAppendAndRecord(t *testing.T) {
	var crashes atomic.Int32
	var armed atomic.Bool // once every batch is stored: a crash then loses no answer
	// A short lead: the batches, 10 ms apart, then fire in many rounds.
	r := newRig(t, t.TempDir(), Options{Lead: 5 * time.Millisecond, crashAfterAppend: func() bool { return armed.Load() && crashes.Add(1) <= 2 }})
	defer r.stop()
	want := map[string]string{}
	for i := range 20 {
		v := fmt.Sprintf("v%d", i)
		want[v] = r.schedule(uint32(i%2), time.Duration(100+i*10)*time.Millisecond, v)
	}
	armed.Store(true)
	count := func() int {
		a, _ := r.read(0)
		b, _ := r.read(1)
		return len(a) + len(b)
	}
	waitFor(t, "20 fires", func() bool { return count() >= 20 && crashes.Load() >= 3 })
	// Give any duplicate a chance to show: one more batch scheduled after
	// all the others has fired, so every earlier one has been handled.
	want["last"] = r.schedule(0, 10*time.Millisecond, "last")
	waitFor(t, "the last fire", func() bool { _, ids := r.read(0); return ids["last"] != "" })
	seen := map[string]int{}
	for p := range uint32(2) {
		vals, ids := r.read(p)
		for _, v := range vals {
			seen[v]++
			if ids[v] != want[v] {
				t.Errorf("%s carries schedule id %q, want %q", v, ids[v], want[v])
			}
		}
	}
	for v := range want {
		if seen[v] != 1 {
			t.Errorf("%s appended %d times, want once", v, seen[v])
		}
	}
	if crashes.Load() < 3 {
		t.Fatalf("only %d crashes injected", crashes.Load())
	}
}

// jumpClock is the real clock plus an offset a test moves forward.
type jumpClock struct{ off atomic.Int64 }

func (c *jumpClock) now() time.Time       { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *jumpClock) jump(d time.Duration) { c.off.Add(int64(d)) }

// Far timers (minutes to 90 days) wait in the disk-backed far store, are
// rebuilt from __schedule after a restart, fire once each in order of
// their time when the clock reaches them, and a cancelled one never fires.
func TestSchedulerFarTimersAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	clk := &jumpClock{}
	opts := func() Options {
		return Options{Now: clk.now, NewFar: func() (timewheel.FarStore, error) {
			return timewheel.OpenDiskFar(dir+"/far", timewheel.DiskFarOptions{MaxBuffered: 2})
		}}
	}
	r := newRig(t, dir+"/data", opts())
	delays := map[string]time.Duration{
		"2m": 2 * time.Minute, "1h": time.Hour, "1h-b": time.Hour + 5*time.Second, "3d": 72 * time.Hour,
		"90d": 90 * 24 * time.Hour, "cancelled": 2 * time.Hour, "near": 30 * time.Second,
	}
	ids := map[string]string{}
	for v, d := range delays {
		ids[v] = r.schedule(0, d, v)
	}
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CancelScheduled{CancelScheduled: &heraldpb.CancelScheduledRequest{Id: ids["cancelled"]}}}, r.sched)
	if got := testutil.ToFloat64(mPending); got != 6 {
		t.Fatalf("herald_scheduler_pending = %v before the stop, want 6", got)
	}
	// Restart: the scheduler rebuilds its wheel and far store from the log.
	r.stop()
	// A stopped scheduler (this node no longer leads __schedule) reports
	// none pending: the next one counts its own.
	if got := testutil.ToFloat64(mPending); got != 0 {
		t.Fatalf("herald_scheduler_pending = %v after the scheduler stopped, want 0", got)
	}
	r = newRig(t, dir+"/data", opts())
	defer r.stop()
	list := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_ListScheduled{ListScheduled: &heraldpb.ListScheduledRequest{Limit: 100}}}, r.sched).GetListScheduledResponse()
	if list.Pending != 6 || len(list.Scheduled) != 6 || list.Scheduled[0].Id != ids["near"] || list.Scheduled[5].Id != ids["90d"] {
		t.Fatalf("after restart: %v", list)
	}
	want := []string{"near", "2m", "1h", "1h-b", "3d", "90d"}
	var moved time.Duration
	for i, v := range want {
		clk.jump(delays[v] - moved) // just past v's time (real time has passed too)
		moved = delays[v]
		r.sys.Root.Send(r.sched, &ClockJumped{})
		waitFor(t, v, func() bool { vals, _ := r.read(0); return len(vals) > i })
		vals, idOf := r.read(0)
		if len(vals) != i+1 || vals[i] != v || idOf[v] != ids[v] {
			t.Fatalf("after the clock reached %s: %v", v, vals)
		}
	}
	clk.jump(100 * 24 * time.Hour)
	r.sys.Root.Send(r.sched, &ClockJumped{})
	// The list is empty once the last fire is recorded; nothing more came.
	waitFor(t, "no pending", func() bool {
		l := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_ListScheduled{ListScheduled: &heraldpb.ListScheduledRequest{}}}, r.sched).GetListScheduledResponse()
		return l.Pending == 0
	})
	if vals, _ := r.read(0); len(vals) != len(want) {
		t.Fatalf("topic holds %v", vals)
	}
}

// settle waits until the scheduler has handled everything due before a
// sentinel batch, due after on a topic of its own, is appended: what a
// test checks after it (no duplicate, nothing missing) is then final.
func (r *rig) settle(after time.Duration) {
	r.t.Helper()
	if r.reg.Get("sentinel") == nil {
		r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "sentinel", Config: &heraldpb.TopicConfig{Partitions: 1}}}}, r.mgr)
	}
	e := r.reg.Get("sentinel")
	n := e.Stats[0].HighWatermark.Load()
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "sentinel", Partition: proto.Uint32(0), DelayMs: uint64(after / time.Millisecond), Records: batchOf("sentinel")}}}, r.sched)
	waitFor(r.t, "the sentinel", func() bool { return e.Stats[0].HighWatermark.Load() > n })
}

// A batch pending for a day no longer pins __schedule: compaction moves
// it up the log under its original id, the log is truncated behind it, a
// restart keeps it (by its original id), and it fires once with that id.
func TestSchedulerMovesLongPendingBatch(t *testing.T) {
	dir := t.TempDir()
	clk := &jumpClock{}
	opts := Options{Now: clk.now, CompactCheck: 20 * time.Millisecond, RewriteBytes: 1, Lead: 5 * time.Millisecond}
	r := newRig(t, dir, opts)
	far := r.schedule(1, 24*time.Hour, "far")
	doomed := r.schedule(1, 48*time.Hour, "doomed")
	for i := range 40 {
		r.schedule(0, time.Millisecond, fmt.Sprint("short-", i))
	}
	waitFor(t, "the short ones", func() bool { v, _ := r.read(0); return len(v) == 40 })
	st := r.reg.Get(ScheduleTopic).Stats[0]
	waitFor(t, "__schedule truncated past the far batches", func() bool { return st.StartOffset.Load() > 1 })
	list := func() map[string]bool {
		l := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_ListScheduled{ListScheduled: &heraldpb.ListScheduledRequest{}}}, r.sched).GetListScheduledResponse()
		ids := map[string]bool{}
		for _, s := range l.Scheduled {
			ids[s.Id] = true
		}
		return ids
	}
	if ids := list(); len(ids) != 2 || !ids[far] || !ids[doomed] {
		t.Fatalf("after the move: listed %v, want the original ids %s and %s", ids, far, doomed)
	}
	r.stop()
	r = newRig(t, dir, opts)
	defer r.stop()
	if ids := list(); len(ids) != 2 || !ids[far] || !ids[doomed] {
		t.Fatalf("after a restart: listed %v, want %s and %s", ids, far, doomed)
	}
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CancelScheduled{CancelScheduled: &heraldpb.CancelScheduledRequest{Id: doomed}}}, r.sched)
	clk.jump(72 * time.Hour)
	r.sys.Root.Send(r.sched, &ClockJumped{})
	waitFor(t, "the far batch", func() bool { v, _ := r.read(1); return len(v) >= 1 })
	r.settle(10 * time.Millisecond)
	vals, ids := r.read(1)
	if len(vals) != 1 || vals[0] != "far" || ids["far"] != far {
		t.Fatalf("partition 1 holds %v (ids %v), want far once with id %s", vals, ids, far)
	}
}

// With MaxHeldBytes far below one round, rounds run one at a time, each
// after the previous one's appends were sent: 200 batches due together
// still all fire, once each, none early, and the held bytes never reach
// two rounds' worth.
func TestSchedulerHeldBytesBound(t *testing.T) {
	r := newRig(t, t.TempDir(), Options{MaxHeldBytes: 1, FireBatch: 8, MaxRounds: 4, Lead: 2 * time.Second})
	defer r.stop()
	const n = 200
	due := time.Now().Add(500 * time.Millisecond)
	for i := 0; i < n; i++ {
		// Under -race on a loaded machine scheduling may outlast due:
		// the rest are due at once then (never a negative delay).
		r.schedule(uint32(i%2), max(time.Until(due), time.Millisecond), fmt.Sprintf("v%03d", i))
	}
	var peak float64
	waitFor(t, "every batch fired", func() bool {
		peak = max(peak, testutil.ToFloat64(mHeldBytes))
		a, _ := r.read(0)
		b, _ := r.read(1)
		if len(a)+len(b) > 0 && time.Now().Before(due.Add(-time.Millisecond)) {
			t.Fatalf("%d batches appended before their time", len(a)+len(b))
		}
		return len(a)+len(b) >= n
	})
	seen := map[string]bool{}
	for p := uint32(0); p < 2; p++ {
		vals, _ := r.read(p)
		for _, v := range vals {
			if seen[v] {
				t.Fatalf("%s appended twice", v)
			}
			seen[v] = true
		}
	}
	if len(seen) != n {
		t.Fatalf("%d distinct batches appended, want %d", len(seen), n)
	}
	// Rounds start only while less than MaxHeldBytes is held, at most
	// MaxRounds at once: held bytes stay below that many rounds (8
	// batches each, of about 110 bytes with their fire headers), whether they
	// wait for their time or behind their partition's open appends.
	t.Logf("held bytes peaked at %.0f", peak)
	if limit := float64(4 * 8 * 128); peak >= limit {
		t.Fatalf("held bytes peaked at %.0f, want below MaxRounds rounds (%.0f)", peak, limit)
	}
}

// offsetClock is a node's clock off the real time by d.
type offsetClock struct{ d time.Duration }

func (c offsetClock) Now() time.Time { return time.Now().Add(c.d) }

// TestFireNotEarlyUnderPartitionClockSkew: the scheduler appends a batch
// AppendAhead before its time; a partition whose clock is ahead of the
// scheduler's still keeps it unreadable until its time by the scheduler's
// clock, and one whose clock is behind makes it readable at most
// partition.MaxHold after it.
func TestFireNotEarlyUnderPartitionClockSkew(t *testing.T) {
	for _, tc := range []struct {
		name string
		skew time.Duration
		late time.Duration
	}{
		{"partition ahead", 30 * time.Second, 500 * time.Millisecond},
		{"partition behind", -30 * time.Second, partition.MaxHold + 500*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRigClock(t, t.TempDir(), Options{AppendAhead: 200 * time.Millisecond}, offsetClock{tc.skew}, 0)
			defer r.stop()
			at := time.UnixMilli(time.Now().Add(700 * time.Millisecond).UnixMilli())
			r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
				Topic: "t", Partition: proto.Uint32(0), DeliverAtMs: at.UnixMilli(), Records: batchOf("d"),
			}}}, r.sched)
			checks := 0
			for {
				vals, _ := r.read(0)
				now := time.Now()
				if len(vals) > 0 {
					if now.Before(at) {
						t.Fatalf("readable %v before its time (partition clock %v)", at.Sub(now), tc.skew)
					}
					t.Logf("readable %v after its time", now.Sub(at))
					break
				}
				if now.After(at.Add(tc.late)) {
					t.Fatalf("not readable %v after its time", now.Sub(at))
				}
				checks++
				time.Sleep(2 * time.Millisecond)
			}
			if checks == 0 {
				t.Fatal("nothing was checked before the time")
			}
		})
	}
}

// TestFireOnTheSameClock: partitions that share the scheduler's clock
// (its node's) hold its appends until their time: the batch becomes
// readable at its time, not before, and its append time (when it became
// readable) is not before its time either. The scheduler claims no clock
// id (the partitions would hold by their wall clock alone, which a step
// may put ahead of the scheduler's time), so the hold counts from the
// request's receipt: the trip to the partition is added.
func TestFireOnTheSameClock(t *testing.T) {
	r := newRigClock(t, t.TempDir(), Options{AppendAhead: 200 * time.Millisecond}, nil, 5)
	defer r.stop()
	at := time.UnixMilli(time.Now().Add(700 * time.Millisecond).UnixMilli())
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "t", Partition: proto.Uint32(0), DeliverAtMs: at.UnixMilli(), Records: batchOf("d"),
	}}}, r.sched)
	for {
		res := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{Topic: "t", Partition: 0, MaxBytes: 1 << 20}}}, r.reg.Get("t").Partitions[0])
		now := time.Now()
		if bs := res.GetFetchResponse().GetBatches(); len(bs) > 0 {
			if now.Before(at) {
				t.Fatalf("readable %v before its time", at.Sub(now))
			}
			if got := bs[0].AppendTimeMs; got < at.UnixMilli() || got > at.Add(partition.MaxHold).UnixMilli() {
				t.Fatalf("append time %d, want from its time %d to %v after it", got, at.UnixMilli(), partition.MaxHold)
			}
			t.Logf("readable %v after its time, append time %d ms after it", now.Sub(at), bs[0].AppendTimeMs-at.UnixMilli())
			return
		}
		if now.After(at.Add(5 * time.Second)) {
			t.Fatal("not readable 5 s after its time")
		}
		time.Sleep(2 * time.Millisecond)
	}
}
