package e2e

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
)

// tailReader reads partition 0 of a topic from the start and tails it,
// recording what it receives. It fails (err) on an offset received out of
// order: one skipped or received twice.
type tailReader struct {
	name string
	mu   sync.Mutex
	next int64            // the offset expected next
	vals map[int64]string // offset -> value
	at   []time.Time      // when each offset was received, by offset
	errs int              // retryable errors seen
	last error            // the last retryable error
	err  error            // an order violation, or a non-retryable error
}

func newTailReader(name string) *tailReader {
	return &tailReader{name: name, vals: map[int64]string{}}
}

// take records messages received now; they must continue the offsets.
func (r *tailReader) take(ms []*client.Message) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range ms {
		if r.err != nil {
			return
		}
		if m.Offset != r.next {
			r.err = fmt.Errorf("%s: received offset %d, expected %d (skipped or duplicated)", r.name, m.Offset, r.next)
			return
		}
		r.vals[m.Offset] = string(m.Value)
		r.at = append(r.at, now)
		r.next++
	}
}

func (r *tailReader) failed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !client.IsRetryable(err) {
		if r.err == nil {
			r.err = fmt.Errorf("%s: %w", r.name, err)
		}
		return
	}
	r.errs++
	r.last = err
}

// count is how many offsets were received; fault the first violation.
func (r *tailReader) count() (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.next, r.err
}

// longestStall is the longest time between two successive receipts, from
// the last one before since on, counting the time since the last receipt
// as one.
func (r *tailReader) longestStall(since time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var worst time.Duration
	for i := 1; i < len(r.at); i++ {
		if r.at[i].After(since) {
			worst = max(worst, r.at[i].Sub(r.at[i-1]))
		}
	}
	if n := len(r.at); n > 0 {
		worst = max(worst, time.Since(r.at[n-1]))
	}
	return worst
}

// fetchLoop tails partition 0 with Client.Fetch, retrying retryable
// errors after 10 ms, until ctx ends.
func (r *tailReader) fetchLoop(ctx context.Context, c *client.Client, topic string) {
	for ctx.Err() == nil {
		r.mu.Lock()
		next := r.next
		r.mu.Unlock()
		res, err := c.Fetch(ctx, topic, 0, next, 1<<20, client.DefaultFetchMaxWait)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			r.failed(err)
			if !client.IsRetryable(err) {
				return
			}
			time.Sleep(10 * time.Millisecond) // a retry's backoff
			continue
		}
		r.take(res.Messages)
	}
}

// consumerLoop tails partition 0 with a client.Consumer (what `herald
// consume --follow` runs without --group) until ctx ends.
func (r *tailReader) consumerLoop(ctx context.Context, cs *client.Consumer) {
	for {
		ms, err := cs.Poll(ctx)
		r.take(ms)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			r.failed(err)
			return // Poll returns only final errors
		}
	}
}

