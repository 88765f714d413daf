package persistence

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	heraldpb "github.com/heraldmq/herald/proto"
)

// FuzzDecodeEntry feeds arbitrary bytes to decodeEntry, the decoder of a WAL
// payload (CRC32C, raftpb.Entry, heraldpb.LogEntry header). It guarantees:
// decodeEntry never panics; it either returns an error marked ErrCorrupt or
// an entry whose records alias its Data and whose offsets do not overflow;
// and any entry it accepts re-encodes to a payload it decodes to the same
// entry. Inputs with a wrong checksum are also retried with the checksum
// fixed, so the fuzzer reaches the protobuf decoders.
func FuzzDecodeEntry(f *testing.F) {
	g := &gen{term: 3, next: 42, nowMs: 1_700_000_000_000, recLen: 16}
	e := g.entry(7, 2)
	f.Add(appendEncodedEntry(nil, &e))
	empty := raftpb.Entry{Index: 1, Term: 1}
	f.Add(appendEncodedEntry(nil, &empty))
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		check(t, b)
		if len(b) >= crcLen {
			fixed := appendCRC(b[crcLen:])
			check(t, fixed)
		}
	})
}

func appendCRC(body []byte) []byte {
	out := binary.LittleEndian.AppendUint32(make([]byte, 0, crcLen+len(body)), crc32c(body))
	return append(out, body...)
}

func check(t *testing.T, b []byte) {
	e, m, records, err := decodeEntry(b)
	if err != nil {
		if !IsCorruption(err) {
			t.Fatalf("error not marked corrupt: %v", err)
		}
		return
	}
	if m.hasRecords && m.base > m.end() {
		t.Fatalf("offsets overflow: %d + %d", m.base, m.count)
	}
	if len(records) > 0 && !bytes.Contains(e.Data, records) {
		t.Fatal("records do not alias the entry data")
	}
	again := appendEncodedEntry(nil, &e)
	e2, m2, _, err := decodeEntry(again)
	if err != nil {
		t.Fatalf("re-encoded entry does not decode: %v", err)
	}
	m2.size = m.size
	if !slices.Equal(m2.refs, m.refs) {
		t.Fatalf("refs differ after a round trip: %v vs %v", m.refs, m2.refs)
	}
	if e2.Index != e.Index || e2.Term != e.Term || e2.Type != e.Type || !bytes.Equal(e2.Data, e.Data) ||
		m2.index != m.index || m2.term != m.term || m2.hasRecords != m.hasRecords || m2.base != m.base || m2.count != m.count ||
		m2.appendMs != m.appendMs || m2.maxTsMs != m.maxTsMs || m2.size != m.size || m2.txnCount != m.txnCount || m2.txn != m.txn {
		t.Fatalf("round trip differs: %v %+v vs %v %+v", e, m, e2, m2)
	}
	if m.hasRecords {
		// The header agrees with the protobuf library's view of the data.
		var le heraldpb.LogEntry
		if err := proto.Unmarshal(e.Data, &le); err == nil {
			if le.BaseOffset != m.base || le.Count != m.count || le.TxnCount != m.txnCount || !slices.Equal(le.TxnRefs, m.refs) {
				t.Fatalf("hand decoder disagrees with proto: %v vs %+v", &le, m)
			}
		}
	}
}

// stateSeeds are state files: two slots, one slot torn, the earlier
// single-record format.
func stateSeeds() [][]byte {
	st := diskState{hs: raftpb.HardState{Term: 4, Vote: 2, Commit: 9}, cs: raftpb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}},
		snapIndex: 3, snapTerm: 1, snapOffset: 70}
	a, _ := encodeSlot(&st, 7)
	st.hs.Term = 5
	b, _ := encodeSlot(&st, 8)
	two := append(append([]byte{}, a...), b...)
	torn := append(append([]byte{}, a...), b[:100]...)
	torn = append(torn, make([]byte, slotSize-100)...)
	hist := st
	hist.snapCS = raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	hist.confs = []confAt{{index: 5, cs: raftpb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}}},
		{index: 7, cs: raftpb.ConfState{Voters: []uint64{1, 2, 4}, VotersOutgoing: []uint64{1, 2, 3}, AutoLeave: true}}}
	hist.gapFrom, hist.gapTo = 4, 5
	h, _ := encodeSlot(&hist, 9)
	return [][]byte{two, torn, encodeState(&st), {}, []byte(slotMagic), h}
}

// FuzzDecodeStateFile feeds arbitrary bytes to decodeStateFile, the
// decoder of the raft state file. It never panics, fails only with
// errors marked ErrCorrupt, and a state it accepts encodes to a slot that
// decodes to the same state.
func FuzzDecodeStateFile(f *testing.F) {
	for _, s := range stateSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st, seq, _, err := decodeStateFile(b)
		if err != nil {
			if !IsCorruption(err) {
				t.Fatalf("error not marked corrupt: %v", err)
			}
			return
		}
		slot, err := encodeSlot(&st, seq+1)
		if err != nil {
			return // a state too large for a slot, from the old format
		}
		st2, seq2, ok := decodeSlot(slot)
		if !ok || seq2 != seq+1 || !bytes.Equal(encodeState(&st2), encodeState(&st)) {
			t.Fatalf("round trip differs: %+v vs %+v", st, st2)
		}
	})
}
