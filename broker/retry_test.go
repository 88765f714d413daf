package broker

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/retry"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
)

// Retries, dead letters and TTL of consumer groups, frame by frame against
// a real broker (loopback, real files, fsync).

// produceRecords writes recs to topicName's partition part, retrying
// retriable errors.
func produceRecords(t *testing.T, w *wire, topicName string, part uint32, recs ...*heraldpb.Record) {
	t.Helper()
	raw, err := proto.Marshal(&heraldpb.RecordBatch{Records: recs})
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, func() error {
		r := w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: topicName, Partition: proto.Uint32(part), Records: raw}}})
		if e := r.GetError(); e != nil {
			if !e.Retriable {
				t.Fatalf("produce: %v", e)
			}
			return e
		}
		return nil
	})
}

// fetchRecords polls topicName's partition 0 from offset 0 until it holds
// at least n records, and returns them all.
func fetchRecords(t *testing.T, w *wire, topicName string, n int) []*heraldpb.Record {
	t.Helper()
	var out []*heraldpb.Record
	checkFor(t, func() error {
		out = out[:0]
		r := w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{Topic: topicName, Partition: 0, Offset: 0, MaxBytes: 1 << 20}}})
		if e := r.GetError(); e != nil {
			return e
		}
		for _, b := range r.GetFetchResponse().GetBatches() {
			var rb heraldpb.RecordBatch
			if err := proto.Unmarshal(b.Records, &rb); err != nil {
				t.Fatal(err)
			}
			out = append(out, rb.Records...)
		}
		if len(out) < n {
			return fmt.Errorf("%s holds %d records, want %d", topicName, len(out), n)
		}
		return nil
	})
	return out
}

func header(r *heraldpb.Record, k string) string {
	for _, h := range r.GetHeaders() {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

// metric reads a counter or gauge of the default registry (0 when absent).
func metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return 0
}

// nextDelivery waits for one pushed message.
func nextDelivery(t *testing.T, w *wire, wait time.Duration) (*heraldpb.DeliveredMessage, time.Time) {
	t.Helper()
	ds := w.deliveries(1, wait)
	if len(ds) != 1 {
		t.Fatalf("no delivery within %v", wait)
	}
	return ds[0], time.Now()
}

func nack(t *testing.T, w *wire, sub uint64, d *heraldpb.DeliveredMessage, delay *uint32, reason string) {
	t.Helper()
	w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Nack{Nack: &heraldpb.NackRequest{SubscriptionId: sub,
		Partitions: []uint32{d.Partition}, Offsets: []int64{d.Offset}, DelayMs: delay, Reason: reason, Credits: 1}}})
}

// checkDeadLetter checks the dead-letter headers of rec against the origin.
func checkDeadLetter(t *testing.T, rec *heraldpb.Record, topicName string, part uint32, off int64, deliveries int, reason string, after time.Time) {
	t.Helper()
	o, err := retry.OriginOf(rec)
	if err != nil {
		t.Fatalf("dead letter headers: %v (%v)", err, rec.Headers)
	}
	if o.Topic != topicName || o.Partition != part || o.Offset != off || o.Deliveries != deliveries || o.Reason != reason {
		t.Fatalf("dead letter origin %+v, want %s/%d@%d deliveries %d reason %q", o, topicName, part, off, deliveries, reason)
	}
	if o.Time.Before(after.Add(-time.Millisecond)) || o.Time.After(time.Now().Add(time.Millisecond)) {
		t.Fatalf("dead letter time %v, want between %v and now", o.Time, after)
	}
	if !strings.HasSuffix(header(rec, retry.HeaderDLQTime), "Z") {
		t.Fatalf("dead letter time %q is not UTC", header(rec, retry.HeaderDLQTime))
	}
}

