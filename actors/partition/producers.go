package partition

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"

	heraldpb "github.com/heraldmq/herald/proto"
)

// ProducerBatches is how many of each producer's most recent batches a
// partition remembers: an idempotent producer's retry of any of them is
// answered with the original offsets. The SDK keeps at most this many
// batches per partition in flight.
const ProducerBatches = 5

// seqBatch is one committed batch of an idempotent producer.
type seqBatch struct {
	seq    int64  // sequence of its first record
	count  uint32 // records
	offset int64  // offset of its first record
}

// end is the sequence after the batch's last record.
func (b seqBatch) end() int64 { return b.seq + int64(b.count) }

// producerEntry is what a partition knows of one producer: its last
// batches, oldest first, and its place in the table's recency list.
type producerEntry struct {
	id         uint64
	batches    [ProducerBatches]seqBatch
	n          int
	prev, next *producerEntry // towards the more and the less recent
}

// last is the producer's most recent batch. n > 0.
func (e *producerEntry) last() seqBatch { return e.batches[e.n-1] }

// find returns the batch with exactly this sequence range.
func (e *producerEntry) find(seq int64, count uint32) (seqBatch, bool) {
	for _, b := range e.batches[:e.n] {
		if b.seq == seq && b.count == count {
			return b, true
		}
	}
	return seqBatch{}, false
}

func (e *producerEntry) add(b seqBatch) {
	if e.n == ProducerBatches {
		copy(e.batches[:], e.batches[1:])
		e.n--
	}
	e.batches[e.n] = b
	e.n++
}

// producerTable holds the recent batches of the idempotent producers of one
// partition, built as committed entries are applied, so that every replica
// derives the same table from the same log. It tracks at most limit
// producers and evicts the one whose last batch is the oldest (least
// recently written; a lookup does not count, so that the order depends on
// the log alone). An evicted producer is unknown: its next batch is accepted
// whatever its sequence. Owned by the partition actor, or by the goroutine
// that rebuilds it before handing it over.
type producerTable struct {
	m          map[uint64]*producerEntry
	head, tail *producerEntry // most and least recently written
	limit      int
	evictions  int // since the table was made
	// epochs holds, per fencer (the transaction coordinator, the
	// scheduler), the highest epoch of the entries applied
	// (LogEntry.txn_epoch, LogEntry.fencer): the leader refuses that
	// fencer's appends of an older one. They are never evicted. Each
	// index is the raft index of the last entry that carried the epoch
	// (0: not known, as when it came from a floor): a reset applies only
	// over both (fence.go).
	epochs [heraldpb.NumFencers]fenceEpoch
}

// fenceEpoch is a fencer's epoch on a partition and the raft index of the
// entry that set it.
type fenceEpoch struct{ epoch, index uint64 }

// epochList is an epoch per fencer.
type epochList [heraldpb.NumFencers]uint64

// applyTxnEpoch records the fencer's epoch of an applied entry: a higher
// one raises the table's, and a resetting fence (h.TxnEpochResetFrom)
// replaces exactly that epoch, even with a lower one. It reports whether
// the table's changed. (ScanLogEntry checked h.Fencer.)
func (t *producerTable) applyTxnEpoch(h heraldpb.LogEntryHeader, index uint64) bool {
	f := &t.epochs[h.Fencer]
	switch {
	case h.TxnEpoch == 0:
		return false
	case h.Fence() && h.TxnEpochResetFrom > h.TxnEpoch:
		if f.epoch != h.TxnEpochResetFrom || f.index != h.TxnEpochResetIndex {
			return false // a fence or an append of that epoch came since
		}
	case h.TxnEpoch < f.epoch:
		return false
	}
	*f = fenceEpoch{h.TxnEpoch, index}
	return true
}

// raiseEpochs raises the table's epochs to floors known without their
// entries (a saved file's, a snapshot's), and reports whether one changed.
func (t *producerTable) raiseEpochs(floor epochList) bool {
	changed := false
	for i, e := range floor {
		if e > t.epochs[i].epoch {
			t.epochs[i], changed = fenceEpoch{e, 0}, true
		}
	}
	return changed
}

// epochList is the table's epochs.
func (t *producerTable) epochList() (l epochList) {
	for i, f := range t.epochs {
		l[i] = f.epoch
	}
	return l
}

func newProducerTable(limit int) *producerTable {
	return &producerTable{m: make(map[uint64]*producerEntry), limit: max(limit, 1)}
}

// len is the number of producers tracked.
func (t *producerTable) len() int { return len(t.m) }

// get returns what the table knows of producer id, nil when it is unknown.
func (t *producerTable) get(id uint64) *producerEntry { return t.m[id] }

