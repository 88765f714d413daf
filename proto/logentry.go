package heraldpb

import (
	"errors"
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// ErrBadLogEntry marks data that is not a valid encoded LogEntry.
var ErrBadLogEntry = errors.New("herald: bad log entry")

func badEntry(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadLogEntry, fmt.Sprintf(format, args...))
}

// LogEntryHeader is a LogEntry without its records.
type LogEntryHeader struct {
	BaseOffset     int64
	Count          uint32
	AppendTimeMs   int64
	MaxTimestampMs int64
	MaxPriority    uint32
	// ProducerID and BaseSequence identify an idempotent producer's batch
	// (ProducerID 0: none). The sequence is as stamped: callers that rely
	// on it check its range.
	ProducerID   uint64
	BaseSequence int64
	// NotBeforeMs: the entry is held unreadable until then, by the
	// leader's clock (0: not held).
	NotBeforeMs int64
	// HoldUs: the hold the leader decided (µs; 0: none, or a leader that
	// predates the field); see LogEntry.hold_us.
	HoldUs uint32
	// TxnEpoch is the appending transaction coordinator's epoch (0: none);
	// with Count 0 the entry is a fence (see LogEntry.txn_epoch).
	TxnEpoch uint64
	// TxnEpochResetFrom: a fence that sets TxnEpoch only over exactly this
	// epoch (see LogEntry.txn_epoch_reset_from).
	TxnEpochResetFrom  uint64
	TxnEpochResetIndex uint64
	// Fencer is whose epoch TxnEpoch is (LogEntry.fencer), checked to be
	// one of the Fencer values.
	Fencer Fencer
	// TxnCount > 0: a transactional batch of that many records, which
	// holds no offset until a commit marker gives them theirs (see
	// LogEntry.txn_count).
	TxnCount uint32
	// ProducerEpoch is the transactional producer's epoch (batches and
	// markers).
	ProducerEpoch uint32
	// TxnMarker: the entry ends a transaction (LogEntry.txn_marker).
	TxnMarker TxnMarker
	// Refs holds a commit marker's batch entries (LogEntry.txn_refs), as
	// packed varints, checked; RefCount is how many. Read them with
	// AppendRefs.
	Refs     []byte
	RefCount int
	// More holds the entry's markers after the first
	// (LogEntry.txn_markers), checked. Read every marker with Markers.
	More []MarkerItem
	// SessionFence > 0: the entry fences ProducerID's transactional
	// batches of epochs below it (LogEntry.session_fence).
	SessionFence uint32
	// TxnCommitInline: the entry is a whole transaction of ProducerID and
	// ProducerEpoch, committed with its records (LogEntry.txn_commit_inline).
	TxnCommitInline bool
}

// MarkerItem is one transaction end of a marker entry: its producer id
// and epoch, commit or abort, its records (a commit's) and how many of
// the entry's refs are its batches.
type MarkerItem struct {
	ProducerID    uint64
	ProducerEpoch uint32
	Marker        TxnMarker
	Count         uint32
	Refs          int
}

// Markers is a marker entry's transaction ends in order, the first from
// the entry's own fields (nil: not a marker). Their records take the
// entry's offsets from BaseOffset in this order, and their batches its
// refs.
func (h LogEntryHeader) Markers() []MarkerItem {
	if h.TxnMarker == TxnMarker_TXN_MARKER_NONE {
		return nil
	}
	first := MarkerItem{ProducerID: h.ProducerID, ProducerEpoch: h.ProducerEpoch, Marker: h.TxnMarker, Count: h.Count, Refs: h.RefCount}
	for _, m := range h.More {
		first.Count -= m.Count // (ScanLogEntry checked the sums)
		first.Refs -= m.Refs
	}
	return append([]MarkerItem{first}, h.More...)
}

// TxnBatch reports whether the entry is a transactional batch that holds
// no offset (yet).
func (h LogEntryHeader) TxnBatch() bool { return h.TxnCount > 0 }

// AppendRefs appends a commit marker's batch entries (raft indexes) to
// dst.
func (h LogEntryHeader) AppendRefs(dst []uint64) []uint64 {
	b := h.Refs
	for len(b) > 0 {
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			break // (checked by ScanLogEntry)
		}
		dst = append(dst, v)
		b = b[n:]
	}
	return dst
}