// A consumer that always fails sees the policy's deliveries, never early;
// then the message is in "<group>.dlq" with its origin in the headers, and
// the group's lag is 0.
func TestRetryPolicyThenDeadLetter(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "orders", 1)
	produceRecords(t, w, "orders", 0, &heraldpb.Record{Key: []byte("k1"), Value: []byte("v1"), Tags: []string{"red"},
		Headers: []*heraldpb.Header{{Key: "n", Value: []byte("1")}}})

	const policy = "100ms,300ms,600ms max-deliveries=4"
	sub := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "pay", Topic: "orders", Mode: heraldpb.SubscriptionMode_MODE_SHARED,
		Credits: 10, RetryPolicy: policy})
	delays := []time.Duration{100 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond}
	var nackedAt time.Time
	for n := 1; n <= 4; n++ {
		d, at := nextDelivery(t, w, 10*time.Second)
		if d.DeliveryCount != uint32(n) || d.Offset != 0 || string(d.Record.GetValue()) != "v1" {
			t.Fatalf("delivery %d: count %d offset %d value %q", n, d.DeliveryCount, d.Offset, d.Record.GetValue())
		}
		if n > 1 {
			gap, want := at.Sub(nackedAt), delays[n-2]
			if gap < want {
				t.Fatalf("delivery %d came %v after the nack, before the policy's %v", n, gap, want)
			}
			if gap > want+5*time.Second {
				t.Fatalf("delivery %d came %v after the nack (policy %v)", n, gap, want)
			}
		}
		if n == 2 {
			if gi := describe(t, w, "pay"); gi.RetryPolicy != policy || gi.DeadLetterTopic != "pay.dlq" {
				t.Fatalf("describe: policy %q topic %q", gi.RetryPolicy, gi.DeadLetterTopic)
			}
		}
		nackedAt = time.Now()
		nack(t, w, sub, d, nil, fmt.Sprintf("boom %d", n))
		if n == 3 { // waiting 600ms: long enough to see it (a lower bound of a retry's wait is all this needs)
			if gi := describe(t, w, "pay"); gi.Retrying != 1 {
				t.Fatalf("after nack %d: retrying %d, want 1", n, gi.Retrying)
			}
		}
	}
	dl := fetchRecords(t, w, "pay.dlq", 1)
	if len(dl) != 1 {
		t.Fatalf("pay.dlq holds %d records, want 1", len(dl))
	}
	rec := dl[0]
	if string(rec.Key) != "k1" || string(rec.Value) != "v1" || len(rec.Tags) != 1 || header(rec, "n") != "1" {
		t.Fatalf("dead letter lost the original record: %v", rec)
	}
	checkDeadLetter(t, rec, "orders", 0, 0, 4, "boom 4", nackedAt)
	checkFor(t, func() error {
		gi := describe(t, w, "pay")
		if gi.Partitions[0].Lag != 0 || gi.DeadLettered != 1 || gi.Retrying != 0 || gi.InFlight != 0 {
			return fmt.Errorf("describe after the dead letter: lag %d dead-lettered %d retrying %d in flight %d",
				gi.Partitions[0].Lag, gi.DeadLettered, gi.Retrying, gi.InFlight)
		}
		return nil
	})
	if got := w.deliveries(1, 300*time.Millisecond); len(got) > 0 {
		t.Fatalf("delivered after the dead letter: %v", got)
	}
	for reason, want := range map[string]float64{"nack": 3, "timeout": 0} {
		if v := metric(t, "herald_consumer_retries_total", map[string]string{"group": "pay", "reason": reason}); v != want {
			t.Errorf("retries_total{reason=%s} = %v, want %v", reason, v, want)
		}
	}
	if v := metric(t, "herald_consumer_dead_lettered_total", map[string]string{"group": "pay"}); v != 1 {
		t.Errorf("dead_lettered_total = %v, want 1", v)
	}
}

