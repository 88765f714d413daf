package workload

// The transaction workload: a transactional producer whose transactions
// each stage a few records over the topic's partitions, then commit (four
// in five) or abort. Written once, every other transaction puts its
// records on one partition (one key) without waiting for each, so that
// its partition commits it alone (single-partition commits).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/heraldmq/herald/chaos/history"
	"github.com/heraldmq/herald/chaos/scenario"
	"github.com/heraldmq/herald/client"
)

// startTxns starts the transactional producer (a generator).
func (w *Workload) startTxns(ctx, genCtx context.Context, tx scenario.Txns) error {
	c, err := w.dial(ctx, "txn-0")
	if err != nil {
		return err
	}
	timeout := tx.Timeout.D()
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	opts := []client.TxnOpt{client.WithTransactionTimeout(timeout)}
	if tx.WrittenOnce {
		opts = append(opts, client.WithTxnWrittenOnce())
	}
	p, err := c.NewTransactionalProducer(ctx, "chaos-txn-0", opts...)
	if err != nil {
		return fmt.Errorf("workload: the transactional producer: %w", err)
	}
	size := max(tx.Size, 1)
	w.gen.Add(1)
	go func() {
		defer w.gen.Done()
		defer p.Close(context.Background())
		t := ticker(tx.Rate)
		defer t.Stop()
		for n := int64(0); ; n++ {
			select {
			case <-genCtx.Done():
				return
			case <-t.C:
			}
			if !w.txn(p, n, size, tx.WrittenOnce && n%2 == 1) {
				return
			}
		}
	}()
	return nil
}

// txn runs transaction n: stages size records, then commits it (or, one
// in five, aborts it), recording each step; alone: on one partition, each
// record sent without waiting (Commit waits for them). It reports false
// when the producer is fenced for good.
func (w *Workload) txn(p *client.TransactionalProducer, n int64, size int, alone bool) bool {
	id := fmt.Sprintf("txn-%d", n)
	if err := p.Begin(); err != nil {
		w.noteErr(fmt.Errorf("workload: beginning %s: %w", id, err))
		return !errors.Is(err, client.ErrProducerFenced)
	}
	failed := false
	var sent sync.WaitGroup
	var mu sync.Mutex
	for k := range size {
		v := fmt.Sprintf("t%d-%d", n, k)
		op := history.Op{Process: "txn-0", Type: history.Invoke, F: history.TxnSend, Topic: w.cfg.Topic, Value: v, RequestID: id, Seq: int64(k), Idempotent: true}
		w.record(op)
		done := func(r client.Result, err error) {
			if err != nil {
				op.Type, op.Error = outcome(err), err.Error()
				mu.Lock()
				failed = true
				mu.Unlock()
			} else {
				op.Type, op.Partition = history.OK, r.Partition
			}
			w.record(op)
		}
		if alone {
			sent.Add(1)
			ctx, cancel := context.WithTimeout(context.Background(), w.cfg.OpTimeout)
			p.SendAsync(ctx, &client.Message{Topic: w.cfg.Topic, Key: []byte(id), Value: []byte(v)}, func(r client.Result, err error) {
				cancel()
				done(r, err)
				sent.Done()
			})
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), w.cfg.OpTimeout)
		r, err := p.Send(ctx, &client.Message{Topic: w.cfg.Topic, Key: []byte(v), Value: []byte(v)})
		cancel()
		done(r, err)
		if failed {
			break
		}
	}
	// (Sent without waiting, the records' outcomes are recorded as they
	// come, by the time Commit or Abort returns, which wait for them.)
	defer sent.Wait()
	mu.Lock()
	commit := !failed && n%5 != 4
	mu.Unlock()
	out := history.OutcomeRollback
	if commit {
		out = history.OutcomeCommit
	}
	end := history.Op{Process: "txn-0", Type: history.Invoke, F: history.TxnEnd, RequestID: id, Outcome: out}
	w.record(end)
	ctx, cancel := context.WithTimeout(context.Background(), 2*w.cfg.OpTimeout)
	defer cancel()
	var err error
	if commit {
		_, err = p.Commit(ctx)
	} else {
		err = p.Abort(ctx)
	}
	switch {
	case err == nil:
		end.Type = history.OK
	case commit:
		// A commit whose answer was lost: ask again (the same epoch's
		// commit is answered already_ended). If it still fails, the
		// transaction's outcome stays unknown.
		if _, err2 := p.Commit(ctx); err2 == nil {
			end.Type = history.OK
		} else {
			end.Type, end.Error = history.Info, err.Error()
			_ = p.Abort(ctx)
		}
	default:
		end.Type, end.Error = outcome(err), err.Error()
	}
	w.record(end)
	return !errors.Is(err, client.ErrProducerFenced)
}
