package raftwire

import (
	"errors"
	"fmt"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of raftpb.Message and raftpb.Entry that decodeRaftMessage
// decodes itself.
const (
	msgEntriesField = 7
	entryTypeField  = 1
	entryTermField  = 2
	entryIndexField = 3
	entryDataField  = 4
)

var errBadRaftMessage = errors.New("undecodable raft message")

// decodeRaftMessage is raftpb.Message.Unmarshal without copying the entries'
// data: each Entry.Data aliases b, so the caller must not modify b
// afterwards. A follower's MsgApp carries up to raft's MaxSizePerMsg of
// entries, which Unmarshal would copy into new buffers only for the log
// writer to copy them once more.
//
// The entries (field 7) are decoded here; every other field goes to
// raftpb.Message.Unmarshal, so their meaning is raftpb's own. It never
// panics, and it accepts a subset of what Unmarshal accepts, decoded the
// same: FuzzDecodeRaftMessage checks both against Unmarshal.
func decodeRaftMessage(b []byte) (raftpb.Message, error) {
	var (
		m    raftpb.Message
		ents []raftpb.Entry
		rest []byte // the fields other than entries, in their order
	)
	for in := b; len(in) > 0; {
		num, typ, n := protowire.ConsumeTag(in)
		if n < 0 {
			return raftpb.Message{}, fmt.Errorf("%w: %v", errBadRaftMessage, protowire.ParseError(n))
		}
		vn := protowire.ConsumeFieldValue(num, typ, in[n:])
		if vn < 0 {
			return raftpb.Message{}, fmt.Errorf("%w: field %d: %v", errBadRaftMessage, num, protowire.ParseError(vn))
		}
		field := in[:n+vn]
		in = in[n+vn:]
		if num != msgEntriesField {
			rest = append(rest, field...)
			continue
		}
		if typ != protowire.BytesType {
			return raftpb.Message{}, fmt.Errorf("%w: entries of wire type %d", errBadRaftMessage, typ)
		}
		data, _ := protowire.ConsumeBytes(field[n:])
		e, err := decodeEntry(data)
		if err != nil {
			return raftpb.Message{}, err
		}
		ents = append(ents, e)
	}
	if len(rest) > 0 {
		if err := m.Unmarshal(rest); err != nil {
			return raftpb.Message{}, fmt.Errorf("%w: %v", errBadRaftMessage, err)
		}
	}
	m.Entries = ents
	return m, nil
}

// decodeEntry is raftpb.Entry.Unmarshal with Data aliasing b.
func decodeEntry(b []byte) (raftpb.Entry, error) {
	var e raftpb.Entry
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return raftpb.Entry{}, fmt.Errorf("%w: entry: %v", errBadRaftMessage, protowire.ParseError(n))
		}
		b = b[n:]
		switch num {
		case entryTypeField, entryTermField, entryIndexField:
			if typ != protowire.VarintType {
				return raftpb.Entry{}, fmt.Errorf("%w: entry field %d of wire type %d", errBadRaftMessage, num, typ)
			}
			v, vn := protowire.ConsumeVarint(b)
			if vn < 0 {
				return raftpb.Entry{}, fmt.Errorf("%w: entry field %d: %v", errBadRaftMessage, num, protowire.ParseError(vn))
			}
			b = b[vn:]
			switch num {
			case entryTypeField:
				e.Type = raftpb.EntryType(v)
			case entryTermField:
				e.Term = v
			default:
				e.Index = v
			}
		case entryDataField:
			if typ != protowire.BytesType {
				return raftpb.Entry{}, fmt.Errorf("%w: entry data of wire type %d", errBadRaftMessage, typ)
			}
			v, vn := protowire.ConsumeBytes(b)
			if vn < 0 {
				return raftpb.Entry{}, fmt.Errorf("%w: entry data: %v", errBadRaftMessage, protowire.ParseError(vn))
			}
			b = b[vn:]
			// Capped, so that an append to Data can never write into b.
			e.Data = v[:len(v):len(v)]
		default:
			vn := protowire.ConsumeFieldValue(num, typ, b)
			if vn < 0 {
				return raftpb.Entry{}, fmt.Errorf("%w: entry field %d: %v", errBadRaftMessage, num, protowire.ParseError(vn))
			}
			b = b[vn:]
		}
	}
	return e, nil
}
