package timewheel

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/heraldmq/herald/persistence/errorfs"
	"github.com/heraldmq/herald/persistence/vfs"
)

func openTestFar(t testing.TB, opt DiskFarOptions) (*DiskFar, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "far")
	d, err := OpenDiskFar(dir, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, dir
}

// farEntry is a timer in bucket b: its At lies in b.
func farEntry(r *rand.Rand, b int64, ref uint64) Entry {
	return Entry{At: b<<farShift + r.Int64N(FarBucketMs), Ref: ref}
}

func sorted(es []Entry) []Entry {
	es = slices.Clone(es)
	slices.SortFunc(es, Entry.compare)
	return es
}

func farFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*"+farSuffix))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestDiskFarModel drives a DiskFar and memFar with random Puts, Takes,
// Removes and Firsts over a few dozen buckets (negative ones too), with
// write buffers from 1 timer (every Put past the first writes files) to the
// default (nothing is written): every answer must match, except that a
// DiskFar may refuse to Remove a timer it wrote (the scheduler tombstones
// it), which the model then keeps too.
func TestDiskFarModel(t *testing.T) {
	for _, max := range []int{0, 1, 7, 40} {
		for seed := uint64(1); seed <= 8; seed++ {
			r := rand.New(rand.NewPCG(seed, uint64(max)))
			d, dir := openTestFar(t, DiskFarOptions{MaxBuffered: max})
			m := newMemFar()
			base := r.Int64N(100) - 50
			var held []Entry
			ref := uint64(0)
			where := func(step int) string { return fmt.Sprintf("max %d seed %d step %d", max, seed, step) }
			for step := 0; step < 1500; step++ {
				b := base + r.Int64N(30)
				switch op := r.IntN(12); {
				case op < 6:
					ref++
					e := farEntry(r, b, ref)
					d.Put(b, e)
					m.Put(b, e)
					held = append(held, e)
				case op < 8:
					if op == 7 {
						b, _ = m.First()
					}
					got, want := sorted(d.Take(b)), sorted(m.Take(b))
					if !slices.Equal(got, want) {
						t.Fatalf("%s: Take(%d) = %d timers %v, want %d %v", where(step), b, len(got), head(got), len(want), head(want))
					}
					held = slices.DeleteFunc(held, func(e Entry) bool { return e.At>>farShift == b })
				case op < 10:
					e := Entry{At: b << farShift, Ref: 1 << 62} // not held
					if len(held) > 0 && op == 8 {
						e = held[r.IntN(len(held))]
					}
					eb := e.At >> farShift
					switch ok := d.Remove(eb, e); {
					case ok:
						if !m.Remove(eb, e) {
							t.Fatalf("%s: DiskFar removed %v, which it did not hold", where(step), e)
						}
						held = slices.DeleteFunc(held, func(f Entry) bool { return f == e })
					case max == 0:
						// Nothing was written: Remove must find every held timer.
						if m.Remove(eb, e) {
							t.Fatalf("%s: Remove(%v) = false for a buffered timer", where(step), e)
						}
					}
				default:
					gb, gok := d.First()
					wb, wok := m.First()
					if gb != wb || gok != wok {
						t.Fatalf("%s: First = %d %v, want %d %v", where(step), gb, gok, wb, wok)
					}
				}
				st := d.Stats()
				if d.Len() != m.Len() || st.OnDisk+st.Buffered != d.Len() {
					t.Fatalf("%s: Len %d (%+v), want %d", where(step), d.Len(), st, m.Len())
				}
				live := 0
				for _, s := range m.buckets {
					if len(s) > 0 {
						live++
					}
				}
				if st.Buckets != live {
					t.Fatalf("%s: %d buckets, want %d", where(step), st.Buckets, live)
				}
			}
			st := d.Stats()
			if n := len(farFiles(t, dir)); n != st.Files {
				t.Fatalf("max %d seed %d: %d files, Stats %+v", max, seed, n, st)
			}
			if max != 0 && st.Files == 0 {
				t.Fatalf("max %d seed %d: nothing written (%+v)", max, seed, st)
			}
			for {
				b, ok := m.First()
				if !ok {
					break
				}
				if db, _ := d.First(); db != b {
					t.Fatalf("max %d seed %d: First %d, want %d", max, seed, db, b)
				}
				if got, want := sorted(d.Take(b)), sorted(m.Take(b)); !slices.Equal(got, want) {
					t.Fatalf("max %d seed %d: drain Take(%d) = %d timers, want %d", max, seed, b, len(got), len(want))
				}
			}
			if _, ok := d.First(); ok || d.Len() != 0 || d.Err() != nil || len(farFiles(t, dir)) != 0 {
				t.Fatalf("max %d seed %d: after draining Len %d Err %v, %d files", max, seed, d.Len(), d.Err(), len(farFiles(t, dir)))
			}
		}
	}
}

