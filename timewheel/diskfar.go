package timewheel

import (
	"bufio"
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/heraldmq/herald/persistence/vfs"
)

// ErrFarCorrupt marks a bucket file of a DiskFar that failed its checksum,
// ended inside a chunk, or held other entries than were written to it. Test
// for it with errors.Is.
var ErrFarCorrupt = errors.New("herald: corrupt scheduler bucket file")

// DefaultFarMaxBuffered is DiskFarOptions.MaxBuffered when left zero: 64Ki
// entries, 1 MiB of timers.
const DefaultFarMaxBuffered = 1 << 16

// DiskFarOptions configures a DiskFar. The zero value is usable.
type DiskFarOptions struct {
	// FS is the filesystem the bucket files live in; nil means vfs.Default.
	// Tests pass a fault-injecting one (persistence/errorfs).
	FS vfs.FS
	// MaxBuffered is the number of timers kept in memory waiting to be
	// written, across all buckets: 16 bytes each, plus up to about 90
	// bytes per bucket holding some (about 6 MiB at worst with the
	// default, when each buffered timer has a bucket of its own). When a Put takes it over the limit, the largest
	// buffers are written until half the limit is left. While writes fail,
	// timers stay in memory beyond it (see DiskFar). 0 means
	// DefaultFarMaxBuffered; negative is invalid.
	MaxBuffered int
}

// EnsureDefaults fills the fields left zero and returns o.
func (o DiskFarOptions) EnsureDefaults() DiskFarOptions {
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.MaxBuffered == 0 {
		o.MaxBuffered = DefaultFarMaxBuffered
	}
	return o
}

// Validate reports every problem of o at once.
func (o DiskFarOptions) Validate() error {
	var errs []error
	if o.MaxBuffered < 0 {
		errs = append(errs, fmt.Errorf("scheduler: DiskFarOptions.MaxBuffered is %d, want >= 0", o.MaxBuffered))
	}
	return errors.Join(errs...)
}

// DiskFarStats are a DiskFar's counters, for the scheduler's gauges.
type DiskFarStats struct {
	Buckets     int   // buckets holding timers
	OnDisk      int   // timers in bucket files
	Buffered    int   // timers in memory waiting to be written
	Files       int   // bucket files holding timers
	WriteErrors int64 // failed writes, truncations and removals
	ReadErrors  int64 // bucket files read short, unreadable or corrupt
}

// DiskFar is a FarStore that keeps distant timers on disk, one file per
// bucket ("<bucket>.far" in its directory), and in memory only a count per
// bucket (about 45 bytes with the map and the heap of bucket numbers) and
// a bounded write buffer: timers spread over 90 days (~119k buckets) cost
// about 11 MB of heap however many they are, not one heap object each. It
// holds no file open between calls. It is the one part of this package
// that does I/O, through the vfs.FS it is given.
//
// It is an index, not a record: the `__schedule` log is the truth, and the
// scheduler rebuilds the index from it at every start. So files are never
// fsynced, and OpenDiskFar throws away whatever the directory held.
//
// Remove only finds timers still in the write buffer: once a timer is
// written, Remove returns false and leaves it in its file, and the
// scheduler must drop it when it fires (it keeps its own record of
// cancelled timers). Wheel.Cancel reports the same.
//
// FarStore has no error returns, so failures are kept and counted: a write
// that fails (disk full, EIO) leaves its timers in memory, beyond
// MaxBuffered if need be, and is retried after MaxBuffered/2 more Puts; a
// bucket file that cannot be read, or is corrupt, gives back the timers it
// could read, and the others are lost until the index is rebuilt. Err
// reports the first error; Stats counts them.
//
// Put (when the buffer is full) and Take do file I/O on the caller's
// goroutine. A DiskFar belongs to the scheduler actor that owns its Wheel;
// it is not safe for concurrent use.
type DiskFar struct {
	fs  vfs.FS
	dir string
	max int

	// disk counts the timers on disk per known bucket. A bucket is known
	// from its first Put until First passes it, empty or not, and is in
	// order exactly once.
	disk   map[int64]int
	dirty  map[int64][]Entry // buffered timers per bucket
	sealed map[int64]bool    // buckets whose file has a torn tail past disk[b]
	order  bucketHeap        // the known buckets; First drops the empty ones

	live, onDisk, buffered, files int
	retryAt                       int // after a failed flush, Puts wait until buffered passes it
	writeErrs, readErrs           int64
	err                           error

	keys    []int64 // scratch: the buffers to flush
	scratch []byte  // one chunk, encoded or read
	rd      *bufio.Reader
}

