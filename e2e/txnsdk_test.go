package e2e

// The SDK's transactions (client.TransactionalProducer,
// client.TransformExactlyOnce) against a real broker process.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Environment of the transformer process (this test binary started again
// by TestTxnSDKExactlyOnceKill): the broker's address, and an input
// offset at which the transform stalls (for a minute), if any.
const (
	transformerEnv      = "HERALD_E2E_TRANSFORMER_ADDR"
	transformerStallEnv = "HERALD_E2E_TRANSFORMER_STALL"
	// transformerGroupEnv runs GroupTransform of gin in group "enrich"
	// instead.
	transformerGroupEnv = "HERALD_E2E_TRANSFORMER_GROUP"
	// transformerOnceEnv writes the transactions once
	// (WithTxnWrittenOnce) instead of staging them.
	transformerOnceEnv = "HERALD_E2E_TRANSFORMER_ONCE"
)

func init() {
	// Runs before TestMain: a transformer process does not build herald
	// or run tests.
	if addr := os.Getenv(transformerEnv); addr != "" {
		os.Exit(runTransformer(addr))
	}
}

// runTransformer runs TransformExactlyOnce of in/0 until killed, printing
// "commit FROM TO" for each transaction, and each failure it recovers
// from on stderr.
func runTransformer(addr string) int {
	ctx := context.Background()
	stall := int64(-1)
	if v := os.Getenv(transformerStallEnv); v != "" {
		stall, _ = strconv.ParseInt(v, 10, 64)
	}
	c, err := client.Dial(ctx, addr, client.WithRequestTimeout(3*time.Second))
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		return 2
	}
	if os.Getenv(transformerGroupEnv) != "" {
		err = c.GroupTransform(ctx, client.GroupTransformConfig{
			Group: "enrich", Topic: "gin", TransactionalPrefix: "enrich", From: client.Earliest(),
			MaxRecords: 10, MaxWait: 100 * time.Millisecond, TransactionTimeout: 10 * time.Second, WrittenOnce: os.Getenv(transformerOnceEnv) != "",
			OnCommit: func(tc client.TransformCommit) { fmt.Printf("commit %d %d %d\n", tc.From, tc.To, tc.Partition) },
			OnError:  func(p int32, err error) { fmt.Fprintln(os.Stderr, "recovering:", p, err) },
		}, func(ctx context.Context, in *client.Message) ([]*client.Message, error) {
			time.Sleep(time.Millisecond) // work
			return []*client.Message{{Topic: "gout", Key: in.Value, Value: append([]byte("out-"), in.Value...)}}, nil
		})
		fmt.Fprintln(os.Stderr, "transformer:", err)
		return 1
	}
	err = c.TransformExactlyOnce(ctx, client.TransformConfig{
		TransactionalID: "enrich-0", Topic: "in", Partition: 0, ProgressTopic: "progress",
		MaxRecords: 10, MaxWait: 100 * time.Millisecond, TransactionTimeout: 10 * time.Second, WrittenOnce: os.Getenv(transformerOnceEnv) != "",
		OnCommit: func(tc client.TransformCommit) { fmt.Printf("commit %d %d\n", tc.From, tc.To) },
		OnError:  func(err error) { fmt.Fprintln(os.Stderr, "recovering:", err) },
	}, func(ctx context.Context, in *client.Message) ([]*client.Message, error) {
		time.Sleep(3 * time.Millisecond) // work
		if in.Offset == stall {
			time.Sleep(time.Minute) // killed meanwhile, its transaction open
		}
		return []*client.Message{{Topic: "out", Key: in.Value, Value: append([]byte("out-"), in.Value...)}}, nil
	})
	fmt.Fprintln(os.Stderr, "transformer:", err)
	return 1
}

// transformer is a transformer process; commits receives the end offset
// of each of its transactions.
type transformer struct {
	cmd     *exec.Cmd
	commits chan int64
	mu      sync.Mutex
	stderr  strings.Builder
}

func startTransformer(t *testing.T, addr string, env ...string) *transformer {
	t.Helper()
	tr := &transformer{cmd: exec.Command(os.Args[0], "-test.run=^$"), commits: make(chan int64, 1024)}
	tr.cmd.Env = append(append(os.Environ(), transformerEnv+"="+addr), env...)
	stdout, err := tr.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	tr.cmd.Stderr = lockedWriter{&tr.mu, &tr.stderr}
	if err := tr.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) >= 3 && f[0] == "commit" {
				to, _ := strconv.ParseInt(f[2], 10, 64)
				tr.commits <- to
			}
		}
		close(tr.commits)
	}()
	t.Cleanup(func() {
		tr.kill()
		if t.Failed() {
			t.Logf("transformer %d stderr:\n%s", tr.cmd.Process.Pid, tr.logs())
		}
	})
	return tr
}

