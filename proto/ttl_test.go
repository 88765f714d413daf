package heraldpb

import (
	"testing"

	"google.golang.org/protobuf/proto"
)

func TestRecordTTL(t *testing.T) {
	for _, tc := range []struct {
		rec  *Record
		want int64
	}{
		{&Record{}, 0},
		{&Record{Key: []byte("k"), Value: []byte("v")}, 0},
		{&Record{Key: []byte("k"), Value: make([]byte, 300), Headers: []*Header{{Key: "h", Value: []byte("x")}}, TtlMs: 30000, Priority: 3, Tags: []string{"a"}}, 30000},
		{&Record{TtlMs: 1}, 1},
	} {
		b, err := proto.Marshal(tc.rec)
		if err != nil {
			t.Fatal(err)
		}
		if got := RecordTTL(b); got != tc.want {
			t.Errorf("RecordTTL(%v) = %d, want %d", tc.rec, got, tc.want)
		}
	}
	if got := RecordTTL([]byte{0x38}); got != 0 { // field 7 with its varint missing
		t.Errorf("truncated: %d", got)
	}
}

// FuzzRecordTTL: RecordTTL never panics, and on a record that unmarshals it
// agrees with proto.Unmarshal (0 for a negative ttl_ms).
func FuzzRecordTTL(f *testing.F) {
	b, _ := proto.Marshal(&Record{Key: []byte("k"), TtlMs: 5000})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		got := RecordTTL(b)
		var r Record
		if proto.Unmarshal(b, &r) == nil && got != max(r.TtlMs, 0) {
			t.Fatalf("RecordTTL %d, Unmarshal %d", got, r.TtlMs)
		}
	})
}
