package partition

import (
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
)

// entryOffsets reads a normal entry's base offset and record count from its
// LogEntry without decoding the records. ok is false for entries that carry
// no records (leader no-ops, conf changes) or do not decode.
func entryOffsets(e raftpb.Entry) (base int64, count uint32, ok bool) {
	if e.Type != raftpb.EntryNormal || len(e.Data) == 0 {
		return 0, 0, false
	}
	b := e.Data
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, 0, false
		}
		b = b[n:]
		if typ == protowire.VarintType && (num == 1 || num == 2) {
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return 0, 0, false
			}
			if num == 1 {
				base = int64(v)
			} else {
				count = uint32(v)
			}
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return 0, 0, false
		}
		b = b[m:]
	}
	return base, count, count > 0
}