func (tr *transformer) kill() {
	if tr.cmd.ProcessState == nil {
		tr.cmd.Process.Signal(syscall.SIGKILL)
		tr.cmd.Wait()
	}
}

func (tr *transformer) logs() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.stderr.String()
}

// waitCommits returns once the transformer has committed n transactions,
// or up to offset to (n 0), and the last end offset.
func (tr *transformer) waitCommits(t *testing.T, total time.Duration, n int, to int64) int64 {
	t.Helper()
	deadline := time.NewTimer(total)
	defer deadline.Stop()
	last := int64(-1)
	for seen := 0; (n == 0 || seen < n) && (to == 0 || last < to); seen++ {
		select {
		case end, ok := <-tr.commits:
			if !ok {
				t.Fatalf("the transformer exited after %d commits (last to %d):\n%s", seen, last, tr.logs())
			}
			last = end
		case <-deadline.C:
			t.Fatalf("the transformer committed %d transactions (last to %d) in %v\n%s", seen, last, total, tr.logs())
		}
	}
	return last
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

func (w lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.String()
}

func newTxnProducer(t *testing.T, c *client.Client, id string, opts ...client.TxnOpt) *client.TransactionalProducer {
	t.Helper()
	p, err := c.NewTransactionalProducer(ctxT(t, 10*time.Second), id, opts...)
	if err != nil {
		t.Fatalf("NewTransactionalProducer %s: %v", id, err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

// sendAll stages values (keyed by themselves) in p's open transaction.
func sendAll(t *testing.T, ctx context.Context, p *client.TransactionalProducer, topic string, values ...string) {
	t.Helper()
	for _, v := range values {
		if _, err := p.Send(ctx, &client.Message{Topic: topic, Key: []byte(v), Value: []byte(v)}); err != nil {
			t.Fatalf("send %s: %v", v, err)
		}
	}
}

// txnModes runs test with the producer staging its transactions (the
// default) and writing them once (WithTxnWrittenOnce).
func txnModes(t *testing.T, test func(t *testing.T, once bool, opts ...client.TxnOpt)) {
	t.Run("staged", func(t *testing.T) { test(t, false) })
	t.Run("written-once", func(t *testing.T) { test(t, true, client.WithTxnWrittenOnce()) })
}

// TestTxnSDKCommitAbort: a committed transaction's records, on two
// partitions, appear once each (staged ones tagged with the transactional
// id), and only after Commit returns; an aborted one's never appear.
func TestTxnSDKCommitAbort(t *testing.T) { txnModes(t, testTxnSDKCommitAbort) }

func testTxnSDKCommitAbort(t *testing.T, once bool, opts ...client.TxnOpt) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "out", 2)
	ctx := ctxT(t, 30*time.Second)
	p := newTxnProducer(t, c, "etl-1", opts...)
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	committed := []string{"a0", "a1", "a2", "a3", "a4", "a5"}
	sendAll(t, ctx, p, "out", committed...)
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := valuesOf(t, n, "out", 2); len(got) != 0 {
		t.Fatalf("staged records visible before the commit: %v", got)
	}
	// Listed open, with its partitions and records: staged, by its
	// coordinator; written once, from its partitions' leaders.
	infos, _, err := c.ListTransactions(ctx, "etl-1", 0)
	if err != nil || len(infos) != 1 || infos[0].GetState() != "open" || infos[0].GetRecords() != uint32(len(committed)) ||
		len(infos[0].GetPartitions()) != 2 || infos[0].GetWrittenOnce() != once || infos[0].GetStartedMs() == 0 {
		t.Fatalf("etl-1 before its commit: %v %v", infos, err)
	}
	end, err := p.Commit(ctx)
	if err != nil || end.Records != len(committed) || len(end.Partitions) != 2 {
		t.Fatalf("Commit: %+v %v", end, err)
	}
	// Visible once appended (Commit returns once decided), each once,
	// tagged.
	waitValues(t, n, "out", 2, func(got map[string]int) error {
		for _, v := range committed {
			if got[v] != 1 {
				return fmt.Errorf("after the commit: %v", got)
			}
		}
		return nil
	})
	for part := range int32(2) {
		for _, m := range readPartition(t, c, "out", part) {
			if !once && !slices.ContainsFunc(m.Headers, func(h client.Header) bool { return h.Key == "herald-txn-id" && string(h.Value) == "etl-1" }) {
				t.Errorf("%s/%d@%d lacks herald-txn-id: %v", m.Topic, m.Partition, m.Offset, m.Headers)
			}
		}
	}
	got := valuesOf(t, n, "out", 2)
	for _, v := range committed {
		if got[v] != 1 {
			t.Fatalf("after the commit: %v", got)
		}
	}

	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	sendAll(t, ctx, p, "out", "b0", "b1", "b2")
	if err := p.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	sendAll(t, ctx, p, "out", "c0")
	if _, err := p.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got = waitValues(t, n, "out", 2, func(got map[string]int) error {
		if got["c0"] != 1 {
			return fmt.Errorf("c0 appears %d times", got["c0"])
		}
		return nil
	})
	if len(got) != len(committed)+1 || got["c0"] != 1 || got["b0"]+got["b1"]+got["b2"] != 0 {
		t.Fatalf("after an abort and a commit: %v", got)
	}
	// Written once, the partitions applied the markers: 2 commits of the
	// first transaction, its abort (on the partitions b0-b2 went to), 1
	// commit of the last. Staged, none.
	markers := metricSum(t, n, "herald_partition_txn_markers_total")
	if once && markers < 4 || !once && markers != 0 {
		t.Fatalf("%v transaction markers applied (written once: %v)", markers, once)
	}
	checkFor(t, 10*time.Second, "etl-1 with nothing open or committing", func() error {
		infos, _, err := c.ListTransactions(ctx, "etl-1", 0)
		if err != nil || len(infos) != 1 || infos[0].GetState() != "empty" {
			return fmt.Errorf("etl-1 after its transactions: %v %v", infos, err)
		}
		return nil
	})
}

// TestTxnSDKFencing: a second producer of the same transactional id
// fences the first: the first's Send and Commit fail with
// ErrProducerFenced, and only the second's records appear. Written once,
// the zombie's Send is refused by the partition, told of the new session
// by the coordinator's sweep: the one it wrote to, and one it had not
// (before, that record was taken there, never readable).
func TestTxnSDKFencing(t *testing.T) { txnModes(t, testTxnSDKFencing) }

func testTxnSDKFencing(t *testing.T, once bool, opts ...client.TxnOpt) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "out", 1)
	createTopic(t, c, "other", 1)
	ctx := ctxT(t, 30*time.Second)
	old := newTxnProducer(t, c, "etl-1", opts...)
	if err := old.Begin(); err != nil {
		t.Fatal(err)
	}
	sendAll(t, ctx, old, "out", "zombie-0")
	cur := newTxnProducer(t, dial(t, n), "etl-1", opts...)
	for _, topic := range []string{"other", "out"} { // (once: the sweep has told both by now)
		if _, err := old.Send(ctx, &client.Message{Topic: topic, Value: []byte("zombie-1")}); !errors.Is(err, client.ErrProducerFenced) {
			t.Fatalf("the zombie's Send to %s: %v", topic, err)
		}
	}
	if _, err := old.Commit(ctx); !errors.Is(err, client.ErrProducerFenced) {
		t.Fatalf("the zombie's Commit: %v", err)
	}
	if err := old.Begin(); !errors.Is(err, client.ErrProducerFenced) {
		t.Fatalf("the zombie's Begin: %v", err)
	}
	if err := cur.Begin(); err != nil {
		t.Fatal(err)
	}
	sendAll(t, ctx, cur, "out", "live-0")
	if _, err := cur.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitValues(t, n, "out", 1, func(got map[string]int) error {
		if len(got) != 1 || got["live-0"] != 1 {
			return fmt.Errorf("the topic holds %v, want only live-0", got)
		}
		return nil
	})
	waitValues(t, n, "other", 1, func(got map[string]int) error {
		if len(got) != 0 {
			return fmt.Errorf("the topic holds %v, want nothing", got)
		}
		return nil
	})
}

