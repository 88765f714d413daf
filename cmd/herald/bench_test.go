package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/broker"
	"github.com/heraldmq/herald/client"
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

// dialT dials the broker at addr, closed by t.Cleanup.
func dialT(t *testing.T, ctx context.Context, addr string) *client.Client {
	t.Helper()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// benchJSON runs herald bench (args may start with "rr" or "half") with --json and
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
// benchHalfCmd for "half ...", with the word taken off (runCLI puts --addr
// before the arguments), else benchCmd.
func benchFn(args *[]string) func(context.Context, []string, cliIO) error {
	if len(*args) > 0 {
		switch (*args)[0] {
		case "rr":
			*args = (*args)[1:]
			return benchRRCmd
		case "half":
			*args = (*args)[1:]
			return benchHalfCmd
		}
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
		{"--txn-size", "-1"},
		{"--txn-size", "10", "--delay", "1s"},
		{"--txn-size", "10", "--fire-rate", "10", "--count", "10"},
		{"--txn-size", "10", "--acks", "leader"},
		{"--txn-size", "10", "--linger", "1ms"},
		{"--txn-size", "10", "--in-flight", "8"},
		{"--txn-size", "10", "--producers", "0", "--group", "g", "--count", "10", "--from", "earliest"},
		{"--isolation", "read-committed"},
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
		{"--size", "100", "half"}, // half comes first
		{"half", "--producers", "0"},
		{"half", "--size", "0"},
		{"half", "--partitions", "0"},
		{"half", "--group", ""},
		{"half", "--duration", "0"},
		{"half", "--count", "-1"},
		{"half", "--check", "-1"},
		{"half", "--check", "10", "--count", "10"},
		{"half", "--check", "10", "--duration", "1s"},
		{"half", "--check-after", "50ms"},
		{"half", "--check-after", "2000h"},
		{"half", "--max-checks", "-1"},
		{"half", "--drain-timeout", "1s"}, // needs --check
		{"half", "--check", "10", "--drain-timeout", "-1s"},
		{"half", "extra"},
	} {
		if _, _, err := runCLI(t, ctx, benchFn(&args), addr, "", args...); !isUsage(err) {
			t.Errorf("bench %v: %v, want a usage error", args, err)
		}
	}
	for _, c := range []struct{ args []string }{{[]string{"-h"}}, {[]string{"rr", "-h"}}, {[]string{"half", "-h"}}} {
		args := c.args
		flag := "-concurrency"
		if args[0] == "half" {
			flag = "-check-after"
		}
		_, stderr, err := runCLI(t, ctx, benchFn(&args), addr, "", args...)
		if !errors.Is(err, errCLIHelp) || !strings.Contains(stderr, "usage: herald bench") || !strings.Contains(stderr, flag) {
			t.Errorf("bench %v: %v\n%s", c.args, err, stderr)
		}
	}
	// herald bench dispatches to the subcommand named first.
	var stderr strings.Builder
	if err := benchCmd(ctx, []string{"half", "-h"}, cliIO{in: strings.NewReader(""), out: io.Discard, err: &stderr}); !errors.Is(err, errCLIHelp) ||
		!strings.Contains(stderr.String(), "usage: herald bench half") {
		t.Errorf("bench half -h: %v\n%s", err, stderr.String())
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

func TestBenchHalf(t *testing.T) {
	addr := startBroker(t)
	ctx := ctxT(t)
	var sum benchHalfSummary
	benchJSON(t, ctx, addr, &sum, "half", "--count", "50", "--producers", "2", "--size", "64", "--partitions", "2")
	if sum.Mode != "commit" || sum.Stored != 50 || sum.Committed != 50 || sum.SendErrors != 0 || sum.CommitErrors != 0 || sum.FirstError != "" ||
		sum.Producers != 2 || sum.Partitions != 2 || sum.Topic != "herald-bench-half" || sum.Group != "herald-bench-half" ||
		sum.CommittedPerSec <= 0 || sum.CommittedMBPerSec <= 0 || sum.Seconds <= 0 {
		t.Fatalf("commit: %+v", sum)
	}
	for _, l := range [][4]float64{
		{sum.SendP50Ms, sum.SendP90Ms, sum.SendP99Ms, sum.SendMaxMs},
		{sum.CommitP50Ms, sum.CommitP90Ms, sum.CommitP99Ms, sum.CommitMaxMs},
		{sum.WholeP50Ms, sum.WholeP90Ms, sum.WholeP99Ms, sum.WholeMaxMs},
	} {
		if l[0] <= 0 || l[0] > l[1] || l[1] > l[2] || l[2] > l[3] {
			t.Fatalf("latency quantiles %v out of order: %+v", l, sum)
		}
	}
	if sum.WholeMaxMs < sum.SendMaxMs || sum.WholeMaxMs < sum.CommitMaxMs || sum.WholeP50Ms < sum.SendP50Ms {
		t.Fatalf("send and commit take longer than both: %+v", sum)
	}
	// Every committed half was appended, once.
	c := dialT(t, ctx, addr)
	if hw, err := benchHighWatermarks(ctx, c, "herald-bench-half", 2); err != nil || hw != 50 {
		t.Fatalf("topic holds %d records (%v), want 50", hw, err)
	}
	if _, n, err := c.ListTxn(ctx, "herald-bench-half", 1); err != nil || n != 0 {
		t.Fatalf("%d halves left pending (%v)", n, err)
	}

	// The text summary and progress lines, for a duration.
	out, _, err := runCLI(t, ctx, benchHalfCmd, addr, "", "--duration", "300ms", "--report-interval", "100ms", "--topic", "half2", "--size", "10")
	for _, want := range []string{"committed ", "/s  send p50", "SendHalf then Commit in a closed loop", "failed: 0 sends, 0 commits",
		"latency SendHalf: p50", "latency Commit:   p50", "latency both:     p50"} {
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("missing %q in\n%s(%v)", want, out, err)
		}
	}
}

func TestBenchHalfCheck(t *testing.T) {
	addr := startBroker(t)
	ctx := ctxT(t)
	var sum benchHalfSummary
	benchJSON(t, ctx, addr, &sum, "half", "--check", "50", "--check-after", "300ms", "--producers", "5", "--size", "64", "--topic", "checked")
	if sum.Mode != "check" || sum.Stored != 50 || sum.Committed != 0 || sum.SendErrors != 0 || sum.FirstError != "" || sum.StoredPerSec <= 0 ||
		sum.Resolved != 50 || sum.Pending != 0 || sum.Appended != 50 || sum.HalvesChecked != 50 || sum.ChecksReceived < 50 ||
		sum.CheckSeconds <= 0 || sum.ResolvedPerSec <= 0 || sum.LastCheck < 1 || sum.LastCheck > sum.MaxChecks || sum.MaxChecks != 15 ||
		sum.SendMaxMs <= 0 || sum.CommitMaxMs != 0 || sum.CheckAfterMs != 300 {
		t.Fatalf("check: %+v", sum)
	}
	// Each half needed as many checks as it got plus those skipped.
	if sum.ChecksSkipped < 0 || sum.ChecksReceived+sum.ChecksSkipped < int64(sum.LastCheck) {
		t.Fatalf("check counts: %+v", sum)
	}
	c := dialT(t, ctx, addr)
	if _, n, err := c.ListTxn(ctx, "herald-bench-half", 1); err != nil || n != 0 {
		t.Fatalf("%d halves left pending (%v)", n, err)
	}
	if hw, err := benchHighWatermarks(ctx, c, "checked", 4); err != nil || hw != 50 {
		t.Fatalf("topic holds %d records (%v), want 50", hw, err)
	}

	// A group with a half pending from elsewhere is refused: the checker
	// would resolve it too.
	if _, err := c.SendHalf(ctx, &client.Message{Topic: "checked", Value: []byte("x")}, client.HalfOptions{ProducerGroup: "busy", CheckInterval: time.Hour}); err != nil {
		t.Fatal(err)
	}
	_, _, err := runCLI(t, ctx, benchHalfCmd, addr, "", "--check", "5", "--group", "busy", "--report-interval", "0")
	if err == nil || isUsage(err) || !strings.Contains(err.Error(), "producer group busy has 1 half message pending already") {
		t.Fatalf("busy group: %v", err)
	}

	// The text summary.
	out, _, err := runCLI(t, ctx, benchHalfCmd, addr, "", "--check", "20", "--check-after", "300ms", "--producers", "4", "--group", "text", "--report-interval", "0")
	for _, want := range []string{"1 checker commits each at its check-back", "stored 20 half messages in", "from the first check-back: ",
		"checks: ", "received for 20 half messages", "left pending: 0; topic grew by 20 records"} {
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("missing %q in\n%s(%v)", want, out, err)
		}
	}
}

// TestBenchTxn: with --txn-size each producer commits every N records
// (the last transaction shorter); every record is consumed once, and the
// summary gives the transactions, their rate and commit latency.
func TestBenchTxn(t *testing.T) {
	addr := startBroker(t)
	ctx := ctxT(t)
	var sum benchSummary
	benchJSON(t, ctx, addr, &sum, "--count", "500", "--txn-size", "50", "--producers", "2", "--size", "64", "--partitions", "2", "--isolation", "read_uncommitted")
	if sum.Produced != 500 || sum.ProduceErrors != 0 || sum.TxnSize != 50 || sum.Transactions != 10 || sum.TxnFailed != 0 || sum.TransactionsPerSec <= 0 ||
		sum.Consumed != 500 || sum.Missing != 0 || sum.Duplicates != 0 || sum.Isolation != "read_uncommitted" ||
		sum.CommitP50Ms <= 0 || sum.CommitP50Ms > sum.CommitP99Ms || sum.CommitP99Ms > sum.CommitMaxMs || sum.AckLatencyP50Ms < sum.CommitP50Ms/2 {
		t.Fatalf("txn: %+v", sum)
	}
	// Keyed records, and a last transaction shorter than --txn-size.
	sum = benchSummary{}
	benchJSON(t, ctx, addr, &sum, "--count", "100", "--txn-size", "7", "--keys", "8", "--size", "64", "--topic", "keyed", "--partitions", "3")
	if sum.Produced != 100 || sum.Transactions != 15 || sum.Consumed != 100 || sum.UnexpectedDuplicates != 0 || sum.Isolation != "read_committed" {
		t.Fatalf("keyed txn: %+v", sum)
	}
	// Written once, with commits in flight: never more than --txn-in-flight
	// at a time.
	sum = benchSummary{}
	benchJSON(t, ctx, addr, &sum, "--count", "600", "--txn-size", "10", "--txn-written-once", "--txn-in-flight", "3", "--size", "64", "--topic", "piped", "--partitions", "2")
	if sum.Produced != 600 || sum.Transactions != 60 || sum.TxnFailed != 0 || sum.Consumed != 600 || sum.UnexpectedDuplicates != 0 ||
		sum.TxnInFlightMax < 1 || sum.TxnInFlightMax > 3 {
		t.Fatalf("txn written once, 3 in flight: %+v", sum)
	}
	c := dialT(t, ctx, addr)
	infos, _, err := c.ListTransactions(ctx, "herald-bench-0", 0)
	if err != nil || len(infos) != 1 || infos[0].GetState() != "empty" {
		t.Fatalf("herald-bench-0 after the run: %v %v", infos, err)
	}

	// The text summary.
	out, _, err := runCLI(t, ctx, benchCmd, addr, "", "--count", "60", "--txn-size", "20", "--size", "64", "--topic", "text", "--report-interval", "0")
	for _, want := range []string{"transactions of 20 records: 3 committed, ", "(0 failed); commit latency p50 ", "latency produce-to-commit: p50",
		"consumed 60 of 60 records"} {
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
