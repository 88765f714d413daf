package partition

import (
	"path/filepath"
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

// TestHoldIsCappedOnEachReplica: a replica holds a batch at most MaxHold
// from its own clock, whatever time the leader stamped (a leader whose
// clock is ahead must not hold the others' readers longer).
func TestHoldIsCappedOnEachReplica(t *testing.T) {
	a := &Actor{cfg: Config{Clock: SystemClock, MaxHold: MaxHold}}
	now := time.Now().UnixMilli()
	h := heraldpb.LogEntryHeader{NotBeforeMs: now + 5000, AppendTimeMs: now + 5000}
	if until := a.holdUntil(h, now); until != now+MaxHold.Milliseconds() {
		t.Fatalf("held until %d ms from now, want %d", until-now, MaxHold.Milliseconds())
	}
	if until := a.holdUntil(heraldpb.LogEntryHeader{NotBeforeMs: now + 20}, now); until != now+20 {
		t.Fatalf("held until %d ms from now, want 20", until-now)
	}
	if until := a.holdUntil(heraldpb.LogEntryHeader{NotBeforeMs: now - 1}, now); until != 0 {
		t.Fatalf("a past time held until %d", until)
	}
}
