// Package errorfs wraps a vfs.FS with faults that tests switch on and off at
// run time, in the manner of pebble's vfs/errorfs: failing fsyncs, failing
// writes, a disk that fills up after N bytes (ENOSPC), torn writes that
// persist only a prefix of a Write before failing, and a slow disk. All
// methods are safe for concurrent use.
//
// Faults apply to operations that go through the wrapper. tidwall/wal
// writes its segments through package os, out of the wrapper's reach; after
// IncludeWAL, package persistence asks the wrapper before every WAL write
// and fsync (vfs.WALHook), so the delay, the sync faults and FailWrites
// reach the WAL too. Space (FailWritesAfter) and torn writes stay on the
// files the wrapper opens.
package errorfs

import (
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/heraldmq/herald/persistence/vfs"
)

// FS is a fault-injecting vfs.FS. The zero value is not usable; call Wrap.
type FS struct {
	inner vfs.FS

	mu sync.Mutex
	// sync faults: syncCountdown > 0 fails the syncCountdown-th next sync
	// once; syncNext > 0 fails each of the next syncNext syncs; syncAll
	// fails every sync.
	syncCountdown int
	syncNext      int
	syncAll       bool
	syncErr       error
	// writeErr, when set, fails every write before it writes anything.
	writeErr error
	// delay is waited before every write and sync.
	delay time.Duration
	// wal: the faults also apply to the WAL (vfs.WALHook).
	wal bool
	// space: when spaceOn, at most spaceLeft more bytes are written in
	// total, after which writes fail with ENOSPC (short write first).
	spaceOn   bool
	spaceLeft int64
	// torn: when tornOn, the next Write writes only tornK bytes and fails.
	tornOn  bool
	tornK   int
	tornErr error

	syncs, writes             int64
	failedSyncs, failedWrites int64
	delayed                   int64
}

var (
	_ vfs.FS      = (*FS)(nil)
	_ vfs.WALHook = (*FS)(nil)
)

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
	fs.syncNext = 0
}

// FailNextSyncs arms a sync fault that lasts: with n > 0 each of the next
// n Syncs and SyncDirs fails with err, after which syncs succeed again;
// with n == 0 every one fails until Reset. A nil err means EIO. It
// replaces a fault armed by FailSync or FailNextSyncs.
func (fs *FS) FailNextSyncs(n int, err error) {
	if err == nil {
		err = syscall.EIO
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.syncErr = err
	fs.syncAll = n == 0
	fs.syncCountdown = 0
	fs.syncNext = max(n, 0)
}

// ClearSyncFaults disarms the sync faults armed by FailSync and
// FailNextSyncs, and leaves the others.
func (fs *FS) ClearSyncFaults() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.syncCountdown, fs.syncNext, fs.syncAll, fs.syncErr = 0, 0, false, nil
}

// FailWrites makes every Write and WriteAt (and, after IncludeWAL, every
// WAL write) fail with err, writing nothing, until Reset or
// FailWrites(nil). A disk whose writes fail but whose reads work.
func (fs *FS) FailWrites(err error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.writeErr = err
}

// SetDelay makes every write and sync through the wrapper (and, after
// IncludeWAL, every WAL write and fsync) wait d before it starts: a slow
// disk. 0 removes the delay. Reads are not delayed.
func (fs *FS) SetDelay(d time.Duration) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.delay = max(d, 0)
}

// IncludeWAL makes the faults apply to the WAL of a persistence.Log opened
// on this FS as well (see the package comment), and returns fs.
func (fs *FS) IncludeWAL() *FS {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.wal = true
	return fs
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
	fs.syncCountdown, fs.syncNext, fs.syncAll, fs.syncErr = 0, 0, false, nil
	fs.spaceOn, fs.spaceLeft = false, 0
	fs.tornOn = false
	fs.writeErr = nil
	fs.delay = 0
}

// Armed describes the faults armed right now, and what they did so far.
type Armed struct {
	// SyncErr is the error syncs fail with, nil when no sync fault is
	// armed. SyncAll: every sync fails; else SyncNext more syncs fail
	// (FailNextSyncs), or the SyncCountdown-th next one does (FailSync).
	SyncErr       error
	SyncAll       bool
	SyncNext      int
	SyncCountdown int
	// WriteErr is the error every write fails with (FailWrites), or nil.
	WriteErr error
	// Delay is waited before every write and sync.
	Delay time.Duration
	// FailedSyncs, FailedWrites and Delayed count the syncs and writes
	// failed and the operations delayed since Wrap.
	FailedSyncs, FailedWrites, Delayed int64
}

// Armed reports the faults armed now.
func (fs *FS) Armed() Armed {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	a := Armed{WriteErr: fs.writeErr, Delay: fs.delay, FailedSyncs: fs.failedSyncs, FailedWrites: fs.failedWrites, Delayed: fs.delayed}
	if fs.syncAll || fs.syncNext > 0 || fs.syncCountdown > 0 {
		a.SyncErr, a.SyncAll, a.SyncNext, a.SyncCountdown = fs.syncErr, fs.syncAll, fs.syncNext, fs.syncCountdown
	}
	return a
}

// Counts reports how many Syncs (including SyncDir) and Writes were
// attempted through the wrapper, with the WAL's fsyncs and batch writes
// after IncludeWAL.
func (fs *FS) Counts() (syncs, writes int64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.syncs, fs.writes
}

// wait sleeps for the armed delay, if any: the slow disk is the fault.
// Called without fs.mu held.
func (fs *FS) wait() {
	fs.mu.Lock()
	d := fs.delay
	if d > 0 {
		fs.delayed++
	}
	fs.mu.Unlock()
	if d > 0 {
		time.Sleep(d)
	}
}

func (fs *FS) syncFault(op, name string) error {
	fs.wait()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.syncs++
	fail := false
	switch {
	case fs.syncAll:
		fail = true
	case fs.syncNext > 0:
		fs.syncNext--
		fail = true
	case fs.syncCountdown > 0:
		fs.syncCountdown--
		fail = fs.syncCountdown == 0
	}
	if !fail {
		return nil
	}
	fs.failedSyncs++
	return wrapErr(op, name, fs.syncErr)
}

// writeFault decides how many bytes of a write of n bytes go through and
// which error follows them.
func (fs *FS) writeFault(n int) (int, error) {
	fs.wait()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.writes++
	if fs.writeErr != nil {
		fs.failedWrites++
		return 0, fs.writeErr
	}
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

// BeforeWALWrite implements vfs.WALHook: after IncludeWAL, a WAL write
// waits out the delay and fails with the FailWrites error.
func (fs *FS) BeforeWALWrite(dir string) error {
	if !fs.coversWAL() {
		return nil
	}
	fs.wait()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.writes++
	if fs.writeErr != nil {
		fs.failedWrites++
		return wrapErr("write", dir, fs.writeErr)
	}
	return nil
}

// BeforeWALSync implements vfs.WALHook: after IncludeWAL, a WAL fsync
// counts as a sync for FailSync and FailNextSyncs and waits out the delay.
func (fs *FS) BeforeWALSync(dir string) error {
	if !fs.coversWAL() {
		return nil
	}
	return fs.syncFault("sync", dir)
}

func (fs *FS) coversWAL() bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.wal
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
