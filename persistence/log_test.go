package persistence

import (
	"errors"
	"reflect"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	heraldpb "github.com/heraldmq/herald/proto"
)

func TestFreshLog(t *testing.T) {
	opts, _ := testOptions(t, t.TempDir())
	l := mustOpen(t, opts)
	defer l.Close()
	if f, la := mustIndexes(t, l); f != 1 || la != 0 {
		t.Fatalf("first, last = %d, %d; want 1, 0", f, la)
	}
	if term, err := l.Term(0); err != nil || term != 0 {
		t.Fatalf("Term(0) = %d, %v", term, err)
	}
	if _, err := l.Term(1); !errors.Is(err, raft.ErrUnavailable) {
		t.Fatalf("Term(1) err = %v, want ErrUnavailable", err)
	}
	hs, cs, err := l.InitialState()
	if err != nil || !raft.IsEmptyHardState(hs) || len(cs.Voters) != 0 {
		t.Fatalf("InitialState = %v %v %v", hs, cs, err)
	}
	if l.StartOffset() != 0 || l.EndOffset() != 0 || l.Size() != 0 {
		t.Fatalf("offsets %d %d size %d", l.StartOffset(), l.EndOffset(), l.Size())
	}
	if got := l.OffsetForTime(0); got != 0 {
		t.Fatalf("OffsetForTime = %d", got)
	}
	if b, err := l.ReadBatches(0, 100, 0); err != nil || len(b) != 0 {
		t.Fatalf("ReadBatches = %v, %v", b, err)
	}
}

func TestSaveReadRoundTripAndStorageContract(t *testing.T) {
	opts, _ := testOptions(t, t.TempDir())
	opts.IndexIntervalBytes = 256 // many index points
	opts.CacheBytes = 1024        // force WAL reads
	l := mustOpen(t, opts)
	defer l.Close()
	g := &gen{term: 1, nowMs: 1000, recLen: 100}

	// An empty leader entry, a conf change, then batches of 3 records.
	cc := raftpb.ConfChange{Type: raftpb.ConfChangeAddNode, NodeID: 1}
	ccData, _ := cc.Marshal()
	ents := []raftpb.Entry{
		{Index: 1, Term: 1},
		{Index: 2, Term: 1, Type: raftpb.EntryConfChange, Data: ccData},
	}
	mustSave(t, l, raftpb.HardState{Term: 1, Vote: 1, Commit: 0}, ents)
	for i := uint64(3); i <= 100; i += 7 {
		g.nowMs += 10
		mustSave(t, l, raftpb.HardState{Term: 1, Vote: 1, Commit: i - 1}, g.entries(i, 7, 3))
	}
	if f, la := mustIndexes(t, l); f != 1 || la != 100 {
		t.Fatalf("first, last = %d, %d", f, la)
	}
	if l.EndOffset() != 98*3 {
		t.Fatalf("EndOffset = %d, want %d", l.EndOffset(), 98*3)
	}
	// Entries with maxSize.
	all, err := l.Entries(1, 101, 1<<30)
	if err != nil || len(all) != 100 {
		t.Fatalf("Entries all: %d, %v", len(all), err)
	}
	for i, e := range all {
		if e.Index != uint64(i+1) {
			t.Fatalf("entry %d has index %d", i, e.Index)
		}
	}
	one, err := l.Entries(10, 20, 0)
	if err != nil || len(one) != 1 || one[0].Index != 10 {
		t.Fatalf("Entries maxSize 0 = %v, %v", len(one), err)
	}
	sz := uint64(all[9].Size() + all[10].Size() + all[11].Size())
	three, err := l.Entries(10, 20, sz)
	if err != nil || len(three) != 3 {
		t.Fatalf("Entries maxSize=3 entries: %d, %v", len(three), err)
	}
	if _, err := l.Entries(0, 5, 100); !errors.Is(err, raft.ErrCompacted) {
		t.Fatalf("Entries(0) err = %v", err)
	}
	if _, err := l.Entries(95, 102, 100); !errors.Is(err, raft.ErrUnavailable) {
		t.Fatalf("Entries past last err = %v", err)
	}
	if term, err := l.Term(100); err != nil || term != 1 {
		t.Fatalf("Term(100) = %d, %v", term, err)
	}
	if !reflect.DeepEqual(all[1].Data, ccData) || all[1].Type != raftpb.EntryConfChange {
		t.Fatalf("conf change entry changed: %v", all[1])
	}

	// ReadBatches from every offset.
	for off := int64(0); off < l.EndOffset(); off++ {
		bs, err := l.ReadBatches(off, 1, l.EndOffset())
		if err != nil || len(bs) != 1 {
			t.Fatalf("ReadBatches(%d) = %d batches, %v", off, len(bs), err)
		}
		if b := bs[0]; off < b.BaseOffset || off >= b.BaseOffset+int64(b.Count) {
			t.Fatalf("ReadBatches(%d) returned batch [%d,+%d)", off, b.BaseOffset, b.Count)
		}
	}
	checkInvariants(t, l)
}

