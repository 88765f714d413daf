package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/client/fakebroker"
	heraldpb "github.com/heraldmq/herald/proto"
)

// values returns the values stored in topic's partitions 0..n-1.
func values(b *fakebroker.Broker, topic string, n uint32) []string {
	var out []string
	for p := range n {
		for _, r := range b.Records(topic, p) {
			out = append(out, string(r.GetValue()))
		}
	}
	slices.Sort(out)
	return out
}

func newTxnProducer(t *testing.T, c *Client, id string, opts ...TxnOpt) *TransactionalProducer {
	t.Helper()
	p, err := c.NewTransactionalProducer(testCtx(t), id, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

func isTxnProduce(f *heraldpb.Frame) bool { return f.GetProduce().GetTransactionalId() != "" }

// isEndTxn: an EndTxn, or the last batch sent with the commit.
func isEndTxn(f *heraldpb.Frame) bool {
	return f.GetEndTxn() != nil && !f.GetEndTxn().GetManual() || f.GetProduce().GetCommitTxn()
}

// TestTransactionalCommitAndAbort: records are staged, invisible until
// Commit, then on their partitions; an aborted transaction's never
// appear; the epoch moves on at every end and the sequence starts over.
func TestTransactionalCommitAndAbort(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("out", 2))
	c := dial(t, b)
	ctx := testCtx(t)
	p := newTxnProducer(t, c, "etl")
	first, _ := b.Txn("etl")
	if _, err := p.Send(ctx, &Message{Topic: "out", Value: []byte("early")}); !errors.Is(err, errNoTxn) {
		t.Fatalf("Send before Begin: %v", err)
	}
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	if err := p.Begin(); err == nil {
		t.Fatal("a second Begin succeeded")
	}
	m := &Message{Topic: "out", Key: []byte("k1"), Value: []byte("a0")}
	r, err := p.Send(ctx, m)
	if err != nil || r.Partition != int32(PartitionForKey([]byte("k1"), 2)) || r.Offset != -1 || m.Partition != r.Partition || m.Offset != -1 {
		t.Fatalf("Send: %+v %v (message %d/%d)", r, err, m.Partition, m.Offset)
	}
	done := make(chan error, 2)
	for _, v := range []string{"a1", "a2"} {
		p.SendAsync(ctx, &Message{Topic: "out", Key: []byte(v), Value: []byte(v)}, func(_ Result, err error) { done <- err })
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if got := values(b, "out", 2); len(got) != 0 {
		t.Fatalf("staged records visible before the commit: %v", got)
	}
	end, err := p.Commit(ctx)
	if err != nil || end.Records != 3 || end.AlreadyEnded || len(end.Partitions) == 0 {
		t.Fatalf("Commit: %+v %v", end, err)
	}
	if got := values(b, "out", 2); !slices.Equal(got, []string{"a0", "a1", "a2"}) {
		t.Fatalf("after the commit: %v", got)
	}
	if info, _ := b.Txn("etl"); info.Epoch != first.Epoch+1 || info.Open {
		t.Fatalf("after the commit: %+v, first epoch %d", info, first.Epoch)
	}

	// Aborted: nothing appears, records not sent yet fail with
	// ErrTxnAborted or are staged and dropped.
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		p.SendAsync(ctx, &Message{Topic: "out", Value: fmt.Appendf(nil, "b%d", i)}, func(_ Result, err error) {
			if err != nil && !errors.Is(err, ErrTxnAborted) {
				t.Errorf("a record of the aborted transaction: %v", err)
			}
		})
	}
	if err := p.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if got := values(b, "out", 2); len(got) != 3 {
		t.Fatalf("after the abort: %v", got)
	}
	if _, err := p.Commit(ctx); !errors.Is(err, errNoTxn) {
		t.Fatalf("Commit with no transaction: %v", err)
	}

	// The next transaction: sequences from 0 again, on the next epoch.
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	before := len(b.Produced())
	if _, err := p.Send(ctx, &Message{Topic: "out", Value: []byte("c0")}); err != nil {
		t.Fatal(err)
	}
	if pl := b.Produced()[before]; pl.BaseSequence != 0 || pl.ProducerID != first.ProducerID {
		t.Fatalf("the next transaction's first batch: %+v", pl)
	}
	if _, err := p.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := values(b, "out", 2); !slices.Equal(got, []string{"a0", "a1", "a2", "c0"}) {
		t.Fatalf("after the third transaction: %v", got)
	}
	if info, _ := b.Txn("etl"); info.Epoch != first.Epoch+3 {
		t.Fatalf("epoch %d after three transactions from %d", info.Epoch, first.Epoch)
	}
}

// TestTransactionalBatchesInOrder: records sent asynchronously are staged
// in few batches, one at a time, with base sequences counting the
// transaction's records, and land in order.
func TestTransactionalBatchesInOrder(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("out", 3))
	c := dial(t, b)
	ctx := testCtx(t)
	p := newTxnProducer(t, c, "batch", WithTxnBatchBytes(2000))
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	var failed atomic.Int64
	for i := range n {
		p.SendAsync(ctx, &Message{Topic: "out", Key: fmt.Appendf(nil, "k%d", i%7), Value: fmt.Appendf(nil, "%05d", i)}, func(_ Result, err error) {
			if err != nil {
				failed.Add(1)
			}
		})
	}
	if _, err := p.Commit(ctx); err != nil || failed.Load() != 0 {
		t.Fatalf("Commit: %v (%d records failed)", err, failed.Load())
	}
	var seq int64
	batches := 0
	for _, pl := range b.Produced() {
		if pl.BaseSequence != seq {
			t.Fatalf("batch %d has base sequence %d, want %d", batches, pl.BaseSequence, seq)
		}
		seq += int64(pl.Count)
		batches++
	}
	if seq != n || batches >= n/10 {
		t.Fatalf("%d records in %d batches", seq, batches)
	}
	for part := range uint32(3) {
		last := map[string]string{}
		for _, r := range b.Records("out", part) {
			if k := string(r.GetKey()); string(r.GetValue()) < last[k] {
				t.Fatalf("key %s out of order: %s after %s", k, r.GetValue(), last[k])
			}
			last[string(r.GetKey())] = string(r.GetValue())
		}
	}
	if got := values(b, "out", 3); len(got) != n {
		t.Fatalf("%d records committed, want %d", len(got), n)
	}
}

