package client

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

func TestDeliveryFieldNumbers(t *testing.T) {
	check := func(m proto.Message, name protoreflect.Name, want protowire.Number) {
		t.Helper()
		fd := m.ProtoReflect().Descriptor().Fields().ByName(name)
		if fd == nil || fd.Number() != want {
			t.Errorf("%s.%s: want field %d, have %v", m.ProtoReflect().Descriptor().Name(), name, want, fd)
		}
	}
	check(&heraldpb.Frame{}, "delivery", frameDeliveryField)
	check(&heraldpb.Delivery{}, "subscription_id", deliverySubscriptionField)
	check(&heraldpb.Delivery{}, "messages", deliveryMessagesField)
	dm := &heraldpb.DeliveredMessage{}
	check(dm, "partition", dmPartitionField)
	check(dm, "offset", dmOffsetField)
	check(dm, "delivery_count", dmDeliveryCountField)
	check(dm, "append_time_ms", dmAppendTimeField)
	check(dm, "record", dmRecordField)
	check(dm, "reply_inbox", dmReplyInboxField)
	check(dm, "correlation_id", dmCorrelationField)
}

// decodeDeliveryFast is what the reader does with a pushed frame payload
// that deliveryBody recognises.
func decodeDeliveryFast(t testing.TB, payload []byte) (uint64, []Delivered, error) {
	t.Helper()
	body, ok := deliveryBody(payload)
	if !ok {
		t.Fatalf("payload %x not recognised as a Delivery push", payload)
	}
	return decodeDelivery(body)
}

// deliveryPayload wraps an encoded Delivery into a frame payload.
func deliveryPayload(body []byte) []byte {
	b := protowire.AppendTag(nil, frameDeliveryField, protowire.BytesType)
	return protowire.AppendBytes(b, body)
}

func randRecord(r *rand.Rand) *heraldpb.Record {
	m := randMessage(r)
	rec := &heraldpb.Record{Key: m.Key, Value: m.Value, Tags: m.Tags}
	if !m.Timestamp.IsZero() {
		rec.TimestampMs = m.Timestamp.UnixMilli()
	}
	for _, h := range m.Headers {
		rec.Headers = append(rec.Headers, &heraldpb.Header{Key: h.Key, Value: h.Value})
	}
	return rec
}

func randVarint(r *rand.Rand) uint64 {
	switch r.IntN(5) {
	case 0:
		return 0
	case 1:
		return uint64(r.IntN(300))
	case 2:
		return uint64(r.Uint32())
	case 3:
		return -uint64(1 + r.IntN(5)) // a negative int64: ten bytes
	}
	return r.Uint64()
}

func randDelivered(r *rand.Rand) *heraldpb.DeliveredMessage {
	dm := &heraldpb.DeliveredMessage{
		Partition:     uint32(randVarint(r)),
		Offset:        int64(randVarint(r)),
		DeliveryCount: uint32(r.IntN(4)),
		CorrelationId: randVarint(r),
	}
	if r.IntN(2) == 0 {
		dm.AppendTimeMs = 1_700_000_000_000 + r.Int64N(1000)
	}
	if r.IntN(5) != 0 {
		dm.Record = randRecord(r)
	}
	if r.IntN(4) == 0 {
		dm.ReplyInbox = randString(r)
	}
	return dm
}

// appendUnknown appends a field no Herald message knows, of any wire type.
func appendUnknown(r *rand.Rand, b []byte) []byte {
	num := []protowire.Number{8, 9, 15, 16, 100, 2047, protowire.MaxValidNumber}[r.IntN(7)]
	return appendOfType(r, b, num, protowire.Type(r.IntN(6)))
}

