// Package persistence is the durable raft log of one raft group: a
// tidwall/wal log in which WAL entry i is raft entry i, plus a small atomic
// state file for the HardState, ConfState and snapshot point. A *Log is the
// group's raft.Storage and its message store: readers find record batches by
// offset through a sparse index and by time through a time index, both
// rebuilt on Open.
//
// Ownership: one goroutine, the partition actor that drives the RawNode, is
// the owner. Only it calls Save, SetConfState, ApplySnapshot, Retain, Sync and
// Close. Every other method is safe for concurrent use from any goroutine,
// including while the owner saves.
//
// Durability: with FlushPolicy "always" a Save that returns nil is on disk
// (one fsync for the whole Ready). A crash at any instant leaves a directory
// that Open recovers: a torn or corrupt tail is cut back to the last whole,
// valid entry; nothing before it is lost.
package persistence

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/wal"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Log is the durable raft log of one raft group. See the package comment for
// who may call what.
type Log struct {
	opts      Options
	fs        FS
	log       *slog.Logger
	walDir    string
	statePath string
	errs      prometheus.Counter
	retained  prometheus.Counter

	// wmu serialises the owner's mutations with the background flusher.
	wmu sync.Mutex
	// rmu serialises wal.Read: tidwall/wal mutates its segment cache under
	// its read lock, so concurrent reads of older segments race.
	rmu sync.Mutex

	// mu guards the fields below. Readers hold it shared for the whole of a
	// read, including WAL reads; the owner takes it exclusively only to
	// publish changes, never across a WAL write or fsync.
	mu     sync.RWMutex
	wal    walLog
	closed bool
	failed error
	hs     raftpb.HardState
	cs     raftpb.ConfState
	// noted is the membership the owner's raft node applied and the log
	// has not saved yet (NoteConfState); index 0: none.
	noted confAt
	snap  diskState // snapshot point (snapIndex, snapTerm, snapOffset)
	first uint64    // FirstIndex = snap.snapIndex+1
	last  uint64    // LastIndex
	ix    indexes
	cache entryCache
	// damage is the log's damage record (damage.go); nil if whole.
	damage *Damage
	// commitCap, when set, bounds the commit index written (AcceptDamage,
	// until the owner reopens the log).
	commitCap uint64
	// openTerm is the state file's term while Open runs (damage.go).
	openTerm uint64
	// readCorrupt is the first corruption a live read found.
	readCorrupt atomic.Pointer[error]

	// Owner-only state (under wmu).
	persisted       diskState // what the state file holds
	stateFile       File      // the state file, open for slot writes (state.go)
	stateSeq        uint64    // the sequence number of the newest slot written
	dirty           bool      // WAL written since the last fsync
	unsyncedEntries int       // entries written since the last fsync (batch-size metric)
	unsyncedBytes   int64     // their WAL bytes
	dirDirty        bool      // a segment was created since the last directory sync
	tailBytes       int64     // bytes of the tail segment, mirrors tidwall's roll rule
	batch           wal.Batch
	stopFlusher     chan struct{}
	flusherDone     chan struct{}
	stopOnce        sync.Once
}

// Open opens (creating if missing) the log in opts.Dir and recovers it:
// it finishes an interrupted snapshot install or retention, cuts a torn WAL
// tail, verifies every entry's CRC32C and encoding and truncates at the
// first bad one (logging a warning with its index), and rebuilds the indexes.
// A torn or corrupt tail never makes Open fail; a missing disk, a corrupt
// state file or an unusable directory does.
func Open(opts Options) (*Log, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	l := &Log{
		opts:      opts,
		fs:        opts.FS,
		log:       opts.Logger,
		walDir:    filepath.Join(opts.Dir, "wal"),
		statePath: filepath.Join(opts.Dir, "state"),
		errs:      storageErrors.WithLabelValues(opts.Group),
		retained:  retentionRemoved.WithLabelValues(opts.Group),
	}
	l.cache.max = opts.CacheBytes
	if err := l.recover(); err != nil {
		if l.wal != nil {
			l.wal.Close()
		}
		return nil, err
	}
	if opts.Flush.Interval > 0 {
		l.stopFlusher = make(chan struct{})
		l.flusherDone = make(chan struct{})
		go l.flusher(opts.Flush.Interval)
	}
	return l, nil
}

