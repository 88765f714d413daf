package cluster

import (
	"fmt"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/heraldmq/herald/internal/raftwire"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// transportCodec is the gRPC codec of the node-to-node server (the
// receiving end of protoactor remote's streams). It is protobuf, except
// that it marks a RemoteMessage's RaftMessage envelopes for raftwire's
// serializer, whose decoding aliases the envelope's bytes instead of
// copying the raft entries out of them: a raft append is copied once
// between gRPC's read buffer and the follower's log writer.
//
// Each envelope's bytes are a copy of their own, as proto.Unmarshal makes
// them, not a slice of gRPC's buffer: a follower keeps entries in its
// caches for a while, and an entry of a quiet partition must not keep the
// whole batch it came in (other partitions' appends, up to 32 of them)
// from the garbage collector.
type transportCodec struct {
	serializer int32 // raftwire's serializer id; < 0: none
}

func (transportCodec) Name() string { return "proto" }

func (transportCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("cluster codec: %T is not a protobuf message", v)
	}
	return proto.Marshal(m)
}

func (c transportCodec) Unmarshal(data []byte, v any) error {
	if rm, ok := v.(*remote.RemoteMessage); ok {
		if batch, ok := decodeBatchMessage(data); ok {
			c.mark(batch)
			proto.Reset(rm)
			rm.MessageType = &remote.RemoteMessage_MessageBatch{MessageBatch: batch}
			return nil
		}
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("cluster codec: %T is not a protobuf message", v)
	}
	return proto.Unmarshal(data, m)
}

// mark sends batch's RaftMessage envelopes to raftwire's serializer.
func (c transportCodec) mark(batch *remote.MessageBatch) {
	if c.serializer < 0 {
		return
	}
	for _, e := range batch.Envelopes {
		if e.SerializerId == 0 && e.TypeId >= 0 && int(e.TypeId) < len(batch.TypeNames) && batch.TypeNames[e.TypeId] == raftwire.TypeName {
			e.SerializerId = c.serializer
		}
	}
}

// Field numbers decodeBatchMessage decodes itself.
const (
	remoteBatchField         = 1 // RemoteMessage.message_batch
	batchEnvelopesField      = 3 // MessageBatch.envelopes
	envelopeMessageDataField = 2 // MessageEnvelope.message_data
)

// decodeBatchMessage decodes a RemoteMessage that is one MessageBatch, as
// protoactor's writer sends them. ok is false for anything else, and for what it cannot
// decode: the caller then uses proto.Unmarshal. What it decodes,
// proto.Unmarshal decodes the same (FuzzDecodeBatchMessage).
func decodeBatchMessage(b []byte) (*remote.MessageBatch, bool) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || num != remoteBatchField || typ != protowire.BytesType {
		return nil, false
	}
	body, bn := protowire.ConsumeBytes(b[n:])
	if bn < 0 || n+bn != len(b) {
		return nil, false // torn, or more than one field
	}
	batch := &remote.MessageBatch{}
	var (
		rest    []byte // the batch's other fields, in their order
		scratch []byte // an envelope's other fields
	)
	for in := body; len(in) > 0; {
		num, typ, n := protowire.ConsumeTag(in)
		if n < 0 {
			return nil, false
		}
		vn := protowire.ConsumeFieldValue(num, typ, in[n:])
		if vn < 0 {
			return nil, false
		}
		field := in[:n+vn]
		in = in[n+vn:]
		if num != batchEnvelopesField || typ != protowire.BytesType {
			rest = append(rest, field...)
			continue
		}
		v, _ := protowire.ConsumeBytes(field[n:])
		env, used, ok := decodeEnvelope(v, scratch[:0])
		scratch = used
		if !ok {
			return nil, false
		}
		batch.Envelopes = append(batch.Envelopes, env)
	}
	if len(rest) > 0 {
		envs := batch.Envelopes
		if err := proto.Unmarshal(rest, batch); err != nil {
			return nil, false
		}
		batch.Envelopes = envs
	}
	return batch, true
}

// decodeEnvelope decodes a MessageEnvelope, its message_data copied into
// a buffer of its own. It may use scratch, and returns it (grown) for the next envelope.
func decodeEnvelope(b, scratch []byte) (*remote.MessageEnvelope, []byte, bool) {
	var data []byte
	rest := scratch
	for in := b; len(in) > 0; {
		num, typ, n := protowire.ConsumeTag(in)
		if n < 0 {
			return nil, rest, false
		}
		vn := protowire.ConsumeFieldValue(num, typ, in[n:])
		if vn < 0 {
			return nil, rest, false
		}
		field := in[:n+vn]
		in = in[n+vn:]
		if num == envelopeMessageDataField && typ == protowire.BytesType {
			data, _ = protowire.ConsumeBytes(field[n:])
			continue
		}
		rest = append(rest, field...)
	}
	env := &remote.MessageEnvelope{}
	if len(rest) > 0 {
		if err := proto.Unmarshal(rest, env); err != nil {
			return nil, rest, false
		}
	}
	if data != nil {
		env.MessageData = append([]byte{}, data...)
	}
	return env, rest, true
}