// appendOfType appends field num with a random value of wire type typ (an
// end-group type gives a whole group instead).
func appendOfType(r *rand.Rand, b []byte, num protowire.Number, typ protowire.Type) []byte {
	switch typ {
	case protowire.VarintType:
		b = protowire.AppendTag(b, num, typ)
		return protowire.AppendVarint(b, randVarint(r))
	case protowire.Fixed32Type:
		b = protowire.AppendTag(b, num, typ)
		return protowire.AppendFixed32(b, r.Uint32())
	case protowire.Fixed64Type:
		b = protowire.AppendTag(b, num, typ)
		return protowire.AppendFixed64(b, r.Uint64())
	case protowire.BytesType:
		b = protowire.AppendTag(b, num, typ)
		return protowire.AppendBytes(b, randBytes(r, 12))
	}
	b = protowire.AppendTag(b, num, protowire.StartGroupType)
	if r.IntN(2) == 0 {
		b = appendOfType(r, b, 1, protowire.VarintType)
	}
	return protowire.AppendTag(b, num, protowire.EndGroupType)
}

const (
	varintT = protowire.VarintType
	bytesT  = protowire.BytesType
)

// scrambled builds a message from chunks, each one or more encoded fields:
// they are shuffled, and unknown fields and known field numbers with
// another wire type are mixed in. known gives the wire type of each field
// number, from 1.
func scrambled(r *rand.Rand, known []protowire.Type, chunks [][]byte) []byte {
	for range r.IntN(3) {
		chunks = append(chunks, appendUnknown(r, nil))
	}
	if r.IntN(3) == 0 {
		i := r.IntN(len(known))
		typ := known[i]
		for typ == known[i] {
			typ = protowire.Type(r.IntN(6))
		}
		chunks = append(chunks, appendOfType(r, nil, protowire.Number(i+1), typ))
	}
	r.Shuffle(len(chunks), func(i, j int) { chunks[i], chunks[j] = chunks[j], chunks[i] })
	return slices.Concat(chunks...)
}

func scrambledHeader(r *rand.Rand) []byte {
	var chunks [][]byte
	for range r.IntN(3) {
		chunks = append(chunks, protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), randString(r)))
	}
	for range r.IntN(3) {
		chunks = append(chunks, protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), randBytes(r, 8)))
	}
	return scrambled(r, []protowire.Type{bytesT, bytesT}, chunks)
}

func scrambledRecord(r *rand.Rand) []byte {
	var chunks [][]byte
	for _, num := range []protowire.Number{1, 2} {
		for range r.IntN(3) {
			chunks = append(chunks, protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), randBytes(r, 40)))
		}
	}
	for range r.IntN(3) {
		chunks = append(chunks, protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), scrambledHeader(r)))
	}
	for range r.IntN(3) {
		chunks = append(chunks, protowire.AppendVarint(protowire.AppendTag(nil, 4, protowire.VarintType), randVarint(r)))
	}
	for range r.IntN(3) {
		chunks = append(chunks, protowire.AppendString(protowire.AppendTag(nil, 5, protowire.BytesType), randString(r)))
	}
	return scrambled(r, []protowire.Type{bytesT, bytesT, bytesT, varintT, bytesT}, chunks)
}

func scrambledDelivered(r *rand.Rand) []byte {
	var chunks [][]byte
	for _, num := range []protowire.Number{dmPartitionField, dmOffsetField, dmDeliveryCountField, dmAppendTimeField, dmCorrelationField} {
		for range r.IntN(3) {
			chunks = append(chunks, protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), randVarint(r)))
		}
	}
	for range r.IntN(4) { // several occurrences merge
		chunks = append(chunks, protowire.AppendBytes(protowire.AppendTag(nil, dmRecordField, protowire.BytesType), scrambledRecord(r)))
	}
	for range r.IntN(3) {
		chunks = append(chunks, protowire.AppendString(protowire.AppendTag(nil, dmReplyInboxField, protowire.BytesType), randString(r)))
	}
	return scrambled(r, []protowire.Type{varintT, varintT, varintT, varintT, bytesT, bytesT, varintT}, chunks)
}