// TestPausedLeaderFetchFailover (issue 14 §6): three nodes, an RF=3 topic
// under load, read at its tail by two pull consumers with the default
// 30 s request timeout and 500 ms long poll: a loop over Client.Fetch, and
// a client.Consumer. The leader of partition 0 is frozen with SIGSTOP for
// 7 s. Both readers must go on reading from the new leader while the old
// one is still frozen (before, a fetch waited on the frozen node for the
// whole pause), and every acknowledged record is read once, at its
// offset, in order: no offset skipped or read twice.
func TestPausedLeaderFetchFailover(t *testing.T) {
	const (
		pause  = 7 * time.Second
		bound  = 5 * time.Second // reads must resume within this of the freeze
		resume = 20              // records read past the frozen node's last answer
	)
	tc, c := clusterWithTopic(t, "orders", 1)
	load := startLoad(t, tc.addrs(), "orders", 2, 1, 2*time.Millisecond)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })

	readers := []*tailReader{newTailReader("Fetch loop"), newTailReader("Consumer")}
	fc, err := client.Dial(ctxT(t, 10*time.Second), tc.addrs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fc.Close() })
	cc, err := client.Dial(ctxT(t, 10*time.Second), tc.addrs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	cs := cc.NewConsumer("orders", client.Earliest(), []int32{0})
	t.Cleanup(func() { cs.Close() })
	wg.Add(2)
	go func() { defer wg.Done(); readers[0].fetchLoop(ctx, fc, "orders") }()
	go func() { defer wg.Done(); readers[1].consumerLoop(ctx, cs) }()

	since := time.Now()
	checkFor(t, 30*time.Second, "acks and reads before the pause", func() error {
		if n := load.countSince(0, since); n < 200 {
			return fmt.Errorf("%d acks", n)
		}
		for _, r := range readers {
			if n, err := r.count(); err != nil || n < 200 {
				return fmt.Errorf("%s: %d read (%v)", r.name, n, err)
			}
		}
		return nil
	})
	victim, p, pausedAt := freezeLeader(t, tc, c, "orders", 0)

	// What the frozen node had sent is read within 200 ms (loopback);
	// past that, records come from another node.
	frozenEnd := make([]int64, len(readers))
	resumed := make([]time.Duration, len(readers))
	for time.Since(pausedAt) < pause {
		el := time.Since(pausedAt)
		for i, r := range readers {
			n, err := r.count()
			if err != nil {
				p.cmd.Process.Signal(syscall.SIGCONT)
				t.Fatal(err)
			}
			switch {
			case el < 200*time.Millisecond:
				frozenEnd[i] = n
			case resumed[i] == 0 && n >= frozenEnd[i]+resume:
				resumed[i] = el
			}
		}
		time.Sleep(10 * time.Millisecond) // polling the readers, not synchronising
	}
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("leader node %d frozen for %v: writes stalled %v", victim, pause, load.longestStall(0, pausedAt).Round(time.Millisecond))
	for i, r := range readers {
		r.mu.Lock()
		errs, last := r.errs, r.last
		r.mu.Unlock()
		t.Logf("%s: reads stalled %v; %d records past offset %d read %v after the freeze; %d retryable errors (last: %v)",
			r.name, r.longestStall(pausedAt).Round(time.Millisecond), resume, frozenEnd[i], resumed[i].Round(time.Millisecond), errs, last)
	}
	for i, r := range readers {
		if resumed[i] == 0 {
			t.Errorf("%s: reads of partition 0 did not resume during the %v the leader was frozen", r.name, pause)
		} else if resumed[i] > bound {
			t.Errorf("%s: reads resumed %v after the freeze, over %v", r.name, resumed[i].Round(time.Millisecond), bound)
		}
	}

	checkFor(t, 30*time.Second, "acks after the thaw", func() error {
		if n := load.countSince(0, time.Now().Add(-time.Second)); n < 20 {
			return fmt.Errorf("%d acks in the last second", n)
		}
		return nil
	})
	load.finish()
	if load.failed > 0 {
		t.Fatalf("%d records failed; last: %v", load.failed, load.lastErr)
	}
	end := int64(0)
	for _, a := range load.acked {
		end = max(end, a.offset+1)
	}
	checkFor(t, 30*time.Second, fmt.Sprintf("the readers at offset %d", end), func() error {
		for _, r := range readers {
			if n, err := r.count(); err != nil || n < end {
				return fmt.Errorf("%s at %d (%v)", r.name, n, err)
			}
		}
		return nil
	})
	for _, r := range readers {
		r.mu.Lock()
		bad := 0
		for _, a := range load.acked {
			if got := r.vals[a.offset]; got != a.id {
				if bad++; bad <= 5 {
					t.Errorf("%s: read %q at offset %d, acknowledged for %q", r.name, got, a.offset, a.id)
				}
			}
		}
		r.mu.Unlock()
		if bad > 0 {
			t.Errorf("%s: %d of %d acknowledged records not read at their offset", r.name, bad, len(load.acked))
		}
	}
	t.Logf("%d records acknowledged; both readers read offsets 0..%d once each, in order", len(load.acked), end-1)
}
