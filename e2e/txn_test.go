package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// txnConn is a raw protocol connection for the half-message tests: it
// sends requests and collects the HalfCheck pushes that arrive meanwhile.
type txnConn struct {
	*rawConn
	next   uint64
	checks []*heraldpb.HalfCheck
}

func dialTxn(t testing.TB, n node) *txnConn {
	tc := &txnConn{rawConn: rawDial(t, n), next: 1}
	if f := tc.call(&heraldpb.Frame{Body: &heraldpb.Frame_Hello{Hello: &heraldpb.HelloRequest{ProtocolVersion: heraldpb.ProtocolVersion}}}); f.GetHelloResponse() == nil {
		t.Fatalf("hello: %v", f)
	}
	return tc
}

// call sends f and returns its answer.
func (tc *txnConn) call(f *heraldpb.Frame) *heraldpb.Frame {
	tc.t.Helper()
	tc.next++
	f.Id = tc.next
	tc.send(f)
	for {
		r := tc.read()
		if r == nil {
			tc.t.Fatalf("connection closed waiting for the answer to %T", f.Body)
		}
		if r.Id == 0 {
			if hc := r.GetHalfCheck(); hc != nil {
				tc.checks = append(tc.checks, hc)
			}
			continue
		}
		if r.Id == f.Id {
			return r
		}
	}
}

// waitCheck reads frames until a HalfCheck arrives (or one already has).
func (tc *txnConn) waitCheck() *heraldpb.HalfCheck {
	tc.t.Helper()
	for len(tc.checks) == 0 {
		r := tc.read()
		if r == nil {
			tc.t.Fatal("connection closed waiting for a check-back")
		}
		if hc := r.GetHalfCheck(); hc != nil {
			tc.checks = append(tc.checks, hc)
		}
	}
	hc := tc.checks[0]
	tc.checks = tc.checks[1:]
	return hc
}

func oneRecord(value string) []byte {
	b, err := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte(value)}}})
	if err != nil {
		panic(err)
	}
	return b
}

// sendHalf stores a half message and returns its id.
func (tc *txnConn) sendHalf(topic, value string, opt *heraldpb.HalfOptions) string {
	tc.t.Helper()
	f := tc.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: topic, Partition: proto.Uint32(0), Records: oneRecord(value), Half: opt,
	}}})
	pr := f.GetProduceResponse()
	if pr == nil || pr.HalfId == "" {
		tc.t.Fatalf("half produce answered %v", f)
	}
	return pr.HalfId
}

func (tc *txnConn) end(id string, a heraldpb.HalfAction, fromCheck bool) *heraldpb.Frame {
	tc.t.Helper()
	return tc.call(&heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{Id: id, Action: a, FromCheck: fromCheck}}})
}

func (tc *txnConn) list(group string) []*heraldpb.HalfInfo {
	tc.t.Helper()
	f := tc.call(&heraldpb.Frame{Body: &heraldpb.Frame_ListTxn{ListTxn: &heraldpb.ListTxnRequest{ProducerGroup: group}}})
	if f.GetListTxnResponse() == nil {
		tc.t.Fatalf("list txn answered %v", f)
	}
	return f.GetListTxnResponse().Halves
}

func values(t testing.TB, n node, topic string) []string {
	c := dial(t, n)
	var out []string
	for _, m := range readPartition(t, c, topic, 0) {
		out = append(out, string(m.Value))
	}
	return out
}

