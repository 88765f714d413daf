package client

import (
	"fmt"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The reference codec: the generated-message implementations that
// encodeRecord and decodeBatch replaced. Tests and fuzzing check that the
// protowire codec agrees with them.

func encodeRecordProto(dst []byte, m *Message) ([]byte, error) {
	r := &heraldpb.Record{Key: m.Key, Value: m.Value, Tags: m.Tags}
	if !m.Timestamp.IsZero() {
		r.TimestampMs = m.Timestamp.UnixMilli()
		if r.TimestampMs < 0 {
			return dst, fmt.Errorf("herald: timestamp %v before 1970", m.Timestamp)
		}
	}
	if len(m.Headers) > 0 {
		r.Headers = make([]*heraldpb.Header, len(m.Headers))
		for i, h := range m.Headers {
			r.Headers[i] = &heraldpb.Header{Key: h.Key, Value: h.Value}
		}
	}
	size := proto.Size(r)
	dst = protowire.AppendTag(dst, 1, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(size))
	return proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(dst, r)
}

func decodeBatchProto(topic string, partition int32, b *heraldpb.StoredBatch, from int64, out []*Message) ([]*Message, error) {
	var rb heraldpb.RecordBatch
	if err := proto.Unmarshal(b.GetRecords(), &rb); err != nil {
		return out, fmt.Errorf("%w: batch at offset %d: %v", ErrProtocol, b.GetBaseOffset(), err)
	}
	for i, r := range rb.GetRecords() {
		off := b.GetBaseOffset() + int64(i)
		if off < from {
			continue
		}
		ts := r.GetTimestampMs()
		if ts == 0 {
			ts = b.GetAppendTimeMs()
		}
		m := &Message{
			Topic:     topic,
			Partition: partition,
			Key:       r.GetKey(),
			Value:     r.GetValue(),
			Timestamp: time.UnixMilli(ts),
			Tags:      r.GetTags(),
			Offset:    off,
		}
		if hs := r.GetHeaders(); len(hs) > 0 {
			m.Headers = make([]Header, len(hs))
			for j, h := range hs {
				m.Headers[j] = Header{Key: h.GetKey(), Value: h.GetValue()}
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// decodeDeliveryProto decodes a Delivery push frame payload the generic
// way: heraldpb.DecodeFrame, then deliveredFromProto.
func decodeDeliveryProto(payload []byte) (uint64, []Delivered, error) {
	f, err := heraldpb.DecodeFrame(payload)
	if err != nil {
		return 0, nil, err
	}
	d := f.GetDelivery()
	if d == nil {
		return 0, nil, fmt.Errorf("frame body %T, not a Delivery", f.GetBody())
	}
	return d.GetSubscriptionId(), deliveredFromProto(d.GetMessages()), nil
}