func scrambledDelivery(r *rand.Rand) []byte {
	var chunks [][]byte
	for range r.IntN(3) {
		chunks = append(chunks, protowire.AppendVarint(protowire.AppendTag(nil, deliverySubscriptionField, protowire.VarintType), randVarint(r)))
	}
	for range r.IntN(6) {
		chunks = append(chunks, protowire.AppendBytes(protowire.AppendTag(nil, deliveryMessagesField, protowire.BytesType), scrambledDelivered(r)))
	}
	return scrambled(r, []protowire.Type{varintT, bytesT}, chunks)
}

// checkSameDelivery decodes payload both ways and fails unless both accept
// it with the same result.
func checkSameDelivery(t *testing.T, name string, payload []byte) []Delivered {
	t.Helper()
	refID, ref, rerr := decodeDeliveryProto(payload)
	if rerr != nil {
		t.Fatalf("%s: proto.Unmarshal rejects the frame: %v", name, rerr)
	}
	id, got, err := decodeDeliveryFast(t, payload)
	if err != nil {
		t.Fatalf("%s: decodeDelivery: %v", name, err)
	}
	if id != refID || !reflect.DeepEqual(got, ref) {
		t.Fatalf("%s: decodeDelivery differs from proto.Unmarshal decoding\n got %d %+v\nwant %d %+v", name, id, got, refID, ref)
	}
	return got
}

// TestDecodeDeliveryMatchesProto checks decodeDelivery against
// proto.Unmarshal and deliveredFromProto on Deliveries encoded by
// proto.Marshal, by heraldpb.AppendDelivery (as the broker does), and by
// hand with shuffled, repeated, unknown and mistyped fields and records
// split into several occurrences.
func TestDecodeDeliveryMatchesProto(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 3000 {
		subID := randVarint(r)
		var dms []*heraldpb.DeliveredMessage
		var pms []heraldpb.PushMessage
		for range r.IntN(8) {
			dm := randDelivered(r)
			dms = append(dms, dm)
			rec, err := proto.Marshal(dm.GetRecord())
			if err != nil {
				t.Fatal(err)
			}
			pms = append(pms, heraldpb.PushMessage{Partition: dm.Partition, Offset: dm.Offset, DeliveryCount: dm.DeliveryCount,
				AppendTimeMs: dm.AppendTimeMs, Record: rec, ReplyInbox: dm.ReplyInbox, CorrelationID: dm.CorrelationId})
		}

		frame, err := heraldpb.AppendFrame(nil, &heraldpb.Frame{Body: &heraldpb.Frame_Delivery{Delivery: &heraldpb.Delivery{SubscriptionId: subID, Messages: dms}}})
		if err != nil {
			t.Fatal(err)
		}
		got := checkSameDelivery(t, "proto.Marshal", frame[heraldpb.HeaderLen:])
		checkSameDelivery(t, "AppendDelivery", heraldpb.AppendDelivery(nil, subID, pms)[heraldpb.HeaderLen:])
		checkSameDelivery(t, "scrambled", deliveryPayload(scrambledDelivery(r)))

		// And what was sent comes back.
		if len(got) != len(dms) {
			t.Fatalf("case %d: sent %d messages, got %d", i, len(dms), len(got))
		}
		for j, dm := range dms {
			d := &got[j]
			want := Delivered{DeliveryCount: int(dm.DeliveryCount), ReplyInbox: dm.ReplyInbox, CorrelationID: dm.CorrelationId}
			want.Partition, want.Offset = int32(dm.Partition), dm.Offset
			if dm.ReplyInbox != "" {
				want.Partition, want.Offset = -1, -1
			}
			recordToMessage(&want.Message, dm.GetRecord(), dm.AppendTimeMs)
			if !reflect.DeepEqual(d, &want) {
				t.Fatalf("case %d message %d: sent %v\n got %+v\nwant %+v", i, j, dm, d, &want)
			}
		}
	}
}

