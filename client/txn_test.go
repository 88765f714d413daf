package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/client/fakebroker"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// isTxn reports whether f is a request only the transaction coordinator
// answers.
func isTxn(f *heraldpb.Frame) bool {
	return f.GetProduce().GetHalf() != nil || f.GetEndHalf() != nil || f.GetRegisterProducer() != nil || f.GetListTxn() != nil
}

// notCoordinator is a hook answering the requests that match with
// NOT_COORDINATOR naming leader, counting them in n.
func notCoordinator(n *atomic.Int64, leader uint32, match func(*heraldpb.Frame) bool) fakebroker.Hook {
	return count(n, fakebroker.Action{Error: &heraldpb.Error{Code: heraldpb.ErrorCode_NOT_COORDINATOR, Retriable: true, Leader: leader,
		Message: "not the transaction coordinator"}}, match)
}

// txnNodes starts fakes of nodes 1 and 2 of a cluster, each with topic
// "t" of 3 partitions, and a client bootstrapping from node 1.
func txnNodes(t *testing.T, opts ...fakebroker.Opt) (n1, n2 *fakebroker.Broker, c *Client) {
	t.Helper()
	n1 = newBroker(t, append([]fakebroker.Opt{fakebroker.Node(1), fakebroker.Topic("t", 3)}, opts...)...)
	n2 = newBroker(t, append([]fakebroker.Opt{fakebroker.Node(2), fakebroker.Topic("t", 3)}, opts...)...)
	brokers := []*heraldpb.BrokerInfo{{NodeId: 1, Addr: n1.Addr()}, {NodeId: 2, Addr: n2.Addr()}}
	n1.SetCluster(brokers, 1)
	n2.SetCluster(brokers, 1)
	return n1, n2, dial(t, n1)
}

var pg = HalfOptions{ProducerGroup: "pg"}

func TestHalfCommit(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 3))
	c := dial(t, b)
	ctx := testCtx(t)
	m := &Message{Topic: "t", Key: []byte("order-7"), Value: []byte("v"), Headers: []Header{{Key: "h", Value: []byte("1")}}, Partition: 9}
	opt := HalfOptions{ProducerGroup: "pg", CheckInterval: 1500 * time.Microsecond, MaxChecks: 3, KeepWhenExhausted: true}
	h, err := c.SendHalf(ctx, m, opt)
	if err != nil {
		t.Fatal(err)
	}
	want := int32(PartitionForKey(m.Key, 3))
	if h.ID == "" || h.Topic != "t" || h.Partition != want || h.ProducerGroup != "pg" {
		t.Fatalf("half %+v, want partition %d", h, want)
	}
	hs := b.Halves()
	if len(hs) != 1 {
		t.Fatalf("%d halves stored", len(hs))
	}
	req := hs[0].Request
	wantOpts := &heraldpb.HalfOptions{ProducerGroup: "pg", CheckIntervalMs: 2, MaxChecks: 3, OnExhausted: heraldpb.HalfExhaustedPolicy_HALF_EXHAUSTED_KEEP}
	if !proto.Equal(req.GetHalf(), wantOpts) || req.Partition == nil || int32(req.GetPartition()) != want || req.GetProducerId() != 0 {
		t.Fatalf("request %v", req)
	}
	rec, err := encodeRecord(nil, m)
	if err != nil || string(req.GetRecords()) != string(rec) {
		t.Fatalf("records %x, want %x (%v)", req.GetRecords(), rec, err)
	}
	if hw, _ := b.HighWatermark("t", uint32(want)); hw != 0 {
		t.Fatalf("a pending half is in the topic (high watermark %d)", hw)
	}

	list, total, err := c.ListTxn(ctx, "pg", 10)
	if err != nil || total != 1 || len(list) != 1 || list[0].GetId() != h.ID || list[0].GetMaxChecks() != 3 {
		t.Fatalf("list: %v %d %v", list, total, err)
	}
	if list, total, err := c.ListTxn(ctx, "other", 0); err != nil || total != 0 || len(list) != 0 {
		t.Fatalf("list of another group: %v %d %v", list, total, err)
	}
	if hi, err := c.DescribeTxn(ctx, h.ID); err != nil || hi.GetTopic() != "t" || hi.GetState() != "pending" {
		t.Fatalf("describe: %v %v", hi, err)
	}

	end, err := h.Commit(ctx)
	if err != nil || end.Offset != 0 || end.Partition != want || end.Topic != "t" || end.AlreadyEnded || !end.DeliverAt.IsZero() {
		t.Fatalf("commit: %+v %v", end, err)
	}
	if recs := b.Records("t", uint32(want)); len(recs) != 1 || string(recs[0].GetValue()) != "v" {
		t.Fatalf("committed records %v", recs)
	}
	if end, err := h.Commit(ctx); err != nil || !end.AlreadyEnded {
		t.Fatalf("second commit: %+v %v", end, err)
	}
	if err := h.Rollback(ctx); !IsCode(err, heraldpb.ErrorCode_TXN_NOT_FOUND) {
		t.Fatalf("rollback after commit: %v", err)
	}
	if _, err := c.DescribeTxn(ctx, h.ID); !IsCode(err, heraldpb.ErrorCode_TXN_NOT_FOUND) {
		t.Fatalf("describe after commit: %v", err)
	}
}

