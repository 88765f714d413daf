package partition

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/internal/raftwire"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.etcd.io/raft/v3/raftpb"
)

// idemFrame is an idempotent produce of values by producer pid, whose
// first record has sequence seq.
func idemFrame(pid uint64, seq int64, acks heraldpb.Acks, values ...string) *heraldpb.Frame {
	f := produceFrame("t", acks, values...)
	f.GetProduce().ProducerId, f.GetProduce().BaseSequence = pid, seq
	return f
}

// ask sends f to pid and returns the answer.
func ask(t *testing.T, sys *actor.ActorSystem, pid *actor.PID, in *inbox, f *heraldpb.Frame) *heraldpb.Frame {
	t.Helper()
	sys.Root.RequestWithCustomSender(pid, f, in.pid)
	return in.next(t)
}

// askRetrying sends the frames mk makes until the answer is not a retriable
// error (a new leader answers THROTTLED until it applied its log, a former
// one NOT_LEADER), as a client would, and returns it.
func askRetrying(t *testing.T, sys *actor.ActorSystem, pid func() *actor.PID, in *inbox, mk func() *heraldpb.Frame) *heraldpb.Frame {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f := ask(t, sys, pid(), in, mk())
		if !f.GetError().GetRetriable() {
			return f
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %v after 10s", f.GetError())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// mustProduce checks f is a ProduceResponse at base, a duplicate or not.
func mustProduce(t *testing.T, f *heraldpb.Frame, base int64, dup bool) {
	t.Helper()
	r := f.GetProduceResponse()
	if r == nil {
		t.Fatalf("want a produce at %d (duplicate %v), got %v", base, dup, f.GetError())
	}
	if r.BaseOffset != base || r.Duplicate != dup {
		t.Fatalf("produce answered at %d (duplicate %v), want %d (duplicate %v)", r.BaseOffset, r.Duplicate, base, dup)
	}
}

func mustFail(t *testing.T, f *heraldpb.Frame, code heraldpb.ErrorCode) *heraldpb.Error {
	t.Helper()
	e := f.GetError()
	if e.GetCode() != code {
		t.Fatalf("want %v, got %v", code, f)
	}
	return e
}

// gate holds a store's fsyncs while closed, so entries stay uncommitted.
type gate struct {
	mu sync.Mutex
	ch chan struct{}
}

func (g *gate) close() { g.mu.Lock(); g.ch = make(chan struct{}); g.mu.Unlock() }
func (g *gate) open() {
	g.mu.Lock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
	g.mu.Unlock()
}
func (g *gate) wait() {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

type gatedStore struct {
	Storage
	g *gate
}

func (s gatedStore) Flush() error { s.g.wait(); return s.Storage.Flush() }

// idemPartition runs one replica of partition <topic>-0 with its producer
// state file in dir.
type idemPartition struct {
	t            *testing.T
	sys          *actor.ActorSystem
	topic, dir   string
	maxProducers int
	hold         *gate
	pid          *actor.PID
	stats        *Stats
	in           *inbox
}

func (ip *idemPartition) statePath() string { return filepath.Join(ip.dir, "producers.state") }

func (ip *idemPartition) start() {
	t := ip.t
	t.Helper()
	readers := NewReaderPool(ip.sys, 2, 64)
	t.Cleanup(readers.Close)
	name := "idem/" + ip.topic
	dir, hold := ip.dir, ip.hold
	ip.stats = &Stats{}
	props, err := Props(ip.sys, Config{
		Topic: ip.topic, Partition: 0, ReplicaID: 1, Peers: map[uint64]*actor.PID{1: actor.NewPID(ip.sys.Address(), name)},
		Open: func() (Storage, error) {
			s, err := persistence.Open(persistence.Options{Dir: dir, Group: "t-0"})
			if err != nil || hold == nil {
				return s, err
			}
			return gatedStore{s, hold}, nil
		},
		ProducerStatePath: ip.statePath(), IndexSaveInterval: time.Hour, MaxProducers: ip.maxProducers,
		TickInterval: 10 * time.Millisecond, Readers: readers,
	}, ip.stats)
	if err != nil {
		t.Fatal(err)
	}
	if ip.pid, err = ip.sys.Root.SpawnNamed(props, name); err != nil {
		t.Fatal(err)
	}
	ip.in = newInbox(ip.sys)
	checkFor(t, 10*time.Second, "idempotent produce accepted", func() bool { return ip.stats.Idempotent.Load() })
}

func (ip *idemPartition) stop() { ip.sys.Root.StopFuture(ip.pid).Wait() }

func (ip *idemPartition) ask(f *heraldpb.Frame) *heraldpb.Frame {
	ip.t.Helper()
	return ask(ip.t, ip.sys, ip.pid, ip.in, f)
}

func (ip *idemPartition) self() *actor.PID { return ip.pid }

// TestIdempotentProduce: a retry of a committed batch is answered with its
// original offsets and appends nothing; a gap or an overlap is
// OUT_OF_ORDER_SEQUENCE (not retriable); a producer the partition does not
// know may start at any sequence.
func TestIdempotentProduce(t *testing.T) {
	sys := actor.NewActorSystem()
	DeleteMetrics("idem-basic", 0) // counters of an earlier run (-count)
	ip := &idemPartition{t: t, sys: sys, topic: "idem-basic", dir: t.TempDir()}
	ip.start()
	defer ip.stop()
	const all = heraldpb.Acks_ACKS_ALL

	mustProduce(t, ip.ask(idemFrame(1, 0, all, "a", "b", "c")), 0, false)
	mustProduce(t, ip.ask(produceFrame("t", all, "x")), 3, false) // not idempotent
	mustProduce(t, ip.ask(idemFrame(1, 3, heraldpb.Acks_ACKS_LEADER, "d")), 4, false)
	mustProduce(t, ip.ask(idemFrame(1, 0, all, "a", "b", "c")), 0, true)
	mustProduce(t, ip.ask(idemFrame(1, 3, heraldpb.Acks_ACKS_LEADER, "d")), 4, true)
	if r := ip.ask(idemFrame(1, 3, heraldpb.Acks_ACKS_NONE, "d")).GetProduceResponse(); r == nil || !r.Duplicate {
		t.Fatalf("acks=none retry: %v", r)
	}

	e := mustFail(t, ip.ask(idemFrame(1, 6, all, "gap")), heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE)
	if e.Retriable || !strings.Contains(e.Message, "next expected is 4") {
		t.Fatalf("gap: %v", e)
	}
	mustFail(t, ip.ask(idemFrame(1, 2, all, "c", "d")), heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE) // overlaps two batches
	mustFail(t, ip.ask(idemFrame(1, 0, all, "a", "b")), heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE) // a batch's start, not its length
	mustFail(t, ip.ask(idemFrame(1, -1, all, "neg")), heraldpb.ErrorCode_INVALID_REQUEST)

	mustProduce(t, ip.ask(idemFrame(2, 1000, all, "p2")), 5, false) // a new producer starts anywhere
	mustProduce(t, ip.ask(idemFrame(1, 4, all, "e")), 6, false)

	checkFor(t, 5*time.Second, "hw 7", func() bool { return ip.stats.HighWatermark.Load() == 7 })
	if got := readAll(t, sys, ip.pid, 7); fmt.Sprint(got) != "[a b c x d p2 e]" {
		t.Fatalf("log holds %v", got)
	}
	lv := []string{"idem-basic", "0"}
	if d, o, n := testutil.ToFloat64(produceDuplicates.WithLabelValues(lv...)), testutil.ToFloat64(produceOutOfOrder.WithLabelValues(lv...)),
		testutil.ToFloat64(idemProducers.WithLabelValues(lv...)); d != 3 || o != 3 || n != 2 {
		t.Fatalf("metrics: %v duplicates, %v out of order, %v producers; want 3, 3, 2", d, o, n)
	}
}

// TestIdempotentRetryOfInFlightBatch: retries of a batch proposed and not
// yet committed wait for it and get its offsets: one append.
func TestIdempotentRetryOfInFlightBatch(t *testing.T) {
	sys := actor.NewActorSystem()
	ip := &idemPartition{t: t, sys: sys, topic: "idem-inflight", dir: t.TempDir(), hold: &gate{}}
	ip.start()
	defer ip.stop()
	defer ip.hold.open()

	mustProduce(t, ip.ask(idemFrame(9, 0, heraldpb.Acks_ACKS_ALL, "first")), 0, false)
	ip.hold.close() // no entry commits from now on
	first, retry, retry2 := newInbox(sys), newInbox(sys), newInbox(sys)
	sys.Root.RequestWithCustomSender(ip.pid, idemFrame(9, 1, heraldpb.Acks_ACKS_ALL, "a", "b"), first.pid)
	sys.Root.RequestWithCustomSender(ip.pid, idemFrame(9, 1, heraldpb.Acks_ACKS_ALL, "a", "b"), retry.pid)
	sys.Root.RequestWithCustomSender(ip.pid, idemFrame(9, 1, heraldpb.Acks_ACKS_LEADER, "a", "b"), retry2.pid)
	// The mailbox is in order: once this is answered, all three were handled.
	lo := ip.ask(&heraldpb.Frame{Id: frameIDs.Add(1), Body: &heraldpb.Frame_ListOffsets{ListOffsets: &heraldpb.ListOffsetsRequest{
		Topic: "t", Spec: heraldpb.OffsetSpec_OFFSET_SPEC_LATEST}}}).GetListOffsetsResponse()
	if lo.GetHighWatermark() != 1 {
		t.Fatalf("high watermark %d while the append is held", lo.GetHighWatermark())
	}
	select {
	case f := <-retry.frames:
		t.Fatalf("a retry of an uncommitted batch was answered before it committed: %v", f)
	default:
	}
	// A next batch may follow the in-flight one before it commits.
	next := newInbox(sys)
	sys.Root.RequestWithCustomSender(ip.pid, idemFrame(9, 3, heraldpb.Acks_ACKS_ALL, "c"), next.pid)

	ip.hold.open()
	mustProduce(t, first.next(t), 1, false)
	mustProduce(t, retry.next(t), 1, true)
	mustProduce(t, retry2.next(t), 1, true)
	mustProduce(t, next.next(t), 3, false)
	mustProduce(t, ip.ask(idemFrame(9, 1, heraldpb.Acks_ACKS_ALL, "a", "b")), 1, true)
	checkFor(t, 5*time.Second, "hw 4", func() bool { return ip.stats.HighWatermark.Load() == 4 })
	if got := readAll(t, sys, ip.pid, 4); fmt.Sprint(got) != "[first a b c]" {
		t.Fatalf("log holds %v", got)
	}
}

// TestIdempotentTableSurvivesRestart: after a restart the partition still
// answers retries of the batches written before it with their offsets, and
// expects the next sequences: from the file saved at stop; from a stale
// file (what a crash leaves) and the log after it; from the log alone when
// the file is missing, damaged, or claims more than the log holds.
func TestIdempotentTableSurvivesRestart(t *testing.T) {
	sys := actor.NewActorSystem()
	ip := &idemPartition{t: t, sys: sys, topic: "idem-restart", dir: t.TempDir()}
	ip.start()
	const all = heraldpb.Acks_ACKS_ALL

	// Producers 1..3 write batches of 2 records; sent[p] are their batches.
	type batch struct {
		seq, off int64
		vals     []string
	}
	sent := map[uint64][]batch{}
	off := int64(0)
	produce := func(round int) {
		t.Helper()
		for p := uint64(1); p <= 3; p++ {
			seq := int64(0)
			if bs := sent[p]; len(bs) > 0 {
				seq = bs[len(bs)-1].seq + 2
			}
			vals := []string{fmt.Sprintf("p%d-r%d-a", p, round), fmt.Sprintf("p%d-r%d-b", p, round)}
			mustProduce(t, ip.ask(idemFrame(p, seq, all, vals...)), off, false)
			sent[p] = append(sent[p], batch{seq, off, vals})
			off += 2
		}
	}
	check := func(stage string) {
		t.Helper()
		for p, bs := range sent {
			// The last ProducerBatches batches are retried: each is a duplicate.
			for _, b := range bs[max(0, len(bs)-ProducerBatches):] {
				f := askRetrying(t, sys, ip.self, ip.in, func() *heraldpb.Frame { return idemFrame(p, b.seq, all, b.vals...) })
				if r := f.GetProduceResponse(); r == nil || !r.Duplicate || r.BaseOffset != b.off {
					t.Fatalf("%s: producer %d retry of seq %d: %v, want a duplicate at %d", stage, p, b.seq, f, b.off)
				}
			}
			last := bs[len(bs)-1]
			mustFail(t, ip.ask(idemFrame(p, last.seq+3, all, "gap")), heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE)
		}
		if hw := ip.stats.HighWatermark.Load(); hw != off {
			t.Fatalf("%s: high watermark %d, want %d (a retry was appended)", stage, hw, off)
		}
	}
	restart := func(damage func()) {
		t.Helper()
		ip.stop()
		if damage != nil {
			damage()
		}
		ip.start()
	}

	produce(0)
	check("live")
	restart(nil)
	if _, err := os.Stat(ip.statePath()); err != nil {
		t.Fatalf("no producer state file after stop: %v", err)
	}
	check("restart with the file")

	// A stale file, as a crash leaves it: the batches after it are read
	// from the log.
	stale, err := os.ReadFile(ip.statePath())
	if err != nil {
		t.Fatal(err)
	}
	for round := 1; round <= 6; round++ {
		produce(round)
	}
	restart(func() {
		if err := os.WriteFile(ip.statePath(), stale, 0o640); err != nil {
			t.Fatal(err)
		}
	})
	check("restart with a stale file")

	for _, c := range []struct {
		name   string
		damage func()
	}{
		{"a missing file", func() { _ = os.Remove(ip.statePath()) }},
		{"a damaged file", func() {
			b, _ := os.ReadFile(ip.statePath())
			b[len(b)/2] ^= 1
			_ = os.WriteFile(ip.statePath(), b, 0o640)
		}},
		{"a file ahead of the log", func() {
			tab := newProducerTable(10)
			tab.record(1, seqBatch{seq: 1 << 40, count: 1, offset: 1 << 40})
			_ = os.WriteFile(ip.statePath(), tab.encode(1<<40, 1), 0o640)
		}},
		{"a file of another log", func() {
			tab := newProducerTable(10)
			tab.record(1, seqBatch{seq: 1 << 40, count: 1, offset: 1 << 40})
			_ = os.WriteFile(ip.statePath(), tab.encode(3, 1<<30), 0o640)
		}},
	} {
		produce(7)
		restart(c.damage)
		check("restart with " + c.name)
	}
	ip.stop()
}

// TestIdempotentProducersBounded: past MaxProducers the least recently
// written producer is forgotten; its next batch is accepted whatever its
// sequence (a retry of its old batch would be written again: the
// documented limit), and the others are still deduplicated.
func TestIdempotentProducersBounded(t *testing.T) {
	sys := actor.NewActorSystem()
	DeleteMetrics("idem-bounded", 0) // counters of an earlier run (-count)
	ip := &idemPartition{t: t, sys: sys, topic: "idem-bounded", dir: t.TempDir(), maxProducers: 3}
	ip.start()
	defer ip.stop()
	const all = heraldpb.Acks_ACKS_ALL
	for p := uint64(1); p <= 4; p++ {
		mustProduce(t, ip.ask(idemFrame(p, 0, all, fmt.Sprint(p))), int64(p-1), false)
	}
	lv := []string{"idem-bounded", "0"}
	checkFor(t, 5*time.Second, "3 producers tracked", func() bool { return testutil.ToFloat64(idemProducers.WithLabelValues(lv...)) == 3 })
	if n := testutil.ToFloat64(idemEvictions.WithLabelValues(lv...)); n != 1 {
		t.Fatalf("%v evictions, want 1", n)
	}
	// Producer 1 was the least recently written: forgotten. A retry does
	// not count as a write, so 2 stays the least recently written.
	mustProduce(t, ip.ask(idemFrame(2, 0, all, "2")), 1, true)
	mustProduce(t, ip.ask(idemFrame(1, 0, all, "1")), 4, false)
	mustProduce(t, ip.ask(idemFrame(1, 1, all, "1b")), 5, false)
	// That forgot 2; 4 and 3 are still known.
	mustProduce(t, ip.ask(idemFrame(4, 0, all, "4")), 3, true)
	mustProduce(t, ip.ask(idemFrame(3, 0, all, "3")), 2, true)
	mustProduce(t, ip.ask(idemFrame(2, 77, all, "2b")), 6, false)
	// And that forgot 3, whose write now forgets 4.
	mustProduce(t, ip.ask(idemFrame(3, 50, all, "3b")), 7, false)
	if n := testutil.ToFloat64(idemEvictions.WithLabelValues(lv...)); n != 4 {
		t.Fatalf("%v evictions, want 4", n)
	}
}

// net is an in-process raft network between replicas that drops the
// messages cut says to drop. It routes by node, as the cluster transport
// does: a message for raft id to goes to whichever replica of the group
// node heraldpb.ReplicaNode(to) runs now, so one meant for an earlier
// incarnation of a node's replica reaches the later one.
type net struct {
	sys  *actor.ActorSystem
	mu   sync.Mutex
	pids map[uint64]*actor.PID                        // by node id
	cut  func(from, to uint64, m raftpb.Message) bool // by raft id
}

func (n *net) set(node uint64, pid *actor.PID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if pid == nil {
		delete(n.pids, node)
	} else {
		n.pids[node] = pid
	}
}

func (n *net) setCut(cut func(from, to uint64, m raftpb.Message) bool) {
	n.mu.Lock()
	n.cut = cut
	n.mu.Unlock()
}

// transport is one replica's end of net.
type transport struct {
	n    *net
	from uint64
}

func (tr transport) Send(to uint64, m *raftwire.Message) {
	tr.n.mu.Lock()
	cut, pid := tr.n.cut, tr.n.pids[heraldpb.ReplicaNode(to)]
	tr.n.mu.Unlock()
	if pid == nil {
		return
	}
	if cut != nil && m.Quiesce == nil && m.Joining == nil && cut(tr.from, to, m.Raft) {
		return
	}
	tr.n.sys.Root.Send(pid, m)
}

// isolate cuts every message to and from id.
func isolate(id uint64) func(from, to uint64, m raftpb.Message) bool {
	return func(from, to uint64, m raftpb.Message) bool { return from == id || to == id }
}

// holdCommit cuts the append responses that acknowledge the entry of
// producer pid's batch at seq, or any later one, once a leader has sent
// that entry: followers get it, but no leader learns that it may commit
// it. (Responses for earlier entries pass: a follower that already
// committed an entry answers a resend of it with its commit index, and
// its leader must see that to go on.)
func holdCommit(pid uint64, seq int64) func(from, to uint64, m raftpb.Message) bool {
	var index atomic.Uint64
	return func(from, to uint64, m raftpb.Message) bool {
		switch m.Type {
		case raftpb.MsgApp:
			for _, e := range m.Entries {
				if h, _, err := heraldpb.ScanLogEntry(e.Data); err == nil && len(e.Data) > 0 && h.ProducerID == pid && h.BaseSequence == seq {
					index.CompareAndSwap(0, e.Index)
				}
			}
		case raftpb.MsgAppResp:
			i := index.Load()
			return !m.Reject && i != 0 && m.Index >= i
		}
		return false
	}
}

// either cuts what a or b cuts.
func either(a, b func(from, to uint64, m raftpb.Message) bool) func(from, to uint64, m raftpb.Message) bool {
	return func(from, to uint64, m raftpb.Message) bool { return a(from, to, m) || b(from, to, m) }
}

// TestIdempotentRetryAcrossLeaderChange runs a 3-replica group and moves
// the leadership between a produce and its retry, three ways; the retry
// never writes the batch a second time:
//  1. the batch committed, the old leader is cut off before its answer: the
//     new leader answers the retry with the original offsets;
//  2. the batch reached the followers' logs but not the commit (the append
//     responses for it are dropped): the new leader refuses the retry (THROTTLED)
//     until it applied its log, where the batch then is, and then answers
//     it as a duplicate;
//  3. the batch reached only the old leader's log: the new leader appends
//     the retry, and the old leader's copy is discarded when it rejoins.
func TestIdempotentRetryAcrossLeaderChange(t *testing.T) {
	sys := actor.NewActorSystem()
	nw := &net{sys: sys, pids: map[uint64]*actor.PID{}}
	reps := spawnGroupWith(t, sys, 3, func(r *replica, cfg *Config) {
		nw.pids[r.id] = actor.NewPID(sys.Address(), r.name)
		cfg.Transport = transport{n: nw, from: r.id}
	})
	all := map[uint64]bool{1: true, 2: true, 3: true}
	without := func(id uint64) map[uint64]bool {
		m := map[uint64]bool{}
		for k := range all {
			if k != id {
				m[k] = true
			}
		}
		return m
	}
	in := newInbox(sys)
	const acks = heraldpb.Acks_ACKS_ALL
	leader := leaderOf(t, reps, all)
	checkFor(t, 10*time.Second, "idempotent leader", func() bool { return leader.stats.Idempotent.Load() })
	var cur *replica
	curPID := func() *actor.PID { return cur.pid }

	// 1. Committed, then the leader is cut off.
	mustProduce(t, ask(t, sys, leader.pid, in, idemFrame(7, 0, acks, "a0", "a1")), 0, false)
	nw.setCut(isolate(leader.id))
	cur = leaderOf(t, reps, without(leader.id))
	mustProduce(t, askRetrying(t, sys, curPID, in, func() *heraldpb.Frame { return idemFrame(7, 0, acks, "a0", "a1") }), 0, true)
	nw.setCut(nil)
	leader = leaderOf(t, reps, all)

	// 2. In the followers' logs, not committed.
	hold := holdCommit(7, 2)
	nw.setCut(hold)
	sys.Root.RequestWithCustomSender(leader.pid, idemFrame(7, 2, acks, "b0", "b1"), in.pid)
	for _, r := range reps {
		r := r
		checkFor(t, 10*time.Second, fmt.Sprintf("replica %d holds the batch (leader %d)", r.id, leader.id), func() bool {
			if r.stats.EndOffset.Load() != 4 {
				t.Logf("replica %d: end %d hw %d leader %d", r.id, r.stats.EndOffset.Load(), r.stats.HighWatermark.Load(), r.stats.Leader.Load())
				return false
			}
			return true
		})
	}
	nw.setCut(either(isolate(leader.id), hold))
	mustFail(t, in.next(t), heraldpb.ErrorCode_NOT_LEADER) // the old leader stepped down
	cur = leaderOf(t, reps, without(leader.id))
	// The new leader cannot commit (no append responses), so it has not
	// applied the batch: it must not take the retry as new.
	checkFor(t, 10*time.Second, "the new leader's log written", func() bool { return cur.stats.Writable.Load() })
	if e := mustFail(t, ask(t, sys, cur.pid, in, idemFrame(7, 2, acks, "b0", "b1")), heraldpb.ErrorCode_THROTTLED); !e.Retriable {
		t.Fatalf("THROTTLED not retriable: %v", e)
	}
	if cur.stats.Idempotent.Load() {
		t.Fatal("a leader that has not applied its log reports it takes idempotent produces")
	}
	nw.setCut(isolate(leader.id))
	mustProduce(t, askRetrying(t, sys, curPID, in, func() *heraldpb.Frame { return idemFrame(7, 2, acks, "b0", "b1") }), 2, true)
	nw.setCut(nil)
	leader = leaderOf(t, reps, all)

	// 3. Only in the old leader's log.
	checkFor(t, 10*time.Second, "idempotent leader", func() bool { return leader.stats.Idempotent.Load() })
	nw.setCut(isolate(leader.id))
	sys.Root.RequestWithCustomSender(leader.pid, idemFrame(7, 4, acks, "c0"), in.pid)
	mustFail(t, in.next(t), heraldpb.ErrorCode_NOT_LEADER)
	cur = leaderOf(t, reps, without(leader.id))
	mustProduce(t, askRetrying(t, sys, curPID, in, func() *heraldpb.Frame { return idemFrame(7, 4, acks, "c0") }), 4, false)
	nw.setCut(nil)
	leader = leaderOf(t, reps, all)
	mustProduce(t, askRetrying(t, sys, func() *actor.PID { return leader.pid }, in, func() *heraldpb.Frame { return idemFrame(7, 5, acks, "d0") }), 5, false)

	for _, r := range reps {
		r := r
		checkFor(t, 10*time.Second, fmt.Sprintf("replica %d at hw 6", r.id), func() bool { return r.stats.HighWatermark.Load() == 6 })
		if got := readAll(t, sys, r.pid, 6); fmt.Sprint(got) != "[a0 a1 b0 b1 c0 d0]" {
			t.Fatalf("replica %d holds %v", r.id, got)
		}
	}
	// Whoever leads next knows every batch: every replica builds the table
	// when it applies.
	nw.setCut(isolate(leader.id))
	cur = leaderOf(t, reps, without(leader.id))
	mustProduce(t, askRetrying(t, sys, curPID, in, func() *heraldpb.Frame { return idemFrame(7, 5, acks, "d0") }), 5, true)
	mustProduce(t, askRetrying(t, sys, curPID, in, func() *heraldpb.Frame { return idemFrame(7, 2, acks, "b0", "b1") }), 2, true)
	nw.setCut(nil)
}