// recover opens and checks the log, repairing it (damage.go) and opening it
// again after each repair.
func (l *Log) recover() error {
	for attempt := 0; ; attempt++ {
		err := l.recoverOnce()
		if !errors.Is(err, errRescan) {
			return err
		}
		if l.wal != nil {
			l.wal.Close()
			l.wal = nil
		}
		if attempt >= 64 {
			return corruptf("the log still fails its checks after %d repairs", attempt+1)
		}
	}
}

func (l *Log) recoverOnce() error {
	if err := l.fs.MkdirAll(l.opts.Dir, 0o750); err != nil {
		return storageErr("create dir", err)
	}
	if err := l.fs.Remove(l.statePath + ".tmp"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return storageErr("remove temp state", err)
	}
	st, found, err := l.readState()
	if err != nil {
		return err
	}
	l.openTerm = st.hs.Term
	if l.damage, err = l.readDamage(); err != nil {
		return err
	}
	if st.resetting {
		l.log.Warn("persistence: finishing interrupted snapshot install", "group", l.opts.Group, "first_index", st.snapIndex+1)
		if err := l.resetWALDir(st.snapIndex + 1); err != nil {
			return storageErr("reset wal", err)
		}
	}
	if l.wal, err = l.openWAL(); err != nil {
		return err
	}
	wf, err := l.wal.FirstIndex()
	if err != nil {
		return storageErr("wal first index", err)
	}
	wl, err := l.wal.LastIndex()
	if err != nil {
		return storageErr("wal last index", err)
	}
	switch {
	case wf <= st.snapIndex && wl > st.snapIndex:
		// Retention wrote the state file but did not finish truncating.
		l.log.Info("persistence: finishing interrupted front truncation", "group", l.opts.Group, "wal_first", wf, "first_index", st.snapIndex+1)
		if err := l.wal.TruncateFront(st.snapIndex + 1); err != nil {
			return storageErr("wal truncate front", err)
		}
	case wf <= st.snapIndex:
		// Every WAL entry is covered by the snapshot point.
		l.log.Info("persistence: wal is behind the snapshot point, starting empty", "group", l.opts.Group, "wal_last", wl, "first_index", st.snapIndex+1)
		if err := l.reopenEmpty(st.snapIndex + 1); err != nil {
			return err
		}
		wl = st.snapIndex
	case wf > st.snapIndex+1:
		return corruptf("wal starts at index %d but the state file's snapshot point is %d", wf, st.snapIndex)
	}

	l.snap = st
	l.hs, l.cs = st.hs, st.cs
	l.first, l.last = st.snapIndex+1, st.snapIndex
	l.ix = indexes{startOffset: st.snapOffset, endOffset: st.snapOffset}
	if err := l.scan(wl); err != nil {
		return err
	}
	if err := l.settleDamage(); err != nil {
		return err
	}
	// Raft needs snapIndex <= Commit <= LastIndex; a cut tail can leave a
	// larger commit, which is safe to lower.
	l.hs.Commit = min(max(l.hs.Commit, l.snap.snapIndex), l.last)
	l.snap.resetting = false
	if !found || st.resetting {
		if err := l.writeState(l.currentState()); err != nil {
			return err
		}
	} else {
		l.persisted = st
	}
	if l.tailBytes, err = l.tailSegmentBytes(); err != nil {
		return storageErr("stat tail segment", err)
	}
	l.log.Debug("persistence: opened", "group", l.opts.Group, "first_index", l.first, "last_index", l.last,
		"start_offset", l.ix.startOffset, "end_offset", l.ix.endOffset, "bytes", l.ix.size)
	return nil
}

// reopenEmpty replaces the WAL with an empty one starting at first.
func (l *Log) reopenEmpty(first uint64) error {
	if l.wal != nil {
		if err := l.wal.Close(); err != nil {
			l.log.Warn("persistence: closing wal before reset", "group", l.opts.Group, "err", err)
		}
		l.wal = nil
	}
	if err := l.resetWALDir(first); err != nil {
		return storageErr("reset wal", err)
	}
	w, err := l.openWAL()
	if err != nil {
		return err
	}
	l.wal = w
	return nil
}

