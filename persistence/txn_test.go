package persistence

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	heraldpb "github.com/heraldmq/herald/proto"
)

// txnBatch is a transactional batch of count records at index i: no
// offset until a commit marker names it.
func (g *gen) txnBatch(i uint64, count uint32, pid uint64, epoch uint32, tag string) raftpb.Entry {
	return g.raw(i, &heraldpb.LogEntry{TxnCount: count, ProducerId: pid, ProducerEpoch: epoch, AppendTimeMs: g.nowMs, MaxTimestampMs: g.nowMs, Records: []byte(tag)})
}

// commit is a commit marker at index i giving the batches at refs (of
// count records in all) the next offsets.
func (g *gen) commit(i uint64, count uint32, pid uint64, epoch uint32, refs ...uint64) raftpb.Entry {
	e := g.raw(i, &heraldpb.LogEntry{BaseOffset: g.next, Count: count, ProducerId: pid, ProducerEpoch: epoch,
		TxnMarker: heraldpb.TxnMarker_TXN_MARKER_COMMIT, TxnRefs: refs, AppendTimeMs: g.nowMs, MaxTimestampMs: g.nowMs})
	g.next += int64(count)
	return e
}

func (g *gen) raw(i uint64, le *heraldpb.LogEntry) raftpb.Entry {
	data, err := proto.Marshal(le)
	if err != nil {
		panic(err)
	}
	return raftpb.Entry{Index: i, Term: g.term, Type: raftpb.EntryNormal, Data: data}
}

// batchesOf renders batches as "base+count:records" for comparison.
func batchesOf(bs []*heraldpb.StoredBatch) string {
	s := ""
	for _, b := range bs {
		s += fmt.Sprintf("%d+%d:%s ", b.BaseOffset, b.Count, b.Records)
	}
	return s
}

// A transactional batch holds no offset and is not read; its commit
// marker gives the batches it names the next offsets, and a read returns
// them there, from any offset inside them, within the byte budget, up to
// a limit, and again after a reopen rebuilt the indexes.
func TestReadCommittedBatches(t *testing.T) {
	opts, _ := testOptions(t, t.TempDir())
	opts.IndexIntervalBytes = 64 // many intervals
	l := mustOpen(t, opts)
	defer func() { l.Close() }()
	g := &gen{term: 1, recLen: 1}
	ents := []raftpb.Entry{
		g.entry(1, 2),                  // 0-1
		g.txnBatch(2, 3, 7, 1, "a1"),   // pending
		g.entry(3, 2),                  // 2-3
		g.txnBatch(4, 2, 7, 1, "a2"),   // pending
		g.txnBatch(5, 1, 8, 4, "b1"),   // another producer's, never committed
		g.commit(6, 5, 7, 1, 2, 4),     // 4-6 (a1), 7-8 (a2)
		g.entry(7, 2),                  // 9-10
		g.txnBatch(8, 4, 7, 2, "late"), // the producer's next transaction, open
	}
	mustSave(t, l, raftpb.HardState{Term: 1, Commit: 8}, ents)
	want := "0+2:\x01 2+2:\x03 4+3:a1 7+2:a2 9+2:\x07 "
	check := func(what string) {
		t.Helper()
		if l.EndOffset() != 11 {
			t.Fatalf("%s: end offset %d, want 11", what, l.EndOffset())
		}
		for _, c := range []struct {
			off      int64
			maxBytes int
			limit    int64
			want     string
		}{
			{0, 1 << 20, 11, want},
			{5, 1 << 20, 11, "4+3:a1 7+2:a2 9+2:\x07 "},
			{7, 1 << 20, 11, "7+2:a2 9+2:\x07 "},
			{4, 1, 11, "4+3:a1 "},                      // the budget ends the read inside the marker
			{8, 1, 11, "7+2:a2 "},                      // and the next read goes on inside it
			{2, 1 << 20, 9, "2+2:\x03 4+3:a1 7+2:a2 "}, // a limit at the marker's end
			{2, 1 << 20, 8, "2+2:\x03 "},               // one inside it stops before it
		} {
			bs, err := l.ReadBatches(c.off, c.maxBytes, c.limit)
			if err != nil || batchesOf(bs) != c.want {
				t.Fatalf("%s: ReadBatches(%d, %d, %d) = %q, %v; want %q", what, c.off, c.maxBytes, c.limit, batchesOf(bs), err, c.want)
			}
		}
		checkInvariants(t, l)
	}
	check("written")
	l.Close()
	l = mustOpen(t, opts)
	check("reopened")
	if got := l.NextOffset(); got != 11 {
		t.Fatalf("next offset %d, want 11", got)
	}
}