// record adds a committed batch of producer id, making it the most recently
// written producer, and evicts the least recently written ones beyond the
// limit.
func (t *producerTable) record(id uint64, b seqBatch) {
	e := t.m[id]
	if e == nil {
		e = &producerEntry{id: id}
		t.m[id] = e
	} else {
		t.unlink(e)
	}
	e.add(b)
	t.pushFront(e)
	for len(t.m) > t.limit {
		old := t.tail
		t.unlink(old)
		delete(t.m, old.id)
		t.evictions++
	}
}

func (t *producerTable) unlink(e *producerEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		t.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		t.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (t *producerTable) pushFront(e *producerEntry) {
	e.next = t.head
	if t.head != nil {
		t.head.prev = e
	}
	t.head = e
	if t.tail == nil {
		t.tail = e
	}
}

// replayOnto records every batch of t, least recently written producer
// first, into dst: as if the entries t was built from had been applied to
// dst after its own. Used to put the batches applied while a rebuilt table
// was read from the log on top of it. The result has the same producers in
// the same order, with the same last batches, as applying every entry in
// order; only a producer that t evicted and then saw again may keep some
// batches of dst that an in-order apply would have dropped with it (they
// are still true: its retries of them are answered right). A producer t
// evicted is evicted from the result too, since t is then full.
//
// It replays the batches of t in recency order of their producers, not in
// log order; that is equivalent because producers are independent and the
// recency order is that of each producer's last write.
func (t *producerTable) replayOnto(dst *producerTable) {
	for i, f := range t.epochs {
		if f.epoch != 0 && f.epoch >= dst.epochs[i].epoch && f.index != 0 {
			dst.epochs[i] = f
		} else if f.epoch > dst.epochs[i].epoch {
			dst.epochs[i] = fenceEpoch{f.epoch, 0}
		}
	}
	for e := t.tail; e != nil; e = e.prev {
		for _, b := range e.batches[:e.n] {
			dst.record(e.id, b)
		}
	}
}

// seqVerdict is what the leader does with an idempotent batch.
type seqVerdict int

const (
	seqAppend     seqVerdict = iota // new and in order (or its producer is unknown): propose it
	seqDuplicate                    // an exact retry of a committed batch: answer with its offset
	seqInFlight                     // an exact retry of a batch proposed and not applied yet: wait for it
	seqOutOfOrder                   // anything else: OUT_OF_ORDER_SEQUENCE
)

// inflightSeq is a batch of an idempotent producer that this replica
// proposed as leader and has not applied yet.
type inflightSeq struct {
	seq    int64
	count  uint32
	offset int64  // base offset it was stamped with
	term   uint64 // the term it was proposed in
}

// checkSequence decides what the leader does with a batch of count records
// starting at seq from a producer of which the table knows committed (nil:
// unknown) and which has inflight (oldest first) proposed and not applied.
// For seqDuplicate and seqInFlight it returns the matching batch; for
// seqOutOfOrder, the sequence expected next. Pure.
func checkSequence(committed *producerEntry, inflight []inflightSeq, seq int64, count uint32) (v seqVerdict, match inflightSeq, expected int64) {
	for _, f := range inflight {
		if f.seq == seq && f.count == count {
			return seqInFlight, f, 0
		}
	}
	if committed != nil {
		if b, ok := committed.find(seq, count); ok {
			return seqDuplicate, inflightSeq{seq: b.seq, count: b.count, offset: b.offset}, 0
		}
	}
	switch {
	case len(inflight) > 0:
		expected = inflight[len(inflight)-1].seq + int64(inflight[len(inflight)-1].count)
	case committed != nil:
		expected = committed.last().end()
	default:
		return seqAppend, inflightSeq{}, 0 // first batch of this producer here, or it was evicted
	}
	if seq != expected {
		return seqOutOfOrder, inflightSeq{}, expected
	}
	return seqAppend, inflightSeq{}, 0
}

// Producer state file: magic, version, the raft index and term of the last
// entry the table covers, the producer count, per fencer (version 3: the
// transaction coordinator, then the scheduler; version 2: the coordinator
// alone) its epoch and the raft index of the entry that set it, then each
// producer from the least to the most recently written: its id, its batch
// count (1 to ProducerBatches) and per batch, oldest first, sequence,
// record count and offset; then the CRC32C of everything before it.
// Little-endian. Versions 1 (no epoch) and 2 are still read, with the
// epochs they lack 0.
var producersMagic = []byte("HPRD")

const (
	producersVersion = 3
	producersHead    = 4 + 1 + 8 + 8 + 4 // magic, version, index, term, count
	epochBytes       = 16                // per fencer: its epoch and the raft index of its entry
	producerMinBytes = 8 + 1 + batchBytesOnDisk
	batchBytesOnDisk = 8 + 4 + 8
)

// errProducersFile marks a producer state file that cannot be used.
var errProducersFile = errors.New("herald: bad producer state file")

// encode serializes the table, which covers the log up to the entry at
// index, of term.
func (t *producerTable) encode(index, term uint64) []byte {
	buf := make([]byte, 0, producersHead+len(t.m)*(producerMinBytes+2*batchBytesOnDisk)+4)
	buf = append(buf, producersMagic...)
	buf = append(buf, producersVersion)
	buf = binary.LittleEndian.AppendUint64(buf, index)
	buf = binary.LittleEndian.AppendUint64(buf, term)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(t.m)))
	for _, f := range t.epochs {
		buf = binary.LittleEndian.AppendUint64(buf, f.epoch)
		buf = binary.LittleEndian.AppendUint64(buf, f.index)
	}
	for e := t.tail; e != nil; e = e.prev {
		buf = binary.LittleEndian.AppendUint64(buf, e.id)
		buf = append(buf, byte(e.n))
		for _, b := range e.batches[:e.n] {
			buf = binary.LittleEndian.AppendUint64(buf, uint64(b.seq))
			buf = binary.LittleEndian.AppendUint32(buf, b.count)
			buf = binary.LittleEndian.AppendUint64(buf, uint64(b.offset))
		}
	}
	return binary.LittleEndian.AppendUint32(buf, crc32.Checksum(buf, castagnoli))
}

