package persistence

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/heraldmq/herald/persistence/errorfs"
)

// damageLog writes n entries of 2 records each into a log of small segments
// and closes it. It returns the entries and the segment files.
func damageLog(t *testing.T, dir string, n int) ([]raftpb.Entry, []segFile) {
	t.Helper()
	opts, _ := testOptions(t, dir)
	opts.SegmentBytes = 2048
	l := mustOpen(t, opts)
	g := &gen{term: 1, recLen: 200}
	ents := g.entries(1, n, 2)
	mustSave(t, l, raftpb.HardState{Term: 1, Vote: 1, Commit: uint64(n)}, ents)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l.walDir = filepath.Join(dir, "wal")
	l.fs = OSFS
	segs, err := l.segmentFiles()
	if err != nil || len(segs) < 5 {
		t.Fatalf("want at least 5 segments, got %d (%v)", len(segs), err)
	}
	if fi, err := os.Stat(segs[len(segs)-1].path); err != nil || fi.Size() == 0 {
		// The tests want a last segment with entries: the writes filled
		// the previous one exactly.
		t.Fatalf("the last segment is empty: choose another n than %d", n)
	}
	return ents, segs
}

func rewrite(t *testing.T, path string, f func(b []byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, f(b), 0o640); err != nil {
		t.Fatal(err)
	}
}

// middleEntry is the byte position of the entry in the middle of a segment.
func middleEntry(t *testing.T, path string) int {
	starts, _ := entryStarts(t, path)
	return starts[len(starts)/2]
}

