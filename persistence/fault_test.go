package persistence

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/heraldmq/herald/persistence/errorfs"
)

func TestFailedWALSyncFailsLogUntilReopen(t *testing.T) {
	opts, _ := testOptions(t, t.TempDir())
	cur := withFaultWAL(&opts)
	l := mustOpen(t, opts)
	g := &gen{term: 1, recLen: 64}
	mustSave(t, l, raftpb.HardState{Term: 1, Vote: 1, Commit: 10}, g.entries(1, 10, 1))

	eio := &os.PathError{Op: "sync", Path: "seg", Err: syscall.EIO}
	cur().set(eio, nil)
	err := l.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: 10}, g.entries(11, 5, 1))
	if !errors.Is(err, ErrStorage) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("Save with failing fsync: %v", err)
	}
	cur().set(nil, nil) // even with the disk healthy again, the log stays failed
	if err := l.Save(raftpb.HardState{}, g.entries(11, 1, 1)); !errors.Is(err, ErrStorage) {
		t.Fatalf("Save after failure: %v", err)
	}
	if _, err := l.Retain(timeNow(), 1, 0, 5); !errors.Is(err, ErrStorage) {
		t.Fatalf("Retain after failure: %v", err)
	}
	// Reads still work. Entries 11..15 were written before the fsync
	// failed, so they are readable but not durable (and never acknowledged).
	if _, la := mustIndexes(t, l); la != 15 {
		t.Fatalf("published last = %d, want 15", la)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close of a failed log: %v", err)
	}
	l = mustOpen(t, opts)
	defer l.Close()
	_, la := mustIndexes(t, l)
	if la < 10 {
		t.Fatalf("lost saved entries: last = %d", la)
	}
	// Entries 11..15 were written but not acknowledged; raft may keep or
	// replace them. Continue after the durable ones.
	g2 := &gen{term: 2, next: 10, recLen: 8}
	mustSave(t, l, raftpb.HardState{Term: 2, Vote: 1, Commit: 10}, g2.entries(11, 3, 1))
	checkInvariants(t, l)
}

func TestWALWriteENOSPC(t *testing.T) {
	opts, _ := testOptions(t, t.TempDir())
	cur := withFaultWAL(&opts)
	l := mustOpen(t, opts)
	g := &gen{term: 1, recLen: 64}
	mustSave(t, l, raftpb.HardState{Term: 1, Vote: 1}, g.entries(1, 10, 1))
	cur().set(nil, &os.PathError{Op: "write", Path: "seg", Err: syscall.ENOSPC})
	err := l.Save(raftpb.HardState{}, g.entries(11, 3, 1))
	if !errors.Is(err, ErrStorage) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Save on a full disk: %v", err)
	}
	if err := l.Save(raftpb.HardState{}, nil); !errors.Is(err, ErrStorage) {
		t.Fatalf("Save after failure: %v", err)
	}
	l.Close()
	l = mustOpen(t, opts)
	defer l.Close()
	if _, la := mustIndexes(t, l); la != 10 {
		t.Fatalf("last = %d, want 10", la)
	}
	g.next = l.EndOffset()
	mustSave(t, l, raftpb.HardState{}, g.entries(11, 3, 1))
	checkInvariants(t, l)
}

func TestStateFileFaults(t *testing.T) {
	for _, tc := range []struct {
		name  string
		arm   func(fs *errorfs.FS)
		errno syscall.Errno
	}{
		{"fsync fails", func(fs *errorfs.FS) { fs.FailSync(1, nil) }, syscall.EIO},
		{"disk full", func(fs *errorfs.FS) { fs.FailWritesAfter(10) }, syscall.ENOSPC},
		{"torn write", func(fs *errorfs.FS) { fs.TearNextWrite(5, syscall.EIO) }, syscall.EIO},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			opts, _ := testOptions(t, dir)
			fs := errorfs.Wrap(OSFS)
			opts.FS = fs
			l := mustOpen(t, opts)
			g := &gen{term: 1}
			mustSave(t, l, raftpb.HardState{Term: 1, Vote: 1}, g.entries(1, 5, 1))
			tc.arm(fs)
			// A term change rewrites the state file.
			err := l.Save(raftpb.HardState{Term: 2, Vote: 2}, g.entries(6, 1, 1))
			if !errors.Is(err, ErrStorage) || !errors.Is(err, tc.errno) {
				t.Fatalf("Save: %v, want ErrStorage and %v", err, tc.errno)
			}
			if err := l.Save(raftpb.HardState{}, nil); !errors.Is(err, ErrStorage) {
				t.Fatalf("Save after failure: %v", err)
			}
			fs.Reset()
			l.Close()
			l = mustOpen(t, opts)
			defer l.Close()
			hs, _, _ := l.InitialState()
			if hs.Term != 1 && hs.Term != 2 {
				t.Fatalf("hard state %v", hs)
			}
			// The new term is written before the entries, so the failed
			// Save wrote none of them.
			if _, la := mustIndexes(t, l); la != 5 {
				t.Fatalf("last = %d, want 5", la)
			}
			mustSave(t, l, raftpb.HardState{Term: 3, Vote: 1}, g.entries(6, 1, 1))
		})
	}
}

