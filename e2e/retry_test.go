package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/heraldmq/herald/adminapi"
	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/retry"
)

// failure is one delivery a handler failed.
type failure struct {
	count int
	at    time.Time
}

// subscribeFailing subscribes a handler that fails every delivery with the
// reason "fail <count>" and reports it on the returned channel.
func subscribeFailing(t *testing.T, c *client.Client, policy string) (*client.Subscription, chan failure) {
	t.Helper()
	got := make(chan failure, 16)
	sub, err := c.Subscribe(ctxT(t, 20*time.Second), client.SubscribeOptions{
		Group: "billing", Topic: "invoices", Mode: client.Shared, From: client.Earliest(), RetryPolicy: policy,
	}, func(ctx context.Context, m *client.Delivered) {
		m.Fail(fmt.Sprintf("fail %d", m.DeliveryCount))
		got <- failure{count: m.DeliveryCount, at: time.Now()}
	})
	if err != nil {
		t.Fatal(err)
	}
	return sub, got
}

func nextFailure(t *testing.T, got chan failure) failure {
	t.Helper()
	select {
	case f := <-got:
		return f
	case <-time.After(20 * time.Second):
		t.Fatal("no delivery within 20s")
		return failure{}
	}
}

// A message that always fails, through the SDK against a broker process
// that is SIGKILLed while a retry is pending: the retry keeps its delay and
// its delivery count across the crash, and after max-deliveries the
// message is in "<group>.dlq" with the last reason.
func TestRetryAcrossSIGKILL(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	if _, err := c.CreateTopic(ctxT(t, 10*time.Second), "invoices", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Subscribe(ctxT(t, 10*time.Second), client.SubscribeOptions{Group: "billing", Topic: "invoices", RetryPolicy: "every 5s"},
		func(context.Context, *client.Delivered) {})
	if !client.IsCode(err, heraldpb.ErrorCode_INVALID_REQUEST) {
		t.Fatalf("a bad retry policy: %v, want INVALID_REQUEST", err)
	}
	if _, err := c.NewProducer().Send(ctxT(t, 10*time.Second), &client.Message{Topic: "invoices", Key: []byte("k"), Value: []byte("inv-1")}); err != nil {
		t.Fatal(err)
	}

	const policy = "200ms,4s max-deliveries=3"
	sub, got := subscribeFailing(t, c, policy)
	f1 := nextFailure(t, got)
	f2 := nextFailure(t, got)
	if f1.count != 1 || f2.count != 2 || f2.at.Sub(f1.at) < 200*time.Millisecond {
		t.Fatalf("deliveries %d then %d after %v, want 1 then 2 after at least 200ms", f1.count, f2.count, f2.at.Sub(f1.at))
	}
	// The second failure's nack is durable once Flush returns; its retry
	// is due 4s later.
	if err := sub.Flush(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	n.Kill(t)
	// The broker comes back on the same address: the old client would
	// resubscribe by itself and take the retry; this test follows a new one.
	c.Close()
	n.Start(t)

	c2 := dial(t, n)
	_, got = subscribeFailing(t, c2, policy)
	f3 := nextFailure(t, got)
	if f3.count != 3 {
		t.Fatalf("after the crash: delivery count %d, want 3", f3.count)
	}
	if d := f3.at.Sub(f2.at); d < 4*time.Second {
		t.Fatalf("after the crash the retry came %v after its failure, before the policy's 4s", d)
	}
	// The third failure is the last: the message goes to billing.dlq.
	var dl []*client.Message
	checkFor(t, 20*time.Second, "the dead letter", func() error {
		res, err := c2.Fetch(ctxT(t, 10*time.Second), "billing.dlq", 0, 0, 1<<20, 0)
		if err != nil {
			return err
		}
		if dl = res.Messages; len(dl) != 1 {
			return fmt.Errorf("billing.dlq holds %d records", len(dl))
		}
		return nil
	})
	rec := &heraldpb.Record{Key: dl[0].Key, Value: dl[0].Value}
	for _, h := range dl[0].Headers {
		rec.Headers = append(rec.Headers, &heraldpb.Header{Key: h.Key, Value: h.Value})
	}
	o, err := retry.OriginOf(rec)
	if err != nil {
		t.Fatal(err)
	}
	if string(dl[0].Value) != "inv-1" || o.Topic != "invoices" || o.Offset != 0 || o.Deliveries != 3 || o.Reason != "fail 3" {
		t.Fatalf("dead letter %q from %+v", dl[0].Value, o)
	}
	checkFor(t, 20*time.Second, "the group's lag to reach 0", func() error {
		gi, err := c2.DescribeGroup(ctxT(t, 5*time.Second), "billing")
		if err != nil {
			return err
		}
		if gi.Partitions[0].Lag != 0 || gi.DeadLettered != 1 || gi.RetryPolicy != policy {
			return fmt.Errorf("lag %d, dead-lettered %d, policy %q", gi.Partitions[0].Lag, gi.DeadLettered, gi.RetryPolicy)
		}
		return nil
	})
	select {
	case f := <-got:
		t.Fatalf("delivered again after the dead letter: %+v", f)
	case <-time.After(300 * time.Millisecond):
	}
}

// The second acceptance scenario: a failing consumer's messages walk
// through the backoff schedule into the DLQ, and `herald dlq redrive` sends
// them back to their topic, where a healthy consumer handles them.
//
// The member's circuit breaker would pause it after 5 failures in a row
// (for --breaker-cooldown, 30 s); this test raises the threshold to watch
// the retry schedule alone.
func TestFailingConsumerDeadLettersThenRedrive(t *testing.T) {
	n := startProc(t, t.TempDir(), "--breaker-failures=1000")
	c := dial(t, n)
	createTopic(t, c, "orders", 2)
	const total = 20
	produceN(t, c, "orders", "o", total, 5)
	var mu sync.Mutex
	counts := map[string][]int{}
	sub, err := c.Subscribe(ctxT(t, 10*time.Second), client.SubscribeOptions{
		Group: "billing", Topic: "orders", Mode: client.Shared, From: client.Earliest(), RetryPolicy: "20ms,40ms max-deliveries=3",
	}, func(_ context.Context, m *client.Delivered) {
		mu.Lock()
		counts[string(m.Value)] = append(counts[string(m.Value)], m.DeliveryCount)
		mu.Unlock()
		m.Fail("db down")
	})
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, 20*time.Second, "20 dead letters", func() error {
		offs, err := c.ListOffsets(ctxT(t, 5*time.Second), "billing.dlq", 0, heraldpb.OffsetSpec_OFFSET_SPEC_LATEST, time.Time{})
		if err != nil {
			mu.Lock()
			defer mu.Unlock()
			gi, _ := c.DescribeGroup(ctxT(t, 5*time.Second), "billing")
			return fmt.Errorf("%w (deliveries so far: %v; group %v)", err, counts, gi)
		}
		if offs.HighWatermark < total {
			return fmt.Errorf("%d dead letters", offs.HighWatermark)
		}
		return nil
	})
	sub.Close(ctxT(t, 5*time.Second))
	mu.Lock()
	for v, cs := range counts {
		if fmt.Sprint(cs) != "[1 2 3]" {
			t.Errorf("%s delivered with counts %v, want [1 2 3]", v, cs)
		}
	}
	mu.Unlock()
	dl := readPartition(t, c, "billing.dlq", 0)
	if len(dl) != total {
		t.Fatalf("%d dead letters, want %d", len(dl), total)
	}
	if headerOf(dl[0], retry.HeaderDLQReason) != "db down" || headerOf(dl[0], retry.HeaderDLQDeliveries) != "3" || headerOf(dl[0], retry.HeaderDLQTopic) != "orders" {
		t.Fatalf("dead letter headers %v", dl[0].Headers)
	}
	out, errs, code := herald(t, "", "dlq", "redrive", "--topic", "billing.dlq", "--addr="+n.Addr())
	if code != 0 || !strings.Contains(out+errs, "redriven 20") {
		t.Fatalf("redrive: exit %d\n%s\n%s", code, out, errs)
	}
	// Each message is on orders twice now: the original and the redriven
	// copy, which carries no dlq headers.
	seen := map[string]int{}
	for p := int32(0); p < 2; p++ {
		for _, m := range readPartition(t, c, "orders", p) {
			seen[string(m.Value)]++
			if headerOf(m, retry.HeaderDLQTopic) != "" {
				t.Fatalf("redriven record still carries dlq headers: %v", m.Headers)
			}
		}
	}
	for v, k := range seen {
		if k != 2 {
			t.Errorf("%s is on orders %d times, want 2 (the original and the redriven copy)", v, k)
		}
	}
	if len(seen) != total {
		t.Fatalf("%d distinct values on orders", len(seen))
	}

	// The admin API redrives the same way (package dlq): a dry run, a bad
	// filter, then two calls of at most 12, the second going on from the
	// first's next.
	admin := n.AdminAddr()
	var res adminapi.RedriveResult
	if st := apiCall(t, "POST", admin, "/api/v1/groups/billing/dlq/redrive", `{"dry_run":true}`, &res); st != 200 || res.Redriven != total || !res.DryRun || !res.Done {
		t.Fatalf("dry run: %d %+v", st, res)
	}
	if st, code := apiErrorCode(t, "POST", admin, "/api/v1/groups/billing/dlq/redrive", `{"filter":"reason = "}`); st != 400 || code != "INVALID_REQUEST" {
		t.Fatalf("a bad filter: %d %s", st, code)
	}
	if st := apiCall(t, "POST", admin, "/api/v1/groups/billing/dlq/redrive", `{"max":12}`, &res); st != 200 || res.Read != 12 || res.Redriven != 12 || res.Done {
		t.Fatalf("first call: %d %+v", st, res)
	}
	from, _ := json.Marshal(map[string]any{"from": res.Next})
	var res2 adminapi.RedriveResult
	if st := apiCall(t, "POST", admin, "/api/v1/groups/billing/dlq/redrive", string(from), &res2); st != 200 || res2.Redriven != total-12 || !res2.Done || res2.Failed != 0 {
		t.Fatalf("second call from %s: %d %+v", from, st, res2)
	}
	clear(seen)
	for p := int32(0); p < 2; p++ {
		for _, m := range readPartition(t, c, "orders", p) {
			seen[string(m.Value)]++
		}
	}
	for v, k := range seen {
		if k != 3 {
			t.Errorf("%s is on orders %d times after the API's redrive, want 3", v, k)
		}
	}
}

// In a shared group, a retry avoids the member that failed it while
// another member has credit. A member whose circuit breaker is open has
// credit it cannot use: the retry must not wait for it through its
// cool-down (60 s here) but go back to the member that failed it. Before
// the fix it waited, and a chaos workload's group stalled for 30 s in CI.
func TestSharedRetryDoesNotWaitForAnOpenBreaker(t *testing.T) {
	n := startProc(t, t.TempDir(), "--breaker-failures=2", "--breaker-cooldown=60s")
	c := dial(t, n)
	createTopic(t, c, "invoices", 1)
	opts := client.SubscribeOptions{Group: "billing", Topic: "invoices", Mode: client.Shared, From: client.Earliest(), RetryPolicy: "100ms max-deliveries=10"}
	// b fails everything until its breaker opens.
	opts.Name = "b"
	if _, err := dial(t, n).Subscribe(ctxT(t, 10*time.Second), opts, func(_ context.Context, m *client.Delivered) { m.Fail("b is broken") }); err != nil {
		t.Fatal(err)
	}
	produceN(t, c, "invoices", "early", 3, 3)
	checkFor(t, 20*time.Second, "b's breaker open", func() error {
		gi, err := c.DescribeGroup(ctxT(t, 5*time.Second), "billing")
		if err != nil {
			return err
		}
		for _, m := range gi.GetMembers() {
			if m.GetName() == "b" && m.GetBreaker() == heraldpb.BreakerState_BREAKER_OPEN {
				return nil
			}
		}
		return fmt.Errorf("group %v", gi)
	})
	// a fails each message's first delivery and acks its redelivery.
	var mu sync.Mutex
	counts := map[string][]int{}
	opts.Name = "a"
	if _, err := dial(t, n).Subscribe(ctxT(t, 10*time.Second), opts, func(_ context.Context, m *client.Delivered) {
		mu.Lock()
		counts[string(m.Value)] = append(counts[string(m.Value)], m.DeliveryCount)
		mu.Unlock()
		if m.DeliveryCount == 1 {
			m.Fail("a fails first deliveries")
			return
		}
		m.Ack()
	}); err != nil {
		t.Fatal(err)
	}
	produceN(t, c, "invoices", "late", 1, 1)
	checkFor(t, 15*time.Second, "the late message redelivered to a", func() error {
		mu.Lock()
		defer mu.Unlock()
		for v, cs := range counts {
			if strings.HasPrefix(v, "late") && len(cs) >= 2 {
				return nil
			}
		}
		return fmt.Errorf("a's deliveries: %v", counts)
	})
}
