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

// entryStarts returns the byte offsets at which the entries of a tidwall
// binary segment file start.
func entryStarts(t *testing.T, path string) ([]int, []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var starts []int
	for pos := 0; pos < len(b); {
		size, n := binary.Uvarint(b[pos:])
		if n <= 0 {
			t.Fatalf("bad segment %s at %d", path, pos)
		}
		starts = append(starts, pos)
		pos += n + int(size)
	}
	return starts, b
}

func lastSegment(t *testing.T, dir string) string {
	t.Helper()
	names, err := segments(OSFS, filepath.Join(dir, "wal"))
	if err != nil || len(names) == 0 {
		t.Fatalf("segments: %v %v", names, err)
	}
	return filepath.Join(dir, "wal", names[len(names)-1])
}

func TestTornTail(t *testing.T) {
	const n = 20
	cases := []struct {
		name string
		keep int // whole valid entries expected to remain
		tear func(t *testing.T, path string)
	}{
		{"half length varint", n - 1, func(t *testing.T, path string) {
			starts, _ := entryStarts(t, path)
			truncate(t, path, int64(starts[len(starts)-1]+1))
		}},
		{"half the data", n - 1, func(t *testing.T, path string) {
			starts, b := entryStarts(t, path)
			last := starts[len(starts)-1]
			truncate(t, path, int64(last+(len(b)-last)/2))
		}},
		{"garbage bytes after the last entry", n, func(t *testing.T, path string) {
			appendBytes(t, path, []byte{0xff, 0xff, 0xff, 0x7f, 0x01, 0x02})
		}},
		{"garbage that frames as a whole entry", n, func(t *testing.T, path string) {
			appendBytes(t, path, []byte{0x06, 1, 2, 3, 4, 5, 6})
		}},
		{"zero-filled tail", n, func(t *testing.T, path string) {
			appendBytes(t, path, make([]byte, 4096))
		}},
		{"flipped crc byte", n - 1, func(t *testing.T, path string) {
			starts, b := entryStarts(t, path)
			last := starts[len(starts)-1]
			_, vn := binary.Uvarint(b[last:])
			b[last+vn] ^= 0x40
			if err := os.WriteFile(path, b, 0o640); err != nil {
				t.Fatal(err)
			}
		}},
		{"flipped data byte", n - 1, func(t *testing.T, path string) {
			_, b := entryStarts(t, path)
			b[len(b)-3] ^= 0x01
			if err := os.WriteFile(path, b, 0o640); err != nil {
				t.Fatal(err)
			}
		}},
		{"torn write through FS", n, func(t *testing.T, path string) {
			// Append a whole encoded entry n+1 through errorfs, torn after
			// 9 bytes, as a crash mid-write would leave it.
			g := &gen{term: 1, recLen: 300}
			e := g.entry(n+1, 1)
			payload := appendEncodedEntry(nil, &e)
			framed := binary.AppendUvarint(nil, uint64(len(payload)))
			framed = append(framed, payload...)
			fs := errorfs.Wrap(OSFS)
			f, err := fs.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			fs.TearNextWrite(9, nil)
			if _, err := f.Write(framed); err == nil {
				t.Fatal("torn write did not fail")
			}
			f.Close()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			opts, sink := testOptions(t, dir)
			l := mustOpen(t, opts)
			g := &gen{term: 1, recLen: 300} // > 127 bytes: two-byte length varints
			mustSave(t, l, raftpb.HardState{Term: 1, Vote: 1, Commit: n}, g.entries(1, n, 2))
			want, _ := l.Entries(1, n+1, 1<<30)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			tc.tear(t, lastSegment(t, dir))

			l = mustOpen(t, opts)
			defer l.Close()
			if f, la := mustIndexes(t, l); f != 1 || la != uint64(tc.keep) {
				t.Fatalf("after tear: first, last = %d, %d; want 1, %d\nlog:\n%s", f, la, tc.keep, sink)
			}
			got, err := l.Entries(1, uint64(tc.keep)+1, 1<<30)
			if err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if got[i].Index != want[i].Index || string(got[i].Data) != string(want[i].Data) {
					t.Fatalf("entry %d differs after recovery", i+1)
				}
			}
			if hs, _, _ := l.InitialState(); hs.Commit != uint64(tc.keep) {
				t.Fatalf("commit = %d, want clamped to %d", hs.Commit, tc.keep)
			}
			if tc.keep < n && !strings.Contains(sink.String(), "level=WARN") {
				t.Fatalf("no warning logged:\n%s", sink)
			}
			checkInvariants(t, l)
			// Save continues at the right index, with the right offsets.
			g2 := &gen{term: 1, next: l.EndOffset(), recLen: 10}
			mustSave(t, l, raftpb.HardState{Term: 1, Vote: 1}, g2.entries(uint64(tc.keep)+1, 3, 1))
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			l = mustOpen(t, opts)
			if _, la := mustIndexes(t, l); la != uint64(tc.keep)+3 {
				t.Fatalf("after save and reopen: last = %d", la)
			}
			checkInvariants(t, l)
		})
	}
}

