package partition

import (
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
)

func heldProduce(notBefore int64, values ...string) *heraldpb.Frame {
	f := produceFrame("t", heraldpb.Acks_ACKS_ALL, values...)
	f.GetProduce().NotBeforeMs = notBefore
	return f
}

func fetchHeld(offset int64) *heraldpb.Frame {
	f := fetchFrame("t", offset, 0)
	f.GetFetch().IncludeHeld = true
	return f
}

func latest() *heraldpb.Frame {
	return &heraldpb.Frame{Id: frameIDs.Add(1), Body: &heraldpb.Frame_ListOffsets{ListOffsets: &heraldpb.ListOffsetsRequest{
		Topic: "t", Spec: heraldpb.OffsetSpec_OFFSET_SPEC_LATEST}}}
}

// askFrame sends f to pid and waits for the answer.
func askFrame(t *testing.T, sys *actor.ActorSystem, pid *actor.PID, f *heraldpb.Frame) *heraldpb.Frame {
	t.Helper()
	in := newInbox(sys)
	sys.Root.RequestWithCustomSender(pid, f, in.pid)
	return in.next(t)
}

func records(bs []*heraldpb.StoredBatch) int {
	n := 0
	for _, b := range bs {
		n += int(b.Count)
	}
	return n
}

// TestHeldBatchIsReadableAtItsTime: a batch appended with not_before_ms
// is committed at once on every replica but readable, on every replica,
// only from its time on, and so is a batch appended after it; its
// producer is answered then; the scheduler's include_held fetch sees both
// before.
func TestHeldBatchIsReadableAtItsTime(t *testing.T) {
	sys := actor.NewActorSystem()
	reps := spawnGroupWith(t, sys, 3, func(_ *replica, cfg *Config) { cfg.MaxHold = 5 * time.Second })
	all := map[uint64]bool{1: true, 2: true, 3: true}
	leader := leaderOf(t, reps, all)
	produceRetrying(t, sys, leader.pid, newInbox(sys), heraldpb.Acks_ACKS_ALL, "a")

	held := newInbox(sys)
	notBefore := time.Now().Add(1500 * time.Millisecond).UnixMilli()
	sys.Root.RequestWithCustomSender(leader.pid, heldProduce(notBefore, "b", "c"), held.pid)
	after := askFrame(t, sys, leader.pid, produceFrame("t", heraldpb.Acks_ACKS_ALL, "d")).GetProduceResponse()
	if after == nil || after.BaseOffset != 3 {
		t.Fatalf("the batch after the held one: %v", after)
	}
	// Committed (the one after it was answered) and on every replica's log.
	checkFor(t, 5*time.Second, "every replica has the 4 records", func() bool {
		for _, r := range reps {
			if r.stats.EndOffset.Load() < 4 {
				return false
			}
		}
		return true
	})
	if r := askFrame(t, sys, leader.pid, fetchHeld(1)).GetFetchResponse(); records(r.GetBatches()) != 3 || r.HighWatermark != 4 {
		t.Fatalf("include_held fetch: %v", r)
	}
	// Not readable before its time, on any replica.
	checks := 0
	for ; time.Now().UnixMilli() < notBefore-100; checks++ {
		if r := askFrame(t, sys, leader.pid, fetchFrame("t", 1, 0)).GetFetchResponse(); len(r.GetBatches()) != 0 || r.GetHighWatermark() != 1 {
			t.Fatalf("fetch before the time: %v", r)
		}
		if lo := askFrame(t, sys, leader.pid, latest()).GetListOffsetsResponse(); lo.GetOffset() != 1 {
			t.Fatalf("latest before the time: %v", lo)
		}
		for _, r := range reps {
			if hw := r.stats.HighWatermark.Load(); hw > 1 && time.Now().UnixMilli() < notBefore {
				t.Fatalf("replica %d shows high watermark %d before the time", r.id, hw)
			}
		}
		select {
		case f := <-held.frames:
			t.Fatalf("held produce answered before its time: %v", f)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if checks == 0 {
		t.Fatal("the setup took longer than the hold: nothing was checked before the time")
	}
	// A long poll waiting at the readable end gets them at their time.
	poll := newInbox(sys)
	sys.Root.RequestWithCustomSender(leader.pid, fetchFrame("t", 1, 5000), poll.pid)
	got := poll.next(t).GetFetchResponse()
	if now := time.Now().UnixMilli(); now < notBefore {
		t.Fatalf("readable %d ms early", notBefore-now)
	}
	if records(got.GetBatches()) != 3 || got.HighWatermark != 4 {
		t.Fatalf("long poll at the time: %v", got)
	}
	resp := held.next(t).GetProduceResponse()
	if resp == nil || resp.BaseOffset != 1 || resp.CommitTimeUs < notBefore*1000 {
		t.Fatalf("held produce's answer: %v (not before %d ms)", resp, notBefore)
	}
	checkFor(t, 5*time.Second, "every replica's high watermark at 4", func() bool {
		for _, r := range reps {
			if r.stats.HighWatermark.Load() != 4 {
				return false
			}
		}
		return true
	})
}

// TestHoldIsBounded: a batch is held at most MaxHold after its append,
// whatever time it names.
func TestHoldIsBounded(t *testing.T) {
	sys := actor.NewActorSystem()
	reps := spawnGroup(t, sys, 1)
	leader := leaderOf(t, reps, map[uint64]bool{1: true})
	in := newInbox(sys)
	sent := time.Now()
	sys.Root.RequestWithCustomSender(leader.pid, heldProduce(sent.Add(time.Hour).UnixMilli(), "x"), in.pid)
	var resp *heraldpb.ProduceResponse
	for resp == nil {
		f := in.next(t)
		if resp = f.GetProduceResponse(); resp == nil && (!f.GetError().GetRetriable() || time.Since(sent) > 5*time.Second) {
			t.Fatalf("held produce: %v", f.GetError())
		} else if resp == nil {
			sys.Root.RequestWithCustomSender(leader.pid, heldProduce(sent.Add(time.Hour).UnixMilli(), "x"), in.pid)
		}
	}
	if waited := time.Since(sent); waited < MaxHold-100*time.Millisecond || waited > 5*time.Second {
		t.Fatalf("held for %v, want about MaxHold (%v)", waited, MaxHold)
	}
	if r := askFrame(t, sys, leader.pid, fetchFrame("t", 0, 0)).GetFetchResponse(); records(r.GetBatches()) != 1 {
		t.Fatalf("fetch after the hold: %v", r)
	}
}

// TestHoldSurvivesRestart: a replica restarted while a batch is held holds
// it again until its time.
func TestHoldSurvivesRestart(t *testing.T) {
	sys := actor.NewActorSystem()
	dir := filepath.Join(t.TempDir(), "r1")
	readers := NewReaderPool(sys, 1, 16)
	t.Cleanup(readers.Close)
	spawn := func() *actor.PID {
		cfg := Config{
			Topic: "t", ReplicaID: 1, Peers: map[uint64]*actor.PID{1: actor.NewPID(sys.Address(), "p/t-0/r1")},
			Open:         func() (Storage, error) { return persistence.Open(persistence.Options{Dir: dir, Group: "t-0"}) },
			TickInterval: 10 * time.Millisecond, Readers: readers, MaxHold: 5 * time.Second,
		}
		props, err := Props(sys, cfg, &Stats{})
		if err != nil {
			t.Fatal(err)
		}
		pid, err := sys.Root.SpawnNamed(props, "p/t-0/r1")
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	pid := spawn()
	produceRetrying(t, sys, pid, newInbox(sys), heraldpb.Acks_ACKS_ALL, "a")
	// Large entries before the held one: reading the log's tail back takes
	// more than one read (each stops at 16 MiB).
	big := string(make([]byte, 900<<10))
	for range 20 {
		produceRetrying(t, sys, pid, newInbox(sys), heraldpb.Acks_ACKS_ALL, big)
	}
	notBefore := time.Now().Add(2500 * time.Millisecond).UnixMilli()
	sys.Root.Send(pid, heldProduce(notBefore, "b"))
	checkFor(t, 5*time.Second, "the held batch committed", func() bool {
		return records(askFrame(t, sys, pid, fetchHeld(21)).GetFetchResponse().GetBatches()) == 1
	})
	if err := sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	pid = spawn()
	t.Cleanup(func() { sys.Root.StopFuture(pid).Wait() })
	checkFor(t, 5*time.Second, "the restarted replica answers", func() bool {
		return askFrame(t, sys, pid, latest()).GetListOffsetsResponse() != nil
	})
	if time.Now().UnixMilli() >= notBefore {
		t.Fatalf("the restart took too long to check the hold (%d ms past its time)", time.Now().UnixMilli()-notBefore)
	}
	if lo := askFrame(t, sys, pid, latest()).GetListOffsetsResponse(); lo.Offset != 21 && time.Now().UnixMilli() < notBefore {
		t.Fatalf("after the restart, before the time: latest %d, want 21", lo.Offset)
	}
	// The long poll is answered at the time (empty when the batch is not
	// in the restarted replica's memory: the client reads it again).
	got := askFrame(t, sys, pid, fetchFrame("t", 21, 5000)).GetFetchResponse()
	if now := time.Now().UnixMilli(); now < notBefore || got.GetHighWatermark() != 22 {
		t.Fatalf("after the restart: %v at %d ms before its time", got, notBefore-now)
	}
	if got := askFrame(t, sys, pid, fetchFrame("t", 21, 0)).GetFetchResponse(); records(got.GetBatches()) != 1 {
		t.Fatalf("after the restart, at the time: %v", got)
	}
}

// TestHoldIsDecidedAtTheLeader: the leader holds a batch for the
// sender's hold_us, or until not_before_ms by its own clock when that is
// later (until not_before_ms alone when the sender shares its clock), at
// most MaxHold; a replica holds an entry for the recorded hold
// from when the entry reached it, capped by its own MaxHold; an entry of a
// leader that predates hold_us is held until its time on this clock.
func TestHoldIsDecidedAtTheLeader(t *testing.T) {
	a := &Actor{cfg: Config{Clock: SystemClock, MaxHold: MaxHold, ClockID: 9}}
	now := time.Now()
	nowMs := now.UnixMilli()
	ms := time.Millisecond
	for _, tc := range []struct {
		name     string
		req      *heraldpb.ProduceRequest
		min, max time.Duration
	}{
		{"hold_us alone", &heraldpb.ProduceRequest{HoldUs: 50_000}, 50 * ms, 50 * ms},
		{"the leader's clock behind the sender's: its time is later", &heraldpb.ProduceRequest{HoldUs: 50_000, NotBeforeMs: nowMs + 200}, 199 * ms, 200 * ms},
		{"the leader's clock ahead of the sender's: hold_us", &heraldpb.ProduceRequest{HoldUs: 50_000, NotBeforeMs: nowMs - 30_000}, 50 * ms, 50 * ms},
		{"another clock: the later of the two", &heraldpb.ProduceRequest{HoldUs: 50_000, NotBeforeMs: nowMs + 20, ClockId: 8}, 50 * ms, 50 * ms},
		{"the leader's own clock: its time alone", &heraldpb.ProduceRequest{HoldUs: 50_000, NotBeforeMs: nowMs + 20, ClockId: 9}, 19 * ms, 20 * ms},
		{"the leader's own clock, a time that has come", &heraldpb.ProduceRequest{HoldUs: 50_000, NotBeforeMs: nowMs - 1, ClockId: 9}, 0, 0},
		{"hold_us capped", &heraldpb.ProduceRequest{HoldUs: 5_000_000}, MaxHold, MaxHold},
		{"not_before_ms alone, capped", &heraldpb.ProduceRequest{NotBeforeMs: nowMs + 3_600_000}, MaxHold, MaxHold},
		{"not_before_ms alone", &heraldpb.ProduceRequest{NotBeforeMs: nowMs + 20}, 19 * ms, 20 * ms},
		{"a past time", &heraldpb.ProduceRequest{NotBeforeMs: nowMs - 1}, 0, 0},
		{"nothing", &heraldpb.ProduceRequest{}, 0, 0},
	} {
		if got := a.holdFor(tc.req, now); got < tc.min || got > tc.max {
			t.Errorf("%s: hold %v, want %v-%v", tc.name, got, tc.min, tc.max)
		}
	}

	// From the entry's arrival when it was seen, else from now; capped.
	arrived := now.Add(-20 * time.Millisecond)
	a.noteReceipt(holdKey{term: 3, base: 7}, arrived)
	if from, until, ok := a.holdOf(3, heraldpb.LogEntryHeader{BaseOffset: 7, HoldUs: 50_000}, now); !ok || !from.Equal(arrived) || !until.Equal(arrived.Add(50*time.Millisecond)) {
		t.Errorf("held from its arrival: %v %v %v", from, until, ok)
	}
	if len(a.heldFrom) != 0 {
		t.Errorf("the arrival is still kept after the apply: %v", a.heldFrom)
	}
	if from, until, ok := a.holdOf(4, heraldpb.LogEntryHeader{BaseOffset: 7, HoldUs: 5_000_000}, now); !ok || !from.Equal(now) || !until.Equal(now.Add(MaxHold)) {
		t.Errorf("held from its apply, capped: %v %v %v", from, until, ok)
	}
	// An arrival after now (the clock went back since): from now.
	a.noteReceipt(holdKey{term: 3, base: 8}, now.Add(30*time.Second))
	if from, _, ok := a.holdOf(3, heraldpb.LogEntryHeader{BaseOffset: 8, HoldUs: 50_000}, now); !ok || !from.Equal(now) {
		t.Errorf("an arrival after now: held from %v, want now", from)
	}
	// Over by its apply.
	a.noteReceipt(holdKey{term: 3, base: 9}, now.Add(-time.Second))
	if _, _, ok := a.holdOf(3, heraldpb.LogEntryHeader{BaseOffset: 9, HoldUs: 50_000}, now); ok {
		t.Error("a hold over before its apply is held")
	}
	// A leader that predates hold_us: its time on this clock.
	if _, until, ok := a.holdOf(1, heraldpb.LogEntryHeader{NotBeforeMs: nowMs + 20}, now); !ok || until.Sub(now) > 20*time.Millisecond || until.Sub(now) < 19*time.Millisecond {
		t.Errorf("a time 20 ms away held until %v from now", until.Sub(now))
	}
	if _, until, ok := a.holdOf(1, heraldpb.LogEntryHeader{NotBeforeMs: nowMs + 5000, AppendTimeMs: nowMs + 5000}, now); !ok || !until.Equal(now.Add(MaxHold)) {
		t.Errorf("a time 5 s away held until %v from now, want MaxHold", until.Sub(now))
	}
	if _, _, ok := a.holdOf(1, heraldpb.LogEntryHeader{NotBeforeMs: nowMs - 1}, now); ok {
		t.Error("a past time is held")
	}
	// Restored: the whole hold again, from now.
	if until, ok := a.restoredHold(heraldpb.LogEntryHeader{HoldUs: 50_000, NotBeforeMs: nowMs - 30_000}, now); !ok || !until.Equal(now.Add(50*time.Millisecond)) {
		t.Errorf("restored hold until %v from now, want 50 ms", until.Sub(now))
	}
}

// TestHoldRequest: the sender asks for the rest of its time, rounded up
// to a µs, and names the time and its clock for partitions on the same
// clock and those that predate hold_us.
func TestHoldRequest(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000).Add(300*time.Microsecond + 1)
	var req heraldpb.ProduceRequest
	HoldRequest(&req, 1_800_000_000_050, now, 7)
	if req.HoldUs != 49_700 || req.NotBeforeMs != 1_800_000_000_050 || req.ClockId != 7 {
		t.Fatalf("50 ms away: %v", &req)
	}
	HoldRequest(&req, 1_800_000_000_000, now, 0)
	if req.HoldUs != 0 || req.NotBeforeMs != 1_800_000_000_000 || req.ClockId != 0 {
		t.Fatalf("a time that has come: %v", &req)
	}
}

// TestHoldRestartsWhenTheClockGoesBack: a clock that goes back during a
// hold (the chaos build's clock: its monotonic reading moves too) holds
// the batch for its length again from then, not for as long as the step.
func TestHoldRestartsWhenTheClockGoesBack(t *testing.T) {
	clock := &jumpClock{}
	sys := actor.NewActorSystem()
	reps := spawnGroupWith(t, sys, 1, func(_ *replica, cfg *Config) { cfg.Clock = clock })
	leader := leaderOf(t, reps, map[uint64]bool{1: true})
	produceRetrying(t, sys, leader.pid, newInbox(sys), heraldpb.Acks_ACKS_ALL, "a")

	sent := time.Now()
	f := produceFrame("t", heraldpb.Acks_ACKS_ALL, "b")
	HoldRequest(f.GetProduce(), clock.Now().Add(300*time.Millisecond).UnixMilli(), clock.Now(), 0)
	held := newInbox(sys)
	sys.Root.RequestWithCustomSender(leader.pid, f, held.pid)
	checkFor(t, 5*time.Second, "the held batch committed", func() bool {
		return records(askFrame(t, sys, leader.pid, fetchHeld(1)).GetFetchResponse().GetBatches()) == 1
	})
	if records(askFrame(t, sys, leader.pid, fetchFrame("t", 1, 0)).GetFetchResponse().GetBatches()) != 0 {
		t.Fatal("readable before the clock went back")
	}
	clock.set(-30 * time.Second)
	resp := held.next(t).GetProduceResponse()
	if waited := time.Since(sent); resp == nil || waited < 300*time.Millisecond || waited > 3*time.Second {
		t.Fatalf("after the clock went back 30 s: answered %v after %v, want about 300-600 ms", resp, waited)
	}
	if records(askFrame(t, sys, leader.pid, fetchFrame("t", 1, 0)).GetFetchResponse().GetBatches()) != 1 {
		t.Fatal("not readable after its hold")
	}
}

// jumpClock is the real time plus an offset that a test moves.
type jumpClock struct{ off atomic.Int64 }

func (c *jumpClock) Now() time.Time      { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *jumpClock) set(d time.Duration) { c.off.Store(int64(d)) }

// offsetClock is a node's clock off the real time by d (as the chaos
// build's clock: its monotonic reading moves with it).
type offsetClock struct{ d time.Duration }

func (c offsetClock) Now() time.Time { return time.Now().Add(c.d) }

// TestHoldUnderClockSkew: the scheduler (on the real clock here) appends
// a batch ahead of its time; replicas whose clocks are off the
// scheduler's, ahead or behind, the leader's included, never make it
// readable before its time by the scheduler's clock, and make it readable
// soon after (within MaxHold when a clock is behind).
func TestHoldUnderClockSkew(t *testing.T) {
	for _, tc := range []struct {
		name   string
		clocks [3]time.Duration // replicas 1-3
		late   time.Duration    // the longest a replica may take past the time
	}{
		{"partition ahead", [3]time.Duration{30 * time.Second, 30 * time.Second, 30 * time.Second}, 500 * time.Millisecond},
		{"partition behind", [3]time.Duration{-30 * time.Second, -30 * time.Second, -30 * time.Second}, MaxHold + 500*time.Millisecond},
		{"replicas disagree", [3]time.Duration{30 * time.Second, -30 * time.Second, 2 * time.Second}, MaxHold + 500*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sys := actor.NewActorSystem()
			reps := spawnGroupWith(t, sys, 3, func(r *replica, cfg *Config) { cfg.Clock = offsetClock{tc.clocks[r.id-1]} })
			all := map[uint64]bool{1: true, 2: true, 3: true}
			leader := leaderOf(t, reps, all)
			produceRetrying(t, sys, leader.pid, newInbox(sys), heraldpb.Acks_ACKS_ALL, "a")
			checkFor(t, 5*time.Second, "every replica reads the first record", func() bool {
				for _, r := range reps {
					if r.stats.HighWatermark.Load() != 1 {
						return false
					}
				}
				return true
			})

			// Sent 300 ms ahead of its time, as the scheduler sends it.
			sent := time.Now()
			at := time.UnixMilli(sent.Add(300 * time.Millisecond).UnixMilli())
			f := produceFrame("t", heraldpb.Acks_ACKS_ALL, "b")
			HoldRequest(f.GetProduce(), at.UnixMilli(), sent, 0)
			held := newInbox(sys)
			sys.Root.RequestWithCustomSender(leader.pid, f, held.pid)

			readable := map[uint64]time.Time{}
			checks := 0
			deadline := at.Add(tc.late)
			for len(readable) < len(reps) {
				for _, r := range reps {
					if _, ok := readable[r.id]; ok {
						continue
					}
					resp := askFrame(t, sys, r.pid, fetchFrame("t", 1, 0)).GetFetchResponse()
					now := time.Now()
					if records(resp.GetBatches()) == 0 {
						if now.After(deadline) {
							t.Fatalf("replica %d (clock %v): not readable %v after its time", r.id, tc.clocks[r.id-1], now.Sub(at))
						}
						checks++
						continue
					}
					if now.Before(at) {
						t.Fatalf("replica %d (clock %v, leader %d): readable %v before its time", r.id, tc.clocks[r.id-1], leader.id, at.Sub(now))
					}
					readable[r.id] = now
				}
				time.Sleep(2 * time.Millisecond)
			}
			if checks == 0 {
				t.Fatal("nothing was checked before the time")
			}
			resp := held.next(t).GetProduceResponse()
			if resp == nil || resp.BaseOffset != 1 {
				t.Fatalf("held produce's answer: %v", resp)
			}
			for id, when := range readable {
				t.Logf("replica %d (clock %v): readable %v after its time", id, tc.clocks[id-1], when.Sub(at))
			}
		})
	}
}
