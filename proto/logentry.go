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
		case (num >= 1 && num <= 4 || num >= 6 && num <= 16 || num == 18) && typ == protowire.VarintType:
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
		case num == 17 && typ == protowire.VarintType:
			// (an unpacked ref, which proto3 encoders do not write)
			return h, nil, badEntry("log entry txn refs are not packed")
		case num >= 1 && num <= 18:
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
	case h.RefCount > 0 && (h.TxnMarker != TxnMarker_TXN_MARKER_COMMIT || h.Count == 0):
		return h, nil, badEntry("log entry has %d txn refs, marker %d, count %d", h.RefCount, h.TxnMarker, h.Count)
	case h.TxnMarker == TxnMarker_TXN_MARKER_COMMIT && h.Count > 0 && h.RefCount == 0:
		return h, nil, badEntry("log entry is a commit marker of %d records without batches", h.Count)
	case h.TxnMarker > TxnMarker_TXN_MARKER_ABORT:
		return h, nil, badEntry("log entry txn marker %d is unknown", h.TxnMarker)
	case h.Fencer >= NumFencers:
		return h, nil, badEntry("log entry fencer %d is unknown", h.Fencer)
	}
	return h, records, nil
}
