// Package errorfs wraps a vfs.FS with faults that tests switch on and off at
// run time, in the manner of pebble's vfs/errorfs: failing fsyncs, a disk that
// fills up after N bytes (ENOSPC), and torn writes that persist only a prefix
// of a Write before failing. All methods are safe for concurrent use.
//
// Faults apply only to operations that go through the wrapper. tidwall/wal
// writes its segments through package os, so WAL faults are injected by
// package persistence's own WAL wrapper instead.
package errorfs

import (
	"os"
	"sync"
	"syscall"

	"github.com/heraldmq/herald/persistence/vfs"
)

// FS is a fault-injecting vfs.FS. The zero value is not usable; call Wrap.
type FS struct {
	inner vfs.FS

	mu sync.Mutex
	// sync faults: syncCountdown > 0 fails the syncCountdown-th next sync
	// once; syncAll fails every sync.
	syncCountdown int
	syncAll       bool
	syncErr       error
	// space: when spaceOn, at most spaceLeft more bytes are written in
	// total, after which writes fail with ENOSPC (short write first).
	spaceOn   bool
	spaceLeft int64
	// torn: when tornOn, the next Write writes only tornK bytes and fails.
	tornOn  bool
	tornK   int
	tornErr error

	syncs, writes int64
}

var _ vfs.FS = (*FS)(nil)

// Wrap returns inner with no faults armed.
func Wrap(inner vfs.FS) *FS { return &FS{inner: inner} }

// FailSync arms a sync fault: with n > 0 the n-th Sync or SyncDir from now
// (1 = the next) fails with err, once; with n == 0 every Sync and SyncDir
// fails until Reset. A nil err means EIO.
func (fs *FS) FailSync(n int, err error) {
	if err == nil {
		err = &os.PathError{Op: "sync", Path: "errorfs", Err: syscall.EIO}
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.syncErr = err
	fs.syncAll = n == 0
	fs.syncCountdown = n
}

// FailWritesAfter simulates a full disk: from now on, n more bytes may be
// written in total; the Write that crosses the limit writes the bytes that
// fit and returns ENOSPC, and every later Write returns ENOSPC.
func (fs *FS) FailWritesAfter(n int64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.spaceOn, fs.spaceLeft = true, n
}

// TearNextWrite makes the next Write persist only its first k bytes and then
// fail with err (EIO if nil). It fires once.
func (fs *FS) TearNextWrite(k int, err error) {
	if err == nil {
		err = syscall.EIO
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.tornOn, fs.tornK, fs.tornErr = true, k, err
}

// Reset disarms every fault.
func (fs *FS) Reset() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.syncCountdown, fs.syncAll, fs.syncErr = 0, false, nil
	fs.spaceOn, fs.spaceLeft = false, 0
	fs.tornOn = false
}

// Counts reports how many Syncs (including SyncDir) and Writes were
// attempted through the wrapper.
func (fs *FS) Counts() (syncs, writes int64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.syncs, fs.writes
}

func (fs *FS) syncFault(op, name string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.syncs++
	if fs.syncAll {
		return wrapErr(op, name, fs.syncErr)
	}
	if fs.syncCountdown > 0 {
		fs.syncCountdown--
		if fs.syncCountdown == 0 {
			return wrapErr(op, name, fs.syncErr)
		}
	}
	return nil
}

// writeFault decides how many bytes of a write of n bytes go through and
// which error follows them.
func (fs *FS) writeFault(n int) (int, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.writes++
	allow, err := n, error(nil)
	if fs.tornOn {
		fs.tornOn = false
		if fs.tornK < allow {
			allow = fs.tornK
		}
		err = fs.tornErr
	}
	if fs.spaceOn {
		if int64(allow) > fs.spaceLeft {
			allow = int(fs.spaceLeft)
			err = syscall.ENOSPC
		}
		fs.spaceLeft -= int64(allow)
	}
	return allow, err
}

func wrapErr(op, name string, err error) error {
	if _, ok := err.(*os.PathError); ok {
		return err
	}
	return &os.PathError{Op: op, Path: name, Err: err}
}

// OpenFile opens name through the inner FS and wraps the file.
func (fs *FS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := fs.inner.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &file{File: f, fs: fs, name: name}, nil
}

func (fs *FS) Remove(name string) error                     { return fs.inner.Remove(name) }
func (fs *FS) RemoveAll(name string) error                  { return fs.inner.RemoveAll(name) }
func (fs *FS) Rename(oldpath, newpath string) error         { return fs.inner.Rename(oldpath, newpath) }
func (fs *FS) MkdirAll(path string, perm os.FileMode) error { return fs.inner.MkdirAll(path, perm) }
func (fs *FS) ReadDir(name string) ([]os.DirEntry, error)   { return fs.inner.ReadDir(name) }
func (fs *FS) Stat(name string) (os.FileInfo, error)        { return fs.inner.Stat(name) }

// SyncDir counts as a sync for FailSync.
func (fs *FS) SyncDir(dir string) error {
	if err := fs.syncFault("syncdir", dir); err != nil {
		return err
	}
	return fs.inner.SyncDir(dir)
}

type file struct {
	vfs.File
	fs   *FS
	name string
}

func (f *file) Write(p []byte) (int, error) {
	allow, ferr := f.fs.writeFault(len(p))
	n, err := f.File.Write(p[:allow])
	if err != nil {
		return n, err
	}
	if ferr != nil {
		return n, wrapErr("write", f.name, ferr)
	}
	return n, nil
}

func (f *file) WriteAt(p []byte, off int64) (int, error) {
	allow, ferr := f.fs.writeFault(len(p))
	n, err := f.File.WriteAt(p[:allow], off)
	if err != nil {
		return n, err
	}
	if ferr != nil {
		return n, wrapErr("write", f.name, ferr)
	}
	return n, nil
}

func (f *file) Sync() error {
	if err := f.fs.syncFault("sync", f.name); err != nil {
		return err
	}
	return f.File.Sync()
}
