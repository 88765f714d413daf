package client

import (
	"fmt"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Header is one record header. Order and duplicates are kept.
type Header struct {
	Key   string
	Value []byte
}

// Message is one record, as produced or consumed.
type Message struct {
	Topic string
	// Partition to produce to; -1 means any: the producer picks
	// PartitionForKey(Key, partitions) for a keyed message and lets the
	// broker round-robin an unkeyed one. Set on consumed messages and, by
	// Send, to the partition the message was written to.
	Partition int32
	Key       []byte
	Value     []byte
	Headers   []Header
	// Timestamp of the record; the zero time means the broker's append time.
	// Consumed messages always carry a timestamp.
	Timestamp time.Time
	Tags      []string
	// Offset in the partition: set on consumed messages and, by Send, after
	// a successful write (-1 with acks none).
	Offset int64
}

// Result is the outcome of producing one message.
type Result struct {
	Partition int32
	Offset    int64 // -1 when produced with acks none
}

// PartitionForKey is the partition of a keyed record in a topic of n
// partitions: the 32-bit FNV-1a hash of key, modulo n.
//
//	h := uint32(2166136261)
//	for _, b := range key { h ^= uint32(b); h *= 16777619 }
//	return h % n
//
// The broker uses the same function for a produce request without an
// explicit partition (on the batch's first key), so the producer and the
// broker agree. It returns 0 when n is 0.
func PartitionForKey(key []byte, n uint32) uint32 {
	return heraldpb.PartitionForKey(key, n)
}

// encodeRecord appends m as a RecordBatch element (field 1, length
// delimited) to dst, so that a batch is built by concatenation.
func encodeRecord(dst []byte, m *Message) ([]byte, error) {
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

// decodeBatch turns a stored batch into messages, skipping offsets below
// from. A record with timestamp 0 takes the batch's append time.
func decodeBatch(topic string, partition int32, b *heraldpb.StoredBatch, from int64, out []*Message) ([]*Message, error) {
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
