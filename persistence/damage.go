package persistence

// Damage: telling a torn tail from corruption, quarantining what is damaged,
// and remembering the loss so that no offset is ever used twice.
//
// A crash can only tear the end of the last write: the last segment's tail,
// with nothing valid after it. That tail is cut, as before. Anything else
// that fails its check (damage followed by a valid entry, or damage in a
// segment that is not the last one, or a segment that ends before the next
// segment's first index) is corruption of data that was written whole and
// may have been acknowledged. Recovery then:
//   - copies the damaged segment and moves every later segment into
//     DIR/quarantine/<time>-<index>/ (nothing is deleted);
//   - cuts the log just before the first damaged entry, so that every entry
//     before the damage stays readable;
//   - writes DIR/damage.json: the raft indexes and record offsets lost.
// While the record is not accepted, Damage reports it and the owner (the
// partition actor) must not write: it serves reads and refuses produces.
// AcceptDamage, the operator's repair, makes the log writable again with its
// NextOffset past every offset the damaged part held, so no offset is
// reused.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// Damage records a part of the log lost to corruption.
type Damage struct {
	// FromIndex is the first raft index lost; the log keeps every entry
	// before it. ToIndex is the last raft index known to have been stored.
	FromIndex uint64 `json:"from_index"`
	ToIndex   uint64 `json:"to_index"`
	// ToTerm bounds the term of the last entry the damaged part held: the
	// term of the last valid entry found after the damage, or the raft
	// term the log had reached when none was found. A replica rebuilding
	// from its leader grants a vote only to a candidate whose log is at
	// least as up to date as (ToTerm, ToIndex): what its log held before.
	ToTerm uint64 `json:"to_term"`
	// The offsets [FromOffset, ToOffset) were lost. ToOffset is exact when
	// valid entries were found after the damage (ToOffsetExact), and
	// otherwise an upper bound: every record takes at least one of the
	// LostBytes that could not be checked. FromOffset is -1 in a record
	// written during a repair that a crash interrupted; the next Open
	// settles it.
	FromOffset    int64 `json:"from_offset"`
	ToOffset      int64 `json:"to_offset"`
	ToOffsetExact bool  `json:"to_offset_exact"`
	LostBytes     int64 `json:"lost_bytes"`
	// Reason is what failed its check, first to last.
	Reason string `json:"reason"`
	// Quarantine lists the folders, relative to the log's directory, that
	// hold the damaged files.
	Quarantine []string  `json:"quarantine"`
	DetectedAt time.Time `json:"detected_at"`
	// Accepted is set by AcceptDamage: an operator accepted the loss and
	// the log is writable again, from ToOffset on.
	Accepted   bool      `json:"accepted"`
	AcceptedAt time.Time `json:"accepted_at,omitzero"`
}

// damageFile is the record's name in the log's directory.
const damageFile = "damage.json"

// quarantineDir is the folder, in the log's directory, that damaged files are
// moved to.
const quarantineDir = "quarantine"

// errRescan tells recover that a repair changed the files and the open must
// start again.
var errRescan = errors.New("persistence: log repaired, open again")

// Damage returns the log's damage record and whether there is one (accepted
// or not). Safe for concurrent use.
func (l *Log) Damage() (Damage, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.damage == nil {
		return Damage{}, false
	}
	return *l.damage, true
}

// Damaged reports whether the log holds a damage record that no operator has
// accepted: it must not be written. Safe for concurrent use.
func (l *Log) Damaged() bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.damage != nil && !l.damage.Accepted
}

