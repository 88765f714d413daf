package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/heraldmq/herald/broker"
)

// startBroker starts a real in-process broker on loopback with a temporary
// data dir (fsync on every write, as by default) and returns its address.
func startBroker(t *testing.T) string {
	t.Helper()
	cfg := broker.Default()
	cfg.DataDir, cfg.Listen, cfg.Admin, cfg.LogLevel = t.TempDir(), "127.0.0.1:0", "", "warn"
	b, err := broker.Start(cfg, slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Shutdown() })
	return b.ClientAddr()
}

// benchJSON runs herald bench (args may start with "rr") with --json and
// decodes its summary into sum.
func benchJSON(t *testing.T, ctx context.Context, addr string, sum any, args ...string) {
	t.Helper()
	out, stderr, err := runCLI(t, ctx, benchFn(&args), addr, "", append(args, "--json", "--report-interval", "0")...)
	if err != nil {
		t.Fatalf("bench %v: %v\n%s%s", args, err, stderr, out)
	}
	if err := json.Unmarshal([]byte(out), sum); err != nil {
		t.Fatalf("bench %v: %v in %q", args, err, out)
	}
}

// benchFn returns the command that runs args: benchRRCmd for "rr ...",
// with "rr" taken off (runCLI puts --addr before the arguments), else
// benchCmd.
func benchFn(args *[]string) func(context.Context, []string, cliIO) error {
	if len(*args) > 0 && (*args)[0] == "rr" {
		*args = (*args)[1:]
		return benchRRCmd
	}
	return benchCmd
}

func TestBenchFlags(t *testing.T) {
	ctx := ctxT(t)
	const addr = "127.0.0.1:1" // flags are checked before dialling
	for _, args := range [][]string{
		{"--producers", "-1"},
		{"--producers", "0", "--consumers", "0"},
		{"--producers", "0", "--count", "10"},                                        // needs --group
		{"--producers", "0", "--group", "g", "--from", "earliest"},                   // needs --count
		{"--producers", "0", "--group", "g", "--count", "10"},                        // needs --from
		{"--producers", "0", "--group", "g", "--count", "10", "--from", "latest"},    // gets nothing
		{"--producers", "0", "--group", "g", "--count", "10", "--from", "yesterday"}, // bad --from
		{"--producers", "0", "--group", "g", "--count", "10", "--consumers", "0", "--from", "earliest"},
		{"--mode", "shared"}, {"--window", "8"}, {"--auto-ack"}, {"--concurrency", "2"}, {"--from", "earliest"}, // need --group
		{"--group", "g", "--mode", "broadcast"},
		{"--group", "g", "--mode", "fanout"},
		{"--group", "g", "--mode", "key-shared"}, // needs --keys
		{"--group", "g", "--window", "0"},
		{"--group", "g", "--window", "70000"},
		{"--group", "g", "--concurrency", "0"},
		{"--keys", "-1"},
		{"--size", "8"},
		{"--rr"},
		{"--size", "100", "rr"}, // rr comes first
		{"rr", "--responders", "0"},
		{"rr", "--clients", "0"},
		{"rr", "--size", "7"},
		{"rr", "--concurrency", "0"},
		{"rr", "--window", "0"},
		{"rr", "--rate", "-1"},
		{"rr", "--duration", "0"},
		{"rr", "--group", ""},
		{"rr", "extra"},
	} {
		if _, _, err := runCLI(t, ctx, benchFn(&args), addr, "", args...); !isUsage(err) {
			t.Errorf("bench %v: %v, want a usage error", args, err)
		}
	}
	for _, args := range [][]string{{"-h"}, {"rr", "-h"}} {
		_, stderr, err := runCLI(t, ctx, benchFn(&args), addr, "", args...)
		if !errors.Is(err, errCLIHelp) || !strings.Contains(stderr, "usage: herald bench") || !strings.Contains(stderr, "-concurrency") {
			t.Errorf("bench %v: %v\n%s", args, err, stderr)
		}
	}
}

