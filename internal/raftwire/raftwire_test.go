package raftwire

import (
	"reflect"
	"testing"

	"github.com/asynkron/protoactor-go/remote"
	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// wireSeeds are Messages of every kind replicas send each other.
func wireSeeds() []*Message {
	var out []*Message
	for _, m := range raftMessageSeeds() {
		if m.Type == raftpb.MsgStorageAppend {
			continue // local to a replica, never sent
		}
		out = append(out, &Message{Group: "orders-3", Raft: m})
	}
	return append(out,
		&Message{Group: "__groups-0", Quiesce: &heraldpb.Quiesce{From: 1, Term: 4, Index: 77}},
		&Message{Group: "t-1", Joining: &heraldpb.Joining{From: 4, Incarnation: "move-9"}},
	)
}

// sameMessage reports whether a and b carry the same message (an absent
// and an empty byte field are the same).
func sameMessage(a, b *Message) bool {
	return a.Group == b.Group && reflect.DeepEqual(normalized(a.Raft), normalized(b.Raft)) &&
		proto.Equal(a.Quiesce, b.Quiesce) && proto.Equal(a.Joining, b.Joining) &&
		(a.Quiesce == nil) == (b.Quiesce == nil) && (a.Joining == nil) == (b.Joining == nil)
}

func normalized(m raftpb.Message) raftpb.Message {
	if len(m.Context) == 0 {
		m.Context = nil
	}
	if len(m.Responses) == 0 {
		m.Responses = nil
	}
	if len(m.Entries) == 0 {
		m.Entries = nil
	} else {
		m.Entries = append([]raftpb.Entry(nil), m.Entries...)
	}
	for i := range m.Entries {
		if len(m.Entries[i].Data) == 0 {
			m.Entries[i].Data = nil
		}
	}
	return m
}

// TestWireRoundTrip: a Message through protoactor's writer path (Serialize,
// then protoactor's serializer 0) and back through either decoder is the
// same Message.
func TestWireRoundTrip(t *testing.T) {
	for i, m := range wireSeeds() {
		root, err := m.Serialize()
		if err != nil {
			t.Fatal(err)
		}
		b, name, err := remote.Serialize(root, 0)
		if err != nil {
			t.Fatal(err)
		}
		if name != TypeName {
			t.Fatalf("type name %q, want %q", name, TypeName)
		}
		got, err := DecodeBytes(b)
		if err != nil {
			t.Fatalf("seed %d: DecodeBytes: %v", i, err)
		}
		var want raftpb.Message
		if m.Quiesce == nil && m.Joining == nil {
			// What raftpb's own encoding decodes to (nil and empty data
			// are raftpb's, not the seed's).
			rb, _ := m.Raft.Marshal()
			if err := want.Unmarshal(rb); err != nil {
				t.Fatal(err)
			}
		}
		exp := &Message{Group: m.Group, Raft: want, Quiesce: m.Quiesce, Joining: m.Joining}
		if !sameMessage(got, exp) {
			t.Fatalf("seed %d: DecodeBytes gives\n%+v\nwant\n%+v", i, got, exp)
		}
		var w heraldpb.RaftMessage
		if err := proto.Unmarshal(b, &w); err != nil {
			t.Fatal(err)
		}
		got2, err := Decode(&w)
		if err != nil || !sameMessage(got2, got) {
			t.Fatalf("seed %d: Decode gives %+v, %v; DecodeBytes %+v", i, got2, err, got)
		}
	}
}

// TestDecodesWholeForm: a RaftMessage of earlier nodes, the whole raftpb
// encoding in message, still decodes; both forms at once do not.
func TestDecodesWholeForm(t *testing.T) {
	m := raftMessageSeeds()[2]
	rb, _ := m.Marshal()
	b, _ := proto.Marshal(&heraldpb.RaftMessage{Group: "g", Message: rb})
	got, err := DecodeBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := decodeRaftMessage(rb)
	if got.Group != "g" || !reflect.DeepEqual(got.Raft, want) {
		t.Fatalf("decoded %+v", got)
	}
	both, _ := proto.Marshal(&heraldpb.RaftMessage{Group: "g", Message: rb, Header: []byte{8, 3}})
	if _, err := DecodeBytes(both); err == nil {
		t.Fatal("accepted both forms at once")
	}
}

// TestDecodeBytesAliases: the entries' data is not copied, and an append
// to it cannot overwrite the bytes after it.
func TestDecodeBytesAliases(t *testing.T) {
	w, err := (&Message{Group: "g", Raft: raftMessageSeeds()[2]}).Wire()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := proto.Marshal(w)
	got, err := DecodeBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	d := got.Raft.Entries[0].Data
	d[0] = 'F'
	if got2, _ := DecodeBytes(b); string(got2.Raft.Entries[0].Data) != "First batch" {
		t.Fatalf("entry data is a copy: %q", got2.Raft.Entries[0].Data)
	}
	before := string(b)
	_ = append(d, "overwrite"...)
	if string(b) != before {
		t.Fatal("appending to entry data wrote into the message")
	}
}

// TestSerializer: the serializer is registered once, under an id of its
// own, reads RaftMessages with DecodeBytes and other types as protobuf.
func TestSerializer(t *testing.T) {
	id := SerializerID()
	if id < 2 || SerializerID() != id {
		t.Fatalf("serializer id %d, then %d", id, SerializerID())
	}
	m := wireSeeds()[2]
	w, _ := m.Wire()
	b, _ := proto.Marshal(w)
	got, err := remote.Deserialize(b, TypeName, id)
	if err != nil {
		t.Fatal(err)
	}
	if rm, ok := got.(*Message); !ok || rm.Group != m.Group || len(rm.Raft.Entries) != len(m.Raft.Entries) {
		t.Fatalf("deserialized %T %+v", got, got)
	}
	// What DecodeBytes refuses (an entry of the wrong wire type) arrives
	// as it is, for the receiver to report.
	bad := append(append([]byte{}, b...), 0x32, 2, 0x0a, 0)
	got, err = remote.Deserialize(bad, TypeName, id)
	if _, ok := got.(*heraldpb.RaftMessage); err != nil || !ok {
		t.Fatalf("refused message: %T, %v", got, err)
	}
	q, _ := proto.Marshal(&heraldpb.Quiesce{From: 3})
	got, err = remote.Deserialize(q, string(proto.MessageName(&heraldpb.Quiesce{})), id)
	if pq, ok := got.(*heraldpb.Quiesce); err != nil || !ok || pq.From != 3 {
		t.Fatalf("other type: %T %v", got, err)
	}
	if _, err := remote.Deserialize(q, "herald.NoSuchType", id); err == nil {
		t.Fatal("unknown type accepted")
	}
}

// FuzzDecodeBytes: on any bytes DecodeBytes never panics, and what it
// accepts, proto.Unmarshal and Decode accept too and decode the same.
func FuzzDecodeBytes(f *testing.F) {
	for _, m := range wireSeeds() {
		w, err := m.Wire()
		if err != nil {
			f.Fatal(err)
		}
		b, _ := proto.Marshal(w)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := DecodeBytes(b)
		if err != nil {
			return
		}
		var w heraldpb.RaftMessage
		if err := proto.Unmarshal(b, &w); err != nil {
			t.Fatalf("accepted what proto.Unmarshal refuses (%v)", err)
		}
		want, err := Decode(&w)
		if err != nil {
			t.Fatalf("accepted what Decode refuses (%v)", err)
		}
		if !sameMessage(got, want) {
			t.Fatalf("decoded\n%+v\nDecode gives\n%+v", got, want)
		}
	})
}