// Fence reports whether the entry is a fence (of h.Fencer): an epoch and
// no records.
func (h LogEntryHeader) Fence() bool { return h.TxnEpoch != 0 && h.Count == 0 }

// NumFencers is how many Fencer values there are: a fencer is below it.
const NumFencers = Fencer_FENCER_SCHEDULER + 1

// ScanLogEntry decodes a marshalled heraldpb.LogEntry without copying its
// records (the result aliases b). Unknown fields are skipped; a known field
// with the wrong wire type, a negative base offset or an offset range that
// overflows is an error wrapping ErrBadLogEntry. It never panics. The
// producer id and sequence are not checked: the leader validated them.
func ScanLogEntry(b []byte) (h LogEntryHeader, records []byte, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return h, nil, badEntry("log entry: %v", protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case (num >= 1 && num <= 4 || num >= 6 && num <= 16 || num == 18 || num == 20 || num == 21) && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return h, nil, badEntry("log entry field %d: %v", num, protowire.ParseError(n))
			}
			b = b[n:]
			switch num {
			case 1:
				h.BaseOffset = int64(v)
			case 2:
				h.Count = uint32(v)
			case 3:
				h.AppendTimeMs = int64(v)
			case 4:
				h.MaxTimestampMs = int64(v)
			case 6:
				h.MaxPriority = uint32(min(v, math.MaxUint32))
			case 7:
				h.ProducerID = v
			case 8:
				h.BaseSequence = int64(v)
			case 9:
				h.NotBeforeMs = int64(v)
			case 10:
				h.HoldUs = uint32(min(v, math.MaxUint32))
			case 11:
				h.TxnEpoch = v
			case 12:
				h.TxnEpochResetFrom = v
			case 13:
				h.TxnEpochResetIndex = v
			case 14:
				h.TxnCount = uint32(min(v, math.MaxUint32))
			case 15:
				h.ProducerEpoch = uint32(min(v, math.MaxUint32))
			case 16:
				h.TxnMarker = TxnMarker(min(v, math.MaxInt32))
			case 18:
				h.Fencer = Fencer(min(v, math.MaxInt32))
			case 20:
				h.SessionFence = uint32(min(v, math.MaxUint32))
			case 21:
				h.TxnCommitInline = v != 0
			}
		case num == 17 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return h, nil, badEntry("log entry txn refs: %v", protowire.ParseError(n))
			}
			b = b[n:]
			for r := v; len(r) > 0; {
				_, n := protowire.ConsumeVarint(r)
				if n < 0 {
					return h, nil, badEntry("log entry txn ref: %v", protowire.ParseError(n))
				}
				r = r[n:]
				h.RefCount++
			}
			if h.Refs == nil {
				h.Refs = v // aliases b
			} else { // (a packed field may come in parts, which concatenate)
				h.Refs = append(h.Refs[:len(h.Refs):len(h.Refs)], v...)
			}
		case num == 5 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return h, nil, badEntry("log entry records: %v", protowire.ParseError(n))
			}
			b = b[n:]
			records = v
		case num == 19 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return h, nil, badEntry("log entry txn marker: %v", protowire.ParseError(n))
			}
			b = b[n:]
			m, err := scanMarkerItem(v)
			if err != nil {
				return h, nil, err
			}
			h.More = append(h.More, m)
		case num == 17 && typ == protowire.VarintType:
			// (an unpacked ref, which proto3 encoders do not write)
			return h, nil, badEntry("log entry txn refs are not packed")
		case num >= 1 && num <= 21:
			return h, nil, badEntry("log entry field %d has wire type %d", num, typ)
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return h, nil, badEntry("log entry field %d: %v", num, protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	if h.BaseOffset < 0 {
		return h, nil, badEntry("log entry base offset %d is negative", h.BaseOffset)
	}
	if h.BaseOffset > math.MaxInt64-int64(h.Count) {
		return h, nil, badEntry("log entry offsets overflow: base %d count %d", h.BaseOffset, h.Count)
	}
	switch {
	case h.TxnCount > 0 && (h.Count > 0 || h.TxnMarker != TxnMarker_TXN_MARKER_NONE):
		return h, nil, badEntry("log entry is a transactional batch of %d records with count %d and marker %d", h.TxnCount, h.Count, h.TxnMarker)
	case h.TxnMarker != TxnMarker_TXN_MARKER_NONE && (len(records) > 0 || h.ProducerID == 0):
		return h, nil, badEntry("log entry is a transaction marker with %d bytes of records, producer %d", len(records), h.ProducerID)
	case h.TxnMarker == TxnMarker_TXN_MARKER_NONE && (h.RefCount > 0 || len(h.More) > 0):
		return h, nil, badEntry("log entry has %d txn refs and %d more markers, and no marker", h.RefCount, len(h.More))
	case h.TxnMarker > TxnMarker_TXN_MARKER_ABORT:
		return h, nil, badEntry("log entry txn marker %d is unknown", h.TxnMarker)
	case h.Fencer >= NumFencers:
		return h, nil, badEntry("log entry fencer %d is unknown", h.Fencer)
	case h.TxnCommitInline && (h.ProducerID == 0 || h.Count == 0 || len(records) == 0 || h.TxnCount > 0 || h.TxnMarker != TxnMarker_TXN_MARKER_NONE || h.TxnEpoch != 0 || h.SessionFence > 0):
		return h, nil, badEntry("log entry is a transaction committed inline of producer %d with %d bytes of records, count %d, txn count %d, marker %d, epoch %d, fence %d",
			h.ProducerID, len(records), h.Count, h.TxnCount, h.TxnMarker, h.TxnEpoch, h.SessionFence)
	case h.SessionFence > 0 && (h.ProducerID == 0 || len(records) > 0 || h.Count > 0 || h.TxnCount > 0 || h.TxnMarker != TxnMarker_TXN_MARKER_NONE || h.TxnEpoch != 0):
		return h, nil, badEntry("log entry is a session fence of producer %d with %d bytes of records, count %d, txn count %d, marker %d, epoch %d",
			h.ProducerID, len(records), h.Count, h.TxnCount, h.TxnMarker, h.TxnEpoch)
	}
	if h.TxnMarker != TxnMarker_TXN_MARKER_NONE {
		var count uint64
		refs := 0
		for _, m := range h.More {
			count += uint64(m.Count)
			refs += m.Refs
		}
		if count > uint64(h.Count) || refs > h.RefCount {
			return h, nil, badEntry("log entry's markers count %d records and %d refs, more than its %d and %d", count, refs, h.Count, h.RefCount)
		}
		for i, m := range h.Markers() {
			if err := m.check(); err != nil {
				return h, nil, badEntry("log entry's marker %d: %v", i, err)
			}
		}
	}
	return h, records, nil
}

