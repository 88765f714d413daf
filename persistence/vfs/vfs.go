// Package vfs is the small filesystem interface that package persistence
// uses for every file operation Herald performs itself (state files, tail
// repair, directory syncs), so tests can substitute a fault-injecting
// implementation (see persistence/errorfs). It lives in its own package so
// that errorfs and persistence can both depend on it without a cycle;
// persistence re-exports FS and File as aliases.
package vfs

import (
	"io"
	"os"
)

// FS is how persistence reaches the filesystem. Implementations must be safe
// for concurrent use.
type FS interface {
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	Remove(name string) error
	RemoveAll(name string) error
	Rename(oldpath, newpath string) error
	MkdirAll(path string, perm os.FileMode) error
	ReadDir(name string) ([]os.DirEntry, error)
	Stat(name string) (os.FileInfo, error)
	// SyncDir fsyncs the directory dir, making creations, renames and
	// removals of its entries durable.
	SyncDir(dir string) error
}

// WALHook is implemented by an FS that injects faults into the WAL as
// well. tidwall/wal writes its segments through package os, out of any
// FS's reach, so package persistence asks an FS that implements WALHook
// before each WAL batch write and each WAL fsync; the real filesystem
// does not implement it, and a WAL opened on it has no hook at all.
type WALHook interface {
	// BeforeWALWrite is called before a batch is written to the WAL in
	// dir. A non-nil error fails the write, and nothing is written.
	BeforeWALWrite(dir string) error
	// BeforeWALSync is called before the WAL in dir is fsynced. A non-nil
	// error fails the fsync, which is not attempted.
	BeforeWALSync(dir string) error
}

// File is an open file of an FS.
type File interface {
	io.Reader
	io.Writer
	io.ReaderAt
	io.WriterAt
	io.Closer
	Sync() error
	Truncate(size int64) error
	Stat() (os.FileInfo, error)
}

// Default is the operating system's filesystem (package os).
var Default FS = osFS{}

type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return f, nil
}

func (osFS) Remove(name string) error                     { return os.Remove(name) }
func (osFS) RemoveAll(name string) error                  { return os.RemoveAll(name) }
func (osFS) Rename(oldpath, newpath string) error         { return os.Rename(oldpath, newpath) }
func (osFS) MkdirAll(path string, perm os.FileMode) error { return os.MkdirAll(path, perm) }
func (osFS) ReadDir(name string) ([]os.DirEntry, error)   { return os.ReadDir(name) }
func (osFS) Stat(name string) (os.FileInfo, error)        { return os.Stat(name) }

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return err
	}
	return d.Close()
}