func TestReadBatchesLimitAndMaxBytes(t *testing.T) {
	opts, _ := testOptions(t, t.TempDir())
	opts.IndexIntervalBytes = 300
	l := mustOpen(t, opts)
	defer l.Close()
	g := &gen{term: 1, recLen: 100}
	mustSave(t, l, raftpb.HardState{Term: 1, Commit: 10}, g.entries(1, 10, 5)) // offsets 0..49

	// limit below the end: batches fully under limit only.
	bs, err := l.ReadBatches(0, 1<<20, 23)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 4 || bs[3].BaseOffset != 15 {
		t.Fatalf("limit 23: got %d batches", len(bs))
	}
	// limit on a boundary.
	if bs, _ = l.ReadBatches(12, 1<<20, 25); len(bs) != 3 || bs[0].BaseOffset != 10 || bs[2].BaseOffset != 20 {
		t.Fatalf("limit 25 from 12: %v", bs)
	}
	// the only batch crosses limit: nothing.
	if bs, err = l.ReadBatches(21, 1<<20, 23); err != nil || len(bs) != 0 {
		t.Fatalf("crossing batch: %v %v", bs, err)
	}
	// maxBytes: at least one even if larger, stop once reached.
	recLen := len(bs)
	_ = recLen
	if bs, _ = l.ReadBatches(0, 1, 50); len(bs) != 1 {
		t.Fatalf("maxBytes 1: %d batches", len(bs))
	}
	one := len(mustRead(t, l, 0, 1, 50)[0].Records)
	if bs = mustRead(t, l, 0, 2*one, 50); len(bs) != 2 {
		t.Fatalf("maxBytes 2 batches: %d", len(bs))
	}
	if bs = mustRead(t, l, 0, 2*one+1, 50); len(bs) != 3 {
		t.Fatalf("maxBytes 2 batches + 1: %d", len(bs))
	}
	// out of range.
	if _, err := l.ReadBatches(-1, 10, 50); !errors.Is(err, ErrOffsetOutOfRange) {
		t.Fatalf("offset -1: %v", err)
	}
	if _, err := l.ReadBatches(30, 10, 29); !errors.Is(err, ErrOffsetOutOfRange) {
		t.Fatalf("offset above limit: %v", err)
	}
	// offset == limit and offsets beyond EndOffset but within limit: empty.
	if bs, err = l.ReadBatches(50, 10, 50); err != nil || len(bs) != 0 {
		t.Fatalf("at end: %v %v", bs, err)
	}
	if bs, err = l.ReadBatches(55, 10, 60); err != nil || len(bs) != 0 {
		t.Fatalf("beyond end within limit: %v %v", bs, err)
	}
	// Records are the producer's bytes.
	bs = mustRead(t, l, 45, 10, 50)
	var le heraldpb.LogEntry
	ents, _ := l.Entries(10, 11, 1<<20)
	if err := proto.Unmarshal(ents[0].Data, &le); err != nil || string(le.Records) != string(bs[0].Records) || bs[0].Count != 5 {
		t.Fatalf("records differ")
	}
}

func mustRead(t *testing.T, l *Log, off int64, maxBytes int, limit int64) []*heraldpb.StoredBatch {
	t.Helper()
	bs, err := l.ReadBatches(off, maxBytes, limit)
	if err != nil {
		t.Fatalf("ReadBatches(%d): %v", off, err)
	}
	return bs
}

