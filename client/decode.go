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

// decodeBatch turns a stored batch into messages, skipping offsets below
// from. A record with timestamp 0 takes the batch's append time.
//
// It walks the encoded RecordBatch with protowire instead of unmarshalling
// it into heraldpb.Records, and gives exactly what proto.Unmarshal-based
// decoding gave: the same records, headers in order with duplicates, tags,
// last-wins scalar fields, unknown fields skipped, and an ErrProtocol error
// for any input proto.Unmarshal rejects (bad wire format, invalid UTF-8 in
// a header key or tag). Key, Value and header values alias b.Records (see
// Message); empty ones are nil. The messages of one batch are allocated
// together, as are their headers and tags. On error out is returned as it
// was passed.
func decodeBatch(topic string, partition int32, b *heraldpb.StoredBatch, from int64, out []*Message) ([]*Message, error) {
	n0 := len(out)
	d := batchDecoder{topic: topic, partition: partition, appendTime: b.GetAppendTimeMs()}
	out, err := d.decode(b.GetRecords(), b.GetBaseOffset(), from, out)
	if err != nil {
		clear(out[n0:])
		return out[:n0], fmt.Errorf("%w: batch at offset %d: %v", ErrProtocol, b.GetBaseOffset(), err)
	}
	return out, nil
}

// errCodeFieldNumber is the protowire error code of an invalid field
// number (protowire.ParseError(errCodeFieldNumber) describes it).
const errCodeFieldNumber = -2

type batchDecoder struct {
	topic      string
	partition  int32
	appendTime int64

	remaining int // records still to be kept, the current one included

	lastTS   int64
	lastTime time.Time
	haveTime bool

	hdrs   []Header // slab of the headers of kept records
	hstart int      // first header of the current record in hdrs
	tags   []string // slab of the tags of kept records
	tstart int      // first tag of the current record in tags

	strs  [8]string // recently decoded header keys and tags
	nstrs int
}

// countRecords counts the records of an encoded RecordBatch, stopping at
// the first malformed field (decode reports it).
func countRecords(b []byte) int {
	n := 0
	for len(b) > 0 {
		num, typ, k := consumeTag(b)
		if k < 0 {
			return n
		}
		b = b[k:]
		if num == 1 && typ == protowire.BytesType {
			_, k = protowire.ConsumeBytes(b)
			n++
		} else {
			k = protowire.ConsumeFieldValue(num, typ, b)
		}
		if k < 0 {
			return n
		}
		b = b[k:]
	}
	return n
}

func (d *batchDecoder) decode(buf []byte, base, from int64, out []*Message) ([]*Message, error) {
	total := countRecords(buf)
	skip := total
	if from <= base {
		skip = 0
	} else if diff := uint64(from) - uint64(base); diff < uint64(total) {
		skip = int(diff)
	}
	d.remaining = total - skip
	var slab []Message
	if d.remaining > 0 {
		slab = make([]Message, d.remaining)
		out = slices.Grow(out, d.remaining)
	}
	off := base
	for len(buf) > 0 {
		num, typ, n := consumeTag(buf)
		if n < 0 {
			return out, protowire.ParseError(n)
		}
		buf = buf[n:]
		if num != 1 || typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, buf)
			if n < 0 {
				return out, protowire.ParseError(n)
			}
			buf = buf[n:]
			continue
		}
		rec, n := protowire.ConsumeBytes(buf)
		if n < 0 {
			return out, protowire.ParseError(n)
		}
		buf = buf[n:]
		var m *Message
		if off >= from {
			if len(slab) > 0 {
				m, slab = &slab[0], slab[1:]
			} else {
				m = new(Message)
			}
		}
		ts, err := d.record(rec, m)
		if err != nil {
			return out, fmt.Errorf("record %d: %w", off-base, err)
		}
		if m != nil {
			if ts == 0 {
				ts = d.appendTime
			}
			m.Topic = d.topic
			m.Partition = d.partition
			m.Timestamp = d.time(ts)
			m.Offset = off
			out = append(out, m)
			d.remaining--
		}
		off++
	}
	return out, nil
}

// record decodes one encoded Record into m's Key, Value, Headers and Tags,
// or only checks it when m is nil (a record below the fetch offset), and
// returns its timestamp_ms. The caller sets the other fields of m.
func (d *batchDecoder) record(b []byte, m *Message) (int64, error) {
	var key, value []byte
	var ts, prio, ttl int64
	d.hstart, d.tstart = len(d.hdrs), len(d.tags)
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case typ == protowire.BytesType && num >= 1 && num <= 5 && num != 4:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			b = b[n:]
			switch num {
			case 1:
				key = v
			case 2:
				value = v
			case 3:
				hk, hv, err := parseHeader(v)
				if err != nil {
					return 0, err
				}
				if m != nil {
					d.addHeader(Header{Key: d.intern(hk), Value: capped(hv)})
				}
			case 5:
				if !utf8.Valid(v) {
					return 0, errTagUTF8
				}
				if m != nil {
					d.addTag(d.intern(v))
				}
			}
		case num == 4 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			b = b[n:]
			ts = int64(v)
		case (num == 6 || num == 7) && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			b = b[n:]
			if num == 6 {
				prio = int64(min(v, 9))
			} else {
				ttl = int64(min(v, 1<<40))
			}
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	if m == nil {
		return ts, nil
	}
	m.Key = capped(key)
	m.Value = capped(value)
	m.Priority = uint8(prio)
	m.TTL = time.Duration(ttl) * time.Millisecond
	if n := len(d.hdrs); n > d.hstart {
		m.Headers = d.hdrs[d.hstart:n:n]
	}
	if n := len(d.tags); n > d.tstart {
		m.Tags = d.tags[d.tstart:n:n]
	}
	return ts, nil
}

