package heraldpb

// RecordTTL returns the ttl_ms of an encoded Record (field 7), or 0 when it
// has none or is malformed (every record in the log passed ScanBatch, which
// refuses a negative or mistyped ttl_ms). The last occurrence wins, as in
// proto.Unmarshal. It reads rec in place and does not allocate.
func RecordTTL(rec []byte) int64 {
	ttl, ok := recordVarint(rec, 7)
	if !ok {
		return 0
	}
	return max(int64(ttl), 0)
}