// TestHalfCommitAndRollback: a half message is invisible until committed,
// then appended once with its id; a rolled-back one never appears; ends
// are idempotent, and the wrong second end is a typed TXN_NOT_FOUND.
func TestHalfCommitAndRollback(t *testing.T) {
	n := startInProc(t, t.TempDir())
	createTopic(t, dial(t, n), "orders", 1)
	tc := dialTxn(t, n)
	opt := &heraldpb.HalfOptions{ProducerGroup: "order-service", CheckIntervalMs: 60_000}
	a := tc.sendHalf("orders", "a", opt)
	b := tc.sendHalf("orders", "b", opt)
	if got := values(t, n, "orders"); len(got) != 0 {
		t.Fatalf("half messages visible before commit: %v", got)
	}
	if l := tc.list("order-service"); len(l) != 2 || l[0].Id != a || l[0].State != "pending" || l[1].Id != b {
		t.Fatalf("txn list: %v", l)
	}
	r := tc.end(a, heraldpb.HalfAction_HALF_COMMIT, false).GetEndHalfResponse()
	if r == nil || r.BaseOffset != 0 || r.Topic != "orders" {
		t.Fatalf("commit answered %v", r)
	}
	if r := tc.end(b, heraldpb.HalfAction_HALF_ROLLBACK, false).GetEndHalfResponse(); r == nil || r.BaseOffset != -1 {
		t.Fatalf("rollback answered %v", r)
	}
	c := dial(t, n)
	msgs := readPartition(t, c, "orders", 0)
	if len(msgs) != 1 || string(msgs[0].Value) != "a" || headerOf(msgs[0], "herald-half-id") != a {
		t.Fatalf("after commit of %s and rollback of %s: %v", a, b, msgs)
	}
	if r := tc.end(a, heraldpb.HalfAction_HALF_COMMIT, false).GetEndHalfResponse(); r == nil || !r.AlreadyEnded {
		t.Fatalf("second commit answered %v", r)
	}
	if e := tc.end(a, heraldpb.HalfAction_HALF_ROLLBACK, false).GetError(); e.GetCode() != heraldpb.ErrorCode_TXN_NOT_FOUND {
		t.Fatalf("rollback of a committed half answered %v", e)
	}
	if e := tc.end(b, heraldpb.HalfAction_HALF_COMMIT, false).GetError(); e.GetCode() != heraldpb.ErrorCode_TXN_NOT_FOUND {
		t.Fatalf("commit of a rolled-back half answered %v", e)
	}
	if e := tc.end("999999", heraldpb.HalfAction_HALF_COMMIT, false).GetError(); e.GetCode() != heraldpb.ErrorCode_TXN_NOT_FOUND {
		t.Fatalf("commit of an unknown id answered %v", e)
	}
	for _, bad := range []*heraldpb.ProduceRequest{
		{Topic: "orders", Records: oneRecord("x"), Half: &heraldpb.HalfOptions{}},
		{Topic: "nope", Records: oneRecord("x"), Half: opt},
		{Topic: "orders", Records: oneRecord("x"), Half: opt, ProducerId: 7, Partition: proto.Uint32(0)},
		{Topic: "__txn", Records: oneRecord("x"), Half: opt},
	} {
		if e := tc.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: bad}}).GetError(); e == nil || e.Retriable {
			t.Errorf("bad half %v answered %v, want a final error", bad, e)
		}
	}
	if l := tc.list(""); len(l) != 0 {
		t.Fatalf("halves left pending: %v", l)
	}
}