// TestTransactionalRetryStagesOnce: a staged batch whose answer is lost
// is sent again with the same base sequence, answered as a duplicate, and
// committed once; a commit whose answer is lost is sent again and
// answered as already ended.
func TestTransactionalRetryStagesOnce(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("out", 1))
	c := dial(t, b)
	ctx := testCtx(t)
	p := newTxnProducer(t, c, "retry")
	var lostProduce, lostEnd atomic.Int64
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		switch {
		case isTxnProduce(f) && lostProduce.Add(1) == 1, isEndTxn(f) && lostEnd.Add(1) == 1:
			return fakebroker.Action{LoseReply: true}
		}
		return fakebroker.Action{}
	})
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Send(ctx, &Message{Topic: "out", Value: []byte("once")}); err != nil {
		t.Fatal(err)
	}
	pls := b.Produced()
	if len(pls) != 2 || pls[0].BaseSequence != 0 || pls[1].BaseSequence != 0 || pls[0].Duplicate || !pls[1].Duplicate {
		t.Fatalf("produces %+v, want one staged and its retry answered as a duplicate", pls)
	}
	end, err := p.Commit(ctx)
	if err != nil || !end.AlreadyEnded || lostEnd.Load() != 2 {
		t.Fatalf("Commit after a lost answer: %+v %v (%d EndTxn)", end, err, lostEnd.Load())
	}
	if got := values(b, "out", 1); !slices.Equal(got, []string{"once"}) {
		t.Fatalf("committed %v", got)
	}
	// The next transaction goes on, on the next epoch.
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Send(ctx, &Message{Topic: "out", Value: []byte("next")}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := values(b, "out", 1); !slices.Equal(got, []string{"next", "once"}) {
		t.Fatalf("committed %v", got)
	}
}

