package client

import (
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/encoding/protowire"
)

// Header is one record header. Order and duplicates are kept.
type Header struct {
	Key   string
	Value []byte
}

// Message is one record, as produced or consumed.
//
// The Key, Value and header Value byte slices of a consumed message alias
// the fetch response it came in (one buffer per fetched batch, shared by the
// batch's messages) instead of being copied. The client never reuses or
// modifies that buffer, so they stay valid for as long as the caller keeps
// them; keeping any one of them keeps the whole batch's buffer in memory
// (copy the bytes to retain a small part of a large batch for long). The
// slices are capped, so appending to one never overwrites another.
type Message struct {
	Topic string
	// Partition is where a consumed message was read from and, after a
	// successful Send, where the message was written.
	//
	// On produce it is ignored unless the producer has
	// WithManualPartitions: by default the producer picks the partition,
	// PartitionForKey(Key, partitions) for a keyed message and, for one
	// without a key, round-robin a batch at a time (the broker's round
	// robin without idempotence). So the zero value means any partition;
	// Partition: -1 is no longer needed. With WithManualPartitions the
	// message goes to Partition exactly, key or not, and a negative
	// Partition fails with ErrInvalidPartition.
	Partition int32
	Key       []byte
	Value     []byte
	Headers   []Header
	// Timestamp of the record; the zero time means the broker's append time.
	// Consumed messages always carry a timestamp.
	Timestamp time.Time
	Tags      []string
	// Offset in the partition: set on consumed messages and, by Send, after
	// a successful write (-1 with acks none, and for a delayed message).
	Offset int64
	// Priority, 0 (default, lowest) to 9: consumer groups deliver higher
	// priorities of a partition first. Set on consumed messages too.
	Priority uint8
	// TTL: consumer groups never deliver the message once TTL has passed
	// since its append (0 = the topic's message TTL, if any). Consumed
	// messages carry the record's own TTL (not the topic's).
	TTL time.Duration
	// Delayed delivery (produce only): the broker keeps the message and
	// appends it to the topic at DeliverAt, or Delay after it receives it
	// (the broker's clock). At most one of the two. A delayed message is
	// sent alone, so that its ScheduleID names it alone.
	DeliverAt time.Time
	Delay     time.Duration
}