// time returns time.UnixMilli(ms), reusing the previous result when ms
// repeats (records of a batch often share their timestamp).
func (d *batchDecoder) time(ms int64) time.Time {
	if !d.haveTime || ms != d.lastTS {
		d.lastTS, d.lastTime, d.haveTime = ms, time.UnixMilli(ms), true
	}
	return d.lastTime
}

// parseHeader decodes one encoded Header: its key (valid UTF-8) and value,
// the last of each if repeated.
func parseHeader(b []byte) (key, value []byte, err error) {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return nil, nil, fmt.Errorf("header: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if typ == protowire.BytesType && (num == 1 || num == 2) {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, nil, fmt.Errorf("header: %w", protowire.ParseError(n))
			}
			b = b[n:]
			if num == 1 {
				if !utf8.Valid(v) {
					return nil, nil, errHeaderUTF8
				}
				key = v
			} else {
				value = v
			}
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil, nil, fmt.Errorf("header: %w", protowire.ParseError(n))
		}
		b = b[n:]
	}
	return key, value, nil
}

// capped returns b with its capacity cut to its length, so that appending
// to it cannot overwrite the bytes that follow in the batch; nil if empty.
func capped(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b[:len(b):len(b)]
}

// intern returns b as a string, reusing a recently decoded equal string:
// header keys and tags tend to repeat from record to record.
func (d *batchDecoder) intern(b []byte) string {
	for i := range min(d.nstrs, len(d.strs)) {
		if d.strs[i] == string(b) {
			return d.strs[i]
		}
	}
	s := string(b)
	d.strs[d.nstrs%len(d.strs)] = s
	d.nstrs++
	return s
}

// slabCap is the capacity of a new header or tag slab when the current
// record has n of them so far: room for twice that, or an estimate for
// the records still to come, up to 1024.
func (d *batchDecoder) slabCap(n int) int {
	return max(2*n, min(1024, n*max(d.remaining, 1)))
}

func (d *batchDecoder) addHeader(h Header) {
	if len(d.hdrs) == cap(d.hdrs) {
		cur := d.hdrs[d.hstart:]
		nh := make([]Header, len(cur), d.slabCap(len(cur)+1))
		copy(nh, cur)
		d.hdrs, d.hstart = nh, 0
	}
	d.hdrs = append(d.hdrs, h)
}

func (d *batchDecoder) addTag(t string) {
	if len(d.tags) == cap(d.tags) {
		cur := d.tags[d.tstart:]
		nt := make([]string, len(cur), d.slabCap(len(cur)+1))
		copy(nt, cur)
		d.tags, d.tstart = nt, 0
	}
	d.tags = append(d.tags, t)
}

// consumeTag is protowire.ConsumeTag that also rejects field numbers above
// protowire.MaxValidNumber, as proto.Unmarshal does. A one-byte tag (field
// numbers 1 to 15, all of Herald's hot fields) is decoded inline.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	if len(b) > 0 && b[0] < 0x80 && b[0] >= 1<<3 {
		return protowire.Number(b[0] >> 3), protowire.Type(b[0] & 7), 1
	}
	num, typ, n := protowire.ConsumeTag(b)
	if n >= 0 && num > protowire.MaxValidNumber {
		return 0, 0, errCodeFieldNumber
	}
	return num, typ, n
}

// Field numbers decodeDelivery and deliveryBody rely on;
// TestDeliveryFieldNumbers checks them against the generated code.
const (
	frameDeliveryField = 60 // Frame.delivery

	deliverySubscriptionField = 1 // Delivery.subscription_id
	deliveryMessagesField     = 2 // Delivery.messages

	dmPartitionField     = 1 // DeliveredMessage.partition
	dmOffsetField        = 2 // DeliveredMessage.offset
	dmDeliveryCountField = 3 // DeliveredMessage.delivery_count
	dmAppendTimeField    = 4 // DeliveredMessage.append_time_ms
	dmRecordField        = 5 // DeliveredMessage.record
	dmReplyInboxField    = 6 // DeliveredMessage.reply_inbox
	dmCorrelationField   = 7 // DeliveredMessage.correlation_id
)

var errReplyInboxUTF8 = errors.New("herald: reply inbox: string field contains invalid UTF-8")

