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
}

// Fence reports whether the entry is a transaction coordinator's fence:
// an epoch and no records.
func (h LogEntryHeader) Fence() bool { return h.TxnEpoch != 0 && h.Count == 0 }

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
		case (num >= 1 && num <= 4 || num >= 6 && num <= 13) && typ == protowire.VarintType:
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
			}
		case num == 5 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return h, nil, badEntry("log entry records: %v", protowire.ParseError(n))
			}
			b = b[n:]
			records = v
		case num >= 1 && num <= 13:
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
	return h, records, nil
}