// Result is the outcome of producing one message.
type Result struct {
	Partition int32
	Offset    int64 // -1 when produced with acks none, or delayed
	// Delayed messages: the id to cancel it by (Client.CancelScheduled)
	// and when it will be appended.
	ScheduleID string
	DeliverAt  time.Time
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

// Wire tags (field number << 3 | wire type) of the fields encodeRecord
// writes: RecordBatch.records; Record.key, value, headers, timestamp_ms,
// tags; Header.key, value.
const (
	tagBatchRecord  = 1<<3 | byte(protowire.BytesType)
	tagRecordKey    = 1<<3 | byte(protowire.BytesType)
	tagRecordValue  = 2<<3 | byte(protowire.BytesType)
	tagRecordHeader = 3<<3 | byte(protowire.BytesType)
	tagRecordTime   = 4<<3 | byte(protowire.VarintType)
	tagRecordTag    = 5<<3 | byte(protowire.BytesType)
	tagRecordPrio   = 6<<3 | byte(protowire.VarintType)
	tagRecordTTL    = 7<<3 | byte(protowire.VarintType)
	tagHeaderKey    = 1<<3 | byte(protowire.BytesType)
	tagHeaderValue  = 2<<3 | byte(protowire.BytesType)
)

var (
	errHeaderUTF8 = errors.New("herald: header key: string field contains invalid UTF-8")
	errTagUTF8    = errors.New("herald: tag: string field contains invalid UTF-8")
)

// headerSize is the encoded size of h as a Header message.
func headerSize(h *Header) int {
	n := 0
	if len(h.Key) > 0 {
		n += 1 + protowire.SizeBytes(len(h.Key))
	}
	if len(h.Value) > 0 {
		n += 1 + protowire.SizeBytes(len(h.Value))
	}
	return n
}

// encodeRecord appends m as a RecordBatch element (field 1, length
// delimited) to dst, so that a batch is built by concatenation. The bytes
// are those proto.Marshal gives for the equivalent heraldpb.Record (fields
// in number order, proto3 defaults omitted); they are written straight into
// dst after sizing the record, without building a heraldpb.Record. On error
// dst is returned unchanged.
func encodeRecord(dst []byte, m *Message) ([]byte, error) {
	var ts int64
	if !m.Timestamp.IsZero() {
		ts = m.Timestamp.UnixMilli()
		if ts < 0 {
			return dst, fmt.Errorf("herald: timestamp %v before 1970", m.Timestamp)
		}
	}
	if m.Priority > heraldpb.MaxPriority {
		return dst, fmt.Errorf("herald: priority %d is above %d", m.Priority, heraldpb.MaxPriority)
	}
	if m.TTL < 0 {
		return dst, fmt.Errorf("herald: negative TTL %v", m.TTL)
	}
	ttl := int64((m.TTL + time.Millisecond - 1) / time.Millisecond)
	size := 0
	if len(m.Key) > 0 {
		size += 1 + protowire.SizeBytes(len(m.Key))
	}
	if m.Priority > 0 {
		size += 1 + protowire.SizeVarint(uint64(m.Priority))
	}
	if ttl > 0 {
		size += 1 + protowire.SizeVarint(uint64(ttl))
	}
	if len(m.Value) > 0 {
		size += 1 + protowire.SizeBytes(len(m.Value))
	}
	for i := range m.Headers {
		h := &m.Headers[i]
		if !utf8.ValidString(h.Key) {
			return dst, errHeaderUTF8
		}
		size += 1 + protowire.SizeBytes(headerSize(h))
	}
	if ts != 0 {
		size += 1 + protowire.SizeVarint(uint64(ts))
	}
	for _, t := range m.Tags {
		if !utf8.ValidString(t) {
			return dst, errTagUTF8
		}
		size += 1 + protowire.SizeBytes(len(t))
	}

	dst = slices.Grow(dst, 1+protowire.SizeVarint(uint64(size))+size)
	dst = append(dst, tagBatchRecord)
	dst = protowire.AppendVarint(dst, uint64(size))
	if len(m.Key) > 0 {
		dst = append(dst, tagRecordKey)
		dst = protowire.AppendVarint(dst, uint64(len(m.Key)))
		dst = append(dst, m.Key...)
	}
	if len(m.Value) > 0 {
		dst = append(dst, tagRecordValue)
		dst = protowire.AppendVarint(dst, uint64(len(m.Value)))
		dst = append(dst, m.Value...)
	}
	for i := range m.Headers {
		h := &m.Headers[i]
		dst = append(dst, tagRecordHeader)
		dst = protowire.AppendVarint(dst, uint64(headerSize(h)))
		if len(h.Key) > 0 {
			dst = append(dst, tagHeaderKey)
			dst = protowire.AppendVarint(dst, uint64(len(h.Key)))
			dst = append(dst, h.Key...)
		}
		if len(h.Value) > 0 {
			dst = append(dst, tagHeaderValue)
			dst = protowire.AppendVarint(dst, uint64(len(h.Value)))
			dst = append(dst, h.Value...)
		}
	}
	if ts != 0 {
		dst = append(dst, tagRecordTime)
		dst = protowire.AppendVarint(dst, uint64(ts))
	}
	for _, t := range m.Tags {
		dst = append(dst, tagRecordTag)
		dst = protowire.AppendVarint(dst, uint64(len(t)))
		dst = append(dst, t...)
	}
	if m.Priority > 0 {
		dst = append(dst, tagRecordPrio)
		dst = protowire.AppendVarint(dst, uint64(m.Priority))
	}
	if ttl > 0 {
		dst = append(dst, tagRecordTTL)
		dst = protowire.AppendVarint(dst, uint64(ttl))
	}
	return dst, nil
}
