package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/heraldmq/herald/client"
)

// benchProduceTxn is benchProduce for --txn-size: the producer is a
// transactional producer (id herald-bench-<id>) that commits every
// bc.txnSize records, and the last, shorter transaction at the end. A
// record counts as produced, with its latency, when its transaction
// commits; the records of a transaction that fails to commit count as
// errors. It runs until prodCtx ends or n records (n >= 0) were sent; a
// commit waits at most --drain-timeout. Records without a key go where
// the broker picks (staged) or the producer picks (--txn-written-once), a
// batch at a time, so a small transaction usually lands on one
// partition; with --keys its records spread by key.
func benchProduceTxn(prodCtx, ctx context.Context, c *client.Client, bc *benchConfig, id int, n int64, start time.Time, clock benchClock, stats *benchStats) error {
	opts := []client.TxnOpt{client.WithTxnBatchBytes(bc.batchBytes), client.WithTxnBufferBytes(bc.bufferBytes)}
	if bc.txnOnce {
		opts = append(opts, client.WithTxnWrittenOnce())
	}
	tp, err := c.NewTransactionalProducer(ctx, fmt.Sprintf("herald-bench-%d", id), opts...)
	if err != nil {
		return fmt.Errorf("producer %d: %w", id, err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bc.drainTimeout)
		defer cancel()
		_ = tp.Close(cctx) // aborts a transaction left open by an interrupt
	}()
	ack, commitLat := stats.acks[id], stats.commits[id]
	var interval time.Duration
	if bc.rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(bc.producers) / bc.rate)
	}
	recs := newBenchRecords(bc, id)
	var stamps, seqs []int64 // of the open transaction's records
	// window holds a token per commit in flight (--txn-in-flight above 1):
	// CommitAsync itself lets up to client.MaxTxnCommitsInFlight wait.
	window := make(chan struct{}, max(bc.txnInFlight, 1))
	var inFlightMax int64 // the most tokens it held at once
	defer func() { stats.sawTxnInFlight(inFlightMax) }()
	done := func(stamps, seqs []int64, took time.Duration, err error) {
		if err != nil {
			if ctx.Err() == nil {
				stats.txnFailed.Add(1)
				for range stamps {
					stats.produceErrs.add(err)
					if errors.Is(err, client.ErrRequestTimeout) || errors.Is(err, context.DeadlineExceeded) {
						stats.produceTimeouts.Add(1)
					}
				}
			}
		} else {
			now := clock.now()
			stats.transactions.Add(1)
			stats.produced.Add(int64(len(stamps)))
			stats.producedBytes.Add(int64(len(stamps) * bc.size))
			ack.mu.Lock()
			for _, stamp := range stamps {
				us := max(now-stamp, 0) / int64(time.Microsecond)
				_ = ack.hist.RecordValue(min(max(us, 1), ack.hist.HighestTrackableValue()))
			}
			ack.mu.Unlock()
			commitLat.mu.Lock()
			_ = commitLat.hist.RecordValue(min(max(took.Microseconds(), 1), commitLat.hist.HighestTrackableValue()))
			commitLat.mu.Unlock()
			if bc.acked != nil {
				for _, seq := range seqs {
					bc.acked.add(id, seq)
				}
			}
		}
	}
	commit := func() {
		defer func() { stamps, seqs = stamps[:0], seqs[:0] }()
		t0 := time.Now()
		if bc.txnInFlight > 1 {
			st, sq := slices.Clone(stamps), slices.Clone(seqs)
			select {
			case window <- struct{}{}:
			case <-ctx.Done():
				done(st, sq, time.Since(t0), ctx.Err())
				return
			}
			inFlightMax = max(inFlightMax, int64(len(window)))
			// (Its callback runs on the producer's goroutine: a failure
			// there fails the open transaction, whose CommitAsync then
			// fails and aborts it here. CommitAsync waits on ctx only for
			// room among the commits in flight, each bounded by the
			// transaction timeout: no context of its own each.)
			if err := tp.CommitAsync(ctx, func(_ client.TxnEnd, err error) {
				<-window
				done(st, sq, time.Since(t0), err)
			}); err != nil {
				<-window
				done(st, sq, time.Since(t0), err)
				actx, cancel := context.WithTimeout(ctx, bc.drainTimeout)
				_ = tp.Abort(actx)
				cancel()
			}
			return
		}
		cctx, cancel := context.WithTimeout(ctx, bc.drainTimeout)
		defer cancel()
		_, err := tp.Commit(cctx)
		done(stamps, seqs, time.Since(t0), err)
		if err != nil {
			_ = tp.Abort(cctx)
		}
	}
	for seq := int64(0); n < 0 || seq < n; seq++ {
		if prodCtx.Err() != nil {
			break
		}
		stamp := pace(prodCtx, start, interval, seq, clock)
		if prodCtx.Err() != nil {
			break
		}
		if len(stamps) == 0 {
			if err := tp.Begin(); err != nil {
				return fmt.Errorf("producer %d: %w", id, err)
			}
		}
		m := recs.next(stamp, seq)
		tp.SendAsync(ctx, m, nil) // a failure fails the transaction: its Commit says so
		stamps, seqs = append(stamps, stamp), append(seqs, seq)
		if len(stamps) == bc.txnSize {
			commit()
		}
	}
	if len(stamps) > 0 && ctx.Err() == nil {
		commit() // interrupted: Close aborts it instead
	}
	return nil
}