// deliveryBody reports whether a frame payload is a Delivery push as the
// broker encodes it (heraldpb.AppendDelivery; proto.Marshal of such a
// Frame gives the same shape): a Frame whose only field is its delivery
// body. It returns that body, an encoded heraldpb.Delivery, aliasing
// payload. Any other payload (a response, another push, or a Delivery
// frame with more fields, which proto.Unmarshal would merge) is left to
// heraldpb.DecodeFrame.
func deliveryBody(payload []byte) ([]byte, bool) {
	num, typ, n := protowire.ConsumeTag(payload)
	if n < 0 || num != frameDeliveryField || typ != protowire.BytesType {
		return nil, false
	}
	body, m := protowire.ConsumeBytes(payload[n:])
	if m < 0 || n+m != len(payload) {
		return nil, false
	}
	return body, true
}

// decodeDelivery decodes an encoded heraldpb.Delivery straight into
// Delivered values, without building heraldpb messages: the subscription
// id and the messages with every field that deliveredFromProto sets (not
// Topic, sub and sess, which Subscription.deliver sets).
//
// It gives exactly what proto.Unmarshal followed by deliveredFromProto
// gives: last-wins scalar fields, repeated record fields merged, unknown
// fields and known field numbers with another wire type skipped, and an
// error wrapping heraldpb.ErrMalformed for any input proto.Unmarshal
// rejects (bad wire format, invalid UTF-8 in reply_inbox, a header key or
// a tag); it never panics. Key, Value and header values alias b, which the
// caller must never reuse or modify; empty ones are nil. All messages are
// allocated in one slab, as are their headers and tags; a reply inbox,
// header key or tag equal to a recent one shares its string.
func decodeDelivery(b []byte) (uint64, []Delivered, error) {
	subID, count, err := scanDelivery(b)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: delivery: %v", heraldpb.ErrMalformed, err)
	}
	if count == 0 {
		return subID, nil, nil
	}
	msgs := make([]Delivered, count)
	var d batchDecoder
	i := 0
	for len(b) > 0 && i < count {
		// scanDelivery checked the framing; the checks here only keep a
		// mistake from panicking.
		num, typ, n := consumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		isMsg := num == deliveryMessagesField && typ == protowire.BytesType
		var v []byte
		if isMsg {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			break
		}
		b = b[n:]
		if !isMsg {
			continue
		}
		d.remaining = count - i
		if err := d.delivered(v, &msgs[i]); err != nil {
			return 0, nil, fmt.Errorf("%w: delivery: message %d: %v", heraldpb.ErrMalformed, i, err)
		}
		i++
	}
	if i != count {
		return 0, nil, fmt.Errorf("%w: delivery: found %d of %d messages", heraldpb.ErrMalformed, i, count)
	}
	return subID, msgs, nil
}

// scanDelivery checks the top-level wire format of an encoded Delivery and
// returns its subscription id (the last one) and the number of messages.
func scanDelivery(b []byte) (subID uint64, count int, err error) {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return 0, 0, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == deliverySubscriptionField && typ == protowire.VarintType:
			subID, n = protowire.ConsumeVarint(b)
		case num == deliveryMessagesField && typ == protowire.BytesType:
			_, n = protowire.ConsumeBytes(b)
			count++
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return 0, 0, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return subID, count, nil
}

// delivered decodes one encoded DeliveredMessage into m. The record is
// decoded last, once the append time is known, whatever the field order.
func (d *batchDecoder) delivered(b []byte, m *Delivered) error {
	var rec []byte
	var appendMs int64
	var haveRec, merged bool
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case typ == protowire.VarintType && num >= dmPartitionField && num <= dmCorrelationField && num != dmRecordField && num != dmReplyInboxField:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			switch num {
			case dmPartitionField:
				m.Partition = int32(uint32(v))
			case dmOffsetField:
				m.Offset = int64(v)
			case dmDeliveryCountField:
				m.DeliveryCount = int(uint32(v))
			case dmAppendTimeField:
				appendMs = int64(v)
			case dmCorrelationField:
				m.CorrelationID = v
			}
		case typ == protowire.BytesType && (num == dmRecordField || num == dmReplyInboxField):
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			if num == dmReplyInboxField {
				if !utf8.Valid(v) {
					return errReplyInboxUTF8
				}
				m.ReplyInbox = ""
				if len(v) > 0 {
					m.ReplyInbox = d.intern(v)
				}
				continue
			}
			if !haveRec {
				rec, haveRec = v, true
				continue
			}
			// A repeated message field merges, which is decoding the
			// concatenation of the occurrences once each is known to be
			// well formed on its own (rare: the broker sends one).
			if !merged {
				if _, err := d.record(rec, nil); err != nil {
					return fmt.Errorf("record: %w", err)
				}
				merged = true
			}
			if _, err := d.record(v, nil); err != nil {
				return fmt.Errorf("record: %w", err)
			}
			rec = append(rec[:len(rec):len(rec)], v...)
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	if m.ReplyInbox != "" {
		m.Partition, m.Offset = -1, -1
	}
	ts, err := d.record(rec, &m.Message)
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	if ts == 0 {
		ts = appendMs
	}
	if ts != 0 {
		m.Timestamp = d.time(ts)
	}
	return nil
}
