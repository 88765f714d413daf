package errorfs

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/heraldmq/herald/persistence/vfs"
)

func TestFaults(t *testing.T) {
	dir := t.TempDir()
	fs := Wrap(vfs.Default)
	f, err := fs.OpenFile(filepath.Join(dir, "f"), os.O_CREATE|os.O_RDWR, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	fs.FailSync(2, nil)
	if err := f.Sync(); err != nil {
		t.Fatalf("first sync: %v", err)
	}
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("second sync: %v", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("third sync: %v", err)
	}
	fs.FailSync(0, syscall.EROFS)
	if err := fs.SyncDir(dir); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("syncdir: %v", err)
	}
	fs.Reset()

	fs.TearNextWrite(3, nil)
	if n, err := f.Write([]byte("abcdef")); n != 3 || !errors.Is(err, syscall.EIO) {
		t.Fatalf("torn write: %d %v", n, err)
	}
	fs.FailWritesAfter(4)
	if n, err := f.Write([]byte("gh")); n != 2 || err != nil {
		t.Fatalf("write within space: %d %v", n, err)
	}
	if n, err := f.Write([]byte("ijkl")); n != 2 || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write crossing space: %d %v", n, err)
	}
	if n, err := f.Write([]byte("m")); n != 0 || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write on full disk: %d %v", n, err)
	}
	fs.Reset()
	b, _ := os.ReadFile(filepath.Join(dir, "f"))
	if string(b) != "abcghij" {
		t.Fatalf("file holds %q", b)
	}
	if s, w := fs.Counts(); s != 4 || w != 4 {
		t.Fatalf("counts %d %d", s, w)
	}
}

// FailNextSyncs fails each of the next n syncs (every one with n == 0);
// FailWrites fails writes with nothing written; Armed reports both.
func TestLastingFaults(t *testing.T) {
	dir := t.TempDir()
	fs := Wrap(vfs.Default)
	f, err := fs.OpenFile(filepath.Join(dir, "f"), os.O_CREATE|os.O_RDWR, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	fs.FailNextSyncs(3, nil)
	if a := fs.Armed(); !errors.Is(a.SyncErr, syscall.EIO) || a.SyncNext != 3 || a.SyncAll {
		t.Fatalf("armed %+v", a)
	}
	for i := range 3 {
		if err := f.Sync(); !errors.Is(err, syscall.EIO) {
			t.Fatalf("sync %d of 3 failing: %v", i+1, err)
		}
	}
	if err := fs.SyncDir(dir); err != nil {
		t.Fatalf("fourth sync: %v", err)
	}
	if a := fs.Armed(); a.SyncErr != nil || a.FailedSyncs != 3 {
		t.Fatalf("armed after the faults ran out: %+v", a)
	}
	fs.FailNextSyncs(0, syscall.EROFS)
	for i := range 5 {
		if err := f.Sync(); !errors.Is(err, syscall.EROFS) {
			t.Fatalf("sync %d with every sync failing: %v", i, err)
		}
	}
	if a := fs.Armed(); !a.SyncAll || a.FailedSyncs != 8 {
		t.Fatalf("armed %+v", a)
	}

	fs.FailWrites(syscall.EIO)
	if n, err := f.Write([]byte("abc")); n != 0 || !errors.Is(err, syscall.EIO) {
		t.Fatalf("failing write: %d %v", n, err)
	}
	if n, err := f.WriteAt([]byte("abc"), 0); n != 0 || !errors.Is(err, syscall.EIO) {
		t.Fatalf("failing write at: %d %v", n, err)
	}
	fs.Reset()
	if a := fs.Armed(); a.SyncErr != nil || a.WriteErr != nil || a.Delay != 0 || a.FailedWrites != 2 {
		t.Fatalf("armed after Reset: %+v", a)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if n, err := f.Write([]byte("ok")); n != 2 || err != nil {
		t.Fatalf("write after Reset: %d %v", n, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "ok" {
		t.Fatalf("file holds %q", b)
	}
}

// SetDelay delays writes and syncs, not reads.
func TestDelay(t *testing.T) {
	dir := t.TempDir()
	fs := Wrap(vfs.Default)
	f, err := fs.OpenFile(filepath.Join(dir, "f"), os.O_CREATE|os.O_RDWR, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const d = 30 * time.Millisecond
	fs.SetDelay(d)
	start := time.Now()
	if _, err := f.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 2*d {
		t.Fatalf("a delayed write and sync took %v, want at least %v", took, 2*d)
	}
	if _, err := f.ReadAt(make([]byte, 1), 0); err != nil {
		t.Fatal(err)
	}
	if a := fs.Armed(); a.Delay != d || a.Delayed != 2 {
		t.Fatalf("armed %+v, want the delay and 2 delayed operations", a)
	}
	fs.SetDelay(0)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if a := fs.Armed(); a.Delayed != 2 {
		t.Fatalf("delayed %d after the delay was removed", a.Delayed)
	}
}

// The WAL hooks do nothing until IncludeWAL; then WAL syncs count with the
// file syncs and WAL writes fail with FailWrites.
func TestWALHook(t *testing.T) {
	fs := Wrap(vfs.Default)
	fs.FailNextSyncs(0, nil)
	fs.FailWrites(syscall.EIO)
	if err := fs.BeforeWALSync("wal"); err != nil {
		t.Fatalf("WAL sync before IncludeWAL: %v", err)
	}
	if err := fs.BeforeWALWrite("wal"); err != nil {
		t.Fatalf("WAL write before IncludeWAL: %v", err)
	}
	fs.IncludeWAL().Reset()
	fs.FailNextSyncs(2, nil)
	for i := range 2 {
		if err := fs.BeforeWALSync("wal"); !errors.Is(err, syscall.EIO) {
			t.Fatalf("WAL sync %d: %v", i, err)
		}
	}
	if err := fs.BeforeWALSync("wal"); err != nil {
		t.Fatalf("third WAL sync: %v", err)
	}
	fs.FailWrites(syscall.EIO)
	if err := fs.BeforeWALWrite("wal"); !errors.Is(err, syscall.EIO) {
		t.Fatalf("WAL write: %v", err)
	}
	if s, w := fs.Counts(); s != 3 || w != 1 {
		t.Fatalf("counts %d %d", s, w)
	}
}
