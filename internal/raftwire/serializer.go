package raftwire

import (
	"fmt"
	"sync"

	"github.com/asynkron/protoactor-go/remote"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// TypeName is the wire form's protobuf name, as protoactor's envelopes
// carry it.
var TypeName = string(proto.MessageName(&heraldpb.RaftMessage{}))

// serializer is a protoactor serializer that reads RaftMessages with
// DecodeBytes, so that the entries alias the received buffer, and every
// other type as protoactor's own protobuf serializer does. protoactor's
// writer always uses serializer 0: this one is chosen only on the
// receiving side, by the node transport's codec (cluster.transportCodec),
// which marks RaftMessage envelopes with its id.
type serializer struct{}

// probe is a value only serializer names probeName, to find its id.
type probe struct{}

const probeName = "herald.raftwire.probe"

func (serializer) Serialize(msg interface{}) ([]byte, error) {
	if _, ok := msg.(probe); ok {
		return nil, nil
	}
	m, ok := msg.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("raftwire: %T is not a protobuf message", msg)
	}
	return proto.Marshal(m)
}

func (serializer) Deserialize(typeName string, b []byte) (interface{}, error) {
	if typeName == TypeName {
		if m, err := DecodeBytes(b); err == nil {
			return m, nil
		}
		// What DecodeBytes refuses, the receiver gets as it arrived, and
		// reports with Decode's error.
		w := &heraldpb.RaftMessage{}
		if err := proto.Unmarshal(b, w); err != nil {
			return nil, err
		}
		return w, nil
	}
	t, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(typeName))
	if err != nil {
		return nil, fmt.Errorf("raftwire: message type %q: %w", typeName, err)
	}
	m := t.New().Interface()
	return m, proto.Unmarshal(b, m)
}

func (serializer) GetTypeName(msg interface{}) (string, error) {
	if _, ok := msg.(probe); ok {
		return probeName, nil
	}
	m, ok := msg.(proto.Message)
	if !ok {
		return "", fmt.Errorf("raftwire: %T is not a protobuf message", msg)
	}
	return string(proto.MessageName(m)), nil
}

var (
	registerOnce sync.Once
	serializerID int32 = -1
)

// SerializerID registers the serializer with protoactor remote, once per
// process, and returns its id; -1 if it could not be found among
// protoactor's serializers afterwards (then received RaftMessages take
// protoactor's own path, with a copy).
func SerializerID() int32 {
	registerOnce.Do(func() {
		remote.RegisterSerializer(serializer{})
		for id := int32(0); id < 256; id++ {
			name, ok := serializerName(id)
			if !ok {
				break // past the last serializer
			}
			if name == probeName {
				serializerID = id
			}
		}
	})
	return serializerID
}

// serializerName is what protoactor's serializer id names probe; ok is
// false when there is no serializer id.
func serializerName(id int32) (name string, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	_, name, _ = remote.Serialize(probe{}, id)
	return name, true
}