// TestHalfCheckBack: a half nobody ends is checked back over the
// connection of a registered producer of its group, and its answer
// decides; with no producer connected, the checks run out and the half is
// rolled back (the default policy), or kept with policy keep.
func TestHalfCheckBack(t *testing.T) {
	n := startInProc(t, t.TempDir())
	createTopic(t, dial(t, n), "orders", 1)
	sender := dialTxn(t, n)
	checker := dialTxn(t, n)
	if f := checker.call(&heraldpb.Frame{Body: &heraldpb.Frame_RegisterProducer{RegisterProducer: &heraldpb.RegisterProducerRequest{ProducerGroup: "g"}}}); f.GetRegisterProducerResponse() == nil {
		t.Fatalf("register answered %v", f)
	}
	fast := &heraldpb.HalfOptions{ProducerGroup: "g", CheckIntervalMs: 200, MaxChecks: 3}
	id := sender.sendHalf("orders", "checked", fast)
	hc := checker.waitCheck()
	if hc.Id != id || hc.Topic != "orders" || hc.Check != 1 || hc.MaxChecks != 3 {
		t.Fatalf("check-back %v for half %s", hc, id)
	}
	// Unknown first: asked again.
	if r := checker.end(id, heraldpb.HalfAction_HALF_UNKNOWN, true).GetEndHalfResponse(); r == nil {
		t.Fatal("unknown not accepted")
	}
	if hc = checker.waitCheck(); hc.Id != id || hc.Check != 2 {
		t.Fatalf("second check-back %v", hc)
	}
	if r := checker.end(id, heraldpb.HalfAction_HALF_COMMIT, true).GetEndHalfResponse(); r == nil || r.BaseOffset != 0 {
		t.Fatalf("commit from the check answered %v", r)
	}
	if got := values(t, n, "orders"); !slices.Equal(got, []string{"checked"}) {
		t.Fatalf("after the check's commit: %v", got)
	}

	// Group "nobody" has no producer: 2 checks, then rolled back; the
	// other is kept.
	gone := sender.sendHalf("orders", "exhausted", &heraldpb.HalfOptions{ProducerGroup: "nobody", CheckIntervalMs: 100, MaxChecks: 2})
	kept := sender.sendHalf("orders", "kept", &heraldpb.HalfOptions{ProducerGroup: "nobody", CheckIntervalMs: 100, MaxChecks: 2, OnExhausted: heraldpb.HalfExhaustedPolicy_HALF_EXHAUSTED_KEEP})
	checkFor(t, 20*time.Second, "the exhausted half rolled back and the other kept", func() error {
		l := sender.list("nobody")
		if len(l) != 1 || l[0].Id != kept || l[0].State != "kept" || l[0].Checks != 2 {
			return fmt.Errorf("pending %v (rolled back %s, kept %s)", l, gone, kept)
		}
		return nil
	})
	if e := sender.end(gone, heraldpb.HalfAction_HALF_COMMIT, false).GetError(); e.GetCode() != heraldpb.ErrorCode_TXN_NOT_FOUND {
		t.Fatalf("commit after the exhausted rollback answered %v", e)
	}
	if r := sender.call(&heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{Id: kept, Action: heraldpb.HalfAction_HALF_COMMIT, Manual: true}}}).GetEndHalfResponse(); r == nil || r.BaseOffset != 1 {
		t.Fatalf("manual commit of the kept half answered %v", r)
	}
	if got := values(t, n, "orders"); !slices.Equal(got, []string{"checked", "kept"}) {
		t.Fatalf("at the end: %v", got)
	}
	if v := metricSum(t, n, `herald_txn_checks_exhausted_total{policy="rollback"}`); v != 1 {
		t.Errorf("exhausted rollbacks: %v", v)
	}
}

// TestHalfDelayedCommit: a delayed half is committed at once and appended
// at its time, not before.
func TestHalfDelayedCommit(t *testing.T) {
	n := startInProc(t, t.TempDir())
	createTopic(t, dial(t, n), "orders", 1)
	tc := dialTxn(t, n)
	f := tc.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "orders", Partition: proto.Uint32(0), Records: oneRecord("later"), DelayMs: 1500,
		Half: &heraldpb.HalfOptions{ProducerGroup: "g", CheckIntervalMs: 60_000},
	}}})
	pr := f.GetProduceResponse()
	if pr == nil {
		t.Fatalf("delayed half answered %v", f)
	}
	at := time.UnixMilli(pr.DeliverAtMs)
	if r := tc.end(pr.HalfId, heraldpb.HalfAction_HALF_COMMIT, false).GetEndHalfResponse(); r == nil || r.BaseOffset != -1 || r.DeliverAtMs != pr.DeliverAtMs {
		t.Fatalf("commit of a delayed half answered %v", r)
	}
	if l := tc.list(""); len(l) != 1 || l[0].State != "committed" {
		t.Fatalf("list after the commit: %v", l)
	}
	c := dial(t, n)
	checkFor(t, 15*time.Second, "the delayed half", func() error {
		msgs := readPartition(t, c, "orders", 0)
		if len(msgs) == 0 {
			return fmt.Errorf("not yet")
		}
		if now := time.Now(); len(msgs) != 1 || msgs[0].Timestamp.Before(at) && now.Before(at) {
			return fmt.Errorf("got %v at %v, due %v", msgs, now, at)
		}
		return nil
	})
}