// scan reads every entry from l.first to wl, verifying it, and builds the
// indexes. At the first bad entry it closes the WAL and repairs the files
// (repairFrom), and recover opens them again.
func (l *Log) scan(wl uint64) error {
	interval := int64(l.opts.IndexIntervalBytes)
	var gapWarned bool
	for i := l.first; i <= wl; i++ {
		data, err := l.wal.Read(i)
		var (
			e       raftpb.Entry
			m       entryMeta
			records []byte
		)
		if err == nil {
			e, m, records, err = decodeEntry(data)
		}
		if err == nil && e.Index != i {
			err = corruptf("entry at wal index %d says index %d", i, e.Index)
		}
		if err == nil && len(l.ix.terms) > 0 && e.Term < l.ix.terms[len(l.ix.terms)-1].term {
			err = corruptf("entry %d has term %d below the previous term %d", i, e.Term, l.ix.terms[len(l.ix.terms)-1].term)
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, wal.ErrCorrupt) {
				return storageErr(fmt.Sprintf("read wal entry %d", i), err)
			}
			// A torn tail is cut; anything else is damage (damage.go).
			l.wal.Close()
			l.wal = nil
			if rerr := l.repairFrom(i, err); rerr != nil {
				return rerr
			}
			return errRescan
		}
		if m.hasRecords && m.end() > l.ix.endOffset && m.base != l.ix.endOffset && !gapWarned {
			gapWarned = true
			l.log.Warn("persistence: offsets are not contiguous", "group", l.opts.Group, "index", i, "base_offset", m.base, "expected", l.ix.endOffset)
		}
		l.ix.add(&m, interval)
		l.cache.push(cachedEntry{e: e, m: m, records: records})
		l.last = i
	}
	return nil
}

func (l *Log) currentState() diskState {
	return diskState{hs: l.hs, cs: l.cs, snapIndex: l.snap.snapIndex, snapTerm: l.snap.snapTerm, snapOffset: l.snap.snapOffset,
		snapCS: l.snap.snapCS, confs: slices.Clone(l.snap.confs), gapFrom: l.snap.gapFrom, gapTo: l.snap.gapTo}
}

// membershipAt returns the membership as of index i (at or after the
// snapshot point) and the history after it; ok is false inside a gap
// where it is no longer known (see diskState).
func (st *diskState) membershipAt(i uint64) (cs raftpb.ConfState, rest []confAt, ok bool) {
	if st.gapTo > 0 && i >= st.gapFrom && i < st.gapTo {
		return cs, nil, false
	}
	cs = st.snapCS
	k := 0
	for k < len(st.confs) && st.confs[k].index <= i {
		cs = st.confs[k].cs
		k++
	}
	return cs, st.confs[k:], true
}

func (l *Log) syncFile(f File) error {
	t := time.Now()
	err := f.Sync()
	fsyncSeconds.Observe(time.Since(t).Seconds())
	return err
}

func (l *Log) syncDir(dir string) error {
	t := time.Now()
	err := l.fs.SyncDir(dir)
	fsyncSeconds.Observe(time.Since(t).Seconds())
	return err
}

// syncWAL fsyncs the WAL and, if a segment was created since the last
// call, the WAL directory. Owner or flusher, under wmu.
func (l *Log) syncWAL() error {
	t := time.Now()
	err := l.wal.Sync()
	fsyncSeconds.Observe(time.Since(t).Seconds())
	if err != nil {
		return storageErr("wal sync", err)
	}
	// One group commit: everything written since the last fsync.
	saveBatchEntries.Observe(float64(l.unsyncedEntries))
	saveBatchBytes.Observe(float64(l.unsyncedBytes))
	l.unsyncedEntries, l.unsyncedBytes = 0, 0
	l.dirty = false
	if l.dirDirty {
		if err := l.syncDir(l.walDir); err != nil {
			return storageErr("sync wal dir", err)
		}
		l.dirDirty = false
	}
	return nil
}

