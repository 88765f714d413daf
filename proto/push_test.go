package heraldpb

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
)

func TestAppendDelivery(t *testing.T) {
	rec1, _ := proto.Marshal(&Record{Key: []byte("k"), Value: []byte("v1"), Tags: []string{"a"}, Headers: []*Header{{Key: "h", Value: []byte("x")}}})
	rec2, _ := proto.Marshal(&Record{Value: []byte("v2")})
	msgs := []PushMessage{
		{Partition: 3, Offset: 1 << 40, DeliveryCount: 2, AppendTimeMs: 1700000000000, Record: rec1},
		{Partition: 0, Offset: 0, DeliveryCount: 1, Record: rec2},
		{Offset: -1, DeliveryCount: 1, Record: rec2, ReplyInbox: "netio/session$9", CorrelationID: 77},
	}
	for _, subID := range []uint64{0, 5, 1 << 60} {
		b := AppendDelivery([]byte("xx"), subID, msgs)[2:]
		if len(b) != DeliveryFrameSize(subID, msgs) {
			t.Fatalf("size %d, DeliveryFrameSize %d", len(b), DeliveryFrameSize(subID, msgs))
		}
		payload, n, err := SplitFrame(b, 1<<20)
		if err != nil || n != len(b) {
			t.Fatalf("SplitFrame: n=%d err=%v", n, err)
		}
		f, err := DecodeFrame(payload)
		if err != nil {
			t.Fatal(err)
		}
		d := f.GetDelivery()
		if f.Id != 0 || d == nil || d.SubscriptionId != subID || len(d.Messages) != 3 {
			t.Fatalf("decoded %v", f)
		}
		for i, m := range d.Messages {
			want := msgs[i]
			if m.Partition != want.Partition || m.Offset != want.Offset || m.DeliveryCount != want.DeliveryCount ||
				m.AppendTimeMs != want.AppendTimeMs || m.ReplyInbox != want.ReplyInbox || m.CorrelationId != want.CorrelationID {
				t.Fatalf("message %d: got %v want %+v", i, m, want)
			}
			enc, _ := proto.Marshal(m.Record)
			if !proto.Equal(m.Record, mustRecord(t, want.Record)) {
				t.Fatalf("message %d record %x != %x", i, enc, want.Record)
			}
		}
	}
}

func mustRecord(t *testing.T, b []byte) *Record {
	r := &Record{}
	if err := proto.Unmarshal(b, r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestAppendReplyDelivery(t *testing.T) {
	rec, _ := proto.Marshal(&Record{Value: []byte("pong"), Headers: []*Header{{Key: "a", Value: []byte("b")}}})
	for _, corr := range []uint64{0, 1, 1 << 63} {
		b := AppendReplyDelivery(nil, corr, rec)
		payload, _, err := SplitFrame(b, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		f, err := DecodeFrame(payload)
		if err != nil {
			t.Fatal(err)
		}
		r := f.GetReplyDelivery()
		if r == nil || r.CorrelationId != corr || !proto.Equal(r.Record, mustRecord(t, rec)) {
			t.Fatalf("decoded %v", f)
		}
	}
}

func TestForEachRecord(t *testing.T) {
	batch, _ := proto.Marshal(&RecordBatch{Records: []*Record{{Key: []byte("a"), Value: []byte("1")}, {Value: []byte("2")}, {Key: []byte("c")}}})
	var keys []string
	err := ForEachRecord(batch, func(i int, rec, key []byte) bool {
		if len(keys) != i {
			t.Fatalf("index %d after %d", i, len(keys))
		}
		mustRecord(t, rec)
		keys = append(keys, string(key))
		return true
	})
	if err != nil || len(keys) != 3 || keys[0] != "a" || keys[1] != "" || keys[2] != "c" {
		t.Fatalf("keys %q err %v", keys, err)
	}
	n := 0
	_ = ForEachRecord(batch, func(int, []byte, []byte) bool { n++; return n < 2 })
	if n != 2 {
		t.Fatalf("early stop visited %d", n)
	}
	if err := ForEachRecord([]byte{0x0a, 0x05, 0x01}, func(int, []byte, []byte) bool { return true }); err == nil {
		t.Fatal("truncated batch accepted")
	}
}

func TestForEachRawRecord(t *testing.T) {
	batch, _ := proto.Marshal(&RecordBatch{Records: []*Record{{Key: []byte("a"), Value: []byte("1")}, {Value: []byte("2")}}})
	var keys []string
	if err := ForEachRawRecord(batch, func(i int, rec []byte) bool {
		keys = append(keys, string(RecordKey(rec)))
		return true
	}); err != nil || len(keys) != 2 || keys[0] != "a" || keys[1] != "" {
		t.Fatalf("keys %q err %v", keys, err)
	}
	if err := ForEachRawRecord([]byte{0x0a, 0x05, 0x01}, func(int, []byte) bool { return true }); err == nil {
		t.Fatal("truncated batch accepted")
	}
}

// ForEachStoredRecord yields the records of a fetch's batches from an
// offset on (a batch that starts before it is read from its middle), and
// returns the offset after the last.
func TestForEachStoredRecord(t *testing.T) {
	batch := func(keys ...string) []byte {
		b := &RecordBatch{}
		for _, k := range keys {
			b.Records = append(b.Records, &Record{Key: []byte(k)})
		}
		out, _ := proto.Marshal(b)
		return out
	}
	batches := []*StoredBatch{{BaseOffset: 10, Count: 3, Records: batch("a", "b", "c")}, {BaseOffset: 13, Count: 2, Records: batch("d", "e")}}
	var got []string
	next := ForEachStoredRecord(batches, 12, func(off int64, rec []byte) { got = append(got, fmt.Sprintf("%d%s", off, RecordKey(rec))) })
	if next != 15 || strings.Join(got, " ") != "12c 13d 14e" {
		t.Fatalf("from 12: %v, next %d", got, next)
	}
	if next := ForEachStoredRecord(batches, 20, func(int64, []byte) { t.Fatal("a record below the start") }); next != 20 {
		t.Fatalf("from past the end: next %d", next)
	}
}

// FuzzForEachRawRecord: never panics, and on a batch ScanBatch accepts it
// yields the records ForEachRecord yields, with the same keys.
func FuzzForEachRawRecord(f *testing.F) {
	b1, _ := proto.Marshal(&RecordBatch{Records: []*Record{{Key: []byte("k"), Value: []byte("v"), Tags: []string{"t"}}, {Value: []byte("x")}}})
	f.Add(b1)
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x02, 0x0a, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		var raw [][]byte
		rawErr := ForEachRawRecord(b, func(i int, rec []byte) bool {
			if i != len(raw) {
				t.Fatalf("index %d after %d records", i, len(raw))
			}
			raw = append(raw, rec)
			_ = RecordKey(rec)
			return true
		})
		if _, err := ScanBatch(b); err != nil {
			return
		}
		if rawErr != nil {
			t.Fatalf("ScanBatch accepts what ForEachRawRecord rejects: %v", rawErr)
		}
		n := 0
		if err := ForEachRecord(b, func(i int, rec, key []byte) bool {
			if string(rec) != string(raw[i]) || string(key) != string(RecordKey(raw[i])) {
				t.Fatalf("record %d differs", i)
			}
			n++
			return true
		}); err != nil || n != len(raw) {
			t.Fatalf("ForEachRecord: %d records, %v; raw %d", n, err, len(raw))
		}
	})
}