// decodeProducers reads a producer state file into a table of at most
// limit producers (the least recently written ones beyond it are dropped),
// and the index and term of the entry it covers. A damaged or crafted file
// is an error (errProducersFile), never a panic, and decoding allocates in
// proportion to the file's size (FuzzDecodeProducers,
// FuzzDecodeProducersBody).
func decodeProducers(data []byte, limit int) (t *producerTable, index, term uint64, err error) {
	head, fencers := producersHead, 0
	if len(data) > 4 && data[4] >= 2 {
		fencers = 1 // version 2: the coordinator's
		if data[4] >= 3 {
			fencers = len(epochList{})
		}
		head += fencers * epochBytes
	}
	if len(data) < head+4 || !bytes.Equal(data[:4], producersMagic) || data[4] > producersVersion || data[4] < 1 {
		return nil, 0, 0, fmt.Errorf("%w: header", errProducersFile)
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, 0, 0, fmt.Errorf("%w: checksum", errProducersFile)
	}
	index = binary.LittleEndian.Uint64(body[5:])
	term = binary.LittleEndian.Uint64(body[13:])
	n := binary.LittleEndian.Uint32(body[21:])
	rest := body[head:]
	if uint64(n) > uint64(len(rest))/producerMinBytes {
		return nil, 0, 0, fmt.Errorf("%w: %d producers in %d bytes", errProducersFile, n, len(rest))
	}
	t = newProducerTable(limit)
	for i := range fencers {
		at := producersHead + i*epochBytes
		t.epochs[i] = fenceEpoch{binary.LittleEndian.Uint64(body[at:]), binary.LittleEndian.Uint64(body[at+8:])}
	}
	for i := uint32(0); i < n; i++ {
		if len(rest) < 9 {
			return nil, 0, 0, fmt.Errorf("%w: producer %d truncated", errProducersFile, i)
		}
		id, nb := binary.LittleEndian.Uint64(rest), int(rest[8])
		rest = rest[9:]
		if id == 0 || nb < 1 || nb > ProducerBatches || len(rest) < nb*batchBytesOnDisk {
			return nil, 0, 0, fmt.Errorf("%w: producer %d (id %d, %d batches)", errProducersFile, i, id, nb)
		}
		if t.get(id) != nil {
			return nil, 0, 0, fmt.Errorf("%w: producer %d listed twice", errProducersFile, id)
		}
		for j := 0; j < nb; j++ {
			b := seqBatch{
				seq:    int64(binary.LittleEndian.Uint64(rest)),
				count:  binary.LittleEndian.Uint32(rest[8:]),
				offset: int64(binary.LittleEndian.Uint64(rest[12:])),
			}
			rest = rest[batchBytesOnDisk:]
			if b.seq < 0 || b.offset < 0 || b.count == 0 || b.seq > maxInt64-int64(b.count) || b.offset > maxInt64-int64(b.count) {
				return nil, 0, 0, fmt.Errorf("%w: producer %d batch %d: sequence %d, %d records at offset %d", errProducersFile, id, j, b.seq, b.count, b.offset)
			}
			t.record(id, b)
		}
	}
	if len(rest) != 0 {
		return nil, 0, 0, fmt.Errorf("%w: %d trailing bytes", errProducersFile, len(rest))
	}
	t.evictions = 0
	return t, index, term, nil
}

const maxInt64 = 1<<63 - 1

// loadProducers reads the producer state file at path ("" or missing: nil
// table, nil error).
func loadProducers(path string, limit int) (t *producerTable, index, term uint64, err error) {
	if path == "" {
		return nil, 0, 0, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, 0, nil
	}
	if err != nil {
		return nil, 0, 0, err
	}
	return decodeProducers(data, limit)
}