func TestIntervalFlushSyncsInBackground(t *testing.T) {
	opts, _ := testOptions(t, t.TempDir())
	opts.Flush = FlushPolicy{Interval: 5e6} // 5ms
	cur := withFaultWAL(&opts)
	l := mustOpen(t, opts)
	g := &gen{term: 1}
	mustSave(t, l, raftpb.HardState{Term: 1}, g.entries(1, 3, 1))
	if n := syncCount(cur()); n != 0 {
		t.Fatalf("Save synced %d times under an interval policy", n)
	}
	// Wait for the flusher by polling its effect, not by sleeping blindly.
	waitFor(t, func() bool { return syncCount(cur()) > 0 })
	// A background fsync failure fails the log.
	cur().set(&os.PathError{Op: "sync", Path: "seg", Err: syscall.EIO}, nil)
	mustSave(t, l, raftpb.HardState{}, g.entries(4, 1, 1))
	waitFor(t, func() bool {
		return errors.Is(l.Save(raftpb.HardState{}, nil), ErrStorage)
	})
	l.Close()
}

func syncCount(f *faultWAL) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.syncs
}

// TestRealENOSPC fills a 2 MiB tmpfs through Save until the kernel says
// ENOSPC, then frees space and checks that close and reopen recover.
func TestRealENOSPC(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a 2m tmpfs (%v: %s); skipping the real ENOSPC test", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	// A filler file takes most of the space so that freeing it helps.
	filler := filepath.Join(mnt, "filler")
	if err := os.WriteFile(filler, make([]byte, 1<<20), 0o640); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(mnt, "group")
	opts, _ := testOptions(t, dir)
	opts.SegmentBytes = 256 << 10
	l := mustOpen(t, opts)
	g := &gen{term: 1, recLen: 1024}
	var (
		idx  uint64 = 1
		err  error
		acks uint64
	)
	for ; idx < 10000; idx += 8 {
		if err = l.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: acks}, g.entries(idx, 8, 1)); err != nil {
			break
		}
		acks = idx + 7
	}
	if err == nil {
		t.Fatal("never hit ENOSPC")
	}
	if !errors.Is(err, ErrStorage) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Save on a full tmpfs: %v", err)
	}
	t.Logf("ENOSPC after %d acknowledged entries: %v", acks, err)
	if err := l.Save(raftpb.HardState{}, nil); !errors.Is(err, ErrStorage) {
		t.Fatalf("Save after ENOSPC: %v", err)
	}
	l.Close()
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, opts)
	defer l.Close()
	_, la := mustIndexes(t, l)
	if la < acks {
		t.Fatalf("lost acknowledged entries: last = %d, acknowledged %d", la, acks)
	}
	checkInvariants(t, l)
	g2 := &gen{term: 2, next: l.EndOffset(), recLen: 1024}
	mustSave(t, l, raftpb.HardState{Term: 2, Vote: 1}, g2.entries(la+1, 8, 1))
	if _, la2 := mustIndexes(t, l); la2 != la+8 {
		t.Fatalf("last after recovery save = %d", la2)
	}
}

// An errorfs FS with IncludeWAL reaches the WAL that tidwall writes
// through package os: a failed WAL fsync or write fails the Log as the
// test wrapper's faults do, and the delay slows WAL writes and fsyncs.
func TestErrorFSReachesWAL(t *testing.T) {
	for _, tc := range []struct {
		name string
		arm  func(fs *errorfs.FS)
	}{
		{"fsync", func(fs *errorfs.FS) { fs.FailNextSyncs(0, nil) }},
		{"write", func(fs *errorfs.FS) { fs.FailWrites(syscall.EIO) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts, _ := testOptions(t, t.TempDir())
			fs := errorfs.Wrap(OSFS).IncludeWAL()
			opts.FS = fs
			l := mustOpen(t, opts)
			g := &gen{term: 1, recLen: 64}
			mustSave(t, l, raftpb.HardState{Term: 1, Vote: 1, Commit: 10}, g.entries(1, 10, 1))
			tc.arm(fs)
			// No state-file write: the hard state is unchanged, so the only
			// writes are the WAL's.
			err := l.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: 10}, g.entries(11, 2, 1))
			if !errors.Is(err, ErrStorage) || !errors.Is(err, syscall.EIO) {
				t.Fatalf("Save: %v, want ErrStorage and EIO", err)
			}
			if a := fs.Armed(); a.FailedSyncs+a.FailedWrites != 1 {
				t.Fatalf("faults hit %+v, want one", a)
			}
			// Reads go on.
			if ents, err := l.Entries(1, 11, 1<<20); err != nil || len(ents) != 10 {
				t.Fatalf("Entries after the failure: %d %v", len(ents), err)
			}
			fs.Reset()
			l.Close()
			l = mustOpen(t, opts)
			defer l.Close()
			if _, la := mustIndexes(t, l); la < 10 {
				t.Fatalf("lost saved entries: last = %d", la)
			}
		})
	}
	t.Run("delay", func(t *testing.T) {
		opts, _ := testOptions(t, t.TempDir())
		fs := errorfs.Wrap(OSFS).IncludeWAL()
		opts.FS = fs
		l := mustOpen(t, opts)
		defer l.Close()
		g := &gen{term: 1, recLen: 64}
		mustSave(t, l, raftpb.HardState{Term: 1, Vote: 1}, g.entries(1, 1, 1))
		const d = 20 * time.Millisecond
		fs.SetDelay(d)
		start := time.Now()
		mustSave(t, l, raftpb.HardState{Term: 1, Vote: 1}, g.entries(2, 1, 1))
		if took := time.Since(start); took < 2*d {
			t.Fatalf("Save on a slow disk took %v, want at least %v (a write and an fsync)", took, 2*d)
		}
	})
}
