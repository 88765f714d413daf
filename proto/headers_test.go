package heraldpb

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"
)

func TestAppendBatchHeaders(t *testing.T) {
	in := &RecordBatch{Records: []*Record{
		{Key: []byte("k"), Value: []byte("v1"), Headers: []*Header{{Key: "a", Value: []byte("1")}}, Tags: []string{"t"}, Priority: 3},
		{Value: []byte("v2")},
	}}
	b, _ := proto.Marshal(in)
	out, err := AppendBatchHeaders(b, [2]string{"herald-schedule-id", "42"}, [2]string{"x", ""})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ScanBatch(out); err != nil {
		t.Fatalf("result does not scan: %v", err)
	}
	var got RecordBatch
	if err := proto.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Records) != 2 {
		t.Fatalf("records = %d", len(got.Records))
	}
	r0 := got.Records[0]
	if string(r0.Key) != "k" || string(r0.Value) != "v1" || r0.Priority != 3 || len(r0.Tags) != 1 || len(r0.Headers) != 3 ||
		r0.Headers[0].Key != "a" || r0.Headers[1].Key != "herald-schedule-id" || string(r0.Headers[1].Value) != "42" || r0.Headers[2].Key != "x" {
		t.Fatalf("record 0 = %v", r0)
	}
	if len(got.Records[1].Headers) != 2 {
		t.Fatalf("record 1 = %v", got.Records[1])
	}
	var raw [][]byte
	_ = ForEachRawRecord(out, func(_ int, rec []byte) bool { raw = append(raw, rec); return true })
	if v, ok := RecordHeader(raw[1], "herald-schedule-id"); !ok || !bytes.Equal(v, []byte("42")) {
		t.Fatalf("RecordHeader = %q %v", v, ok)
	}
	if _, ok := RecordHeader(raw[1], "missing"); ok {
		t.Fatal("found a missing header")
	}
	if _, err := AppendBatchHeaders([]byte{0x0a, 0x05, 1}, [2]string{"a", "b"}); err == nil {
		t.Fatal("truncated batch accepted")
	}
}

// FuzzAppendBatchHeaders: any input either errors or yields a batch with
// the same records, each carrying the header.
func FuzzAppendBatchHeaders(f *testing.F) {
	b, _ := proto.Marshal(&RecordBatch{Records: []*Record{{Key: []byte("k"), Value: []byte("v")}}})
	f.Add(b)
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = RecordHeader(b, "k")
		if v, err := RecordValue(b); err == nil {
			var r Record
			if proto.Unmarshal(b, &r) == nil && !bytes.Equal(v, r.Value) {
				t.Fatalf("RecordValue %q, Unmarshal %q", v, r.Value)
			}
		}
		info, err := ScanBatch(b)
		out, aerr := AppendBatchHeaders(b, [2]string{"herald-schedule-id", "7"})
		if err != nil {
			return // invalid input: an error or a copy, never a panic
		}
		if aerr != nil {
			t.Fatalf("valid batch refused: %v", aerr)
		}
		info2, err := ScanBatch(out)
		if err != nil || info2.Count != info.Count {
			t.Fatalf("scan after append: %v, %d vs %d", err, info2.Count, info.Count)
		}
		_ = ForEachRawRecord(out, func(_ int, rec []byte) bool {
			if v, ok := RecordHeader(rec, "herald-schedule-id"); !ok || string(v) != "7" {
				t.Fatalf("header missing from %x", rec)
			}
			return true
		})
	})
}