// check validates one transaction end of a marker entry.
func (m MarkerItem) check() error {
	switch {
	case m.ProducerID == 0:
		return errors.New("no producer id")
	case m.Marker != TxnMarker_TXN_MARKER_COMMIT && m.Marker != TxnMarker_TXN_MARKER_ABORT:
		return fmt.Errorf("marker %d is unknown", m.Marker)
	case m.Marker == TxnMarker_TXN_MARKER_ABORT && (m.Count > 0 || m.Refs > 0):
		return fmt.Errorf("an abort with %d records and %d batches", m.Count, m.Refs)
	case (m.Count > 0) != (m.Refs > 0):
		return fmt.Errorf("a commit of %d records in %d batches", m.Count, m.Refs)
	case uint64(m.Refs) > uint64(m.Count):
		return fmt.Errorf("%d batches hold %d records", m.Refs, m.Count)
	}
	return nil
}

// scanMarkerItem decodes a TxnMarkerItem.
func scanMarkerItem(b []byte) (MarkerItem, error) {
	var m MarkerItem
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return m, badEntry("log entry txn marker: %v", protowire.ParseError(n))
		}
		b = b[n:]
		if num < 1 || num > 5 {
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return m, badEntry("log entry txn marker field %d: %v", num, protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		if typ != protowire.VarintType {
			return m, badEntry("log entry txn marker field %d has wire type %d", num, typ)
		}
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return m, badEntry("log entry txn marker field %d: %v", num, protowire.ParseError(n))
		}
		b = b[n:]
		switch num { // (as protobuf decodes them: uint32 and enum fields truncate)
		case 1:
			m.ProducerID = v
		case 2:
			m.ProducerEpoch = uint32(v)
		case 3:
			m.Marker = TxnMarker(int32(v))
		case 4:
			m.Count = uint32(v)
		case 5:
			m.Refs = int(uint32(v))
		}
	}
	return m, nil
}