// TestTxnSDKTimeout: the coordinator aborts a transaction open past its
// timeout; the producer's Send and Commit fail with ErrTxnTimedOut, Abort
// ends it, and the next transaction (a new session) commits.
func TestTxnSDKTimeout(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "out", 1)
	ctx := ctxT(t, 30*time.Second)
	p := newTxnProducer(t, c, "slow", client.WithTransactionTimeout(300*time.Millisecond))
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	sendAll(t, ctx, p, "out", "x")
	checkFor(t, 10*time.Second, "the timeout abort", func() error {
		infos, _, err := c.ListTransactions(ctx, "slow", 0)
		if err != nil || len(infos) != 1 || infos[0].GetState() != "empty" {
			return fmt.Errorf("list: %v %v", infos, err)
		}
		return nil
	})
	if _, err := p.Send(ctx, &client.Message{Topic: "out", Value: []byte("y")}); !errors.Is(err, client.ErrTxnTimedOut) {
		t.Fatalf("Send after the timeout: %v", err)
	}
	afterTimeout(t, ctx, n, p)
}

// TestTxnSDKExactlyOnceKill: TransformExactlyOnce in a process of its
// own, SIGKILLed in the middle of its work (its open transaction is
// aborted by the next one's session); a new one resumes from the
// committed progress, and the broker is SIGKILLed and restarted under it.
// Every input's output appears once.
func TestTxnSDKExactlyOnceKill(t *testing.T) {
	const inputs = 400
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "in", 1)
	createTopic(t, c, "out", 2)
	createTopic(t, c, "progress", 1)
	ctx := ctxT(t, 60*time.Second)
	prod := c.NewProducer()
	for i := range inputs {
		prod.SendAsync(ctx, &client.Message{Topic: "in", Value: fmt.Appendf(nil, "%04d", i)}, nil)
	}
	if err := prod.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// A stalls at input 55, its transaction of [50, 60) open with the
	// outputs of 50-54 staged, and dies there.
	a := startTransformer(t, n.Addr(), transformerStallEnv+"=55")
	if last := a.waitCommits(t, 30*time.Second, 0, 50); last != 50 {
		t.Fatalf("transformer A's commits end at %d, want 50", last)
	}
	open := func() error {
		infos, _, err := c.ListTransactions(ctx, "enrich-0", 0)
		if err != nil || len(infos) != 1 || infos[0].GetState() != "open" || infos[0].GetRecords() < 5 {
			return fmt.Errorf("enrich-0: %v %v", infos, err)
		}
		return nil
	}
	checkFor(t, 10*time.Second, "transformer A's transaction open, 5 outputs staged", open)
	a.kill()
	if err := open(); err != nil {
		t.Fatalf("after the SIGKILL: %v", err)
	}

	b := startTransformer(t, n.Addr())
	last := b.waitCommits(t, 30*time.Second, 3, 0)
	n.Kill(t)
	t.Logf("broker SIGKILLed after transformer B's commit up to %d", last)
	n.Start(t)
	if last = b.waitCommits(t, 60*time.Second, 0, inputs); last != inputs {
		t.Fatalf("transformer B's last commit ends at %d, want %d", last, inputs)
	}
	b.kill()

	got := waitValues(t, n, "out", 2, func(got map[string]int) error {
		if len(got) < inputs {
			return fmt.Errorf("%d distinct outputs of %d", len(got), inputs)
		}
		return nil
	})
	for i := range inputs {
		if v := fmt.Sprintf("out-%04d", i); got[v] != 1 {
			t.Fatalf("%s appears %d times (of %d outputs)", v, got[v], len(got))
		}
	}
	if len(got) != inputs {
		t.Fatalf("%d distinct outputs, want %d", len(got), inputs)
	}
	// The SDK's retries may ride out the restart (a batch retried with
	// its sequence, a commit sent again), or the transformer starts over
	// from its progress: either way, once.
	t.Logf("transformer B recovered %d times by starting over", strings.Count(b.logs(), "recovering:"))
}

