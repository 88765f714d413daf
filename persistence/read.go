package persistence

import (
	"fmt"
	"math"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// StartOffset is the offset of the first record still in the log (after
// retention). Safe for concurrent use.
func (l *Log) StartOffset() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.ix.startOffset
}

// EndOffset is the offset after the last record of the last entry in the log,
// committed or not; the leader stamps new entries' base_offset from it. Safe
// for concurrent use.
func (l *Log) EndOffset() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.ix.endOffset
}

// Size is the number of WAL bytes the entries of the log occupy on disk (the
// small state file excluded). Safe for concurrent use.
func (l *Log) Size() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.ix.size
}

// ReadBatches returns, in order, the stored batches holding offsets in
// [offset, limit), where limit is the caller's high watermark. The first
// batch may start below offset. It stops adding batches once their records
// total maxBytes, but returns at least one batch if one exists even if it is
// larger. It never returns a record at or above limit: a batch that would
// cross limit ends the result. Offsets in [EndOffset, limit] return no
// batches. It returns ErrOffsetOutOfRange when offset < StartOffset or
// offset > limit, ErrClosed after Close, and ErrStorage on a read failure.
//
// Safe for concurrent use with the owner's Save. The returned batches'
// Records may alias the log's cache: callers must not modify them.
func (l *Log) ReadBatches(offset int64, maxBytes int, limit int64) ([]*heraldpb.StoredBatch, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return nil, ErrClosed
	}
	if offset < l.ix.startOffset || offset > limit {
		return nil, fmt.Errorf("%w: offset %d outside [%d, %d]", ErrOffsetOutOfRange, offset, l.ix.startOffset, limit)
	}
	limit = min(limit, l.ix.endOffset)
	if offset >= limit {
		return nil, nil
	}
	k := l.ix.pointForOffset(offset)
	if k < 0 {
		k = 0
	}
	var (
		out   []*heraldpb.StoredBatch
		bytes int
	)
	for i := l.ix.points[k].idx; i <= l.last; i++ {
		ce, err := l.readEntry(i)
		if err != nil {
			return nil, err
		}
		m := &ce.m
		if !m.hasRecords || m.end() <= offset {
			continue
		}
		if m.end() > limit {
			break
		}
		if m.refs != nil {
			var full bool
			if out, bytes, full, err = l.appendCommitted(out, bytes, maxBytes, m, offset); err != nil || full {
				return out, err
			}
		} else {
			out = append(out, &heraldpb.StoredBatch{BaseOffset: m.base, Count: m.count, AppendTimeMs: m.appendMs, Records: ce.records})
			bytes += len(ce.records)
		}
		if bytes >= maxBytes || m.end() >= limit {
			break
		}
	}
	return out, nil
}

// appendCommitted appends the batches of the commit marker m from offset
// on: each of its transactional batches with the offsets the marker gives
// it, at the marker's append time (when its records became readable).
// full reports that maxBytes was reached inside the marker. A named entry
// that is not a transactional batch, or batches that do not add up to the
// marker's count, are ErrCorrupt. Callers hold l.mu.
func (l *Log) appendCommitted(out []*heraldpb.StoredBatch, bytes, maxBytes int, m *entryMeta, offset int64) (_ []*heraldpb.StoredBatch, _ int, full bool, err error) {
	base := m.base
	for _, r := range m.refs {
		if r < l.first || r >= m.index {
			return nil, 0, false, fmt.Errorf("%w: %w", ErrStorage, corruptf("commit marker at index %d names entry %d, outside [%d, %d)", m.index, r, l.first, m.index))
		}
		ce, err := l.readEntry(r)
		if err != nil {
			return nil, 0, false, err
		}
		if ce.m.txnCount == 0 {
			return nil, 0, false, fmt.Errorf("%w: %w", ErrStorage, corruptf("commit marker at index %d names entry %d, which is not a transactional batch", m.index, r))
		}
		b := base
		base += int64(ce.m.txnCount)
		if base <= offset {
			continue
		}
		out = append(out, &heraldpb.StoredBatch{BaseOffset: b, Count: ce.m.txnCount, AppendTimeMs: m.appendMs, Records: ce.records})
		bytes += len(ce.records)
		if bytes >= maxBytes && base < m.end() {
			return out, bytes, true, nil
		}
	}
	if base != m.end() {
		return nil, 0, false, fmt.Errorf("%w: %w", ErrStorage, corruptf("commit marker at index %d covers offsets [%d, %d), its batches [%d, %d)", m.index, m.base, m.end(), m.base, base))
	}
	return out, bytes, false, nil
}

