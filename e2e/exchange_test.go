package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// values of every partition of topic, sorted.
func topicValues(t testing.TB, c *client.Client, topic string) []string {
	t.Helper()
	n, err := c.Partitions(ctxT(t, 10*time.Second), topic)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for p := range int32(n) {
		for _, m := range readPartition(t, c, topic, p) {
			out = append(out, string(m.Value))
		}
	}
	slices.Sort(out)
	return out
}

func mustDeclare(t testing.TB, c *client.Client, name string, typ heraldpb.ExchangeType, alternate string) {
	t.Helper()
	if _, err := c.DeclareExchange(ctxT(t, 10*time.Second), name, typ, alternate); err != nil {
		t.Fatalf("declare %s: %v", name, err)
	}
}

func mustBind(t testing.TB, c *client.Client, b *heraldpb.Binding) {
	t.Helper()
	if _, err := c.Bind(ctxT(t, 10*time.Second), b); err != nil {
		t.Fatalf("bind %v: %v", b, err)
	}
}

func publish(t testing.TB, c *client.Client, ex, key string, opt client.PublishOptions, msgs ...*client.Message) *client.PublishResult {
	t.Helper()
	r, err := c.Publish(ctxT(t, 20*time.Second), ex, key, opt, msgs...)
	if err != nil {
		t.Fatalf("publish %s %q: %v", ex, key, err)
	}
	return r
}

func msg(v string) *client.Message { return &client.Message{Value: []byte(v)} }

