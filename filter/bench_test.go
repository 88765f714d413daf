package filter

import (
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
)

// benchRecord is a typical record: a handful of headers, the matched ones
// not first.
func benchRecord() *heraldpb.Record {
	return &heraldpb.Record{
		Key: []byte("order-42"),
		Headers: []*heraldpb.Header{
			{Key: "content-type", Value: []byte("application/json")},
			{Key: "trace-id", Value: []byte("4bf92f3577b34da6a3ce929d0e0e4736")},
			{Key: "region", Value: []byte("eu")},
			{Key: "amount", Value: []byte("250.75")},
			{Key: "s", Value: []byte("abc")},
			{Key: "flag", Value: []byte("true")},
		},
		Tags: []string{"orders", "paid"},
	}
}

func BenchmarkMatch(b *testing.B) {
	f, err := ParseSQL("region = 'eu' AND amount > 100")
	if err != nil {
		b.Fatal(err)
	}
	r := FromProto(benchRecord())
	b.ReportAllocs()
	for b.Loop() {
		if !f.Match(r) {
			b.Fatal("no match")
		}
	}
}

func BenchmarkMatchTags(b *testing.B) {
	f, err := ParseTags("refunds || paid")
	if err != nil {
		b.Fatal(err)
	}
	r := FromProto(benchRecord())
	b.ReportAllocs()
	for b.Loop() {
		if !f.Match(r) {
			b.Fatal("no match")
		}
	}
}

func BenchmarkParseSQL(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseSQL("region = 'eu' AND amount > 100"); err != nil {
			b.Fatal(err)
		}
	}
}