// fail marks the log failed with err (which wraps ErrStorage) and returns it.
func (l *Log) fail(err error) error {
	l.mu.Lock()
	if l.failed == nil {
		l.failed = err
	}
	l.mu.Unlock()
	l.errs.Inc()
	l.log.Error("persistence: storage failure, log refuses writes until reopened", "group", l.opts.Group, "err", err)
	return err
}

// checkWritable returns ErrClosed or the recorded failure. Owner, under wmu.
func (l *Log) checkWritable() error {
	if l.closed {
		return ErrClosed
	}
	if l.failed != nil {
		return fmt.Errorf("%w: log failed earlier, close and reopen it: %w", ErrStorage, l.failed)
	}
	return nil
}

// flusher fsyncs the WAL every interval under the interval flush policy.
func (l *Log) flusher(every time.Duration) {
	defer close(l.flusherDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.stopFlusher:
			return
		case <-t.C:
			l.wmu.Lock()
			if l.dirty && l.checkWritable() == nil {
				if err := l.syncWAL(); err != nil {
					l.fail(err)
				}
			}
			l.wmu.Unlock()
		}
	}
}

// Save persists one raft Ready: entries first, then the hard state. Only the
// owner may call it.
//
// If entries[0].Index <= LastIndex, the conflicting suffix is truncated
// first. Under FlushPolicy "always" the call makes one fsync for all the
// entries (plus one for the state file when Term, Vote or ConfState changed,
// and one of the WAL directory when a new segment was started); under an
// interval policy it makes none and a background flusher syncs. Commit is
// persisted lazily: on the next state-file write, Retain or Close.
//
// Save keeps references to the entries' Data (in its cache): the caller must
// not modify them afterwards. Invalid entries (a gap, an index below
// FirstIndex, Data that is not a heraldpb.LogEntry) return ErrBadEntry and
// write nothing. Any disk failure returns an error wrapping ErrStorage and the
// OS error; the Log is then failed and every later Save returns ErrStorage
// until the owner Closes and re-Opens it.
func (l *Log) Save(hs raftpb.HardState, entries []raftpb.Entry) error {
	if err := l.Write(hs, entries); err != nil {
		return err
	}
	return l.Flush()
}

// Write is Save without the fsync: the entries and hard state are written
// (the hard state made durable at once when its term or vote changed) but
// the WAL is synced only by a later Flush, Sync or the interval flusher.
// A writer that has several raft Readies to persist Writes each and then
// Flushes once: group commit across Readies. Owner only.
func (l *Log) Write(hs raftpb.HardState, entries []raftpb.Entry) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.checkWritable(); err != nil {
		return err
	}
	// A new term or vote is made durable before the entries: a crash in
	// between leaves a term with no entries of it (safe), never entries of
	// a term this node has no durable record of being in, nor a vote it
	// could cast twice. A commit index ahead of the saved entries is
	// clamped to LastIndex by InitialState.
	if !raft.IsEmptyHardState(hs) {
		l.mu.Lock()
		if l.commitCap > 0 {
			hs.Commit = min(hs.Commit, l.commitCap)
		}
		l.hs = hs
		l.mu.Unlock()
		if hs.Term != l.persisted.hs.Term || hs.Vote != l.persisted.hs.Vote {
			if err := l.writeState(l.currentState()); err != nil {
				return l.fail(err)
			}
		}
	}
	if len(entries) > 0 {
		if err := l.saveEntries(entries); err != nil {
			return err
		}
	}
	return nil
}