// TestGroupTransformExactlyOnceKills: an exactly-once pipeline in a
// consumer group. Two GroupTransform processes share the four partitions
// of gin while a producer writes to it; five times, one of them is
// SIGKILLed mid-work and a new one joins in its place (the group moves
// partitions each time, and the new owner of a partition fences the old
// one's transactional id). At the end every input has exactly one output,
// and a read_committed group reading the output saw only records of
// committed transactions, each once.
func TestGroupTransformExactlyOnceKills(t *testing.T) {
	txnModes(t, func(t *testing.T, once bool, _ ...client.TxnOpt) { testGroupTransformKills(t, once) })
}

func testGroupTransformKills(t *testing.T, once bool) {
	const inputs = 1500
	env := []string{transformerGroupEnv + "=1"}
	if once {
		env = append(env, transformerOnceEnv+"=1")
	}
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "gin", 4)
	createTopic(t, c, "gout", 2)
	ctx := ctxT(t, 180*time.Second)

	// A reader of the outputs, read_committed (the groups' default).
	var wmu sync.Mutex
	watched := map[string]int{}
	if _, err := c.Subscribe(ctx, client.SubscribeOptions{Group: "watch", Topic: "gout", Mode: client.Shared, From: client.Earliest()},
		func(_ context.Context, m *client.Delivered) {
			wmu.Lock()
			watched[string(m.Value)]++
			wmu.Unlock()
		}); err != nil {
		t.Fatal(err)
	}

	// The input, written under way: about 150 records a second.
	produced := make(chan error, 1)
	go func() {
		prod := c.NewProducer()
		defer prod.Close(context.Background())
		for i := range inputs {
			prod.SendAsync(ctx, &client.Message{Topic: "gin", Key: fmt.Appendf(nil, "%05d", i), Value: fmt.Appendf(nil, "%05d", i)}, nil)
			if i%15 == 14 {
				time.Sleep(100 * time.Millisecond)
			}
		}
		produced <- prod.Flush(ctx)
	}()

	trs := []*transformer{
		startTransformer(t, n.Addr(), env...),
		startTransformer(t, n.Addr(), env...),
	}
	for kill := range 5 {
		victim := kill % 2
		trs[victim].waitCommits(t, 60*time.Second, 3, 0)
		trs[victim].kill()
		t.Logf("kill %d: transformer %d SIGKILLed", kill+1, trs[victim].cmd.Process.Pid)
		trs[victim] = startTransformer(t, n.Addr(), env...)
	}
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	checkFor(t, 90*time.Second, "an output for every input", func() error {
		got := valuesOf(t, n, "gout", 2)
		if len(got) < inputs {
			return fmt.Errorf("%d distinct outputs of %d", len(got), inputs)
		}
		return nil
	})
	got := valuesOf(t, n, "gout", 2)
	for i := range inputs {
		if v := fmt.Sprintf("out-%05d", i); got[v] != 1 {
			t.Fatalf("%s appears %d times (of %d outputs)", v, got[v], len(got))
		}
	}
	if len(got) != inputs {
		t.Fatalf("%d distinct outputs, want %d", len(got), inputs)
	}
	checkFor(t, 30*time.Second, "the reader caught up", func() error {
		wmu.Lock()
		defer wmu.Unlock()
		if len(watched) < inputs {
			return fmt.Errorf("the reader saw %d of %d", len(watched), inputs)
		}
		return nil
	})
	wmu.Lock()
	for v, k := range watched {
		if got[v] != 1 || k != 1 {
			t.Errorf("the reader saw %s %d times; it is in the output %d times", v, k, got[v])
		}
	}
	wmu.Unlock()
	// The group's position, committed with the outputs, is at the end of
	// the input.
	checkFor(t, 10*time.Second, "the group's progress at the end of the input", func() error {
		gi, err := c.DescribeGroup(ctx, "enrich")
		if err != nil {
			return err
		}
		var floor int64
		for _, p := range gi.GetPartitions() {
			floor += p.GetAckFloor()
		}
		if floor != inputs {
			return fmt.Errorf("group enrich: %v", gi)
		}
		return nil
	})
	recovered := 0
	for _, tr := range trs {
		recovered += strings.Count(tr.logs(), "recovering:")
	}
	t.Logf("the live transformers recovered %d times", recovered)
}

