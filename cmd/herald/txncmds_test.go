package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/client/fakebroker"
	heraldpb "github.com/heraldmq/herald/proto"
)

// sendHalves stores one half message per value, of producer group pg.
func sendHalves(t *testing.T, ctx context.Context, addr string, values ...string) []*client.Half {
	t.Helper()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var out []*client.Half
	for _, v := range values {
		h, err := c.SendHalf(ctx, &client.Message{Topic: "t", Value: []byte(v)}, client.HalfOptions{ProducerGroup: "pg", MaxChecks: 5})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
	return out
}

func TestTxnCommands(t *testing.T) {
	b := fakeBroker(t, fakebroker.Topic("t", 1))
	ctx := ctxT(t)
	hs := sendHalves(t, ctx, b.Addr(), "a", "b", "c")

	out, stderr, err := runCLI(t, ctx, txnCmd, b.Addr(), "", "list", "--group", "pg", "--limit", "2")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if err != nil || len(lines) != 3 || stderr != "2 shown, 3 pending in all\n" {
		t.Fatalf("list: %q %q %v", out, stderr, err)
	}
	if f := strings.Fields(lines[0]); strings.Join(f, " ") != "ID GROUP TOPIC/PARTITION STATE AGE CHECKS NEXT CHECK" {
		t.Fatalf("list header %q", lines[0])
	}
	if f := strings.Fields(lines[1]); len(f) != 8 || f[0] != hs[0].ID || f[1] != "pg" || f[2] != "t/0" || f[3] != "pending" || f[5] != "0/5" || f[6] != "in" {
		t.Fatalf("list row %q", lines[1])
	}
	if out, stderr, err := runCLI(t, ctx, txnCmd, b.Addr(), "", "list", "--group", "other"); err != nil || strings.Count(out, "\n") != 1 || stderr != "0 shown, 0 pending in all\n" {
		t.Fatalf("list of another group: %q %q %v", out, stderr, err)
	}

	out, _, err = runCLI(t, ctx, txnCmd, b.Addr(), "", "describe", hs[1].ID)
	for _, want := range []string{"id:          " + hs[1].ID + "\n", "group:       pg\n", "topic:       t/0\n", "state:       pending\n",
		"checks:      0/5\n", "deliver at:  -\n", "records:     1\n"} {
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("describe: %q %v, want %q", out, err, want)
		}
	}

	out, _, err = runCLI(t, ctx, txnCmd, b.Addr(), "", "commit", hs[0].ID)
	if err != nil || out != "committed "+hs[0].ID+": t/0 at offset 0\n" {
		t.Fatalf("commit: %q %v", out, err)
	}
	out, _, err = runCLI(t, ctx, txnCmd, b.Addr(), "", "rollback", hs[1].ID, hs[2].ID)
	if err != nil || out != "rolled back "+hs[1].ID+"\nrolled back "+hs[2].ID+"\n" {
		t.Fatalf("rollback: %q %v", out, err)
	}
	if out, _, err := runCLI(t, ctx, txnCmd, b.Addr(), "", "commit", hs[0].ID); err != nil || out != hs[0].ID+" committed already (t/0)\n" {
		t.Fatalf("commit again: %q %v", out, err)
	}
	for _, e := range b.Ends() {
		if !e.Request.GetManual() || e.Request.GetFromCheck() {
			t.Fatalf("the CLI sent %v", e.Request)
		}
	}
	if recs := b.Records("t", 0); len(recs) != 1 || string(recs[0].GetValue()) != "a" {
		t.Fatalf("records %v", recs)
	}

	// Unknown ids, and halves ended the other way: exit 1 with a clear line.
	out, stderr, err = runCLI(t, ctx, txnCmd, b.Addr(), "", "commit", "nope", hs[1].ID)
	if err == nil || isUsage(err) || err.Error() != "2 of 2 not committed" || out != "" ||
		!strings.HasPrefix(stderr, "no pending half message nope (unknown, or already committed or rolled back; 'herald txn list' shows the pending ones): herald TXN_NOT_FOUND") ||
		strings.Count(stderr, "\n") != 2 {
		t.Fatalf("commit of unknown ids: %q %q %v", out, stderr, err)
	}
	_, _, err = runCLI(t, ctx, txnCmd, b.Addr(), "", "describe", hs[0].ID)
	if !client.IsCode(err, heraldpb.ErrorCode_TXN_NOT_FOUND) || !strings.Contains(err.Error(), "no pending half message "+hs[0].ID) {
		t.Fatalf("describe of a committed half: %v", err)
	}
}