// Flush makes everything written so far durable under the flush policy:
// an fsync under "always", nothing under "interval" (the background
// flusher syncs). Owner only.
func (l *Log) Flush() error {
	if l.opts.Flush.Interval > 0 {
		return nil
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.checkWritable(); err != nil {
		return err
	}
	if !l.dirty {
		return nil
	}
	if err := l.syncWAL(); err != nil {
		return l.fail(err)
	}
	return nil
}

func (l *Log) saveEntries(entries []raftpb.Entry) error {
	first := entries[0].Index
	if first < l.first {
		return fmt.Errorf("%w: entry %d is below first index %d", ErrBadEntry, first, l.first)
	}
	if first > l.last+1 {
		return fmt.Errorf("%w: entry %d leaves a gap after last index %d", ErrBadEntry, first, l.last)
	}
	metas := make([]cachedEntry, len(entries))
	for i := range entries {
		e := &entries[i]
		if e.Index != first+uint64(i) {
			return fmt.Errorf("%w: entry %d follows %d", ErrBadEntry, e.Index, first+uint64(i)-1)
		}
		m, records, err := entryMetaOf(e)
		if err != nil {
			return fmt.Errorf("%w: entry %d: %w", ErrBadEntry, e.Index, err)
		}
		metas[i] = cachedEntry{e: *e, m: m, records: records}
	}
	if first <= l.last {
		if err := l.truncateBack(first - 1); err != nil {
			return l.fail(err)
		}
	}

	l.batch.Clear()
	var bytes int64
	rolled := false
	if l.tailBytes > int64(l.opts.SegmentBytes) {
		l.tailBytes, rolled = 0, true
	}
	for i := range entries {
		// Encoded straight into the batch: one copy of the data fewer.
		n := encodedSize(&entries[i])
		encodeEntry(l.batch.Append(entries[i].Index, n), &entries[i])
		metas[i].m.size = framedSize(n)
		bytes += metas[i].m.size
		// tidwall starts a new segment once the tail reaches SegmentSize.
		if l.tailBytes += metas[i].m.size; l.tailBytes >= int64(l.opts.SegmentBytes) {
			l.tailBytes, rolled = 0, true
		}
	}
	if err := l.wal.WriteBatch(&l.batch); err != nil {
		return l.fail(storageErr("wal write", err))
	}
	l.dirty = true
	l.dirDirty = l.dirDirty || rolled
	l.unsyncedEntries += len(entries)
	l.unsyncedBytes += bytes

	interval := int64(l.opts.IndexIntervalBytes)
	l.mu.Lock()
	for i := range metas {
		l.ix.add(&metas[i].m, interval)
		l.cache.push(metas[i])
	}
	l.last = entries[len(entries)-1].Index
	l.mu.Unlock()
	return nil
}

// truncateBack removes entries after t (l.first-1 <= t < l.last): it
// unpublishes them first, so readers stop looking, then truncates the WAL.
// Owner only.
func (l *Log) truncateBack(t uint64) error {
	ix := l.ix.clone()
	k := ix.pointFor(t)
	ix.points = ix.points[:k+1]
	firstCum := ix.endCum - ix.size
	if k < 0 {
		ix.endCum, ix.size, ix.endOffset = firstCum, 0, ix.startOffset
	} else {
		p := &ix.points[k]
		p.maxTs, p.maxAppend, p.minRef = math.MinInt64, math.MinInt64, math.MaxUint64
		cum, off := p.cum, p.off
		for i := p.idx; i <= t; i++ {
			ce, err := l.readEntry(i)
			if err != nil {
				return err
			}
			if ce.m.hasRecords {
				p.maxTs = max(p.maxTs, ce.m.maxTsMs)
				p.maxAppend = max(p.maxAppend, ce.m.appendMs)
				off = max(off, ce.m.end())
			}
			for _, r := range ce.m.refs {
				p.minRef = min(p.minRef, r)
			}
			cum += ce.m.size
		}
		ix.endCum, ix.endOffset = cum, off
		ix.size = cum - firstCum
	}
	for len(ix.terms) > 0 && ix.terms[len(ix.terms)-1].start > t {
		ix.terms = ix.terms[:len(ix.terms)-1]
	}
	l.mu.Lock()
	l.ix = ix
	l.last = t
	l.cache.truncateBack(t)
	l.mu.Unlock()
	l.log.Debug("persistence: truncating conflicting suffix", "group", l.opts.Group, "last_index", t)
	if err := l.wal.TruncateBack(t); err != nil {
		return storageErr("wal truncate back", err)
	}
	return l.afterTruncate()
}

// afterTruncate makes tidwall's renames durable and refreshes tailBytes.
func (l *Log) afterTruncate() error {
	if err := l.syncDir(l.walDir); err != nil {
		return storageErr("sync wal dir", err)
	}
	tb, err := l.tailSegmentBytes()
	if err != nil {
		return storageErr("stat tail segment", err)
	}
	l.tailBytes = tb
	return nil
}

// readEntry returns entry i from the cache or the WAL. Callers hold mu
// shared, or are the owner. i must be within [first, last].
func (l *Log) readEntry(i uint64) (*cachedEntry, error) {
	if ce := l.cache.get(i); ce != nil {
		return ce, nil
	}
	l.rmu.Lock()
	data, err := l.wal.Read(i)
	l.rmu.Unlock()
	if err != nil {
		if errors.Is(err, wal.ErrCorrupt) {
			err = fmt.Errorf("%w: %w", ErrStorage, fmt.Errorf("%w: read wal entry %d: %w", ErrCorrupt, i, err))
			l.noteReadCorruption(err)
			return nil, err
		}
		return nil, storageErr(fmt.Sprintf("read wal entry %d", i), err)
	}
	e, m, records, err := decodeEntry(data)
	if err == nil && e.Index != i {
		err = corruptf("entry at wal index %d says index %d", i, e.Index)
	}
	if err != nil {
		err = fmt.Errorf("%w: wal entry %d: %w", ErrStorage, i, err)
		l.noteReadCorruption(err)
		return nil, err
	}
	return &cachedEntry{e: e, m: m, records: records}, nil
}

// NoteConfState tells the log the membership the owner's raft node has
// just applied at raft index index, before SetConfState saves it. Raft
// tracks a replica from the moment the change is applied and may ask for
// a snapshot to send it at once; the snapshot must name that replica, or
// the replica refuses it ("not in the ConfState"). The note lasts until
// SetConfState saves the change or a snapshot installed covers it. Safe
// from any goroutine.
func (l *Log) NoteConfState(index uint64, cs raftpb.ConfState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if index > l.noted.index && index > l.snap.snapIndex {
		l.noted = confAt{index: index, cs: cs}
	}
}

// SetConfState records the ConfState after the owner applied the
// configuration change at raft index index, writing the state file (one
// fsync) if it changed. The log keeps the membership after each change
// since its snapshot point, so that a snapshot carries the membership as
// of its own index. Owner only; a disk failure fails the Log as in Save.
func (l *Log) SetConfState(index uint64, cs raftpb.ConfState) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.checkWritable(); err != nil {
		return err
	}
	l.mu.Lock()
	l.cs = cs
	if l.noted.index <= index {
		l.noted = confAt{}
	}
	if index > l.snap.snapIndex {
		h := l.snap.confs
		for len(h) > 0 && h[len(h)-1].index >= index {
			h = h[:len(h)-1] // applied again (after a restart)
		}
		h = append(h, confAt{index: index, cs: cs})
		forget := func() {
			// The membership between the two oldest changes is forgotten:
			// those indexes cannot become the snapshot point.
			if l.snap.gapTo == 0 {
				l.snap.gapFrom = h[0].index
			}
			l.snap.gapTo = h[1].index
			h = slices.Clone(h[1:])
		}
		if len(h) > maxConfHistory {
			forget()
		}
		l.snap.confs = h
		// And as many more as the state slot needs: large memberships of
		// long raft ids (incarnations) fill it before maxConfHistory.
		for len(h) > 1 {
			st := l.currentState()
			if len(encodeState(&st)) <= slotSize-slotHeader {
				break
			}
			forget()
			l.snap.confs = h
		}
	}
	l.mu.Unlock()
	if l.persisted.cs.Equivalent(cs) == nil && index <= l.snap.snapIndex {
		return nil
	}
	if err := l.writeState(l.currentState()); err != nil {
		return l.fail(err)
	}
	return nil
}

