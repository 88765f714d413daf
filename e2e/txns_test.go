package e2e

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// session is a transactional producer speaking raw frames.
type session struct {
	tc    *txnConn
	id    string
	pid   uint64
	epoch uint32
	seq   int64
}

func (tc *txnConn) initTxn(t testing.TB, id string, timeoutMs uint32) *session {
	t.Helper()
	f := tc.call(&heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{TransactionalId: id, TransactionTimeoutMs: timeoutMs}}})
	r := f.GetInitProducerIdResponse()
	if r == nil {
		t.Fatalf("init %s answered %v", id, f)
	}
	return &session{tc: tc, id: id, pid: r.ProducerId, epoch: r.ProducerEpoch}
}

// produce stages one record in the open transaction; it returns the
// answer (an error frame included).
func (s *session) produce(topic string, part uint32, value string) *heraldpb.Frame {
	f := s.tc.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: topic, Partition: proto.Uint32(part), Records: oneRecord(value),
		TransactionalId: s.id, ProducerId: s.pid, ProducerEpoch: s.epoch, BaseSequence: s.seq,
	}}})
	if f.GetProduceResponse() != nil {
		s.seq++
	}
	return f
}

// end commits or aborts; on success the session moves to the next epoch.
func (s *session) end(commit bool) *heraldpb.Frame {
	f := s.tc.call(&heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{
		TransactionalId: s.id, ProducerId: s.pid, ProducerEpoch: s.epoch, Commit: commit,
	}}})
	if r := f.GetEndTxnResponse(); r != nil && !r.AlreadyEnded {
		s.epoch, s.seq = r.NextEpoch, 0
	}
	return f
}

func valuesOf(t testing.TB, n node, topic string, parts int32) map[string]int {
	c := dial(t, n)
	got := map[string]int{}
	for p := range parts {
		for _, m := range readPartition(t, c, topic, p) {
			got[string(m.Value)]++
		}
	}
	return got
}

// waitValues polls the values of topic until cond holds, and returns
// them: a commit is answered once decided, and its records are appended
// right after.
func waitValues(t testing.TB, n node, topic string, parts int32, cond func(map[string]int) error) map[string]int {
	t.Helper()
	var got map[string]int
	checkFor(t, 15*time.Second, "the committed records of "+topic, func() error {
		got = valuesOf(t, n, topic, parts)
		return cond(got)
	})
	return got
}

// TestTxnCommitAbortAndEpochs: a transaction's records, staged on two
// partitions, are invisible until the commit, then on their partitions
// once each; an aborted one's never appear. The epoch moves on at every
// end: a replayed EndTxn of an earlier transaction is answered as already
// ended and does not touch the open one, and a delayed produce of an
// earlier transaction is refused, not staged in the open one.
func TestTxnCommitAbortAndEpochs(t *testing.T) {
	n := startInProc(t, t.TempDir())
	createTopic(t, dial(t, n), "out", 2)
	tc := dialTxn(t, n)
	s := tc.initTxn(t, "etl-1", 0)
	for i, v := range []string{"a0", "a1", "a2"} {
		if f := s.produce("out", uint32(i%2), v); f.GetProduceResponse() == nil {
			t.Fatalf("stage %s: %v", v, f)
		}
	}
	if got := valuesOf(t, n, "out", 2); len(got) != 0 {
		t.Fatalf("staged records visible before the commit: %v", got)
	}
	first := *s
	r := s.end(true).GetEndTxnResponse()
	if r == nil || r.Records != 3 || len(r.Partitions) != 2 || r.NextEpoch != first.epoch+1 {
		t.Fatalf("commit answered %v", r)
	}
	// Answered once decided; the appends follow.
	checkFor(t, 10*time.Second, "the committed records", func() error {
		if got := valuesOf(t, n, "out", 2); len(got) != 3 || got["a0"] != 1 || got["a1"] != 1 || got["a2"] != 1 {
			return fmt.Errorf("after the commit: %v", got)
		}
		return nil
	})
	// The next transaction: staged, then a replay of the first's commit
	// and a delayed produce of the first's epoch.
	if f := s.produce("out", 0, "b0"); f.GetProduceResponse() == nil {
		t.Fatalf("stage b0: %v", f)
	}
	if r := first.end(true).GetEndTxnResponse(); r == nil || !r.AlreadyEnded {
		t.Fatalf("replayed commit of epoch %d answered %v", first.epoch, r)
	}
	if e := first.end(false).GetError(); e.GetCode() != heraldpb.ErrorCode_INVALID_TXN_STATE {
		t.Fatalf("an abort of the committed epoch %d answered %v", first.epoch, e)
	}
	late := first
	late.seq = 3
	if e := late.produce("out", 0, "late").GetError(); e.GetCode() != heraldpb.ErrorCode_INVALID_TXN_STATE {
		t.Fatalf("a produce of the ended epoch answered %v", e)
	}
	if r := s.end(false).GetEndTxnResponse(); r == nil || r.Records != 1 {
		t.Fatalf("abort answered %v", r)
	}
	if got := valuesOf(t, n, "out", 2); len(got) != 3 || got["b0"] != 0 || got["late"] != 0 {
		t.Fatalf("after the abort: %v", got)
	}
	// A retried produce (same sequence) is staged once.
	s.produce("out", 1, "c0")
	s.seq--
	if f := s.produce("out", 1, "c0"); !f.GetProduceResponse().GetDuplicate() {
		t.Fatalf("a retried produce answered %v", f)
	}
	if r := s.end(true).GetEndTxnResponse(); r == nil || r.Records != 1 {
		t.Fatalf("commit answered %v", r)
	}
	checkFor(t, 10*time.Second, "the retried record, once", func() error {
		if got := valuesOf(t, n, "out", 2); got["c0"] != 1 {
			return fmt.Errorf("the retried record appears %d times", got["c0"])
		}
		return nil
	})
}