// The damage matrix of issue 14: each kind of mid-log damage keeps every
// entry before it, is recorded with the offsets lost, quarantines the
// damaged files, refuses nothing it should keep, and never lets an offset be
// used twice. The last case, damage at the very end of the log, is a torn
// tail and is cut without a record.
func TestDamageMatrix(t *testing.T) {
	const n = 66
	type damageCase struct {
		name string
		// damage changes the files and returns the first index that the
		// log may no longer hold (everything before it must be kept).
		damage func(t *testing.T, segs []segFile) uint64
		torn   bool
	}
	flipMiddle := func(seg func(segs []segFile) int) func(t *testing.T, segs []segFile) uint64 {
		return func(t *testing.T, segs []segFile) uint64 {
			k := seg(segs)
			starts, _ := entryStarts(t, segs[k].path)
			m := len(starts) / 2
			rewrite(t, segs[k].path, func(b []byte) []byte { b[starts[m]+20] ^= 0x10; return b })
			return segs[k].first + uint64(m)
		}
	}
	cases := []damageCase{
		{name: "flip in the first segment", damage: flipMiddle(func([]segFile) int { return 0 })},
		{name: "flip in a middle segment", damage: flipMiddle(func(s []segFile) int { return len(s) / 2 })},
		{name: "flip in the middle of the last segment", damage: flipMiddle(func(s []segFile) int { return len(s) - 1 })},
		{name: "corrupted length prefix in a middle segment", damage: func(t *testing.T, segs []segFile) uint64 {
			k := len(segs) / 2
			starts, _ := entryStarts(t, segs[k].path)
			m := len(starts) / 2
			rewrite(t, segs[k].path, func(b []byte) []byte { b[starts[m]] = 0xff; b[starts[m]+1] = 0x7f; return b })
			return segs[k].first + uint64(m)
		}},
		{name: "corrupted length prefix in the last segment", damage: func(t *testing.T, segs []segFile) uint64 {
			k := len(segs) - 1
			starts, _ := entryStarts(t, segs[k].path)
			if len(starts) < 3 {
				t.Skip("last segment too short")
			}
			rewrite(t, segs[k].path, func(b []byte) []byte { b[starts[1]] = 0xff; b[starts[1]+1] = 0x7f; return b })
			return segs[k].first + 1
		}},
		{name: "truncated middle segment", damage: func(t *testing.T, segs []segFile) uint64 {
			k := len(segs) / 2
			at := middleEntry(t, segs[k].path)
			truncate(t, segs[k].path, int64(at))
			starts, _ := entryStarts(t, segs[k].path)
			return segs[k].first + uint64(len(starts))
		}},
		{name: "deleted middle segment", damage: func(t *testing.T, segs []segFile) uint64 {
			k := len(segs) / 2
			if err := os.Remove(segs[k].path); err != nil {
				t.Fatal(err)
			}
			return segs[k].first
		}},
		{name: "zeroed page", damage: func(t *testing.T, segs []segFile) uint64 {
			k := len(segs) / 2
			at := middleEntry(t, segs[k].path)
			starts, _ := entryStarts(t, segs[k].path)
			m := len(starts) / 2
			rewrite(t, segs[k].path, func(b []byte) []byte {
				clear(b[at+7 : min(len(b), at+7+512)])
				return b
			})
			return segs[k].first + uint64(m)
		}},
		{name: "flip in the last entry (a torn tail)", torn: true, damage: func(t *testing.T, segs []segFile) uint64 {
			k := len(segs) - 1
			rewrite(t, segs[k].path, func(b []byte) []byte { b[len(b)-3] ^= 0x01; return b })
			return n
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ents, segs := damageLog(t, dir, n)
			keepBefore := tc.damage(t, segs)

			opts, sink := testOptions(t, dir)
			opts.SegmentBytes = 2048
			l := mustOpen(t, opts)
			_, last := mustIndexes(t, l)
			if last+1 < keepBefore {
				t.Fatalf("kept entries up to %d, want at least up to %d\n%s", last, keepBefore-1, sink)
			}
			got, err := l.Entries(1, last+1, 1<<30)
			if err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if got[i].Index != ents[i].Index || string(got[i].Data) != string(ents[i].Data) {
					t.Fatalf("kept entry %d differs from the one written", i+1)
				}
			}
			checkInvariants(t, l)
			d, damaged := l.Damage()
			if tc.torn {
				if damaged {
					t.Fatalf("a torn tail was recorded as damage: %+v", d)
				}
				if last != n-1 {
					t.Fatalf("torn tail: last = %d, want %d", last, n-1)
				}
				l.Close()
				return
			}
			if !damaged || !l.Damaged() {
				t.Fatalf("damage not recorded; last=%d\n%s", last, sink)
			}
			if d.FromIndex != last+1 || d.FromOffset != l.EndOffset() {
				t.Fatalf("record starts at index %d offset %d; the kept log ends at %d, %d", d.FromIndex, d.FromOffset, last, l.EndOffset())
			}
			wantEnd := int64(2 * n) // every record written
			if d.ToOffset < wantEnd || d.ToIndex < n {
				t.Fatalf("record ends at index %d offset %d; the log held up to %d, %d", d.ToIndex, d.ToOffset, n, wantEnd)
			}
			if d.ToOffsetExact && d.ToOffset != wantEnd {
				t.Fatalf("exact end %d, want %d", d.ToOffset, wantEnd)
			}
			if len(d.Quarantine) != 1 {
				t.Fatalf("quarantine = %v", d.Quarantine)
			}
			qfiles, err := os.ReadDir(filepath.Join(dir, d.Quarantine[0]))
			if err != nil || len(qfiles) == 0 {
				t.Fatalf("quarantine folder: %v %v", qfiles, err)
			}
			if !strings.Contains(sink.String(), "level=ERROR") {
				t.Fatalf("damage not logged as an error:\n%s", sink)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}

			// Reopened, it is still damaged: nothing serves it as whole.
			l = mustOpen(t, opts)
			if d2, ok := l.Damage(); !ok || d2.Accepted || d2.FromOffset != d.FromOffset || d2.ToOffset != d.ToOffset {
				t.Fatalf("after reopen: %+v %v, want %+v", d2, ok, d)
			}
			// The repair: writable again past every lost offset.
			if err := l.AcceptDamage(0, 0); err != nil {
				t.Fatal(err)
			}
			if l.Damaged() || l.NextOffset() != d.ToOffset {
				t.Fatalf("after accept: damaged=%v NextOffset=%d, want %d", l.Damaged(), l.NextOffset(), d.ToOffset)
			}
			g := &gen{term: 2, next: l.NextOffset(), recLen: 10}
			mustSave(t, l, raftpb.HardState{Term: 2, Vote: 1}, g.entries(last+1, 3, 1))
			l.Close()
			l = mustOpen(t, opts)
			defer l.Close()
			if l.Damaged() || l.EndOffset() != d.ToOffset+3 {
				t.Fatalf("after accept and reopen: damaged=%v EndOffset=%d, want %d", l.Damaged(), l.EndOffset(), d.ToOffset+3)
			}
			b, err := l.ReadBatches(d.FromOffset, 1<<20, l.EndOffset())
			if err != nil || len(b) == 0 || b[0].BaseOffset != d.ToOffset {
				t.Fatalf("read from the lost range: %v %v; want the first new batch at %d", b, err, d.ToOffset)
			}
		})
	}
}