// TestTxnSDKWrittenOnceTimeout: a transaction written once and left open
// past its timeout is aborted by the coordinator's sweep of the
// partitions; the partition then refuses its next record, Commit fails
// with ErrTxnTimedOut (the coordinator's answer), Abort ends it, and the
// next transaction (a new session) commits.
func TestTxnSDKWrittenOnceTimeout(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "out", 1)
	ctx := ctxT(t, 60*time.Second)
	p := newTxnProducer(t, c, "slow", client.WithTransactionTimeout(300*time.Millisecond), client.WithTxnWrittenOnce())
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	sendAll(t, ctx, p, "out", "x")
	checkFor(t, 40*time.Second, "the sweep's abort", func() error {
		if _, err := p.Send(ctx, &client.Message{Topic: "out", Value: []byte("y")}); err == nil {
			return fmt.Errorf("a record of the transaction is still accepted")
		} else if !errors.Is(err, client.ErrTxnFailed) && !client.IsCode(err, heraldpb.ErrorCode_INVALID_TXN_STATE) {
			t.Fatalf("Send after the timeout: %v", err)
		}
		return nil
	})
	afterTimeout(t, ctx, n, p)
}

// TestTxnSDKCommitAsync: a producer writing once commits 30 transactions
// without waiting for each (CommitAsync, up to 8 in flight): every
// callback reports the commit, and every record appears once. Then a
// second session of the id fences the first while its commits are in
// flight: the first's callbacks after the fence fail with
// ErrProducerFenced (or ErrTxnFailed behind one), and only the records of
// the commits reported done appear.
func TestTxnSDKCommitAsync(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "out", 3)
	ctx := ctxT(t, 60*time.Second)
	p := newTxnProducer(t, c, "async-1", client.WithTxnWrittenOnce())
	var mu sync.Mutex
	committed, failed := map[string]bool{}, 0
	var failures []string
	var onCommit func(done int) // (under mu) told of each commit reported
	run := func(p *client.TransactionalProducer, prefix string, txns int) {
		for i := range txns {
			if err := p.Begin(); err != nil {
				if errors.Is(err, client.ErrProducerFenced) {
					return
				}
				t.Fatal(err)
			}
			var vals []string
			for j := range 5 {
				v := fmt.Sprintf("%s-%02d-%d", prefix, i, j)
				vals = append(vals, v)
				p.SendAsync(ctx, &client.Message{Topic: "out", Value: []byte(v)}, nil)
			}
			err := p.CommitAsync(ctx, func(_ client.TxnEnd, err error) {
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failed++
					failures = append(failures, fmt.Sprintf("%s-%02d: %v", prefix, i, err))
					return
				}
				for _, v := range vals {
					committed[v] = true
				}
				if onCommit != nil {
					onCommit(len(committed) / 5)
				}
			})
			if err != nil {
				if errors.Is(err, client.ErrProducerFenced) || errors.Is(err, client.ErrTxnFailed) {
					_ = p.Abort(ctx)
					return
				}
				t.Fatal(err)
			}
		}
	}
	run(p, "a", 30)
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(committed) != 150 || failed != 0 {
		t.Fatalf("%d records reported committed, %d transactions failed", len(committed), failed)
	}
	mu.Unlock()
	waitCommittedOnce(t, n, "out", 3, committed)

	// Fenced with commits in flight.
	old := newTxnProducer(t, c, "async-2", client.WithTxnWrittenOnce())
	c2 := dial(t, n)
	started := make(chan struct{})
	onCommit = func(done int) {
		if done == 30+5 { // the fifth of the old session's commits: a new session starts
			go func() {
				defer close(started)
				if np, err := c2.NewTransactionalProducer(ctx, "async-2", client.WithTxnWrittenOnce()); err != nil {
					t.Errorf("the new session: %v", err)
				} else {
					np.Close(context.Background())
				}
			}()
		}
	}
	run(old, "b", 200)
	_ = old.Close(ctx)
	<-started
	mu.Lock()
	t.Logf("after the fence: %d records reported committed, %d transactions failed: %q", len(committed), failed, failures)
	mu.Unlock()
	waitValues(t, n, "out", 3, func(got map[string]int) error {
		mu.Lock()
		defer mu.Unlock()
		for v := range committed {
			if got[v] != 1 {
				return fmt.Errorf("%s appears %d times", v, got[v])
			}
		}
		for v, k := range got {
			if !committed[v] {
				return fmt.Errorf("%s (%d times) appears though its commit was not reported", v, k)
			}
		}
		return nil
	})
}