// schedWheel drives a Wheel the way the scheduler does: a timer its far
// store will not Remove (written to disk) is tombstoned, and dropped when
// it fires.
type schedWheel struct {
	w       *Wheel
	pending map[Entry]int // added and neither fired nor cancelled
	tomb    map[Entry]int // cancelled but still in the wheel
}

func newSchedWheel(now int64, far FarStore) *schedWheel {
	return &schedWheel{w: NewWheel(now, far), pending: map[Entry]int{}, tomb: map[Entry]int{}}
}

func (s *schedWheel) add(e Entry) {
	s.w.Add(e)
	s.pending[e]++
}

func (s *schedWheel) cancel(e Entry) bool {
	if s.pending[e] == 0 {
		return s.w.Cancel(e)
	}
	if s.pending[e]--; s.pending[e] == 0 {
		delete(s.pending, e)
	}
	if !s.w.Cancel(e) {
		s.tomb[e]++
	}
	return true
}

func (s *schedWheel) advance(now int64, out []Entry) []Entry {
	start := len(out)
	out = s.w.Advance(now, out)
	kept := out[:start]
	for _, e := range out[start:] {
		if s.tomb[e] > 0 {
			if s.tomb[e]--; s.tomb[e] == 0 {
				delete(s.tomb, e)
			}
			continue
		}
		if s.pending[e]--; s.pending[e] == 0 {
			delete(s.pending, e)
		}
		kept = append(kept, e)
	}
	return kept
}

func (s *schedWheel) now() int64 { return s.w.Now() }

func (s *schedWheel) len() int {
	n := s.w.Len()
	for _, k := range s.tomb {
		n -= k
	}
	return n
}

// near is Wheel.Near without the tombstones: timers in the far store are
// those of a bucket after the clock's.
func (s *schedWheel) near() int {
	n := s.w.Near()
	for e, k := range s.tomb {
		if e.At>>farShift <= s.w.Now()>>farShift {
			n -= k
		}
	}
	return n
}

// TestDiskFarWheelScenarios runs testdata/wheel/*.txt (see
// TestWheelScenarios) on a Wheel whose far store is a DiskFar, one that
// buffers everything and one that writes every timer it can, driven as the
// scheduler drives it (cancelled timers it wrote are tombstoned): the
// output must be the one memFar gives.
func TestDiskFarWheelScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/wheel/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	for _, max := range []int{0, 1} {
		for _, f := range files {
			name := fmt.Sprintf("%s/max=%d", strings.TrimSuffix(filepath.Base(f), ".txt"), max)
			t.Run(name, func(t *testing.T) {
				d, _ := openTestFar(t, DiskFarOptions{MaxBuffered: max})
				runWheelFile(t, f, func(start int64) scenarioWheel { return newSchedWheel(start, d) }, false)
				if d.Err() != nil {
					t.Fatal(d.Err())
				}
			})
		}
	}
}

