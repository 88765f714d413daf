package heraldpb

import (
	"encoding/binary"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// ForEachRecord calls fn with each record of an encoded RecordBatch, in
// order: its index, its encoding (a Record message) and its key, both
// aliasing b. It stops early when fn returns false. The batch must have
// passed ScanBatch (the log only holds such batches); a malformed one
// returns ErrBadBatch at the first bad record.
func ForEachRecord(b []byte, fn func(i int, rec, key []byte) bool) error {
	var err error
	if rerr := ForEachRawRecord(b, func(i int, rec []byte) bool {
		var key []byte
		if key, _, _, err = scanRecord(rec); err != nil {
			return false
		}
		return fn(i, rec, key)
	}); rerr != nil {
		return rerr
	}
	return err
}

// PushMessage is one DeliveredMessage for AppendDelivery. Record is an
// encoded Record, copied as it is.
type PushMessage struct {
	Partition     uint32
	Offset        int64
	DeliveryCount uint32
	AppendTimeMs  int64
	Record        []byte
	ReplyInbox    string
	CorrelationID uint64
}

// Field numbers of the push encoders; TestAppendDelivery checks them against
// the generated code.
const (
	frameDeliveryField      = 60
	frameReplyDeliveryField = 62
)

// Size is m's encoded size as a DeliveredMessage, without its tag and
// length prefix.
func (m *PushMessage) Size() int {
	n := 0
	if m.Partition != 0 {
		n += 1 + protowire.SizeVarint(uint64(m.Partition))
	}
	if m.Offset != 0 {
		n += 1 + protowire.SizeVarint(uint64(m.Offset))
	}
	if m.DeliveryCount != 0 {
		n += 1 + protowire.SizeVarint(uint64(m.DeliveryCount))
	}
	if m.AppendTimeMs != 0 {
		n += 1 + protowire.SizeVarint(uint64(m.AppendTimeMs))
	}
	n += 1 + protowire.SizeBytes(len(m.Record))
	if m.ReplyInbox != "" {
		n += 1 + protowire.SizeBytes(len(m.ReplyInbox))
	}
	if m.CorrelationID != 0 {
		n += 1 + protowire.SizeVarint(m.CorrelationID)
	}
	return n
}

// DeliveryFrameSize is the size of the frame AppendDelivery writes for msgs,
// length prefix included.
func DeliveryFrameSize(subID uint64, msgs []PushMessage) int {
	body := deliveryBodySize(subID, msgs)
	return HeaderLen + 2 + protowire.SizeBytes(body)
}

func deliveryBodySize(subID uint64, msgs []PushMessage) int {
	n := 0
	if subID != 0 {
		n += 1 + protowire.SizeVarint(subID)
	}
	for i := range msgs {
		n += 1 + protowire.SizeBytes(msgs[i].Size())
	}
	return n
}

// AppendDelivery appends a whole length-prefixed server push frame (id 0)
// whose body is Delivery{subscription_id: subID, messages: msgs}, encoded
// without building the message tree: records are copied, never re-encoded.
func AppendDelivery(dst []byte, subID uint64, msgs []PushMessage) []byte {
	body := deliveryBodySize(subID, msgs)
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = protowire.AppendTag(dst, frameDeliveryField, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(body))
	if subID != 0 {
		dst = protowire.AppendTag(dst, 1, protowire.VarintType)
		dst = protowire.AppendVarint(dst, subID)
	}
	for i := range msgs {
		m := &msgs[i]
		dst = protowire.AppendTag(dst, 2, protowire.BytesType)
		dst = protowire.AppendVarint(dst, uint64(m.Size()))
		dst = appendVarintField(dst, 1, uint64(m.Partition))
		dst = appendVarintField(dst, 2, uint64(m.Offset))
		dst = appendVarintField(dst, 3, uint64(m.DeliveryCount))
		dst = appendVarintField(dst, 4, uint64(m.AppendTimeMs))
		dst = protowire.AppendTag(dst, 5, protowire.BytesType)
		dst = protowire.AppendBytes(dst, m.Record)
		if m.ReplyInbox != "" {
			dst = protowire.AppendTag(dst, 6, protowire.BytesType)
			dst = protowire.AppendString(dst, m.ReplyInbox)
		}
		dst = appendVarintField(dst, 7, m.CorrelationID)
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-HeaderLen))
	return dst
}

// AppendReplyDelivery appends a whole server push frame (id 0) whose body is
// ReplyDelivery{correlation_id, record}, record being an encoded Record.
func AppendReplyDelivery(dst []byte, correlationID uint64, record []byte) []byte {
	body := 1 + protowire.SizeBytes(len(record))
	if correlationID != 0 {
		body += 1 + protowire.SizeVarint(correlationID)
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = protowire.AppendTag(dst, frameReplyDeliveryField, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(body))
	dst = appendVarintField(dst, 1, correlationID)
	dst = protowire.AppendTag(dst, 2, protowire.BytesType)
	dst = protowire.AppendBytes(dst, record)
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-HeaderLen))
	return dst
}

func appendVarintField(dst []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return dst
	}
	dst = protowire.AppendTag(dst, num, protowire.VarintType)
	return protowire.AppendVarint(dst, v)
}

// ForEachRawRecord is ForEachRecord for batches already validated (every
// batch in the log passed ScanBatch): it splits the batch into record
// encodings without looking inside them. A malformed batch still returns
// ErrBadBatch rather than panicking.
func ForEachRawRecord(b []byte, fn func(i int, rec []byte) bool) error {
	for i := 0; len(b) > 0; {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %v", ErrBadBatch, protowire.ParseError(n))
		}
		b = b[n:]
		if num != 1 || typ != protowire.BytesType {
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return fmt.Errorf("%w: %v", ErrBadBatch, protowire.ParseError(m))
			}
			b = b[m:]
			continue
		}
		rec, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return fmt.Errorf("%w: %v", ErrBadBatch, protowire.ParseError(m))
		}
		b = b[m:]
		if !fn(i, rec) {
			return nil
		}
		i++
	}
	return nil
}

// RecordKey returns the key of an encoded Record (aliasing rec), or nil.
func RecordKey(rec []byte) []byte {
	key, _, _, err := scanRecord(rec)
	if err != nil {
		return nil
	}
	return key
}

// ForEachStoredRecord calls fn with the offset and encoding of each record
// of batches (a fetch's, in offset order) at or after offset from, and
// returns the offset after the last record it saw (from when none): how an
// actor replays an internal topic it reads in steps.
func ForEachStoredRecord(batches []*StoredBatch, from int64, fn func(off int64, rec []byte)) int64 {
	next := from
	for _, b := range batches {
		_ = ForEachRawRecord(b.Records, func(i int, rec []byte) bool {
			if off := b.BaseOffset + int64(i); off >= next {
				next = off + 1
				fn(off, rec)
			}
			return true
		})
	}
	return next
}