// TestTransactionalFenced: a second producer of the same transactional id
// fences the first: its Send, Commit and every later call fail with
// ErrProducerFenced, and what it staged is never visible.
func TestTransactionalFenced(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("out", 1))
	c := dial(t, b)
	ctx := testCtx(t)
	old := newTxnProducer(t, c, "etl")
	if err := old.Begin(); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Send(ctx, &Message{Topic: "out", Value: []byte("zombie-0")}); err != nil {
		t.Fatal(err)
	}
	cur := newTxnProducer(t, dial(t, b), "etl")
	_, err := old.Send(ctx, &Message{Topic: "out", Value: []byte("zombie-1")})
	if !errors.Is(err, ErrProducerFenced) || !IsCode(err, heraldpb.ErrorCode_PRODUCER_FENCED) || IsRetryable(err) {
		t.Fatalf("the zombie's Send: %v", err)
	}
	if _, err := old.Commit(ctx); !errors.Is(err, ErrProducerFenced) {
		t.Fatalf("the zombie's Commit: %v", err)
	}
	if err := old.Abort(ctx); !errors.Is(err, ErrProducerFenced) {
		t.Fatalf("the zombie's Abort: %v", err)
	}
	if err := old.Begin(); !errors.Is(err, ErrProducerFenced) {
		t.Fatalf("the zombie's Begin: %v", err)
	}
	if err := cur.Begin(); err != nil {
		t.Fatal(err)
	}
	if _, err := cur.Send(ctx, &Message{Topic: "out", Value: []byte("live")}); err != nil {
		t.Fatal(err)
	}
	if _, err := cur.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := values(b, "out", 1); !slices.Equal(got, []string{"live"}) {
		t.Fatalf("committed %v", got)
	}
	if err := old.Close(ctx); err != nil {
		t.Fatalf("closing a fenced producer: %v", err)
	}
}

