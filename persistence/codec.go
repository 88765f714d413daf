package persistence

import (
	"encoding/binary"
	"fmt"
	heraldpb "github.com/heraldmq/herald/proto"
	"hash/crc32"

	"go.etcd.io/raft/v3/raftpb"
)

// castagnoli is the CRC32C table used for WAL entries and the state file.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crcLen is the size of the CRC32C prefix of every WAL entry.
const crcLen = 4

// entryMeta is what the indexes and retention need to know about one raft
// entry, without its records.
type entryMeta struct {
	index, term uint64
	hasRecords  bool  // a normal entry whose LogEntry has count > 0
	base        int64 // LogEntry.base_offset
	count       uint32
	appendMs    int64
	maxTsMs     int64
	size        int64 // bytes the entry occupies in its WAL segment
	// txnCount > 0: a transactional batch of that many records, which
	// holds no offset (hasRecords is false) until a commit marker names it.
	txnCount uint32
	// refs: a commit marker's batches (raft indexes, in offset order),
	// whose records its offsets [base, end) are.
	refs []uint64
	// txn: a transactional batch, a transaction marker or a session fence.
	txn bool
}

// end is the offset after the entry's last record.
func (m *entryMeta) end() int64 { return m.base + int64(m.count) }

// logHeader is a decoded heraldpb.LogEntry without its records.
type logHeader struct {
	base     int64
	count    uint32
	appendMs int64
	maxTsMs  int64
	txnCount uint32
	refs     []uint64
	marker   bool
	// sessionFence: a session fence (LogEntry.session_fence), transactional
	// state a partition rebuilds from the log like batches and markers.
	sessionFence bool
	// txnInline: a transaction committed with its records
	// (LogEntry.txn_commit_inline), transactional like the above.
	txnInline bool
}

// framedSize is the number of bytes tidwall/wal's binary format uses for a
// payload of n bytes: a uvarint length and the payload.
func framedSize(n int) int64 {
	var buf [binary.MaxVarintLen64]byte
	return int64(binary.PutUvarint(buf[:], uint64(n)) + n)
}

// appendEncodedEntry appends the WAL payload of e to dst:
// crc32c(u32 little-endian) of the marshalled entry, then raftpb.Entry.Marshal().
func appendEncodedEntry(dst []byte, e *raftpb.Entry) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, encodedSize(e))...)
	encodeEntry(dst[start:], e)
	return dst
}

// encodedSize is the length of e's WAL payload.
func encodedSize(e *raftpb.Entry) int { return crcLen + e.Size() }

// encodeEntry writes e's WAL payload (see appendEncodedEntry) into dst,
// which must be exactly encodedSize(e) bytes long; every byte is written.
func encodeEntry(dst []byte, e *raftpb.Entry) {
	body := dst[crcLen:]
	if _, err := e.MarshalToSizedBuffer(body); err != nil {
		// MarshalToSizedBuffer only fails on a too-small buffer.
		panic(err)
	}
	binary.LittleEndian.PutUint32(dst, crc32.Checksum(body, castagnoli))
}

// decodeEntry decodes one WAL payload: it verifies the CRC32C, unmarshals
// the raftpb.Entry and, for a normal entry with data, its heraldpb.LogEntry
// header. records aliases e.Data. Every failure is marked ErrCorrupt. It
// never panics.
func decodeEntry(b []byte) (e raftpb.Entry, m entryMeta, records []byte, err error) {
	if len(b) < crcLen {
		return e, m, nil, corruptf("entry of %d bytes is shorter than its checksum", len(b))
	}
	body := b[crcLen:]
	if want, got := binary.LittleEndian.Uint32(b), crc32.Checksum(body, castagnoli); want != got {
		return e, m, nil, corruptf("entry checksum mismatch: stored %08x, computed %08x", want, got)
	}
	if err := e.Unmarshal(body); err != nil {
		return raftpb.Entry{}, m, nil, corruptf("raft entry does not unmarshal: %v", err)
	}
	m, records, err = entryMetaOf(&e)
	if err != nil {
		return raftpb.Entry{}, m, nil, err
	}
	m.size = framedSize(len(b))
	return e, m, records, nil
}

// entryMetaOf extracts the index metadata of e (size excluded). A normal
// entry with non-empty Data must hold a valid LogEntry.
func entryMetaOf(e *raftpb.Entry) (entryMeta, []byte, error) {
	m := entryMeta{index: e.Index, term: e.Term}
	if e.Type != raftpb.EntryNormal || len(e.Data) == 0 {
		return m, nil, nil
	}
	h, records, err := decodeLogEntry(e.Data)
	if err != nil {
		return m, nil, err
	}
	m.base, m.count, m.appendMs, m.maxTsMs = h.base, h.count, h.appendMs, h.maxTsMs
	m.hasRecords = h.count > 0
	m.txnCount, m.refs, m.txn = h.txnCount, h.refs, h.txnCount > 0 || h.marker || h.sessionFence || h.txnInline
	return m, records, nil
}