func TestTxnUsage(t *testing.T) {
	ctx := ctxT(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "missing subcommand; " + txnUsage},
		{[]string{"lst"}, `unknown subcommand "lst"; ` + txnUsage},
		{[]string{"list", "x"}, "txn list takes no arguments"},
		{[]string{"list", "--limit", "0"}, "--limit must be at least 1"},
		{[]string{"describe"}, "txn describe needs exactly one ID"},
		{[]string{"describe", "a", "b"}, "txn describe needs exactly one ID"},
		{[]string{"commit"}, "txn commit needs one or more IDs"},
		{[]string{"rollback", "a", "--group", "g"}, "--group is only for txn list"},
		{[]string{"list", "--gruop", "g"}, "unknown flag --gruop; did you mean --group?"},
		{[]string{"list", "--transactions", "--group", "g"}, "--group is for half messages, not with --transactions"},
		{[]string{"abort"}, "txn abort needs one or more transactional ids"},
		{[]string{"abort", "etl", "--transactions"}, "--transactions is only for txn list"},
		{[]string{"commit", "h1", "--limit", "3"}, "--limit is only for txn list"},
	} {
		// Parsing fails before dialing: no broker is needed.
		_, stderr, err := runCLI(t, ctx, txnCmd, "127.0.0.1:1", "", c.args...)
		if !isUsage(err) || err.Error() != c.want || stderr != "" {
			t.Errorf("%v: %v (stderr %q), want the usage error %q", c.args, err, stderr, c.want)
		}
	}
}

func TestPrintTxn(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	h := &heraldpb.HalfInfo{Id: "h1", ProducerGroup: "pg", Topic: "orders", Partition: 2, State: "kept",
		CreatedMs: now.Add(-90 * time.Second).UnixMilli(), Checks: 15, MaxChecks: 15, DeliverAtMs: now.Add(time.Hour).UnixMilli(), Count: 1, Bytes: 12}
	var out bytes.Buffer
	printTxnList(cliIO{out: &out}, []*heraldpb.HalfInfo{h}, now)
	if f := strings.Fields(strings.Split(out.String(), "\n")[1]); strings.Join(f, " ") != "h1 pg orders/2 kept 1m30s 15/15 -" {
		t.Fatalf("list row %q", f)
	}
	out.Reset()
	h.NextCheckMs = now.Add(-time.Second).UnixMilli()
	printTxn(cliIO{out: &out}, h, now)
	for _, want := range []string{"created:     2023-11-14T22:11:50Z (1m30s ago)\n", "checks:      15/15\n",
		"next check:  2023-11-14T22:13:19Z (due)\n", "deliver at:  2023-11-14T23:13:20Z\n", "bytes:       12\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("describe lacks %q:\n%s", want, out.String())
		}
	}
}

