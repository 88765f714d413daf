package partition

import (
	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3/raftpb"
)

// entryOffsets reads a normal entry's base offset and record count from its
// LogEntry without copying the records. ok is false for entries that carry
// no records (leader no-ops, conf changes) or do not decode.
func entryOffsets(e raftpb.Entry) (base int64, count uint32, ok bool) {
	if e.Type != raftpb.EntryNormal || len(e.Data) == 0 {
		return 0, 0, false
	}
	h, _, err := heraldpb.ScanLogEntry(e.Data)
	if err != nil {
		return 0, 0, false
	}
	return h.BaseOffset, h.Count, h.Count > 0
}