func TestSuffixTruncation(t *testing.T) {
	opts, _ := testOptions(t, t.TempDir())
	opts.IndexIntervalBytes = 200
	opts.CacheBytes = -1 // every read from the WAL
	l := mustOpen(t, opts)
	g := &gen{term: 1, recLen: 50}
	mustSave(t, l, raftpb.HardState{Term: 1, Vote: 1}, g.entries(1, 20, 2)) // offsets 0..39
	// A new leader in term 2 replaces entries 12.. with its own.
	g2 := &gen{term: 2, next: 22, recLen: 70}
	repl := g2.entries(12, 3, 4) // offsets 22..33
	mustSave(t, l, raftpb.HardState{Term: 2, Vote: 2}, repl)
	if _, la := mustIndexes(t, l); la != 14 {
		t.Fatalf("last = %d, want 14", la)
	}
	if l.EndOffset() != 34 {
		t.Fatalf("EndOffset = %d, want 34", l.EndOffset())
	}
	for i, want := range map[uint64]uint64{11: 1, 12: 2, 14: 2} {
		if term, err := l.Term(i); err != nil || term != want {
			t.Fatalf("Term(%d) = %d, %v; want %d", i, term, err, want)
		}
	}
	if _, err := l.Term(15); !errors.Is(err, raft.ErrUnavailable) {
		t.Fatalf("Term(15): %v", err)
	}
	bs := mustRead(t, l, 22, 1<<20, 34)
	if len(bs) != 3 || bs[0].BaseOffset != 22 || bs[2].BaseOffset != 30 {
		t.Fatalf("batches after truncation: %v", bs)
	}
	checkInvariants(t, l)
	// Truncate to nothing after the first entry and keep going.
	g3 := &gen{term: 3, next: 2, recLen: 10}
	mustSave(t, l, raftpb.HardState{Term: 3, Vote: 3}, g3.entries(2, 5, 1))
	if l.EndOffset() != 7 {
		t.Fatalf("EndOffset = %d", l.EndOffset())
	}
	checkInvariants(t, l)
	before := snapshotIndexes(l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, opts)
	defer l.Close()
	if after := snapshotIndexes(l); !reflect.DeepEqual(before, after) {
		t.Fatalf("indexes after reopen differ:\n%+v\n%+v", before, after)
	}
	hs, _, _ := l.InitialState()
	if hs.Term != 3 || hs.Vote != 3 {
		t.Fatalf("hard state %v", hs)
	}
}

func TestSaveRejectsBadEntries(t *testing.T) {
	opts, _ := testOptions(t, t.TempDir())
	l := mustOpen(t, opts)
	defer l.Close()
	g := &gen{term: 1}
	mustSave(t, l, raftpb.HardState{}, g.entries(1, 3, 1))
	for name, ents := range map[string][]raftpb.Entry{
		"gap":          {{Index: 5, Term: 1}},
		"not adjacent": {{Index: 4, Term: 1}, {Index: 6, Term: 1}},
		"bad data":     {{Index: 4, Term: 1, Data: []byte{0xff, 0xff}}},
		"zero index":   {{Index: 0, Term: 1}},
	} {
		if err := l.Save(raftpb.HardState{}, ents); !errors.Is(err, ErrBadEntry) {
			t.Errorf("%s: err = %v, want ErrBadEntry", name, err)
		}
	}
	// The log is not failed.
	mustSave(t, l, raftpb.HardState{}, g.entries(4, 1, 1))
}

func TestOffsetForTime(t *testing.T) {
	opts, _ := testOptions(t, t.TempDir())
	opts.IndexIntervalBytes = 150
	l := mustOpen(t, opts)
	defer l.Close()
	g := &gen{term: 1, recLen: 40}
	for i := uint64(1); i <= 30; i++ {
		g.nowMs = int64(i) * 100
		mustSave(t, l, raftpb.HardState{}, []raftpb.Entry{g.entry(i, 2)})
	}
	cases := map[int64]int64{0: 0, 100: 0, 101: 2, 200: 2, 1550: 30, 3000: 58, 3001: 60}
	for ts, want := range cases {
		if got := l.OffsetForTime(ts); got != want {
			t.Errorf("OffsetForTime(%d) = %d, want %d", ts, got, want)
		}
	}
}

