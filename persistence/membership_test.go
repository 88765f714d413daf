package persistence

import (
	"slices"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

func voters(ids ...uint64) raftpb.ConfState { return raftpb.ConfState{Voters: ids} }

// logOfEntries opens a new log holding entries 1 to n of term 2, all
// committed, three records each.
func logOfEntries(t *testing.T, n uint64) (*Log, Options) {
	t.Helper()
	opts, _ := testOptions(t, t.TempDir())
	l := mustOpen(t, opts)
	g := &gen{term: 2, recLen: 50, nowMs: 5}
	mustSave(t, l, raftpb.HardState{Term: 2, Vote: 1, Commit: n}, g.entries(1, int(n), 3))
	return l, opts
}

// snapshotVoters returns the voters a raft snapshot of l would carry, and
// its index.
func snapshotVoters(t *testing.T, l *Log) ([]uint64, uint64) {
	t.Helper()
	snap, err := l.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return snap.Metadata.ConfState.Voters, snap.Metadata.Index
}

// TestSnapshotCarriesMembershipAsOfItsIndex: after truncating the front, a
// snapshot carries the membership as of its own index, not the one last
// applied (a replica restoring it replays the changes logged after it),
// across a reopen too.
func TestSnapshotCarriesMembershipAsOfItsIndex(t *testing.T) {
	dir := t.TempDir()
	opts, _ := testOptions(t, dir)
	l := mustOpen(t, opts)
	g := &gen{term: 2, recLen: 50, nowMs: 5}
	mustSave(t, l, raftpb.HardState{Term: 2, Vote: 1, Commit: 100}, g.entries(1, 100, 3))
	for _, c := range []struct {
		index uint64
		cs    raftpb.ConfState
	}{{1, voters(1)}, {50, voters(1, 2, 3)}, {90, voters(1, 2, 4)}} {
		if err := l.SetConfState(c.index, c.cs); err != nil {
			t.Fatal(err)
		}
	}
	// Entry i holds offsets [3(i-1), 3i): before 3*59 leaves index 60 first.
	if _, err := l.DeleteBefore(3*59, 100); err != nil {
		t.Fatal(err)
	}
	if v, idx := snapshotVoters(t, l); idx != 59 || !slices.Equal(v, []uint64{1, 2, 3}) {
		t.Fatalf("snapshot at %d carries %v, want 59 and [1 2 3]", idx, v)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, opts)
	if v, idx := snapshotVoters(t, l); idx != 59 || !slices.Equal(v, []uint64{1, 2, 3}) {
		t.Fatalf("after a reopen the snapshot at %d carries %v, want 59 and [1 2 3]", idx, v)
	}
	if _, cs, _ := l.InitialState(); !slices.Equal(cs.Voters, []uint64{1, 2, 4}) {
		t.Fatalf("initial state %v, want the latest membership [1 2 4]", cs.Voters)
	}
	if _, err := l.DeleteBefore(3*95, 100); err != nil {
		t.Fatal(err)
	}
	if v, idx := snapshotVoters(t, l); idx != 95 || !slices.Equal(v, []uint64{1, 2, 4}) {
		t.Fatalf("snapshot at %d carries %v, want 95 and [1 2 4]", idx, v)
	}
	l.Close()
}

// TestForgottenMembershipSpanIsNotTruncated: past maxConfHistory changes
// since the snapshot point, the oldest are forgotten, and the log is not
// truncated inside the span whose membership is no longer known; past it,
// the snapshot is exact again.
func TestForgottenMembershipSpanIsNotTruncated(t *testing.T) {
	l, _ := logOfEntries(t, 200)
	defer l.Close()
	// Changes at 2, 4, ..., 2*(maxConfHistory+2): the first two are forgotten.
	n := maxConfHistory + 2
	for k := 1; k <= n; k++ {
		if err := l.SetConfState(uint64(2*k), voters(uint64(k))); err != nil {
			t.Fatal(err)
		}
	}
	// The membership at 2..5 is no longer known (the changes at 2 and 4
	// are gone; the one at 6 is kept): truncating to index 5 is refused.
	if removed, err := l.DeleteBefore(3*5, 200); err != nil || removed != 0 {
		t.Fatalf("truncation inside the forgotten span: %d records removed, %v", removed, err)
	}
	// Before the span the membership is the snapshot point's (none here).
	if removed, err := l.DeleteBefore(3*1, 200); err != nil || removed != 3 {
		t.Fatalf("truncation before the span: %d records removed, %v", removed, err)
	}
	if v, idx := snapshotVoters(t, l); idx != 1 || len(v) != 0 {
		t.Fatalf("snapshot at %d carries %v, want 1 and none", idx, v)
	}
	// Past it, exact: index 7 is after the change at 6 (voter 3).
	if removed, err := l.DeleteBefore(3*7, 200); err != nil || removed != 18 {
		t.Fatalf("truncation past the span: %d records removed, %v", removed, err)
	}
	if v, idx := snapshotVoters(t, l); idx != 7 || !slices.Equal(v, []uint64{3}) {
		t.Fatalf("snapshot at %d carries %v, want 7 and [3]", idx, v)
	}
}

// TestSnapshotNamesReplicasAddedAfterIt: a replica added after the
// snapshot point (the one that needs the snapshot) is in the snapshot's
// membership as a learner, or raft would not install it there.
func TestSnapshotNamesReplicasAddedAfterIt(t *testing.T) {
	l, _ := logOfEntries(t, 100)
	defer l.Close()
	steps := []struct {
		index uint64
		cs    raftpb.ConfState
	}{
		{1, voters(1, 2, 3)},
		{70, raftpb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}}},
		{80, raftpb.ConfState{Voters: []uint64{1, 2, 4}, VotersOutgoing: []uint64{1, 2, 3}, AutoLeave: true}},
		{81, voters(1, 2, 4)},
	}
	for _, c := range steps {
		if err := l.SetConfState(c.index, c.cs); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.DeleteBefore(3*59, 100); err != nil {
		t.Fatal(err)
	}
	snap, err := l.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	cs := snap.Metadata.ConfState
	if !slices.Equal(cs.Voters, []uint64{1, 2, 3}) || !slices.Equal(cs.Learners, []uint64{4}) || len(cs.VotersOutgoing) != 0 {
		t.Fatalf("snapshot at %d carries %v, want voters [1 2 3] (as of its index) and learner 4 (added after it)", snap.Metadata.Index, cs.String())
	}
}