// The messages of a pushed frame alias it, capped so that appending to one
// slice cannot overwrite the next.
func TestDecodeDeliveryAliasesFrame(t *testing.T) {
	rec := func(k, v string) []byte {
		b, _ := proto.Marshal(&heraldpb.Record{Key: []byte(k), Value: []byte(v), Headers: []*heraldpb.Header{{Key: "h", Value: []byte("x")}}})
		return b
	}
	payload := heraldpb.AppendDelivery(nil, 7, []heraldpb.PushMessage{{Offset: 1, Record: rec("k", "v")}, {Offset: 2, Record: rec("k2", "v2")}})[heraldpb.HeaderLen:]
	id, ms, err := decodeDeliveryFast(t, payload)
	if err != nil || id != 7 || len(ms) != 2 {
		t.Fatal(id, ms, err)
	}
	snapshot := slices.Clone(payload)
	inPayload := func(b []byte) bool { // writing to b changes payload
		b[0] ^= 0xff
		defer func() { b[0] ^= 0xff }()
		return !slices.Equal(payload, snapshot)
	}
	if !inPayload(ms[0].Key) || !inPayload(ms[0].Value) || !inPayload(ms[1].Headers[0].Value) {
		t.Fatal("key, value or header value copied out of the frame")
	}
	_ = append(ms[0].Key, "XXXXXXXXXXXXXXXX"...)
	_ = append(ms[0].Value, "XXXXXXXXXXXXXXXX"...)
	_ = append(ms[0].Headers[0].Value, "XXXXXXXXXXXXXXXX"...)
	_ = append(ms[0].Headers, Header{Key: "y"})
	if string(ms[0].Value) != "v" || string(ms[1].Key) != "k2" || string(ms[1].Value) != "v2" || ms[1].Headers[0].Key != "h" {
		t.Fatalf("appending to a decoded slice changed the frame: %+v %+v", &ms[0], &ms[1])
	}
}

// Frames that are not a Delivery alone, as the broker sends it, take the
// generic path.
func TestDeliveryBodyShape(t *testing.T) {
	body := heraldpb.AppendDelivery(nil, 7, []heraldpb.PushMessage{{Offset: 1}})[heraldpb.HeaderLen+3:]
	payload := deliveryPayload(body)
	if b, ok := deliveryBody(payload); !ok || !slices.Equal(b, body) {
		t.Fatalf("deliveryBody(%x) = %x, %v", payload, b, ok)
	}
	for name, p := range map[string][]byte{
		"empty":          nil,
		"id first":       append(protowire.AppendVarint([]byte{1 << 3}, 0), payload...),
		"id after":       append(slices.Clone(payload), 1<<3, 0),
		"twice (merged)": slices.Concat(payload, payload),
		"truncated":      payload[:len(payload)-1],
		"varint body":    protowire.AppendVarint(protowire.AppendTag(nil, frameDeliveryField, protowire.VarintType), 3),
		"reply delivery": protowire.AppendBytes(protowire.AppendTag(nil, 62, protowire.BytesType), nil),
	} {
		if b, ok := deliveryBody(p); ok {
			t.Errorf("%s: deliveryBody(%x) = %x, true", name, p, b)
		}
	}
}