// A repair that fails part-way (its fsyncs fail) leaves files that the next
// Open still knows to be damaged: the record is written before anything
// moves.
func TestDamageRepairInterrupted(t *testing.T) {
	for fail := 1; fail <= 6; fail++ {
		dir := t.TempDir()
		_, segs := damageLog(t, dir, 66)
		k := len(segs) / 2
		starts, _ := entryStarts(t, segs[k].path)
		// The last entry of a middle segment: once later segments are
		// moved away, it would look like a torn tail.
		rewrite(t, segs[k].path, func(b []byte) []byte { b[starts[len(starts)-1]+20] ^= 0x10; return b })

		opts, sink := testOptions(t, dir)
		opts.SegmentBytes = 2048
		efs := errorfs.Wrap(OSFS)
		opts.FS = efs
		efs.FailSync(fail, errors.New("injected fsync failure"))
		if l, err := Open(opts); err == nil {
			// The fault hit after the repair (or not at all).
			l.Close()
		}
		efs.Reset()
		l := mustOpen(t, opts)
		d, ok := l.Damage()
		_, last := mustIndexes(t, l)
		if !ok || d.FromOffset < 0 || d.ToOffset < 132 || last >= segs[k].first+uint64(len(starts)-1) {
			t.Fatalf("fail sync %d: damage %+v %v, last %d\n%s", fail, d, ok, last, sink)
		}
		checkInvariants(t, l)
		l.Close()
	}
}

// A read of the live log that finds corrupt data is reported, so the owner
// can reopen the log and Open handle the damage.
func TestLiveReadCorruptionIsReported(t *testing.T) {
	dir := t.TempDir()
	_, segs := damageLog(t, dir, 66)
	opts, _ := testOptions(t, dir)
	opts.SegmentBytes = 2048
	opts.CacheBytes = -1
	l := mustOpen(t, opts)
	defer l.Close()
	if l.ReadCorruption() != nil {
		t.Fatal("corruption reported before any damage")
	}
	starts, _ := entryStarts(t, segs[1].path)
	rewrite(t, segs[1].path, func(b []byte) []byte { b[starts[1]+20] ^= 0x10; return b })
	// Segment 1 is not cached (the scan's reads moved on): reads load it
	// from the file.
	if err := l.ClearCache(); err != nil {
		t.Fatal(err)
	}
	_, err := l.Entries(segs[1].first+1, segs[1].first+2, 1<<30)
	if err == nil {
		t.Fatal("a corrupt entry was read without an error")
	}
	if got := l.ReadCorruption(); got == nil || !IsCorruption(got) {
		t.Fatalf("ReadCorruption = %v", got)
	}
}