// TestDiskFarWheelLongRun drives a Wheel on memFar and Wheels on DiskFars
// (writing nearly every timer, and buffering all) with random adds up to 90
// days ahead, cancels and advances up to weeks, as the scheduler drives
// them: each Advance must fire the same timers, and Len agree.
func TestDiskFarWheelLongRun(t *testing.T) {
	const day = 24 * 3600 * 1000
	for seed := uint64(1); seed <= 6; seed++ {
		r := rand.New(rand.NewPCG(seed, 90))
		now := int64(1_700_000_000_000) + r.Int64N(1<<20)
		ref := newSchedWheel(now, nil)
		d1, _ := openTestFar(t, DiskFarOptions{MaxBuffered: 5})
		d2, _ := openTestFar(t, DiskFarOptions{})
		disks := []*schedWheel{newSchedWheel(now, d1), newSchedWheel(now, d2)}
		adds := []int64{4, 300, 70_000, 5_000_000, day, 90 * day}
		advances := []int64{4, 300, 70_000, 5_000_000, 14 * day}
		var live []Entry // may hold fired timers: cancelling one must fail everywhere
		var want, got []Entry
		id := uint64(0)
		for step := 0; step < 3000; step++ {
			switch op := r.IntN(10); {
			case op < 6:
				id++
				e := Entry{At: now + r.Int64N(adds[r.IntN(len(adds))]) - 2, Ref: id}
				ref.add(e)
				for _, w := range disks {
					w.add(e)
				}
				live = append(live, e)
			case op == 6 && len(live) > 0:
				i := r.IntN(len(live))
				e := live[i]
				live = slices.Delete(live, i, i+1)
				ok := ref.cancel(e)
				for k, w := range disks {
					if w.cancel(e) != ok {
						t.Fatalf("seed %d step %d: disk wheel %d: cancel %v = %v, want %v", seed, step, k, e, !ok, ok)
					}
				}
			default:
				now += 1 + r.Int64N(advances[r.IntN(len(advances))])
				want = ref.advance(now, want[:0])
				for k, w := range disks {
					got = w.advance(now, got[:0])
					if !slices.Equal(got, want) {
						t.Fatalf("seed %d step %d: disk wheel %d: advance to %d fired %d timers, want %d\n got %v\nwant %v", seed, step, k, now, len(got), len(want), head(got), head(want))
					}
				}
			}
			for k, w := range disks {
				if w.len() != ref.len() {
					t.Fatalf("seed %d step %d: disk wheel %d: Len %d, want %d (%v)", seed, step, k, w.len(), ref.len(), w.w)
				}
			}
		}
		if d1.Stats().Files == 0 || d1.Err() != nil || d2.Err() != nil {
			t.Fatalf("seed %d: %+v %v %v", seed, d1.Stats(), d1.Err(), d2.Err())
		}
	}
}

// fillBucket puts n timers into bucket b and returns them.
func fillBucket(d *DiskFar, r *rand.Rand, b int64, n int, ref *uint64) []Entry {
	var es []Entry
	for range n {
		*ref++
		e := farEntry(r, b, *ref)
		d.Put(b, e)
		es = append(es, e)
	}
	return es
}

