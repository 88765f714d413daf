package heraldpb

import "google.golang.org/protobuf/encoding/protowire"

// RecordPriority returns the priority of an encoded Record (field 6, a
// varint), or 0 when it has none, when rec is malformed, or when the value
// is above MaxPriority (every record in the log passed ScanBatch, which
// refuses those). The last occurrence wins, as in proto.Unmarshal. It
// reads rec in place, never panics and does not allocate; the consumer
// group coordinator calls it on every record it offers for push delivery.
func RecordPriority(rec []byte) uint8 {
	var prio uint64
	for len(rec) > 0 {
		num, typ, n := consumeTag(rec)
		if n < 0 {
			return 0
		}
		rec = rec[n:]
		if num == 6 && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(rec)
			if m < 0 {
				return 0
			}
			prio, rec = v, rec[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, rec)
		if m < 0 {
			return 0
		}
		rec = rec[m:]
	}
	if prio > MaxPriority {
		return 0
	}
	return uint8(prio)
}
