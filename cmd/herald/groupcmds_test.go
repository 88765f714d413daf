package main

import (
	"context"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/client/fakebroker"
	heraldpb "github.com/heraldmq/herald/proto"
)

func produceLines(t *testing.T, ctx context.Context, addr string, lines ...string) {
	t.Helper()
	if _, _, err := runCLI(t, ctx, produceCmd, addr, strings.Join(lines, "\n")+"\n", "--topic", "t", "--linger", "0"); err != nil {
		t.Fatal(err)
	}
}

func sortedLines(s string) []string {
	l := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	sort.Strings(l)
	return l
}

func TestConsumeGroup(t *testing.T) {
	b := fakeBroker(t, fakebroker.Topic("t", 2))
	ctx := ctxT(t)
	produceLines(t, ctx, b.Addr(), "a", "b", "c", "d", "e")

	out, _, err := runCLI(t, ctx, consumeCmd, b.Addr(), "", "--topic", "t", "--group", "g", "--mode", "shared",
		"--from", "earliest", "--max", "5", "--name", "cli-1")
	if err != nil || strings.Join(sortedLines(out), ",") != "a,b,c,d,e" {
		t.Fatalf("consume --group: %q %v", out, err)
	}
	var acked int
	for p := uint32(0); p < 2; p++ {
		acked += len(b.Acked("g", p))
	}
	if acked != 5 {
		t.Fatalf("%d acked, want 5 (manual ack is the default)", acked)
	}
	if len(b.Subscriptions()) != 0 {
		t.Fatal("consume left its subscription")
	}
	req := b.SubscribeRequests()[0]
	if req.GetAutoAck() || req.GetMode() != heraldpb.SubscriptionMode_MODE_SHARED || req.GetCredits() != client.DefaultWindow ||
		req.GetMemberName() != "cli-1" || !req.GetStart().GetEarliest() {
		t.Fatalf("subscribe request %v", req)
	}

	// The group resumes where it stopped; --verbose shows the delivery count.
	type res struct {
		out string
		err error
	}
	done := make(chan res, 1)
	go func() {
		out, _, err := runCLI(t, ctx, consumeCmd, b.Addr(), "", "--topic", "t", "--group", "g", "--mode", "shared",
			"--max", "2", "--verbose", "--ack", "auto", "--window", "8", "--tags", "*")
		done <- res{out, err}
	}()
	waitSubs(t, b, 1)
	produceLines(t, ctx, b.Addr(), "f", "g")
	r := <-done
	if r.err != nil || strings.Count(r.out, "\n") != 2 || !strings.Contains(r.out, " delivery=1 ") || !strings.HasPrefix(r.out, "partition=") {
		t.Fatalf("second consume: %q %v", r.out, r.err)
	}
	req = b.SubscribeRequests()[1]
	if !req.GetAutoAck() || req.GetCredits() != 8 || req.GetFilterType() != heraldpb.FilterType_FILTER_TAG || req.GetFilter() != "*" {
		t.Fatalf("subscribe request %v", req)
	}

	// SIGINT ends it normally, after leaving the group.
	ictx, cancel := context.WithCancel(ctx)
	go func() {
		out, _, err := runCLI(t, ictx, consumeCmd, b.Addr(), "", "--topic", "t", "--group", "g2", "--filter", "region = 'eu'")
		done <- res{out, err}
	}()
	waitSubs(t, b, 1)
	cancel()
	if r := <-done; r.err != nil || r.out != "" {
		t.Fatalf("interrupted consume: %q %v", r.out, r.err)
	}
	waitSubs(t, b, 0) // unsubscribed, or (interrupted while subscribing) disconnected
	if req := b.SubscribeRequests()[2]; req.GetFilterType() != heraldpb.FilterType_FILTER_SQL || !req.GetStart().GetLatest() {
		t.Fatalf("subscribe request %v", req)
	}

	// A broker refusal is a failure (exit 1), on one line.
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetSubscribe() != nil {
			return fakebroker.Action{Error: heraldpb.NewError(heraldpb.ErrorCode_GROUP_CONFLICT, "group g uses mode shared")}
		}
		return fakebroker.Action{}
	})
	_, _, err = runCLI(t, ctx, consumeCmd, b.Addr(), "", "--topic", "t", "--group", "g", "--mode", "broadcast")
	if err == nil || isUsage(err) || !strings.Contains(err.Error(), "GROUP_CONFLICT") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("conflict: %v", err)
	}

	for _, args := range [][]string{
		{"--topic", "t", "--group", "g", "--tags", "a", "--filter", "b"},
		{"--topic", "t", "--group", "g", "--mode", "fanout"},
		{"--topic", "t", "--group", "g", "--ack", "sometimes"},
		{"--topic", "t", "--group", "g", "--window", "0"},
		{"--topic", "t", "--group", "g", "--max-wait", "1s"},
		{"--topic", "t", "--group", "g", "--from", "yesterday"},
		{"--topic", "t", "--group", "g", "--ack-timeout", "-1s"},
		{"--topic", "t", "--tags", "a"},
		{"--topic", "t", "--window", "5"},
		{"--topic", "t", "--orderly"},
		{"--group", "g"},
	} {
		if _, _, err := runCLI(t, ctx, consumeCmd, b.Addr(), "", args...); !isUsage(err) {
			t.Errorf("consume %v: %v, want a usage error", args, err)
		}
	}
}

