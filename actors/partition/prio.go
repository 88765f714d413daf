package partition

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"

	"github.com/RoaringBitmap/roaring/v2/roaring64"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Levels is the number of priority sub-queues a partition keeps: one per
// record priority 1-9 (level 0, the log itself, needs none).
const Levels = heraldpb.MaxPriority + 1

// prioIndex is a partition's priority sub-queues: for each level 1-9 the
// offsets of the committed records with that priority, in a roaring bitmap
// (dense runs cost bits, scattered offsets about two bytes each). As
// RocketMQ's consume queues index its commit log, the sub-queues index the
// partition's log: a consumer group reads a level's queue to deliver high
// priorities from anywhere in its span, not only from what it has read
// ahead. Entries are added when a committed entry that carries priorities
// (LogEntry.max_priority) is applied, and dropped with the log's front.
//
// The index is saved to a file (Config.IndexPath) from time to time and at
// stop, with the offset it is complete up to; at open it is loaded and the
// committed records after that offset (the gap) are indexed by a read of
// the log off the actor. Until the gap is closed the partition reports no
// sub-queue ends (Stats.PriorityEnd), so groups fall back to offset order.
// A missing or damaged file only costs that read over the whole log.
// Owned by the partition actor.
type prioIndex struct {
	lv           [Levels]*roaring64.Bitmap // [0] unused
	gapLo, gapHi int64                     // [gapLo, gapHi): committed, not indexed yet
	dirty        bool                      // changed since the last save
	saving       bool                      // a save is writing the file
	lastSave     int                       // actor tick of the last save
}

// reset empties the index; everything committed in [start, hw) is a gap.
func (x *prioIndex) reset(start, hw int64) {
	for i := range x.lv {
		x.lv[i] = nil
	}
	x.gapLo, x.gapHi = start, hw
	x.dirty = true
}

// complete reports whether every committed record is indexed.
func (x *prioIndex) complete() bool { return x.gapLo >= x.gapHi }

// add indexes the records of a committed batch at base; it returns the
// levels it added to as a bit set.
func (x *prioIndex) add(base int64, records []byte) (levels uint16) {
	_ = heraldpb.ForEachRawRecord(records, func(i int, rec []byte) bool {
		if p := heraldpb.RecordPriority(rec); p > 0 {
			x.put(p, base+int64(i))
			levels |= 1 << p
		}
		return true
	})
	return levels
}

func (x *prioIndex) put(level uint8, off int64) {
	if x.lv[level] == nil {
		x.lv[level] = roaring64.New()
	}
	x.lv[level].Add(uint64(off))
	x.dirty = true
}

// trim drops the entries below start (the log's new front).
func (x *prioIndex) trim(start int64) {
	for _, b := range x.lv {
		if b != nil && !b.IsEmpty() && b.Minimum() < uint64(start) {
			b.RemoveRange(0, uint64(start))
			x.dirty = true
		}
	}
	x.gapLo = max(x.gapLo, start)
}

// end is the offset after level's last entry (0: none), or 0 for every
// level while a gap is open.
func (x *prioIndex) end(level int) int64 {
	b := x.lv[level]
	if !x.complete() || b == nil || b.IsEmpty() {
		return 0
	}
	return int64(b.Maximum()) + 1
}

// query returns up to limit offsets of level in [from, to), ascending, and
// where the next query of that level should start: after the last offset
// returned when it hit limit, else to. A gap caps the answer at its start.
func (x *prioIndex) query(level int, from, to int64, limit int) (offs []int64, next int64) {
	if !x.complete() && to > x.gapLo {
		to = max(from, x.gapLo)
	}
	b := x.lv[level]
	if b == nil || from >= to || limit <= 0 {
		return nil, max(from, to)
	}
	it := b.Iterator()
	it.AdvanceIfNeeded(uint64(max(from, 0)))
	for it.HasNext() {
		o := int64(it.Next())
		if o >= to {
			break
		}
		offs = append(offs, o)
		if len(offs) == limit {
			return offs, o + 1
		}
	}
	return offs, to
}

// Index file: magic, version, the offset the index is complete up to, then
// per level 1-9 the length and bytes of its serialized bitmap, then the
// CRC32C of everything before it.
var prioMagic = []byte("HPRI")

const prioVersion = 1

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errPrioFile marks an index file that cannot be used.
var errPrioFile = errors.New("herald: bad priority index file")

// encode serializes the index, complete up to through.
func (x *prioIndex) encode(through int64) ([]byte, error) {
	var buf bytes.Buffer
	buf.Write(prioMagic)
	buf.WriteByte(prioVersion)
	_ = binary.Write(&buf, binary.LittleEndian, through)
	for l := 1; l < Levels; l++ {
		b := x.lv[l]
		if b == nil {
			b = roaring64.New()
		}
		b.RunOptimize()
		n := b.GetSerializedSizeInBytes()
		if n > math.MaxUint32 {
			return nil, fmt.Errorf("priority level %d index of %d bytes", l, n)
		}
		_ = binary.Write(&buf, binary.LittleEndian, uint32(n))
		if _, err := b.WriteTo(&buf); err != nil {
			return nil, err
		}
	}
	_ = binary.Write(&buf, binary.LittleEndian, crc32.Checksum(buf.Bytes(), castagnoli))
	return buf.Bytes(), nil
}

