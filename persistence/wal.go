package persistence

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/tidwall/wal"

	"github.com/heraldmq/herald/persistence/vfs"
)

// walLog is the part of *wal.Log that Log uses. It exists so tests can wrap
// the real tidwall log and inject a failed write or fsync (tidwall/wal does
// its I/O through package os, out of reach of FS).
type walLog interface {
	WriteBatch(b *wal.Batch) error
	Read(index uint64) ([]byte, error)
	Sync() error
	TruncateFront(index uint64) error
	TruncateBack(index uint64) error
	FirstIndex() (uint64, error)
	LastIndex() (uint64, error)
	ClearCache() error
	Close() error
}

var _ walLog = (*wal.Log)(nil)

// segmentName is tidwall's file name for a segment starting at index.
func segmentName(index uint64) string { return fmt.Sprintf("%020d", index) }

// segments lists the plain segment files of dir (ignoring .START, .END and
// .TEMP leftovers that tidwall cleans up itself), ordered by first index.
func segments(fs FS, dir string) ([]string, error) {
	ents, err := fs.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || len(n) != 20 {
			continue
		}
		if idx, err := strconv.ParseUint(n, 10, 64); err != nil || idx == 0 {
			continue
		}
		names = append(names, n)
	}
	sort.Strings(names) // zero-padded: lexical order is numeric order
	return names, nil
}

// openWAL opens the tidwall log in l.walDir. If tidwall reports the log
// corrupt it repairs the files (repairFrom) and returns errRescan.
func (l *Log) openWAL() (walLog, error) {
	wo := &wal.Options{
		NoSync:           true,
		SegmentSize:      l.opts.SegmentBytes,
		LogFormat:        wal.Binary,
		SegmentCacheSize: l.opts.SegmentCacheSize,
		AllowEmpty:       true,
		DirPerms:         0o750,
		FilePerms:        0o640,
	}
	w, err := wal.Open(l.walDir, wo)
	if errors.Is(err, wal.ErrCorrupt) {
		// tidwall reads the last segment whole at open: its framing is
		// broken. A torn tail is cut; anything else is damage.
		segs, serr := l.segmentFiles()
		if serr != nil {
			return nil, storageErr("list wal segments", serr)
		}
		if len(segs) > 0 {
			if rerr := l.repairFrom(segs[len(segs)-1].first, err); rerr != nil {
				return nil, rerr
			}
		}
		return nil, fmt.Errorf("%w: wal open: %w", ErrCorrupt, err)
	}
	if err != nil {
		if errors.Is(err, wal.ErrCorrupt) {
			return nil, fmt.Errorf("%w: wal open: %w", ErrCorrupt, err)
		}
		return nil, storageErr("wal open", err)
	}
	var wl walLog = w
	if l.opts.wrapWAL != nil {
		wl = l.opts.wrapWAL(wl)
	}
	if h, ok := l.fs.(vfs.WALHook); ok {
		wl = &hookedWAL{walLog: wl, hook: h, dir: l.walDir}
	}
	return wl, nil
}

// hookedWAL asks a fault-injecting FS (vfs.WALHook) before each batch
// write and fsync of the WAL. Only a test or chaos FS implements the
// hook; a log on the real filesystem never has this wrapper.
type hookedWAL struct {
	walLog
	hook vfs.WALHook
	dir  string
}

func (w *hookedWAL) WriteBatch(b *wal.Batch) error {
	if err := w.hook.BeforeWALWrite(w.dir); err != nil {
		return err
	}
	return w.walLog.WriteBatch(b)
}

func (w *hookedWAL) Sync() error {
	if err := w.hook.BeforeWALSync(w.dir); err != nil {
		return err
	}
	return w.walLog.Sync()
}

// resetWALDir replaces the WAL directory with an empty log whose first
// index is first: an empty segment named after first (the tidwall way to
// start a log at N), made durable before returning.
func (l *Log) resetWALDir(first uint64) error {
	if err := l.fs.RemoveAll(l.walDir); err != nil {
		return err
	}
	if err := l.fs.MkdirAll(l.walDir, 0o750); err != nil {
		return err
	}
	f, err := l.fs.OpenFile(filepath.Join(l.walDir, segmentName(first)), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o640)
	if err != nil {
		return err
	}
	if err := l.syncFile(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := l.syncDir(l.walDir); err != nil {
		return err
	}
	return l.syncDir(l.opts.Dir)
}

// tailSegmentBytes returns the size of the last segment file, which tidwall
// holds in memory; Log tracks it to notice segment rolls.
func (l *Log) tailSegmentBytes() (int64, error) {
	names, err := segments(l.fs, l.walDir)
	if err != nil || len(names) == 0 {
		return 0, err
	}
	fi, err := l.fs.Stat(filepath.Join(l.walDir, names[len(names)-1]))
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}
