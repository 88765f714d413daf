package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/dlq"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/retry"
)

// dlqFixture is a real broker holding the topics orders (3 partitions) and
// payments (1), and the dead-letter topic g.dlq (1 partition) with:
//
//	0: key customer-42, header app=x, from orders/1@17 after 5 deliveries ("ack timeout")
//	1: no key, from orders/2@3 after 16 deliveries ("nack: db down")
//	2: a plain record without dead-letter headers
//	3: key k3, header trace=t3, from payments/0@9 after 3 deliveries ("ack timeout")
type dlqFixture struct {
	addr string
	c    *client.Client
	sent []*heraldpb.Record // what g.dlq holds, in offset order
}

var dlqTime = time.Date(2026, 11, 29, 14, 0, 0, 123e6, time.UTC)

func newDLQFixture(t *testing.T, ctx context.Context) *dlqFixture {
	t.Helper()
	f := &dlqFixture{addr: startBroker(t)}
	c, err := client.Dial(ctx, f.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	f.c = c
	for name, n := range map[string]uint32{"orders": 3, "payments": 1, "g.dlq": 1} {
		if _, err := c.CreateTopic(ctx, name, &heraldpb.TopicConfig{Partitions: n}); err != nil {
			t.Fatal(err)
		}
	}
	ts := time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC).UnixMilli()
	f.sent = []*heraldpb.Record{
		retry.DeadLetter(&heraldpb.Record{Key: []byte("customer-42"), Value: []byte("order-1 paid"), TimestampMs: ts,
			Headers: []*heraldpb.Header{{Key: "app", Value: []byte("x")}}},
			retry.Origin{Topic: "orders", Partition: 1, Offset: 17, Deliveries: 5, Reason: "ack timeout", Time: dlqTime}),
		retry.DeadLetter(&heraldpb.Record{Value: []byte("v1"), TimestampMs: ts, Tags: []string{"red"}},
			retry.Origin{Topic: "orders", Partition: 2, Offset: 3, Deliveries: 16, Reason: "nack: db down", Time: dlqTime.Add(time.Second)}),
		{Value: []byte("stray"), Headers: []*heraldpb.Header{{Key: "app", Value: []byte("y")}}},
		retry.DeadLetter(&heraldpb.Record{Key: []byte("k3"), Value: []byte("charge 9"), TimestampMs: ts,
			Headers: []*heraldpb.Header{{Key: "trace", Value: []byte("t3")}}},
			retry.Origin{Topic: "payments", Partition: 0, Offset: 9, Deliveries: 3, Reason: "ack timeout", Time: dlqTime.Add(2 * time.Second)}),
	}
	produceRecords(t, ctx, c, "g.dlq", 0, f.sent...)
	return f
}