// TestExchangeRouting on one node: a topic exchange fans orders out to
// three topics (each publish reaching several topics is one decision of
// the coordinator); nothing reaches an unbound topic; mandatory
// unroutable publishes fail with UNROUTABLE and store nothing; an
// alternate exchange takes what is unroutable; a headers exchange routes
// record by record; the default exchange reaches a topic by its name; and
// every exchange and binding survives a restart.
func TestExchangeRouting(t *testing.T) {
	n := startInProc(t, t.TempDir())
	c := dial(t, n)
	for _, topic := range []string{"eu-orders", "all-orders", "audit", "unbound", "lost", "pdf"} {
		createTopic(t, c, topic, 2)
	}
	mustDeclare(t, c, "unrouted", heraldpb.ExchangeType_EXCHANGE_FANOUT, "")
	mustDeclare(t, c, "orders", heraldpb.ExchangeType_EXCHANGE_TOPIC, "unrouted")
	mustDeclare(t, c, "docs", heraldpb.ExchangeType_EXCHANGE_HEADERS, "")
	mustBind(t, c, &heraldpb.Binding{Exchange: "orders", Topic: "eu-orders", Key: "eu.#"})
	mustBind(t, c, &heraldpb.Binding{Exchange: "orders", Topic: "all-orders", Key: "*.order.*"})
	mustBind(t, c, &heraldpb.Binding{Exchange: "orders", Topic: "audit", Key: "#"})
	mustBind(t, c, &heraldpb.Binding{Exchange: "unrouted", Topic: "lost"})
	mustBind(t, c, &heraldpb.Binding{Exchange: "docs", Topic: "pdf", Headers: map[string]string{"format": "pdf"}})

	// One publish, three topics.
	r := publish(t, c, "orders", "eu.order.created", client.PublishOptions{Mandatory: true}, msg("o1"), msg("o2"))
	if len(r.Destinations) != 3 || r.Unroutable != 0 {
		t.Fatalf("eu.order.created went to %v (unroutable %d)", r.Destinations, r.Unroutable)
	}
	// One topic: a plain produce, answered with its offset.
	r = publish(t, c, "orders", "us.refund", client.PublishOptions{Mandatory: true}, msg("r1"))
	if len(r.Destinations) != 1 || r.Destinations[0].Topic != "audit" || r.Destinations[0].BaseOffset < 0 {
		t.Fatalf("us.refund went to %v", r.Destinations)
	}
	// The audit binding takes everything: nothing reaches the alternate
	// until it is removed.
	if ch, err := c.Unbind(ctxT(t, 10*time.Second), &heraldpb.Binding{Exchange: "orders", Topic: "audit", Key: "#"}); err != nil || !ch {
		t.Fatalf("unbind: %v %v", ch, err)
	}
	r = publish(t, c, "orders", "us.refund", client.PublishOptions{}, msg("r2"))
	if r.Alternate != 1 || len(r.Destinations) != 1 || r.Destinations[0].Topic != "lost" {
		t.Fatalf("unroutable us.refund: %+v", r)
	}
	// No alternate, mandatory: refused whole; not mandatory: dropped.
	_, err := c.Publish(ctxT(t, 10*time.Second), "docs", "", client.PublishOptions{Mandatory: true},
		&client.Message{Value: []byte("d1"), Headers: []client.Header{{Key: "format", Value: []byte("pdf")}}}, msg("d2"))
	if !client.IsCode(err, heraldpb.ErrorCode_UNROUTABLE) {
		t.Fatalf("mandatory publish with an unroutable record: %v", err)
	}
	r = publish(t, c, "docs", "", client.PublishOptions{},
		&client.Message{Value: []byte("d3"), Headers: []client.Header{{Key: "format", Value: []byte("pdf")}}}, msg("d4"))
	if r.Unroutable != 1 || len(r.Destinations) != 1 || r.Destinations[0].Count != 1 {
		t.Fatalf("headers publish: %+v", r)
	}
	// The default exchange: a topic by its name.
	publish(t, c, "", "unbound", client.PublishOptions{Mandatory: true}, msg("direct"))
	if _, err := c.Publish(ctxT(t, 10*time.Second), "", "no-such-topic", client.PublishOptions{Mandatory: true}, msg("x")); !client.IsCode(err, heraldpb.ErrorCode_UNROUTABLE) {
		t.Fatalf("default exchange to a missing topic: %v", err)
	}
	if _, err := c.Publish(ctxT(t, 10*time.Second), "nope", "k", client.PublishOptions{}, msg("x")); !client.IsCode(err, heraldpb.ErrorCode_EXCHANGE_NOT_FOUND) {
		t.Fatalf("missing exchange: %v", err)
	}

	want := map[string][]string{
		"eu-orders": {"o1", "o2"}, "all-orders": {"o1", "o2"}, "audit": {"o1", "o2", "r1"},
		"lost": {"r2"}, "pdf": {"d3"}, "unbound": {"direct"},
	}
	check := func() {
		t.Helper()
		for topic, w := range want {
			checkFor(t, 10*time.Second, topic+" holds its copies", func() error {
				if got := topicValues(t, c, topic); !slices.Equal(got, w) {
					return fmt.Errorf("%s holds %v, want %v", topic, got, w)
				}
				return nil
			})
		}
	}
	check()
	xs, err := c.ListExchanges(ctxT(t, 10*time.Second), "orders")
	if err != nil || len(xs) != 1 || len(xs[0].Bindings) != 2 || xs[0].Published != 4 || xs[0].Routed != 8 {
		t.Fatalf("list orders: %v %v", xs, err)
	}
	// A restart keeps the exchanges and bindings.
	n.Stop(t)
	n.Start(t)
	c = dial(t, n)
	all, err := c.ListExchanges(ctxT(t, 10*time.Second), "")
	if err != nil || len(all) != 3 {
		t.Fatalf("after a restart: %v %v", all, err)
	}
	publish(t, c, "orders", "eu.order.paid", client.PublishOptions{Mandatory: true}, msg("o3"))
	want["eu-orders"] = []string{"o1", "o2", "o3"}
	want["all-orders"] = []string{"o1", "o2", "o3"}
	check()
	// Deleting a topic removes its bindings.
	if err := c.DeleteTopic(ctxT(t, 10*time.Second), "eu-orders"); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 10*time.Second, "the binding to the deleted topic gone", func() error {
		xs, err := c.ListExchanges(ctxT(t, 10*time.Second), "orders")
		if err != nil || len(xs) != 1 || len(xs[0].Bindings) != 1 {
			return fmt.Errorf("orders: %v %v", xs, err)
		}
		return nil
	})
}
