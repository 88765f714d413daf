package heraldpb

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
)

func encodeValues(t testing.TB, n int) []byte {
	t.Helper()
	rb := &RecordBatch{}
	for i := 0; i < n; i++ {
		rb.Records = append(rb.Records, &Record{Key: []byte(fmt.Sprint("k", i)), Value: []byte(fmt.Sprint("v", i)), TimestampMs: int64(i + 1)})
	}
	raw, err := proto.Marshal(rb)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func values(t testing.TB, b []byte) []string {
	t.Helper()
	var rb RecordBatch
	if err := proto.Unmarshal(b, &rb); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rb.Records {
		out = append(out, string(r.Value))
	}
	return out
}

func TestSliceBatch(t *testing.T) {
	b := encodeValues(t, 5)
	cases := []struct {
		from, n int
		want    string
	}{
		{0, 5, "[v0 v1 v2 v3 v4]"}, {0, 9, "[v0 v1 v2 v3 v4]"}, {1, 2, "[v1 v2]"},
		{4, 1, "[v4]"}, {4, 3, "[v4]"}, {5, 1, "[]"}, {2, 0, "[]"},
	}
	for _, c := range cases {
		got, total, err := SliceBatch(b, c.from, c.n)
		if err != nil || total != 5 {
			t.Fatalf("[%d,+%d): total %d, err %v", c.from, c.n, total, err)
		}
		if s := fmt.Sprint(values(t, got)); s != c.want {
			t.Fatalf("[%d,+%d) = %s, want %s", c.from, c.n, s, c.want)
		}
	}
	// The whole batch comes back without a copy.
	if got, _, _ := SliceBatch(b, 0, 5); &got[0] != &b[0] {
		t.Fatal("whole-batch slice copied")
	}
	// A slice is itself a valid batch for ScanBatch.
	sub, _, _ := SliceBatch(b, 1, 3)
	if info, err := ScanBatch(sub); err != nil || info.Count != 3 || info.MinTimestamp != 2 {
		t.Fatalf("ScanBatch of a slice: %+v %v", info, err)
	}
	// Interleaved unknown fields are dropped, records kept in order.
	odd := append(append([]byte{}, b...), 0x10, 0x07) // field 2 varint
	odd = append(odd, encodeValues(t, 1)...)          // one more record "v0"
	got, total, err := SliceBatch(odd, 4, 2)
	if err != nil || total != 6 || fmt.Sprint(values(t, got)) != "[v4 v0]" {
		t.Fatalf("interleaved: %v %d %v", values(t, got), total, err)
	}
	if _, _, err := SliceBatch([]byte{0x0a, 0x05, 0x01}, 0, 1); !errors.Is(err, ErrBadBatch) {
		t.Fatalf("truncated batch: %v", err)
	}
	if _, _, err := SliceBatch(b, -1, 1); !errors.Is(err, ErrBadBatch) {
		t.Fatalf("negative from: %v", err)
	}
}

// FuzzSliceBatch: SliceBatch never panics; on any batch proto.Unmarshal
// accepts, the slice holds exactly records [from, from+n) in order.
func FuzzSliceBatch(f *testing.F) {
	f.Add(encodeValues(f, 3), 1, 1)
	f.Add(encodeValues(f, 0), 0, 1)
	f.Add([]byte{0x0a, 0x00, 0x10, 0x01, 0x0a, 0x00}, 1, 5)
	f.Fuzz(func(t *testing.T, b []byte, from, n int) {
		from, n = from%64, n%64
		got, total, err := SliceBatch(b, from, n)
		var rb RecordBatch
		if proto.Unmarshal(b, &rb) != nil || err != nil || from < 0 || n < 0 {
			return
		}
		if total != len(rb.Records) {
			t.Fatalf("total %d, proto says %d", total, len(rb.Records))
		}
		var sub RecordBatch
		if err := proto.Unmarshal(got, &sub); err != nil {
			t.Fatalf("slice does not decode: %v", err)
		}
		lo, hi := min(from, total), min(from+n, total)
		if len(sub.Records) != hi-lo {
			t.Fatalf("slice has %d records, want %d", len(sub.Records), hi-lo)
		}
		for i, r := range sub.Records {
			if !proto.Equal(r, rb.Records[lo+i]) {
				t.Fatalf("record %d differs", lo+i)
			}
		}
	})
}