func TestBenchPush(t *testing.T) {
	addr := startBroker(t)
	ctx := ctxT(t)

	// Fill a topic, then read it back by push from a new group.
	var sum benchSummary
	benchJSON(t, ctx, addr, &sum, "--count", "2000", "--size", "64", "--consumers", "0", "--topic", "filled", "--partitions", "3")
	if sum.Produced != 2000 || sum.ProduceErrors != 0 {
		t.Fatalf("fill: %+v", sum)
	}
	sum = benchSummary{}
	benchJSON(t, ctx, addr, &sum, "--producers", "0", "--group", "g", "--from", "earliest", "--count", "2000", "--consumers", "2", "--topic", "filled")
	if sum.Expected != 2000 || sum.Consumed != 2000 || sum.Missing != 0 || sum.UnexpectedDuplicates != 0 || sum.Ignored != 0 ||
		sum.ConsumeMode != "shared" || sum.Window != benchDefaultWindow || sum.AutoAck || sum.ConsumedPerSec <= 0 || sum.LatencyMaxMs != 0 {
		t.Fatalf("push from a filled topic: %+v", sum)
	}

	// The group has consumed everything: a second run gets nothing, says
	// so and fails (not a usage error).
	out, _, err := runCLI(t, ctx, benchCmd, addr, "", "--producers", "0", "--group", "g", "--from", "earliest", "--count", "2000",
		"--topic", "filled", "--drain-timeout", "200ms", "--report-interval", "0")
	if err == nil || isUsage(err) || !strings.Contains(err.Error(), "2000 of 2000 records were not consumed") ||
		!strings.Contains(err.Error(), "use a new --group") || !strings.Contains(out, "2000 missing") {
		t.Fatalf("drained group: %v\n%s", err, out)
	}

	// Produce and consume at once, in each mode.
	for _, args := range [][]string{
		{"--group", "live-shared", "--consumers", "2", "--acks", "leader"},
		{"--group", "live-clustering", "--consumers", "2", "--mode", "clustering", "--concurrency", "2"},
		{"--group", "live-keys", "--consumers", "2", "--mode", "key-shared", "--keys", "16", "--auto-ack", "--concurrency", "3", "--window", "64"},
	} {
		sum = benchSummary{}
		benchJSON(t, ctx, addr, &sum, append([]string{"--count", "2000", "--size", "100", "--topic", "live", "--partitions", "2"}, args...)...)
		if sum.Produced != 2000 || sum.Consumed != 2000 || sum.Missing != 0 || sum.UnexpectedDuplicates != 0 || sum.Ignored != 0 ||
			sum.LatencyMaxMs <= 0 || sum.ConsumeErrors != 0 {
			t.Fatalf("bench %v: %+v", args, sum)
		}
	}

	// A new group from earliest on a topic with records of earlier runs
	// counts only this run's.
	sum = benchSummary{}
	benchJSON(t, ctx, addr, &sum, "--count", "500", "--size", "100", "--topic", "live", "--group", "late", "--from", "earliest")
	if sum.Consumed != 500 || sum.Missing != 0 || sum.Ignored == 0 {
		t.Fatalf("from earliest with old records: %+v", sum)
	}

	// The text summary.
	out, _, err = runCLI(t, ctx, benchCmd, addr, "", "--count", "300", "--size", "100", "--topic", "live", "--group", "text",
		"--report-interval", "0")
	for _, want := range []string{"push: group text, shared, window 1024, manual acks, concurrency 1", "consumed 300 of 300 records",
		"0 missing", "latency produce-to-consume: p50"} {
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("missing %q in\n%s(%v)", want, out, err)
		}
	}
}

func TestBenchRR(t *testing.T) {
	addr := startBroker(t)
	ctx := ctxT(t)
	var sum benchRRSummary
	benchJSON(t, ctx, addr, &sum, "rr", "--count", "200", "--clients", "2", "--responders", "2", "--concurrency", "2", "--size", "64")
	if sum.Calls != 200 || sum.Errors != 0 || sum.ResponderErrors != 0 || sum.RTTMaxMs <= 0 || sum.RTTP50Ms > sum.RTTP99Ms ||
		sum.CallsPerSec <= 0 || sum.Responders != 2 || sum.Clients != 2 || sum.Topic != "herald-bench-rr" {
		t.Fatalf("rr: %+v", sum)
	}
	out, _, err := runCLI(t, ctx, benchRRCmd, addr, "", "--duration", "300ms", "--rate", "300", "--report-interval", "100ms", "--topic", "rr2")
	for _, want := range []string{"calls", "/s  rtt p50", "300 calls/s in total", "(0 errors, 0 responder errors)", "rtt: p50"} {
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("missing %q in\n%s(%v)", want, out, err)
		}
	}
}

func TestBenchSeen(t *testing.T) {
	var s benchSeen
	for seq := uint64(0); seq < 1000; seq++ {
		if !s.add(seq%3, seq, false) {
			t.Fatalf("pair %d new but not fresh", seq)
		}
	}
	if s.add(1, 1, true) || s.add(2, 2, false) || !s.add(0, 1<<20, true) {
		t.Fatal("fresh wrong for repeats")
	}
	if d, u := s.dups(); s.distinct() != 1001 || d != 2 || u != 1 {
		t.Fatalf("distinct %d, dups %d, unexpected %d; want 1001, 2, 1", s.distinct(), d, u)
	}

	v := benchValid{minNs: 100, ids: 2, seqs: 10}
	rec := func(sent int64, id, seq uint64) []byte {
		b := make([]byte, benchHeader+4)
		binary.BigEndian.PutUint64(b, uint64(sent))
		binary.BigEndian.PutUint64(b[8:], id<<benchSeqBits|seq)
		return b
	}
	if _, id, seq, ok := v.parse(rec(100, 1, 9)); !ok || id != 1 || seq != 9 {
		t.Fatalf("valid record: %d %d %v", id, seq, ok)
	}
	for _, b := range [][]byte{rec(99, 0, 0), rec(100, 2, 0), rec(100, 0, 10), rec(100, 0, 0)[:benchHeader-1]} {
		if _, _, _, ok := v.parse(b); ok {
			t.Errorf("record %x counted", b)
		}
	}
}

// BenchmarkBenchTake measures what counting one consumed record costs the
// bench client: header parse, distinct tracking and latency recording.
func BenchmarkBenchTake(b *testing.B) {
	stats := newBenchStats(benchValid{ids: 1, seqs: 1 << benchSeqBits}, true)
	k := stats.newSink()
	v := make([]byte, 100)
	b.ReportAllocs()
	k.mu.Lock()
	for i := 0; i < b.N; i++ {
		binary.BigEndian.PutUint64(v[8:], uint64(i))
		stats.takeLocked(k, 1000, v, false, nil)
	}
	k.mu.Unlock()
}
