package workload

// The half-message workload: a producer of half messages that ends most
// of them itself and leaves some to the check-back, and a checker that
// answers check-backs by the same rule.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/heraldmq/herald/chaos/history"
	"github.com/heraldmq/herald/chaos/scenario"
	"github.com/heraldmq/herald/client"
)

// HalfGroup is the producer group of the workload's half messages.
const HalfGroup = "chaos-halves"

// HalfOutcome is the end the workload intends for half message seq: its
// producer commits seq%10 < 7 and rolls back 7 and 8; 9 is left to the
// check-back, which commits it when seq%20 == 9 and rolls it back when
// seq%20 == 19. The checker answers check-backs by this rule too, so a
// half whose producer's end was lost ends the same way.
func HalfOutcome(seq int64) string {
	if seq%10 < 7 || seq%20 == 9 {
		return history.OutcomeCommit
	}
	return history.OutcomeRollback
}

// halfSeq reads the seq of a half message's value ("h-SEQ").
func halfSeq(v string) (int64, bool) {
	s, ok := strings.CutPrefix(v, "h-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// startHalves starts the half-message producer (a generator) and the
// check-back answerer (which runs until Stop, as the consumers do).
func (w *Workload) startHalves(ctx, genCtx context.Context, h scenario.Halves) error {
	cc, err := w.dial(ctx, "half-checker")
	if err != nil {
		return err
	}
	stop, err := cc.RegisterTransactionChecker(ctx, HalfGroup, func(_ context.Context, hc *client.HalfCheck) client.HalfAction {
		v := ""
		if len(hc.Messages) > 0 {
			v = string(hc.Messages[0].Value)
		}
		seq, ok := halfSeq(v)
		if !ok {
			w.noteErr(fmt.Errorf("workload: check-back of half %s with value %q, not one of ours", hc.ID, v))
			return client.HalfUnknown
		}
		out := HalfOutcome(seq)
		w.record(history.Op{Process: "half-checker", Type: history.OK, F: history.HalfCheck, Topic: hc.Topic, Partition: hc.Partition,
			Value: v, RequestID: hc.ID, Outcome: out, Attempt: hc.Check})
		if out == history.OutcomeCommit {
			return client.HalfCommit
		}
		return client.HalfRollback
	})
	if err != nil {
		return fmt.Errorf("workload: registering the half checker: %w", err)
	}
	w.mu.Lock()
	w.stops = append(w.stops, stop)
	w.mu.Unlock()

	c, err := w.dial(ctx, "half-0")
	if err != nil {
		return err
	}
	opts := client.HalfOptions{ProducerGroup: HalfGroup, CheckInterval: h.CheckInterval.D()}
	if opts.CheckInterval == 0 {
		opts.CheckInterval = time.Second
	}
	w.gen.Add(1)
	go func() {
		defer w.gen.Done()
		t := ticker(h.Rate)
		defer t.Stop()
		for seq := int64(0); ; seq++ {
			select {
			case <-genCtx.Done():
				return
			case <-t.C:
			}
			w.half(c, opts, seq)
		}
	}()
	return nil
}

// half sends half message seq and ends it by the rule, recording each
// step and its outcome.
func (w *Workload) half(c *client.Client, opts client.HalfOptions, seq int64) {
	v := fmt.Sprintf("h-%d", seq)
	out := HalfOutcome(seq)
	op := history.Op{Process: "half-0", Type: history.Invoke, F: history.HalfSend, Topic: w.cfg.Topic, Value: v, Seq: seq, Outcome: out, Idempotent: true}
	w.record(op)
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.OpTimeout)
	h, err := c.SendHalf(ctx, &client.Message{Topic: w.cfg.Topic, Value: []byte(v)}, opts)
	cancel()
	if err != nil {
		op.Type, op.Error = outcome(err), err.Error()
		w.record(op)
		return
	}
	op.Type, op.RequestID, op.Partition = history.OK, h.ID, h.Partition
	w.record(op)
	if seq%10 == 9 {
		return // left to the check-back
	}
	end := history.Op{Process: "half-0", Type: history.Invoke, F: history.HalfEnd, Topic: w.cfg.Topic, Partition: h.Partition, Value: v, RequestID: h.ID, Outcome: out}
	w.record(end)
	ctx, cancel = context.WithTimeout(context.Background(), w.cfg.OpTimeout)
	if out == history.OutcomeCommit {
		var e client.HalfEnd
		if e, err = h.Commit(ctx); err == nil {
			end.Offset = e.Offset
		}
	} else {
		err = h.Rollback(ctx)
	}
	cancel()
	if err != nil {
		end.Type, end.Error = outcome(err), err.Error()
	} else {
		end.Type = history.OK
	}
	w.record(end)
}
