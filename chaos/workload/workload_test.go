package workload

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/heraldmq/herald/broker"
	"github.com/heraldmq/herald/chaos/checker"
	"github.com/heraldmq/herald/chaos/history"
	"github.com/heraldmq/herald/chaos/scenario"
	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// TestWorkloadWithoutFaults runs every kind of worker for a few seconds
// against a real (in-process) broker with no fault, and checks the
// history it recorded: the checker must find nothing wrong, and every
// kind of operation must be there.
func TestWorkloadWithoutFaults(t *testing.T) {
	cfg := broker.Default()
	cfg.DataDir, cfg.Listen, cfg.Admin, cfg.LogLevel = t.TempDir(), "127.0.0.1:0", "", "warn"
	b, err := broker.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, b.ClientAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CreateTopic(ctx, "chaos", &heraldpb.TopicConfig{Partitions: 2}); err != nil {
		t.Fatal(err)
	}

	var buf lockedBuffer
	start := time.Now()
	now := func() time.Duration { return time.Since(start) }
	rec := history.NewRecorder(&buf, now)
	spec := scenario.Workload{Producers: 2, PlainProducers: 1, Rate: 100, Acks: "all", Idempotent: true, Keys: 4, Pull: true,
		Groups: []scenario.Group{
			{Name: "g-cluster", Mode: "clustering", Members: 2},
			{Name: "g-keys", Mode: "key-shared", Members: 2},
			{Name: "g-shared", Mode: "shared", Members: 2, Fail: 0.2, MaxDeliveries: 2},
			{Name: "g-bcast", Mode: "broadcast", Members: 2},
		},
		Delayed:  &scenario.Delayed{Rate: 20, Delay: scenario.Duration(500 * time.Millisecond)},
		Requests: &scenario.Requests{Rate: 20},
	}
	w, err := Start(ctx, Config{Addrs: []string{b.ClientAddr()}, Topic: "chaos", Parts: 2, Spec: spec, Recorder: rec, Now: now, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	pollFor(t, 20*time.Second, "every kind of op recorded", func() bool {
		return kinds(t, buf.snapshot())[history.Nack] > 0 && kinds(t, buf.snapshot())[history.Reply] > 0
	})
	w.StopGenerators()
	// Let the consumers catch up with everything produced, once the last
	// delayed message is due and so in the log.
	var lastDue time.Duration
	for _, op := range readOps(t, buf.snapshot()) {
		lastDue = max(lastDue, time.Duration(op.Due))
	}
	lag := ""
	var checked time.Time
	pollFor(t, 20*time.Second, "the groups caught up", func() bool {
		checked = time.Now()
		if now() < lastDue+100*time.Millisecond {
			return false
		}
		for _, g := range []string{"g-cluster", "g-keys", "g-shared", "g-bcast"} {
			info, err := c.DescribeGroup(ctx, g)
			if err != nil {
				lag = g + ": " + err.Error()
				return false
			}
			for _, p := range info.GetPartitions() {
				if p.GetAckFloor() < p.GetHighWatermark() {
					lag = fmt.Sprintf("%s: %v", g, info)
					return false
				}
			}
		}
		return true
	}, func() string { return lag })
	// A dead letter appended just before the groups were done must be read
	// too, or the checker finds it neither acked nor dead-lettered.
	pollFor(t, 10*time.Second, "the dead-letter reader caught up", func() bool { return w.DLQCaughtUp(checked) })
	if errs := w.Stop(ctx); len(errs) > 0 {
		t.Fatalf("workload errors: %v", errs)
	}
	if err := rec.Err(); err != nil {
		t.Fatal(err)
	}
	ops, err := history.Read(bytes.NewReader(buf.snapshot()))
	if err != nil {
		t.Fatal(err)
	}
	// The final reads, from the live broker (no replica to compare).
	for p := range int32(2) {
		res, err := c.Fetch(ctx, "chaos", p, 0, 64<<20, 0)
		if err != nil {
			t.Fatal(err)
		}
		read := history.Op{Process: "final-read", Type: history.OK, F: history.FinalRead, Topic: "chaos", Partition: p, Node: 1}
		for _, m := range res.Messages {
			read.Records = append(read.Records, history.Record{Offset: m.Offset, Key: string(m.Key), Value: string(m.Value)})
		}
		if r, err := rec.Record(read); err != nil {
			t.Fatal(err)
		} else {
			ops = append(ops, r)
		}
	}
	report := checker.Check(ops, checker.Options{Drained: true})
	if !report.Valid() {
		t.Fatalf("the checker found violations in a run without faults:\n%s", report)
	}
	t.Logf("%d ops; report:\n%s", len(ops), report)
}

// TestDLQCaughtUp: a run is settled only once every dead-letter reader
// read to the end of its topic in a fetch sent after the groups were seen
// done; a fetch sent earlier, or one that stopped short of the high
// watermark, does not count.
func TestDLQCaughtUp(t *testing.T) {
	w := &Workload{cfg: Config{Spec: scenario.Workload{Groups: []scenario.Group{
		{Name: "plain"}, {Name: "dl-a", MaxDeliveries: 3}, {Name: "dl-b", MaxDeliveries: 2},
	}}}, dlqRead: map[string]dlqProgress{}}
	t0 := time.Now()
	since := t0.Add(time.Second)
	if w.DLQCaughtUp(since) {
		t.Fatal("caught up before any fetch")
	}
	w.noteDLQ("dl-a", t0, true) // before since: it may have missed a dead letter
	w.noteDLQ("dl-b", since.Add(time.Millisecond), true)
	if w.DLQCaughtUp(since) {
		t.Fatal("caught up with dl-a's last fetch sent before since")
	}
	w.noteDLQ("dl-a", since.Add(2*time.Millisecond), false) // stopped short of the high watermark
	if w.DLQCaughtUp(since) {
		t.Fatal("caught up with dl-a short of its high watermark")
	}
	w.noteDLQ("dl-a", since.Add(3*time.Millisecond), true)
	if !w.DLQCaughtUp(since) {
		t.Fatal("not caught up with both readers at their ends after since (a group without dead letters has no reader)")
	}
}

// lockedBuffer is the history's file in memory, read while written.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) snapshot() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

func readOps(t *testing.T, b []byte) []history.Op {
	t.Helper()
	ops, err := history.Read(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return ops
}

func kinds(t *testing.T, b []byte) map[history.F]int {
	t.Helper()
	ops, err := history.Read(bytes.NewReader(b))
	if err != nil {
		return nil // a line half written: look again
	}
	n := map[history.F]int{}
	for _, op := range ops {
		if op.Type == history.OK {
			n[op.F]++
		}
	}
	return n
}

// pollFor polls cond until it holds or d passes; a detail func, when
// given, says in the failure what was still missing.
func pollFor(t *testing.T, d time.Duration, what string, cond func() bool, detail ...func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			var more string
			for _, f := range detail {
				more += "; " + f()
			}
			t.Fatalf("timed out after %v waiting for %s%s", d, what, more)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