// A commit marker that names an entry that is not a transactional batch,
// or batches that do not add up to its count, is corruption, reported by
// the read and never served.
func TestCommitMarkerMismatchIsCorrupt(t *testing.T) {
	for name, ents := range map[string]func(g *gen) []raftpb.Entry{
		"names a plain entry": func(g *gen) []raftpb.Entry {
			return []raftpb.Entry{g.entry(1, 2), g.commit(2, 2, 7, 1, 1)}
		},
		"counts more than its batches": func(g *gen) []raftpb.Entry {
			return []raftpb.Entry{g.txnBatch(1, 2, 7, 1, "a"), g.commit(2, 3, 7, 1, 1)}
		},
		"names a later entry": func(g *gen) []raftpb.Entry {
			return []raftpb.Entry{g.txnBatch(1, 2, 7, 1, "a"), g.commit(2, 2, 7, 1, 3), g.txnBatch(3, 2, 7, 1, "b")}
		},
	} {
		t.Run(name, func(t *testing.T) {
			opts, _ := testOptions(t, t.TempDir())
			l := mustOpen(t, opts)
			defer l.Close()
			es := ents(&gen{term: 1})
			mustSave(t, l, raftpb.HardState{Term: 1, Commit: uint64(len(es))}, es)
			bs, err := l.ReadBatches(0, 1<<20, l.EndOffset())
			if !errors.Is(err, ErrCorrupt) || !errors.Is(err, ErrStorage) || bs != nil {
				t.Fatalf("read %q, %v; want a corruption error", batchesOf(bs), err)
			}
		})
	}
}

// txnLog is 30 entries: plain ones of one record (offsets 0-9 at
// indexes 1-10, 10-18 at 12-20, 24-31 at 23-30) and a transaction whose
// batches at 11 and 21 its commit marker at 22 gives offsets 19-23.
func txnLog(t *testing.T) (*Log, Options) {
	opts, _ := testOptions(t, t.TempDir())
	opts.IndexIntervalBytes = 200
	l := mustOpen(t, opts)
	g := &gen{term: 1, recLen: 50}
	var ents []raftpb.Entry
	for i := uint64(1); i <= 10; i++ {
		ents = append(ents, g.entry(i, 1))
	}
	ents = append(ents, g.txnBatch(11, 2, 7, 1, "early"))
	for i := uint64(12); i <= 20; i++ {
		ents = append(ents, g.entry(i, 1))
	}
	ents = append(ents, g.txnBatch(21, 3, 7, 1, "late"))
	ents = append(ents, g.commit(22, 5, 7, 1, 11, 21))
	for i := uint64(23); i <= 30; i++ {
		ents = append(ents, g.entry(i, 1))
	}
	mustSave(t, l, raftpb.HardState{Term: 1, Commit: 30}, ents)
	return l, opts
}

// checkFront checks the log's first index and start offset, that a read
// at the start returns it, and the invariants, before and after a reopen.
func checkFront(t *testing.T, l *Log, opts Options, first uint64, start int64, wantFirst string) *Log {
	t.Helper()
	for _, what := range []string{"cut", "reopened"} {
		if what == "reopened" {
			l.Close()
			l = mustOpen(t, opts)
		}
		if f, _ := mustIndexes(t, l); f != first || l.StartOffset() != start || l.EndOffset() != 32 {
			t.Fatalf("%s: first index %d, offsets [%d, %d); want %d, [%d, 32)", what, f, l.StartOffset(), l.EndOffset(), first, start)
		}
		bs, err := l.ReadBatches(start, 1, l.EndOffset())
		if err != nil || len(bs) == 0 || fmt.Sprintf("%d+%d", bs[0].BaseOffset, bs[0].Count) != wantFirst {
			t.Fatalf("%s: read at the start %q, %v; want %s first", what, batchesOf(bs), err, wantFirst)
		}
		if _, err := l.ReadBatches(start-1, 1, l.EndOffset()); !errors.Is(err, ErrOffsetOutOfRange) {
			t.Fatalf("%s: read below the start: %v", what, err)
		}
		checkInvariants(t, l)
	}
	return l
}

// Retention that cuts the log between a committed transaction's batches
// and its marker removes the whole transaction: the log then starts after
// it (no offset at or above the start is without its records), and the
// entries kept below that offset go with the next truncation. A cut that
// splits no transaction keeps its offsets readable.
func TestRetentionAcrossATransaction(t *testing.T) {
	l, opts := txnLog(t)
	defer func() { l.Close() }()
	retain := func(upTo uint64) {
		t.Helper()
		if _, err := l.Retain(time.UnixMilli(0), 0, 1, upTo); err != nil {
			t.Fatal(err)
		}
	}
	retain(11) // before the transaction's first batch: it stays whole
	l = checkFront(t, l, opts, 11, 10, "10+1")
	if bs, err := l.ReadBatches(19, 1<<20, 24); err != nil || batchesOf(bs) != "19+2:early 21+3:late " {
		t.Fatalf("the committed batches read %q, %v", batchesOf(bs), err)
	}
	retain(22) // between its batches and its marker
	l = checkFront(t, l, opts, 22, 24, "24+1")
	retain(24)
	checkFront(t, l, opts, 24, 25, "25+1")
}

// DeleteBefore never splits a committed transaction: every record at or
// after its offset stays, so its cut moves back to the transaction's
// first batch. Once the marker goes, its batches may go with it.
func TestDeleteBeforeKeepsATransactionWhole(t *testing.T) {
	l, opts := txnLog(t)
	defer func() { l.Close() }()
	if _, err := l.DeleteBefore(1000, 22); err != nil {
		t.Fatal(err)
	}
	l = checkFront(t, l, opts, 11, 10, "10+1")
	if bs, err := l.ReadBatches(19, 1<<20, 24); err != nil || batchesOf(bs) != "19+2:early 21+3:late " {
		t.Fatalf("the committed batches read %q, %v", batchesOf(bs), err)
	}
	if _, err := l.DeleteBefore(1000, 23); err != nil {
		t.Fatal(err)
	}
	checkFront(t, l, opts, 23, 24, "24+1")
}