// A nack with an explicit delay keeps it and still counts as a delivery;
// an ack timeout counts too, with reason "ack timeout".
func TestRetryExplicitDelayAndAckTimeoutCount(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "jobs", 1)
	produce(t, w, "jobs", 0, 1)
	sub := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "workers", Topic: "jobs", Mode: heraldpb.SubscriptionMode_MODE_SHARED,
		Credits: 10, AckTimeoutMs: 300, RetryPolicy: "50ms max-deliveries=3", DeadLetterTopic: "jobs-failed"})

	d, _ := nextDelivery(t, w, 10*time.Second)
	sent := time.Now()
	nack(t, w, sub, d, proto.Uint32(700), "later")
	d, at := nextDelivery(t, w, 10*time.Second)
	if d.DeliveryCount != 2 || at.Sub(sent) < 700*time.Millisecond {
		t.Fatalf("second delivery: count %d after %v, want 2 after the explicit 700ms", d.DeliveryCount, at.Sub(sent))
	}
	// Not acked: the ack timeout (300ms) then the policy (50ms).
	// The timeout runs from the broker's send of the second delivery,
	// which the client sees only when it receives it (a little later):
	// allow 20 ms for that, and check the bound from the nack too.
	d, at2 := nextDelivery(t, w, 10*time.Second)
	if d.DeliveryCount != 3 || at2.Sub(at) < 330*time.Millisecond || at2.Sub(sent) < 1050*time.Millisecond {
		t.Fatalf("third delivery: count %d after %v (%v after the nack), want 3 after the ack timeout and the policy's delay", d.DeliveryCount, at2.Sub(at), at2.Sub(sent))
	}
	// The third delivery is the last: its ack timeout dead-letters it.
	rec := fetchRecords(t, w, "jobs-failed", 1)[0]
	checkDeadLetter(t, rec, "jobs", 0, 0, 3, "ack timeout", at2)
	if got := w.deliveries(1, 500*time.Millisecond); len(got) > 0 {
		t.Fatalf("delivered after the dead letter: %v", got)
	}
	checkFor(t, func() error {
		if gi := describe(t, w, "workers"); gi.Partitions[0].Lag != 0 || gi.DeadLettered != 1 {
			return fmt.Errorf("lag %d dead-lettered %d", gi.Partitions[0].Lag, gi.DeadLettered)
		}
		return nil
	})
	if v := metric(t, "herald_consumer_retries_total", map[string]string{"group": "workers", "reason": "timeout"}); v != 1 {
		t.Errorf("retries_total{reason=timeout} = %v, want 1", v)
	}
}

// crash stops b the way a SIGKILL would as far as groups go: the
// coordinators stop first, so nothing they have not written survives;
// the logs keep what was fsynced (with the default flush, every write a
// client was answered for).
func crash(t *testing.T, b *Broker) {
	t.Helper()
	b.closing.Store(true)
	if _, err := b.sys.Root.StopFuture(b.groups).Result(); err != nil {
		t.Fatal(err)
	}
	b.groups = nil
	b.server.Shutdown(t.Context())
	b.stopActors()
	b.lock.Close()
}

// A retry pending when the broker stops, gracefully or not, is not
// delivered before its time after the restart, and counts on from its
// deliveries.
func TestRetrySurvivesRestart(t *testing.T) {
	for _, mode := range []string{"graceful", "crash"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			b := startTestBroker(t, dir)
			w := dialWire(t, b.ClientAddr())
			newTopic(t, w, "t", 1)
			produce(t, w, "t", 0, 2)
			req := func() *heraldpb.SubscribeRequest {
				return &heraldpb.SubscribeRequest{Group: "g", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: 10,
					RetryPolicy: "100ms,3s max-deliveries=5"}
			}
			sub := subscribe(t, w, req())
			ds := w.deliveries(2, 10*time.Second)
			if len(ds) != 2 {
				t.Fatalf("got %d of 2", len(ds))
			}
			ackAll(t, w, sub, ds[1:], 0)
			nack(t, w, sub, ds[0], nil, "first")
			d, _ := nextDelivery(t, w, 10*time.Second)
			if d.DeliveryCount != 2 {
				t.Fatalf("count %d, want 2", d.DeliveryCount)
			}
			nacked := time.Now()
			nack(t, w, sub, d, nil, "second") // answered once the retry is durable
			if mode == "graceful" {
				if err := b.Shutdown(); err != nil {
					t.Fatal(err)
				}
			} else {
				crash(t, b)
			}
			b = startTestBroker(t, dir)
			defer b.Shutdown()
			w = dialWire(t, b.ClientAddr())
			if gi := describe(t, w, "g"); gi.Retrying != 1 || gi.Partitions[0].AckFloor != 0 || gi.Partitions[0].AckedAbove != 1 {
				t.Fatalf("stored group after restart: retrying %d floor %d acked above %d", gi.Retrying, gi.Partitions[0].AckFloor, gi.Partitions[0].AckedAbove)
			}
			subscribe(t, w, req())
			d, at := nextDelivery(t, w, 15*time.Second)
			if at.Sub(nacked) < 3*time.Second {
				t.Fatalf("retry delivered %v after its nack, before the policy's 3s", at.Sub(nacked))
			}
			if d.Offset != 0 || d.DeliveryCount != 3 {
				t.Fatalf("after restart: offset %d count %d, want offset 0 count 3", d.Offset, d.DeliveryCount)
			}
			if extra := w.deliveries(1, 300*time.Millisecond); len(extra) > 0 {
				t.Fatalf("acked message redelivered after restart: %v", extra)
			}
		})
	}
}

// Messages whose TTL (the topic's, or the record's own, which wins) ran
// out are never delivered: dropped as done, or dead-lettered with reason
// "expired". One that expires while it waits for a retry is not delivered
// again either.
func TestTTLNeverDelivered(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	w := dialWire(t, b.ClientAddr())
	w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "news",
		Config: &heraldpb.TopicConfig{Partitions: 1, MessageTtlMs: 300}}}})
	ti := w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_DescribeTopic{DescribeTopic: &heraldpb.DescribeTopicRequest{Name: "news"}}})
	if ttl := ti.GetDescribeTopicResponse().GetTopic().GetConfig().GetMessageTtlMs(); ttl != 300 {
		t.Fatalf("described message ttl %d, want 300", ttl)
	}
	r := w.call(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "bad",
		Config: &heraldpb.TopicConfig{MessageTtlMs: -1}}}})
	if e := r.GetError(); e == nil || e.Code != heraldpb.ErrorCode_INVALID_REQUEST {
		t.Fatalf("negative ttl: %v", r)
	}
	produceRecords(t, w, "news", 0,
		&heraldpb.Record{Value: []byte("topic-ttl")},               // 300 ms
		&heraldpb.Record{Value: []byte("own-ttl"), TtlMs: 60_000},  // its own wins
		&heraldpb.Record{Value: []byte("short"), TtlMs: 100},       // expires first
		&heraldpb.Record{Value: []byte("retry-ttl"), TtlMs: 1_000}) // expires while it waits
	time.Sleep(400 * time.Millisecond) // let the first and third expire: this is the condition under test

	subscribe(t, w, &heraldpb.SubscribeRequest{Group: "drop", Topic: "news", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: 10})
	sub2 := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "dead", Topic: "news", Mode: heraldpb.SubscriptionMode_MODE_SHARED,
		Credits: 10, DeadLetterExpired: true, RetryPolicy: "2s max-deliveries=5"})
	got := map[string]map[string]*heraldpb.DeliveredMessage{"drop": {}, "dead": {}}
	deadline := time.After(10 * time.Second)
	for len(got["drop"])+len(got["dead"]) < 4 {
		select {
		case f := <-w.pushes:
			if dv := f.GetDelivery(); dv != nil {
				for _, m := range dv.Messages {
					g := "drop"
					if dv.SubscriptionId == sub2 {
						g = "dead"
					}
					got[g][string(m.Record.GetValue())] = m
				}
			}
		case <-deadline:
			t.Fatalf("deliveries: %v", got)
		}
	}
	for g, ms := range got {
		if len(ms) != 2 || ms["own-ttl"] == nil || ms["retry-ttl"] == nil {
			t.Fatalf("group %s got %v, want own-ttl and retry-ttl only", g, ms)
		}
	}
	// "dead" fails retry-ttl: its retry is due after 2s, 1s after it expired.
	nack(t, w, sub2, got["dead"]["retry-ttl"], nil, "nope")
	if extra := w.deliveries(1, 2500*time.Millisecond); len(extra) > 0 {
		t.Fatalf("delivered after expiry: %v", extra)
	}
	dl := fetchRecords(t, w, "dead.dlq", 3)
	reasons := map[string]string{}
	for _, rec := range dl {
		o, err := retry.OriginOf(rec)
		if err != nil {
			t.Fatal(err)
		}
		reasons[string(rec.Value)] = o.Reason + "/" + strconv.Itoa(o.Deliveries)
	}
	want := map[string]string{"topic-ttl": "expired/0", "short": "expired/0", "retry-ttl": "expired/1"}
	if fmt.Sprint(reasons) != fmt.Sprint(want) {
		t.Fatalf("dead letters %v, want %v", reasons, want)
	}
	checkFor(t, func() error {
		gi := describe(t, w, "dead")
		if gi.Expired != 3 || gi.DeadLettered != 3 || gi.InFlight != 1 {
			return fmt.Errorf("dead: expired %d dead-lettered %d in flight %d", gi.Expired, gi.DeadLettered, gi.InFlight)
		}
		if gi := describe(t, w, "drop"); gi.Expired != 2 || gi.DeadLettered != 0 {
			return fmt.Errorf("drop: expired %d dead-lettered %d", gi.Expired, gi.DeadLettered)
		}
		return nil
	})
	if v := metric(t, "herald_consumer_expired_total", map[string]string{"group": "drop", "action": "drop"}); v != 2 {
		t.Errorf("expired_total{drop, drop} = %v, want 2", v)
	}
	if v := metric(t, "herald_consumer_expired_total", map[string]string{"group": "dead", "action": "dead_letter"}); v != 3 {
		t.Errorf("expired_total{dead, dead_letter} = %v, want 3", v)
	}
}

// The retry policy and dead-letter settings are part of the group's
// subscription: a live group refuses others (GROUP_CONFLICT); a policy that
// does not parse, or a dead-letter topic that is the group's own, is
// INVALID_REQUEST.
func TestRetrySettingsRefused(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "t", 1)
	try := func(req *heraldpb.SubscribeRequest) *heraldpb.Error {
		req.Topic, req.Mode = "t", heraldpb.SubscriptionMode_MODE_SHARED
		return w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: req}}).GetError()
	}
	for _, tc := range []struct {
		req  *heraldpb.SubscribeRequest
		code heraldpb.ErrorCode
		msg  string
	}{
		{&heraldpb.SubscribeRequest{Group: "g", RetryPolicy: "1s,fast"}, heraldpb.ErrorCode_INVALID_REQUEST, `"fast" at byte 3`},
		{&heraldpb.SubscribeRequest{Group: "g", RetryPolicy: "exponential factor=1"}, heraldpb.ErrorCode_INVALID_REQUEST, "factor"},
		{&heraldpb.SubscribeRequest{Group: "g", DeadLetterTopic: "t"}, heraldpb.ErrorCode_INVALID_REQUEST, "own topic"},
		{&heraldpb.SubscribeRequest{Group: "g", DeadLetterTopic: "__groups"}, heraldpb.ErrorCode_INVALID_REQUEST, "not a valid topic name"},
	} {
		if e := try(tc.req); e == nil || e.Code != tc.code || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("%v: %v, want %v with %q", tc.req, e, tc.code, tc.msg)
		}
	}
	if e := try(&heraldpb.SubscribeRequest{Group: "g", RetryPolicy: "1s,5s max-deliveries=3"}); e != nil {
		t.Fatal(e)
	}
	if e := try(&heraldpb.SubscribeRequest{Group: "g", RetryPolicy: "1s,5s   max-deliveries=3"}); e != nil {
		t.Fatalf("the same policy written differently: %v", e)
	}
	for _, req := range []*heraldpb.SubscribeRequest{
		{Group: "g", RetryPolicy: "1s,5s max-deliveries=4"},
		{Group: "g"},
		{Group: "g", RetryPolicy: "1s,5s max-deliveries=3", DeadLetterTopic: "elsewhere"},
		{Group: "g", RetryPolicy: "1s,5s max-deliveries=3", DeadLetterExpired: true},
	} {
		if e := try(req); e == nil || e.Code != heraldpb.ErrorCode_GROUP_CONFLICT {
			t.Errorf("%v: %v, want GROUP_CONFLICT", req, e)
		}
	}
	// The broker's default and the same policy spelled out agree.
	if e := try(&heraldpb.SubscribeRequest{Group: "d"}); e != nil {
		t.Fatal(e)
	}
	if e := try(&heraldpb.SubscribeRequest{Group: "d", RetryPolicy: "exponential"}); e != nil {
		t.Fatalf("the default policy spelled out: %v", e)
	}
}