func TestReopenRestoresEverything(t *testing.T) {
	dir := t.TempDir()
	opts, _ := testOptions(t, dir)
	opts.IndexIntervalBytes = 500
	opts.SegmentBytes = 4096 // many segments
	l := mustOpen(t, opts)
	g := &gen{term: 2, recLen: 200, nowMs: 5}
	for i := uint64(1); i <= 200; i += 10 {
		g.nowMs += 7
		mustSave(t, l, raftpb.HardState{Term: 2, Vote: 3, Commit: i + 5}, g.entries(i, 10, 3))
	}
	cs := raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	if err := l.SetConfState(200, cs); err != nil {
		t.Fatal(err)
	}
	before := snapshotIndexes(l)
	ents, _ := l.Entries(1, 201, 1<<30)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := l.LastIndex(); !errors.Is(err, ErrClosed) {
		t.Fatalf("LastIndex after Close: %v", err)
	}
	if err := l.Save(raftpb.HardState{}, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Save after Close: %v", err)
	}

	l = mustOpen(t, opts)
	defer l.Close()
	if after := snapshotIndexes(l); !reflect.DeepEqual(before, after) {
		t.Fatalf("indexes after reopen differ:\n%+v\n%+v", before, after)
	}
	hs, gotCS, _ := l.InitialState()
	if hs.Term != 2 || hs.Vote != 3 || hs.Commit != 196 {
		t.Fatalf("hard state %v", hs)
	}
	if !reflect.DeepEqual(gotCS.Voters, cs.Voters) {
		t.Fatalf("conf state %v", gotCS)
	}
	ents2, err := l.Entries(1, 201, 1<<30)
	if err != nil || !reflect.DeepEqual(ents, ents2) {
		t.Fatalf("entries differ after reopen: %v", err)
	}
	checkInvariants(t, l)
	// Save continues.
	mustSave(t, l, raftpb.HardState{Term: 2, Vote: 3, Commit: 200}, g.entries(201, 1, 1))
}

func TestInitialStateClampsCommit(t *testing.T) {
	opts, _ := testOptions(t, t.TempDir())
	l := mustOpen(t, opts)
	g := &gen{term: 1}
	mustSave(t, l, raftpb.HardState{Term: 1, Vote: 1}, g.entries(1, 5, 1))
	// Commit beyond LastIndex can only come from a lost tail; fake it.
	l.hs.Commit = 50
	hs, _, _ := l.InitialState()
	if hs.Commit != 5 {
		t.Fatalf("Commit = %d, want 5", hs.Commit)
	}
	l.Close()
}

// indexSnapshot is the observable index state of a log, for comparisons.
type indexSnapshot struct {
	First, Last uint64
	Ix          indexes
}

func snapshotIndexes(l *Log) indexSnapshot {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return indexSnapshot{First: l.first, Last: l.last, Ix: l.ix.clone()}
}

// checkInvariants rebuilds the indexes from the entries and compares the
// answers (not the interval boundaries) with the log's.
func checkInvariants(t *testing.T, l *Log) {
	t.Helper()
	first, last := mustIndexes(t, l)
	var size int64
	off := l.StartOffset()
	for i := first; i <= last; i++ {
		l.mu.RLock()
		ce, err := l.readEntry(i)
		l.mu.RUnlock()
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		size += ce.m.size
		if term, _ := l.Term(i); term != ce.e.Term {
			t.Fatalf("Term(%d) = %d, entry says %d", i, term, ce.e.Term)
		}
		if ce.m.hasRecords && ce.m.end() > l.StartOffset() {
			// (entries wholly below the start offset may stay after a
			// truncation inside a transaction's span)
			if ce.m.base != off {
				t.Fatalf("entry %d base %d, want %d", i, ce.m.base, off)
			}
			off = ce.m.end()
			for _, r := range ce.m.refs {
				if r < first || r >= i {
					t.Fatalf("commit marker %d at offsets from %d names entry %d, outside [%d, %d)", i, ce.m.base, r, first, i)
				}
			}
		}
	}
	if off != l.EndOffset() {
		t.Fatalf("EndOffset = %d, entries end at %d", l.EndOffset(), off)
	}
	if size != l.Size() {
		t.Fatalf("Size = %d, entries total %d", l.Size(), size)
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	for k, p := range l.ix.points {
		if p.idx < first || p.idx > last {
			t.Fatalf("point %d idx %d outside [%d,%d]", k, p.idx, first, last)
		}
		if k > 0 && p.idx <= l.ix.points[k-1].idx {
			t.Fatalf("points not increasing at %d", k)
		}
	}
	if len(l.ix.points) > 0 && l.ix.points[0].idx != first {
		t.Fatalf("first point %d != first index %d", l.ix.points[0].idx, first)
	}
}