// Sync fsyncs everything written so far. Owner only; useful under an
// interval policy before acknowledging something that must be durable.
func (l *Log) Sync() error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.checkWritable(); err != nil {
		return err
	}
	if err := l.syncWAL(); err != nil {
		return l.fail(err)
	}
	return nil
}

// ClearCache drops the WAL's in-memory segment cache and the recent-entry
// cache, for idle groups. Safe for concurrent use.
func (l *Log) ClearCache() error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if l.failed != nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cache.reset()
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if err := l.wal.ClearCache(); err != nil {
		return storageErr("wal clear cache", err)
	}
	return nil
}

// Close fsyncs the WAL, writes the state file (persisting Commit), stops the
// background flusher and closes the WAL. Owner only. Closing a failed Log
// skips the writes and just releases it; the failure is not repeated.
// Closing twice returns nil.
func (l *Log) Close() error {
	if l.stopFlusher != nil {
		l.stopOnce.Do(func() {
			close(l.stopFlusher)
			<-l.flusherDone
		})
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.closed {
		return nil
	}
	var errs []error
	if l.failed == nil {
		if err := l.syncWAL(); err != nil {
			errs = append(errs, err)
		} else if st := l.currentState(); st.hs.Commit != l.persisted.hs.Commit || st.hs.Term != l.persisted.hs.Term ||
			st.hs.Vote != l.persisted.hs.Vote || st.cs.Equivalent(l.persisted.cs) != nil {
			if err := l.writeState(st); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if l.stateFile != nil {
		if err := l.stateFile.Close(); err != nil && l.failed == nil {
			errs = append(errs, storageErr("state close", err))
		}
		l.stateFile = nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.cache.reset()
	if l.wal != nil {
		if err := l.wal.Close(); err != nil && l.failed == nil {
			errs = append(errs, storageErr("wal close", err))
		}
	}
	if len(errs) > 0 {
		l.errs.Inc()
		return errors.Join(errs...)
	}
	return nil
}

// ---- raft.Storage --------------------------------------------------------

var _ raft.Storage = (*Log)(nil)

// InitialState returns the saved HardState, with Commit clamped to
// [FirstIndex-1, LastIndex], and the ConfState.
func (l *Log) InitialState() (raftpb.HardState, raftpb.ConfState, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return raftpb.HardState{}, raftpb.ConfState{}, ErrClosed
	}
	hs := l.hs
	hs.Commit = min(max(hs.Commit, l.first-1), l.last)
	return hs, l.cs, nil
}

// Entries returns the entries in [lo, hi), at least one if lo < hi, and
// no more than maxSize bytes (by Entry.Size) beyond the first. It returns
// raft.ErrCompacted for lo < FirstIndex and raft.ErrUnavailable for
// hi > LastIndex+1. Returned entries must not be modified.
func (l *Log) Entries(lo, hi, maxSize uint64) ([]raftpb.Entry, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return nil, ErrClosed
	}
	if lo < l.first {
		return nil, raft.ErrCompacted
	}
	if hi > l.last+1 {
		return nil, raft.ErrUnavailable
	}
	if lo >= hi {
		return nil, nil
	}
	var out []raftpb.Entry
	var size uint64
	for i := lo; i < hi; i++ {
		ce, err := l.readEntry(i)
		if err != nil {
			return nil, err
		}
		size += uint64(ce.e.Size())
		if len(out) > 0 && size > maxSize {
			break
		}
		out = append(out, ce.e)
	}
	return out, nil
}

// Term returns the term of entry i, which must be in [FirstIndex-1,
// LastIndex]: FirstIndex-1 is the snapshot point. It returns
// raft.ErrCompacted below and raft.ErrUnavailable above. It never reads the
// disk.
func (l *Log) Term(i uint64) (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, ErrClosed
	}
	switch {
	case i == l.first-1:
		return l.snap.snapTerm, nil
	case i < l.first:
		return 0, raft.ErrCompacted
	case i > l.last:
		return 0, raft.ErrUnavailable
	}
	return l.ix.term(i), nil
}

// LastIndex returns the index of the last entry, FirstIndex-1 if empty.
func (l *Log) LastIndex() (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, ErrClosed
	}
	return l.last, nil
}

