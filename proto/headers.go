package heraldpb

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// AppendBatchHeaders returns a copy of the encoded RecordBatch b in which
// every record carries the headers hdrs (key, value pairs) after its own.
// A record's headers are a repeated field, so appending encoded Header
// fields to a record's bytes adds them without decoding or re-encoding
// the rest. b must be valid (ScanBatch); an invalid b is an error, never a
// panic.
func AppendBatchHeaders(b []byte, hdrs ...[2]string) ([]byte, error) {
	extra := EncodeHeaders(nil, hdrs...)
	return AppendBatchWithHeaders(make([]byte, 0, len(b)+len(b)/8+len(extra)*4), b, extra)
}

// EncodeHeaders appends hdrs (key, value pairs) to dst as encoded Header
// fields of a Record, for AppendBatchWithHeaders.
func EncodeHeaders(dst []byte, hdrs ...[2]string) []byte {
	for _, h := range hdrs {
		n := protowire.SizeTag(1) + protowire.SizeBytes(len(h[0])) + protowire.SizeTag(2) + protowire.SizeBytes(len(h[1]))
		dst = protowire.AppendTag(dst, 3, protowire.BytesType)
		dst = protowire.AppendVarint(dst, uint64(n))
		dst = protowire.AppendTag(dst, 1, protowire.BytesType)
		dst = protowire.AppendString(dst, h[0])
		dst = protowire.AppendTag(dst, 2, protowire.BytesType)
		dst = protowire.AppendString(dst, h[1])
	}
	return dst
}

// AppendBatchWithHeaders appends to dst a copy of the encoded RecordBatch
// b in which every record ends with extra (encoded Header fields, see
// EncodeHeaders). An invalid b is an error, and dst is then returned as
// it was.
func AppendBatchWithHeaders(dst, b, extra []byte) ([]byte, error) {
	out := dst
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return dst, fmt.Errorf("%w: %v", ErrBadBatch, protowire.ParseError(n))
		}
		if num != 1 || typ != protowire.BytesType {
			m := protowire.ConsumeFieldValue(num, typ, b[n:])
			if m < 0 {
				return dst, fmt.Errorf("%w: %v", ErrBadBatch, protowire.ParseError(m))
			}
			out = append(out, b[:n+m]...)
			b = b[n+m:]
			continue
		}
		rec, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return dst, fmt.Errorf("%w: %v", ErrBadBatch, protowire.ParseError(m))
		}
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(len(rec)+len(extra)))
		out = append(out, rec...)
		out = append(out, extra...)
		b = b[n+m:]
	}
	return out, nil
}

// RecordHeader returns the value of the last header named key in the
// encoded Record rec, and whether it has one: headers the broker appends
// (AppendBatchHeaders) win over any a producer set. It never panics.
func RecordHeader(rec []byte, key string) (val []byte, found bool) {
	for len(rec) > 0 {
		num, typ, n := consumeTag(rec)
		if n < 0 {
			return val, found
		}
		rec = rec[n:]
		if num != 3 || typ != protowire.BytesType {
			m := protowire.ConsumeFieldValue(num, typ, rec)
			if m < 0 {
				return val, found
			}
			rec = rec[m:]
			continue
		}
		h, m := protowire.ConsumeBytes(rec)
		if m < 0 {
			return val, found
		}
		rec = rec[m:]
		var k, v []byte
		for len(h) > 0 {
			hn, ht, hl := consumeTag(h)
			if hl < 0 {
				return val, found
			}
			h = h[hl:]
			hm := protowire.ConsumeFieldValue(hn, ht, h)
			if hm < 0 {
				return val, found
			}
			if ht == protowire.BytesType && (hn == 1 || hn == 2) {
				x, _ := protowire.ConsumeBytes(h)
				if hn == 1 {
					k = x
				} else {
					v = x
				}
			}
			h = h[hm:]
		}
		if string(k) == key {
			val, found = v, true
		}
	}
	return val, found
}

// RecordValue returns the value of the encoded Record rec (aliasing rec),
// without decoding the rest. A malformed record is an error, never a
// panic.
func RecordValue(rec []byte) ([]byte, error) {
	var val []byte
	for len(rec) > 0 {
		num, typ, n := consumeTag(rec)
		if n < 0 {
			return nil, fmt.Errorf("%w: record: %v", ErrBadBatch, protowire.ParseError(n))
		}
		rec = rec[n:]
		m := protowire.ConsumeFieldValue(num, typ, rec)
		if m < 0 {
			return nil, fmt.Errorf("%w: record: %v", ErrBadBatch, protowire.ParseError(m))
		}
		if num == 2 {
			if typ != protowire.BytesType {
				return nil, fmt.Errorf("%w: record value has wire type %d", ErrBadBatch, typ)
			}
			val, _ = protowire.ConsumeBytes(rec)
		}
		rec = rec[m:]
	}
	return val, nil
}

// AppendValueRecord appends to b, an encoded RecordBatch, one Record whose
// value is v (no key, headers or timestamp): how the broker's internal
// logs (`__schedule`, `__txn`) store their events.
func AppendValueRecord(b, v []byte) []byte {
	recLen := protowire.SizeTag(2) + protowire.SizeBytes(len(v))
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(recLen))
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// UnmarshalRecordValue decodes the value of the encoded Record rec into m:
// an internal log's event (AppendValueRecord).
func UnmarshalRecordValue(rec []byte, m proto.Message) error {
	v, err := RecordValue(rec)
	if err != nil {
		return err
	}
	return proto.Unmarshal(v, m)
}

// AppendRecordField appends the encoded Record rec to the encoded
// RecordBatch b as one more record (its field 1).
func AppendRecordField(b, rec []byte) []byte {
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	return protowire.AppendBytes(b, rec)
}