// TestHalfSurvivesKill: the broker is SIGKILLed while half messages are
// pending and while commits are being appended. After the restart the
// pending halves are still there and checked back, and every half whose
// commit was answered is on its topic exactly once; none appears twice.
func TestHalfSurvivesKill(t *testing.T) {
	n := startProc(t, t.TempDir())
	createTopic(t, dial(t, n), "orders", 1)
	tc := dialTxn(t, n)
	opt := &heraldpb.HalfOptions{ProducerGroup: "g", CheckIntervalMs: 300}
	pending := tc.sendHalf("orders", "pending", opt)

	// Committers on their own connections, until the kill.
	var mu sync.Mutex
	committed := map[string]bool{} // value -> commit answered
	sent := map[string]string{}    // value -> id
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wc := &txnConn{rawConn: rawDial(t, n), next: 1}
			if wc.trySend(&heraldpb.Frame{Id: 1, Body: &heraldpb.Frame_Hello{Hello: &heraldpb.HelloRequest{ProtocolVersion: heraldpb.ProtocolVersion}}}) == nil {
				return
			}
			for i := 0; ; i++ {
				v := fmt.Sprintf("w%d-%d", w, i)
				wc.next++
				r := wc.trySend(&heraldpb.Frame{Id: wc.next, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
					Topic: "orders", Partition: proto.Uint32(0), Records: oneRecord(v), Half: opt,
				}}})
				if r.GetProduceResponse() == nil {
					return
				}
				id := r.GetProduceResponse().HalfId
				mu.Lock()
				sent[v] = id
				mu.Unlock()
				wc.next++
				if wc.trySend(&heraldpb.Frame{Id: wc.next, Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{Id: id, Action: heraldpb.HalfAction_HALF_COMMIT}}}).GetEndHalfResponse() == nil {
					return
				}
				mu.Lock()
				committed[v] = true
				mu.Unlock()
			}
		}()
	}
	checkFor(t, 30*time.Second, "commits under way", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(committed) < 200 {
			return fmt.Errorf("%d committed", len(committed))
		}
		return nil
	})
	n.Kill(t)
	wg.Wait()
	n.Start(t)

	checker := dialTxn(t, n)
	if f := checker.call(&heraldpb.Frame{Body: &heraldpb.Frame_RegisterProducer{RegisterProducer: &heraldpb.RegisterProducerRequest{ProducerGroup: "g"}}}); f.GetRegisterProducerResponse() == nil {
		t.Fatalf("register answered %v", f)
	}
	// Every pending half (the first, and any whose commit the kill cut
	// off) is checked back; the checker commits them all.
	checkFor(t, 60*time.Second, "every half resolved", func() error {
		for len(checker.checks) > 0 {
			hc := checker.checks[0]
			checker.checks = checker.checks[1:]
			checker.end(hc.Id, heraldpb.HalfAction_HALF_COMMIT, true)
		}
		// (list collects the check-backs pushed meanwhile)
		if l := checker.list(""); len(l) > 0 {
			return fmt.Errorf("%d halves pending: %v", len(l), l)
		}
		return nil
	})
	_ = pending
	got := map[string]int{}
	for _, v := range values(t, n, "orders") {
		got[v]++
	}
	for v, k := range got {
		if k != 1 {
			t.Errorf("%s appended %d times", v, k)
		}
	}
	for v := range committed {
		if got[v] != 1 {
			t.Errorf("%s (half %s) was committed but is not on the topic", v, sent[v])
		}
	}
	for v := range sent {
		if got[v] != 1 {
			t.Errorf("%s (half %s) was stored but never appended after the checks committed everything", v, sent[v])
		}
	}
	if got["pending"] != 1 {
		t.Errorf("the pending half was not committed by its check-back")
	}
	t.Logf("%d halves stored, %d commits answered before the kill, %d records", len(sent), len(committed), len(got))
}

