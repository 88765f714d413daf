package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
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
	// Idempotent, to one topic: decided by the coordinator like a
	// publish to several.
	r = publish(t, c, "", "unbound", client.PublishOptions{Mandatory: true, Idempotent: true}, msg("idem"))
	if len(r.Destinations) != 1 || r.Duplicate {
		t.Fatalf("idempotent publish: %+v", r)
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
		"lost": {"r2"}, "pdf": {"d3"}, "unbound": {"direct", "idem"},
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

// TestExchangeCluster: three nodes, RF=3 topics a, b and c behind a
// fanout exchange. The bindings are on every node and survive a SIGKILL
// of the controller group's leader (and a new binding is taken after
// it). Then publishers fan out through the exchange while the leader of
// a destination partition is SIGKILLed: every publish acknowledged is on
// all three topics once, and every publish is on all three or on none,
// read from every replica, the killed node's too once it is back (one
// publisher is idempotent: its retries are never stored twice).
func TestExchangeCluster(t *testing.T) {
	tc, c := clusterWithTopic(t, "a", 1)
	for _, name := range []string{"b", "c", "d"} {
		if _, err := c.CreateTopic(ctxT(t, 15*time.Second), name, &heraldpb.TopicConfig{Partitions: 1, ReplicationFactor: 3}); err != nil {
			t.Fatal(err)
		}
	}
	mustDeclare(t, c, "fan", heraldpb.ExchangeType_EXCHANGE_FANOUT, "")
	for _, name := range []string{"a", "b", "c"} {
		mustBind(t, c, &heraldpb.Binding{Exchange: "fan", Topic: name})
	}
	bindingsOn := func(p *proc, want int) error {
		cc, err := client.Dial(ctxT(t, 10*time.Second), p.Addr())
		if err != nil {
			return err
		}
		defer cc.Close()
		xs, err := cc.ListExchanges(ctxT(t, 5*time.Second), "fan")
		if err != nil || len(xs) != 1 || len(xs[0].Bindings) != want {
			return fmt.Errorf("node at %s: %v %v", p.Addr(), xs, err)
		}
		return nil
	}
	checkFor(t, 20*time.Second, "the bindings on every node", func() error {
		for _, p := range tc.nodes {
			if err := bindingsOn(p, 3); err != nil {
				return err
			}
		}
		return nil
	})

	// The controller's leader dies: the metadata is on the others.
	var anyNode *proc
	for _, p := range tc.nodes {
		anyNode = p
	}
	cv, _, err := getController(anyNode)
	if err != nil || cv.Leader == 0 {
		t.Fatalf("controller: %+v %v", cv, err)
	}
	ctrlLeader := tc.nodes[cv.Leader]
	ctrlLeader.Kill(t)
	live := map[uint64]*proc{}
	for id, p := range tc.nodes {
		if id != cv.Leader {
			live[id] = p
		}
	}
	checkFor(t, 30*time.Second, "a binding taken by the new controller leader", func() error {
		for _, p := range live {
			cc, err := client.Dial(ctxT(t, 10*time.Second), p.Addr())
			if err != nil {
				return err
			}
			_, err = cc.Bind(ctxT(t, 5*time.Second), &heraldpb.Binding{Exchange: "fan", Topic: "d"})
			cc.Close()
			return err
		}
		return nil
	})
	for _, p := range live {
		checkFor(t, 20*time.Second, "four bindings on a live node", func() error { return bindingsOn(p, 4) })
	}
	if _, err := c.Unbind(ctxT(t, 20*time.Second), &heraldpb.Binding{Exchange: "fan", Topic: "d"}); err != nil {
		t.Fatal(err)
	}
	ctrlLeader.Start(t)
	tc.waitRegistered(t, tc.nodes)
	checkFor(t, 20*time.Second, "the restarted node has the bindings", func() error { return bindingsOn(ctrlLeader, 3) })

	// Publishers through the exchange; the leader of a destination
	// partition (not the coordinator's node, if any is not) dies.
	publishThroughKill(t, tc, c, func(coord uint32) uint32 {
		for _, topic := range []string{"a", "b", "c"} {
			if l := leaderOf(t, c, topic, 0); l != 0 && l != coord {
				return l
			}
		}
		return coord%3 + 1 // every destination led by the coordinator's node: kill a follower of them all
	})
}

// TestExchangeClusterCoordinatorKill: publishers fan out through an
// exchange to three RF=3 topics while the node coordinating them (the
// leader of __txn, which decides each publish) is SIGKILLed: the next
// coordinator completes the publishes decided before the kill, and every
// publish is whole on all three topics or on none, on every replica; the
// idempotent publisher's retries are stored once.
func TestExchangeClusterCoordinatorKill(t *testing.T) {
	tc, c := clusterWithTopic(t, "a", 1)
	for _, name := range []string{"b", "c"} {
		if _, err := c.CreateTopic(ctxT(t, 15*time.Second), name, &heraldpb.TopicConfig{Partitions: 1, ReplicationFactor: 3}); err != nil {
			t.Fatal(err)
		}
	}
	mustDeclare(t, c, "fan", heraldpb.ExchangeType_EXCHANGE_FANOUT, "")
	for _, name := range []string{"a", "b", "c"} {
		mustBind(t, c, &heraldpb.Binding{Exchange: "fan", Topic: name})
	}
	publishThroughKill(t, tc, c, func(coord uint32) uint32 { return coord })
}

// publishThroughKill runs two publishers (one idempotent) through the
// fanout exchange "fan" to topics a, b and c, SIGKILLs the node victim
// picks (given the coordinator's), lets them go on, restarts the node and
// checks every replica: each publish acknowledged is on all three topics
// once, and each publish is on all three or on none.
func publishThroughKill(t *testing.T, tc *testCluster, c *client.Client, victimOf func(coord uint32) uint32) {
	t.Helper()
	coord := awaitInternalLeader(t, c, "__txn")
	var mu sync.Mutex
	acked, tried := map[string]bool{}, map[string]bool{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pc, err := client.Dial(ctxT(t, 10*time.Second), tc.addrs(), client.WithRequestTimeout(5*time.Second))
			if err != nil {
				t.Error(err)
				return
			}
			defer pc.Close()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				v := fmt.Sprintf("w%d-%d", w, i)
				mu.Lock()
				tried[v] = true
				mu.Unlock()
				_, err := pc.Publish(ctxT(t, 20*time.Second), "fan", "", client.PublishOptions{Mandatory: true, Idempotent: w == 0}, msg(v))
				if err == nil {
					mu.Lock()
					acked[v] = true
					mu.Unlock()
				}
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	checkFor(t, 30*time.Second, "publishes under way", func() error {
		if n := count(); n < 50 {
			return fmt.Errorf("%d acknowledged", n)
		}
		return nil
	})
	victim := victimOf(coord)
	t.Logf("killing node %d (coordinator on node %d)", victim, coord)
	tc.nodes[uint64(victim)].Kill(t)
	base := count()
	checkFor(t, 60*time.Second, "publishes acknowledged after the kill", func() error {
		if n := count(); n < base+50 {
			return fmt.Errorf("%d acknowledged since the kill", n-base)
		}
		return nil
	})
	close(stop)
	wg.Wait()
	tc.nodes[uint64(victim)].Start(t)
	tc.waitRegistered(t, tc.nodes)
	var addrs []string
	for _, p := range tc.nodes {
		addrs = append(addrs, p.Addr())
	}
	checkFor(t, 60*time.Second, "every replica of a, b and c caught up", func() error {
		var ends []int64
		for _, topic := range []string{"a", "b", "c"} {
			hws, err := highWatermarksAt(t, topic, 0, addrs...)
			if err != nil {
				return err
			}
			if slices.Min(hws) != slices.Max(hws) {
				return fmt.Errorf("%s: high watermarks %v", topic, hws)
			}
			ends = append(ends, hws[0])
		}
		if slices.Min(ends) != slices.Max(ends) {
			return fmt.Errorf("a, b and c end at %v: a publish is not whole yet", ends)
		}
		return nil
	})
	for id, p := range tc.nodes {
		cl := dialNode(t, p)
		per := map[string]map[string]int{}
		for _, topic := range []string{"a", "b", "c"} {
			per[topic] = map[string]int{}
			for _, m := range readPartition(t, cl, topic, 0) {
				per[topic][string(m.Value)]++
			}
		}
		cl.Close()
		whole := 0
		for v := range tried {
			n := per["a"][v]
			for _, topic := range []string{"b", "c"} {
				if per[topic][v] != n {
					t.Errorf("node %d: %s is %d times on a, %d on %s", id, v, n, per[topic][v], topic)
				}
			}
			if n > 1 {
				t.Errorf("node %d: %s stored %d times", id, v, n)
			}
			if acked[v] && n != 1 {
				t.Errorf("node %d: acknowledged %s is missing", id, v)
			}
			if n == 1 {
				whole++
			}
		}
		for _, topic := range []string{"a", "b", "c"} {
			if len(per[topic]) != whole {
				t.Errorf("node %d: %s holds %d values, %d publishes are whole", id, topic, len(per[topic]), whole)
			}
		}
		t.Logf("node %d: %d publishes tried, %d acknowledged, %d whole on every topic", id, len(tried), len(acked), whole)
	}
}

// TestDocsRouting runs docs/routing.md as TestDocsQuickstart runs the
// quick start: every command as written, each output as shown.
func TestDocsRouting(t *testing.T) { runDocPage(t, "routing.md", 8) }

// TestExchangesInVhostsAndACLs: exchanges live in a vhost like topics:
// vhosts A and B both have an exchange "x" bound to their own "orders";
// a publish in A reaches A's topic only; listings show a vhost's own
// exchanges with its names; B cannot bind to A's topic. A user with
// produce on the topic but no permission on the exchange is refused the
// publish (NOT_AUTHORIZED) until a rule on the exchange allows it.
// Deleting a vhost deletes its exchanges.
func TestExchangesInVhostsAndACLs(t *testing.T) {
	p, adminPW := startAuthBroker(t)
	ctx := ctxT(t, 90*time.Second)
	as := []string{"--addr", p.Addr(), "--user", "admin", "--password-file", adminPW}
	for _, v := range []string{"A", "B"} {
		if out, errOut, code := herald(t, "", append([]string{"vhost", "add", v}, as...)...); code != 0 {
			t.Fatalf("vhost add %s: %d %q %q", v, code, out, errOut)
		}
	}
	inA := dial(t, p, client.WithSCRAM("admin", "admin-secret"), client.WithVhost("A"))
	inB := dial(t, p, client.WithSCRAM("admin", "admin-secret"), client.WithVhost("B"))
	for c, v := range map[*client.Client]string{inA: "A", inB: "B"} {
		if _, err := c.CreateTopic(ctx, "orders", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
			t.Fatalf("orders in %s: %v", v, err)
		}
		mustDeclare(t, c, "x", heraldpb.ExchangeType_EXCHANGE_FANOUT, "")
		mustBind(t, c, &heraldpb.Binding{Exchange: "x", Topic: "orders"})
	}
	if _, err := inA.CreateTopic(ctx, "only-a", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	r := publish(t, inA, "x", "", client.PublishOptions{Mandatory: true}, msg("in A"))
	if len(r.Destinations) != 1 || r.Destinations[0].Topic != "orders" {
		t.Fatalf("publish in A went to %v", r.Destinations)
	}
	if got := topicValues(t, inA, "orders"); !slices.Equal(got, []string{"in A"}) {
		t.Fatalf("A's orders: %v", got)
	}
	if got := topicValues(t, inB, "orders"); len(got) != 0 {
		t.Fatalf("B's orders: %v", got)
	}
	xs, err := inB.ListExchanges(ctx, "")
	if err != nil || len(xs) != 1 || xs[0].Config.Name != "x" || xs[0].Bindings[0].Topic != "orders" || xs[0].Bindings[0].Exchange != "x" {
		t.Fatalf("B's exchanges: %v %v", xs, err)
	}
	if _, err := inB.Bind(ctx, &heraldpb.Binding{Exchange: "x", Topic: "only-a"}); !client.IsCode(err, heraldpb.ErrorCode_TOPIC_NOT_FOUND) {
		t.Fatalf("B binds to A's topic: %v", err)
	}
	if _, err := inB.Bind(ctx, &heraldpb.Binding{Exchange: "x", Topic: "A~only-a"}); !client.IsCode(err, heraldpb.ErrorCode_INVALID_REQUEST) {
		t.Fatalf("B names A's topic: %v", err)
	}

	// ACLs: alice may produce to A's orders, not publish through x.
	if _, errOut, code := herald(t, "alice-secret\n", append([]string{"user", "add", "alice"}, as...)...); code != 0 {
		t.Fatal(errOut)
	}
	for _, rule := range [][]string{
		{"acl", "add", "--principal", "user:alice", "--operation", "all", "--access-vhost", "A"},
		{"acl", "add", "--vhost", "A", "--principal", "user:alice", "--operation", "produce", "--topic", "orders"},
	} {
		if _, errOut, code := herald(t, "", append(rule, as...)...); code != 0 {
			t.Fatal(errOut)
		}
	}
	alice := dial(t, p, client.WithSCRAM("alice", "alice-secret"), client.WithVhost("A"))
	if _, err := alice.Publish(ctx, "x", "", client.PublishOptions{}, msg("alice")); !client.IsCode(err, heraldpb.ErrorCode_NOT_AUTHORIZED) {
		t.Fatalf("publish without a rule on the exchange: %v", err)
	}
	if _, err := alice.Publish(ctx, "", "orders", client.PublishOptions{}, msg("alice direct")); err != nil {
		t.Fatalf("publish to the default exchange with produce on the topic: %v", err)
	}
	if _, err := alice.DeclareExchange(ctx, "mine", heraldpb.ExchangeType_EXCHANGE_DIRECT, ""); !client.IsCode(err, heraldpb.ErrorCode_NOT_AUTHORIZED) {
		t.Fatalf("declare without create on exchanges: %v", err)
	}
	if _, errOut, code := herald(t, "", append([]string{"acl", "add", "--vhost", "A", "--principal", "user:alice", "--operation", "produce", "--exchange", "x"}, as...)...); code != 0 {
		t.Fatal(errOut)
	}
	checkFor(t, 10*time.Second, "alice publishes through x", func() error {
		_, err := alice.Publish(ctx, "x", "", client.PublishOptions{}, msg("alice"))
		return err
	})
	if got := topicValues(t, inA, "orders"); !slices.Equal(got, []string{"alice", "alice direct", "in A"}) {
		t.Fatalf("A's orders: %v", got)
	}
	// Deleting vhost B deletes its exchanges: a new B starts without any.
	if err := inB.DeleteTopic(ctx, "orders"); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"vhost", "delete", "B"}, {"vhost", "add", "B"}} {
		if _, errOut, code := herald(t, "", append(args, as...)...); code != 0 {
			t.Fatalf("%v: %s", args, errOut)
		}
	}
	newB := dial(t, p, client.WithSCRAM("admin", "admin-secret"), client.WithVhost("B"))
	if xs, err := newB.ListExchanges(ctx, ""); err != nil || len(xs) != 0 {
		t.Fatalf("the new B's exchanges: %v %v", xs, err)
	}
	if xs, err := inA.ListExchanges(ctx, ""); err != nil || len(xs) != 1 {
		t.Fatalf("A's exchanges after B was deleted: %v %v", xs, err)
	}
}

// TestExchangeFeedsConsumerGroups: a topic exchange fans orders out to
// three topics, each read by its own consumer group: two members of a
// clustering group on eu-orders, two shared consumers on all-orders, and
// a clustering group on audit. Every order reaches every group bound to
// it exactly as routed (nothing lost), and the unbound topic gets
// nothing.
func TestExchangeFeedsConsumerGroups(t *testing.T) {
	n := startInProc(t, t.TempDir())
	c := dial(t, n)
	for _, topic := range []string{"eu-orders", "all-orders", "audit", "unbound"} {
		createTopic(t, c, topic, 3)
	}
	mustDeclare(t, c, "orders", heraldpb.ExchangeType_EXCHANGE_TOPIC, "")
	mustBind(t, c, &heraldpb.Binding{Exchange: "orders", Topic: "eu-orders", Key: "eu.#"})
	mustBind(t, c, &heraldpb.Binding{Exchange: "orders", Topic: "all-orders", Key: "*.order.*"})
	mustBind(t, c, &heraldpb.Binding{Exchange: "orders", Topic: "audit", Key: "#"})
	groups := map[string]*seenSet{}
	for _, g := range []struct {
		group, topic string
		mode         client.SubscriptionMode
		members      int
	}{
		{"eu-billing", "eu-orders", client.Clustering, 2},
		{"fulfilment", "all-orders", client.Shared, 2},
		{"auditor", "audit", client.Clustering, 1},
	} {
		seen := newSeen()
		groups[g.topic] = seen
		for i := range g.members {
			cc := dial(t, n)
			member := fmt.Sprint(g.group, i)
			subscribeT(t, cc, client.SubscribeOptions{Group: g.group, Topic: g.topic, Mode: g.mode, From: client.Earliest()},
				func(_ context.Context, m *client.Delivered) { seen.add(member, m) })
		}
	}
	want := map[string][]string{}
	regions := []string{"eu", "us", "eu", "apac"}
	kinds := []string{"order.created", "order.paid", "refund.created"}
	for i := range 120 {
		key := regions[i%len(regions)] + "." + kinds[i%len(kinds)]
		v := fmt.Sprintf("%d:%s", i, key)
		publish(t, c, "orders", key, client.PublishOptions{Mandatory: true}, &client.Message{Key: []byte(fmt.Sprint(i % 7)), Value: []byte(v)})
		want["audit"] = append(want["audit"], v)
		if strings.HasPrefix(key, "eu.") {
			want["eu-orders"] = append(want["eu-orders"], v)
		}
		if strings.Contains(key, ".order.") {
			want["all-orders"] = append(want["all-orders"], v)
		}
	}
	for topic, seen := range groups {
		checkFor(t, 30*time.Second, "every order routed to "+topic+" consumed", func() error {
			if d, w := seen.distinct(), len(want[topic]); d != w {
				return fmt.Errorf("%s: %d distinct consumed, want %d", topic, d, w)
			}
			return nil
		})
		seen.mu.Lock()
		for _, v := range want[topic] {
			if seen.n[v] == 0 {
				t.Errorf("%s: %s never consumed", topic, v)
			}
		}
		seen.mu.Unlock()
		if got := topicValues(t, c, topic); len(got) != len(want[topic]) {
			t.Errorf("%s stores %d records, want %d", topic, len(got), len(want[topic]))
		}
	}
	if got := topicValues(t, c, "unbound"); len(got) != 0 {
		t.Fatalf("the unbound topic holds %v", got)
	}
}
