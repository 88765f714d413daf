// Package raftwire carries raft messages between the replicas of a raft
// group: in process as a *Message, and between nodes, through protoactor
// remote, as a heraldpb.RaftMessage.
//
// A *Message is protoactor's RootSerializable: protoactor's endpoint writer
// turns it into its wire form off the sending actor, and the wire form
// holds each entry's data as a field of its own, so proto.Marshal copies an
// entry's data once, straight into the transport's buffer. The receiving
// side decodes without copying the entries (DecodeBytes, used by the
// serializer Register installs).
package raftwire

import (
	"fmt"

	"github.com/asynkron/protoactor-go/remote"
	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Message is one message between the replicas of a raft group: a raft
// message, or one of Herald's own (Quiesce, Joining), which replace it.
// Its entries' data is shared, never modified: raft's entries are
// immutable once made.
type Message struct {
	Group   string
	Raft    raftpb.Message
	Quiesce *heraldpb.Quiesce
	Joining *heraldpb.Joining
}

// wire is a RaftMessage as the RootSerialized that protoactor's writer
// marshals (it embeds the generated message, so proto.Marshal and
// proto.MessageName see heraldpb.RaftMessage).
type wire struct{ *heraldpb.RaftMessage }

// Deserialize implements remote.RootSerialized.
func (w wire) Deserialize() (remote.RootSerializable, error) { return Decode(w.RaftMessage) }

// Serialize implements remote.RootSerializable: the wire form, whose
// entries alias m's.
func (m *Message) Serialize() (remote.RootSerialized, error) {
	w, err := m.Wire()
	if err != nil {
		return nil, err
	}
	return wire{w}, nil
}

// Wire is m's wire form, in the split form (header and entries); the
// entries' data aliases m's.
func (m *Message) Wire() (*heraldpb.RaftMessage, error) {
	w := &heraldpb.RaftMessage{Group: m.Group, Quiesce: m.Quiesce, Joining: m.Joining}
	if m.Quiesce != nil || m.Joining != nil {
		return w, nil
	}
	hdr := m.Raft
	hdr.Entries = nil
	b, err := hdr.Marshal()
	if err != nil {
		return nil, fmt.Errorf("encoding raft message: %w", err)
	}
	w.Header = b
	if n := len(m.Raft.Entries); n > 0 {
		ents := make([]heraldpb.RaftEntry, n)
		w.Entries = make([]*heraldpb.RaftEntry, n)
		for i := range m.Raft.Entries {
			e, we := &m.Raft.Entries[i], &ents[i]
			we.Type, we.Term, we.Index, we.Data = int32(e.Type), e.Term, e.Index, e.Data
			w.Entries[i] = we
		}
	}
	return w, nil
}

// Decode turns a received RaftMessage into a Message; the entries' data
// aliases w's. It accepts both forms: the split one (header, entries) and
// the whole raftpb encoding in message that earlier nodes send.
func Decode(w *heraldpb.RaftMessage) (*Message, error) {
	var ents []raftpb.Entry
	if len(w.Entries) > 0 {
		ents = make([]raftpb.Entry, len(w.Entries))
		for i, we := range w.Entries {
			e := &ents[i]
			e.Type, e.Term, e.Index = raftpb.EntryType(we.Type), we.Term, we.Index
			if we.Data != nil {
				// Capped, so that an append to Data never writes into the
				// buffer it aliases.
				e.Data = we.Data[:len(we.Data):len(we.Data)]
			}
		}
	}
	return fromWire(w, ents)
}

// fromWire is Decode with w's entries already decoded into ents.
func fromWire(w *heraldpb.RaftMessage, ents []raftpb.Entry) (*Message, error) {
	m := &Message{Group: w.Group, Quiesce: w.Quiesce, Joining: w.Joining}
	if m.Quiesce != nil || m.Joining != nil {
		return m, nil
	}
	if len(w.Message) > 0 {
		if len(w.Header) > 0 || len(ents) > 0 {
			return nil, fmt.Errorf("%w: both forms set", errBadRaftMessage)
		}
		rm, err := decodeRaftMessage(w.Message)
		if err != nil {
			return nil, err
		}
		m.Raft = rm
		return m, nil
	}
	if err := m.Raft.Unmarshal(w.Header); err != nil {
		return nil, fmt.Errorf("%w: header: %v", errBadRaftMessage, err)
	}
	if len(m.Raft.Entries) > 0 {
		return nil, fmt.Errorf("%w: entries in the header", errBadRaftMessage)
	}
	m.Raft.Entries = ents
	return m, nil
}

// Field numbers of heraldpb.RaftMessage that DecodeBytes decodes itself.
const (
	wireMessageField = 2
	wireHeaderField  = 5
	wireEntriesField = 6
)

// DecodeBytes is proto.Unmarshal of a RaftMessage followed by Decode, but
// the entries' data aliases b instead of being copied out of it: the
// caller must not modify b afterwards. It never panics, and it accepts a
// subset of what the two accept, decoded the same (FuzzDecodeBytes).
func DecodeBytes(b []byte) (*Message, error) {
	var (
		w      heraldpb.RaftMessage
		ents   []raftpb.Entry
		rest   []byte // the other fields, in their order
		legacy []byte
		header []byte
	)
	for in := b; len(in) > 0; {
		num, typ, n := protowire.ConsumeTag(in)
		if n < 0 {
			return nil, fmt.Errorf("%w: %v", errBadRaftMessage, protowire.ParseError(n))
		}
		vn := protowire.ConsumeFieldValue(num, typ, in[n:])
		if vn < 0 {
			return nil, fmt.Errorf("%w: field %d: %v", errBadRaftMessage, num, protowire.ParseError(vn))
		}
		field := in[:n+vn]
		in = in[n+vn:]
		if typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(field[n:])
			switch num {
			case wireMessageField:
				legacy = v
				continue
			case wireHeaderField:
				header = v
				continue
			case wireEntriesField:
				e, err := decodeEntry(v)
				if err != nil {
					return nil, err
				}
				ents = append(ents, e)
				continue
			}
		}
		rest = append(rest, field...)
	}
	if len(rest) > 0 {
		if err := proto.Unmarshal(rest, &w); err != nil {
			return nil, fmt.Errorf("%w: %v", errBadRaftMessage, err)
		}
	}
	w.Message, w.Header = legacy, header
	return fromWire(&w, ents)
}