// trySend sends f and returns the next frame answering it, or nil once
// the connection fails (for goroutines that outlive a killed broker).
func (tc *txnConn) trySend(f *heraldpb.Frame) *heraldpb.Frame {
	raw, err := heraldpb.AppendFrame(nil, f)
	if err != nil {
		return nil
	}
	if _, err := tc.c.Write(raw); err != nil {
		return nil
	}
	for {
		tc.c.SetReadDeadline(time.Now().Add(30 * time.Second))
		var hdr [4]byte
		if _, err := io.ReadFull(tc.r, hdr[:]); err != nil {
			return nil
		}
		buf := make([]byte, binary.BigEndian.Uint32(hdr[:]))
		if _, err := io.ReadFull(tc.r, buf); err != nil {
			return nil
		}
		r, err := heraldpb.DecodeFrame(buf)
		if err != nil {
			return nil
		}
		if r.Id == f.Id {
			return r
		}
	}
}

// TestHalfSurvivesCoordinatorFailover: three nodes; __txn is replicated
// (RF=3) and the coordinator runs on its leader, which every other node
// names in NOT_COORDINATOR. Twenty halves are stored there, ten of them
// committed, then that node is SIGKILLed. The new leader of __txn loads
// the halves from its replica and checks back the other ten with a
// producer registered there; at the end each of the twenty is on its
// topic exactly once.
func TestHalfSurvivesCoordinatorFailover(t *testing.T) {
	tc, c := clusterWithTopic(t, "orders", 1)
	leader := awaitInternalLeader(t, c, "__txn")
	var other *proc
	for id, p := range tc.nodes {
		if uint32(id) != leader {
			other = p
		}
	}
	oc := dialTxn(t, other)
	var e *heraldpb.Error
	checkFor(t, 20*time.Second, "NOT_COORDINATOR naming the leader of __txn", func() error {
		e = oc.call(&heraldpb.Frame{Body: &heraldpb.Frame_ListTxn{ListTxn: &heraldpb.ListTxnRequest{}}}).GetError()
		if e.GetCode() != heraldpb.ErrorCode_NOT_COORDINATOR || e.Leader != leader {
			return fmt.Errorf("a follower answered %v (leader %d)", e, leader)
		}
		return nil
	})
	lc := dialTxn(t, tc.nodes[uint64(leader)])
	opt := &heraldpb.HalfOptions{ProducerGroup: "g", CheckIntervalMs: 500}
	var ids []string
	checkFor(t, 20*time.Second, "the coordinator serving", func() error {
		f := lc.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
			Topic: "orders", Records: oneRecord("h-00"), Half: opt,
		}}})
		if f.GetProduceResponse() == nil {
			return fmt.Errorf("half produce answered %v", f)
		}
		ids = append(ids, f.GetProduceResponse().HalfId)
		return nil
	})
	for i := 1; i < 20; i++ {
		ids = append(ids, lc.sendHalf("orders", fmt.Sprintf("h-%02d", i), opt))
	}
	for _, id := range ids[:10] {
		if r := lc.end(id, heraldpb.HalfAction_HALF_COMMIT, false).GetEndHalfResponse(); r == nil {
			t.Fatalf("commit of %s failed", id)
		}
	}
	tc.nodes[uint64(leader)].Kill(t)
	delete(tc.nodes, uint64(leader))
	var next uint32
	checkFor(t, 30*time.Second, "a new leader of __txn", func() error {
		if next = internalLeader(t, dialNode(t, other), "__txn"); next == 0 || next == leader {
			return fmt.Errorf("leader %d", next)
		}
		return nil
	})
	nc := dialTxn(t, tc.nodes[uint64(next)])
	checkFor(t, 30*time.Second, "registered at the new coordinator", func() error {
		f := nc.call(&heraldpb.Frame{Body: &heraldpb.Frame_RegisterProducer{RegisterProducer: &heraldpb.RegisterProducerRequest{ProducerGroup: "g"}}})
		if f.GetRegisterProducerResponse() == nil {
			return fmt.Errorf("register answered %v", f)
		}
		return nil
	})
	checkFor(t, 60*time.Second, "every half resolved at the new coordinator", func() error {
		for len(nc.checks) > 0 {
			hc := nc.checks[0]
			nc.checks = nc.checks[1:]
			nc.end(hc.Id, heraldpb.HalfAction_HALF_COMMIT, true)
		}
		f := nc.call(&heraldpb.Frame{Body: &heraldpb.Frame_ListTxn{ListTxn: &heraldpb.ListTxnRequest{}}})
		if l := f.GetListTxnResponse(); l == nil || len(l.Halves) > 0 {
			return fmt.Errorf("list answered %v", f)
		}
		return nil
	})
	got := map[string]int{}
	for _, m := range readPartition(t, dialNode(t, tc.nodes[uint64(next)]), "orders", 0) {
		got[string(m.Value)]++
	}
	for i := range 20 {
		if v := fmt.Sprintf("h-%02d", i); got[v] != 1 {
			t.Errorf("%s is on the topic %d times", v, got[v])
		}
	}
	if len(got) != 20 {
		t.Errorf("the topic holds %d distinct records: %v", len(got), got)
	}
}

