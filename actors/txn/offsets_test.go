package txn

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// groupsStub stands in for the groups coordinator: it records the
// offsets applied, refusing the first `refuse` requests with a retriable
// error.
type groupsStub struct {
	mu      sync.Mutex
	applied []*heraldpb.CommitTxnOffsetsRequest
	refuse  atomic.Int32
	// values, if set, is read when offsets arrive: the records on t then.
	values func() []string
	seen   [][]string
}

func (g *groupsStub) apply(f *heraldpb.Frame) (*heraldpb.Frame, error) {
	if g.refuse.Add(-1) >= 0 {
		e := heraldpb.NewError(heraldpb.ErrorCode_NOT_COORDINATOR, "no node coordinates consumer groups right now")
		return heraldpb.ErrorFrame(f.Id, e), nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.applied = append(g.applied, f.GetCommitTxnOffsets())
	if g.values != nil {
		g.seen = append(g.seen, g.values())
	}
	return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_CommitTxnOffsetsResponse{CommitTxnOffsetsResponse: &heraldpb.CommitTxnOffsetsResponse{}}}, nil
}

func (g *groupsStub) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.applied)
}

func (s *txnSession) commitWithOffsets(offs ...*heraldpb.TxnGroupOffsets) (*heraldpb.EndTxnResponse, *heraldpb.Error) {
	s.r.t.Helper()
	res := s.r.call(&heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{TransactionalId: s.id, ProducerId: s.pid, ProducerEpoch: s.epoch, Commit: true, GroupOffsets: offs}}}, s.r.txn)
	if e := res.GetError(); e != nil {
		return nil, e
	}
	r := res.GetEndTxnResponse()
	s.epoch, s.seq = r.NextEpoch, 0
	return r, nil
}

// A commit's group offsets are recorded in its decision and applied once
// its records are on their partitions (retried while the groups
// coordinator cannot take them), and before the commit is complete: a new
// session of the id waits for them. An abort applies none, bad offsets are
// refused with a typed error before anything is decided, and a commit
// decided but not complete when the coordinator stops applies its
// offsets after the reload.
func TestCommitAppliesGroupOffsets(t *testing.T) {
	dir := t.TempDir()
	g := &groupsStub{}
	var hold atomic.Bool
	r := newRig(t, dir, Options{GroupOffsets: g.apply, holdAppends: hold.Load})
	g.values = r.values
	offs := &heraldpb.TxnGroupOffsets{Group: "g", Topic: "t", Partitions: []uint32{0}, Offsets: []int64{7}}

	// Refused before anything is decided: a bad group, an unknown topic
	// or partition, mismatched lists, a negative offset, an abort.
	s := r.session("p")
	s.stage("a")
	for _, bad := range []struct {
		o    *heraldpb.TxnGroupOffsets
		code heraldpb.ErrorCode
	}{
		{&heraldpb.TxnGroupOffsets{Group: "__g", Topic: "t", Partitions: []uint32{0}, Offsets: []int64{1}}, heraldpb.ErrorCode_INVALID_REQUEST},
		{&heraldpb.TxnGroupOffsets{Group: "g", Topic: "nope", Partitions: []uint32{0}, Offsets: []int64{1}}, heraldpb.ErrorCode_TOPIC_NOT_FOUND},
		{&heraldpb.TxnGroupOffsets{Group: "g", Topic: "t", Partitions: []uint32{3}, Offsets: []int64{1}}, heraldpb.ErrorCode_PARTITION_NOT_FOUND},
		{&heraldpb.TxnGroupOffsets{Group: "g", Topic: "t", Partitions: []uint32{0}, Offsets: []int64{1, 2}}, heraldpb.ErrorCode_INVALID_REQUEST},
		{&heraldpb.TxnGroupOffsets{Group: "g", Topic: "t", Partitions: []uint32{0}, Offsets: []int64{-1}}, heraldpb.ErrorCode_INVALID_REQUEST},
	} {
		if _, e := s.commitWithOffsets(bad.o); e.GetCode() != bad.code {
			t.Fatalf("offsets %v: %v, want %v", bad.o, e, bad.code)
		}
	}
	res := r.call(&heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{TransactionalId: s.id, ProducerId: s.pid, ProducerEpoch: s.epoch, GroupOffsets: []*heraldpb.TxnGroupOffsets{offs}}}}, r.txn)
	if res.GetError().GetCode() != heraldpb.ErrorCode_INVALID_REQUEST {
		t.Fatalf("an abort with offsets: %v", res)
	}
	s.end(false) // aborted: no offsets
	s.stage("b")
	g.refuse.Store(3) // the groups coordinator is away for a while
	if _, e := s.commitWithOffsets(offs); e != nil {
		t.Fatal(e)
	}
	waitFor(t, "the offsets applied", func() error {
		if g.count() == 1 {
			return nil
		}
		return fmt.Errorf("%d applied", g.count())
	})
	g.mu.Lock()
	if a := g.applied[0]; a.TransactionalId != "p" || !proto.Equal(a.Offsets, offs) || !slices.Equal(g.seen[0], []string{"b"}) {
		t.Fatalf("applied %v with the topic holding %v, want %v after b", a, g.seen[0], offs)
	}
	g.mu.Unlock()
	if got := r.values(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("topic holds %v", got)
	}

	// An empty transaction commits its offsets alone.
	offs2 := &heraldpb.TxnGroupOffsets{Group: "g", Topic: "t", Partitions: []uint32{0}, Offsets: []int64{9}}
	if _, e := s.commitWithOffsets(offs2); e != nil {
		t.Fatal(e)
	}
	waitFor(t, "the empty transaction's offsets", func() error {
		if g.count() == 2 {
			return nil
		}
		return fmt.Errorf("%d applied", g.count())
	})

	// Decided, appends held, the coordinator stopped: the reloaded one
	// appends the records and then applies the offsets.
	hold.Store(true)
	s.stage("c")
	offs3 := &heraldpb.TxnGroupOffsets{Group: "g", Topic: "t", Partitions: []uint32{0}, Offsets: []int64{11}}
	if _, e := s.commitWithOffsets(offs3); e != nil {
		t.Fatal(e)
	}
	_, _ = r.sys.Root.StopFuture(r.txn).Result()
	if n := g.count(); n != 2 {
		t.Fatalf("offsets applied before the appends: %d", n)
	}
	hold.Store(false)
	r.txn = r.sys.Root.Spawn(Props(Options{Topics: r.reg, Push: noPush{}, GroupOffsets: g.apply, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	waitFor(t, "the reloaded commit's offsets", func() error {
		if g.count() == 3 {
			return nil
		}
		return fmt.Errorf("%d applied", g.count())
	})
	g.mu.Lock()
	if a := g.applied[2]; !proto.Equal(a.Offsets, offs3) || !slices.Equal(g.seen[2], []string{"b", "c"}) {
		t.Fatalf("after the reload applied %v with the topic holding %v", a, g.seen[2])
	}
	g.mu.Unlock()
	// A new session starts once they are applied (nothing is left).
	r.session("p")
}
