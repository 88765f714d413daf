package client

import (
	"fmt"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/encoding/protowire"
)

// benchRecords is the number of records per benchmarked batch.
const benchRecords = 1000

type benchCase struct {
	name  string
	size  int  // value bytes
	extra bool // key, two headers, a tag and a timestamp
}

var benchCases = []benchCase{
	{"100B", 100, false},
	{"100B-keyhdr", 100, true},
	{"1KiB", 1024, false},
	{"1KiB-keyhdr", 1024, true},
}

func benchMessages(c benchCase) []*Message {
	ms := make([]*Message, benchRecords)
	for i := range ms {
		v := make([]byte, c.size)
		for j := range v {
			v[j] = byte('a' + (i+j)%26)
		}
		m := &Message{Topic: "bench", Value: v}
		if c.extra {
			m.Key = []byte(fmt.Sprintf("key-%06d", i))
			m.Headers = []Header{{Key: "trace-id", Value: []byte("0123456789abcdef")}, {Key: "source", Value: []byte("bench")}}
			m.Tags = []string{"bench"}
			m.Timestamp = time.UnixMilli(1_700_000_000_000 + int64(i))
		}
		ms[i] = m
	}
	return ms
}

func payloadBytes(ms []*Message) int64 {
	var n int64
	for _, m := range ms {
		n += int64(len(m.Key) + len(m.Value))
	}
	return n
}

func encodeAll(dst []byte, ms []*Message) ([]byte, error) {
	var err error
	for _, m := range ms {
		if dst, err = encodeRecord(dst, m); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// BenchmarkEncodeBatch encodes benchRecords messages into one RecordBatch,
// into a new buffer each time as the producer does for each batch.
func BenchmarkEncodeBatch(b *testing.B) {
	for _, c := range benchCases {
		b.Run(c.name, func(b *testing.B) {
			ms := benchMessages(c)
			b.SetBytes(payloadBytes(ms))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := encodeAll(nil, ms); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeBatch decodes a stored batch of benchRecords records.
func BenchmarkDecodeBatch(b *testing.B) {
	for _, c := range benchCases {
		b.Run(c.name, func(b *testing.B) {
			ms := benchMessages(c)
			data, err := encodeAll(nil, ms)
			if err != nil {
				b.Fatal(err)
			}
			sb := &heraldpb.StoredBatch{BaseOffset: 1000, Count: benchRecords, AppendTimeMs: 1_700_000_000_000, Records: data}
			b.SetBytes(payloadBytes(ms))
			b.ReportAllocs()
			var out []*Message
			for b.Loop() {
				out, err = decodeBatch("bench", 0, sb, 0, out[:0])
				if err != nil || len(out) != benchRecords {
					b.Fatal(len(out), err)
				}
			}
		})
	}
}

// BenchmarkDecodeDelivery decodes a pushed Delivery frame of 256 messages
// with 100-byte values, as the broker encodes it (heraldpb.AppendDelivery),
// into Delivered values: "proto" is the generic path (heraldpb.DecodeFrame
// and deliveredFromProto, what every push took before decodeDelivery),
// "protowire" the one the reader takes (deliveryBody and decodeDelivery).
func BenchmarkDecodeDelivery(b *testing.B) {
	const n, size = 256, 100
	msgs := make([]heraldpb.PushMessage, n)
	for i := range msgs {
		v := make([]byte, size)
		for j := range v {
			v[j] = byte('a' + (i+j)%26)
		}
		elem, err := encodeRecord(nil, &Message{Value: v})
		if err != nil {
			b.Fatal(err)
		}
		rec, _ := protowire.ConsumeBytes(elem[1:]) // the Record inside the RecordBatch element
		msgs[i] = heraldpb.PushMessage{Partition: uint32(i % 4), Offset: 1_000_000 + int64(i), DeliveryCount: 1,
			AppendTimeMs: 1_700_000_000_000 + int64(i/16), Record: rec}
	}
	payload := heraldpb.AppendDelivery(nil, 7, msgs)[heraldpb.HeaderLen:]
	b.Run("proto", func(b *testing.B) {
		b.SetBytes(n * size)
		b.ReportAllocs()
		for b.Loop() {
			f, err := heraldpb.DecodeFrame(payload)
			if err != nil {
				b.Fatal(err)
			}
			if ds := deliveredFromProto(f.GetDelivery().GetMessages()); len(ds) != n {
				b.Fatal(len(ds))
			}
		}
	})
	b.Run("protowire", func(b *testing.B) {
		b.SetBytes(n * size)
		b.ReportAllocs()
		for b.Loop() {
			body, ok := deliveryBody(payload)
			if !ok {
				b.Fatal("not a delivery")
			}
			_, ds, err := decodeDelivery(body)
			if err != nil || len(ds) != n {
				b.Fatal(len(ds), err)
			}
		}
	})
}
