package partition

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.etcd.io/raft/v3/raftpb"
)

// stallingStore is a real log whose Flush (the fsync) waits while stall is
// set: a disk that stalls.
type stallingStore struct {
	Storage
	stall *atomic.Bool
}

func (s stallingStore) Flush() error {
	for s.stall.Load() {
		time.Sleep(time.Millisecond)
	}
	return s.Storage.Flush()
}

// The log writer's queue is bounded and the actor never waits on it (issue
// 15: Receive must not block). With the disk stalled and the queue full,
// produces get THROTTLED at once, reads and retention jobs are answered or
// queued, and once the disk moves the queued appends commit.
func TestStalledDiskDoesNotBlockTheActor(t *testing.T) {
	sys := actor.NewActorSystem()
	var stall atomic.Bool
	reps := spawnGroupWith(t, sys, 1, func(r *replica, cfg *Config) {
		dir := r.dir
		cfg.WriterQueue = 2
		cfg.RetentionAge = time.Hour
		cfg.RetentionCheck = 10 * time.Millisecond
		cfg.Open = func() (Storage, error) {
			l, err := persistence.Open(persistence.Options{Dir: dir, Group: "t-0"})
			if err != nil {
				return nil, err
			}
			return stallingStore{Storage: l, stall: &stall}, nil
		}
	})
	leader := leaderOf(t, reps, map[uint64]bool{1: true})
	in := newInbox(sys)
	produceRetrying(t, sys, leader.pid, in, heraldpb.Acks_ACKS_ALL, "before")

	stall.Store(true)
	t.Cleanup(func() { stall.Store(false) })
	// Produces, one Ready each, and the retention jobs fill the writer's
	// queue of 2 while its fsync waits.
	deadline := time.Now().Add(10 * time.Second)
	for throttled := false; !throttled; {
		if time.Now().After(deadline) {
			t.Fatal("no THROTTLED while the disk stalls with the writer's queue full")
		}
		sys.Root.RequestWithCustomSender(leader.pid, produceFrame("t", heraldpb.Acks_ACKS_ALL, "v"), in.pid)
		select {
		case f := <-in.frames:
			throttled = f.GetError().GetCode() == heraldpb.ErrorCode_THROTTLED
		case <-time.After(5 * time.Millisecond):
		}
	}
	// The actor still answers: a read, while the disk is stalled.
	sys.Root.RequestWithCustomSender(leader.pid, fetchFrame("t", 0, 0), in.pid)
	for f := in.next(t); f.GetFetchResponse() == nil; f = in.next(t) {
	}
	stall.Store(false)
	checkFor(t, 10*time.Second, "the stalled appends to commit", func() bool {
		return leader.stats.HighWatermark.Load() >= 2
	})
}

// recordingStore records the Write calls it gets (the rest of Storage is
// never called here).
type recordingStore struct {
	Storage
	writes []recordedWrite
}

type recordedWrite struct {
	hs      raftpb.HardState
	indexes []uint64
}

func (s *recordingStore) Flush() error { return nil }

func (s *recordingStore) ApplySnapshot(raftpb.Snapshot) error {
	s.writes = append(s.writes, recordedWrite{hs: raftpb.HardState{Term: ^uint64(0)}})
	return nil
}

func (s *recordingStore) Write(hs raftpb.HardState, entries []raftpb.Entry) error {
	w := recordedWrite{hs: hs}
	for _, e := range entries {
		w.indexes = append(w.indexes, e.Index)
	}
	s.writes = append(s.writes, w)
	return nil
}

// The log writer merges a group commit's appends into one Write when
// their entries follow each other and their hard states keep the term and
// vote; a new term or vote, a gap or overlap (raft replacing a suffix),
// and a snapshot start a new Write, so each Write orders a new term or
// vote before its entries as it did alone.
func TestAppendRunMerges(t *testing.T) {
	ents := func(from, to uint64) []raftpb.Entry {
		var out []raftpb.Entry
		for i := from; i <= to; i++ {
			out = append(out, raftpb.Entry{Index: i, Term: 2})
		}
		return out
	}
	msg := func(term, vote, commit uint64, e []raftpb.Entry) raftpb.Message {
		return raftpb.Message{Type: raftpb.MsgStorageAppend, Term: term, Vote: vote, Commit: commit, Entries: e}
	}
	for _, tc := range []struct {
		name string
		msgs []raftpb.Message
		want string
	}{
		{"one leader's appends", []raftpb.Message{msg(2, 1, 4, ents(5, 6)), msg(2, 1, 5, ents(7, 7)), msg(0, 0, 0, ents(8, 9)), msg(2, 1, 7, nil)},
			"[{2 1 7 [5 6 7 8 9]}]"},
		{"a new term", []raftpb.Message{msg(2, 1, 4, ents(5, 6)), msg(3, 0, 4, ents(7, 7))}, "[{2 1 4 [5 6]} {3 0 4 [7]}]"},
		{"a vote", []raftpb.Message{msg(3, 0, 4, nil), msg(3, 2, 4, nil)}, "[{3 0 4 []} {3 2 4 []}]"},
		{"a hard state after entries without one", []raftpb.Message{msg(0, 0, 0, ents(5, 5)), msg(3, 2, 5, ents(6, 6))}, "[{0 0 0 [5]} {3 2 5 [6]}]"},
		{"a suffix replaced", []raftpb.Message{msg(2, 1, 4, ents(5, 8)), msg(2, 1, 4, ents(7, 7))}, "[{2 1 4 [5 6 7 8]} {2 1 4 [7]}]"},
		{"a snapshot", []raftpb.Message{msg(2, 1, 4, ents(5, 5)),
			{Type: raftpb.MsgStorageAppend, Term: 2, Vote: 1, Commit: 9, Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 9, Term: 2}}},
			msg(2, 1, 9, ents(10, 10))}, "[{2 1 4 [5]} snapshot {2 1 9 []} {2 1 9 [10]}]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &recordingStore{}
			w := &logWriter{store: s, send: func(any) {}}
			if w.flush(tc.msgs, false) {
				t.Fatal("the log failed")
			}
			var got []string
			for _, w := range s.writes {
				if w.hs.Term == ^uint64(0) {
					got = append(got, "snapshot")
					continue
				}
				got = append(got, fmt.Sprintf("{%d %d %d %v}", w.hs.Term, w.hs.Vote, w.hs.Commit, w.indexes))
			}
			if s := "[" + strings.Join(got, " ") + "]"; s != tc.want {
				t.Fatalf("writes %s, want %s", s, tc.want)
			}
		})
	}
}