// produceRecords writes recs to one partition of topic, in order, acks=all.
func produceRecords(t *testing.T, ctx context.Context, c *client.Client, topic string, partition int32, recs ...*heraldpb.Record) {
	t.Helper()
	p := c.NewProducer(client.WithManualPartitions())
	defer p.Close(ctx)
	for _, r := range recs {
		m := &client.Message{Topic: topic, Partition: partition, Key: r.GetKey(), Value: r.GetValue(), Tags: r.GetTags()}
		if r.GetTimestampMs() != 0 {
			m.Timestamp = time.UnixMilli(r.GetTimestampMs())
		}
		for _, h := range r.GetHeaders() {
			m.Headers = append(m.Headers, client.Header{Key: h.GetKey(), Value: h.GetValue()})
		}
		if _, err := p.Send(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
}

// readAll returns every record of every partition of topic, as wire
// records, partition by partition.
func readAll(t *testing.T, ctx context.Context, c *client.Client, topic string) map[int32][]*heraldpb.Record {
	t.Helper()
	n, err := c.Partitions(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int32][]*heraldpb.Record{}
	for p := int32(0); p < int32(n); p++ {
		for off := int64(0); ; {
			res, err := c.Fetch(ctx, topic, p, off, 1<<20, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range res.Messages {
				out[p] = append(out[p], dlq.Record(m))
			}
			if off = res.NextOffset; off >= res.HighWatermark {
				break
			}
		}
	}
	return out
}

func countRecs(recs map[int32][]*heraldpb.Record) int {
	n := 0
	for _, rs := range recs {
		n += len(rs)
	}
	return n
}

func headerList(r *heraldpb.Record) string {
	var s []string
	for _, h := range r.GetHeaders() {
		s = append(s, h.GetKey()+"="+string(h.GetValue()))
	}
	return strings.Join(s, ",")
}

func TestDlqListAndPeek(t *testing.T) {
	ctx := ctxT(t)
	f := newDLQFixture(t, ctx)

	out, _, err := runCLI(t, ctx, dlqCmd, f.addr, "", "list")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "TOPIC") {
		t.Fatalf("list shows other topics than g.dlq:\n%s", out)
	}
	if got := strings.Fields(lines[1]); !slices.Equal(got, []string{"g.dlq", "1", "4", "2026-11-29T14:00:00.123Z", "2026-11-29T14:00:02.123Z"}) {
		// The plain record at offset 2 is not the newest: offset 3 is.
		t.Fatalf("list row %q", lines[1])
	}

	out, _, err = runCLI(t, ctx, dlqCmd, f.addr, "", "peek", "--topic", "g.dlq")
	if err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	want := []string{
		`partition=0 offset=0 origin=orders/1@17 deliveries=5 dead-lettered=2026-11-29T14:00:00.123Z reason="ack timeout" key="customer-42" header.app="x" value="order-1 paid"`,
		`partition=0 offset=1 origin=orders/2@3 deliveries=16 dead-lettered=2026-11-29T14:00:01.123Z reason="nack: db down" key="" value="v1"`,
		`partition=0 offset=2 not-a-dead-letter="header herald-dlq-topic missing" key="" header.app="y" value="stray"`,
		`partition=0 offset=3 origin=payments/0@9 deliveries=3 dead-lettered=2026-11-29T14:00:02.123Z reason="ack timeout" key="k3" header.trace="t3" value="charge 9"`,
	}
	if !slices.Equal(lines, want) {
		t.Fatalf("peek:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}
	out, _, err = runCLI(t, ctx, dlqCmd, f.addr, "", "peek", "--topic", "g.dlq", "--filter", `"herald-dlq-reason" = 'ack timeout'`,
		"--count", "1", "--value-bytes", "5")
	if err != nil || out != strings.Replace(want[0], `value="order-1 paid"`, `value="order"...(12 bytes)`, 1)+"\n" {
		t.Fatalf("peek --filter --count 1 --value-bytes 5: %q %v", out, err)
	}
	out, _, err = runCLI(t, ctx, dlqCmd, f.addr, "", "peek", "--topic", "g.dlq", "--from", "1", "--filter", "`herald-dlq-deliveries` < 10 AND __key IS NOT NULL")
	if err != nil || out != want[3]+"\n" {
		t.Fatalf("peek --from 1 --filter: %q %v", out, err)
	}
}

func TestDlqRedrive(t *testing.T) {
	ctx := ctxT(t)
	f := newDLQFixture(t, ctx)

	// --dry-run writes nothing.
	out, _, err := runCLI(t, ctx, dlqCmd, f.addr, "", "redrive", "--topic", "g.dlq", "--dry-run")
	if err != nil {
		t.Fatal(err)
	}
	keyPart := client.PartitionForKey([]byte("customer-42"), 3)
	for _, want := range []string{
		"g.dlq partition 0: offsets 0 to 4 (4 records)",
		fmt.Sprintf("would redrive g.dlq/0@0 -> orders/%d", keyPart),
		"would redrive g.dlq/0@1 -> orders/2",
		"skipped g.dlq/0@2: herald: not a dead-lettered record: header herald-dlq-topic missing",
		"would redrive g.dlq/0@3 -> payments/0",
		"matched 4 of 4 records read: would redrive 3, skip 1, fail 0 (dry run: nothing written)",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Fatalf("dry run: missing %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "next run") || countRecs(readAll(t, ctx, f.c, "orders")) != 0 || countRecs(readAll(t, ctx, f.c, "payments")) != 0 {
		t.Fatalf("dry run wrote records or offered a next run:\n%s", out)
	}

	// A filter: only the records delivered at least 5 times, both from orders.
	out, _, err = runCLI(t, ctx, dlqCmd, f.addr, "", "redrive", "--topic", "g.dlq", "--filter", `"herald-dlq-deliveries" >= 5`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "matched 2 of 4 records read: redriven 2, skipped 0, failed 0\nnext run: --from 4\n") ||
		!strings.Contains(out, fmt.Sprintf("redrove g.dlq/0@0 -> orders/%d@0\n", keyPart)) || !strings.Contains(out, "redrove g.dlq/0@1 -> orders/2@0\n") {
		t.Fatalf("redrive --filter:\n%s", out)
	}
	orders := readAll(t, ctx, f.c, "orders")
	if countRecs(orders) != 2 || len(orders[int32(keyPart)]) != 1 || len(orders[2]) != 1 || countRecs(readAll(t, ctx, f.c, "payments")) != 0 {
		t.Fatalf("orders after redrive: %v", orders)
	}
	keyed, unkeyed := orders[int32(keyPart)][0], orders[2][0]
	if string(keyed.GetKey()) != "customer-42" || string(keyed.GetValue()) != "order-1 paid" || headerList(keyed) != "app=x" ||
		keyed.GetTimestampMs() != f.sent[0].GetTimestampMs() {
		t.Fatalf("keyed record redriven as %v", keyed)
	}
	if len(unkeyed.GetKey()) != 0 || string(unkeyed.GetValue()) != "v1" || headerList(unkeyed) != "" || !slices.Equal(unkeyed.GetTags(), []string{"red"}) {
		t.Fatalf("unkeyed record redriven as %v", unkeyed)
	}

	// --from/--to bound it: offsets 2 and 3, the plain record is skipped.
	out, _, err = runCLI(t, ctx, dlqCmd, f.addr, "", "redrive", "--topic", "g.dlq", "--from", "2", "--to", "4")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{
		"g.dlq partition 0: offsets 2 to 4 (2 records)",
		"skipped g.dlq/0@2: herald: not a dead-lettered record: header herald-dlq-topic missing",
		"redrove g.dlq/0@3 -> payments/0@0",
		"matched 2 of 2 records read: redriven 1, skipped 1, failed 0",
		"next run: --from 4",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Fatalf("redrive --from 2 --to 4: missing %q in\n%s", want, out)
		}
	}
	payments := readAll(t, ctx, f.c, "payments")
	if countRecs(readAll(t, ctx, f.c, "orders")) != 2 || len(payments[0]) != 1 || headerList(payments[0][0]) != "trace=t3" ||
		string(payments[0][0].GetKey()) != "k3" || string(payments[0][0].GetValue()) != "charge 9" {
		t.Fatalf("payments after redrive: %v", payments)
	}

	// The next run's --from finds nothing new; dead letters appended after
	// a run starts wait for the next one.
	out, _, err = runCLI(t, ctx, dlqCmd, f.addr, "", "redrive", "--topic", "g.dlq", "--from", "4")
	if err != nil || !strings.Contains(out, "matched 0 of 0 records read") {
		t.Fatalf("redrive --from 4: %q %v", out, err)
	}
	out, _, err = runCLI(t, ctx, dlqCmd, f.addr, "", "redrive", "--topic", "g.dlq", "--from", "1", "--to", "2")
	if err != nil || !strings.Contains(out, "redrove g.dlq/0@1 -> orders/2@1\n") || countRecs(readAll(t, ctx, f.c, "orders")) != 3 {
		t.Fatalf("redrive --from 1 --to 2: %q %v", out, err)
	}
}

func TestDlqRedriveFailuresAndPartitions(t *testing.T) {
	ctx := ctxT(t)
	addr := startBroker(t)
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for name, n := range map[string]uint32{"orders": 2, "h.dlq": 2} {
		if _, err := c.CreateTopic(ctx, name, &heraldpb.TopicConfig{Partitions: n}); err != nil {
			t.Fatal(err)
		}
	}
	dl := func(topic string, part uint32, value string) *heraldpb.Record {
		return retry.DeadLetter(&heraldpb.Record{Value: []byte(value)},
			retry.Origin{Topic: topic, Partition: part, Deliveries: 1, Reason: "nack", Time: dlqTime})
	}
	produceRecords(t, ctx, c, "h.dlq", 0, dl("orders", 1, "a"), dl("gone", 0, "b"))
	produceRecords(t, ctx, c, "h.dlq", 1, dl("orders", 7, "c"), dl("orders", 0, "d"), dl("orders", 0, "e"))

	// A missing origin topic fails its records (exit 1) and the rest go on.
	// An unkeyed record whose origin partition is gone goes to any partition.
	out, _, err := runCLI(t, ctx, dlqCmd, addr, "", "redrive", "--topic", "h.dlq")
	if err == nil || isUsage(err) || !strings.Contains(err.Error(), "1 of 5 matched records failed") {
		t.Fatalf("redrive with a missing origin: %v\n%s", err, out)
	}
	for _, want := range []string{
		"h.dlq partition 0: offsets 0 to 2 (2 records)", "h.dlq partition 1: offsets 0 to 3 (3 records)",
		"redrove h.dlq/0@0 -> orders/1@0", "failed h.dlq/0@1 -> gone: origin topic does not exist",
		"redrove h.dlq/1@0 -> orders/", "redrove h.dlq/1@1 -> orders/0@", "redrove h.dlq/1@2 -> orders/0@",
		"matched 5 of 5 records read: redriven 4, skipped 0, failed 1\nnext run: --from 0:2,1:3\n",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("missing %q in\n%s", want, out)
		}
	}
	got := readAll(t, ctx, c, "orders")
	var p0 []string
	for _, r := range got[0] {
		p0 = append(p0, string(r.GetValue()))
	}
	if countRecs(got) != 4 || string(got[1][0].GetValue()) != "a" || slices.Index(p0, "d") < 0 || slices.Index(p0, "d") > slices.Index(p0, "e") {
		t.Fatalf("orders = %v (a on partition 1, d before e on partition 0)", got)
	}
	// Resuming from the printed offsets reads nothing; per-partition
	// offsets must name every partition read.
	out, _, err = runCLI(t, ctx, dlqCmd, addr, "", "redrive", "--topic", "h.dlq", "--from", "0:2,1:3")
	if err != nil || !strings.Contains(out, "matched 0 of 0 records read") {
		t.Fatalf("resumed redrive: %q %v", out, err)
	}
	out, _, err = runCLI(t, ctx, dlqCmd, addr, "", "redrive", "--topic", "h.dlq", "--partition", "1", "--from", "2", "--dry-run")
	if err != nil || !strings.Contains(out, "would redrive h.dlq/1@2 -> orders/0\n") || !strings.Contains(out, "would redrive 1,") {
		t.Fatalf("--partition 1 --from 2 --dry-run: %q %v", out, err)
	}
	for _, args := range [][]string{
		{"redrive", "--topic", "h.dlq", "--from", "0:2"},
		{"redrive", "--topic", "h.dlq", "--partition", "0", "--from", "1:2"},
		{"redrive", "--topic", "h.dlq", "--partition", "2"},
		{"redrive", "--topic", "h.dlq", "--from", "0:1,0:2,1:0"},
		{"redrive", "--topic", "h.dlq", "--from", "4"}, // past both high watermarks
		{"peek", "--topic", "h.dlq", "--from", "0:x"},
	} {
		if _, _, err := runCLI(t, ctx, dlqCmd, addr, "", args...); !isUsage(err) {
			t.Errorf("dlq %v: %v, want a usage error", args, err)
		}
	}
}

func TestDlqBadInput(t *testing.T) {
	ctx := ctxT(t)
	f := newDLQFixture(t, ctx)

	_, _, err := runCLI(t, ctx, dlqCmd, f.addr, "", "redrive", "--topic", "g.dlq", "--filter", `"herald-dlq-reason" LIKE 'ack%'`)
	if !isUsage(err) || !strings.Contains(err.Error(), "--filter: filter: at 20: ") || !strings.Contains(err.Error(), "\n                      ^") {
		t.Fatalf("bad filter: %v", err)
	}
	_, _, err = runCLI(t, ctx, dlqCmd, f.addr, "", "peek", "--topic", "nope.dlq")
	if err == nil || isUsage(err) || !strings.Contains(err.Error(), "nope.dlq does not exist") {
		t.Fatalf("unknown topic: %v", err)
	}
	for _, args := range [][]string{
		{}, {"frob"}, {"list", "x"}, {"peek"}, {"peek", "g.dlq"}, {"redrive", "--topic", "orders"}, {"peek", "--topic", ".dlq"},
		{"list", "--topic", "g.dlq"}, {"peek", "--topic", "g.dlq", "--to", "3"}, {"peek", "--topic", "g.dlq", "--dry-run"},
		{"redrive", "--topic", "g.dlq", "--count", "3"}, {"peek", "--topic", "g.dlq", "--count", "-1"},
		{"redrive", "--topic", "g.dlq", "--from", "-1"}, {"redrive", "--topic", "g.dlq", "--from", "latest"},
		{"redrive", "--topic", "g.dlq", "--from", "3", "--to", "1"}, {"redrive", "--topic", "g.dlq", "--from", "5"},
		{"redrive", "--topic", "g.dlq", "--partition", "1"}, {"redrive", "--topic", "g.dlq", "--filter", "a ="},
	} {
		if _, _, err := runCLI(t, ctx, dlqCmd, f.addr, "", args...); !isUsage(err) {
			t.Errorf("dlq %v: %v, want a usage error", args, err)
		}
	}
	// None of that wrote anything.
	if countRecs(readAll(t, ctx, f.c, "orders")) != 0 || countRecs(readAll(t, ctx, f.c, "payments")) != 0 {
		t.Fatal("a refused command wrote records")
	}
	// -h is not an error.
	if _, _, err := runCLI(t, ctx, dlqCmd, f.addr, "", "-h"); err != errCLIHelp {
		t.Fatalf("-h: %v", err)
	}
}

func TestParseDLQOffsets(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want dlqOffsets
	}{
		{"earliest", dlqOffsets{}},
		{"12", dlqOffsets{set: true, all: 12}},
		{"0:12, 3:0", dlqOffsets{set: true, per: map[int32]int64{0: 12, 3: 0}}},
	} {
		got, err := parseDLQOffsets("--from", tc.in, "earliest")
		if err != nil || got.set != tc.want.set || got.all != tc.want.all || len(got.per) != len(tc.want.per) {
			t.Errorf("%q: %+v %v", tc.in, got, err)
		}
		for p, n := range tc.want.per {
			if got.per[p] != n {
				t.Errorf("%q: partition %d at %d", tc.in, p, got.per[p])
			}
		}
	}
	for _, in := range []string{"", "latest", "-3", "x", "0:", ":3", "0:1,", "0:-1", "-1:0", "0:1:2", "99999999999:1"} {
		if _, err := parseDLQOffsets("--from", in, "earliest"); !isUsage(err) {
			t.Errorf("%q: %v, want a usage error", in, err)
		}
	}
}
