package heraldpb

import (
	"math"
	"testing"

	"google.golang.org/protobuf/proto"
)

func TestScanLogEntryProducer(t *testing.T) {
	data, err := proto.Marshal(&LogEntry{BaseOffset: 7, Count: 3, AppendTimeMs: 11, MaxTimestampMs: 12, Records: []byte{1, 2},
		MaxPriority: 4, ProducerId: 1 << 63, BaseSequence: 1<<40 + 5, NotBeforeMs: 1_800_000_000_123, HoldUs: 47_000, TxnEpoch: 1<<33 + 1})
	if err != nil {
		t.Fatal(err)
	}
	h, recs, err := ScanLogEntry(data)
	if err != nil {
		t.Fatal(err)
	}
	want := LogEntryHeader{BaseOffset: 7, Count: 3, AppendTimeMs: 11, MaxTimestampMs: 12, MaxPriority: 4, ProducerID: 1 << 63, BaseSequence: 1<<40 + 5,
		NotBeforeMs: 1_800_000_000_123, HoldUs: 47_000, TxnEpoch: 1<<33 + 1}
	if h != want || string(recs) != "\x01\x02" {
		t.Fatalf("scanned %+v %v, want %+v", h, recs, want)
	}
	if h.Fence() {
		t.Fatal("an entry with records is not a fence")
	}
	data, _ = proto.Marshal(&LogEntry{BaseOffset: 9, TxnEpoch: 4, TxnEpochResetFrom: 12})
	if h, recs, err = ScanLogEntry(data); err != nil || !h.Fence() || h.TxnEpoch != 4 || h.TxnEpochResetFrom != 12 || h.BaseOffset != 9 || len(recs) != 0 {
		t.Fatalf("fence scanned as %+v %v %v", h, recs, err)
	}
}

// FuzzScanLogEntry: ScanLogEntry never panics, and whatever it accepts that
// proto.Unmarshal accepts too has the same header fields, except that a
// max_priority or hold_us beyond 32 bits is clamped where protobuf
// truncates it (testdata/fuzz/FuzzScanLogEntry).
func FuzzScanLogEntry(f *testing.F) {
	for _, e := range []*LogEntry{
		{BaseOffset: 7, Count: 3, Records: []byte{1}},
		{BaseOffset: 100, Count: 1, ProducerId: 42, BaseSequence: 9, MaxPriority: 2},
		{BaseOffset: 5, Count: 2, NotBeforeMs: 1_800_000_000_000, Records: []byte{3}},
		{BaseOffset: 6, Count: 1, NotBeforeMs: 1_800_000_000_050, HoldUs: 50_000, Records: []byte{4}},
		{BaseOffset: 8, Count: 1, ProducerId: 3, TxnEpoch: 12, Records: []byte{5}},
		{BaseOffset: 8, TxnEpoch: 13},
		{BaseOffset: 8, TxnEpoch: 2, TxnEpochResetFrom: 13, TxnEpochResetIndex: 40},
		{},
	} {
		b, _ := proto.Marshal(e)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, recs, err := ScanLogEntry(b)
		if err != nil {
			return
		}
		var e LogEntry
		if proto.Unmarshal(b, &e) != nil {
			return
		}
		if h.MaxPriority == math.MaxUint32 {
			e.MaxPriority = math.MaxUint32
		}
		if h.HoldUs == math.MaxUint32 {
			e.HoldUs = math.MaxUint32
		}
		got := LogEntryHeader{BaseOffset: e.BaseOffset, Count: e.Count, AppendTimeMs: e.AppendTimeMs, MaxTimestampMs: e.MaxTimestampMs,
			MaxPriority: e.MaxPriority, ProducerID: e.ProducerId, BaseSequence: e.BaseSequence, NotBeforeMs: e.NotBeforeMs, HoldUs: e.HoldUs, TxnEpoch: e.TxnEpoch, TxnEpochResetFrom: e.TxnEpochResetFrom, TxnEpochResetIndex: e.TxnEpochResetIndex}
		if h != got || string(recs) != string(e.Records) {
			t.Fatalf("ScanLogEntry %+v, Unmarshal %+v", h, got)
		}
	})
}
