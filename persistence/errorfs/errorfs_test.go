package errorfs

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

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
