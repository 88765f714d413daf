package persistence

import (
	"errors"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	heraldpb "github.com/heraldmq/herald/proto"
)

// fillTimed saves n entries of 2 records, entry i appended at i seconds.
func fillTimed(t *testing.T, l *Log, n int) {
	t.Helper()
	g := &gen{term: 1, recLen: 100}
	for i := 1; i <= n; i++ {
		g.nowMs = int64(i) * 1000
		if i == 1 {
			g.term = 1
		} else if i == n/2 {
			g.term = 2
		}
		mustSave(t, l, raftpb.HardState{Term: g.term, Vote: 1, Commit: uint64(i)}, []raftpb.Entry{g.entry(uint64(i), 2)})
	}
}

func TestRetainByAge(t *testing.T) {
	dir := t.TempDir()
	opts, _ := testOptions(t, dir)
	opts.IndexIntervalBytes = 500
	opts.SegmentBytes = 2000
	opts.CacheBytes = 2000
	l := mustOpen(t, opts)
	fillTimed(t, l, 100)
	now := time.UnixMilli(100_000)

	// Entries appended before 100s-30.5s = 69.5s are 1..69.
	removed, err := l.Retain(now, 30500*time.Millisecond, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if removed != 69*2 {
		t.Fatalf("removed %d records, want %d", removed, 69*2)
	}
	if f, _ := mustIndexes(t, l); f != 70 {
		t.Fatalf("first = %d, want 70", f)
	}
	if l.StartOffset() != 138 {
		t.Fatalf("StartOffset = %d", l.StartOffset())
	}
	checkRetained(t, l, 70, 138)

	// upTo bounds it: everything is old, but only entries before 80 go.
	if removed, err = l.Retain(time.UnixMilli(1e9), time.Second, 0, 80); err != nil || removed != 20 {
		t.Fatalf("Retain upTo 80: removed %d, %v", removed, err)
	}
	checkRetained(t, l, 80, 158)
	// Nothing more below upTo.
	if removed, err = l.Retain(time.UnixMilli(1e9), time.Second, 0, 80); err != nil || removed != 0 {
		t.Fatalf("Retain again: removed %d, %v", removed, err)
	}

	before := snapshotIndexes(l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, opts)
	defer l.Close()
	checkRetained(t, l, 80, 158)
	after := snapshotIndexes(l)
	if before.First != after.First || before.Last != after.Last || before.Ix.size != after.Ix.size ||
		before.Ix.startOffset != after.Ix.startOffset || before.Ix.endOffset != after.Ix.endOffset {
		t.Fatalf("reopen after retention differs:\n%+v\n%+v", before, after)
	}
	if got := l.OffsetForTime(0); got != 158 {
		t.Fatalf("OffsetForTime(0) = %d, want StartOffset 158", got)
	}
	if got := l.OffsetForTime(90_000); got != 178 {
		t.Fatalf("OffsetForTime(90s) = %d, want 178", got)
	}
}

func TestRetainByBytes(t *testing.T) {
	opts, _ := testOptions(t, t.TempDir())
	opts.IndexIntervalBytes = 700
	l := mustOpen(t, opts)
	defer l.Close()
	fillTimed(t, l, 100)
	per := l.Size() / 100
	budget := per*30 + per/2 // room for 30 entries
	removed, err := l.Retain(time.UnixMilli(0), 0, budget, 100)
	if err != nil {
		t.Fatal(err)
	}
	if removed != 70*2 || l.Size() > budget {
		t.Fatalf("removed %d records, size %d > %d", removed, l.Size(), budget)
	}
	checkRetained(t, l, 71, 140)
	// upTo wins over bytes.
	if removed, _ := l.Retain(time.UnixMilli(0), 0, 1, 75); removed != 4*2 {
		t.Fatalf("removed %d with upTo 75", removed)
	}
	checkRetained(t, l, 75, 148)
	// Retain everything up to the last entry.
	if _, err := l.Retain(time.UnixMilli(0), 0, 1, 101); err != nil {
		t.Fatal(err)
	}
	if f, la := mustIndexes(t, l); f != 101 || la != 100 || l.Size() != 0 || l.StartOffset() != 200 || l.EndOffset() != 200 {
		t.Fatalf("empty after retention: first %d last %d size %d start %d end %d", f, la, l.Size(), l.StartOffset(), l.EndOffset())
	}
	if term, err := l.Term(100); err != nil || term != 2 {
		t.Fatalf("Term(100) = %d, %v", term, err)
	}
	// Save continues.
	g := &gen{term: 2, next: 200}
	mustSave(t, l, raftpb.HardState{}, g.entries(101, 2, 1))
	checkRetained(t, l, 101, 200)
}

// checkRetained checks FirstIndex, StartOffset, the snapshot and the
// storage contract at the new front.
func checkRetained(t *testing.T, l *Log, first uint64, start int64) {
	t.Helper()
	if f, _ := mustIndexes(t, l); f != first {
		t.Fatalf("first = %d, want %d", f, first)
	}
	if l.StartOffset() != start {
		t.Fatalf("StartOffset = %d, want %d", l.StartOffset(), start)
	}
	if _, err := l.ReadBatches(start-1, 10, l.EndOffset()); start > 0 && !errors.Is(err, ErrOffsetOutOfRange) {
		t.Fatalf("read below start: %v", err)
	}
	if start < l.EndOffset() {
		bs, err := l.ReadBatches(start, 10, l.EndOffset())
		if err != nil || len(bs) == 0 || bs[0].BaseOffset != start {
			t.Fatalf("read at start: %v %v", bs, err)
		}
	}
	if _, err := l.Entries(first-1, first, 100); !errors.Is(err, raft.ErrCompacted) {
		t.Fatalf("Entries below first: %v", err)
	}
	if _, err := l.Term(first - 2); first >= 2 && !errors.Is(err, raft.ErrCompacted) {
		t.Fatalf("Term below snapshot: %v", err)
	}
	snap, err := l.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	term, err := l.Term(first - 1)
	if err != nil || snap.Metadata.Index != first-1 || snap.Metadata.Term != term {
		t.Fatalf("snapshot %v, Term(%d) = %d, %v", snap.Metadata, first-1, term, err)
	}
	var sd heraldpb.SnapshotData
	if err := proto.Unmarshal(snap.Data, &sd); err != nil || sd.NextOffset != start {
		t.Fatalf("snapshot data %v, %v", &sd, err)
	}
	hs, _, _ := l.InitialState()
	if hs.Commit < first-1 {
		t.Fatalf("commit %d below snapshot %d", hs.Commit, first-1)
	}
	checkInvariants(t, l)
}

func TestApplySnapshot(t *testing.T) {
	dir := t.TempDir()
	opts, _ := testOptions(t, dir)
	l := mustOpen(t, opts)
	g := &gen{term: 1}
	mustSave(t, l, raftpb.HardState{Term: 1, Vote: 1, Commit: 3}, g.entries(1, 5, 1))
	data, _ := proto.Marshal(&heraldpb.SnapshotData{NextOffset: 5000})
	snap := raftpb.Snapshot{Data: data, Metadata: raftpb.SnapshotMetadata{Index: 1000, Term: 7, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}
	if err := l.ApplySnapshot(snap); err != nil {
		t.Fatal(err)
	}
	if err := l.ApplySnapshot(snap); !errors.Is(err, raft.ErrSnapOutOfDate) {
		t.Fatalf("stale snapshot: %v", err)
	}
	check := func() {
		t.Helper()
		if f, la := mustIndexes(t, l); f != 1001 || la != 1000 {
			t.Fatalf("first, last = %d, %d", f, la)
		}
		if l.StartOffset() != 5000 || l.EndOffset() != 5000 {
			t.Fatalf("offsets %d %d", l.StartOffset(), l.EndOffset())
		}
		if term, _ := l.Term(1000); term != 7 {
			t.Fatalf("Term(1000) = %d", term)
		}
		hs, cs, _ := l.InitialState()
		if hs.Commit != 1000 || hs.Term != 7 || len(cs.Voters) != 3 {
			t.Fatalf("state %v %v", hs, cs)
		}
	}
	check()
	l.Close()
	l = mustOpen(t, opts)
	check()
	g2 := &gen{term: 7, next: 5000}
	mustSave(t, l, raftpb.HardState{Term: 7, Vote: 2, Commit: 1001}, g2.entries(1001, 3, 2))
	if bs := mustRead(t, l, 5000, 1<<20, 5006); len(bs) != 3 {
		t.Fatalf("batches after snapshot %v", bs)
	}
	l.Close()

	// An install interrupted after the state file was written is finished
	// by Open.
	l = mustOpen(t, opts)
	st := l.currentState()
	st.snapIndex, st.snapTerm, st.snapOffset, st.resetting = 2000, 8, 9000, true
	if err := l.writeState(st); err != nil {
		t.Fatal(err)
	}
	l.Close() // Close rewrites state from memory; write the crash state after.
	l2 := &Log{opts: opts, fs: OSFS, statePath: l.statePath, log: l.log}
	if err := l2.writeState(st); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, opts)
	defer l.Close()
	if f, la := mustIndexes(t, l); f != 2001 || la != 2000 || l.StartOffset() != 9000 {
		t.Fatalf("after interrupted install: %d %d %d", f, la, l.StartOffset())
	}
}

func TestInterruptedRetentionIsFinished(t *testing.T) {
	dir := t.TempDir()
	opts, _ := testOptions(t, dir)
	l := mustOpen(t, opts)
	fillTimed(t, l, 20)
	st := l.currentState()
	st.snapIndex, st.snapTerm, st.snapOffset = 9, l.ix.term(9), 18
	l.Close()
	// The state file says 10 is first, as Retain writes it before it
	// truncates the WAL; the crash came before the truncation.
	l2 := &Log{opts: opts, fs: OSFS, statePath: l.statePath, log: l.log}
	if err := l2.writeState(st); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, opts)
	defer l.Close()
	checkRetained(t, l, 10, 18)
}

func TestDeleteBefore(t *testing.T) {
	opts, _ := testOptions(t, t.TempDir())
	l := mustOpen(t, opts)
	defer func() { l.Close() }()
	fillTimed(t, l, 20) // entry i holds offsets 2(i-1), 2(i-1)+1
	// Offset 7 is in entry 4 (offsets 6, 7): entries 1-3 go.
	if removed, err := l.DeleteBefore(7, 21); err != nil || removed != 6 {
		t.Fatalf("DeleteBefore(7) removed %d, %v", removed, err)
	}
	checkRetained(t, l, 4, 6)
	// upTo wins.
	if removed, _ := l.DeleteBefore(30, 6); removed != 4 {
		t.Fatalf("removed %d with upTo 6", removed)
	}
	checkRetained(t, l, 6, 10)
	if removed, _ := l.DeleteBefore(5, 21); removed != 0 {
		t.Fatalf("DeleteBefore below the start removed %d", removed)
	}
	// It survives a reopen.
	l.Close()
	l = mustOpen(t, opts)
	checkRetained(t, l, 6, 10)
}