func TestDecodeDeliveryMalformed(t *testing.T) {
	msg := func(fields ...[]byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, deliveryMessagesField, protowire.BytesType), slices.Concat(fields...))
	}
	recField := func(rec []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, dmRecordField, protowire.BytesType), rec)
	}
	good := msg(protowire.AppendVarint([]byte{dmOffsetField << 3}, 5), recField([]byte{tagRecordValue, 1, 'v'}))
	for name, body := range map[string][]byte{
		"truncated message":    good[:len(good)-1],
		"bad tag":              {0x00, 0x01},
		"big field":            protowire.AppendTag(nil, protowire.MaxValidNumber+1, protowire.VarintType),
		"end group":            protowire.AppendTag(nil, 7, protowire.EndGroupType),
		"overlong varint":      append([]byte{deliverySubscriptionField << 3}, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01),
		"message bad tag":      slices.Concat(good, msg([]byte{0x00})),
		"message end group":    msg(protowire.AppendTag(nil, 9, protowire.EndGroupType)),
		"message bad varint":   msg([]byte{dmPartitionField << 3, 0x80}),
		"reply inbox utf8":     msg([]byte{dmReplyInboxField<<3 | 2, 2, 'a', 0xff}),
		"record truncated":     msg(recField([]byte{tagRecordValue, 3, 'v'})),
		"record header utf8":   msg(recField([]byte{tagRecordHeader, 3, tagHeaderKey, 1, 0xff})),
		"record tag utf8":      msg(recField([]byte{tagRecordTag, 1, 0xc0})),
		"second record bad":    msg(recField([]byte{tagRecordValue, 1, 'v'}), recField([]byte{tagRecordKey, 2})),
		"bad records that fit": msg(recField([]byte{tagRecordKey, 2}), recField([]byte{1 << 3, 1})), // concatenated they parse
	} {
		payload := deliveryPayload(body)
		if _, _, rerr := decodeDeliveryProto(payload); rerr == nil {
			t.Errorf("%s: proto.Unmarshal accepts it", name)
		}
		_, ms, err := decodeDeliveryFast(t, payload)
		if !errors.Is(err, heraldpb.ErrMalformed) || ms != nil {
			t.Errorf("%s: got %d messages, %v", name, len(ms), err)
		}
	}
}

// A malformed Delivery fails the connection, as any malformed frame does,
// and one in another shape goes through DecodeFrame and push.
func TestPushDeliveryPaths(t *testing.T) {
	cn, s := pushTarget(8)
	payload := heraldpb.AppendDelivery(nil, 7, []heraldpb.PushMessage{{Offset: 1, DeliveryCount: 1}, {Offset: 2, DeliveryCount: 2}})[heraldpb.HeaderLen:]
	if ok, err := cn.pushDelivery(payload); !ok || err != nil {
		t.Fatal(ok, err)
	}
	// An explicit id 0 after the body: proto.Unmarshal still gives a
	// Delivery push, by the generic path.
	withID := append(slices.Clone(payload), 1<<3, 0)
	if ok, err := cn.pushDelivery(withID); ok || err != nil {
		t.Fatal(ok, err)
	}
	f, err := heraldpb.DecodeFrame(withID)
	if err != nil || !cn.push(f) {
		t.Fatal(f, err)
	}
	if st := s.Stats(); st.Delivered != 4 || st.Redelivered != 2 {
		t.Fatalf("stats %+v", st)
	}
	for _, q := range s.queues {
		for len(q) > 0 {
			if d := <-q; d.Topic != "t" || d.sub != s || d.sess != s.cur {
				t.Fatalf("delivered %+v", d)
			}
		}
	}
	if ok, err := cn.pushDelivery(deliveryPayload([]byte{0x00})); !ok || !errors.Is(err, heraldpb.ErrMalformed) {
		t.Fatal(ok, err)
	}
}

// FuzzDecodeDelivery feeds arbitrary Delivery bodies, wrapped in a push
// frame payload, to decodeDelivery. It checks that decodeDelivery never
// panics and agrees with proto.Unmarshal followed by deliveredFromProto:
// the same subscription id and messages when that accepts the frame, an
// ErrMalformed error and no messages when it rejects it.
func FuzzDecodeDelivery(f *testing.F) {
	r := rand.New(rand.NewPCG(7, 8))
	for range 4 {
		f.Add(scrambledDelivery(r))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		payload := deliveryPayload(body)
		refID, ref, rerr := decodeDeliveryProto(payload)
		id, got, err := decodeDeliveryFast(t, payload)
		if rerr != nil {
			if !errors.Is(err, heraldpb.ErrMalformed) || got != nil {
				t.Fatalf("proto.Unmarshal rejects the frame (%v), decodeDelivery gives %d messages, %v", rerr, len(got), err)
			}
			return
		}
		if err != nil {
			t.Fatalf("proto.Unmarshal accepts the frame, decodeDelivery fails: %v", err)
		}
		if id != refID || !reflect.DeepEqual(got, ref) {
			t.Fatalf("decodeDelivery differs\n got %d %+v\nwant %d %+v", id, got, refID, ref)
		}
	})
}