// TestTxnSDKWrittenOnceInCluster: transactions written once in a 3-node
// cluster, each over the partitions of a topic replicated three times
// (their leaders on different nodes): every committed record appears once,
// on every replica's read through its leader, and no aborted one does.
func TestTxnSDKWrittenOnceInCluster(t *testing.T) {
	tc, c := clusterWithTopic(t, "out", 3)
	ctx := ctxT(t, 90*time.Second)
	awaitInternalLeader(t, c, "__txn")
	p := newTxnProducer(t, c, "once-c", client.WithTxnWrittenOnce())
	want := map[string]int{}
	for n := range 20 {
		if err := p.Begin(); err != nil {
			t.Fatal(err)
		}
		var vals []string
		for k := range 4 {
			vals = append(vals, fmt.Sprintf("t%d-%d", n, k))
		}
		sendAll(t, ctx, p, "out", vals...)
		if n%5 == 4 {
			if err := p.Abort(ctx); err != nil {
				t.Fatalf("abort %d: %v", n, err)
			}
			continue
		}
		if _, err := p.Commit(ctx); err != nil {
			t.Fatalf("commit %d: %v", n, err)
		}
		for _, v := range vals {
			want[v] = 1
		}
	}
	checkFor(t, 30*time.Second, "every committed record, once", func() error {
		got := map[string]int{}
		for part := range int32(3) {
			for _, m := range readPartition(t, c, "out", part) {
				got[string(m.Value)]++
			}
		}
		if !maps.Equal(got, want) {
			return fmt.Errorf("the topic holds %d values %v, want %d", len(got), got, len(want))
		}
		return nil
	})
	_ = tc
}

