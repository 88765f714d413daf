package heraldpb

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// SliceBatch returns an encoded RecordBatch holding records [from, from+n)
// of the encoded batch b, and how many records b holds in all. Records are
// copied as encoded (no decode, no re-encode); fields other than records are
// dropped. When the range covers every record, b itself is returned (no
// copy). n past the end is cut to the end. It is how a push delivery honours
// a credit window smaller than a stored batch. It never panics; b must
// already have passed ScanBatch (the log only holds such batches), and a
// malformed b gives an error wrapping ErrBadBatch.
func SliceBatch(b []byte, from, n int) ([]byte, int, error) {
	if from < 0 || n < 0 {
		return nil, 0, fmt.Errorf("%w: negative slice [%d, +%d)", ErrBadBatch, from, n)
	}
	// First pass: the byte ranges of the wanted records and the total.
	start, end, count := -1, -1, 0
	onlyRecords := true
	pos := 0
	for rest := b; len(rest) > 0; {
		num, typ, tn := consumeTag(rest)
		if tn < 0 {
			return nil, 0, fmt.Errorf("%w: %v", ErrBadBatch, protowire.ParseError(tn))
		}
		vn := protowire.ConsumeFieldValue(num, typ, rest[tn:])
		if vn < 0 {
			return nil, 0, fmt.Errorf("%w: %v", ErrBadBatch, protowire.ParseError(vn))
		}
		field := tn + vn
		if num == 1 && typ == protowire.BytesType {
			if count == from {
				start = pos
			}
			if count >= from && count < from+n {
				end = pos + field
			}
			count++
		} else {
			onlyRecords = false
		}
		pos += field
		rest = rest[field:]
	}
	if start < 0 || end < 0 {
		return nil, count, nil
	}
	if onlyRecords && start == 0 && end == len(b) {
		return b, count, nil
	}
	if onlyRecords {
		// Records are contiguous when nothing else is interleaved.
		out := make([]byte, end-start)
		copy(out, b[start:end])
		return out, count, nil
	}
	// Other fields are interleaved: copy record fields one by one.
	out := make([]byte, 0, end-start)
	idx := 0
	for rest := b; len(rest) > 0; {
		num, typ, tn := consumeTag(rest)
		vn := protowire.ConsumeFieldValue(num, typ, rest[tn:])
		field := rest[:tn+vn]
		if num == 1 && typ == protowire.BytesType {
			if idx >= from && idx < from+n {
				out = append(out, field...)
			}
			idx++
		}
		rest = rest[tn+vn:]
	}
	return out, count, nil
}