const (
	farSuffix = ".far"
	// A bucket file is a sequence of chunks, one or more per flush:
	//	count  uint32 LE, 1..farChunkMax
	//	crc    uint32 LE, CRC-32C (Castagnoli) of count's 4 bytes and the records
	//	count records of 16 bytes: At int64 LE, Ref uint64 LE
	// The format has no version: the files never outlive the process
	// that wrote them.
	farHeader   = 8
	farRecord   = 16
	farChunkMax = 4096 // 64 KiB of records
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var _ FarStore = (*DiskFar)(nil)

// OpenDiskFar returns an empty DiskFar keeping its files in dir, which it
// creates if need be. It removes the bucket files a previous run left
// there; it refuses a directory holding anything else (a misconfigured dir
// must not be wiped).
func OpenDiskFar(dir string, opt DiskFarOptions) (*DiskFar, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	opt = opt.EnsureDefaults()
	if err := opt.FS.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("scheduler: far store: %w", err)
	}
	if err := removeFarFiles(opt.FS, dir, true); err != nil {
		return nil, err
	}
	return &DiskFar{
		fs:      opt.FS,
		dir:     dir,
		max:     opt.MaxBuffered,
		disk:    map[int64]int{},
		dirty:   map[int64][]Entry{},
		scratch: make([]byte, farHeader+farChunkMax*farRecord),
		rd:      bufio.NewReaderSize(nil, 64<<10),
	}, nil
}

// removeFarFiles removes dir's bucket files; with strict, anything else
// in dir is an error.
func removeFarFiles(fs vfs.FS, dir string, strict bool) error {
	ents, err := fs.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("scheduler: far store: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if _, ok := farBucketOf(e.Name()); !ok || !e.Type().IsRegular() {
			if strict {
				errs = append(errs, fmt.Errorf("scheduler: far store %s holds %q, not a bucket file: refusing to clear it", dir, e.Name()))
			}
			continue
		}
		if err := fs.Remove(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("scheduler: far store: %w", err))
		}
	}
	return errors.Join(errs...)
}

func farBucketOf(name string) (int64, bool) {
	s, ok := strings.CutSuffix(name, farSuffix)
	if !ok {
		return 0, false
	}
	b, err := strconv.ParseInt(s, 10, 64)
	return b, err == nil && strconv.FormatInt(b, 10) == s
}

func (d *DiskFar) path(b int64) string {
	return filepath.Join(d.dir, strconv.FormatInt(b, 10)+farSuffix)
}

// Put buffers e, and writes the largest buffers when the buffer is full.
// b must be e's bucket (e.At >> 16), as the Wheel passes it.
func (d *DiskFar) Put(b int64, e Entry) {
	if e.At>>farShift != b {
		panic("scheduler: DiskFar.Put: timer outside its bucket") // a bug, never input
	}
	n, known := d.disk[b]
	if !known {
		d.disk[b] = 0
		heap.Push(&d.order, b)
	}
	buf := d.dirty[b]
	if n == 0 && len(buf) == 0 {
		d.live++
	}
	d.dirty[b] = append(buf, e)
	d.buffered++
	if d.buffered > d.max && d.buffered > d.retryAt {
		d.flush(d.max / 2)
	}
}

// Take removes and returns bucket b's timers: its file's, then its
// buffered ones. If the file cannot be read whole it returns what it read
// and records the error; Len forgets the bucket either way.
func (d *DiskFar) Take(b int64) []Entry {
	n, known := d.disk[b]
	buf := d.dirty[b]
	if !known || n == 0 && len(buf) == 0 {
		return nil
	}
	delete(d.dirty, b)
	d.disk[b] = 0 // known until First passes it, so a later Put does not push it twice
	d.live--
	d.buffered -= len(buf)
	if n == 0 {
		return buf
	}
	d.onDisk -= n
	d.files--
	out := d.read(b, n, make([]Entry, 0, n+len(buf)))
	delete(d.sealed, b)
	if err := d.fs.Remove(d.path(b)); err != nil && !errors.Is(err, os.ErrNotExist) {
		// The next flush of b truncates the file (disk[b] is 0), and
		// Close and OpenDiskFar remove it.
		d.writeErrs++
		d.fail(fmt.Errorf("scheduler: far bucket %d: %w", b, err))
	}
	return append(out, buf...)
}