// TestTxnTransactionsCommands: txn list --transactions shows the
// transactional ids, open transactions first; txn abort aborts one by
// hand, and says so for an id with nothing open.
func TestTxnTransactionsCommands(t *testing.T) {
	b := fakeBroker(t, fakebroker.Topic("out", 2))
	ctx := ctxT(t)
	c, err := client.Dial(ctx, b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	idle, err := c.NewTransactionalProducer(ctx, "idle")
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close(ctx)
	p, err := c.NewTransactionalProducer(ctx, "etl-1", client.WithTransactionTimeout(90*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "c"} {
		if _, err := p.Send(ctx, &client.Message{Topic: "out", Key: []byte(k), Value: []byte(k)}); err != nil {
			t.Fatal(err)
		}
	}

	out, stderr, err := runCLI(t, ctx, txnCmd, b.Addr(), "", "list", "--transactions")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if err != nil || len(lines) != 3 || stderr != "2 shown, 2 transactional ids in all\n" {
		t.Fatalf("list: %q %q %v", out, stderr, err)
	}
	if f := strings.Fields(lines[0]); strings.Join(f, " ") != "ID PRODUCER ID EPOCH STATE PARTITIONS RECORDS AGE TIMEOUT" {
		t.Fatalf("list header %q", lines[0])
	}
	if f := strings.Fields(lines[1]); len(f) != 8 || f[0] != "etl-1" || f[3] != "open" || f[4] != "out/0,out/1" || f[5] != "3" || f[7] != "1m30s" {
		t.Fatalf("list row %q", lines[1])
	}
	if f := strings.Fields(lines[2]); len(f) != 8 || f[0] != "idle" || f[3] != "empty" || f[4] != "-" || f[5] != "0" || f[6] != "-" || f[7] != "1m0s" {
		t.Fatalf("list row %q", lines[2])
	}
	if out, stderr, err := runCLI(t, ctx, txnCmd, b.Addr(), "", "list", "--transactions", "--limit", "1"); err != nil || strings.Count(out, "\n") != 2 ||
		stderr != "1 shown, 2 transactional ids in all\n" {
		t.Fatalf("list --limit 1: %q %q %v", out, stderr, err)
	}

	out, _, err = runCLI(t, ctx, txnCmd, b.Addr(), "", "abort", "etl-1")
	if err != nil || out != "aborted etl-1: 3 records dropped from out/0,out/1\n" {
		t.Fatalf("abort: %q %v", out, err)
	}
	if info, _ := b.Txn("etl-1"); info.Open {
		t.Fatalf("still open after the abort: %+v", info)
	}
	// The producer learns it at its next call; its Abort then succeeds.
	if _, err := p.Commit(ctx); err == nil {
		t.Fatal("a commit of the aborted transaction succeeded")
	}
	out, stderr, err = runCLI(t, ctx, txnCmd, b.Addr(), "", "abort", "etl-1", "nope")
	if err == nil || isUsage(err) || err.Error() != "2 of 2 not aborted" || out != "" ||
		!strings.HasPrefix(stderr, "no open transaction of etl-1 (an unknown id, or nothing open; 'herald txn list --transactions' shows them): herald TXN_NOT_FOUND") ||
		strings.Count(stderr, "\n") != 2 {
		t.Fatalf("abort with nothing open: %q %q %v", out, stderr, err)
	}
	for p := range uint32(2) {
		if recs := b.Records("out", p); len(recs) != 0 {
			t.Fatalf("records of the aborted transaction in out/%d: %v", p, recs)
		}
	}
}

func TestPrintTxnsPartitions(t *testing.T) {
	for _, c := range []struct {
		parts []string
		want  string
	}{
		{nil, "-"},
		{[]string{"a/0"}, "a/0"},
		{[]string{"a/0", "a/1", "b/0"}, "a/0,a/1,b/0"},
		{[]string{"a/0", "a/1", "b/0", "b/1", "c/0"}, "a/0,a/1,b/0 +2"},
	} {
		if got := txnPartitions(c.parts, 3); got != c.want {
			t.Errorf("txnPartitions(%v) = %q, want %q", c.parts, got, c.want)
		}
	}
}

// TestTxnIsolationFlag: consume --isolation takes read_committed and
// read_uncommitted, which read the same records, and refuses anything
// else.
func TestTxnIsolationFlag(t *testing.T) {
	b := fakeBroker(t, fakebroker.Topic("t", 1))
	ctx := ctxT(t)
	if _, _, err := runCLI(t, ctx, produceCmd, b.Addr(), "x\ny\n", "--topic", "t"); err != nil {
		t.Fatal(err)
	}
	for _, level := range []string{"read_committed", "read_uncommitted"} {
		out, _, err := runCLI(t, ctx, consumeCmd, b.Addr(), "", "--topic", "t", "--isolation", level)
		if err != nil || out != "x\ny\n" {
			t.Fatalf("consume --isolation %s: %q %v", level, out, err)
		}
	}
	for _, fn := range []func(context.Context, []string, cliIO) error{consumeCmd, benchCmd} {
		args := []string{"--isolation", "snapshot"}
		if _, _, err := runCLI(t, ctx, fn, "127.0.0.1:1", "", append([]string{"--topic", "t"}, args...)...); !isUsage(err) ||
			err.Error() != `--isolation must be read_committed or read_uncommitted, not "snapshot"` {
			t.Errorf("--isolation snapshot: %v", err)
		}
	}
}

// A transaction written once, found open on its partitions, is listed as
// such.
func TestTxnListWrittenOnce(t *testing.T) {
	var out strings.Builder
	now := time.Now()
	printTxnsList(cliIO{out: &out}, []*heraldpb.TxnInfo{{TransactionalId: "etl-2", ProducerId: 9, ProducerEpoch: 40, State: "open", WrittenOnce: true,
		Partitions: []string{"out/0", "out/1"}, Records: 6, StartedMs: now.Add(-3 * time.Second).UnixMilli(), TimeoutMs: 60000}}, now)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[1]), " ") != "etl-2 9 40 open (written once) out/0,out/1 6 3s 1m0s" {
		t.Fatalf("list: %q", out.String())
	}
}