func TestHalfRollback(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	ctx := testCtx(t)
	h, err := c.SendHalf(ctx, &Message{Topic: "t", Value: []byte("v")}, pg)
	if err != nil {
		t.Fatal(err)
	}
	if req := b.Halves()[0].Request; req.Partition != nil {
		t.Fatalf("a half without a key named partition %d; the broker picks", req.GetPartition())
	}
	if err := h.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if hw, _ := b.HighWatermark("t", 0); hw != 0 {
		t.Fatalf("high watermark %d after a rollback", hw)
	}
	if _, err := c.EndHalf(ctx, h.ID, HalfCommit); !IsCode(err, heraldpb.ErrorCode_TXN_NOT_FOUND) {
		t.Fatalf("commit after rollback: %v", err)
	}
	if _, err := c.EndHalf(ctx, "nope", HalfRollback); !IsCode(err, heraldpb.ErrorCode_TXN_NOT_FOUND) {
		t.Fatalf("unknown id: %v", err)
	}
	h2, err := c.SendHalf(ctx, &Message{Topic: "t", Value: []byte("w")}, pg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.EndHalfManually(ctx, h2.ID, HalfRollback); err != nil {
		t.Fatal(err)
	}
	n := len(b.Ends())
	if _, err := c.EndHalf(ctx, h2.ID, HalfUnknown); err == nil || len(b.Ends()) != n {
		t.Fatalf("EndHalf(HalfUnknown): %v, sent %d", err, len(b.Ends())-n)
	}
	ends := b.Ends()
	if last := ends[len(ends)-1].Request; !last.GetManual() || last.GetFromCheck() || last.GetAction() != HalfRollback {
		t.Fatalf("manual rollback sent %v", last)
	}
	for _, e := range ends[:len(ends)-1] {
		if e.Request.GetManual() {
			t.Fatalf("EndHalf sent %v", e.Request)
		}
	}
}

func TestHalfDelayedAndInvalid(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	ctx := testCtx(t)
	h, err := c.SendHalf(ctx, &Message{Topic: "t", Value: []byte("v"), Delay: 1500 * time.Millisecond}, pg)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if _, err := c.SendHalf(ctx, &Message{Topic: "t", Value: []byte("w"), DeliverAt: at}, pg); err != nil {
		t.Fatal(err)
	}
	hs := b.Halves()
	if hs[0].Request.GetDelayMs() != 1500 || hs[1].Request.GetDeliverAtMs() != at.UnixMilli() {
		t.Fatalf("requests %v, %v", hs[0].Request, hs[1].Request)
	}
	end, err := h.Commit(ctx)
	if err != nil || end.Offset != -1 || end.DeliverAt.IsZero() {
		t.Fatalf("commit of a delayed half: %+v %v", end, err)
	}

	for _, x := range []struct {
		m    *Message
		opt  HalfOptions
		want string
	}{
		{&Message{Topic: "t"}, HalfOptions{}, "ProducerGroup is required"},
		{&Message{Topic: "t"}, HalfOptions{ProducerGroup: "pg", MaxChecks: -1, CheckInterval: -time.Second}, "CheckInterval -1s out of range\nherald: half: MaxChecks -1"},
		{&Message{}, pg, "without topic"},
		{&Message{Topic: "t", Delay: time.Second, DeliverAt: at}, pg, "not both"},
	} {
		if _, err := c.SendHalf(ctx, x.m, x.opt); err == nil || !strings.Contains(err.Error(), x.want) {
			t.Errorf("SendHalf(%+v, %+v): %v, want %q", x.m, x.opt, err, x.want)
		}
	}
	if len(b.Halves()) != 2 {
		t.Fatalf("invalid halves were sent: %d stored", len(b.Halves()))
	}
}

// Transaction requests go to the node a NOT_COORDINATOR names, which the
// client remembers apart from the groups coordinator.
func TestHalfFollowsTxnCoordinator(t *testing.T) {
	n1, n2, c := txnNodes(t)
	ctx := testCtx(t)
	var refused, first atomic.Int64
	// The first answer names nobody (an election): the client pauses and
	// asks again.
	n1.SetHook(func(conn int, f *heraldpb.Frame) fakebroker.Action {
		if !isTxn(f) {
			return fakebroker.Action{}
		}
		if first.Add(1) == 1 {
			return notCoordinator(&refused, 0, isTxn)(conn, f)
		}
		return notCoordinator(&refused, 2, isTxn)(conn, f)
	})
	var groups2 atomic.Int64
	n2.SetHook(count(&groups2, fakebroker.Action{}, func(f *heraldpb.Frame) bool { return f.GetListGroups() != nil }))
	h, err := c.SendHalf(ctx, &Message{Topic: "t", Value: []byte("v")}, pg)
	if err != nil {
		t.Fatal(err)
	}
	if refused.Load() != 2 || len(n1.Halves()) != 0 || len(n2.Halves()) != 1 || c.txn.node.Load() != 2 {
		t.Fatalf("refused %d, halves %d on node 1 and %d on node 2, coordinator %d", refused.Load(), len(n1.Halves()), len(n2.Halves()), c.txn.node.Load())
	}
	if _, err := h.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.ListTxn(ctx, "", 0); err != nil {
		t.Fatal(err)
	}
	if refused.Load() != 2 || len(n2.Ends()) != 1 {
		t.Fatalf("after the move: node 1 refused %d, node 2 ended %d", refused.Load(), len(n2.Ends()))
	}
	// Consumer groups stay with their own coordinator (unknown here: any node).
	if _, err := c.ListGroups(ctx); err != nil {
		t.Fatal(err)
	}
	if c.groups.node.Load() != 0 || groups2.Load() != 0 {
		t.Fatalf("groups coordinator %d, node 2 answered %d ListGroups", c.groups.node.Load(), groups2.Load())
	}
}

// A half produce whose outcome is unknown is not sent again: a second
// half would be a second message.
func TestHalfNoRetryWhenOutcomeUnknown(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b, WithRequestTimeout(200*time.Millisecond))
	ctx := testCtx(t)
	isHalf := func(f *heraldpb.Frame) bool { return f.GetProduce().GetHalf() != nil }

	var dropped atomic.Int64
	b.SetHook(count(&dropped, fakebroker.Action{Drop: true}, isHalf))
	_, err := c.SendHalf(ctx, &Message{Topic: "t", Value: []byte("v")}, pg)
	if !errors.Is(err, ErrRequestTimeout) || !IsOutcomeUnknown(err) || dropped.Load() != 1 {
		t.Fatalf("timed out: %v (outcome unknown: %v), sent %d times", err, IsOutcomeUnknown(err), dropped.Load())
	}

	var lost atomic.Int64
	b.SetHook(count(&lost, fakebroker.Action{LoseReply: true}, isHalf))
	_, err = c.SendHalf(ctx, &Message{Topic: "t", Value: []byte("w")}, pg)
	if !errors.Is(err, ErrConnectionLost) || !IsOutcomeUnknown(err) || lost.Load() != 1 || len(b.Halves()) != 1 {
		t.Fatalf("reply lost: %v, sent %d times, %d halves stored", err, lost.Load(), len(b.Halves()))
	}

	// Refusals that stored nothing are retried.
	var throttled atomic.Int64
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if isHalf(f) && throttled.Add(1) <= 2 {
			return fakebroker.Action{Error: heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "busy")}
		}
		return fakebroker.Action{}
	})
	if _, err := c.SendHalf(ctx, &Message{Topic: "t", Value: []byte("x")}, pg); err != nil || throttled.Load() != 3 || len(b.Halves()) != 2 {
		t.Fatalf("throttled twice: %v, sent %d times, %d halves stored", err, throttled.Load(), len(b.Halves()))
	}
	// EndHalf is idempotent: it is sent again after a timeout.
	h := b.Halves()[1]
	var endDropped atomic.Int64
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetEndHalf() != nil && endDropped.Add(1) == 1 {
			return fakebroker.Action{Drop: true}
		}
		return fakebroker.Action{}
	})
	if _, err := c.EndHalf(ctx, h.ID, HalfCommit); err != nil || endDropped.Load() != 2 {
		t.Fatalf("commit after a timeout: %v, sent %d times", err, endDropped.Load())
	}
}