// decodeLogEntry is heraldpb.ScanLogEntry with its errors marked ErrCorrupt.
func decodeLogEntry(b []byte) (h logHeader, records []byte, err error) {
	ph, records, err := heraldpb.ScanLogEntry(b)
	if err != nil {
		return h, nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	h = logHeader{base: ph.BaseOffset, count: ph.Count, appendMs: ph.AppendTimeMs, maxTsMs: ph.MaxTimestampMs, txnCount: ph.TxnCount,
		marker: ph.TxnMarker != heraldpb.TxnMarker_TXN_MARKER_NONE, sessionFence: ph.SessionFence > 0, txnInline: ph.TxnCommitInline}
	if ph.RefCount > 0 {
		h.refs = ph.AppendRefs(make([]uint64, 0, ph.RefCount))
	}
	return h, records, nil
}

// diskState is the content of the state file.
type diskState struct {
	hs         raftpb.HardState
	cs         raftpb.ConfState
	snapIndex  uint64 // raft index just before FirstIndex
	snapTerm   uint64 // its term
	snapOffset int64  // offset at FirstIndex (heraldpb.SnapshotData.next_offset)
	// resetting is set while ApplySnapshot replaces the WAL; Open finishes
	// the reset if it finds it set.
	resetting bool
	// The membership as of snapIndex (what a raft snapshot of this log
	// carries), and after each membership change logged since (confs,
	// ascending, at most maxConfHistory). Past that many, the oldest is
	// dropped and the indexes [gapFrom, gapTo) where the membership is no
	// longer known cannot become the snapshot point. A state file of the
	// earlier format has none of this: snapCS is then cs.
	snapCS         raftpb.ConfState
	confs          []confAt
	gapFrom, gapTo uint64
}

// confAt is the membership from a raft index on.
type confAt struct {
	index uint64
	cs    raftpb.ConfState
}

// maxConfHistory bounds diskState.confs (a state slot is 4 KiB).
const maxConfHistory = 32

const stateMagic = "HRLDST01"

// encodeState returns the state file bytes: magic, flags, snapshot point,
// HardState, ConfState, then a CRC32C (little-endian) of everything before.
func encodeState(s *diskState) []byte {
	b := []byte(stateMagic)
	var flags byte
	if s.resetting {
		flags |= 1
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, s.snapIndex)
	b = binary.AppendUvarint(b, s.snapTerm)
	b = binary.AppendVarint(b, s.snapOffset)
	hs, _ := s.hs.Marshal()
	cs, _ := s.cs.Marshal()
	b = binary.AppendUvarint(b, uint64(len(hs)))
	b = append(b, hs...)
	b = binary.AppendUvarint(b, uint64(len(cs)))
	b = append(b, cs...)
	snapCS, _ := s.snapCS.Marshal()
	b = binary.AppendUvarint(b, uint64(len(snapCS)))
	b = append(b, snapCS...)
	b = binary.AppendUvarint(b, s.gapFrom)
	b = binary.AppendUvarint(b, s.gapTo)
	b = binary.AppendUvarint(b, uint64(len(s.confs)))
	for _, c := range s.confs {
		b = binary.AppendUvarint(b, c.index)
		m, _ := c.cs.Marshal()
		b = binary.AppendUvarint(b, uint64(len(m)))
		b = append(b, m...)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// decodeState parses encodeState's output; failures are marked ErrCorrupt.
func decodeState(b []byte) (diskState, error) {
	var s diskState
	if len(b) < len(stateMagic)+1+4 || string(b[:len(stateMagic)]) != stateMagic {
		return s, corruptf("state file: bad magic or length %d", len(b))
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return s, corruptf("state file: checksum mismatch")
	}
	p := body[len(stateMagic):]
	s.resetting = p[0]&1 != 0
	p = p[1:]
	var n int
	fail := func(what string) (diskState, error) { return diskState{}, corruptf("state file: bad %s", what) }
	if s.snapIndex, n = binary.Uvarint(p); n <= 0 {
		return fail("snapshot index")
	}
	p = p[n:]
	if s.snapTerm, n = binary.Uvarint(p); n <= 0 {
		return fail("snapshot term")
	}
	p = p[n:]
	if s.snapOffset, n = binary.Varint(p); n <= 0 {
		return fail("snapshot offset")
	}
	p = p[n:]
	section := func(part func([]byte) error) error {
		l, n := binary.Uvarint(p)
		if n <= 0 || uint64(len(p)-n) < l {
			return corruptf("state file: bad section length")
		}
		if err := part(p[n : n+int(l)]); err != nil {
			return corruptf("state file: bad section: %v", err)
		}
		p = p[n+int(l):]
		return nil
	}
	for _, part := range []func([]byte) error{s.hs.Unmarshal, s.cs.Unmarshal} {
		if err := section(part); err != nil {
			return diskState{}, err
		}
	}
	if len(p) == 0 {
		s.snapCS = s.cs // the earlier format
		return s, nil
	}
	if err := section(s.snapCS.Unmarshal); err != nil {
		return diskState{}, err
	}
	var count uint64
	for _, v := range []*uint64{&s.gapFrom, &s.gapTo, &count} {
		if *v, n = binary.Uvarint(p); n <= 0 {
			return fail("membership history")
		}
		p = p[n:]
	}
	if count > maxConfHistory {
		return fail("membership history length")
	}
	for range count {
		var c confAt
		if c.index, n = binary.Uvarint(p); n <= 0 {
			return fail("membership history index")
		}
		p = p[n:]
		if err := section(c.cs.Unmarshal); err != nil {
			return diskState{}, err
		}
		s.confs = append(s.confs, c)
	}
	if len(p) != 0 {
		return fail("trailing bytes")
	}
	return s, nil
}

// crc32c returns the CRC32C of b.
func crc32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }
