package partition

import (
	"encoding/binary"
	"hash/crc32"
	"slices"
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
)

func TestCheckSequence(t *testing.T) {
	tab := newProducerTable(10)
	for i := int64(0); i < 7; i++ { // batches of 3 records: seq 0, 3, ..., 18 at offsets 100, 110, ...
		tab.record(1, seqBatch{seq: 3 * i, count: 3, offset: 100 + 10*i})
	}
	inflight := []inflightSeq{{seq: 21, count: 2, offset: 170, term: 4}, {seq: 23, count: 5, offset: 172, term: 4}}
	cases := []struct {
		name      string
		committed *producerEntry
		inflight  []inflightSeq
		seq       int64
		count     uint32
		want      seqVerdict
		offset    int64 // of the match
		expected  int64 // for out of order
	}{
		{"unknown producer starts anywhere", nil, nil, 1000, 4, seqAppend, 0, 0},
		{"next after the committed", tab.get(1), nil, 21, 1, seqAppend, 0, 0},
		{"next after the in-flight", tab.get(1), inflight, 28, 1, seqAppend, 0, 0},
		{"retry of the last committed", tab.get(1), nil, 18, 3, seqDuplicate, 160, 0},
		{"retry of the oldest remembered", tab.get(1), nil, 6, 3, seqDuplicate, 120, 0},
		{"retry older than the remembered ones", tab.get(1), nil, 3, 3, seqOutOfOrder, 0, 21},
		{"retry of an in-flight batch", tab.get(1), inflight, 23, 5, seqInFlight, 172, 0},
		{"retry of an in-flight batch, producer unknown", nil, inflight, 21, 2, seqInFlight, 170, 0},
		{"gap", tab.get(1), nil, 22, 1, seqOutOfOrder, 0, 21},
		{"gap after the in-flight", tab.get(1), inflight, 21, 7, seqOutOfOrder, 0, 28},
		{"same start, other length", tab.get(1), nil, 18, 2, seqOutOfOrder, 0, 21},
		{"overlap", tab.get(1), nil, 19, 2, seqOutOfOrder, 0, 21},
	}
	for _, c := range cases {
		v, m, exp := checkSequence(c.committed, c.inflight, c.seq, c.count)
		if v != c.want || (v == seqDuplicate || v == seqInFlight) && m.offset != c.offset || v == seqOutOfOrder && exp != c.expected {
			t.Errorf("%s: verdict %d match %+v expected %d; want %d offset %d expected %d", c.name, v, m, exp, c.want, c.offset, c.expected)
		}
	}
}

func tableIDs(t *producerTable) []uint64 {
	var ids []uint64
	for e := t.head; e != nil; e = e.next {
		ids = append(ids, e.id)
	}
	return ids
}

func TestProducerTableEvictsLeastRecentlyWritten(t *testing.T) {
	tab := newProducerTable(3)
	for _, id := range []uint64{1, 2, 3} {
		tab.record(id, seqBatch{seq: 0, count: 1, offset: int64(id)})
	}
	tab.record(1, seqBatch{seq: 1, count: 1, offset: 10}) // 1 is now the most recent
	_ = tab.get(2)                                        // a lookup does not count
	tab.record(4, seqBatch{seq: 0, count: 1, offset: 11}) // evicts 2
	if got := tableIDs(tab); !slices.Equal(got, []uint64{4, 1, 3}) || tab.len() != 3 || tab.evictions != 1 {
		t.Fatalf("table %v (len %d, %d evictions), want [4 1 3] after one eviction", got, tab.len(), tab.evictions)
	}
	if tab.get(2) != nil {
		t.Fatal("producer 2 still known after its eviction")
	}
	// Only the last ProducerBatches batches are kept.
	for i := int64(2); i < 10; i++ {
		tab.record(1, seqBatch{seq: i, count: 1, offset: 10 + i})
	}
	e := tab.get(1)
	if e.n != ProducerBatches || e.batches[0].seq != 10-ProducerBatches || e.last().seq != 9 {
		t.Fatalf("producer 1 keeps %d batches from seq %d to %d", e.n, e.batches[0].seq, e.last().seq)
	}
}

// Replaying the batches applied during a rebuild on top of the rebuilt
// table gives the table of applying everything in order: the same
// producers in the same order with the same last batch. A producer evicted
// and written again in the later part may keep earlier batches in the
// replay, which whole drops; they were committed where the table says.
func TestProducerTableReplay(t *testing.T) {
	type rec struct {
		id  uint64
		seq int64
	}
	var log []rec
	for i := 0; i < 200; i++ {
		id := uint64(i*7%13 + 1)
		log = append(log, rec{id, int64(i)})
	}
	build := func(recs []rec, into *producerTable) *producerTable {
		for _, r := range recs {
			into.record(r.id, seqBatch{seq: r.seq, count: 1, offset: r.seq})
		}
		return into
	}
	for _, split := range []int{0, 1, 50, 150, 199, 200} {
		whole := build(log, newProducerTable(5))
		older := build(log[:split], newProducerTable(5))
		newer := build(log[split:], newProducerTable(5))
		newer.raiseEpochs(epochList{uint64(split + 1), 3})
		older.raiseEpochs(epochList{100, 2})
		newer.replayOnto(older)
		if want := max(100, uint64(split+1)); older.epochList() != (epochList{want, 3}) {
			t.Fatalf("split %d: epochs %v after the replay, want the higher of both, [%d 3]", split, older.epochList(), want)
		}
		if !slices.Equal(tableIDs(older), tableIDs(whole)) {
			t.Fatalf("split %d: order %v, want %v", split, tableIDs(older), tableIDs(whole))
		}
		for e := whole.head; e != nil; e = e.next {
			o := older.get(e.id)
			if o == nil || o.n < e.n || !slices.Equal(o.batches[o.n-e.n:o.n], e.batches[:e.n]) {
				t.Fatalf("split %d: producer %d differs", split, e.id)
			}
		}
	}
}

func TestProducerFileRoundTrip(t *testing.T) {
	tab := newProducerTable(100)
	for i := 0; i < 60; i++ {
		id := uint64(i%17 + 1)
		tab.record(id, seqBatch{seq: int64(i * 3), count: 3, offset: int64(1000 + i*3)})
	}
	tab.epochs = [heraldpb.NumFencers]fenceEpoch{{1<<40 + 3, 61}, {9, 70}}
	data := tab.encode(77, 5)
	got, index, term, err := decodeProducers(data, 100)
	if err != nil || index != 77 || term != 5 || got.epochs != tab.epochs {
		t.Fatalf("decode: index %d term %d epochs %v: %v", index, term, got.epochs, err)
	}
	// A file of version 1 (before coordinator epochs): the same, epochs 0;
	// of version 2 (before the scheduler's): the coordinator's alone.
	for v, epochs := range map[byte]int{1: 0, 2: 1} {
		old := slices.Concat(data[:producersHead+epochs*epochBytes], data[producersHead+len(tab.epochs)*epochBytes:len(data)-4])
		old[4] = v
		old = binary.LittleEndian.AppendUint32(old, crc32.Checksum(old, castagnoli))
		ot, _, _, err := decodeProducers(old, 100)
		want := [heraldpb.NumFencers]fenceEpoch{}
		copy(want[:epochs], tab.epochs[:])
		if err != nil || ot.epochs != want || !slices.Equal(tableIDs(ot), tableIDs(tab)) {
			t.Fatalf("version %d file: epochs %v, %v: %v", v, ot.epochs, tableIDs(ot), err)
		}
	}
	if !slices.Equal(tableIDs(got), tableIDs(tab)) {
		t.Fatalf("order %v, want %v", tableIDs(got), tableIDs(tab))
	}
	for e := tab.head; e != nil; e = e.next {
		if g := got.get(e.id); g.n != e.n || g.batches != e.batches {
			t.Fatalf("producer %d differs after a round trip", e.id)
		}
	}
	// A smaller limit keeps the most recently written producers.
	small, _, _, err := decodeProducers(data, 4)
	if err != nil || !slices.Equal(tableIDs(small), tableIDs(tab)[:4]) {
		t.Fatalf("limit 4: %v (%v), want %v", tableIDs(small), err, tableIDs(tab)[:4])
	}
	// Every damaged copy is refused.
	for _, i := range []int{0, 4, 6, 14, 22, len(data) / 2, len(data) - 1} {
		bad := slices.Clone(data)
		bad[i] ^= 0x10
		if _, _, _, err := decodeProducers(bad, 100); err == nil {
			t.Errorf("a flipped byte at %d was accepted", i)
		}
	}
	if _, _, _, err := decodeProducers(data[:len(data)-5], 100); err == nil {
		t.Error("a truncated file was accepted")
	}
	empty := newProducerTable(10).encode(0, 0)
	if e, _, _, err := decodeProducers(empty, 10); err != nil || e.len() != 0 {
		t.Fatalf("empty table: %v", err)
	}
}

// FuzzDecodeProducers: decoding any bytes as a producer state file errors
// or yields a table within its limit, and never panics.
func FuzzDecodeProducers(f *testing.F) {
	tab := newProducerTable(10)
	tab.record(1, seqBatch{seq: 0, count: 3, offset: 0})
	tab.record(2, seqBatch{seq: 9, count: 1, offset: 3})
	f.Add(tab.encode(5, 2))
	f.Add([]byte("HPRD"))
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecodedProducers(t, b)
	})
}

// FuzzDecodeProducersBody: as FuzzDecodeProducers, with the checksum made
// right so that the body is decoded: a producer count larger than the file
// can hold is refused before anything is allocated for it, and what is
// accepted is a table within its limit with sane batches.
func FuzzDecodeProducersBody(f *testing.F) {
	tab := newProducerTable(10)
	for i := 0; i < 12; i++ {
		tab.record(uint64(i%4+1), seqBatch{seq: int64(i), count: 1, offset: int64(i)})
	}
	good := tab.encode(12, 3)
	f.Add(good[:len(good)-4])
	f.Fuzz(func(t *testing.T, body []byte) {
		checkDecodedProducers(t, binary.LittleEndian.AppendUint32(slices.Clone(body), crc32.Checksum(body, castagnoli)))
	})
}

func checkDecodedProducers(t *testing.T, b []byte) {
	const limit = 3
	tab, _, _, err := decodeProducers(b, limit)
	if err != nil {
		return
	}
	if tab.len() > limit {
		t.Fatalf("%d producers in a table limited to %d", tab.len(), limit)
	}
	n := 0
	for e := tab.head; e != nil; e = e.next {
		n++
		if e.n < 1 || e.n > ProducerBatches || tab.get(e.id) != e {
			t.Fatalf("producer %d with %d batches", e.id, e.n)
		}
		for _, sb := range e.batches[:e.n] {
			if sb.seq < 0 || sb.offset < 0 || sb.count == 0 {
				t.Fatalf("producer %d: batch %+v accepted", e.id, sb)
			}
		}
		_, _, _ = checkSequence(e, nil, e.last().end(), 1)
	}
	if n != tab.len() {
		t.Fatalf("recency list holds %d producers, map %d", n, tab.len())
	}
}