// OffsetForTime returns the base offset of the first batch whose
// max_timestamp_ms is >= tsMs, or EndOffset if there is none. It returns -1
// if the log is closed or could not be read (the failure is logged). Safe
// for concurrent use.
func (l *Log) OffsetForTime(tsMs int64) int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return -1
	}
	for k := range l.ix.points {
		p := &l.ix.points[k]
		if p.maxTs < tsMs {
			continue
		}
		end := l.last + 1
		if k+1 < len(l.ix.points) {
			end = l.ix.points[k+1].idx
		}
		for i := p.idx; i < end; i++ {
			ce, err := l.readEntry(i)
			if err != nil {
				l.log.Warn("persistence: OffsetForTime read failed", "group", l.opts.Group, "index", i, "err", err)
				return -1
			}
			if ce.m.hasRecords && ce.m.maxTsMs >= tsMs {
				return ce.m.base
			}
		}
	}
	return l.ix.endOffset
}

// Retain truncates the front of the log: whole entries whose append_time_ms
// is older than now-maxAge (maxAge > 0), and then as many more of the oldest
// entries as needed to bring Size to at most maxBytes (maxBytes > 0). It
// never removes entry upTo (the applied index) or any later one. Entries
// without records are removed with their neighbours. It writes the new
// snapshot point to the state file before truncating the WAL, and returns
// the number of records removed. Owner only; a disk failure returns
// ErrStorage and fails the Log.
func (l *Log) Retain(now time.Time, maxAge time.Duration, maxBytes int64, upTo uint64) (int64, error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.checkWritable(); err != nil {
		return 0, err
	}
	ageOn, bytesOn := maxAge > 0, maxBytes > 0
	if !ageOn && !bytesOn {
		return 0, nil
	}
	cutoff := now.Add(-maxAge).UnixMilli()
	idx, off, removed, err := l.retainUpTo(min(upTo, l.last+1), cutoff, ageOn, bytesOn, maxBytes)
	if err != nil {
		return 0, err
	}
	if idx == l.first {
		return 0, nil
	}
	// A committed transaction whose batches are partly before the cut
	// loses them: the log then starts after it, and the entries kept
	// below that offset go with the next truncation.
	_, end, err := l.split(idx)
	if err != nil {
		return 0, l.fail(err)
	}
	return l.truncateLogged(idx, max(off, end), removed, "persistence: retention truncated the log")
}

// TxnFloor is a raft index at or below the log's first transactional
// entry (a batch written once, a marker or a session fence), 0 if the log holds none: a
// reader rebuilding the open transactions need not look below it. Safe
// for concurrent use.
func (l *Log) TxnFloor() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.ix.txnLow == 0 {
		return 0
	}
	return max(l.ix.txnLow, l.first)
}

// split finds the commit markers at raft index idx or later that name
// entries before idx: the lowest index they name (math.MaxUint64: none)
// and the offset after the last of them (-1: none). Truncating the front
// to idx removes records of theirs.
func (l *Log) split(idx uint64) (minRef uint64, end int64, err error) {
	minRef, end = math.MaxUint64, -1
	if idx > l.last {
		return minRef, end, nil
	}
	for k := max(l.ix.pointFor(idx), 0); k < len(l.ix.points); k++ {
		p := l.ix.points[k]
		if p.minRef >= idx {
			continue
		}
		to := l.last
		if k+1 < len(l.ix.points) {
			to = l.ix.points[k+1].idx - 1
		}
		for i := max(p.idx, idx); i <= to; i++ {
			ce, err := l.readEntry(i)
			if err != nil {
				return 0, 0, err
			}
			for _, r := range ce.m.refs {
				if r < idx {
					minRef, end = min(minRef, r), max(end, ce.m.end())
				}
			}
		}
	}
	return minRef, end, nil
}

// retainUpTo is Retain's walk from the front, never past limit: the first
// index to keep, its offset, and the WAL bytes before it.
func (l *Log) retainUpTo(limit uint64, cutoff int64, ageOn, bytesOn bool, maxBytes int64) (uint64, int64, int64, error) {
	var (
		idx     = l.first
		off     = l.ix.startOffset
		removed int64 // WAL bytes
	)
	for idx < limit {
		k := l.ix.pointFor(idx)
		p := &l.ix.points[k]
		end, endOff, endCum := l.last+1, l.ix.endOffset, l.ix.endCum
		if k+1 < len(l.ix.points) {
			end, endOff, endCum = l.ix.points[k+1].idx, l.ix.points[k+1].off, l.ix.points[k+1].cum
		}
		if idx == p.idx && end <= limit {
			ib := endCum - p.cum
			if (ageOn && p.maxAppend < cutoff) || (bytesOn && l.ix.size-removed-ib >= maxBytes) {
				idx, off, removed = end, max(off, endOff), removed+ib
				continue
			}
		}
		ce, err := l.readEntry(idx)
		if err != nil {
			return 0, 0, 0, l.fail(err)
		}
		old := ageOn && (!ce.m.hasRecords || ce.m.appendMs < cutoff)
		over := bytesOn && l.ix.size-removed > maxBytes
		if !old && !over {
			break
		}
		if ce.m.hasRecords {
			off = max(off, ce.m.end())
		}
		removed += ce.m.size
		idx++
	}
	return idx, off, removed, nil
}