// A bucket file cut short, damaged or missing a chunk is reported by Err
// (ErrFarCorrupt) and ReadErrors, and Take still returns the chunks before
// the damage and the buffered timers.
func TestDiskFarCorruptFile(t *testing.T) {
	const chunk = farHeader + 5*farRecord // one flush of 5 timers
	for _, tc := range []struct {
		name   string
		damage func(data []byte) []byte
	}{
		{"torn", func(data []byte) []byte { return data[:len(data)-3] }},
		{"torn-header", func(data []byte) []byte { return data[:chunk+5] }},
		{"flipped-bit", func(data []byte) []byte { data[chunk+farHeader+20] ^= 4; return data }},
		{"bad-checksum", func(data []byte) []byte { data[chunk+4] ^= 1; return data }},
		{"lost-chunk", func(data []byte) []byte { return data[:chunk] }},
		{"zero-count", func(data []byte) []byte { clear(data[chunk : chunk+4]); return data }},
		{"extra-chunk", func(data []byte) []byte { return append(data, data[:chunk]...) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			d, dir := openTestFar(t, DiskFarOptions{MaxBuffered: 4})
			const b = 12345
			var ref uint64
			first := fillBucket(d, r, b, 5, &ref)    // written: 5 > 4
			second := fillBucket(d, r, b, 5, &ref)   // written
			buffered := fillBucket(d, r, b, 2, &ref) // kept
			other := fillBucket(d, r, b+1, 1, &ref)  // another bucket, buffered
			if st := d.Stats(); st.OnDisk != 10 || st.Files != 1 {
				t.Fatalf("setup: %+v", st)
			}
			name := filepath.Join(dir, strconv.Itoa(b)+farSuffix)
			data, err := os.ReadFile(name)
			if err != nil || len(data) != 2*chunk {
				t.Fatalf("file: %d bytes, %v", len(data), err)
			}
			if err := os.WriteFile(name, tc.damage(data), 0o640); err != nil {
				t.Fatal(err)
			}
			got := sorted(d.Take(b))
			want := sorted(append(slices.Clone(first), buffered...))
			if tc.name == "extra-chunk" {
				want = sorted(slices.Concat(first, second, buffered))
			}
			if !slices.Equal(got, want) {
				t.Fatalf("Take = %v, want %v", got, want)
			}
			if err := d.Err(); !errors.Is(err, ErrFarCorrupt) {
				t.Fatalf("Err = %v, want ErrFarCorrupt", err)
			}
			t.Log(d.Err())
			if st := d.Stats(); st.ReadErrors != 1 || d.Len() != 1 || st.Files != 0 || st.Buckets != 1 {
				t.Fatalf("after Take: Len %d %+v", d.Len(), st)
			}
			if _, err := os.Stat(name); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("file left: %v", err)
			}
			if got := d.Take(b + 1); !slices.Equal(got, other) {
				t.Fatalf("other bucket: %v, want %v", got, other)
			}
		})
	}
}

// faultFS adds to a vfs.FS (errorfs for write faults) read faults and
// failing truncations.
type faultFS struct {
	vfs.FS
	readLeft int64 // bytes readable before reads fail with EIO; -1: no fault
	truncErr error
}

func (f *faultFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fs: f}, nil
}

type faultFile struct {
	vfs.File
	fs *faultFS
}

func (f *faultFile) Read(p []byte) (int, error) {
	left := f.fs.readLeft
	if left < 0 {
		return f.File.Read(p)
	}
	if left == 0 {
		return 0, &os.PathError{Op: "read", Path: "faultfs", Err: syscall.EIO}
	}
	n, err := f.File.Read(p[:min(int64(len(p)), left)])
	f.fs.readLeft -= int64(n)
	return n, err
}

func (f *faultFile) Truncate(size int64) error {
	if f.fs.truncErr != nil {
		return f.fs.truncErr
	}
	return f.File.Truncate(size)
}

