package heraldpb

import (
	"errors"
	"math"
	"reflect"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
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
	if !sameHeader(h, want) || string(recs) != "\x01\x02" {
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
		{BaseOffset: 9, TxnEpoch: 7, Fencer: Fencer_FENCER_SCHEDULER},
		{BaseOffset: 9, Count: 2, TxnEpoch: 7, Fencer: Fencer_FENCER_SCHEDULER, Records: []byte{7}},
		{TxnCount: 3, ProducerId: 7, ProducerEpoch: 2, BaseSequence: 0, Records: []byte{6}},
		{BaseOffset: 20, Count: 5, ProducerId: 7, ProducerEpoch: 2, TxnMarker: TxnMarker_TXN_MARKER_COMMIT, TxnRefs: []uint64{3, 1 << 40}},
		{ProducerId: 7, ProducerEpoch: 3, TxnMarker: TxnMarker_TXN_MARKER_ABORT},
		multiMarker(),
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
		if h.TxnCount == math.MaxUint32 {
			e.TxnCount = math.MaxUint32
		}
		if h.ProducerEpoch == math.MaxUint32 {
			e.ProducerEpoch = math.MaxUint32
		}
		if h.SessionFence == math.MaxUint32 {
			e.SessionFence = math.MaxUint32
		}
		got := LogEntryHeader{BaseOffset: e.BaseOffset, Count: e.Count, AppendTimeMs: e.AppendTimeMs, MaxTimestampMs: e.MaxTimestampMs,
			MaxPriority: e.MaxPriority, ProducerID: e.ProducerId, BaseSequence: e.BaseSequence, NotBeforeMs: e.NotBeforeMs, HoldUs: e.HoldUs, TxnEpoch: e.TxnEpoch, TxnEpochResetFrom: e.TxnEpochResetFrom, TxnEpochResetIndex: e.TxnEpochResetIndex,
			Fencer: e.Fencer, TxnCount: e.TxnCount, ProducerEpoch: e.ProducerEpoch, TxnMarker: e.TxnMarker, RefCount: len(e.TxnRefs), SessionFence: e.SessionFence, TxnCommitInline: e.TxnCommitInline}
		for _, m := range e.TxnMarkers {
			got.More = append(got.More, MarkerItem{ProducerID: m.ProducerId, ProducerEpoch: m.ProducerEpoch, Marker: m.Marker, Count: m.Count, Refs: int(m.Refs)})
		}
		var count uint64
		refs := 0
		for _, m := range h.Markers() {
			count += uint64(m.Count)
			refs += m.Refs
		}
		if h.TxnMarker != TxnMarker_TXN_MARKER_NONE && (count != uint64(h.Count) || refs != h.RefCount) {
			t.Fatalf("markers %+v count %d records and %d refs, the entry %d and %d", h.Markers(), count, refs, h.Count, h.RefCount)
		}
		if !sameHeader(h, got) || string(recs) != string(e.Records) || !slices.Equal(h.AppendRefs(nil), e.TxnRefs) {
			t.Fatalf("ScanLogEntry %+v, Unmarshal %+v (refs %v)", h, got, e.TxnRefs)
		}
	})
}

// sameHeader compares two headers but for their packed refs (compared
// through AppendRefs where they matter).
func sameHeader(a, b LogEntryHeader) bool {
	a.Refs, b.Refs = nil, nil
	return reflect.DeepEqual(a, b)
}

// Transactional entries: a batch holds no offset, a commit marker covers
// its batches' records and names their entries, an abort marker has
// neither; inconsistent combinations are refused.
func TestScanLogEntryTxn(t *testing.T) {
	scan := func(e *LogEntry) (LogEntryHeader, []byte, error) {
		t.Helper()
		b, err := proto.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		return ScanLogEntry(b)
	}
	h, recs, err := scan(&LogEntry{TxnCount: 3, ProducerId: 7, ProducerEpoch: 2, BaseSequence: 4, Records: []byte{9}})
	if err != nil || !h.TxnBatch() || h.Count != 0 || h.TxnCount != 3 || h.ProducerEpoch != 2 || string(recs) != "\x09" || h.Fence() {
		t.Fatalf("batch scanned as %+v %v %v", h, recs, err)
	}
	refs := []uint64{5, 300, 1 << 40}
	h, recs, err = scan(&LogEntry{BaseOffset: 10, Count: 9, ProducerId: 7, ProducerEpoch: 2, TxnMarker: TxnMarker_TXN_MARKER_COMMIT, TxnRefs: refs})
	if err != nil || h.TxnBatch() || h.TxnMarker != TxnMarker_TXN_MARKER_COMMIT || h.RefCount != 3 || !slices.Equal(h.AppendRefs(nil), refs) || len(recs) != 0 {
		t.Fatalf("commit marker scanned as %+v %v %v", h, recs, err)
	}
	if h, _, err = scan(&LogEntry{ProducerId: 7, ProducerEpoch: 3, TxnMarker: TxnMarker_TXN_MARKER_ABORT}); err != nil || h.TxnMarker != TxnMarker_TXN_MARKER_ABORT || h.Fence() {
		t.Fatalf("abort marker scanned as %+v %v", h, err)
	}
	if h, _, err = scan(&LogEntry{BaseOffset: 12, ProducerId: 7, SessionFence: 40}); err != nil || h.SessionFence != 40 || h.ProducerID != 7 || h.TxnBatch() || h.Fence() || h.Count != 0 {
		t.Fatalf("session fence scanned as %+v %v", h, err)
	}
	if h, recs, err = scan(&LogEntry{BaseOffset: 12, Count: 2, ProducerId: 7, ProducerEpoch: 3, TxnCommitInline: true, Records: []byte{9}}); err != nil || !h.TxnCommitInline || h.TxnBatch() ||
		h.TxnMarker != TxnMarker_TXN_MARKER_NONE || h.Count != 2 || h.ProducerEpoch != 3 || string(recs) != "\x09" {
		t.Fatalf("a transaction committed inline scanned as %+v %v %v", h, recs, err)
	}
	// Several transactions' ends in one entry: the first from the entry's
	// fields, the rest after it, each with its share of records and refs.
	h, _, err = scan(multiMarker())
	want := []MarkerItem{{ProducerID: 7, ProducerEpoch: 2, Marker: TxnMarker_TXN_MARKER_COMMIT, Count: 3, Refs: 1},
		{ProducerID: 8, ProducerEpoch: 5, Marker: TxnMarker_TXN_MARKER_ABORT},
		{ProducerID: 9, ProducerEpoch: 1, Marker: TxnMarker_TXN_MARKER_COMMIT, Count: 4, Refs: 2}}
	if err != nil || !reflect.DeepEqual(h.Markers(), want) {
		t.Fatalf("several markers scanned as %+v, %v", h.Markers(), err)
	}
	more := func(m ...*TxnMarkerItem) *LogEntry {
		e := multiMarker()
		e.TxnMarkers = m
		return e
	}
	for name, e := range map[string]*LogEntry{
		"more markers than records": more(&TxnMarkerItem{ProducerId: 8, Marker: TxnMarker_TXN_MARKER_COMMIT, Count: 8, Refs: 1}),
		"more markers than refs":    more(&TxnMarkerItem{ProducerId: 8, Marker: TxnMarker_TXN_MARKER_COMMIT, Count: 2, Refs: 4}),
		"a first abort with records": func() *LogEntry {
			e := more(&TxnMarkerItem{ProducerId: 8, Marker: TxnMarker_TXN_MARKER_COMMIT, Count: 3, Refs: 1})
			e.TxnMarker = TxnMarker_TXN_MARKER_ABORT
			return e
		}(),
		"a later abort with records":  more(&TxnMarkerItem{ProducerId: 8, Marker: TxnMarker_TXN_MARKER_ABORT, Count: 1, Refs: 1}),
		"a later marker, no producer": more(&TxnMarkerItem{Marker: TxnMarker_TXN_MARKER_ABORT}),
		"a later unknown marker":      more(&TxnMarkerItem{ProducerId: 8}),
		"a later commit without refs": more(&TxnMarkerItem{ProducerId: 8, Marker: TxnMarker_TXN_MARKER_COMMIT, Count: 2}),
		"more markers, no marker":     {ProducerId: 7, Count: 1, TxnMarkers: []*TxnMarkerItem{{ProducerId: 8, Marker: TxnMarker_TXN_MARKER_ABORT}}, Records: []byte{1}},
	} {
		if h, _, err := scan(e); !errors.Is(err, ErrBadLogEntry) {
			t.Errorf("%s: scanned as %+v, %v", name, h.Markers(), err)
		}
	}
	for name, e := range map[string]*LogEntry{
		"a batch with an offset":       {TxnCount: 3, Count: 3, ProducerId: 7, Records: []byte{1}},
		"a batch that is a marker":     {TxnCount: 3, ProducerId: 7, TxnMarker: TxnMarker_TXN_MARKER_COMMIT, Records: []byte{1}},
		"a marker with records":        {ProducerId: 7, TxnMarker: TxnMarker_TXN_MARKER_ABORT, Records: []byte{1}},
		"a marker without producer":    {TxnMarker: TxnMarker_TXN_MARKER_ABORT},
		"refs on an abort":             {ProducerId: 7, Count: 1, TxnMarker: TxnMarker_TXN_MARKER_ABORT, TxnRefs: []uint64{1}},
		"refs without count":           {ProducerId: 7, TxnMarker: TxnMarker_TXN_MARKER_COMMIT, TxnRefs: []uint64{1}},
		"refs on a plain entry":        {ProducerId: 7, Count: 1, TxnRefs: []uint64{1}},
		"a commit of records, no refs": {ProducerId: 7, Count: 2, TxnMarker: TxnMarker_TXN_MARKER_COMMIT},
		"an unknown marker":            {ProducerId: 7, TxnMarker: 3},
		"an unknown fencer":            {TxnEpoch: 3, Fencer: NumFencers},
		"a negative fencer":            {TxnEpoch: 3, Fencer: -1},
		"a session fence, no producer": {SessionFence: 4},
		"a session fence with records": {ProducerId: 7, SessionFence: 4, Records: []byte{1}},
		"a session fence with a count": {ProducerId: 7, SessionFence: 4, Count: 1},
		"a session fence that ends":    {ProducerId: 7, SessionFence: 4, TxnMarker: TxnMarker_TXN_MARKER_ABORT},
		"a session fence, epoch fence": {ProducerId: 7, SessionFence: 4, TxnEpoch: 2},
		"inline, no producer":          {Count: 1, TxnCommitInline: true, Records: []byte{1}},
		"inline, no records":           {ProducerId: 7, Count: 1, TxnCommitInline: true},
		"inline, no count":             {ProducerId: 7, TxnCommitInline: true, Records: []byte{1}},
		"inline and a batch":           {ProducerId: 7, TxnCount: 1, TxnCommitInline: true, Records: []byte{1}},
		"inline and a marker":          {ProducerId: 7, Count: 1, TxnCommitInline: true, TxnMarker: TxnMarker_TXN_MARKER_COMMIT, TxnRefs: []uint64{1}},
		"inline and a fence":           {ProducerId: 7, Count: 1, TxnCommitInline: true, Records: []byte{1}, SessionFence: 2},
	} {
		if h, _, err := scan(e); !errors.Is(err, ErrBadLogEntry) {
			t.Errorf("%s: scanned as %+v, %v", name, h, err)
		}
	}
	// Unpacked refs, and a truncated packed one.
	b := protowire.AppendTag(nil, 17, protowire.VarintType)
	b = protowire.AppendVarint(b, 5)
	if _, _, err := ScanLogEntry(b); !errors.Is(err, ErrBadLogEntry) {
		t.Errorf("unpacked refs: %v", err)
	}
	b = protowire.AppendTag(nil, 17, protowire.BytesType)
	b = protowire.AppendBytes(b, []byte{0x80})
	if _, _, err := ScanLogEntry(b); !errors.Is(err, ErrBadLogEntry) {
		t.Errorf("truncated ref: %v", err)
	}
}

// multiMarker is a marker entry of three transactions' ends: a commit of
// 3 records in one batch, an abort, a commit of 4 records in two.
func multiMarker() *LogEntry {
	return &LogEntry{BaseOffset: 30, Count: 7, ProducerId: 7, ProducerEpoch: 2, TxnMarker: TxnMarker_TXN_MARKER_COMMIT, TxnRefs: []uint64{4, 9, 11},
		TxnMarkers: []*TxnMarkerItem{
			{ProducerId: 8, ProducerEpoch: 5, Marker: TxnMarker_TXN_MARKER_ABORT},
			{ProducerId: 9, ProducerEpoch: 1, Marker: TxnMarker_TXN_MARKER_COMMIT, Count: 4, Refs: 2},
		}}
}
