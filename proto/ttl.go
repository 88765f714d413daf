package heraldpb

import "google.golang.org/protobuf/encoding/protowire"

// RecordTTL returns the ttl_ms of an encoded Record (field 7), or 0 when it
// has none or is malformed (every record in the log passed ScanBatch, which
// refuses a negative or mistyped ttl_ms). The last occurrence wins, as in
// proto.Unmarshal. It reads rec in place and does not allocate.
func RecordTTL(rec []byte) int64 {
	var ttl int64
	for len(rec) > 0 {
		num, typ, n := consumeTag(rec)
		if n < 0 {
			return 0
		}
		rec = rec[n:]
		if num == 7 && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(rec)
			if m < 0 {
				return 0
			}
			ttl, rec = int64(v), rec[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, rec)
		if m < 0 {
			return 0
		}
		rec = rec[m:]
	}
	return max(ttl, 0)
}