// afterTimeout checks what follows a transaction the coordinator timed
// out: Commit fails with ErrTxnTimedOut, Abort ends it, and the next
// transaction (a new session) commits, alone on the topic "out".
func afterTimeout(t *testing.T, ctx context.Context, n node, p *client.TransactionalProducer) {
	t.Helper()
	if _, err := p.Commit(ctx); !errors.Is(err, client.ErrTxnTimedOut) {
		t.Fatalf("Commit after the timeout: %v", err)
	}
	if err := p.Abort(ctx); err != nil {
		t.Fatalf("Abort after the timeout: %v", err)
	}
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	sendAll(t, ctx, p, "out", "z")
	if _, err := p.Commit(ctx); err != nil {
		t.Fatalf("a transaction after the timeout: %v", err)
	}
	waitValues(t, n, "out", 1, func(got map[string]int) error {
		if len(got) != 1 || got["z"] != 1 {
			return fmt.Errorf("the topic holds %v, want only z", got)
		}
		return nil
	})
}

// TestTxnSDKManualAbort: `herald txn abort` (AbortTransaction) aborts a
// producer's open transaction, staged or written once (found on its
// partitions): its records never appear, the producer's Commit fails,
// its Abort then succeeds and its next transaction commits.
func TestTxnSDKManualAbort(t *testing.T) { txnModes(t, testTxnSDKManualAbort) }

func testTxnSDKManualAbort(t *testing.T, once bool, opts ...client.TxnOpt) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "out", 2)
	ctx := ctxT(t, 30*time.Second)
	p := newTxnProducer(t, c, "etl-m", opts...)
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	sendAll(t, ctx, p, "out", "x0", "x1", "x2", "x3")
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	end, err := c.AbortTransaction(ctx, "etl-m")
	if err != nil || end.Records != 4 || len(end.Partitions) != 2 {
		t.Fatalf("AbortTransaction: %+v %v", end, err)
	}
	if _, err := c.AbortTransaction(ctx, "etl-m"); err == nil {
		t.Fatal("a second manual abort found a transaction open")
	}
	_, err = p.Commit(ctx)
	var he *client.Error
	if !errors.As(err, &he) {
		t.Fatalf("the commit of a transaction aborted by hand: %v", err)
	}
	t.Logf("the commit of a transaction aborted by hand: %v", err)
	if err := p.Abort(ctx); err != nil {
		t.Fatalf("Abort after the manual abort: %v", err)
	}
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	sendAll(t, ctx, p, "out", "y0")
	if _, err := p.Commit(ctx); err != nil {
		t.Fatalf("the next transaction: %v", err)
	}
	got := waitValues(t, n, "out", 2, func(got map[string]int) error {
		if got["y0"] != 1 {
			return fmt.Errorf("y0 appears %d times", got["y0"])
		}
		return nil
	})
	if len(got) != 1 {
		t.Fatalf("after a manual abort and a commit: %v", got)
	}
	if once {
		checkFor(t, 10*time.Second, "the aborted records dropped on their partitions", func() error {
			if open := metricSum(t, n, "herald_partition_txn_open"); open != 0 {
				return fmt.Errorf("%v transactions open on partitions", open)
			}
			return nil
		})
	}
}

// TestTxnSDKCommitAlone: a producer writing once commits a transaction
// that wrote one partition on that partition alone (its last batch
// carries the commit), and one over two partitions through the
// coordinator, which then hears of the ones committed alone since
// (one_phase_from). 150 transactions, up to 8 in flight (CommitAsync),
// every fifth over both partitions: every record appears once, each
// partition holds the transactions in their order, and the partitions
// committed the single-partition ones themselves. A second session of
// the id then fences the first: its next commit alone is refused with
// ErrProducerFenced, and nothing of it appears.
func TestTxnSDKCommitAlone(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "out", 2)
	ctx := ctxT(t, 60*time.Second)
	keyFor := [2][]byte{}
	for i := 0; keyFor[0] == nil || keyFor[1] == nil; i++ {
		k := []byte(fmt.Sprintf("k%d", i))
		keyFor[client.PartitionForKey(k, 2)] = k
	}
	p := newTxnProducer(t, c, "alone", client.WithTxnWrittenOnce())
	var mu sync.Mutex
	committed := map[string]bool{}
	var failures []string
	const txns = 150
	for i := range txns {
		if err := p.Begin(); err != nil {
			t.Fatal(err)
		}
		var vals []string
		for j := range 3 {
			part := i % 2
			if i%5 == 0 && j == 2 {
				part = 1 - part // over both partitions: through the coordinator
			}
			v := fmt.Sprintf("a-%03d-%d", i, j)
			vals = append(vals, v)
			p.SendAsync(ctx, &client.Message{Topic: "out", Key: keyFor[part], Value: []byte(v)}, nil)
		}
		if err := p.CommitAsync(ctx, func(_ client.TxnEnd, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures = append(failures, fmt.Sprintf("%d: %v", i, err))
				return
			}
			for _, v := range vals {
				committed[v] = true
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(committed) != 3*txns || len(failures) > 0 {
		t.Fatalf("%d records reported committed; failures: %q", len(committed), failures)
	}
	mu.Unlock()
	waitCommittedOnce(t, n, "out", 2, committed)
	for part := range int32(2) {
		last := -1
		for _, m := range readPartition(t, c, "out", part) {
			var i, j int
			if _, err := fmt.Sscanf(string(m.Value), "a-%d-%d", &i, &j); err != nil {
				t.Fatal(err)
			}
			if i < last {
				t.Fatalf("partition %d holds transaction %d after %d", part, i, last)
			}
			last = i
		}
	}
	alone := 0.0
	for part := range 2 {
		alone += metricValue(t, n, fmt.Sprintf(`herald_partition_txn_commits_alone_total{partition="%d",topic="out"}`, part))
	}
	if want := float64(txns - txns/5); alone != want {
		t.Fatalf("the partitions committed %v transactions alone, want %v", alone, want)
	}

	// A transaction larger than the producer's buffer: the batches held
	// for the commit go when the buffer fills (before, Send waited for
	// room that never came).
	big := newTxnProducer(t, c, "alone-big", client.WithTxnWrittenOnce(), client.WithTxnBufferBytes(16<<10))
	if err := big.Begin(); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		v := fmt.Sprintf("big-%03d-%s", i, strings.Repeat("x", 1000))
		big.SendAsync(ctx, &client.Message{Topic: "out", Key: keyFor[i%2], Value: []byte(v)}, nil)
		committed[v] = true
	}
	if _, err := big.Commit(ctx); err != nil {
		t.Fatalf("a transaction larger than the buffer: %v", err)
	}
	waitCommittedOnce(t, n, "out", 2, committed)

	// A new session fences the old one's commits alone.
	old := newTxnProducer(t, c, "alone-2", client.WithTxnWrittenOnce())
	if err := old.Begin(); err != nil {
		t.Fatal(err)
	}
	old.SendAsync(ctx, &client.Message{Topic: "out", Key: keyFor[0], Value: []byte("before")}, nil)
	if _, err := old.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	np := newTxnProducer(t, dial(t, n), "alone-2", client.WithTxnWrittenOnce())
	defer np.Close(ctx)
	if err := old.Begin(); err != nil {
		t.Fatal(err)
	}
	old.SendAsync(ctx, &client.Message{Topic: "out", Key: keyFor[0], Value: []byte("zombie")}, nil)
	if _, err := old.Commit(ctx); !errors.Is(err, client.ErrProducerFenced) {
		t.Fatalf("the old session's commit alone after a new session: %v", err)
	}
	got := waitValues(t, n, "out", 2, func(got map[string]int) error {
		if got["before"] != 1 {
			return fmt.Errorf("before appears %d times", got["before"])
		}
		return nil
	})
	if got["zombie"] != 0 {
		t.Fatalf("the fenced session's record appears %d times", got["zombie"])
	}
}

// waitCommittedOnce waits until topic holds every value of committed once,
// and nothing else.
func waitCommittedOnce(t *testing.T, n node, topic string, parts int32, committed map[string]bool) {
	t.Helper()
	waitValues(t, n, topic, parts, func(got map[string]int) error {
		for v := range committed {
			if got[v] != 1 {
				return fmt.Errorf("%s appears %d times (%d values)", v, got[v], len(got))
			}
		}
		if len(got) != len(committed) {
			return fmt.Errorf("%d values, %d committed", len(got), len(committed))
		}
		return nil
	})
}