// checkerRecorder is a TransactionChecker deciding by the message's value
// ("yes" commits, "no" rolls back, "boom" panics, anything else is not
// known yet) and recording what it saw.
type checkerRecorder struct {
	mu   sync.Mutex
	seen []*HalfCheck
}

func (r *checkerRecorder) check(_ context.Context, hc *HalfCheck) HalfAction {
	r.mu.Lock()
	r.seen = append(r.seen, hc)
	r.mu.Unlock()
	switch string(hc.Messages[0].Value) {
	case "yes":
		return HalfCommit
	case "no":
		return HalfRollback
	case "boom":
		panic("checker bug")
	}
	return HalfUnknown
}

// checkAnswers returns the from_check EndHalf requests received, by id.
func checkAnswers(b *fakebroker.Broker) map[string]*heraldpb.EndHalfRequest {
	out := map[string]*heraldpb.EndHalfRequest{}
	for _, e := range b.Ends() {
		if e.Request.GetFromCheck() {
			out[e.Request.GetId()] = e.Request
		}
	}
	return out
}

func TestTxnCheckerAnswers(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 2))
	c := dial(t, b)
	ctx := testCtx(t)
	var rec checkerRecorder
	stop, err := c.RegisterTransactionChecker(ctx, "pg", rec.check)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RegisterTransactionChecker(ctx, "pg", rec.check); err == nil {
		t.Fatal("a second checker of the same group registered")
	}
	if p := b.Producers("pg"); len(p) != 1 {
		t.Fatalf("producers of pg: %v", p)
	}
	want := map[string]HalfAction{"yes": HalfCommit, "no": HalfRollback, "boom": HalfUnknown, "maybe": HalfUnknown}
	ids := map[string]string{} // id -> value
	for _, v := range []string{"yes", "no", "boom", "maybe"} {
		h, err := c.SendHalf(ctx, &Message{Topic: "t", Key: []byte(v), Value: []byte(v)}, HalfOptions{ProducerGroup: "pg", MaxChecks: 4})
		if err != nil {
			t.Fatal(err)
		}
		ids[h.ID] = v
		if _, err := b.SendHalfCheck(h.ID); err != nil {
			t.Fatal(err)
		}
	}
	// A check whose records do not decode is answered unknown.
	conn := b.Producers("pg")[0]
	if err := b.Push(conn, &heraldpb.Frame{Body: &heraldpb.Frame_HalfCheck{HalfCheck: &heraldpb.HalfCheck{
		Id: "garbled", ProducerGroup: "pg", Topic: "t", Records: []byte{0xff}, Check: 1, MaxChecks: 1}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "5 answers", func() bool { return len(checkAnswers(b)) == 5 })
	answers := checkAnswers(b)
	for id, v := range ids {
		if a := answers[id]; a.GetAction() != want[v] {
			t.Errorf("%s (%s) answered %v, want %v", id, v, a.GetAction(), want[v])
		}
	}
	if a := answers["garbled"]; a.GetAction() != HalfUnknown {
		t.Errorf("garbled check answered %v", a)
	}
	for _, h := range b.Halves() {
		if wantState := map[string]string{"yes": "committed", "no": "rolled back"}[ids[h.ID]]; wantState != "" && h.State != wantState {
			t.Errorf("%s (%s) is %s, want %s", h.ID, ids[h.ID], h.State, wantState)
		}
	}
	rec.mu.Lock()
	for _, hc := range rec.seen {
		m := hc.Messages[0]
		if hc.ProducerGroup != "pg" || hc.Topic != "t" || hc.Check != 1 || hc.MaxChecks != 4 || time.Since(hc.Created) > time.Minute ||
			len(hc.Messages) != 1 || m.Offset != -1 || m.Topic != "t" || m.Partition != hc.Partition || string(m.Key) != ids[hc.ID] ||
			hc.Partition != int32(PartitionForKey(m.Key, 2)) {
			t.Errorf("check %+v, message %+v", hc, m)
		}
	}
	rec.mu.Unlock()

	stop()
	regs := b.Registrations()
	if last := regs[len(regs)-1]; !last.Request.GetUnregister() || last.Request.GetProducerGroup() != "pg" || len(b.Producers("pg")) != 0 {
		t.Fatalf("after stop: last registration %v, producers %v", last.Request, b.Producers("pg"))
	}
	stop() // again: nothing
	// The group can be registered again.
	stop, err = c.RegisterTransactionChecker(ctx, "pg", rec.check)
	if err != nil {
		t.Fatal(err)
	}
	stop()
}

// At most maxChecksRunning checks run at once; the checks beyond them
// queue and are answered as the running ones finish; a check of a half
// being checked (or queued) already is not run twice.
func TestTxnCheckerBounded(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	ctx := testCtx(t)
	release := make(chan struct{})
	var started atomic.Int64
	stop, err := c.RegisterTransactionChecker(ctx, "pg", func(ctx context.Context, hc *HalfCheck) HalfAction {
		started.Add(1)
		<-release
		return HalfRollback
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	rec, _ := encodeRecord(nil, &Message{Value: []byte("v")})
	conn := b.Producers("pg")[0]
	push := func(id string) {
		if err := b.Push(conn, &heraldpb.Frame{Body: &heraldpb.Frame_HalfCheck{HalfCheck: &heraldpb.HalfCheck{
			Id: id, ProducerGroup: "pg", Topic: "t", Records: rec, Check: 1, MaxChecks: 1}}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < maxChecksRunning+4; i++ {
		push(fmt.Sprintf("x%d", i))
	}
	push("x0") // being checked
	// A round trip on the connection: the reader has handled every push
	// before the answer.
	if _, _, err := c.ListTxn(ctx, "", 0); err != nil {
		t.Fatal(err)
	}
	k := c.checkers["pg"]
	waitFor(t, 5*time.Second, "the workers started", func() bool { return started.Load() == maxChecksRunning })
	k.mu.Lock()
	held, workers, queued := len(k.running), k.workers, len(k.queue)
	k.mu.Unlock()
	if held != maxChecksRunning+4 || workers != maxChecksRunning || queued != 4 {
		t.Fatalf("%d checks held, %d workers, %d queued; want %d, %d, 4", held, workers, queued, maxChecksRunning+4, maxChecksRunning)
	}
	if n := started.Load(); n != maxChecksRunning {
		t.Fatalf("checker ran %d times before any finished, want %d", n, maxChecksRunning)
	}
	close(release)
	waitFor(t, 5*time.Second, "the answers", func() bool { return len(checkAnswers(b)) == maxChecksRunning+4 })
	if n := started.Load(); n != maxChecksRunning+4 {
		t.Fatalf("checker ran %d times, want %d", n, maxChecksRunning+4)
	}
	if len(b.Ends()) != maxChecksRunning+4 {
		t.Fatalf("%d answers sent, want %d", len(b.Ends()), maxChecksRunning+4)
	}
}

// The checker registers again every heartbeat and at once on a new
// connection after its connection died.
func TestTxnCheckerHeartbeat(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1), fakebroker.TxnHeartbeat(20*time.Millisecond))
	c := dial(t, b)
	ctx := testCtx(t)
	var rec checkerRecorder
	stop, err := c.RegisterTransactionChecker(ctx, "pg", rec.check)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	waitFor(t, 5*time.Second, "3 heartbeats", func() bool { return len(b.Registrations()) >= 4 })
	first := b.Registrations()[0].Conn
	b.DropConnections()
	waitFor(t, 5*time.Second, "a registration on a new connection", func() bool {
		p := b.Producers("pg")
		return len(p) == 1 && p[0] != first
	})
	h, err := c.SendHalf(ctx, &Message{Topic: "t", Value: []byte("yes")}, pg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.SendHalfCheck(h.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the answer", func() bool { return checkAnswers(b)[h.ID].GetAction() == HalfCommit })
}

// The checker registers with the node a NOT_COORDINATOR names, and moves
// when the coordinator moves.
func TestTxnCheckerFollowsCoordinator(t *testing.T) {
	n1, n2, c := txnNodes(t, fakebroker.TxnHeartbeat(20*time.Millisecond))
	ctx := testCtx(t)
	var refused1, refused2 atomic.Int64
	n1.SetHook(notCoordinator(&refused1, 2, isTxn))
	var rec checkerRecorder
	stop, err := c.RegisterTransactionChecker(ctx, "pg", rec.check)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if len(n2.Producers("pg")) != 1 || refused1.Load() != 1 {
		t.Fatalf("node 2 producers %v, node 1 refused %d", n2.Producers("pg"), refused1.Load())
	}
	// The coordinator moves to node 1.
	n1.SetHook(nil)
	n2.SetHook(notCoordinator(&refused2, 1, isTxn))
	waitFor(t, 5*time.Second, "the registration on node 1", func() bool { return len(n1.Producers("pg")) == 1 })
	h, err := c.SendHalf(ctx, &Message{Topic: "t", Value: []byte("no")}, pg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n1.SendHalfCheck(h.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the answer", func() bool { return checkAnswers(n1)[h.ID].GetAction() == HalfRollback })
	if c.groups.node.Load() != 0 {
		t.Fatalf("groups coordinator %d", c.groups.node.Load())
	}
}

func TestTxnSendInTransaction(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	ctx := testCtx(t)
	state := func(h *Half) string {
		for _, x := range b.Halves() {
			if x.ID == h.ID {
				return x.State
			}
		}
		return "missing"
	}
	send := func(local func(context.Context, *Half) error) (*Half, error) {
		return c.SendInTransaction(ctx, &Message{Topic: "t", Value: []byte("v")}, pg, local)
	}

	var seen *Half
	h, err := send(func(_ context.Context, h *Half) error { seen = h; return nil })
	if err != nil || h == nil || seen != h || state(h) != "committed" {
		t.Fatalf("nil: %v %v, %s", h, err, state(h))
	}
	declined := fmt.Errorf("card declined: %w", ErrRollback)
	h, err = send(func(context.Context, *Half) error { return declined })
	if err != declined || h == nil || state(h) != "rolled back" {
		t.Fatalf("ErrRollback: %v %v, %s", h, err, state(h))
	}
	dbDown := errors.New("database down")
	ends := len(b.Ends())
	h, err = send(func(context.Context, *Half) error { return dbDown })
	if err != dbDown || h == nil || state(h) != "pending" {
		t.Fatalf("another error: %v %v, %s", h, err, state(h))
	}
	h, err = send(func(context.Context, *Half) error { panic("local bug") })
	if err == nil || !strings.Contains(err.Error(), "panicked: local bug") || errors.Is(err, ErrRollback) || h == nil || state(h) != "pending" {
		t.Fatalf("panic: %v %v, %s", h, err, state(h))
	}
	if len(b.Ends()) != ends {
		t.Fatalf("halves left to the check-back were ended: %v", b.Ends()[ends:])
	}
	ran := false
	if _, err := c.SendInTransaction(ctx, &Message{Topic: "nope"}, pg, func(context.Context, *Half) error { ran = true; return nil }); !IsCode(err, heraldpb.ErrorCode_TOPIC_NOT_FOUND) || ran {
		t.Fatalf("half refused: %v, local ran %v", err, ran)
	}
}