// A full disk loses no timer: they stay buffered (Len counts them), a
// failed write is retried only every MaxBuffered/2 Puts, a torn write is
// cut off, and once the disk has room everything goes out and comes back
// exactly once.
func TestDiskFarWriteFailure(t *testing.T) {
	efs := errorfs.Wrap(vfs.Default)
	d, dir := openTestFar(t, DiskFarOptions{FS: efs, MaxBuffered: 4})
	r := rand.New(rand.NewPCG(3, 4))
	var ref uint64
	want := map[int64][]Entry{}
	put := func(b int64, n int) { want[b] = append(want[b], fillBucket(d, r, b, n, &ref)...) }
	put(1, 5) // written
	name := filepath.Join(dir, "1"+farSuffix)
	size := func() int64 {
		st, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	before := size()

	efs.FailWritesAfter(20) // the next write is torn after 20 bytes
	put(1, 3)
	put(2, 2) // 5 > 4: flush, which fails
	st := d.Stats()
	if st.WriteErrors != 1 || st.Buffered != 5 || st.OnDisk != 5 || d.Len() != 10 {
		t.Fatalf("after a failed flush: Len %d %+v", d.Len(), st)
	}
	if !errors.Is(d.Err(), syscall.ENOSPC) {
		t.Fatalf("Err = %v, want ENOSPC", d.Err())
	}
	if size() != before {
		t.Fatalf("torn write left: %d bytes, want %d", size(), before)
	}
	put(3, 1) // retried after 2 more Puts (MaxBuffered/2), not before
	if d.Stats().WriteErrors != 1 {
		t.Fatalf("retried at once: %+v", d.Stats())
	}
	put(3, 1)
	put(4, 40)
	if st := d.Stats(); st.WriteErrors < 2 || st.WriteErrors > 2+40/2 || st.Buffered != 47 {
		t.Fatalf("retries: %+v", st)
	}
	first := d.Err()

	efs.Reset()
	put(5, 3) // the next retry succeeds
	if st := d.Stats(); st.Buffered > 2 || d.Len() != 55 {
		t.Fatalf("after the disk recovered: Len %d %+v", d.Len(), st)
	}
	if d.Err() != first {
		t.Fatalf("Err changed to %v", d.Err())
	}
	for b, es := range want {
		if got := sorted(d.Take(b)); !slices.Equal(got, sorted(es)) {
			t.Fatalf("Take(%d) = %d timers, want %d", b, len(got), len(es))
		}
	}
	if d.Len() != 0 || d.Stats().ReadErrors != 0 {
		t.Fatalf("after Take: Len %d %+v", d.Len(), d.Stats())
	}
}

// A failed write that cannot be cut off (the truncation fails too) seals
// the bucket: its file is read up to the timers written before, even when
// the failed write got a whole chunk through, and its later timers stay
// in memory. Each comes back once.
func TestDiskFarWriteFailureSealed(t *testing.T) {
	efs := errorfs.Wrap(vfs.Default)
	ffs := &faultFS{FS: efs, readLeft: -1}
	const max = 5000
	d, _ := openTestFar(t, DiskFarOptions{FS: ffs, MaxBuffered: max})
	r := rand.New(rand.NewPCG(5, 6))
	var ref uint64
	const b = -7
	want := fillBucket(d, r, b, max+1, &ref) // written, two chunks
	if d.Stats().OnDisk != max+1 {
		t.Fatalf("setup: %+v", d.Stats())
	}
	efs.FailWritesAfter(farHeader + farChunkMax*farRecord + 20) // the first chunk goes through
	ffs.truncErr = &os.PathError{Op: "truncate", Path: "faultfs", Err: syscall.EIO}
	want = append(want, fillBucket(d, r, b, max+1, &ref)...)
	if st := d.Stats(); st.WriteErrors != 2 || st.Buffered != max+1 {
		t.Fatalf("after the failed write: %+v", st)
	}
	efs.Reset()
	ffs.truncErr = nil
	want = append(want, fillBucket(d, r, b, max, &ref)...)
	want = append(want, fillBucket(d, r, b+1, 10, &ref)...) // another bucket is written
	st := d.Stats()
	if st.Buffered+st.OnDisk != len(want) || st.OnDisk <= max+1 {
		t.Fatalf("sealed bucket: %+v", st)
	}
	got := d.Take(b)
	got = append(got, d.Take(b+1)...)
	if !slices.Equal(sorted(got), sorted(want)) {
		t.Fatalf("Take returned %d timers, want %d", len(got), len(want))
	}
	if d.Stats().ReadErrors != 0 || d.Len() != 0 {
		t.Fatalf("after Take: Len %d %+v", d.Len(), d.Stats())
	}
}

// A read that fails returns the chunks read before the failure and the
// buffered timers, and records the error.
func TestDiskFarReadFailure(t *testing.T) {
	ffs := &faultFS{FS: vfs.Default, readLeft: -1}
	d, _ := openTestFar(t, DiskFarOptions{FS: ffs, MaxBuffered: 4})
	r := rand.New(rand.NewPCG(7, 8))
	var ref uint64
	first := fillBucket(d, r, 9, 5, &ref)
	fillBucket(d, r, 9, 5, &ref)
	buffered := fillBucket(d, r, 9, 1, &ref)
	ffs.readLeft = farHeader + 5*farRecord + 3
	got := d.Take(9)
	if want := append(slices.Clone(first), buffered...); !slices.Equal(sorted(got), sorted(want)) {
		t.Fatalf("Take = %v, want %v", got, want)
	}
	if !errors.Is(d.Err(), syscall.EIO) || d.Stats().ReadErrors != 1 || d.Len() != 0 {
		t.Fatalf("Err %v, Len %d, %+v", d.Err(), d.Len(), d.Stats())
	}
}

func TestOpenDiskFar(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"5.far", "-3.far"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("old"), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	d, err := OpenDiskFar(dir, DiskFarOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 || d.Len() != 0 {
		t.Fatalf("Open left %d files", len(ents))
	}
	d.Put(5, Entry{At: 5 << farShift, Ref: 1})
	d.flush(0)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("Close left %d files", len(ents))
	}
	for _, n := range []string{"00.far", "x.far", "segment.log"} {
		bad := t.TempDir()
		if err := os.WriteFile(filepath.Join(bad, n), nil, 0o640); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenDiskFar(bad, DiskFarOptions{}); err == nil {
			t.Fatalf("Open cleared a directory holding %q", n)
		}
		if _, err := os.Stat(filepath.Join(bad, n)); err != nil {
			t.Fatalf("Open removed %q", n)
		}
	}
	if _, err := OpenDiskFar(t.TempDir(), DiskFarOptions{MaxBuffered: -1}); err == nil {
		t.Fatal("negative MaxBuffered accepted")
	}
}

// nullFS swallows writes: it measures a DiskFar's own memory, without the
// time and the 100k files of a real disk.
type nullFS struct{}

func (nullFS) OpenFile(string, int, os.FileMode) (vfs.File, error) { return nullFile{}, nil }
func (nullFS) Remove(string) error                                 { return nil }
func (nullFS) RemoveAll(string) error                              { return nil }
func (nullFS) Rename(string, string) error                         { return nil }
func (nullFS) MkdirAll(string, os.FileMode) error                  { return nil }
func (nullFS) ReadDir(string) ([]os.DirEntry, error)               { return nil, nil }
func (nullFS) Stat(string) (os.FileInfo, error)                    { return nullInfo{}, nil }
func (nullFS) SyncDir(string) error                                { return nil }

type nullFile struct{}

func (nullFile) Read([]byte) (int, error)               { return 0, io.EOF }
func (nullFile) Write(p []byte) (int, error)            { return len(p), nil }
func (nullFile) ReadAt([]byte, int64) (int, error)      { return 0, io.EOF }
func (nullFile) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }
func (nullFile) Close() error                           { return nil }
func (nullFile) Sync() error                            { return nil }
func (nullFile) Truncate(int64) error                   { return nil }
func (nullFile) Stat() (os.FileInfo, error)             { return nullInfo{}, nil }