// AcceptDamage accepts the loss the damage record names: the log becomes
// writable, and NextOffset, the offset its owner stamps on new entries,
// becomes at least the record's ToOffset and at least floor, so that new
// entries never reuse a lost offset. floor is for a replicated partition
// whose every replica was damaged: the operator's command passes the
// largest ToOffset of all replicas, so that whichever leads next skips every
// offset any of them lost. It is the repair an operator runs; the record
// stays (accepted) as the log's history. A log with no damage returns nil.
// Owner only.
//
// maxCommit, when not 0, lowers the log's commit index to at most it (see
// RepairPartitionRequest.max_commit_index): the owner must then reopen the
// log so that raft starts from the lowered commit.
func (l *Log) AcceptDamage(floor int64, maxCommit uint64) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.closed {
		return ErrClosed
	}
	l.mu.RLock()
	d := l.damage
	l.mu.RUnlock()
	if maxCommit > 0 && l.hs.Commit > maxCommit {
		l.mu.Lock()
		l.hs.Commit = maxCommit
		// Until the owner reopens the log, its raft node still has the
		// higher commit: later writes must not put it back.
		l.commitCap = maxCommit
		l.mu.Unlock()
		if err := l.writeState(l.currentState()); err != nil {
			return l.fail(err)
		}
		l.log.Warn("persistence: commit index lowered for an accepted loss", "group", l.opts.Group, "commit", maxCommit)
	}
	if d == nil || (d.Accepted && d.ToOffset >= floor) {
		return nil
	}
	nd := *d
	nd.Accepted, nd.AcceptedAt = true, time.Now().UTC()
	if floor > nd.ToOffset {
		nd.ToOffset, nd.ToOffsetExact = floor, false
	}
	if err := l.writeDamage(&nd); err != nil {
		return storageErr("write damage record", err)
	}
	l.mu.Lock()
	l.damage = &nd
	l.mu.Unlock()
	damagedLogs.WithLabelValues(l.opts.Group).Set(0)
	l.log.Warn("persistence: damage accepted, the log is writable again; lost offsets are not reused",
		"group", l.opts.Group, "lost_from", nd.FromOffset, "lost_to", nd.ToOffset, "next_offset", l.NextOffset())
	return nil
}

// NextOffset is the offset the next record written gets: EndOffset, or past
// an accepted damage's lost offsets while no entry was written after them.
// The leader stamps new entries from it. Safe for concurrent use.
func (l *Log) NextOffset() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if d := l.damage; d != nil && d.Accepted && l.ix.endOffset < d.ToOffset {
		return d.ToOffset
	}
	return l.ix.endOffset
}

// ReadCorruption returns the first corruption a read found in the live log
// (nil if none). The owner reopens the log when it sees one, and Open then
// handles the damage. Safe for concurrent use.
func (l *Log) ReadCorruption() error {
	if p := l.readCorrupt.Load(); p != nil {
		return *p
	}
	return nil
}

// noteReadCorruption records a read that found corrupt data.
func (l *Log) noteReadCorruption(err error) {
	if l.readCorrupt.CompareAndSwap(nil, &err) {
		damageReadsTotal.Inc()
		l.log.Error("persistence: a read found corrupt data in the log; the partition will reopen it", "group", l.opts.Group, "err", err)
	}
}

func (l *Log) damagePath() string { return filepath.Join(l.opts.Dir, damageFile) }

