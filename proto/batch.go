package heraldpb

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// MaxPriority is the highest record priority (0 is the lowest).
const MaxPriority = 9

// ErrBadBatch marks a record batch that is not a valid encoded RecordBatch.
var ErrBadBatch = errors.New("herald: bad record batch")

// BatchInfo is what the broker needs to know of a batch without decoding it.
type BatchInfo struct {
	Count        int
	MinTimestamp int64 // smallest non-zero record timestamp, 0 if none
	MaxTimestamp int64 // largest record timestamp, 0 if none
	MaxRecord    int   // size of the largest encoded record
	MaxPriority  uint8 // highest record priority (RecordPriority), 0 if none
	FirstKey     []byte
}

// ScanBatch validates an encoded RecordBatch in one pass with no allocation
// beyond the result, and reports its record count and timestamps. FirstKey
// aliases b. It never panics on any input.
func ScanBatch(b []byte) (BatchInfo, error) {
	var info BatchInfo
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return info, fmt.Errorf("%w: %v", ErrBadBatch, protowire.ParseError(n))
		}
		b = b[n:]
		if num != 1 || typ != protowire.BytesType {
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return info, fmt.Errorf("%w: %v", ErrBadBatch, protowire.ParseError(m))
			}
			b = b[m:]
			continue
		}
		rec, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return info, fmt.Errorf("%w: %v", ErrBadBatch, protowire.ParseError(m))
		}
		b = b[m:]
		key, ts, prio, err := scanRecord(rec)
		if err != nil {
			return info, err
		}
		info.MaxPriority = max(info.MaxPriority, prio)
		if info.Count == 0 {
			info.FirstKey = key
		}
		info.Count++
		if len(rec) > info.MaxRecord {
			info.MaxRecord = len(rec)
		}
		if ts != 0 {
			if info.MinTimestamp == 0 || ts < info.MinTimestamp {
				info.MinTimestamp = ts
			}
			if ts > info.MaxTimestamp {
				info.MaxTimestamp = ts
			}
		}
	}
	return info, nil
}

// scanRecord checks one encoded Record and returns its key, timestamp and
// priority (the last occurrence, as RecordPriority reads it).
func scanRecord(b []byte) (key []byte, ts int64, prio uint8, err error) {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return nil, 0, 0, fmt.Errorf("%w: record: %v", ErrBadBatch, protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil, 0, 0, fmt.Errorf("%w: record key: %v", ErrBadBatch, protowire.ParseError(m))
			}
			key, b = v, b[m:]
		case num == 4 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return nil, 0, 0, fmt.Errorf("%w: record timestamp: %v", ErrBadBatch, protowire.ParseError(m))
			}
			ts, b = int64(v), b[m:]
		case (num == 6 || num == 7) && typ != protowire.VarintType:
			return nil, 0, 0, fmt.Errorf("%w: record field %d has wire type %d", ErrBadBatch, num, typ)
		case num == 6 || num == 7:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return nil, 0, 0, fmt.Errorf("%w: record field %d: %v", ErrBadBatch, num, protowire.ParseError(m))
			}
			b = b[m:]
			if num == 6 && v > MaxPriority {
				return nil, 0, 0, fmt.Errorf("%w: record priority %d is above %d", ErrBadBatch, v, MaxPriority)
			}
			if num == 6 {
				prio = uint8(v)
			}
			if num == 7 && int64(v) < 0 {
				return nil, 0, 0, fmt.Errorf("%w: negative record ttl_ms %d", ErrBadBatch, int64(v))
			}
		case (num == 2 || num == 3 || num == 5) && typ != protowire.BytesType:
			return nil, 0, 0, fmt.Errorf("%w: record field %d has wire type %d", ErrBadBatch, num, typ)
		case num == 3 || num == 5:
			// A header must be a valid Header and a tag valid UTF-8, or
			// consumers could not decode the stored batch.
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil, 0, 0, fmt.Errorf("%w: record field %d: %v", ErrBadBatch, num, protowire.ParseError(m))
			}
			b = b[m:]
			if num == 5 && !utf8.Valid(v) {
				return nil, 0, 0, fmt.Errorf("%w: record tag is not valid UTF-8", ErrBadBatch)
			}
			if num == 3 {
				if err := scanHeader(v); err != nil {
					return nil, 0, 0, err
				}
			}
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return nil, 0, 0, fmt.Errorf("%w: record: %v", ErrBadBatch, protowire.ParseError(m))
			}
			b = b[m:]
		}
	}
	if ts < 0 {
		return nil, 0, 0, fmt.Errorf("%w: negative record timestamp %d", ErrBadBatch, ts)
	}
	return key, ts, prio, nil
}

// scanHeader checks one encoded Header: a UTF-8 key (field 1) and any value.
func scanHeader(b []byte) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: record header: %v", ErrBadBatch, protowire.ParseError(n))
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return fmt.Errorf("%w: record header: %v", ErrBadBatch, protowire.ParseError(m))
		}
		if num == 1 && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b)
			if !utf8.Valid(v) {
				return fmt.Errorf("%w: record header key is not valid UTF-8", ErrBadBatch)
			}
		}
		b = b[m:]
	}
	return nil
}

// consumeTag is protowire.ConsumeTag that also rejects field numbers above
// protowire.MaxValidNumber, as proto.Unmarshal does.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	num, typ, n := protowire.ConsumeTag(b)
	if n >= 0 && num > protowire.MaxValidNumber {
		return 0, 0, -1
	}
	return num, typ, n
}