type nullInfo struct{}

func (nullInfo) Name() string       { return "null" }
func (nullInfo) Size() int64        { return 0 }
func (nullInfo) Mode() os.FileMode  { return 0 }
func (nullInfo) ModTime() time.Time { return time.Time{} }
func (nullInfo) IsDir() bool        { return false }
func (nullInfo) Sys() any           { return nil }

// 1M timers spread over 90 days in a Wheel on a DiskFar with the default
// buffer cost a few bytes of heap each: a count per bucket (~119k of
// them), the bucket heap and the 1 MiB buffer, not 16 bytes per timer.
func TestDiskFarMemory(t *testing.T) {
	const n = 1_000_000
	start := int64(1 << 40)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	d, err := OpenDiskFar("far", DiskFarOptions{FS: nullFS{}})
	if err != nil {
		t.Fatal(err)
	}
	w := NewWheel(start, d)
	r := rand.New(rand.NewPCG(5, 6))
	for i := uint64(0); i < n; i++ {
		w.Add(Entry{At: start + 1 + r.Int64N(90*24*3600*1000), Ref: i})
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	objects := int64(after.HeapObjects) - int64(before.HeapObjects)
	bytes := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	st := d.Stats()
	t.Logf("%d timers: %d heap objects, %.1f bytes each (%+v)", n, objects, float64(bytes)/n, st)
	if w.Len() != n || st.OnDisk < n-DefaultFarMaxBuffered || d.Err() != nil {
		t.Fatalf("Len %d, %+v, %v", w.Len(), st, d.Err())
	}
	if bytes > 16*n || objects > n/10 {
		t.Fatalf("%d timers took %d heap objects and %d bytes", n, objects, bytes)
	}
	runtime.KeepAlive(w)
}

// FuzzDiskFarFile decodes arbitrary bytes as the bucket file of bucket b.
// It guarantees: no panic; only timers of whole chunks that pass their
// checksum and lie in b, never more than the data holds (16 bytes each);
// any failure marked ErrFarCorrupt; and timers it returns encode to a file
// that decodes to them again.
func FuzzDiskFarFile(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, b int64) {
		scratch := make([]byte, farHeader+farChunkMax*farRecord)
		out, err := decodeFarChunks(bytes.NewReader(data), b, nil, scratch)
		if err != nil && !errors.Is(err, ErrFarCorrupt) {
			t.Fatalf("error not marked ErrFarCorrupt: %v", err)
		}
		if len(out)*farRecord > len(data) {
			t.Fatalf("%d timers from %d bytes", len(out), len(data))
		}
		if err == nil && len(data)-len(out)*farRecord > farHeader*len(out) {
			t.Fatalf("%d timers from %d bytes without an error", len(out), len(data))
		}
		for _, e := range out {
			if e.At>>farShift != b {
				t.Fatalf("timer %v not in bucket %d", e, b)
			}
		}
		var file []byte
		for rest := out; len(rest) > 0; rest = rest[min(len(rest), farChunkMax):] {
			file = encodeFarChunk(file, rest[:min(len(rest), farChunkMax)])
		}
		again, err := decodeFarChunks(bytes.NewReader(file), b, nil, scratch)
		if err != nil || !slices.Equal(again, out) {
			t.Fatalf("re-encoded %d timers decode to %d, %v", len(out), len(again), err)
		}
	})
}

// BenchmarkDiskFarPutTake puts timers spread over a day (~1300 buckets)
// into a DiskFar on the real disk with the default buffer, then takes
// every bucket in order: the cost per timer of going to disk and back.
func BenchmarkDiskFarPutTake(b *testing.B) {
	d, _ := openTestFar(b, DiskFarOptions{})
	r := rand.New(rand.NewPCG(1, 1))
	start := int64(1 << 40)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		at := start + r.Int64N(24*3600*1000)
		d.Put(at>>farShift, Entry{At: at, Ref: uint64(i)})
	}
	n := 0
	for {
		bk, ok := d.First()
		if !ok {
			break
		}
		n += len(d.Take(bk))
	}
	b.StopTimer()
	if n != b.N || d.Err() != nil {
		b.Fatalf("took %d of %d: %v", n, b.N, d.Err())
	}
}