func TestCorruptEntryInOlderSegment(t *testing.T) {
	dir := t.TempDir()
	opts, sink := testOptions(t, dir)
	opts.SegmentBytes = 2048
	l := mustOpen(t, opts)
	g := &gen{term: 1, recLen: 200}
	mustSave(t, l, raftpb.HardState{Term: 1, Commit: 60}, g.entries(1, 60, 1))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	names, _ := segments(OSFS, filepath.Join(dir, "wal"))
	if len(names) < 4 {
		t.Fatalf("want several segments, got %v", names)
	}
	// Flip a data byte of the third entry of the second segment.
	path := filepath.Join(dir, "wal", names[1])
	starts, b := entryStarts(t, path)
	b[starts[2]+10] ^= 0xff
	if err := os.WriteFile(path, b, 0o640); err != nil {
		t.Fatal(err)
	}
	var segFirst uint64
	for _, c := range names[1] {
		segFirst = segFirst*10 + uint64(c-'0')
	}
	l = mustOpen(t, opts)
	defer l.Close()
	if _, la := mustIndexes(t, l); la != segFirst+1 {
		t.Fatalf("last = %d, want %d\n%s", la, segFirst+1, sink)
	}
	checkInvariants(t, l)
	mustSave(t, l, raftpb.HardState{}, (&gen{term: 1, next: l.EndOffset()}).entries(segFirst+2, 5, 1))
}

// The state file's two slots: a damaged newest slot (a write torn by a
// crash) leaves the previous state; both damaged fail the open.
func TestCorruptStateFileFailsOpen(t *testing.T) {
	dir := t.TempDir()
	opts, _ := testOptions(t, dir)
	l := mustOpen(t, opts)
	mustSave(t, l, raftpb.HardState{Term: 1, Vote: 1}, nil)
	mustSave(t, l, raftpb.HardState{Term: 2, Vote: 1}, nil)
	l.Close()
	path := filepath.Join(dir, "state")
	b, _ := os.ReadFile(path)
	if len(b) != 2*slotSize {
		t.Fatalf("state file of %d bytes", len(b))
	}
	_, newest, _, err := decodeStateFile(b)
	if err != nil {
		t.Fatal(err)
	}
	b[int(newest%2)*slotSize+slotHeader+3] ^= 1 // the newest slot's body
	os.WriteFile(path, b, 0o640)
	l = mustOpen(t, opts)
	if hs, _, _ := l.InitialState(); hs.Term != 1 || hs.Vote != 1 {
		t.Fatalf("with the newest slot torn: %+v, want the previous term 1", hs)
	}
	l.Close()
	b, _ = os.ReadFile(path)
	b[10] ^= 1
	b[slotSize+10] ^= 1
	os.WriteFile(path, b, 0o640)
	if _, err := Open(opts); !IsCorruption(err) {
		t.Fatalf("Open with both state slots corrupt: %v", err)
	}
}

// A state file of the earlier single-record format is read, and replaced
// by the two-slot format on the next write.
func TestOldStateFileFormatIsRead(t *testing.T) {
	dir := t.TempDir()
	opts, _ := testOptions(t, dir)
	l := mustOpen(t, opts)
	mustSave(t, l, raftpb.HardState{Term: 3, Vote: 2}, nil)
	st := l.currentState()
	l.Close()
	path := filepath.Join(dir, "state")
	if err := os.WriteFile(path, encodeState(&st), 0o640); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, opts)
	if hs, _, _ := l.InitialState(); hs.Term != 3 || hs.Vote != 2 {
		t.Fatalf("from the old format: %+v", hs)
	}
	mustSave(t, l, raftpb.HardState{Term: 4, Vote: 2}, nil)
	l.Close()
	if b, _ := os.ReadFile(path); len(b) != 2*slotSize {
		t.Fatalf("state file of %d bytes after a write", len(b))
	}
	l = mustOpen(t, opts)
	defer l.Close()
	if hs, _, _ := l.InitialState(); hs.Term != 4 {
		t.Fatalf("after the rewrite: %+v", hs)
	}
}

func TestMissingStateWithWALIsRecovered(t *testing.T) {
	// A crash after the first WAL write but before the first state write
	// cannot happen (Open writes the state), but a lost state file must
	// still leave a usable log of what the WAL holds.
	dir := t.TempDir()
	opts, _ := testOptions(t, dir)
	l := mustOpen(t, opts)
	mustSave(t, l, raftpb.HardState{}, (&gen{term: 1}).entries(1, 5, 1))
	l.Close()
	if err := os.Remove(filepath.Join(dir, "state")); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, opts)
	defer l.Close()
	if _, la := mustIndexes(t, l); la != 5 {
		t.Fatalf("last = %d", la)
	}
}

func truncate(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

func appendBytes(t *testing.T, path string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
}

var _ = errors.Is