// TestTxnZombieFencing: two sessions of one transactional id. Once the
// second has started, the first's produce and commit are refused with
// PRODUCER_FENCED, and nothing it staged becomes visible.
func TestTxnZombieFencing(t *testing.T) {
	n := startInProc(t, t.TempDir())
	createTopic(t, dial(t, n), "out", 1)
	old := dialTxn(t, n).initTxn(t, "etl-1", 0)
	if f := old.produce("out", 0, "zombie-0"); f.GetProduceResponse() == nil {
		t.Fatalf("stage: %v", f)
	}
	cur := dialTxn(t, n).initTxn(t, "etl-1", 0)
	if cur.epoch <= old.epoch || cur.pid != old.pid {
		t.Fatalf("second session: pid %d epoch %d, first: pid %d epoch %d", cur.pid, cur.epoch, old.pid, old.epoch)
	}
	if e := old.produce("out", 0, "zombie-1").GetError(); e.GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
		t.Fatalf("the zombie's produce answered %v", e)
	}
	if e := old.end(true).GetError(); e.GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
		t.Fatalf("the zombie's commit answered %v", e)
	}
	cur.produce("out", 0, "live-0")
	if r := cur.end(true).GetEndTxnResponse(); r == nil {
		t.Fatal("the live session's commit failed")
	}
	if e := old.end(true).GetError(); e.GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
		t.Fatalf("the zombie's late commit answered %v", e)
	}
	waitValues(t, n, "out", 1, func(got map[string]int) error {
		if len(got) != 1 || got["live-0"] != 1 {
			return fmt.Errorf("the topic holds %v, want only live-0", got)
		}
		return nil
	})
	if v := metricSum(t, n, "herald_txn_fenced_total"); v < 3 {
		t.Errorf("herald_txn_fenced_total %v", v)
	}
}

// TestTxnTimeout: a transaction open longer than its timeout is aborted by
// the coordinator, and the producer's next request gets TXN_TIMED_OUT.
func TestTxnTimeout(t *testing.T) {
	n := startInProc(t, t.TempDir())
	createTopic(t, dial(t, n), "out", 1)
	tc := dialTxn(t, n)
	s := tc.initTxn(t, "slow", 300)
	s.produce("out", 0, "x")
	checkFor(t, 10*time.Second, "the timeout abort", func() error {
		f := tc.call(&heraldpb.Frame{Body: &heraldpb.Frame_ListTxn{ListTxn: &heraldpb.ListTxnRequest{Transactions: true, Id: "slow"}}})
		if l := f.GetListTxnResponse(); l == nil || len(l.Transactions) != 1 || l.Transactions[0].State != "empty" {
			return fmt.Errorf("list: %v", f)
		}
		return nil
	})
	if e := s.produce("out", 0, "y").GetError(); e.GetCode() != heraldpb.ErrorCode_TXN_TIMED_OUT {
		t.Fatalf("a produce after the timeout answered %v", e)
	}
	if e := s.end(true).GetError(); e.GetCode() != heraldpb.ErrorCode_TXN_TIMED_OUT {
		t.Fatalf("a commit after the timeout answered %v", e)
	}
	if got := valuesOf(t, n, "out", 1); len(got) != 0 {
		t.Fatalf("records of the timed-out transaction visible: %v", got)
	}
	s = tc.initTxn(t, "slow", 0)
	s.produce("out", 0, "z")
	if r := s.end(true).GetEndTxnResponse(); r == nil {
		t.Fatal("commit in the new session failed")
	}
}