// FirstIndex returns the index of the first entry still in the log (1 for
// a new log).
func (l *Log) FirstIndex() (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, ErrClosed
	}
	return l.first, nil
}

// Snapshot returns the snapshot point: Metadata{Index: FirstIndex-1, its
// term, the current ConfState} with Data a marshalled heraldpb.SnapshotData
// whose next_offset is the offset at FirstIndex.
func (l *Log) Snapshot() (raftpb.Snapshot, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return raftpb.Snapshot{}, ErrClosed
	}
	data, err := proto.Marshal(&heraldpb.SnapshotData{NextOffset: l.snap.snapOffset})
	if err != nil {
		return raftpb.Snapshot{}, err
	}
	return raftpb.Snapshot{
		Data:     data,
		Metadata: raftpb.SnapshotMetadata{Index: l.snap.snapIndex, Term: l.snap.snapTerm, ConfState: l.snapshotMembership()},
	}, nil
}

// snapshotMembership is the membership a snapshot carries: the one as of
// the snapshot point, so that the changes logged after it replay onto
// what they were made on, plus, as learners, the replicas those changes
// added. Raft installs a snapshot only on a replica its membership names,
// and a replica added after the point (a move's new learner, which is
// exactly who needs the snapshot) would otherwise refuse it; replaying
// its addition as a learner, or its promotion, onto that is harmless. A
// change raft applied and the writer has not saved yet counts too
// (NoteConfState).
func (l *Log) snapshotMembership() raftpb.ConfState {
	cs := l.snap.snapCS
	cs.Voters, cs.Learners = slices.Clone(cs.Voters), slices.Clone(cs.Learners)
	known := func(id uint64) bool {
		return slices.Contains(cs.Voters, id) || slices.Contains(cs.VotersOutgoing, id) ||
			slices.Contains(cs.Learners, id) || slices.Contains(cs.LearnersNext, id)
	}
	later := make([]raftpb.ConfState, 0, len(l.snap.confs)+1)
	for _, c := range l.snap.confs {
		later = append(later, c.cs)
	}
	later = append(later, l.cs)
	if l.noted.index > 0 {
		later = append(later, l.noted.cs)
	}
	for _, c := range later {
		for _, set := range [][]uint64{c.Voters, c.VotersOutgoing, c.Learners, c.LearnersNext} {
			for _, id := range set {
				if !known(id) {
					cs.Learners = append(cs.Learners, id)
				}
			}
		}
	}
	return cs
}