// startOutbox starts examples/outbox with args against n and returns its
// process and a channel of its output lines.
func startOutbox(t *testing.T, bin string, n node, args ...string) (*exec.Cmd, <-chan string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HERALD_ADDR="+n.Addr())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return cmd, lines
}

// expectLine waits for a line of lines containing want.
func expectLine(t *testing.T, lines <-chan string, want string) string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("output ended before %q", want)
			}
			if strings.Contains(l, want) {
				return l
			}
		case <-deadline:
			t.Fatalf("no %q within 30s", want)
		}
	}
}

// TestOutboxProducerKilled is the half-message example (examples/outbox)
// as processes: one order service is SIGKILLed after storing its order
// and before committing, another after sending its half and before
// storing; a third places its order whole. A second process of the same
// producer group, started afterwards, answers the broker's check-backs
// from the database: the first order is published once, the second
// never, the third once.
func TestOutboxProducerKilled(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "outbox")
	if out, err := exec.Command("go", "build", "-o", bin, "../examples/outbox").CombinedOutput(); err != nil {
		t.Fatalf("building examples/outbox: %v\n%s", err, out)
	}
	db := filepath.Join(dir, "orders.db")
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "orders", 1)

	p1, l1 := startOutbox(t, bin, n, "--db", db, "--stop-after", "stored", "place", "o-1")
	expectLine(t, l1, "stored o-1")
	_ = p1.Process.Kill()
	p2, l2 := startOutbox(t, bin, n, "--db", db, "--stop-after", "half", "place", "o-2")
	expectLine(t, l2, "half ")
	_ = p2.Process.Kill()
	_, l3 := startOutbox(t, bin, n, "--db", db, "place", "o-3")
	expectLine(t, l3, "o-3 is published")
	if got := values(t, n, "orders"); !slices.Equal(got, []string{"o-3 created"}) {
		t.Fatalf("before any check-back the topic holds %v", got)
	}

	_, lc := startOutbox(t, bin, n, "--db", db, "checker")
	expectLine(t, lc, "checker registered")
	checkFor(t, 30*time.Second, "both halves resolved by the checker", func() error {
		halves, total, err := c.ListTxn(ctxT(t, 5*time.Second), "", 0)
		if err != nil || total > 0 {
			return fmt.Errorf("pending %v (%d), err %v", halves, total, err)
		}
		return nil
	})
	got := values(t, n, "orders")
	slices.Sort(got)
	if !slices.Equal(got, []string{"o-1 created", "o-3 created"}) {
		t.Fatalf("the topic holds %v, want o-1 and o-3 once each", got)
	}
}