// readDamage loads the damage record, if any.
func (l *Log) readDamage() (*Damage, error) {
	f, err := l.fs.OpenFile(l.damagePath(), os.O_RDONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, storageErr("open damage record", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil, storageErr("read damage record", err)
	}
	var d Damage
	if err := json.Unmarshal(b, &d); err != nil {
		// A record we cannot read must not make a damaged log look whole.
		return nil, corruptf("damage record %s does not decode: %v", l.damagePath(), err)
	}
	return &d, nil
}

func (l *Log) writeDamage(d *Damage) error {
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileAtomic(l.fs, l.damagePath(), append(b, '\n'), 0o640)
}

// segFile is one WAL segment file: its name's first index and its path.
type segFile struct {
	first uint64
	path  string
}

func (l *Log) segmentFiles() ([]segFile, error) {
	names, err := segments(l.fs, l.walDir)
	if err != nil {
		return nil, err
	}
	out := make([]segFile, len(names))
	for i, n := range names {
		first, _ := strconv.ParseUint(n, 10, 64)
		out[i] = segFile{first: first, path: filepath.Join(l.walDir, n)}
	}
	return out, nil
}

func (l *Log) readWhole(path string) ([]byte, error) {
	f, err := l.fs.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	b := make([]byte, fi.Size())
	if _, err := f.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return b, nil
}

// badSpot is the first entry of a segment that fails its checks.
type badSpot struct {
	seg    int    // position in the segment list
	pos    int    // byte position in the segment file
	index  uint64 // the raft index the entry should have had
	reason string
	// offset after the last valid entry before the spot in its segment
	// (-1 if the segment holds no record before it).
	endBefore int64
}

// findBad checks the segments from the one holding index from on, entry by
// entry (framing, CRC32C, encoding, index, term order), and returns the
// first bad spot. ok is false when every entry checks out.
func (l *Log) findBad(segs []segFile, from uint64) (spot badSpot, ok bool, err error) {
	k := 0
	for k+1 < len(segs) && segs[k+1].first <= from {
		k++
	}
	var prevTerm uint64
	for j := k; j < len(segs); j++ {
		b, err := l.readWhole(segs[j].path)
		if err != nil {
			return spot, false, storageErr("read wal segment", err)
		}
		idx, pos, end := segs[j].first, 0, int64(-1)
		bad := func(reason string) (badSpot, bool, error) {
			return badSpot{seg: j, pos: pos, index: idx, reason: reason, endBefore: end}, true, nil
		}
		for pos < len(b) {
			size, n := binary.Uvarint(b[pos:])
			if n <= 0 || uint64(len(b)-pos-n) < size {
				return bad(fmt.Sprintf("entry %d: bad length prefix at byte %d of segment %s", idx, pos, filepath.Base(segs[j].path)))
			}
			e, m, _, derr := decodeEntry(b[pos+n : pos+n+int(size)])
			switch {
			case derr != nil:
				return bad(fmt.Sprintf("entry %d: %v", idx, derr))
			case e.Index != idx:
				return bad(fmt.Sprintf("entry at index %d says index %d", idx, e.Index))
			case e.Term < prevTerm:
				return bad(fmt.Sprintf("entry %d has term %d below the previous term %d", idx, e.Term, prevTerm))
			}
			prevTerm = e.Term
			if m.hasRecords {
				end = m.end()
			}
			pos += n + int(size)
			idx++
		}
		if j+1 < len(segs) && idx < segs[j+1].first {
			return bad(fmt.Sprintf("segment %s ends at index %d but the next segment starts at %d (entries missing)",
				filepath.Base(segs[j].path), idx-1, segs[j+1].first))
		}
	}
	return spot, false, nil
}

// validFound summarises the valid entries found after a damaged spot.
type validFound struct {
	any       bool
	maxIndex  uint64
	maxTerm   uint64
	maxEnd    int64 // -1 if none held records
	unchecked int64 // bytes between the spot and the last valid entry that did not check out
}

// scanValid looks for valid entries in b from pos on whose index is at least
// minIndex, resynchronising byte by byte after anything that does not check
// out. It stops at the end of b.
func scanValid(b []byte, pos int, minIndex uint64, acc *validFound) {
	var unchecked int64
	for pos < len(b) {
		size, n := binary.Uvarint(b[pos:])
		if n > 0 && size >= crcLen+6 && uint64(len(b)-pos-n) >= size {
			body := b[pos+n : pos+n+int(size)]
			// raftpb.Entry marshals its fields in order: Type (tag 0x08,
			// a one-byte value), then Term (tag 0x10). A cheap filter
			// before the CRC.
			if body[crcLen] == 0x08 && body[crcLen+2] == 0x10 {
				if e, m, _, err := decodeEntry(body); err == nil && e.Index >= minIndex {
					acc.any = true
					acc.maxIndex = max(acc.maxIndex, e.Index)
					acc.maxTerm = max(acc.maxTerm, e.Term)
					if m.hasRecords {
						acc.maxEnd = max(acc.maxEnd, m.end())
					}
					acc.unchecked += unchecked
					unchecked = 0
					pos += n + int(size)
					continue
				}
			}
		}
		pos++
		unchecked++
	}
}

// repairFrom handles a failed check at or after raft index from, found by
// the scan or by tidwall's open. The WAL must be closed. It cuts a torn tail,
// or quarantines the damage and records it in l.found; either way it
// returns errRescan so that recover opens the repaired files again. It
// returns another error when the files cannot be read or changed, or when
// no bad entry can be found (Open then fails rather than serve a log it
// cannot trust).
func (l *Log) repairFrom(from uint64, cause error) error {
	segs, err := l.segmentFiles()
	if err != nil {
		return storageErr("list wal segments", err)
	}
	spot, ok, err := l.findBad(segs, from)
	if err != nil {
		return err
	}
	if !ok {
		return corruptf("the check of entry %d failed (%v) but the segment files check out", from, cause)
	}
	last := spot.seg == len(segs)-1
	b, err := l.readWhole(segs[spot.seg].path)
	if err != nil {
		return storageErr("read wal segment", err)
	}
	found := validFound{maxEnd: -1}
	scanValid(b, spot.pos, spot.index, &found)
	if last && !found.any {
		// The last write of a crash: nothing valid follows. Cut it.
		l.log.Warn("persistence: cutting torn tail of WAL segment",
			"group", l.opts.Group, "segment", segs[spot.seg].path, "index", spot.index,
			"size", len(b), "keep", spot.pos, "dropped_bytes", len(b)-spot.pos, "reason", spot.reason)
		if err := l.cutSegment(segs[spot.seg].path, int64(spot.pos)); err != nil {
			return storageErr("cut torn tail", err)
		}
		return errRescan
	}

	// Corruption. Look at everything after the spot for what was stored.
	unchecked := found.unchecked
	if !found.any {
		unchecked = int64(len(b) - spot.pos)
	}
	for j := spot.seg + 1; j < len(segs); j++ {
		sb, err := l.readWhole(segs[j].path)
		if err != nil {
			return storageErr("read wal segment", err)
		}
		before := found.any
		f := validFound{maxEnd: -1}
		scanValid(sb, 0, spot.index, &f)
		if f.any {
			found.any = true
			found.maxIndex = max(found.maxIndex, f.maxIndex)
			found.maxTerm = max(found.maxTerm, f.maxTerm)
			found.maxEnd = max(found.maxEnd, f.maxEnd)
			unchecked += f.unchecked
		} else if !before {
			unchecked += int64(len(sb))
		}
	}
	q := filepath.Join(quarantineDir, fmt.Sprintf("%s-index-%d", time.Now().UTC().Format("20060102T150405.000Z"), spot.index))
	term := found.maxTerm
	if !found.any {
		term = l.openTerm
	}
	d := Damage{FromIndex: spot.index, ToIndex: max(found.maxIndex, spot.index), ToTerm: term, FromOffset: -1, ToOffset: found.maxEnd,
		ToOffsetExact: found.any, LostBytes: unchecked, Reason: spot.reason, Quarantine: []string{q}, DetectedAt: time.Now().UTC()}
	if prev := l.damage; prev != nil {
		// Damage again, before or after a repair: the loss only grows,
		// and an earlier record's end still holds.
		d.ToIndex = max(d.ToIndex, prev.ToIndex)
		d.ToTerm = max(d.ToTerm, prev.ToTerm)
		d.ToOffset = max(d.ToOffset, prev.ToOffset)
		d.ToOffsetExact = d.ToOffsetExact && prev.ToOffsetExact
		d.Quarantine = append(slices.Clone(prev.Quarantine), q)
		if !prev.Accepted {
			d.FromIndex = min(d.FromIndex, prev.FromIndex)
			d.LostBytes += prev.LostBytes
			d.Reason = prev.Reason + "; then " + d.Reason
			d.DetectedAt = prev.DetectedAt
		}
	}
	// The record is durable before any file moves: a crash part-way
	// through the quarantine leaves a log that knows it is damaged.
	if err := l.writeDamage(&d); err != nil {
		return storageErr("write damage record", err)
	}
	l.damage = &d
	if err := l.quarantine(segs, spot, q); err != nil {
		return storageErr("quarantine damaged segments", err)
	}
	damageFoundTotal.Inc()
	l.log.Error("persistence: the log is damaged: the damaged part is quarantined and the partition stays read-only until repaired",
		"group", l.opts.Group, "first_lost_index", spot.index, "last_stored_index", d.ToIndex, "reason", spot.reason,
		"cause", cause, "quarantine", filepath.Join(l.opts.Dir, q))
	return errRescan
}

// quarantine copies the damaged segment and moves every later one into the
// folder q (relative to the log's directory), then cuts the damaged segment
// just before the bad spot. Each step is made durable before the next, so a
// crash leaves the files either in place or in quarantine, never lost.
func (l *Log) quarantine(segs []segFile, spot badSpot, q string) error {
	dir := filepath.Join(l.opts.Dir, q)
	if err := l.fs.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	if err := l.syncDir(filepath.Join(l.opts.Dir, quarantineDir)); err != nil {
		return err
	}
	src := segs[spot.seg].path
	b, err := l.readWhole(src)
	if err != nil {
		return err
	}
	if err := WriteFileAtomic(l.fs, filepath.Join(dir, filepath.Base(src)), b, 0o640); err != nil {
		return err
	}
	for j := len(segs) - 1; j > spot.seg; j-- {
		if err := l.fs.Rename(segs[j].path, filepath.Join(dir, filepath.Base(segs[j].path))); err != nil {
			return err
		}
	}
	if err := l.syncDir(dir); err != nil {
		return err
	}
	if spot.pos == 0 && spot.seg > 0 {
		// Nothing of the segment is kept: the one before it is the tail.
		if err := l.fs.Remove(src); err != nil {
			return err
		}
	} else if err := l.cutSegment(src, int64(spot.pos)); err != nil {
		return err
	}
	return l.syncDir(l.walDir)
}

// cutSegment truncates a segment file to size bytes and syncs it.
func (l *Log) cutSegment(path string, size int64) error {
	f, err := l.fs.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	if err := l.syncFile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// settleDamage completes a damage record written by a repair of this or an
// earlier Open (FromOffset -1): now that the kept log is known, the loss
// starts at its end, and an inexact end is bounded by the lost bytes.
// Called at the end of recover.
func (l *Log) settleDamage() error {
	d := l.damage
	if d == nil {
		return nil
	}
	if d.FromOffset < 0 {
		nd := *d
		nd.FromIndex, nd.FromOffset = l.last+1, l.ix.endOffset
		if !nd.ToOffsetExact {
			nd.ToOffset = max(nd.ToOffset, nd.FromOffset+nd.LostBytes)
		}
		nd.ToOffset = max(nd.ToOffset, nd.FromOffset)
		nd.ToIndex = max(nd.ToIndex, nd.FromIndex)
		if err := l.writeDamage(&nd); err != nil {
			return storageErr("write damage record", err)
		}
		d = &nd
		l.damage = d
	}
	damagedLogs.WithLabelValues(l.opts.Group).Set(b2f(!d.Accepted))
	if !d.Accepted {
		l.log.Error("persistence: the log is damaged and read-only until repaired (herald partition repair --accept-loss)",
			"group", l.opts.Group, "lost_from_offset", d.FromOffset, "lost_to_offset", d.ToOffset,
			"lost_from_index", d.FromIndex, "lost_to_index", d.ToIndex, "reason", d.Reason,
			"quarantine", d.Quarantine)
	}
	return nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// ClearDamage removes the damage record once the replica holds again every
// entry the record names as lost (it was rebuilt from its leader). It
// refuses while LastIndex is below the record's ToIndex. Owner only.
func (l *Log) ClearDamage() error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.RLock()
	d, last := l.damage, l.last
	l.mu.RUnlock()
	if d == nil {
		return nil
	}
	if last < d.ToIndex {
		return fmt.Errorf("persistence: the log ends at index %d, before the damaged part's last index %d", last, d.ToIndex)
	}
	if err := l.fs.Remove(l.damagePath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return storageErr("remove damage record", err)
	}
	if err := l.syncDir(l.opts.Dir); err != nil {
		return storageErr("sync dir", err)
	}
	l.mu.Lock()
	l.damage = nil
	l.mu.Unlock()
	damagedLogs.WithLabelValues(l.opts.Group).Set(0)
	l.log.Info("persistence: the damaged part of the log was rebuilt from the leader", "group", l.opts.Group, "last_index", last)
	return nil
}
