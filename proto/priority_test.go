package heraldpb

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

func TestRecordPriority(t *testing.T) {
	for _, tc := range []struct {
		rec  *Record
		want uint8
	}{
		{&Record{}, 0},
		{&Record{Key: []byte("k"), Value: []byte("v")}, 0},
		{&Record{Key: []byte("k"), Value: make([]byte, 300), Headers: []*Header{{Key: "h", Value: []byte("x")}}, TtlMs: 30000, Priority: 7, Tags: []string{"a"}}, 7},
		{&Record{Priority: 1}, 1},
		{&Record{Priority: MaxPriority}, MaxPriority},
		{&Record{Priority: MaxPriority + 1}, 0}, // ScanBatch refuses it
		{&Record{Priority: 1 << 31}, 0},
	} {
		b, err := proto.Marshal(tc.rec)
		if err != nil {
			t.Fatal(err)
		}
		if got := RecordPriority(b); got != tc.want {
			t.Errorf("RecordPriority(%v) = %d, want %d", tc.rec, got, tc.want)
		}
	}
	twice := protowire.AppendVarint(protowire.AppendTag(nil, 6, protowire.VarintType), 2)
	twice = protowire.AppendVarint(protowire.AppendTag(twice, 6, protowire.VarintType), 5)
	for name, tc := range map[string]struct {
		rec  []byte
		want uint8
	}{
		"last wins":        {twice, 5},
		"varint missing":   {[]byte{0x30}, 0},
		"varint truncated": {[]byte{0x30, 0x85}, 0},
		"bad tag":          {[]byte{0x30, 0x05, 0xff}, 0},
		"wrong wire type":  {[]byte{0x32, 0x01, 0x05}, 0}, // field 6 as bytes: skipped
		"value cut":        {[]byte{0x30, 0x05, 0x12, 0x09, 'v'}, 0},
	} {
		if got := RecordPriority(tc.rec); got != tc.want {
			t.Errorf("%s: RecordPriority(%x) = %d, want %d", name, tc.rec, got, tc.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { RecordPriority(twice) }); n != 0 {
		t.Errorf("RecordPriority allocates %v times", n)
	}
}

// FuzzRecordPriority: RecordPriority never panics and never returns more
// than MaxPriority; on a record that the log's record scan (ScanBatch)
// accepts and proto.Unmarshal decodes, it agrees with Unmarshal.
func FuzzRecordPriority(f *testing.F) {
	b, _ := proto.Marshal(&Record{Key: []byte("k"), Priority: 9})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		got := RecordPriority(b)
		if got > MaxPriority {
			t.Fatalf("RecordPriority %d > %d", got, MaxPriority)
		}
		var r Record
		_, _, scanned, err := scanRecord(b)
		if err == nil && scanned != got {
			t.Fatalf("RecordPriority %d, scanRecord %d", got, scanned)
		}
		if err == nil && proto.Unmarshal(b, &r) == nil && uint32(got) != r.Priority {
			t.Fatalf("RecordPriority %d, Unmarshal %d", got, r.Priority)
		}
	})
}