// read appends to out the n timers of b's file.
func (d *DiskFar) read(b int64, n int, out []Entry) []Entry {
	start := len(out)
	f, err := d.fs.OpenFile(d.path(b), os.O_RDONLY, 0)
	if err == nil {
		d.rd.Reset(f)
		out, err = decodeFarChunks(d.rd, b, out, d.scratch)
		d.rd.Reset(nil)
		if cerr := f.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}
	got := len(out) - start
	sealed := d.sealed[b]
	if got > n {
		out = out[:start+n]
		if !sealed && err == nil {
			err = fmt.Errorf("%w: holds %d timers, %d were written", ErrFarCorrupt, got, n)
		}
	}
	if sealed && got >= n {
		// A write to b failed and could not be undone: what follows the
		// n timers written before it is torn, and kept in memory.
		err = nil
	}
	if got < n && err == nil {
		err = fmt.Errorf("%w: holds %d timers, %d were written", ErrFarCorrupt, got, n)
	}
	if err != nil {
		d.readErrs++
		d.fail(fmt.Errorf("scheduler: far bucket %d: read %d of %d timers: %w", b, min(got, n), n, err))
	}
	return out
}

// Remove deletes e from b's write buffer, reporting whether it was there.
// A timer already written to b's file is not removed: Remove returns false
// and the timer is returned by Take (see DiskFar).
func (d *DiskFar) Remove(b int64, e Entry) bool {
	buf := d.dirty[b]
	i := slices.Index(buf, e)
	if i < 0 {
		return false
	}
	buf = slices.Delete(buf, i, i+1)
	d.buffered--
	if len(buf) > 0 {
		d.dirty[b] = buf
		return true
	}
	delete(d.dirty, b)
	if d.disk[b] == 0 {
		d.live--
	}
	return true
}

// First is the smallest bucket holding timers; ok is false if none.
func (d *DiskFar) First() (int64, bool) {
	for len(d.order) > 0 {
		b := d.order[0]
		if d.disk[b] > 0 || len(d.dirty[b]) > 0 {
			return b, true
		}
		delete(d.disk, b)
		heap.Pop(&d.order)
	}
	return 0, false
}

// Len is the number of timers held, on disk and buffered, including those
// written before they were cancelled.
func (d *DiskFar) Len() int { return d.onDisk + d.buffered }

// Err is the first write, read or corruption error since OpenDiskFar, or
// nil. It stays set: timers a read lost come back only when the scheduler
// rebuilds the index from its log.
func (d *DiskFar) Err() error { return d.err }

// Stats returns the counters.
func (d *DiskFar) Stats() DiskFarStats {
	return DiskFarStats{
		Buckets:     d.live,
		OnDisk:      d.onDisk,
		Buffered:    d.buffered,
		Files:       d.files,
		WriteErrors: d.writeErrs,
		ReadErrors:  d.readErrs,
	}
}

// Close forgets every timer and removes the bucket files (the next
// OpenDiskFar would). It holds no open file between calls, so nothing
// else needs releasing. The DiskFar must not be used after.
func (d *DiskFar) Close() error {
	*d = DiskFar{fs: d.fs, dir: d.dir, err: d.err}
	return removeFarFiles(d.fs, d.dir, false)
}

func (d *DiskFar) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

// flush writes the largest buffers until at most target timers are
// buffered: largest to within a factor of two (buffers are classed by the
// bit length of their size, and classes go from the top down), in bucket
// order within a class, so a run is reproducible. It stops at the first
// failed write and then, as when the buffers it may write do not bring it
// under target (sealed buckets), waits MaxBuffered/2 Puts before the next
// try: a full disk costs one failed write per MaxBuffered/2 Puts, not one
// per Put.
func (d *DiskFar) flush(target int) {
	var classes [bits.UintSize + 1]int // timers per class
	for b, buf := range d.dirty {
		if !d.sealed[b] {
			classes[bits.Len(uint(len(buf)))] += len(buf)
		}
	}
	low := len(classes) // the smallest class to write
	for left := d.buffered; low > 0 && left > target; {
		low--
		left -= classes[low]
	}
	d.keys = d.keys[:0]
	for b, buf := range d.dirty {
		if !d.sealed[b] && bits.Len(uint(len(buf))) >= low {
			d.keys = append(d.keys, b)
		}
	}
	slices.Sort(d.keys)
	d.retryAt = 0
	ok := true
	for _, above := range []bool{true, false} {
		for _, b := range d.keys {
			if !ok || d.buffered <= target {
				break
			}
			if buf, dirty := d.dirty[b]; dirty && (bits.Len(uint(len(buf))) > low) == above {
				ok = d.write(b)
			}
		}
	}
	if d.buffered > target {
		d.retryAt = d.buffered + d.max/2
	}
}