// TestTransactionalTimedOut: after the coordinator aborted a transaction
// at its timeout, Send and Commit fail with ErrTxnTimedOut, Abort ends it
// without a request, and the next transaction starts a new session.
func TestTransactionalTimedOut(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("out", 1))
	c := dial(t, b)
	ctx := testCtx(t)
	p := newTxnProducer(t, c, "slow", WithTransactionTimeout(300*time.Millisecond))
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Send(ctx, &Message{Topic: "out", Value: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if !b.TimeOutTxn("slow") {
		t.Fatal("no transaction open")
	}
	_, err := p.Send(ctx, &Message{Topic: "out", Value: []byte("y")})
	if !errors.Is(err, ErrTxnTimedOut) {
		t.Fatalf("Send after the timeout: %v", err)
	}
	if _, err := p.Commit(ctx); !errors.Is(err, ErrTxnTimedOut) || !errors.Is(err, ErrTxnFailed) {
		t.Fatalf("Commit after the timeout: %v", err)
	}
	var ends atomic.Int64
	b.SetHook(count(&ends, fakebroker.Action{}, isEndTxn))
	if err := p.Abort(ctx); err != nil || ends.Load() != 0 {
		t.Fatalf("Abort after the timeout: %v (%d EndTxn sent)", err, ends.Load())
	}
	before, _ := b.Txn("slow")
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Send(ctx, &Message{Topic: "out", Value: []byte("z")}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if after, _ := b.Txn("slow"); after.Epoch <= before.Epoch+1 {
		t.Fatalf("epoch %d after a new session and a commit, %d before", after.Epoch, before.Epoch)
	}
	if got := values(b, "out", 1); !slices.Equal(got, []string{"z"}) {
		t.Fatalf("committed %v", got)
	}
}

// TestTransactionalFailedMustAbort: a record that fails (refused by the
// coordinator, or before it is sent) fails the transaction: Commit
// refuses with ErrTxnFailed, Abort ends it, and the next one commits.
func TestTransactionalFailedMustAbort(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("out", 1))
	c := dial(t, b)
	ctx := testCtx(t)
	p := newTxnProducer(t, c, "etl")
	for _, bad := range []*Message{
		{Topic: "missing", Value: []byte("x")},
		{Topic: "out", Value: []byte("x"), Delay: time.Second},
	} {
		if err := p.Begin(); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Send(ctx, &Message{Topic: "out", Value: []byte("lost")}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Send(ctx, bad); err == nil {
			t.Fatalf("%+v was accepted", bad)
		}
		if _, err := p.Send(ctx, &Message{Topic: "out", Value: []byte("after")}); !errors.Is(err, ErrTxnFailed) {
			t.Fatalf("Send after a failure: %v", err)
		}
		_, err := p.Commit(ctx)
		if !errors.Is(err, ErrTxnFailed) {
			t.Fatalf("Commit after a failure: %v", err)
		}
		if bad.Topic == "missing" && !IsCode(err, heraldpb.ErrorCode_TOPIC_NOT_FOUND) {
			t.Fatalf("Commit's error does not carry the cause: %v", err)
		}
		if err := p.Abort(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Send(ctx, &Message{Topic: "out", Value: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := values(b, "out", 1); !slices.Equal(got, []string{"ok"}) {
		t.Fatalf("committed %v", got)
	}
}

// TestTransactionalListAndManualAbort: ListTransactions shows the open
// transaction; AbortTransaction drops it; its producer's next Send fails,
// its Abort succeeds, and it goes on.
func TestTransactionalListAndManualAbort(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("out", 2))
	c := dial(t, b)
	ctx := testCtx(t)
	p := newTxnProducer(t, c, "etl-1", WithTransactionTimeout(90*time.Second))
	newTxnProducer(t, c, "etl-2")
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := p.Send(ctx, &Message{Topic: "out", Key: fmt.Appendf(nil, "%d", i), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	infos, total, err := c.ListTransactions(ctx, "", 0)
	if err != nil || total != 2 || len(infos) != 2 {
		t.Fatalf("list: %v %d %v", infos, total, err)
	}
	if ti := infos[0]; ti.TransactionalId != "etl-1" || ti.State != "open" || ti.Records != 3 || ti.TimeoutMs != 90000 || ti.StartedMs == 0 {
		t.Fatalf("first: %v", ti)
	}
	if ti := infos[1]; ti.TransactionalId != "etl-2" || ti.State != "empty" {
		t.Fatalf("second: %v", ti)
	}
	if infos, total, err := c.ListTransactions(ctx, "etl-2", 0); err != nil || total != 1 || infos[0].TransactionalId != "etl-2" {
		t.Fatalf("list of one: %v %d %v", infos, total, err)
	}
	if _, _, err := c.ListTransactions(ctx, "nope", 0); !IsCode(err, heraldpb.ErrorCode_TXN_NOT_FOUND) {
		t.Fatalf("list of an unknown id: %v", err)
	}

	end, err := c.AbortTransaction(ctx, "etl-1")
	if err != nil || end.Records != 3 {
		t.Fatalf("manual abort: %+v %v", end, err)
	}
	if _, err := c.AbortTransaction(ctx, "etl-1"); !IsCode(err, heraldpb.ErrorCode_TXN_NOT_FOUND) {
		t.Fatalf("manual abort with nothing open: %v", err)
	}
	if _, err := p.Send(ctx, &Message{Topic: "out", Value: []byte("late")}); !IsCode(err, heraldpb.ErrorCode_INVALID_TXN_STATE) {
		t.Fatalf("Send after the manual abort: %v", err)
	}
	if err := p.Abort(ctx); err != nil {
		t.Fatalf("Abort after the manual abort: %v", err)
	}
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Send(ctx, &Message{Topic: "out", Value: []byte("next")}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := values(b, "out", 2); !slices.Equal(got, []string{"next"}) {
		t.Fatalf("committed %v", got)
	}
}

// TestTransactionalCloseAborts: Close aborts the open transaction, and
// every call fails with ErrClosed afterwards.
func TestTransactionalCloseAborts(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("out", 1))
	c := dial(t, b)
	ctx := testCtx(t)
	p, err := c.NewTransactionalProducer(ctx, "etl")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Send(ctx, &Message{Topic: "out", Value: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if info, _ := b.Txn("etl"); info.Open {
		t.Fatalf("the transaction is still open after Close: %+v", info)
	}
	if err := p.Begin(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Begin after Close: %v", err)
	}
	if len(values(b, "out", 1)) != 0 {
		t.Fatal("records of a transaction aborted by Close are visible")
	}
}

// transformFixture is an input topic of n records, the output and the
// progress topics, on one fake broker.
func transformFixture(t *testing.T, n int) *fakebroker.Broker {
	b := newBroker(t, fakebroker.Topic("in", 1), fakebroker.Topic("out", 2), fakebroker.Topic("progress", 1))
	c := dial(t, b)
	p := c.NewProducer(WithLinger(0))
	for i := range n {
		p.SendAsync(testCtx(t), &Message{Topic: "in", Value: fmt.Appendf(nil, "%03d", i)}, nil)
	}
	if err := p.Close(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return b
}

// transformCfg configures the transformer of the tests; commits counts
// its commits, plus 1000 for the one that reaches offset n.
func transformCfg(commits *atomic.Int64, n int64) TransformConfig {
	return TransformConfig{TransactionalID: "enrich-0", Topic: "in", Partition: 0, ProgressTopic: "progress", MaxRecords: 20, MaxWait: 50 * time.Millisecond,
		OnCommit: func(tc TransformCommit) {
			if tc.To == n {
				commits.Add(1000)
			}
			commits.Add(1)
		}}
}

// double is the transform of the tests: two outputs per input.
func double(_ context.Context, in *Message) ([]*Message, error) {
	return []*Message{
		{Topic: "out", Key: in.Value, Value: append([]byte("a-"), in.Value...)},
		{Topic: "out", Key: in.Value, Value: append([]byte("b-"), in.Value...)},
	}, nil
}

// checkExactlyOnce fails t unless "out" holds both outputs of each of the
// n inputs, once.
func checkExactlyOnce(t *testing.T, b *fakebroker.Broker, n int) {
	t.Helper()
	got := values(b, "out", 2)
	var want []string
	for i := range n {
		want = append(want, fmt.Sprintf("a-%03d", i), fmt.Sprintf("b-%03d", i))
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("outputs: %d records, want %d, each once:\n%v", len(got), len(want), got)
	}
}

// runTransform runs TransformExactlyOnce on its own client until ctx ends
// and returns its error on the channel.
func runTransform(t *testing.T, ctx context.Context, b *fakebroker.Broker, cfg TransformConfig, fn TransformFunc) (*Client, <-chan error) {
	c := dial(t, b)
	errc := make(chan error, 1)
	go func() { errc <- c.TransformExactlyOnce(ctx, cfg, fn) }()
	return c, errc
}

// TestTxnTransformCrashAndRestart: a transformer dies in the middle of a
// transaction (its client closed from inside the transform, so nothing
// is aborted); a new one resumes from the committed progress, its session
// aborting the dead one's transaction. Every input's outputs appear once.
func TestTxnTransformCrashAndRestart(t *testing.T) {
	const n = 200
	b := transformFixture(t, n)
	var commits atomic.Int64
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	var victim *Client
	var once sync.Once
	crashAt := make(chan struct{})
	c, errc := runTransform(t, ctx, b, transformCfg(&commits, n), func(ctx context.Context, in *Message) ([]*Message, error) {
		if in.Offset == 70 {
			once.Do(func() {
				<-crashAt
				// Outputs of [60, 70) staged, then the process dies: no abort.
				for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
					if info, _ := b.Txn("enrich-0"); info.Open {
						break
					}
				}
				victim.Close()
			})
		}
		return double(ctx, in)
	})
	victim = c
	close(crashAt)
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("the crashed transformer returned %v", err)
	}
	if info, _ := b.Txn("enrich-0"); !info.Open || len(values(b, "out", 2)) != 2*60 {
		t.Fatalf("at the crash: %+v, %d outputs committed, want the transaction of [60, 80) open and 120 outputs", info, len(values(b, "out", 2)))
	}
	_, errc = runTransform(t, ctx, b, transformCfg(&commits, n), double)
	waitFor(t, 10*time.Second, "the last commit", func() bool { return commits.Load() > 1000 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the transformer returned %v", err)
	}
	checkExactlyOnce(t, b, n)
	if commits.Load() != 1010 {
		t.Fatalf("%d transactions committed, want 10 (200 records, 20 each)", commits.Load())
	}
}

// TestTxnTransformCommitLost: a commit that took effect while its answers
// were lost (the connection cut three times) is an unknown outcome: the
// transformer starts over from the progress it reads back, which says the
// transaction committed, so nothing is produced twice.
func TestTxnTransformCommitLost(t *testing.T) {
	const n = 100
	b := transformFixture(t, n)
	var ends atomic.Int64
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if !isEndTxn(f) {
			return fakebroker.Action{}
		}
		switch ends.Add(1) {
		case 2:
			return fakebroker.Action{LoseReply: true} // committed, answer lost
		case 3, 4:
			return fakebroker.Action{Close: true} // the retries: no answer either
		}
		return fakebroker.Action{}
	})
	var commits atomic.Int64
	var recovered []error
	var mu sync.Mutex
	cfg := transformCfg(&commits, n)
	cfg.OnError = func(err error) {
		mu.Lock()
		recovered = append(recovered, err)
		mu.Unlock()
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	_, errc := runTransform(t, ctx, b, cfg, double)
	waitFor(t, 10*time.Second, "the last commit", func() bool { return commits.Load() > 1000 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the transformer returned %v", err)
	}
	checkExactlyOnce(t, b, n)
	mu.Lock()
	defer mu.Unlock()
	if len(recovered) != 1 || !IsOutcomeUnknown(recovered[0]) {
		t.Fatalf("recovered from %v, want one unknown outcome", recovered)
	}
	if commits.Load() != 1004 {
		t.Fatalf("%d commits seen by the transformer, want 4 of 5 (one's answer was lost)", commits.Load())
	}
}

// TestTxnTransformZombie: a transformer stalls in the middle of a
// transaction while a second one with the same transactional id starts:
// the second fences the first, aborts its transaction and does all the
// work; the first, resuming, fails with ErrProducerFenced and commits
// nothing.
func TestTxnTransformZombie(t *testing.T) {
	const n = 100
	b := transformFixture(t, n)
	var commits atomic.Int64
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	stalled, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	_, zombie := runTransform(t, ctx, b, transformCfg(&commits, n), func(ctx context.Context, in *Message) ([]*Message, error) {
		if in.Offset == 45 {
			once.Do(func() {
				close(stalled)
				<-resume
			})
		}
		return double(ctx, in)
	})
	<-stalled
	_, errc := runTransform(t, ctx, b, transformCfg(&commits, n), double)
	waitFor(t, 10*time.Second, "the last commit", func() bool { return commits.Load() > 1000 })
	close(resume)
	if err := <-zombie; !errors.Is(err, ErrProducerFenced) {
		t.Fatalf("the zombie returned %v", err)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the live transformer returned %v", err)
	}
	checkExactlyOnce(t, b, n)
}

// TestTxnTransformConfig: a progress topic that forgets (retention) or
// holds another input's progress under the id is refused.
func TestTxnTransformConfig(t *testing.T) {
	const n = 10
	b := transformFixture(t, n)
	c := dial(t, b)
	ctx := testCtx(t)
	if _, err := c.CreateTopic(ctx, "forgetful", &heraldpb.TopicConfig{Partitions: 1, RetentionMs: 3600_000}); err != nil {
		t.Fatal(err)
	}
	var commits atomic.Int64
	cfg := transformCfg(&commits, n)
	cfg.ProgressTopic = "forgetful"
	if err := c.TransformExactlyOnce(ctx, cfg, double); err == nil || !strings.Contains(err.Error(), `progress topic "forgetful" has retention`) {
		t.Fatalf("a progress topic with retention: %v", err)
	}
	cfg.ProgressTopic = "nope"
	if err := c.TransformExactlyOnce(ctx, cfg, double); !IsCode(err, heraldpb.ErrorCode_TOPIC_NOT_FOUND) {
		t.Fatalf("a missing progress topic: %v", err)
	}
	// Progress of in/0 under the id; then the id is used for in/1.
	if _, err := c.CreateTopic(ctx, "in2", &heraldpb.TopicConfig{Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	p := newTxnProducer(t, c, "enrich-0")
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Send(ctx, &Message{Topic: "progress", Key: []byte("enrich-0"), Value: []byte(`{"topic":"in","partition":0,"next":5}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	cfg = transformCfg(&commits, n)
	cfg.Topic, cfg.Partition = "in2", 1
	if err := c.TransformExactlyOnce(ctx, cfg, double); err == nil || !strings.Contains(err.Error(), "holds the progress of in/0, not of in2/1") {
		t.Fatalf("another input's progress: %v", err)
	}
	// An error of the transform stops it; its transaction is aborted.
	boom := errors.New("boom")
	cfg = transformCfg(&commits, n)
	err := c.TransformExactlyOnce(ctx, cfg, func(context.Context, *Message) ([]*Message, error) { return nil, boom })
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "in/0 at offset 5") {
		t.Fatalf("a failing transform: %v", err)
	}
	if info, _ := b.Txn("enrich-0"); info.Open {
		t.Fatalf("the failed transform's transaction is open: %+v", info)
	}
}
