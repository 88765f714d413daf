package client

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

func randBytes(r *rand.Rand, max int) []byte {
	switch r.IntN(6) {
	case 0:
		return nil
	case 1:
		return []byte{}
	}
	b := make([]byte, r.IntN(max+1))
	for i := range b {
		b[i] = byte(r.UintN(256))
	}
	return b
}

func randString(r *rand.Rand) string {
	s := []string{"", "a", "trace-id", "héllo", "日本", "x"}
	if r.IntN(4) == 0 {
		return string(rune('a'+r.IntN(26))) + "-" + s[r.IntN(len(s))]
	}
	return s[r.IntN(len(s))]
}

// randMessage returns a message exercising every field: empty and nil byte
// slices, duplicate and empty headers and tags, zero and set timestamps.
func randMessage(r *rand.Rand) *Message {
	m := &Message{Topic: "t", Key: randBytes(r, 20), Value: randBytes(r, 300)}
	for range r.IntN(4) {
		h := Header{Key: randString(r), Value: randBytes(r, 10)}
		m.Headers = append(m.Headers, h)
		if r.IntN(3) == 0 {
			m.Headers = append(m.Headers, h) // duplicate
		}
	}
	for range r.IntN(3) {
		m.Tags = append(m.Tags, randString(r))
	}
	switch r.IntN(4) {
	case 0:
		m.Timestamp = time.UnixMilli(r.Int64N(1 << 42))
	case 1:
		m.Timestamp = time.Unix(0, 500_000) // before the first millisecond: encodes as 0
	case 2:
		m.Timestamp = time.UnixMilli(1<<62 + r.Int64N(1<<40))
	}
	return m
}

func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

func TestEncodeRecordMatchesProtoMarshal(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		n := 1 + r.IntN(20)
		ms := make([]*Message, n)
		var got, want []byte
		prefix := []byte("prefix")
		got = append(got, prefix...)
		for j := range ms {
			ms[j] = randMessage(r)
			var err error
			if got, err = encodeRecord(got, ms[j]); err != nil {
				t.Fatal(err)
			}
			if want, err = encodeRecordProto(want, ms[j]); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(got[len(prefix):], want) || !bytes.HasPrefix(got, prefix) {
			t.Fatalf("case %d: encoding differs from proto.Marshal\n got %x\nwant %x", i, got[len(prefix):], want)
		}
		data := got[len(prefix):]
		var rb heraldpb.RecordBatch
		if err := proto.Unmarshal(data, &rb); err != nil {
			t.Fatalf("case %d: proto.Unmarshal: %v", i, err)
		}
		info, err := heraldpb.ScanBatch(data)
		if err != nil || info.Count != n {
			t.Fatalf("case %d: ScanBatch: %+v, %v", i, info, err)
		}

		const base, appendMs = 500, 1_700_000_000_123
		from := int64(base + r.IntN(n+2) - 1)
		sb := &heraldpb.StoredBatch{BaseOffset: base, Count: uint32(n), AppendTimeMs: appendMs, Records: data}
		pre := []*Message{{Topic: "earlier"}}
		dec, err := decodeBatch("t", 3, sb, from, slices.Clone(pre))
		if err != nil {
			t.Fatal(err)
		}
		ref, err := decodeBatchProto("t", 3, sb, from, slices.Clone(pre))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(dec, ref) {
			t.Fatalf("case %d: decodeBatch differs from proto.Unmarshal decoding\n got %+v\nwant %+v", i, dec, ref)
		}
		// And the round trip gives back what was sent.
		dec = dec[1:]
		for j, m := range ms {
			off := int64(base + j)
			if off < from {
				continue
			}
			d := dec[0]
			dec = dec[1:]
			var ts int64
			if !m.Timestamp.IsZero() {
				ts = m.Timestamp.UnixMilli()
			}
			if ts == 0 {
				ts = appendMs
			}
			if d.Offset != off || d.Partition != 3 || d.Topic != "t" || !bytes.Equal(d.Key, nilIfEmpty(m.Key)) || !bytes.Equal(d.Value, m.Value) ||
				d.Timestamp.UnixMilli() != ts || len(d.Headers) != len(m.Headers) || !slices.Equal(d.Tags, m.Tags) {
				t.Fatalf("case %d record %d: sent %+v got %+v", i, j, m, d)
			}
			for k, h := range m.Headers {
				if d.Headers[k].Key != h.Key || !bytes.Equal(d.Headers[k].Value, nilIfEmpty(h.Value)) {
					t.Fatalf("case %d record %d header %d: sent %+v got %+v", i, j, k, h, d.Headers[k])
				}
			}
		}
		if len(dec) != 0 {
			t.Fatalf("case %d: %d extra messages", i, len(dec))
		}
	}
}

