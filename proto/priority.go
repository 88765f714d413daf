package heraldpb

import "google.golang.org/protobuf/encoding/protowire"

// RecordPriority returns the priority of an encoded Record (field 6, a
// varint), or 0 when it has none, when rec is malformed, or when the value
// is above MaxPriority (every record in the log passed ScanBatch, which
// refuses those). The last occurrence wins, as in proto.Unmarshal. It
// reads rec in place, never panics and does not allocate; the consumer
// group coordinator calls it on every record it offers for push delivery.
func RecordPriority(rec []byte) uint8 {
	prio, ok := recordVarint(rec, 6)
	if !ok || prio > MaxPriority {
		return 0
	}
	return uint8(prio)
}

// recordVarint returns the last varint field num of an encoded Record (0
// if absent); ok is false when rec is malformed. It never panics and does
// not allocate.
func recordVarint(rec []byte, num protowire.Number) (v uint64, ok bool) {
	for len(rec) > 0 {
		n, typ, l := consumeTag(rec)
		if l < 0 {
			return 0, false
		}
		rec = rec[l:]
		if n == num && typ == protowire.VarintType {
			x, m := protowire.ConsumeVarint(rec)
			if m < 0 {
				return 0, false
			}
			v, rec = x, rec[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(n, typ, rec)
		if m < 0 {
			return 0, false
		}
		rec = rec[m:]
	}
	return v, true
}