// decodePrio reads an index file's contents. A damaged or crafted file is
// an error (errPrioFile), never a panic or an allocation out of proportion
// to its size (FuzzDecodePrio, FuzzDecodePrioBody).
func decodePrio(data []byte) (lv [Levels]*roaring64.Bitmap, through int64, err error) {
	head := len(prioMagic) + 1 + 8
	if len(data) < head+4 || !bytes.Equal(data[:len(prioMagic)], prioMagic) || data[len(prioMagic)] != prioVersion {
		return lv, 0, fmt.Errorf("%w: header", errPrioFile)
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return lv, 0, fmt.Errorf("%w: checksum", errPrioFile)
	}
	through = int64(binary.LittleEndian.Uint64(body[len(prioMagic)+1:]))
	if through < 0 {
		return lv, 0, fmt.Errorf("%w: offset %d", errPrioFile, through)
	}
	rest := body[head:]
	for l := 1; l < Levels; l++ {
		if len(rest) < 4 {
			return lv, 0, fmt.Errorf("%w: level %d truncated", errPrioFile, l)
		}
		n := binary.LittleEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(n) > uint64(len(rest)) {
			return lv, 0, fmt.Errorf("%w: level %d length %d", errPrioFile, l, n)
		}
		b, err := decodeBitmap(rest[:n])
		if err != nil {
			return lv, 0, fmt.Errorf("%w: level %d: %v", errPrioFile, l, err)
		}
		if !b.IsEmpty() {
			lv[l] = b
		}
		rest = rest[n:]
	}
	if len(rest) != 0 {
		return lv, 0, fmt.Errorf("%w: %d trailing bytes", errPrioFile, len(rest))
	}
	return lv, through, nil
}

// decodeBitmap decodes a serialized roaring64 bitmap, refusing what the
// library would trust: a bucket count it allocates before reading the
// buckets (a count larger than the data could hold would exhaust memory,
// which no recover survives), unsorted keys or incoherent containers (read
// as they are, they would answer queries wrongly). A panic of the decoder
// on anything else it does not check is an error too.
func decodeBitmap(data []byte) (b *roaring64.Bitmap, err error) {
	// A bucket is a 4-byte key and a 32-bit bitmap of at least 4 bytes.
	if len(data) < 8 || binary.LittleEndian.Uint64(data) > uint64(len(data)-8)/8 {
		return nil, errors.New("bucket count beyond the data")
	}
	defer func() {
		if r := recover(); r != nil {
			b, err = nil, fmt.Errorf("bitmap decoder panicked: %v", r)
		}
	}()
	b = roaring64.New()
	if err := b.UnmarshalBinary(data); err != nil {
		return nil, err
	}
	if err := b.Validate(); err != nil {
		return nil, err
	}
	return b, nil
}

// load installs the index saved at path for a log of committed records
// [start, hw): entries outside it are dropped and the records after the
// saved offset form the gap. Without a usable file the whole log is the
// gap; the error says why (nil when there is simply no file).
func (x *prioIndex) load(path string, start, hw int64) error {
	x.reset(start, hw)
	if path == "" {
		return nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	lv, through, err := decodePrio(data)
	if err != nil {
		return err
	}
	x.lv = lv
	for _, b := range x.lv {
		if b != nil {
			b.RemoveRange(uint64(hw), math.MaxUint64)
		}
	}
	x.trim(start)
	x.gapLo = max(start, min(through, hw))
	x.dirty = false
	return nil
}

// replaceFile replaces path with data: a temporary file renamed over it.
// No fsync: the file (the priority index, the producer table) is a cache of
// the log, and a torn or stale one is detected (checksum, offset or index)
// and rebuilt.
func replaceFile(path string, data []byte) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o640); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// catchUpChunkBytes is about how many bytes of records one step of a
// catch-up read reads (at least one batch).
var catchUpChunkBytes = 4 << 20

// catchUp reads the committed records of [from, to) from store and reports
// their priorities in chunks, for the gap left at open. It runs on its own
// goroutine; report returns false to stop it (the actor reopened). Records
// that retention removes meanwhile are skipped.
func catchUp(store Storage, from, to int64, report func(prioChunk) bool) {
	for from < to {
		batches, err := store.ReadBatches(from, catchUpChunkBytes, to)
		if s := store.StartOffset(); errors.Is(err, persistence.ErrOffsetOutOfRange) && s > from {
			// Retention or compaction removed the front meanwhile: the
			// actor trims the gap likewise (prioIndex.trim).
			if s >= to {
				report(prioChunk{upTo: to})
				return
			}
			from = s
			continue
		}
		if err != nil {
			report(prioChunk{err: err})
			return
		}
		if len(batches) == 0 {
			report(prioChunk{upTo: to})
			return
		}
		var c prioChunk
		for _, b := range batches {
			_ = heraldpb.ForEachRawRecord(b.Records, func(i int, rec []byte) bool {
				if o := b.BaseOffset + int64(i); o >= from && o < to {
					if p := heraldpb.RecordPriority(rec); p > 0 {
						c.offs = append(c.offs, o)
						c.levels = append(c.levels, p)
					}
				}
				return true
			})
			c.upTo = b.BaseOffset + int64(b.Count)
		}
		c.upTo = min(max(c.upTo, from+1), to)
		if !report(c) {
			return
		}
		from = c.upTo
	}
}

// prioChunk is one step of a catch-up read: the priority records it found
// below upTo (offsets and their levels), or the error that stopped it.
type prioChunk struct {
	gen    uint64 // the log's (Actor.gen)
	run    uint64 // the catch-up's (Actor.prioRun)
	offs   []int64
	levels []uint8
	upTo   int64
	err    error
}

// prioSaved reports the end of a save started by the actor of gen.
type prioSaved struct {
	gen uint64
	err error
}