// runTxnLoad runs transactional producers on their own connections until
// stop: each transaction stages 4 records over the topic's partitions and
// commits. It returns, per transaction ("w1-t7"), whether its commit was
// answered, and every value staged.
func runTxnLoad(t *testing.T, n node, parts uint32, workers int, stop <-chan struct{}) func() (committed map[string]bool, txnOf map[string]string) {
	var mu sync.Mutex
	committed := map[string]bool{}
	txnOf := map[string]string{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wc := &txnConn{rawConn: rawDial(t, n), next: 1}
			if wc.trySend(&heraldpb.Frame{Id: 1, Body: &heraldpb.Frame_Hello{Hello: &heraldpb.HelloRequest{ProtocolVersion: heraldpb.ProtocolVersion}}}) == nil {
				return
			}
			// call sends f, again while the answer is a retriable error
			// (the coordinator still loading, a busy partition); nil once
			// the connection fails or the error is final.
			call := func(f *heraldpb.Frame) *heraldpb.Frame {
				for range 100 {
					wc.next++
					f.Id = wc.next
					r := wc.trySend(f)
					if r == nil || r.GetError() == nil || !r.GetError().Retriable {
						return r
					}
					time.Sleep(max(time.Duration(r.GetError().RetryAfterMs)*time.Millisecond, 10*time.Millisecond)) // the broker's retry hint
				}
				return nil
			}
			r := call(&heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{TransactionalId: fmt.Sprintf("w%d", w), TransactionTimeoutMs: 3000}}}).GetInitProducerIdResponse()
			if r == nil {
				return
			}
			pid, epoch := r.ProducerId, r.ProducerEpoch
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				txn := fmt.Sprintf("w%d-t%d", w, i)
				for k := range 4 {
					v := fmt.Sprintf("%s-r%d", txn, k)
					mu.Lock()
					txnOf[v] = txn
					mu.Unlock()
					if call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
						Topic: "out", Partition: proto.Uint32(uint32(k) % parts), Records: oneRecord(v),
						TransactionalId: fmt.Sprintf("w%d", w), ProducerId: pid, ProducerEpoch: epoch, BaseSequence: int64(k),
					}}}).GetProduceResponse() == nil {
						return
					}
				}
				er := call(&heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{
					TransactionalId: fmt.Sprintf("w%d", w), ProducerId: pid, ProducerEpoch: epoch, Commit: true,
				}}}).GetEndTxnResponse()
				if er == nil {
					return
				}
				epoch = er.NextEpoch
				mu.Lock()
				committed[txn] = true
				mu.Unlock()
			}
		}()
	}
	return func() (map[string]bool, map[string]string) {
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return committed, txnOf
	}
}

// checkAllOrNothing checks got (value -> count) against the transactions:
// every record of a committed transaction once, and each other
// transaction either whole (its commit was decided but not answered) or
// absent.
func checkAllOrNothing(t *testing.T, got map[string]int, committed map[string]bool, txnOf map[string]string) {
	t.Helper()
	per := map[string][]string{}
	for v, txn := range txnOf {
		per[txn] = append(per[txn], v)
	}
	whole, none := 0, 0
	for txn, vs := range per {
		sort.Strings(vs)
		seen := 0
		for _, v := range vs {
			if got[v] > 1 {
				t.Errorf("%s appended %d times", v, got[v])
			}
			if got[v] > 0 {
				seen++
			}
		}
		switch {
		case committed[txn] && seen != len(vs):
			t.Errorf("committed transaction %s: %d of its %d records visible", txn, seen, len(vs))
		case seen != 0 && seen != len(vs):
			t.Errorf("transaction %s is partly visible: %d of %d records", txn, seen, len(vs))
		case seen == len(vs):
			whole++
		default:
			none++
		}
	}
	for v := range got {
		if _, ok := txnOf[v]; !ok {
			t.Errorf("%q is on the topic but was never staged", v)
		}
	}
	t.Logf("%d transactions: %d whole (%d commits answered), %d absent", len(per), whole, len(committed), none)
}

// TestTxnSurvivesKill: the broker is SIGKILLed while transactions commit.
// After the restart every transaction whose commit was answered is on the
// topic whole, once; every other one is whole (its commit was decided
// before the kill: the new coordinator finishes it) or absent (aborted
// after its timeout); none is partly visible, and no record is there
// twice.
func TestTxnSurvivesKill(t *testing.T) {
	n := startProc(t, t.TempDir())
	createTopic(t, dial(t, n), "out", 3)
	stop := make(chan struct{})
	wait := runTxnLoad(t, n, 3, 4, stop)
	checkFor(t, 30*time.Second, "transactions under way", func() error {
		if v := metricSum(t, n, "herald_txn_committed_records_total"); v < 400 {
			return fmt.Errorf("%v records committed", v)
		}
		return nil
	})
	n.Kill(t)
	close(stop)
	committed, txnOf := wait()
	n.Start(t)
	tc := dialTxn(t, n)
	checkFor(t, 30*time.Second, "no transaction open or committing", func() error {
		f := tc.call(&heraldpb.Frame{Body: &heraldpb.Frame_ListTxn{ListTxn: &heraldpb.ListTxnRequest{Transactions: true}}})
		for _, ti := range f.GetListTxnResponse().GetTransactions() {
			if ti.State != "empty" {
				return fmt.Errorf("%s is %s", ti.TransactionalId, ti.State)
			}
		}
		return nil
	})
	checkAllOrNothing(t, valuesOf(t, n, "out", 3), committed, txnOf)
}