// write appends b's buffer to its file, reporting success. On failure the
// buffer stays, and the file is cut back to what it held; if it cannot
// be, b is sealed: its file is read only up to the timers written before,
// and its later timers stay in memory until Take.
func (d *DiskFar) write(b int64) bool {
	buf, n := d.dirty[b], d.disk[b]
	flag := os.O_WRONLY | os.O_CREATE | os.O_APPEND
	if n == 0 {
		flag |= os.O_TRUNC // a file left by a failed Remove holds nothing of ours
	}
	f, err := d.fs.OpenFile(d.path(b), flag, 0o640)
	if err != nil {
		return d.writeFailed(b, err)
	}
	var size int64
	if n > 0 {
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return d.writeFailed(b, err)
		}
		size = st.Size()
	}
	for rest := buf; len(rest) > 0 && err == nil; {
		k := min(len(rest), farChunkMax)
		chunk := encodeFarChunk(d.scratch[:0], rest[:k])
		var w int
		if w, err = f.Write(chunk); err == nil && w < len(chunk) {
			err = io.ErrShortWrite
		}
		rest = rest[k:]
	}
	if err != nil {
		if n == 0 {
			// Leave no empty file behind; one that stays is truncated by
			// the next write.
			f.Close()
			d.fs.Remove(d.path(b))
		} else if terr := f.Truncate(size); terr != nil {
			d.seal(b, terr)
			f.Close()
		} else {
			f.Close()
		}
		return d.writeFailed(b, err)
	}
	if err := f.Close(); err != nil {
		// What reached the file is unknown: keep the buffer and read only
		// the timers written before.
		if n > 0 {
			d.seal(b, err)
		}
		return d.writeFailed(b, err)
	}
	delete(d.dirty, b)
	d.disk[b] = n + len(buf)
	d.buffered -= len(buf)
	d.onDisk += len(buf)
	if n == 0 {
		d.files++
	}
	return true
}

func (d *DiskFar) writeFailed(b int64, err error) bool {
	d.writeErrs++
	d.fail(fmt.Errorf("scheduler: far bucket %d: write: %w", b, err))
	return false
}

func (d *DiskFar) seal(b int64, err error) {
	if d.sealed == nil {
		d.sealed = map[int64]bool{}
	}
	d.sealed[b] = true
	d.writeErrs++
	d.fail(fmt.Errorf("scheduler: far bucket %d: undo a failed write: %w", b, err))
}

// encodeFarChunk appends one chunk holding es (1..farChunkMax of them).
func encodeFarChunk(dst []byte, es []Entry) []byte {
	start := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(es)))
	dst = append(dst, 0, 0, 0, 0)
	for _, e := range es {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(e.At))
		dst = binary.LittleEndian.AppendUint64(dst, e.Ref)
	}
	c := crc32.Update(crc32.Checksum(dst[start:start+4], castagnoli), castagnoli, dst[start+farHeader:])
	binary.LittleEndian.PutUint32(dst[start+4:], c)
	return dst
}

// decodeFarChunks appends to out the timers of bucket b read from r, a
// sequence of chunks, stopping at the end of r or at the first bad chunk.
// A chunk that fails its checksum, ends early, declares 0 or more than
// farChunkMax records, or holds a timer of another bucket is an error
// marked ErrFarCorrupt, and none of its timers is returned; an error of r
// is returned as is. scratch must hold a whole chunk; beyond it, decoding
// allocates only the timers it returns.
func decodeFarChunks(r io.Reader, b int64, out []Entry, scratch []byte) ([]Entry, error) {
	hdr := scratch[:farHeader]
	for off := int64(0); ; {
		if _, err := io.ReadFull(r, hdr); err != nil {
			switch err {
			case io.EOF:
				return out, nil
			case io.ErrUnexpectedEOF:
				return out, fmt.Errorf("%w: chunk at byte %d: header cut short", ErrFarCorrupt, off)
			}
			return out, err
		}
		n := binary.LittleEndian.Uint32(hdr)
		if n == 0 || n > farChunkMax {
			return out, fmt.Errorf("%w: chunk at byte %d: %d records", ErrFarCorrupt, off, n)
		}
		body := scratch[farHeader : farHeader+int(n)*farRecord]
		if _, err := io.ReadFull(r, body); err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return out, fmt.Errorf("%w: chunk at byte %d: %d records cut short", ErrFarCorrupt, off, n)
			}
			return out, err
		}
		want := binary.LittleEndian.Uint32(hdr[4:])
		if crc32.Update(crc32.Checksum(hdr[:4], castagnoli), castagnoli, body) != want {
			return out, fmt.Errorf("%w: chunk at byte %d: checksum mismatch", ErrFarCorrupt, off)
		}
		start := len(out)
		for p := body; len(p) > 0; p = p[farRecord:] {
			e := Entry{At: int64(binary.LittleEndian.Uint64(p)), Ref: binary.LittleEndian.Uint64(p[8:])}
			if e.At>>farShift != b {
				return out[:start], fmt.Errorf("%w: chunk at byte %d: timer at %d is not in bucket %d", ErrFarCorrupt, off, e.At, b)
			}
			out = append(out, e)
		}
		off += int64(farHeader + len(body))
	}
}
