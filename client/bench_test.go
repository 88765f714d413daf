package client

import (
	"fmt"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
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
		m := &Message{Topic: "bench", Partition: 0, Value: v}
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
