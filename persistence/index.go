package persistence

import (
	"math"
	"sort"

	"go.etcd.io/raft/v3/raftpb"
)

// point starts one interval of the sparse index. Interval k covers raft
// indexes [points[k].idx, points[k+1].idx), the last one up to LastIndex.
// A new interval starts once the current one holds IndexIntervalBytes of WAL.
type point struct {
	idx uint64 // first raft index of the interval
	off int64  // offset at idx: the first record offset at or after idx
	cum int64  // WAL bytes before idx, counted from an arbitrary origin
	// maxTs and maxAppend are upper bounds of max_timestamp_ms and
	// append_time_ms over the record-bearing entries of the interval
	// (exact except after front truncation); MinInt64 if there are none.
	maxTs     int64
	maxAppend int64
	// minRef is the lowest raft index a commit marker of the interval
	// names (math.MaxUint64: none), an upper bound after front
	// truncation: Log.split looks only where it is below the cut.
	minRef uint64
}

// termRun says entries from start on (up to the next run) have term.
type termRun struct{ start, term uint64 }

// indexes are the in-memory indexes of a Log, rebuilt by the scan in Open and
// kept current by Save, Retain and ApplySnapshot. They cost a few dozen bytes
// per IndexIntervalBytes of log plus one run per term change.
type indexes struct {
	points      []point
	terms       []termRun
	endCum      int64 // cum after LastIndex
	size        int64 // WAL bytes of entries [FirstIndex, LastIndex]
	startOffset int64 // offset at FirstIndex
	endOffset   int64 // offset after the last record of the last entry
	// txnLow is at or below the first transactional entry (batch,
	// marker or session fence) of the log (0: none seen since the log
	// was opened empty or a snapshot replaced it); see Log.TxnFloor.
	txnLow uint64
}

// add appends the metadata of entry m, the next index after LastIndex.
func (ix *indexes) add(m *entryMeta, interval int64) {
	if n := len(ix.points); n == 0 || ix.endCum-ix.points[n-1].cum >= interval {
		ix.points = append(ix.points, point{idx: m.index, off: ix.endOffset, cum: ix.endCum, maxTs: math.MinInt64, maxAppend: math.MinInt64, minRef: math.MaxUint64})
	}
	p := &ix.points[len(ix.points)-1]
	if m.txn && ix.txnLow == 0 {
		ix.txnLow = m.index
	}
	for _, r := range m.refs {
		p.minRef = min(p.minRef, r)
	}
	if m.hasRecords {
		p.maxTs = max(p.maxTs, m.maxTsMs)
		p.maxAppend = max(p.maxAppend, m.appendMs)
		// (max: after a front truncation inside a transaction's span, entries
		// wholly below the start offset stay until the next one; see
		// Log.split)
		ix.endOffset = max(ix.endOffset, m.end())
	}
	ix.endCum += m.size
	ix.size += m.size
	if n := len(ix.terms); n == 0 || ix.terms[n-1].term != m.term {
		ix.terms = append(ix.terms, termRun{start: m.index, term: m.term})
	}
}

// pointFor returns the position of the interval holding raft index i, or -1.
func (ix *indexes) pointFor(i uint64) int {
	return sort.Search(len(ix.points), func(k int) bool { return ix.points[k].idx > i }) - 1
}

// pointForOffset returns the position of the last interval whose offset is
// <= off, or -1: the entry holding off is in it or after it.
func (ix *indexes) pointForOffset(off int64) int {
	return sort.Search(len(ix.points), func(k int) bool { return ix.points[k].off > off }) - 1
}

// term returns the term of an entry known to be in the log.
func (ix *indexes) term(i uint64) uint64 {
	k := sort.Search(len(ix.terms), func(k int) bool { return ix.terms[k].start > i }) - 1
	if k < 0 {
		return 0
	}
	return ix.terms[k].term
}

// clone returns a deep copy, for tests.
func (ix *indexes) clone() indexes {
	c := *ix
	c.points = append([]point(nil), ix.points...)
	c.terms = append([]termRun(nil), ix.terms...)
	return c
}

// cachedEntry is a decoded entry of the recent-entry cache.
type cachedEntry struct {
	e       raftpb.Entry
	m       entryMeta
	records []byte // aliases e.Data
}

// entryCache holds the newest entries of the log, a contiguous run ending at
// LastIndex, bounded by bytes. Only the owner mutates it, under Log.mu.
type entryCache struct {
	ents  []cachedEntry
	head  int
	bytes int
	max   int
}

func cachedSize(ce *cachedEntry) int { return len(ce.e.Data) + 64 }

func (c *entryCache) len() int { return len(c.ents) - c.head }

func (c *entryCache) get(i uint64) *cachedEntry {
	if c.len() == 0 {
		return nil
	}
	first := c.ents[c.head].e.Index
	if i < first || i-first >= uint64(c.len()) {
		return nil
	}
	return &c.ents[c.head+int(i-first)]
}

// push appends ce, which must follow the cached run (else the cache restarts
// at ce), then evicts the oldest entries beyond the byte bound.
func (c *entryCache) push(ce cachedEntry) {
	if c.max <= 0 {
		return
	}
	if n := c.len(); n > 0 && c.ents[len(c.ents)-1].e.Index+1 != ce.e.Index {
		c.reset()
	}
	c.ents = append(c.ents, ce)
	c.bytes += cachedSize(&ce)
	for c.bytes > c.max && c.len() > 1 {
		c.bytes -= cachedSize(&c.ents[c.head])
		c.ents[c.head] = cachedEntry{}
		c.head++
	}
	if c.head > 64 && c.head > len(c.ents)/2 {
		n := copy(c.ents, c.ents[c.head:])
		clear(c.ents[n:])
		c.ents = c.ents[:n]
		c.head = 0
	}
}

// truncateBack drops cached entries after index t.
func (c *entryCache) truncateBack(t uint64) {
	for c.len() > 0 && c.ents[len(c.ents)-1].e.Index > t {
		last := len(c.ents) - 1
		c.bytes -= cachedSize(&c.ents[last])
		c.ents[last] = cachedEntry{}
		c.ents = c.ents[:last]
	}
}

// truncateFront drops cached entries before index f.
func (c *entryCache) truncateFront(f uint64) {
	for c.len() > 0 && c.ents[c.head].e.Index < f {
		c.bytes -= cachedSize(&c.ents[c.head])
		c.ents[c.head] = cachedEntry{}
		c.head++
	}
}

func (c *entryCache) reset() {
	clear(c.ents)
	c.ents, c.head, c.bytes = c.ents[:0], 0, 0
}
