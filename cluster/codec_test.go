package cluster

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/heraldmq/herald/internal/raftwire"
	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// batchSeeds are RemoteMessages as protoactor's writer and its connection
// set-up send them.
func batchSeeds(t testing.TB) []*remote.RemoteMessage {
	rm := &raftwire.Message{Group: "orders-1", Raft: raftpb.Message{Type: raftpb.MsgApp, To: 2, From: 1, Term: 3, Index: 9,
		Entries: []raftpb.Entry{{Term: 3, Index: 10, Data: []byte("batch of records")}, {Term: 3, Index: 11}}}}
	w, err := rm.Wire()
	if err != nil {
		t.Fatal(err)
	}
	raftBytes, _ := proto.Marshal(w)
	fwd, _ := proto.Marshal(&heraldpb.Forward{Group: "orders-1", Request: true})
	return []*remote.RemoteMessage{
		{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{
			TypeNames: []string{raftwire.TypeName, string(proto.MessageName(&heraldpb.Forward{}))},
			Targets:   []*actor.PID{{Address: "127.0.0.1:7001", Id: RelayName}},
			Senders:   []*actor.PID{{Address: "127.0.0.1:7002", Id: "future$1", RequestId: 4}},
			Envelopes: []*remote.MessageEnvelope{
				{TypeId: 0, MessageData: raftBytes, Target: 0, Sender: 0},
				{TypeId: 1, MessageData: fwd, Target: 0, Sender: 1, SenderRequestId: 4,
					MessageHeader: &remote.MessageHeader{HeaderData: map[string]string{"k": "v"}}},
				{TypeId: 0, MessageData: raftBytes, SerializerId: 1},
				{TypeId: 7, MessageData: []byte{}},
			},
		}}},
		{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{}}},
		{MessageType: &remote.RemoteMessage_ConnectRequest{ConnectRequest: &remote.ConnectRequest{
			ConnectionType: &remote.ConnectRequest_ServerConnection{ServerConnection: &remote.ServerConnection{SystemId: "s", Address: "a"}}}}},
		{MessageType: &remote.RemoteMessage_ConnectResponse{ConnectResponse: &remote.ConnectResponse{MemberId: "m", Blocked: true}}},
		{},
	}
}

// TestTransportCodecMatchesProto: the codec decodes what protoactor sends
// as proto.Unmarshal does, except that it marks RaftMessage envelopes of
// serializer 0 for raftwire's serializer.
func TestTransportCodecMatchesProto(t *testing.T) {
	c := transportCodec{serializer: raftwire.SerializerID()}
	for i, m := range batchSeeds(t) {
		b, err := c.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		want := &remote.RemoteMessage{}
		if err := proto.Unmarshal(b, want); err != nil {
			t.Fatal(err)
		}
		if batch := want.GetMessageBatch(); batch != nil {
			for _, e := range batch.Envelopes {
				if e.SerializerId == 0 && int(e.TypeId) < len(batch.TypeNames) && batch.TypeNames[e.TypeId] == raftwire.TypeName {
					e.SerializerId = c.serializer
				}
			}
		}
		got := &remote.RemoteMessage{MessageType: &remote.RemoteMessage_DisconnectRequest{}} // reset by Unmarshal
		if err := c.Unmarshal(b, got); err != nil {
			t.Fatalf("seed %d: %v", i, err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("seed %d: decoded\n%v\nwant\n%v", i, got, want)
		}
	}
	// Envelopes are copies (the buffer goes back to gRPC's pool, and one
	// message must not keep the whole batch alive); the raft envelope
	// reaches raftwire's serializer, which decodes it.
	b, _ := c.Marshal(batchSeeds(t)[0])
	got := &remote.RemoteMessage{}
	if err := c.Unmarshal(b, got); err != nil {
		t.Fatal(err)
	}
	env := got.GetMessageBatch().Envelopes[0]
	before := string(env.MessageData)
	clear(b)
	if string(env.MessageData) != before {
		t.Fatal("message data aliases the received buffer")
	}
	msg, err := remote.Deserialize(env.MessageData, raftwire.TypeName, env.SerializerId)
	if rm, ok := msg.(*raftwire.Message); err != nil || !ok || string(rm.Raft.Entries[0].Data) != "batch of records" {
		t.Fatalf("deserialized %T %+v, %v", msg, msg, err)
	}
	if err := c.Unmarshal([]byte{0x0a, 0x05, 1}, &remote.RemoteMessage{}); err == nil {
		t.Fatal("torn message accepted")
	}
}

// FuzzDecodeBatchMessage: on any bytes decodeBatchMessage never panics,
// and what it decodes proto.Unmarshal decodes the same.
func FuzzDecodeBatchMessage(f *testing.F) {
	for _, m := range batchSeeds(f) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		batch, ok := decodeBatchMessage(b)
		if !ok {
			return
		}
		want := &remote.RemoteMessage{}
		if err := proto.Unmarshal(b, want); err != nil {
			t.Fatalf("decoded what proto.Unmarshal refuses (%v)", err)
		}
		got := &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: batch}}
		if !proto.Equal(got, want) {
			t.Fatalf("decoded\n%v\nproto.Unmarshal gives\n%v", got, want)
		}
	})
}