// FuzzRecoverDamage damages a log of several segments at random (flips,
// zeroed runs, truncations, deleted segments) and opens it, with an injected
// fsync failure first when the input asks for one. It guarantees: Open
// never panics; every entry the log keeps is the one written; the log either
// holds every entry before the first damaged byte or records the damage; an
// unrecorded loss is only ever the tail of the last segment; and after
// AcceptDamage the log's EndOffset is past every offset a valid entry after
// the damage held.
func FuzzRecoverDamage(f *testing.F) {
	f.Add([]byte{0, 3, 50, 1}, uint8(0))
	f.Add([]byte{1, 2, 10, 200}, uint8(0))
	f.Add([]byte{2, 4, 0, 0}, uint8(0))
	f.Add([]byte{3, 2, 0, 0}, uint8(2))
	f.Add([]byte{0, 0, 5, 7, 0, 6, 90, 3}, uint8(1))
	f.Fuzz(func(t *testing.T, ops []byte, failSync uint8) {
		const n = 44
		dir := t.TempDir()
		ents, segs := damageLog(t, dir, n)
		// firstDamaged: the lowest raft index whose bytes an op touched.
		firstDamaged := uint64(n + 1)
		lastSegTouched := true
		entryAt := func(k, pos int) uint64 {
			starts, _ := entryStarts(t, segs[k].path)
			i := 0
			for i+1 < len(starts) && starts[i+1] <= pos {
				i++
			}
			return segs[k].first + uint64(i)
		}
		for len(ops) >= 4 {
			op, k := ops[0]%4, int(ops[1])%len(segs)
			at := int(binary.LittleEndian.Uint16(ops[2:4]))
			ops = ops[4:]
			if _, err := os.Stat(segs[k].path); err != nil {
				continue // deleted by an earlier op
			}
			b, _ := os.ReadFile(segs[k].path)
			if len(b) == 0 {
				continue
			}
			at %= len(b)
			idx := entryAt(k, at)
			switch op {
			case 0:
				b[at] ^= 1 << (at % 8)
			case 1:
				clear(b[at:min(len(b), at+64)])
			case 2:
				b = b[:at]
			case 3:
				if k == 0 || k == len(segs)-1 {
					continue
				}
				os.Remove(segs[k].path)
				idx = segs[k].first
				b = nil
			}
			if b != nil {
				os.WriteFile(segs[k].path, b, 0o640)
			}
			if idx < firstDamaged {
				firstDamaged = idx
				lastSegTouched = k == len(segs)-1
			}
		}
		opts, sink := testOptions(t, dir)
		opts.SegmentBytes = 2048
		if failSync > 0 {
			efs := errorfs.Wrap(OSFS)
			efs.FailSync(int(failSync%8), errors.New("injected"))
			fo := opts
			fo.FS = efs
			if l, err := Open(fo); err == nil {
				l.Close()
			}
		}
		l, err := Open(opts)
		if err != nil {
			t.Skipf("open refused the damaged log: %v", err) // refusing is safe
		}
		defer l.Close()
		_, last := mustIndexes(t, l)
		got, err := l.Entries(1, last+1, 1<<30)
		if err != nil {
			t.Fatalf("reading the kept entries: %v\n%s", err, sink)
		}
		for i := range got {
			if got[i].Index != ents[i].Index || string(got[i].Data) != string(ents[i].Data) {
				t.Fatalf("kept entry %d differs", i+1)
			}
		}
		if last+1 < firstDamaged && firstDamaged <= n {
			t.Fatalf("lost entries %d..%d before the first damaged one %d", last+1, firstDamaged-1, firstDamaged)
		}
		d, damaged := l.Damage()
		if !damaged && last < n && !lastSegTouched {
			t.Fatalf("entries after %d lost without a damage record (first damaged %d)\n%s", last, firstDamaged, sink)
		}
		if damaged {
			if err := l.AcceptDamage(0, 0); err != nil {
				t.Fatal(err)
			}
			if l.NextOffset() < d.ToOffset || d.FromOffset != 2*int64(last) {
				t.Fatalf("after accept NextOffset %d, record %+v, kept %d entries", l.NextOffset(), d, last)
			}
		}
	})
}