// TestLargeMembershipHistoryFitsTheSlot: memberships of many long raft ids
// (replication factor 20, ids of 8 bytes) fill the 4 KiB state slot before
// maxConfHistory changes: the oldest are forgotten instead, every change
// is stored, and the latest membership survives a reopen.
func TestLargeMembershipHistoryFitsTheSlot(t *testing.T) {
	l, opts := logOfEntries(t, 200)
	big := func(k int) raftpb.ConfState {
		var cs raftpb.ConfState
		for n := 0; n < 20; n++ {
			cs.Voters = append(cs.Voters, uint64(k+n+1)|uint64(1<<30+k)<<32)
		}
		return cs
	}
	for k := 1; k <= maxConfHistory; k++ {
		if err := l.SetConfState(uint64(2*k), big(k)); err != nil {
			t.Fatalf("change %d: %v", k, err)
		}
	}
	l.mu.RLock()
	kept := len(l.snap.confs)
	l.mu.RUnlock()
	if kept >= maxConfHistory || kept < 1 {
		t.Fatalf("kept %d changes; the slot cannot hold %d of these", kept, maxConfHistory)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, opts)
	defer l.Close()
	if _, cs, _ := l.InitialState(); !slices.Equal(cs.Voters, big(maxConfHistory).Voters) {
		t.Fatalf("after a reopen the membership is %v", cs.Voters)
	}
}

// TestSnapshotNamesAReplicaAddedButNotSaved: raft tracks a replica from
// the moment its addition is applied, and may ask for a snapshot for it
// before the log writer saved the change. The snapshot names it from the
// note on (TestControllerCheckpoints once saw node 4 refuse a snapshot
// "not in the ConfState" and never join); a note the save or an installed
// snapshot covers is dropped.
func TestSnapshotNamesAReplicaAddedButNotSaved(t *testing.T) {
	l, _ := logOfEntries(t, 100)
	defer l.Close()
	if err := l.SetConfState(1, voters(1, 2, 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := l.DeleteBefore(3*59, 100); err != nil {
		t.Fatal(err)
	}
	learners := func() []uint64 {
		t.Helper()
		snap, err := l.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		return snap.Metadata.ConfState.Learners
	}
	if got := learners(); len(got) != 0 {
		t.Fatalf("learners %v before any addition", got)
	}
	added := raftpb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}}
	l.NoteConfState(90, added)
	if got := learners(); !slices.Equal(got, []uint64{4}) {
		t.Fatalf("learners %v after the addition was applied, unsaved; want [4]", got)
	}
	if err := l.SetConfState(90, added); err != nil {
		t.Fatal(err)
	}
	if l.noted.index != 0 {
		t.Fatalf("the note at %d outlived the save", l.noted.index)
	}
	if got := learners(); !slices.Equal(got, []uint64{4}) {
		t.Fatalf("learners %v after the save; want [4]", got)
	}
	// A note older than the snapshot point is ignored.
	l.NoteConfState(10, raftpb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{9}})
	if got := learners(); !slices.Equal(got, []uint64{4}) {
		t.Fatalf("learners %v after a note below the snapshot point; want [4]", got)
	}
}