// timingStore records when each Write began (the sync that follows it is
// the writer's next step).
type timingStore struct {
	Storage
	mu     sync.Mutex
	writes []time.Time
}

func (s *timingStore) Flush() error { return nil }

func (s *timingStore) Write(raftpb.HardState, []raftpb.Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes = append(s.writes, time.Now())
	return nil
}

func (s *timingStore) gaps() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []time.Duration
	for i := 1; i < len(s.writes); i++ {
		out = append(out, s.writes[i].Sub(s.writes[i-1]))
	}
	return out
}

// The sync pace (Config.SyncPace): while a writer's syncs carry two or
// more entries on average (concurrent appends), the next sync begins no
// sooner than the pace after the last began; once the syncs carry one
// entry each again (a lone producer), none is held.
func TestSyncPaceHoldsOnlyConcurrentAppends(t *testing.T) {
	const pace = 20 * time.Millisecond
	s := &timingStore{}
	done := make(chan appendDone, 1)
	w := startWriter(s, 1, 8, pace, writerQueueDepth.WithLabelValues("pace-test", "0"), func(m any) { done <- m.(appendDone) })
	t.Cleanup(w.stop)
	next := uint64(1)
	appendOf := func(entries int) {
		t.Helper()
		m := raftpb.Message{Type: raftpb.MsgStorageAppend}
		for range entries {
			m.Entries = append(m.Entries, raftpb.Entry{Index: next, Term: 1})
			next++
		}
		w.submit(m)
		select {
		case d := <-done:
			if d.err != nil || len(d.entries) != entries {
				t.Fatalf("append of %d entries: %d written, err %v", entries, len(d.entries), d.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no report of the append")
		}
	}
	paced := func() float64 { return testutil.ToFloat64(syncsPaced) }

	// One entry a sync: nothing held.
	before := paced()
	for range 20 {
		appendOf(1)
	}
	if got := paced(); got != before {
		t.Fatalf("%v syncs held with one entry a sync", got-before)
	}
	// Three entries a sync: held once the average reaches two (the 7th),
	// each sync from then on at least the pace after the one before. (The
	// last 10 together: a write is timed a moment after its sync's start,
	// a moment a loaded machine may stretch; one pace of slack for it.)
	for range 20 {
		appendOf(3)
	}
	gaps := s.gaps()
	var span time.Duration
	for _, g := range gaps[len(gaps)-10:] {
		span += g
	}
	if span < 9*pace {
		t.Fatalf("the last 10 syncs began %v apart in all, under 10 paces of %v less one (gaps %v)", span, pace, gaps[len(gaps)-10:])
	}
	if got := paced() - before; got < 5 {
		t.Fatalf("%v syncs held with three entries a sync, want the most of the 14 after the 6th", got)
	}
	// Back to one entry a sync: the average falls under two and nothing
	// is held any more.
	for range 10 {
		appendOf(1)
	}
	before = paced()
	for range 10 {
		appendOf(1)
	}
	if got := paced(); got != before {
		t.Fatalf("%v syncs still held after the load fell to one entry a sync", got-before)
	}
}

// What arrives while a sync is held joins it: three appends queued during
// one hold are written and reported together, by one sync.
func TestSyncPaceJoinsWhatArrivesMeanwhile(t *testing.T) {
	s := &timingStore{}
	done := make(chan appendDone, 4)
	w := &logWriter{store: s, gen: 1, pace: time.Second, in: make(chan writerItem, 8), done: make(chan struct{}),
		send: func(m any) { done <- m.(appendDone) }, depth: writerQueueDepth.WithLabelValues("pace-join-test", "0")}
	// As after concurrent syncs of three entries, the last one just now:
	// the next waits out the second.
	w.entries, w.lastSync = 3, time.Now()
	go w.run()
	t.Cleanup(w.stop)
	appendAt := func(i uint64) {
		w.submit(raftpb.Message{Type: raftpb.MsgStorageAppend, Entries: []raftpb.Entry{{Index: i, Term: 1}}})
	}
	// The first, taken by the writer (which then holds it), then two more.
	appendAt(1)
	checkFor(t, 10*time.Second, "the writer to take the first append", func() bool { return len(w.in) == 0 })
	appendAt(2)
	appendAt(3)
	select {
	case d := <-done:
		if d.err != nil || d.n != 3 || len(d.entries) != 3 {
			t.Fatalf("the first report covers %d appends and %d entries (err %v), want the 3 queued during the hold", d.n, len(d.entries), d.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no report")
	}
	if n := len(s.gaps()) + 1; n != 1 {
		t.Fatalf("%d writes, want 1", n)
	}
}