// TestTxnSurvivesCoordinatorKill: the same in a 3-node cluster (RF=3),
// killing the node that runs the transaction coordinator while
// transactions commit; every replica of every partition is read.
func TestTxnSurvivesCoordinatorKill(t *testing.T) {
	txnClusterKill(t, func(_ *testing.T, _ *client.Client, coord uint32) uint32 { return coord })
}

// TestTxnSurvivesPartitionLeaderKill: the same, killing the leader of a
// partition the transactions write to (not the coordinator's node): the
// coordinator's appends there are retried until the partition's new
// leader takes them.
func TestTxnSurvivesPartitionLeaderKill(t *testing.T) {
	txnClusterKill(t, func(t *testing.T, c *client.Client, coord uint32) uint32 {
		for p := range 3 {
			if l := leaderOf(t, c, "out", p); l != coord {
				return l
			}
		}
		for id := uint32(1); id <= 3; id++ {
			if id != coord {
				return id // every partition is led by the coordinator's node: a follower of them all
			}
		}
		return 0
	})
}

// txnClusterKill runs transactions through the coordinator of a 3-node
// cluster, SIGKILLs the node victim picks, and checks every transaction
// all-or-nothing on every surviving replica. A victim that is the
// coordinator's node takes the load's connections with it.
func txnClusterKill(t *testing.T, victim func(t *testing.T, c *client.Client, coord uint32) uint32) {
	tc, c := clusterWithTopic(t, "out", 3)
	leader := awaitInternalLeader(t, c, "__txn")
	coord := tc.nodes[uint64(leader)]
	stop := make(chan struct{})
	wait := runTxnLoad(t, coord, 3, 4, stop)
	checkFor(t, 30*time.Second, "transactions under way", func() error {
		if v := metricSum(t, coord, "herald_txn_committed_records_total"); v < 200 {
			return fmt.Errorf("%v records committed", v)
		}
		return nil
	})
	v := victim(t, c, leader)
	tc.nodes[uint64(v)].Kill(t)
	delete(tc.nodes, uint64(v))
	if v != leader {
		// The load goes on through the faults for a while.
		base := metricSum(t, coord, "herald_txn_committed_records_total")
		checkFor(t, 30*time.Second, "transactions committed after the kill", func() error {
			if now := metricSum(t, coord, "herald_txn_committed_records_total"); now < base+100 {
				return fmt.Errorf("%v records committed since the kill", now-base)
			}
			return nil
		})
	}
	close(stop)
	committed, txnOf := wait()
	var next uint32
	var any *proc
	for _, p := range tc.nodes {
		any = p
	}
	checkFor(t, 30*time.Second, "a new coordinator with no transaction committing", func() error {
		if next = internalLeader(t, dialNode(t, any), "__txn"); next == 0 || next == v {
			return fmt.Errorf("leader of __txn: %d", next)
		}
		nc := dialTxn(t, tc.nodes[uint64(next)])
		f := nc.call(&heraldpb.Frame{Body: &heraldpb.Frame_ListTxn{ListTxn: &heraldpb.ListTxnRequest{Transactions: true}}})
		l := f.GetListTxnResponse()
		if l == nil {
			return fmt.Errorf("list: %v", f)
		}
		for _, ti := range l.Transactions {
			if ti.State == "committing" {
				return fmt.Errorf("%s is committing", ti.TransactionalId)
			}
		}
		return nil
	})
	// Every replica: once their high watermarks agree, each is checked.
	var addrs []string
	for _, p := range tc.nodes {
		addrs = append(addrs, p.Addr())
	}
	checkFor(t, 30*time.Second, "the replicas' high watermarks agree", func() error {
		for part := range 3 {
			hws, err := highWatermarksAt(t, "out", part, addrs...)
			if err != nil {
				return err
			}
			if slices.Min(hws) != slices.Max(hws) {
				return fmt.Errorf("partition %d: high watermarks %v", part, hws)
			}
		}
		return nil
	})
	for id, p := range tc.nodes {
		got := map[string]int{}
		cl := dialNode(t, p)
		for part := range int32(3) {
			for _, m := range readPartition(t, cl, "out", part) {
				got[string(m.Value)]++
			}
		}
		t.Logf("node %d:", id)
		checkAllOrNothing(t, got, committed, txnOf)
	}
}
