package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// An acknowledgement log written by the bench reads back as it was.
func TestAckLogRoundTrip(t *testing.T) {
	s := newBenchAckSet(3)
	for _, seq := range []int64{0, 1, 63, 64, 1000} {
		s.add(0, seq)
	}
	s.add(2, 5)
	path := filepath.Join(t.TempDir(), "acks.json")
	start := time.Unix(1700000000, 42)
	if err := s.write(path, "orders", start); err != nil {
		t.Fatal(err)
	}
	doc, bits, err := readAckLog(path)
	if err != nil {
		t.Fatal(err)
	}
	if doc.Topic != "orders" || doc.RunStartNs != start.UnixNano() || len(bits) != 3 || doc.Producers[0].Count != 5 || doc.Producers[1].Count != 0 {
		t.Fatalf("read back %+v, %d producers", doc, len(bits))
	}
	has := func(id int, seq int64) bool {
		w := seq / 64
		return w < int64(len(bits[id])) && bits[id][w]&(1<<(seq%64)) != 0
	}
	for _, seq := range []int64{0, 1, 63, 64, 1000} {
		if !has(0, seq) {
			t.Fatalf("producer 0 lost sequence %d", seq)
		}
	}
	if has(0, 2) || has(1, 0) || !has(2, 5) {
		t.Fatal("bits set that were not acknowledged, or lost")
	}
}

// The acknowledgement log decoder never panics, and whatever it accepts
// has one bitset per producer id.
func FuzzParseAckLog(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/acklog/*.json")
	for _, p := range seeds {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, bits, err := parseAckLog(data)
		if err != nil {
			return
		}
		if len(bits) != len(doc.Producers) {
			t.Fatalf("%d bitsets for %d producers", len(bits), len(doc.Producers))
		}
		for id := range bits {
			if bits[id] == nil {
				t.Fatalf("producer %d has no bitset", id)
			}
		}
	})
}