func TestEncodeRecordErrors(t *testing.T) {
	for _, m := range []*Message{
		{Value: []byte("v"), Timestamp: time.UnixMilli(-5)},
		{Value: []byte("v"), Headers: []Header{{Key: "ok"}, {Key: "bad\xff"}}},
		{Value: []byte("v"), Tags: []string{"ok", "\xc0"}},
	} {
		dst := []byte("keep")
		out, err := encodeRecord(dst, m)
		if err == nil || string(out) != "keep" {
			t.Errorf("%+v: got %q, %v", m, out, err)
		}
		if _, rerr := encodeRecordProto(nil, m); rerr == nil {
			t.Errorf("%+v: the reference encoder accepts it", m)
		}
	}
}

func TestDecodedSlicesAreCapped(t *testing.T) {
	data, err := encodeRecord(nil, &Message{Key: []byte("k"), Value: []byte("v"), Headers: []Header{{Key: "h", Value: []byte("x")}}})
	if err != nil {
		t.Fatal(err)
	}
	data, _ = encodeRecord(data, &Message{Key: []byte("k2"), Value: []byte("v2")})
	ms, err := decodeBatch("t", 0, &heraldpb.StoredBatch{Records: data}, 0, nil)
	if err != nil || len(ms) != 2 {
		t.Fatal(ms, err)
	}
	_ = append(ms[0].Key, "XXXXXXXXXXXXXXXX"...)
	_ = append(ms[0].Value, "XXXXXXXXXXXXXXXX"...)
	_ = append(ms[0].Headers[0].Value, "XXXXXXXXXXXXXXXX"...)
	_ = append(ms[0].Headers, Header{Key: "y"})
	if string(ms[0].Value) != "v" || ms[0].Headers[0].Key != "h" || string(ms[1].Key) != "k2" || string(ms[1].Value) != "v2" || ms[1].Headers != nil {
		t.Fatalf("appending to a decoded slice changed the batch: %+v %+v", ms[0], ms[1])
	}
}

func TestDecodeBatchMalformed(t *testing.T) {
	good, _ := encodeRecord(nil, &Message{Key: []byte("k"), Value: []byte("v"), Headers: []Header{{Key: "h"}}, Tags: []string{"t"}})
	rec := good[2:]
	wrap := func(r []byte) []byte {
		return append(protowire.AppendVarint([]byte{tagBatchRecord}, uint64(len(r))), r...)
	}
	for name, data := range map[string][]byte{
		"truncated":       good[:len(good)-1],
		"bad tag":         {0x00, 0x01},
		"big field":       protowire.AppendTag(nil, protowire.MaxValidNumber+1, protowire.VarintType),
		"end group":       protowire.AppendTag(nil, 7, protowire.EndGroupType),
		"header utf8":     wrap(append(slices.Clone(rec), tagRecordHeader, 3, tagHeaderKey, 1, 0xff)),
		"tag utf8":        wrap(append(slices.Clone(rec), tagRecordTag, 1, 0xff)),
		"record trailing": wrap(append(slices.Clone(rec), tagRecordTime)),
	} {
		pre := []*Message{{Topic: "keep"}}
		out, err := decodeBatch("t", 0, &heraldpb.StoredBatch{BaseOffset: 7, Records: data}, 0, pre)
		if !errors.Is(err, ErrProtocol) || len(out) != 1 || out[0].Topic != "keep" {
			t.Errorf("%s: got %d messages, %v", name, len(out), err)
		}
		if _, rerr := decodeBatchProto("t", 0, &heraldpb.StoredBatch{Records: data}, 0, nil); rerr == nil {
			t.Errorf("%s: proto.Unmarshal accepts it", name)
		}
	}
}

// FuzzDecodeBatch checks that decodeBatch never panics and agrees with the
// proto.Unmarshal-based decoder: same messages when that accepts the batch,
// an ErrProtocol error when it rejects it.
func FuzzDecodeBatch(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 4 {
		var data []byte
		for range 1 + r.IntN(3) {
			data, _ = encodeRecord(data, randMessage(r))
		}
		f.Add(data, int64(10), int64(11))
	}
	f.Fuzz(func(t *testing.T, data []byte, base, from int64) {
		sb := &heraldpb.StoredBatch{BaseOffset: base, AppendTimeMs: 1_700_000_000_000, Records: data}
		pre := []*Message{{Topic: "earlier"}}
		ref, rerr := decodeBatchProto("t", 1, sb, from, slices.Clone(pre))
		got, err := decodeBatch("t", 1, sb, from, slices.Clone(pre))
		if rerr != nil {
			if !errors.Is(err, ErrProtocol) || len(got) != 1 {
				t.Fatalf("proto.Unmarshal rejects the batch (%v), decodeBatch gives %d messages, %v", rerr, len(got), err)
			}
			return
		}
		if err != nil {
			t.Fatalf("proto.Unmarshal accepts the batch, decodeBatch fails: %v", err)
		}
		if !reflect.DeepEqual(got, ref) {
			t.Fatalf("decodeBatch differs\n got %+v\nwant %+v", got, ref)
		}
	})
}