func waitSubs(t *testing.T, b *fakebroker.Broker, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(b.Subscriptions()) != n {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %d subscriptions, have %d", n, len(b.Subscriptions()))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestGroupCommands(t *testing.T) {
	b := fakeBroker(t, fakebroker.Topic("t", 2))
	ctx := ctxT(t)
	out, _, err := runCLI(t, ctx, groupCmd, b.Addr(), "", "list")
	if err != nil || strings.TrimSpace(out) != "GROUP  TOPIC  MODE  MEMBERS  LAG" {
		t.Fatalf("empty list: %q %v", out, err)
	}
	if _, _, err := runCLI(t, ctx, groupCmd, b.Addr(), "", "describe", "g"); err == nil || !strings.Contains(err.Error(), "GROUP_NOT_FOUND") {
		t.Fatalf("describe unknown: %v", err)
	}
	produceLines(t, ctx, b.Addr(), "a", "b", "c", "d")

	c, err := client.Dial(ctx, b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var got atomic.Int64
	sub, err := c.Subscribe(ctx, client.SubscribeOptions{Group: "g", Topic: "t", From: client.Earliest(), Name: "worker-7", Tags: "*"},
		func(context.Context, *client.Delivered) { got.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	for got.Load() < 4 {
		time.Sleep(2 * time.Millisecond)
	}
	if err := sub.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	out, _, err = runCLI(t, ctx, groupCmd, b.Addr(), "", "list")
	if err != nil || !strings.Contains(out, "g      t      clustering  1        0") {
		t.Fatalf("list: %q %v", out, err)
	}
	out, _, err = runCLI(t, ctx, groupCmd, b.Addr(), "", "describe", "g")
	for _, want := range []string{"mode:         clustering", `filter:       tags "*"`, "MEMBER", "worker-7", "0,1", "closed",
		"PARTITION", "HIGH-WATERMARK", "total lag: 0"} {
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("describe: missing %q in\n%s (%v)", want, out, err)
		}
	}

	var resets atomic.Int64
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetResetGroup() != nil {
			resets.Add(1)
		}
		return fakebroker.Action{}
	})
	_, _, err = runCLI(t, ctx, groupCmd, b.Addr(), "", "reset", "g", "--to", "earliest")
	if err == nil || isUsage(err) || !strings.Contains(err.Error(), "worker-7") || !strings.Contains(err.Error(), "--force") || resets.Load() != 0 {
		t.Fatalf("reset with members: %v (%d reset requests)", err, resets.Load())
	}
	out, _, err = runCLI(t, ctx, groupCmd, b.Addr(), "", "reset", "g", "--to", "earliest", "--force")
	if err != nil || !strings.Contains(out, "reset group g to earliest") || !strings.Contains(out, "total lag: 4") {
		t.Fatalf("forced reset: %q %v", out, err)
	}
	sub.Close(ctx)
	out, _, err = runCLI(t, ctx, groupCmd, b.Addr(), "", "reset", "g", "--to", "1", "--partitions", "0,1")
	if err != nil || !strings.Contains(out, "reset group g to offset 1") {
		t.Fatalf("reset to an offset: %q %v", out, err)
	}
	out, _, err = runCLI(t, ctx, groupCmd, b.Addr(), "", "reset", "g", "--to", time.Now().Add(-time.Hour).Format(time.RFC3339))
	if err != nil || !strings.Contains(out, "total lag: 4") {
		t.Fatalf("reset to a time: %q %v", out, err)
	}

	for _, args := range [][]string{
		{}, {"frob"}, {"describe"}, {"list", "x"}, {"reset", "g"}, {"reset", "g", "--to", "yesterday"},
		{"describe", "g", "--force"}, {"list", "--to", "earliest"}, {"reset", "g", "--to", "earliest", "--partitions", "a"},
		{"reset", "g", "--to", "-3"},
	} {
		if _, _, err := runCLI(t, ctx, groupCmd, b.Addr(), "", args...); !isUsage(err) {
			t.Errorf("group %v: %v, want a usage error", args, err)
		}
	}
}