// ApplySnapshot resets the log to start right after snap (a follower that
// received a snapshot from its leader): every entry is discarded and
// FirstIndex becomes snap.Metadata.Index+1, StartOffset and EndOffset the
// snapshot's next_offset. Owner only; call it before Save for a Ready that
// carries a snapshot. It returns raft.ErrSnapOutOfDate if snap is not newer
// than the current snapshot point, and fails the Log like Save on a disk
// error. A crash in the middle is finished by the next Open.
func (l *Log) ApplySnapshot(snap raftpb.Snapshot) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.checkWritable(); err != nil {
		return err
	}
	md := snap.Metadata
	if md.Index <= l.snap.snapIndex {
		return raft.ErrSnapOutOfDate
	}
	var sd heraldpb.SnapshotData
	if err := proto.Unmarshal(snap.Data, &sd); err != nil {
		return fmt.Errorf("%w: snapshot data: %w", ErrBadEntry, err)
	}
	if sd.NextOffset < 0 {
		return fmt.Errorf("%w: snapshot next_offset %d is negative", ErrBadEntry, sd.NextOffset)
	}
	hs := l.hs
	hs.Commit = max(hs.Commit, md.Index)
	hs.Term = max(hs.Term, md.Term)
	st := diskState{hs: hs, cs: md.ConfState, snapIndex: md.Index, snapTerm: md.Term, snapOffset: sd.NextOffset, resetting: true, snapCS: md.ConfState}
	if err := l.writeState(st); err != nil {
		return l.fail(err)
	}
	l.mu.Lock()
	l.rmu.Lock()
	err := l.reopenEmpty(md.Index + 1)
	if err == nil {
		st.resetting = false
		l.snap, l.hs, l.cs = st, st.hs, st.cs
		if l.noted.index <= md.Index {
			l.noted = confAt{}
		}
		l.first, l.last = md.Index+1, md.Index
		l.ix = indexes{startOffset: sd.NextOffset, endOffset: sd.NextOffset}
		l.cache.reset()
	}
	l.rmu.Unlock()
	l.mu.Unlock()
	if err != nil {
		return l.fail(err)
	}
	if err := l.writeState(st); err != nil {
		return l.fail(err)
	}
	l.tailBytes = 0
	l.log.Info("persistence: installed snapshot", "group", l.opts.Group, "index", md.Index, "term", md.Term, "next_offset", sd.NextOffset)
	return nil
}