// truncateLogged is truncateFront for Retain and DeleteBefore: it counts
// and logs the records removed, and fails the Log on a disk error.
func (l *Log) truncateLogged(idx uint64, off, removed int64, msg string) (int64, error) {
	st := l.currentState()
	if _, _, ok := st.membershipAt(idx - 1); !ok {
		// More membership changes than the state file keeps since the
		// snapshot point: the log is not truncated inside the forgotten
		// span (a snapshot there would carry the wrong membership).
		l.log.Warn("persistence: not truncating inside a span of forgotten membership changes", "group", l.opts.Group,
			"first_index", idx, "span_from", st.gapFrom, "span_to", st.gapTo)
		return 0, nil
	}
	records := off - l.ix.startOffset
	if err := l.truncateFront(idx, off, removed); err != nil {
		return 0, l.fail(err)
	}
	l.retained.Add(float64(records))
	l.log.Info(msg, "group", l.opts.Group, "first_index", idx,
		"start_offset", off, "removed_records", records, "removed_bytes", removed)
	return records, nil
}

// DeleteBefore truncates the front of the log up to offset: every entry
// whose records all lie below offset is removed (with the record-less
// entries among them), never entry upTo (the applied index) or a later one.
// An entry holding offset or a later record stays whole. It returns the
// number of records removed. Compaction of internal topics uses it (records
// before offset are superseded). Owner only; a disk failure returns
// ErrStorage and fails the Log.
func (l *Log) DeleteBefore(offset int64, upTo uint64) (int64, error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.checkWritable(); err != nil {
		return 0, err
	}
	// The cut never splits a committed transaction (every record at or
	// after offset stays): it moves back to the first batch it would
	// remove of one, until none.
	limit := min(upTo, l.last+1)
	var (
		idx, off, removed = l.first, l.ix.startOffset, int64(0)
		err               error
	)
	for {
		idx, off, removed, err = l.deleteUpTo(limit, offset)
		if err != nil || idx == l.first {
			break
		}
		var floor uint64
		if floor, _, err = l.split(idx); err != nil {
			return 0, l.fail(err)
		}
		if floor >= idx {
			break
		}
		limit = floor
	}
	if err != nil {
		return 0, err
	}
	if idx == l.first {
		return 0, nil
	}
	return l.truncateLogged(idx, off, removed, "persistence: truncated the log before an offset")
}

// deleteUpTo is DeleteBefore's walk from the front, never past limit: the
// first index to keep, its offset, and the WAL bytes before it.
func (l *Log) deleteUpTo(limit uint64, offset int64) (uint64, int64, int64, error) {
	idx, off, removed := l.first, l.ix.startOffset, int64(0)
	for idx < limit {
		ce, err := l.readEntry(idx)
		if err != nil {
			return 0, 0, 0, l.fail(err)
		}
		if ce.m.hasRecords {
			if ce.m.end() > offset {
				break
			}
			off = max(off, ce.m.end())
		}
		removed += ce.m.size
		idx++
	}
	return idx, off, removed, nil
}

// truncateFront makes f the first index, off the start offset, after
// removing removed WAL bytes. It writes the state file first (so a crash
// leaves a state that Open can finish), publishes, then truncates the WAL.
func (l *Log) truncateFront(f uint64, off, removed int64) error {
	st := l.currentState()
	cs, rest, ok := st.membershipAt(f - 1)
	if !ok {
		return fmt.Errorf("persistence: the membership at index %d is not known", f-1) // (truncateLogged checks first)
	}
	st.snapCS, st.confs = cs, rest
	if f-1 >= st.gapTo {
		st.gapFrom, st.gapTo = 0, 0
	}
	st.snapIndex, st.snapTerm, st.snapOffset = f-1, l.ix.term(f-1), off
	st.hs.Commit = max(st.hs.Commit, f-1)
	if err := l.writeState(st); err != nil {
		return err
	}
	ix := l.ix.clone()
	firstCum := ix.endCum - ix.size
	ix.size -= removed
	ix.startOffset = off
	if f > l.last {
		ix.points, ix.terms = nil, nil
		ix.endOffset = off
	} else {
		k := ix.pointFor(f)
		ix.points = ix.points[k:]
		if p := &ix.points[0]; p.idx < f {
			p.idx, p.off, p.cum = f, off, firstCum+removed
		} else {
			p.off = max(p.off, off)
		}
		t := 0
		for t+1 < len(ix.terms) && ix.terms[t+1].start <= f {
			t++
		}
		ix.terms = ix.terms[t:]
		ix.terms[0].start = max(ix.terms[0].start, f)
	}
	l.mu.Lock()
	l.snap = st
	l.hs.Commit = st.hs.Commit
	l.first = f
	l.ix = ix
	l.cache.truncateFront(f)
	l.mu.Unlock()
	if err := l.wal.TruncateFront(f); err != nil {
		return storageErr("wal truncate front", err)
	}
	return l.afterTruncate()
}