// TestHalfSDKAcrossCoordinatorFailover: the Go SDK in a 3-node cluster
// finds the transaction coordinator through NOT_COORDINATOR, and its
// registered checker follows the coordinator when that node is killed:
// halves left pending before the kill are checked back by the new
// coordinator over the checker's new connection and each is published
// once.
func TestHalfSDKAcrossCoordinatorFailover(t *testing.T) {
	tc, c := clusterWithTopic(t, "orders", 2)
	leader := awaitInternalLeader(t, c, "__txn")
	var decided sync.Map // id -> true once the checker answered
	stop, err := c.RegisterTransactionChecker(ctxT(t, 30*time.Second), "g", func(_ context.Context, hc *client.HalfCheck) client.HalfAction {
		decided.Store(hc.ID, true)
		return client.HalfCommit
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	opt := client.HalfOptions{ProducerGroup: "g", CheckInterval: 3 * time.Second}
	var ids []string
	for i := range 10 {
		h, err := c.SendHalf(ctxT(t, 20*time.Second), &client.Message{Topic: "orders", Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d", i)}, opt)
		if err != nil {
			t.Fatalf("half %d: %v", i, err)
		}
		ids = append(ids, h.ID)
	}
	tc.nodes[uint64(leader)].Kill(t)
	delete(tc.nodes, uint64(leader))
	checkFor(t, 60*time.Second, "every half checked back and committed by the new coordinator", func() error {
		halves, total, err := c.ListTxn(ctxT(t, 10*time.Second), "", 0)
		if err != nil || total > 0 {
			return fmt.Errorf("pending %d %v, err %v", total, halves, err)
		}
		return nil
	})
	got := map[string]int{}
	for p := range int32(2) {
		for _, m := range readPartition(t, c, "orders", p) {
			got[string(m.Value)]++
		}
	}
	for i := range 10 {
		if v := fmt.Sprintf("v%d", i); got[v] != 1 {
			t.Errorf("%s published %d times", v, got[v])
		}
	}
	n := 0
	decided.Range(func(any, any) bool { n++; return true })
	t.Logf("%d halves, %d decided by check-backs, leader of __txn was node %d", len(ids), n, leader)
}

// TestHalfCheckFlowControl: a producer is sent at most 1,024 unanswered
// check-backs; the checks beyond wait (postponed, not counted as checks)
// until it answers some.
func TestHalfCheckFlowControl(t *testing.T) {
	n := startInProc(t, t.TempDir())
	createTopic(t, dial(t, n), "orders", 1)
	sender := dialTxn(t, n)
	checker := dialTxn(t, n)
	// register renews the checker's registration, as the SDK's heartbeat
	// does (it lapses after three missed heartbeats, 6 s), and collects
	// the check-backs pushed meanwhile.
	register := func() {
		if f := checker.call(&heraldpb.Frame{Body: &heraldpb.Frame_RegisterProducer{RegisterProducer: &heraldpb.RegisterProducerRequest{ProducerGroup: "g"}}}); f.GetRegisterProducerResponse() == nil {
			t.Fatalf("register answered %v", f)
		}
	}
	register()
	// Many checks allowed: on a slow machine the 1,100 synced produces
	// take longer than the default 15 checks at 100-800 ms.
	fast := &heraldpb.HalfOptions{ProducerGroup: "g", CheckIntervalMs: 100, MaxChecks: 1000}
	for i := range 1100 {
		sender.sendHalf("orders", fmt.Sprint("f", i), fast)
		if i%100 == 0 {
			register()
		}
	}
	distinct := map[string]bool{}
	checkFor(t, 30*time.Second, "1,024 check-backs and the rest postponed", func() error {
		register()
		for _, hc := range checker.checks {
			distinct[hc.Id] = true
		}
		checker.checks = nil
		if len(distinct) < 1024 || metricSum(t, n, `herald_txn_checks_total{result="postponed"}`) == 0 {
			return fmt.Errorf("%d distinct halves checked", len(distinct))
		}
		return nil
	})
	if len(distinct) != 1024 {
		t.Fatalf("%d halves checked with none answered, want 1024", len(distinct))
	}
	// Answering lets the others through.
	i := 0
	for id := range distinct {
		if f := checker.end(id, heraldpb.HalfAction_HALF_COMMIT, true); f.GetEndHalfResponse() == nil {
			t.Fatalf("ending %s answered %v", id, f)
		}
		if i++; i%100 == 0 {
			register()
		}
	}
	checkFor(t, 30*time.Second, "the other 76 checked", func() error {
		register()
		for _, hc := range checker.checks {
			distinct[hc.Id] = true
		}
		checker.checks = nil
		if len(distinct) < 1100 {
			return fmt.Errorf("%d distinct halves checked", len(distinct))
		}
		return nil
	})
}
