package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/client/fakebroker"
)

func fakeBroker(t *testing.T, opts ...fakebroker.Opt) *fakebroker.Broker {
	t.Helper()
	b, err := fakebroker.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// runCLI runs one client command in-process against addr.
func runCLI(t *testing.T, ctx context.Context, fn func(context.Context, []string, cliIO) error, addr, stdin string, args ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	args = append([]string{"--addr", addr}, args...)
	err := fn(ctx, args, cliIO{in: strings.NewReader(stdin), out: &out, err: &errb})
	return out.String(), errb.String(), err
}

func isUsage(err error) bool {
	var ue usageError
	return errors.As(err, &ue)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestTopicCommands(t *testing.T) {
	b := fakeBroker(t)
	ctx := ctxT(t)
	out, _, err := runCLI(t, ctx, topicCmd, b.Addr(), "", "create", "orders", "--partitions", "3", "--retention", "24h")
	if err != nil || !strings.Contains(out, "created topic orders with 3 partitions") {
		t.Fatalf("create: %q %v", out, err)
	}
	if _, _, err := runCLI(t, ctx, topicCmd, b.Addr(), "", "create", "orders", "--partitions", "3"); err == nil || isUsage(err) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("duplicate create: %v", err)
	}
	out, _, err = runCLI(t, ctx, topicCmd, b.Addr(), "", "list")
	if err != nil || !strings.Contains(out, "NAME") || !strings.Contains(out, "orders") || !strings.Contains(out, "24h0m0s") {
		t.Fatalf("list: %q %v", out, err)
	}
	out, _, err = runCLI(t, ctx, topicCmd, b.Addr(), "", "describe", "orders")
	if err != nil || strings.Count(out, "\n") < 10 || !strings.Contains(out, "HIGH-WATERMARK") {
		t.Fatalf("describe: %q %v", out, err)
	}
	if _, _, err = runCLI(t, ctx, topicCmd, b.Addr(), "", "delete", "orders"); err != nil {
		t.Fatal(err)
	}
	if _, _, err = runCLI(t, ctx, topicCmd, b.Addr(), "", "describe", "orders"); err == nil || !strings.Contains(err.Error(), "TOPIC_NOT_FOUND") {
		t.Fatalf("describe deleted: %v", err)
	}
	for _, args := range [][]string{{}, {"frob"}, {"create"}, {"create", "x", "--partitions", "0"}, {"list", "x"}, {"create", "x", "--bogus"}} {
		if _, _, err := runCLI(t, ctx, topicCmd, b.Addr(), "", args...); !isUsage(err) {
			t.Errorf("topic %v: %v, want a usage error", args, err)
		}
	}
}

func TestProduceAndConsume(t *testing.T) {
	b := fakeBroker(t, fakebroker.Topic("t", 3))
	ctx := ctxT(t)
	_, stderr, err := runCLI(t, ctx, produceCmd, b.Addr(), "one\ntwo\nthree\n", "--topic", "t", "--partition", "1")
	if err != nil || !strings.Contains(stderr, "3 of 3 records acknowledged") {
		t.Fatalf("produce stdin: %q %v", stderr, err)
	}
	if recs := b.Records("t", 1); len(recs) != 3 || string(recs[2].GetValue()) != "three" {
		t.Fatalf("partition 1 = %v", recs)
	}
	_, stderr, err = runCLI(t, ctx, produceCmd, b.Addr(), "", "--topic", "t", "--count", "30", "--size", "12", "--acks", "leader")
	if err != nil || !strings.Contains(stderr, "30 of 30") {
		t.Fatalf("produce --count: %q %v", stderr, err)
	}
	_, _, err = runCLI(t, ctx, produceCmd, b.Addr(), "k1\n", "--topic", "t", "--key", "user-1")
	if err != nil {
		t.Fatal(err)
	}

	out, _, err := runCLI(t, ctx, consumeCmd, b.Addr(), "", "--topic", "t")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 34 {
		t.Fatalf("consume printed %d lines, want 34:\n%s", len(lines), out)
	}
	seen := map[string]bool{}
	for _, l := range lines {
		if seen[l] {
			t.Fatalf("duplicate value %q", l)
		}
		seen[l] = true
		if len(l) != 12 && l != "one" && l != "two" && l != "three" && l != "k1" {
			t.Fatalf("unexpected value %q", l)
		}
	}
	out, _, err = runCLI(t, ctx, consumeCmd, b.Addr(), "", "--topic", "t", "--partition", "1", "--from", "1", "--max", "1", "--verbose")
	if err != nil || !strings.HasPrefix(out, "partition=1 offset=1 ") || !strings.HasSuffix(out, "\ttwo\n") {
		t.Fatalf("consume --verbose: %q %v", out, err)
	}
	out, _, err = runCLI(t, ctx, consumeCmd, b.Addr(), "", "--topic", "t", "--from", "latest")
	if err != nil || out != "" {
		t.Fatalf("consume from latest: %q %v", out, err)
	}
	out, _, err = runCLI(t, ctx, consumeCmd, b.Addr(), "", "--topic", "t", "--from", time.Now().Add(-time.Hour).Format(time.RFC3339), "--partition", "1")
	if err != nil || !strings.HasPrefix(out, "one\ntwo\nthree\n") {
		t.Fatalf("consume --from time: %q %v", out, err)
	}
	// --from past the end: said on stderr; an error unless --follow.
	out, stderr, err = runCLI(t, ctx, consumeCmd, b.Addr(), "", "--topic", "t", "--partition", "1", "--from", "5000")
	if err == nil || out != "" || !strings.Contains(stderr, "partition 1: --from 5000 is past the end of the log (high watermark ") || !strings.Contains(err.Error(), "past the end") {
		t.Fatalf("consume --from past the end: out %q, stderr %q, err %v", out, stderr, err)
	}
	fctx, cancel := context.WithCancel(ctx)
	stop := time.AfterFunc(300*time.Millisecond, cancel) // ends --follow as SIGINT would
	defer stop.Stop()
	out, stderr, err = runCLI(t, fctx, consumeCmd, b.Addr(), "", "--topic", "t", "--partition", "1", "--from", "5000", "--follow", "--max-wait", "50ms")
	if err != nil || out != "" || !strings.Contains(stderr, "; reading from the high watermark") {
		t.Fatalf("consume --follow --from past the end: out %q, stderr %q, err %v", out, stderr, err)
	}
	for _, args := range [][]string{
		{"--topic", "t", "--group", "g", "--partition", "1"}, {"--topic", "t", "--mode", "shared"}, {"--topic", "t", "--filter", "x"},
		{"--topic", "t", "--ack", "manual"}, {}, {"--topic", "t", "--from", "yesterday"},
	} {
		if _, _, err := runCLI(t, ctx, consumeCmd, b.Addr(), "", args...); !isUsage(err) {
			t.Errorf("consume %v: %v, want a usage error", args, err)
		}
	}
	for _, args := range [][]string{
		{"--topic", "t", "--delay", "-1s"}, {"--topic", "t", "--delay", "500us"}, {"--topic", "t", "--at", "tomorrow"},
		{"--topic", "t", "--delay", "1s", "--at", "2030-01-01T00:00:00Z"}, {"--topic", "t", "--priority", "10"}, {"--topic", "t", "--ttl", "-1s"},
		{}, {"--topic", "t", "--acks", "some"},
	} {
		if _, _, err := runCLI(t, ctx, produceCmd, b.Addr(), "", args...); !isUsage(err) {
			t.Errorf("produce %v: %v, want a usage error", args, err)
		}
	}
	if _, _, err := runCLI(t, ctx, produceCmd, b.Addr(), "x\n", "--topic", "missing"); err == nil || isUsage(err) {
		t.Errorf("produce to a missing topic: %v", err)
	}
}

// TestProducePartitionFlag: --partition N writes every record to N, 0
// included and whatever the key; without it (or with -1) a keyed record
// goes to its key's partition.
func TestProducePartitionFlag(t *testing.T) {
	b := fakeBroker(t, fakebroker.Topic("t", 3))
	ctx := ctxT(t)
	key := "user-1"
	keyed := client.PartitionForKey([]byte(key), 3)
	manual := (keyed + 1) % 3
	for _, c := range []struct {
		args []string
		part uint32
	}{
		{[]string{"--key", key}, keyed},
		{[]string{"--key", key, "--partition", "-1"}, keyed},
		{[]string{"--key", key, "--partition", strconv.Itoa(int(manual))}, manual},
		{[]string{"--partition", "0"}, 0},
	} {
		before := len(b.Records("t", c.part))
		args := append([]string{"--topic", "t"}, c.args...)
		if _, stderr, err := runCLI(t, ctx, produceCmd, b.Addr(), "a\nb\n", args...); err != nil || !strings.Contains(stderr, "2 of 2 records acknowledged") {
			t.Fatalf("produce %v: %q %v", c.args, stderr, err)
		}
		if n := len(b.Records("t", c.part)) - before; n != 2 {
			t.Fatalf("produce %v: partition %d got %d of 2 records", c.args, c.part, n)
		}
	}
	if _, _, err := runCLI(t, ctx, produceCmd, b.Addr(), "a\n", "--topic", "t", "--partition", "-2"); !isUsage(err) {
		t.Fatalf("--partition -2: %v, want a usage error", err)
	}
	if _, _, err := runCLI(t, ctx, produceCmd, b.Addr(), "a\n", "--topic", "t", "--partition", "3"); err == nil || !strings.Contains(err.Error(), "PARTITION_NOT_FOUND") {
		t.Fatalf("--partition 3 of 3: %v, want PARTITION_NOT_FOUND", err)
	}
}

func TestConsumeFollow(t *testing.T) {
	b := fakeBroker(t, fakebroker.Topic("t", 2))
	ctx := ctxT(t)
	type res struct {
		out string
		err error
	}
	done := make(chan res, 1)
	go func() {
		out, _, err := runCLI(t, ctx, consumeCmd, b.Addr(), "", "--topic", "t", "--follow", "--from", "latest", "--max", "4", "--max-wait", "50ms")
		done <- res{out, err}
	}()
	// Produce until the follower has seen enough: it starts at latest, so
	// records written before it resolved its start are not printed.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		select {
		case r := <-done:
			if r.err != nil || strings.Count(r.out, "\n") != 4 {
				t.Fatalf("follow: %q %v", r.out, r.err)
			}
			// Interrupting a follower is a normal end.
			ictx, cancel := context.WithCancel(ctx)
			go cancel()
			if _, _, err := runCLI(t, ictx, consumeCmd, b.Addr(), "", "--topic", "t", "--follow"); err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("interrupted follow: %v", err)
			}
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("follower never finished")
		}
		if _, _, err := runCLI(t, ctx, produceCmd, b.Addr(), fmt.Sprintf("v%d\n", i), "--topic", "t", "--linger", "0"); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBenchJSON(t *testing.T) {
	b := fakeBroker(t)
	ctx := ctxT(t)
	out, _, err := runCLI(t, ctx, benchCmd, b.Addr(), "", "--count", "400", "--producers", "2", "--consumers", "2",
		"--size", "64", "--partitions", "3", "--topic", "bt", "--json", "--report-interval", "10ms")
	if err != nil {
		t.Fatal(err)
	}
	var sum benchSummary
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatalf("%v in %q", err, out)
	}
	if sum.Produced != 400 || sum.Consumed != 400 || sum.Partitions != 3 || sum.LatencyMaxMs <= 0 || sum.ProduceErrors != 0 {
		t.Fatalf("summary %+v", sum)
	}
	out, _, err = runCLI(t, ctx, benchCmd, b.Addr(), "", "--duration", "300ms", "--rate", "500", "--topic", "bt", "--report-interval", "100ms")
	if err != nil || !strings.Contains(out, "latency produce-to-consume") || !strings.Contains(out, "msg/s") {
		t.Fatalf("bench --rate: %q %v", out, err)
	}
	if _, _, err := runCLI(t, ctx, benchCmd, b.Addr(), "", "--size", "8"); !isUsage(err) {
		t.Fatalf("bench --size 8: %v", err)
	}
}

// TestCommandWaitsForAStartingBroker: a command run while the broker is
// still starting (its port not yet listening, as right after a restart)
// waits up to --connect-timeout for it instead of failing with "connection
// refused" (issue 15: consume failed where produce retried).
func TestCommandWaitsForAStartingBroker(t *testing.T) {
	b := fakeBroker(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there yet
	done := make(chan error, 1)
	go func() {
		_, _, err := runCLI(t, ctxT(t), topicCmd, addr, "", "list", "--connect-timeout", "10s")
		done <- err
	}()
	// The broker starts a moment later: a proxy to the fake broker on the
	// address the command dials.
	time.Sleep(300 * time.Millisecond)
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", b.Addr())
			if err != nil {
				c.Close()
				return
			}
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
	if err := <-done; err != nil {
		t.Fatalf("topic list against a broker that started 300 ms later: %v", err)
	}
	// With nothing listening at all, it gives up after --connect-timeout.
	start := time.Now()
	if _, _, err := runCLI(t, ctxT(t), topicCmd, "127.0.0.1:1", "", "list", "--connect-timeout", "300ms"); err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("no broker: %v after %v", err, time.Since(start))
	}
}
