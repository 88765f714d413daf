package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/client/fakebroker"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// produceN writes n records to topic: value "v<i>", key "k<i%keys>" (no
// key when keys is 0).
func produceN(t *testing.T, c *Client, topic string, n, keys int) {
	t.Helper()
	p := c.NewProducer(WithLinger(0), WithUnpartitionedInFlight(1)) // in order
	defer p.Close(context.Background())
	ctx := testCtx(t)
	for i := 0; i < n; i++ {
		m := &Message{Topic: topic, Value: []byte(fmt.Sprintf("v%d", i))}
		if keys > 0 {
			m.Key = []byte(fmt.Sprintf("k%d", i%keys))
		}
		p.SendAsync(ctx, m, func(_ Result, err error) {
			if err != nil {
				t.Error(err)
			}
		})
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

func subscribe(t *testing.T, c *Client, o SubscribeOptions, h Handler) *Subscription {
	t.Helper()
	s, err := c.Subscribe(testCtx(t), o, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

// collector records what a handler saw.
type collector struct {
	mu   sync.Mutex
	msgs []*Delivered
}

func (col *collector) add(m *Delivered) {
	col.mu.Lock()
	col.msgs = append(col.msgs, m)
	col.mu.Unlock()
}

func (col *collector) len() int {
	col.mu.Lock()
	defer col.mu.Unlock()
	return len(col.msgs)
}

func (col *collector) values() []string {
	col.mu.Lock()
	defer col.mu.Unlock()
	var out []string
	for _, m := range col.msgs {
		out = append(out, string(m.Value))
	}
	return out
}

func TestSubscribeDeliversAndAcks(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 3))
	c := dial(t, b, WithClientID("svc"))
	produceN(t, c, "t", 50, 7)
	var col collector
	s := subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", Mode: Shared, From: Earliest(), Name: "worker-1"},
		func(_ context.Context, m *Delivered) { col.add(m) })
	waitFor(t, 5*time.Second, "50 messages", func() bool { return col.len() == 50 })
	if err := s.Flush(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	var acked int
	for p := uint32(0); p < 3; p++ {
		hw, _ := b.HighWatermark("t", p)
		got := b.Acked("g", p)
		if int64(len(got)) != hw {
			t.Errorf("partition %d: acked %v, want all %d", p, got, hw)
		}
		acked += len(got)
	}
	if acked != 50 {
		t.Fatalf("acked %d, want 50", acked)
	}
	st := s.Stats()
	if st.Delivered != 50 || st.Acked != 50 || st.InFlight != 0 || st.Dropped != 0 || st.Lost != 0 || st.Redelivered != 0 {
		t.Fatalf("stats %+v", st)
	}
	vals := col.values()
	slices.Sort(vals)
	if vals = slices.Compact(vals); len(vals) != 50 {
		t.Fatalf("%d distinct values, want 50", len(vals))
	}
	m := col.msgs[0]
	if m.Topic != "t" || m.DeliveryCount != 1 || m.Timestamp.IsZero() || m.IsRequest() || len(m.Key) == 0 {
		t.Fatalf("delivered %+v", m.Message)
	}
	req := b.SubscribeRequests()[0]
	if req.GetGroup() != "g" || req.GetMode() != heraldpb.SubscriptionMode_MODE_SHARED || req.GetCredits() != DefaultWindow ||
		req.GetStart().GetEarliest() != true || req.GetMemberName() != "worker-1" || req.GetAutoAck() {
		t.Fatalf("subscribe request %v", req)
	}
}

func TestSubscribeDefaultsToLatest(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	produceN(t, c, "t", 5, 0)
	var col collector
	subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t"}, func(_ context.Context, m *Delivered) { col.add(m) })
	if req := b.SubscribeRequests()[0]; req.GetStart().GetLatest() != true || req.GetMode() != heraldpb.SubscriptionMode_MODE_CLUSTERING {
		t.Fatalf("subscribe request %v", req)
	}
	produceN(t, c, "t", 3, 0)
	waitFor(t, 5*time.Second, "3 new messages", func() bool { return col.len() == 3 })
	time.Sleep(20 * time.Millisecond)
	if got := col.values(); !slices.Equal(got, []string{"v0", "v1", "v2"}) {
		t.Fatalf("values %v: older records delivered", got)
	}
}

// The broker never has more than Window messages outstanding: the
// subscription grants Window, and one credit per message its handler
// finished, never more.
func TestSubscribeCreditWindow(t *testing.T) {
	const window = 8
	b := newBroker(t, fakebroker.Topic("t", 2))
	c := dial(t, b)
	produceN(t, c, "t", 40, 0)
	release := make(chan struct{})
	var finished atomic.Int64
	var col collector
	s := subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", Mode: Shared, From: Earliest(), Window: window, Concurrency: 2},
		func(_ context.Context, m *Delivered) {
			col.add(m)
			<-release
			finished.Add(1)
		})
	sub := func() fakebroker.SubInfo {
		subs := b.Subscriptions()
		if len(subs) != 1 {
			t.Fatalf("%d subscriptions", len(subs))
		}
		return subs[0]
	}
	waitFor(t, 5*time.Second, "a full window", func() bool { return sub().Delivered == window })
	time.Sleep(30 * time.Millisecond) // nothing more may come
	if si := sub(); si.Delivered != window || si.Granted != window || si.Credits != 0 {
		t.Fatalf("blocked handlers: %+v", si)
	}
	if st := s.Stats(); st.InFlight != window || st.Delivered != window {
		t.Fatalf("stats %+v", st)
	}
	for i := 1; i <= 32; i++ {
		release <- struct{}{}
		waitFor(t, 5*time.Second, "the credit back", func() bool { return sub().Granted == int64(window+i) })
		if si := sub(); si.Granted > window+finished.Load() {
			t.Fatalf("after %d finished: %+v", finished.Load(), si)
		}
	}
	close(release)
	waitFor(t, 5*time.Second, "all 40 handled", func() bool { return finished.Load() == 40 })
	if err := s.Flush(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "all credits back", func() bool { return sub().Granted == window+40 })
	if st := s.Stats(); st.Dropped != 0 || st.Acked != 40 {
		t.Fatalf("stats %+v", st)
	}
	// Credits travel on AckRequests (alone or with acks), never NackRequests here.
	var credits int64 = window
	for _, a := range b.Acks() {
		credits += int64(a.Credits)
		if len(a.Partitions) > AckBatch {
			t.Fatalf("ack request with %d acks", len(a.Partitions))
		}
	}
	if credits != window+40 {
		t.Fatalf("credits granted in requests %d", credits)
	}
}

// A broker that pushes past the credits it was granted cannot block the
// reader: the excess is dropped and counted.
func TestSubscribeOverflowDropped(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1), fakebroker.AutoDeliver(false))
	c := dial(t, b)
	release := make(chan struct{})
	var col collector
	s := subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", Mode: Shared, Window: 2},
		func(_ context.Context, m *Delivered) { col.add(m); <-release })
	si := b.Subscriptions()[0]
	var msgs []*heraldpb.DeliveredMessage
	for i := 0; i < 5; i++ {
		msgs = append(msgs, &heraldpb.DeliveredMessage{Offset: int64(i), DeliveryCount: 1, Record: &heraldpb.Record{Value: []byte{byte('a' + i)}}})
	}
	if err := b.Push(si.Conn, &heraldpb.Frame{Body: &heraldpb.Frame_Delivery{Delivery: &heraldpb.Delivery{SubscriptionId: si.ID, Messages: msgs}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "drops counted", func() bool { return s.Stats().Dropped == 3 })
	// The connection still works while the handler is stuck.
	if _, err := c.ListTopics(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	// A push for an unknown subscription is ignored.
	if err := b.Push(si.Conn, &heraldpb.Frame{Body: &heraldpb.Frame_Delivery{Delivery: &heraldpb.Delivery{SubscriptionId: 999, Messages: msgs}}}); err != nil {
		t.Fatal(err)
	}
	close(release)
	waitFor(t, 5*time.Second, "the handlers", func() bool { return s.Stats().InFlight == 0 })
	if err := s.Flush(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Delivered != 2 || st.Dropped != 3 || st.Acked != 2 {
		t.Fatalf("stats %+v", st)
	}
	if got := col.values(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("handled %v", got)
	}
}

func TestAckBatching(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	produceN(t, c, "t", 600, 0)
	var col collector
	s := subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", Mode: Shared, From: Earliest(), Window: 1024, AckLinger: time.Hour},
		func(_ context.Context, m *Delivered) { col.add(m) })
	waitFor(t, 5*time.Second, "600 messages", func() bool { return col.len() == 600 })
	// Two full batches went out without waiting for the (hour-long) linger.
	waitFor(t, 5*time.Second, "two full batches acked", func() bool { return s.Stats().Acked >= 2*AckBatch })
	if err := s.Flush(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	var reqs, offsets int
	for _, a := range b.Acks() {
		if len(a.Partitions) > 0 {
			reqs++
			offsets += len(a.Offsets)
		}
		if a.Nack || len(a.Partitions) > AckBatch {
			t.Fatalf("ack request %+v", a)
		}
	}
	if offsets != 600 || reqs > 4 {
		t.Fatalf("%d acks in %d requests, want 600 in at most 4: %v", offsets, reqs, b.Acks())
	}
	if got := b.Acked("g", 0); len(got) != 600 {
		t.Fatalf("%d acked", len(got))
	}
}

func TestAckLingerSendsWithoutFlush(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	s := subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", Mode: Shared}, func(context.Context, *Delivered) {})
	produceN(t, c, "t", 1, 0)
	waitFor(t, 5*time.Second, "the ack after the linger", func() bool { return s.Stats().Acked == 1 })
}

// Flush returns only once the broker answered the acks (durable).
func TestFlushWaitsForAckResponse(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	produceN(t, c, "t", 10, 0)
	var col collector
	s := subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", Mode: Shared, From: Earliest(), AckLinger: time.Hour},
		func(_ context.Context, m *Delivered) { col.add(m) })
	waitFor(t, 5*time.Second, "10 messages", func() bool { return col.len() == 10 })
	const delay = 150 * time.Millisecond
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetAck() != nil {
			return fakebroker.Action{Delay: delay}
		}
		return fakebroker.Action{}
	})
	start := time.Now()
	if err := s.Flush(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < delay {
		t.Fatalf("Flush returned after %s, before the ack response", d)
	}
	if st := s.Stats(); st.Acked != 10 {
		t.Fatalf("stats %+v", st)
	}
	// Nothing queued: Flush returns at once.
	start = time.Now()
	if err := s.Flush(testCtx(t)); err != nil || time.Since(start) > delay/2 {
		t.Fatalf("empty flush: %v after %s", err, time.Since(start))
	}
	// A flush with a short context gives up.
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetAck() != nil {
			return fakebroker.Action{Delay: time.Second}
		}
		return fakebroker.Action{}
	})
	produceN(t, c, "t", 1, 0)
	waitFor(t, 5*time.Second, "one more", func() bool { return col.len() == 11 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := s.Flush(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("flush: %v", err)
	}
}

func TestNackRedelivers(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	produceN(t, c, "t", 3, 0)
	var col collector
	var nackedAt atomic.Int64
	s := subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", Mode: Shared, From: Earliest()},
		func(_ context.Context, m *Delivered) {
			col.add(m)
			if m.Offset == 1 && m.DeliveryCount == 1 {
				nackedAt.Store(time.Now().UnixNano())
				m.Nack(50 * time.Millisecond)
				m.Ack() // ignored: the nack came first
			}
		})
	waitFor(t, 5*time.Second, "the redelivery", func() bool { return col.len() == 4 })
	last := col.msgs[3]
	if last.Offset != 1 || last.DeliveryCount != 2 {
		t.Fatalf("redelivered %q #%d", last.Value, last.DeliveryCount)
	}
	if err := s.Flush(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Nacked != 1 || st.Acked != 3 || st.Redelivered != 1 || st.Delivered != 4 {
		t.Fatalf("stats %+v", st)
	}
	var nacks []fakebroker.AckLog
	for _, a := range b.Acks() {
		if a.Nack {
			nacks = append(nacks, a)
		}
	}
	if len(nacks) != 1 || nacks[0].DelayMs != 50 || !slices.Equal(nacks[0].Offsets, []int64{1}) {
		t.Fatalf("nacks %+v", nacks)
	}
}

func TestAutoAckSendsOnlyCredits(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	produceN(t, c, "t", 20, 0)
	var col collector
	s := subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", Mode: Shared, From: Earliest(), AutoAck: true, Window: 4},
		func(_ context.Context, m *Delivered) {
			col.add(m)
			m.Ack()
			m.Nack(0)
		})
	waitFor(t, 5*time.Second, "20 messages", func() bool { return col.len() == 20 })
	if err := s.Flush(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	var credits uint32
	for _, a := range b.Acks() {
		if a.Nack || len(a.Offsets) > 0 {
			t.Fatalf("auto-ack subscription sent %+v", a)
		}
		credits += a.Credits
	}
	if credits < 16 || !b.SubscribeRequests()[0].GetAutoAck() {
		t.Fatalf("credits %d", credits)
	}
	if st := s.Stats(); st.Acked != 0 || st.Nacked != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// With Concurrency > 1, a partition's messages are still handled one at a
// time and in offset order (clustering); other partitions run in parallel.
func TestSubscribePartitionOrder(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 4))
	c := dial(t, b)
	produceN(t, c, "t", 200, 13)
	var mu sync.Mutex
	seen := map[int32][]int64{}
	busy := map[int32]bool{}
	var parallel atomic.Int64
	var running atomic.Int64
	var col collector
	subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", Mode: Clustering, From: Earliest(), Concurrency: 4, Window: 64},
		func(_ context.Context, m *Delivered) {
			mu.Lock()
			if busy[m.Partition] {
				t.Errorf("partition %d handled twice at once", m.Partition)
			}
			busy[m.Partition] = true
			seen[m.Partition] = append(seen[m.Partition], m.Offset)
			mu.Unlock()
			if n := running.Add(1); n > 1 {
				parallel.Add(1)
			}
			time.Sleep(time.Duration(m.Offset%3) * 100 * time.Microsecond)
			running.Add(-1)
			mu.Lock()
			busy[m.Partition] = false
			mu.Unlock()
			col.add(m)
		})
	waitFor(t, 10*time.Second, "200 messages", func() bool { return col.len() == 200 })
	mu.Lock()
	defer mu.Unlock()
	for p, offs := range seen {
		if !slices.IsSorted(offs) {
			t.Errorf("partition %d out of order: %v", p, offs)
		}
	}
	if parallel.Load() == 0 {
		t.Errorf("no two partitions were ever handled in parallel")
	}
}

func TestKeySharedKeepsKeyOrder(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	produceN(t, c, "t", 120, 5)
	var mu sync.Mutex
	byKey := map[string][]int64{}
	var col collector
	subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", Mode: KeyShared, From: Earliest(), Concurrency: 3},
		func(_ context.Context, m *Delivered) {
			time.Sleep(time.Duration(m.Offset%4) * 50 * time.Microsecond)
			mu.Lock()
			byKey[string(m.Key)] = append(byKey[string(m.Key)], m.Offset)
			mu.Unlock()
			col.add(m)
		})
	waitFor(t, 10*time.Second, "120 messages", func() bool { return col.len() == 120 })
	mu.Lock()
	defer mu.Unlock()
	for k, offs := range byKey {
		if !slices.IsSorted(offs) {
			t.Errorf("key %s out of order: %v", k, offs)
		}
	}
}

func TestAssignedAndCommit(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 3))
	c := dial(t, b)
	s := subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t"}, func(context.Context, *Delivered) {})
	waitFor(t, 5*time.Second, "the assignment", func() bool { return len(s.Assigned()) == 3 })
	si := b.Subscriptions()[0]
	if err := b.Push(si.Conn, &heraldpb.Frame{Body: &heraldpb.Frame_Assignment{Assignment: &heraldpb.AssignmentChange{
		SubscriptionId: si.ID, Revoked: []uint32{1}}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the revocation", func() bool { return slices.Equal(s.Assigned(), []int32{0, 2}) })

	produceN(t, c, "t", 30, 0)
	hw, _ := b.HighWatermark("t", 0)
	if err := s.Commit(testCtx(t), 0, hw); err != nil {
		t.Fatal(err)
	}
	if got := b.Acked("g", 0); int64(len(got)) != hw {
		t.Fatalf("after commit: acked %v, want %d", got, hw)
	}
	if err := s.Commit(testCtx(t), -1, 0); err == nil {
		t.Fatal("commit of partition -1")
	}
}

func TestSubscribeErrors(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	ctx := testCtx(t)
	h := func(context.Context, *Delivered) {}

	err := (&SubscribeOptions{Tags: "a", SQL: "b", Window: -1, Mode: 9}).Validate()
	for _, want := range []string{"Group is required", "Topic is required", "not both", "Window", "Mode"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want it to mention %q", err, want)
		}
	}
	if err := (&SubscribeOptions{Group: "g", Topic: "t", DeadLetterTopic: "t"}).Validate(); err == nil || !strings.Contains(err.Error(), "DeadLetterTopic") {
		t.Errorf("Validate with the topic as its dead-letter topic: %v", err)
	}
	if _, err := c.Subscribe(ctx, SubscribeOptions{Group: "g"}, h); err == nil {
		t.Fatal("subscribe without topic")
	}
	if _, err := c.Subscribe(ctx, SubscribeOptions{Group: "g", Topic: "t"}, nil); err == nil {
		t.Fatal("subscribe without handler")
	}
	if _, err := c.Subscribe(ctx, SubscribeOptions{Group: "g", Topic: "nope"}, h); !IsCode(err, heraldpb.ErrorCode_TOPIC_NOT_FOUND) {
		t.Fatalf("missing topic: %v", err)
	}
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetSubscribe() != nil {
			return fakebroker.Action{Error: heraldpb.NewError(heraldpb.ErrorCode_INVALID_FILTER, "at 3: unexpected ')'")}
		}
		return fakebroker.Action{}
	})
	_, err = c.Subscribe(ctx, SubscribeOptions{Group: "g", Topic: "t", SQL: "a = )"}, h)
	var he *Error
	if !errors.As(err, &he) || he.Code != heraldpb.ErrorCode_INVALID_FILTER || IsRetryable(err) {
		t.Fatalf("invalid filter: %v", err)
	}
	// A retryable failure of the first Subscribe is retried.
	var n atomic.Int64
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetSubscribe() != nil && n.Add(1) <= 2 {
			return fakebroker.Action{Error: heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "busy")}
		}
		return fakebroker.Action{}
	})
	s := subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", RetryBackoffMin: time.Millisecond}, h)
	if n.Load() != 3 || len(b.Subscriptions()) != 1 {
		t.Fatalf("attempts %d, subscriptions %d", n.Load(), len(b.Subscriptions()))
	}
	_ = s
	// Until ctx ends.
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetSubscribe() != nil {
			return fakebroker.Action{Error: heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "busy")}
		}
		return fakebroker.Action{}
	})
	// Long enough for the first refusal to come back on a loaded machine
	// (with 50 ms, -race under CI load once ended before any answer,
	// and the error was the context's).
	sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := c.Subscribe(sctx, SubscribeOptions{Group: "g2", Topic: "t", RetryBackoffMin: time.Millisecond}, h); !IsCode(err, heraldpb.ErrorCode_THROTTLED) {
		t.Fatalf("throttled until ctx ends: %v", err)
	}
}

// A Subscribe whose caller gives up after the broker accepted it leaves no
// subscription behind.
func TestSubscribeAbandoned(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetSubscribe() != nil {
			return fakebroker.Action{Delay: 100 * time.Millisecond}
		}
		return fakebroker.Action{}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.Subscribe(ctx, SubscribeOptions{Group: "g", Topic: "t"}, func(context.Context, *Delivered) {}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("subscribe: %v", err)
	}
	waitFor(t, 5*time.Second, "the late subscription to be ended", func() bool {
		return len(b.SubscribeRequests()) == 1 && len(b.Subscriptions()) == 0
	})
}

// When the connection dies the subscription subscribes again on a new one.
// The message being handled then is not acked; the broker redelivers it.
func TestSubscribeReconnects(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	produceN(t, c, "t", 5, 0)
	var errs collectorErr
	inHandler := make(chan struct{})
	release := make(chan struct{})
	var col collector
	var blocked atomic.Bool
	s := subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", Mode: Shared, From: Earliest(), Window: 4,
		RetryBackoffMin: time.Millisecond, OnError: errs.add},
		func(_ context.Context, m *Delivered) {
			col.add(m)
			if string(m.Value) == "v2" && blocked.CompareAndSwap(false, true) {
				close(inHandler)
				<-release
			}
		})
	<-inHandler
	waitFor(t, 5*time.Second, "acks of v0 and v1", func() bool { return s.Stats().Acked == 2 })
	b.DropConnections()
	waitFor(t, 5*time.Second, "a second subscription", func() bool { return len(b.SubscribeRequests()) == 2 && len(b.Subscriptions()) == 1 })
	// The new session is granted only what the window has free: v2 is
	// still in its handler, v3 and v4 are buffered.
	if got := b.SubscribeRequests()[1].GetCredits(); got > 4 {
		t.Fatalf("resubscribed with %d credits", got)
	}
	close(release)
	produceN(t, c, "t", 2, 0)
	defer func() {
		if t.Failed() {
			t.Logf("values %v stats %+v subs %+v acks %+v", col.values(), s.Stats(), b.Subscriptions(), b.Acks())
		}
	}()
	waitFor(t, 5*time.Second, "offset 2 redelivered and offsets 5, 6", func() bool {
		col.mu.Lock()
		defer col.mu.Unlock()
		seen := map[int64]int{}
		for _, m := range col.msgs {
			seen[m.Offset]++
		}
		return seen[2] == 2 && seen[5] == 1 && seen[6] == 1
	})
	if err := s.Flush(testCtx(t)); !errors.Is(err, ErrAcksLost) {
		t.Fatalf("flush after a lost ack: %v", err)
	}
	if err := s.Flush(testCtx(t)); err != nil {
		t.Fatalf("second flush: %v", err)
	}
	st := s.Stats()
	if st.Resubscribes != 1 || st.Lost < 1 {
		t.Fatalf("stats %+v", st)
	}
	waitFor(t, 5*time.Second, "everything acked", func() bool { return len(b.Acked("g", 0)) == 7 })
	if errs.len() == 0 || !errors.Is(errs.first(), ErrConnectionLost) {
		t.Fatalf("OnError got %v", errs.all())
	}
	var redelivered bool
	for _, m := range col.msgs {
		if m.Offset == 2 && m.DeliveryCount == 2 {
			redelivered = true
		}
	}
	if !redelivered {
		t.Fatalf("v2 not redelivered with count 2")
	}
}

// A broker that forgets the subscription (forced reset) makes the client
// subscribe again when its next ack fails with SUBSCRIPTION_NOT_FOUND.
func TestSubscribeAgainAfterSubscriptionNotFound(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	var col collector
	var errs collectorErr
	s := subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", Mode: Shared, OnError: errs.add, RetryBackoffMin: time.Millisecond},
		func(_ context.Context, m *Delivered) { col.add(m) })
	if _, err := c.ResetGroup(testCtx(t), "g", Earliest(), true); err != nil {
		t.Fatal(err)
	}
	// Nothing tells the client until a request of the subscription fails.
	if len(b.Subscriptions()) != 0 {
		t.Fatal("forced reset left the subscription")
	}
	if _, err := s.activeSession(); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(testCtx(t), 0, 0); !IsCode(err, heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND) {
		t.Fatalf("commit on an ended subscription: %v", err)
	}
	waitFor(t, 5*time.Second, "a new subscription", func() bool { return len(b.Subscriptions()) == 1 })
	produceN(t, c, "t", 1, 0)
	waitFor(t, 5*time.Second, "a message on the new subscription", func() bool { return col.len() >= 1 })
	if st := s.Stats(); st.Resubscribes != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// Close waits for the running handler, sends its ack, then unsubscribes.
func TestCloseFlushesThenUnsubscribes(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	produceN(t, c, "t", 3, 0)
	inHandler := make(chan struct{})
	var once sync.Once
	var handled atomic.Int64
	var order []string
	var mu sync.Mutex
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case f.GetAck() != nil && len(f.GetAck().GetOffsets()) > 0:
			order = append(order, "ack")
		case f.GetUnsubscribe() != nil:
			order = append(order, "unsubscribe")
		}
		return fakebroker.Action{}
	})
	s, err := c.Subscribe(testCtx(t), SubscribeOptions{Group: "g", Topic: "t", Mode: Shared, From: Earliest(), AckLinger: time.Hour},
		func(_ context.Context, m *Delivered) {
			once.Do(func() { close(inHandler) })
			time.Sleep(50 * time.Millisecond)
			handled.Add(1)
		})
	if err != nil {
		t.Fatal(err)
	}
	<-inHandler
	if err := s.Close(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(testCtx(t)); err != nil {
		t.Fatalf("second close: %v", err)
	}
	n := handled.Load()
	if n < 1 || n > 3 {
		t.Fatalf("handled %d", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(order) < 2 || order[len(order)-1] != "unsubscribe" || order[0] != "ack" {
		t.Fatalf("requests %v, want acks before the unsubscribe", order)
	}
	if got := len(b.Acked("g", 0)); int64(got) != n {
		t.Fatalf("acked %d, handled %d", got, n)
	}
	if len(b.Subscriptions()) != 0 {
		t.Fatal("still subscribed")
	}
	if err := s.Flush(testCtx(t)); err != nil && !errors.Is(err, ErrClosed) {
		t.Fatalf("flush after close: %v", err)
	}
	if err := s.Commit(testCtx(t), 0, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("commit after close: %v", err)
	}
}

// Close with a context that ends while a handler is stuck cancels the
// handler's context and returns.
func TestCloseGivesUpOnStuckHandler(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	produceN(t, c, "t", 1, 0)
	inHandler := make(chan struct{})
	cancelled := make(chan struct{})
	s, err := c.Subscribe(testCtx(t), SubscribeOptions{Group: "g", Topic: "t", Mode: Shared, From: Earliest()},
		func(ctx context.Context, m *Delivered) {
			close(inHandler)
			<-ctx.Done()
			close(cancelled)
		})
	if err != nil {
		t.Fatal(err)
	}
	<-inHandler
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := s.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("close: %v", err)
	}
	<-cancelled
	waitFor(t, 5*time.Second, "the unsubscribe", func() bool { return len(b.Subscriptions()) == 0 })
}

// Closing the client stops the subscription's goroutines.
func TestClientCloseStopsSubscription(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	s, err := c.Subscribe(testCtx(t), SubscribeOptions{Group: "g", Topic: "t"}, func(context.Context, *Delivered) {})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case <-s.runDone:
	case <-time.After(5 * time.Second):
		t.Fatal("session loop still running")
	}
	select {
	case <-s.ackDone:
	case <-time.After(5 * time.Second):
		t.Fatal("ack loop still running")
	}
	s.workers.Wait()
	if err := s.Close(testCtx(t)); err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, context.Canceled) {
		t.Fatalf("close after client close: %v", err)
	}
}

type collectorErr struct {
	mu   sync.Mutex
	errs []error
}

func (c *collectorErr) add(err error) {
	c.mu.Lock()
	c.errs = append(c.errs, err)
	c.mu.Unlock()
}

func (c *collectorErr) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.errs)
}

func (c *collectorErr) first() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errs[0]
}

func (c *collectorErr) all() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.errs)
}

// pushTarget is a connection with no network and one subscription (id 7,
// KeyShared, three queues) and one pending call (correlation id 9), for
// feeding pushes straight to conn.push.
func pushTarget(window int) (*conn, *Subscription) {
	c := &Client{cfg: defaultClientConfig()}
	s := &Subscription{c: c, opts: SubscribeOptions{Group: "g", Topic: "t", Mode: KeyShared, Window: window, Concurrency: 3},
		progress: make(chan struct{})}
	for range 3 {
		s.queues = append(s.queues, make(chan *Delivered, window))
	}
	cn := &conn{log: c.cfg.logger, pending: map[uint64]chan *heraldpb.Frame{}, subs: map[uint64]*subSession{}, calls: map[uint64]*callWaiter{}}
	ss := &subSession{sub: s, cn: cn, id: 7, state: sessActive, ended: make(chan struct{})}
	s.cur = ss
	cn.subs[7] = ss
	cn.calls[9] = &callWaiter{ch: make(chan *heraldpb.ReplyDelivery, 1)}
	return cn, s
}

func pushSeeds() [][]byte {
	var msgs []*heraldpb.DeliveredMessage
	for i := range 6 {
		msgs = append(msgs, &heraldpb.DeliveredMessage{Partition: uint32(i % 2), Offset: int64(i), DeliveryCount: 1, AppendTimeMs: 1,
			Record: &heraldpb.Record{Key: []byte{byte(i)}, Value: []byte("v"), Headers: []*heraldpb.Header{{Key: "h"}}, Tags: []string{"t"}}})
	}
	msgs = append(msgs, &heraldpb.DeliveredMessage{Offset: -1, ReplyInbox: "in", CorrelationId: 3, Record: &heraldpb.Record{}})
	frames := []*heraldpb.Frame{
		{Body: &heraldpb.Frame_Delivery{Delivery: &heraldpb.Delivery{SubscriptionId: 7, Messages: msgs}}},
		{Body: &heraldpb.Frame_Delivery{Delivery: &heraldpb.Delivery{SubscriptionId: 8, Messages: msgs}}},
		{Body: &heraldpb.Frame_Assignment{Assignment: &heraldpb.AssignmentChange{SubscriptionId: 7, Added: []uint32{1, 2}, Revoked: []uint32{2}}}},
		{Body: &heraldpb.Frame_ReplyDelivery{ReplyDelivery: &heraldpb.ReplyDelivery{CorrelationId: 9, Record: &heraldpb.Record{Value: []byte("r")}}}},
		{Body: &heraldpb.Frame_ReplyDelivery{ReplyDelivery: &heraldpb.ReplyDelivery{CorrelationId: 10}}},
		{Id: 5, Body: &heraldpb.Frame_AckResponse{AckResponse: &heraldpb.AckResponse{}}},
	}
	var out [][]byte
	for _, f := range frames {
		b, err := heraldpb.AppendFrame(nil, f)
		if err != nil {
			panic(err)
		}
		out = append(out, b[heraldpb.HeaderLen:])
	}
	return out
}

// dispatchPush does with a frame payload what the reader does with one
// that is a push: pushDelivery, else DecodeFrame and push. It reports
// whether the frame was a push.
func dispatchPush(cn *conn, payload []byte) bool {
	if ok, err := cn.pushDelivery(payload); ok || err != nil {
		return true
	}
	fr, err := heraldpb.DecodeFrame(payload)
	if err != nil && fr == nil {
		return false
	}
	return fr.GetId() == 0 && cn.push(fr)
}

// FuzzPushFrame feeds frame payloads to the reader's push dispatch. It
// checks that dispatch never panics and never blocks, that a subscription
// never holds more than its window (the excess is dropped and counted),
// and that a pending call gets at most its one reply.
func FuzzPushFrame(f *testing.F) {
	for _, s := range pushSeeds() {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		const window = 4
		cn, s := pushTarget(window)
		for _, payload := range [][]byte{a, b} {
			dispatchPush(cn, payload)
		}
		queued := 0
		for _, q := range s.queues {
			queued += len(q)
		}
		st := s.Stats()
		if st.InFlight > window || queued != st.InFlight || uint64(queued) != st.Delivered {
			t.Fatalf("held %d, queued %d, stats %+v", st.InFlight, queued, st)
		}
	})
}

func TestPushDispatch(t *testing.T) {
	cn, s := pushTarget(4)
	w := cn.calls[9]
	seeds := pushSeeds()
	for _, p := range seeds {
		f, err := heraldpb.DecodeFrame(p)
		if err != nil {
			t.Fatal(err)
		}
		if isPush := dispatchPush(cn, p); isPush != (f.GetId() == 0) {
			t.Fatalf("push(%T) = %v", f.GetBody(), isPush)
		}
	}
	if st := s.Stats(); st.Delivered != 4 || st.Dropped != 3 {
		t.Fatalf("stats %+v", st)
	}
	if got := s.Assigned(); !slices.Equal(got, []int32{1, 2}) { // revoked before added

		t.Fatalf("assigned %v", got)
	}
	select {
	case rd := <-w.ch:
		if string(rd.GetRecord().GetValue()) != "r" {
			t.Fatalf("reply %v", rd)
		}
	default:
		t.Fatal("call 9 got no reply")
	}
	if len(cn.calls) != 0 {
		t.Fatalf("calls %v", cn.calls)
	}
	// Messages of one key go to one queue.
	for _, q := range s.queues {
		for len(q) > 0 {
			d := <-q
			if s.route(d) != q {
				t.Fatalf("message with key %x in the wrong queue", d.Key)
			}
		}
	}
}

func TestOrderlyAcksWithoutLinger(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	s := subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", Mode: Shared, Orderly: true, AckLinger: time.Hour},
		func(context.Context, *Delivered) {})
	produceN(t, c, "t", 3, 0)
	waitFor(t, 5*time.Second, "acks despite the hour-long linger", func() bool { return s.Stats().Acked == 3 })
	if !b.SubscribeRequests()[0].GetOrderly() {
		t.Fatal("orderly not requested")
	}
}

func TestSubscribeRequestFields(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_000)
	for _, tc := range []struct {
		o    SubscribeOptions
		want *heraldpb.SubscribeRequest
	}{
		{SubscribeOptions{Mode: Clustering, From: Latest()},
			&heraldpb.SubscribeRequest{Mode: heraldpb.SubscriptionMode_MODE_CLUSTERING, Start: &heraldpb.StartPosition{At: &heraldpb.StartPosition_Latest{Latest: true}}}},
		{SubscribeOptions{Mode: Broadcast, From: AtOffset(42), Tags: "a || b", AckTimeout: 1500 * time.Millisecond},
			&heraldpb.SubscribeRequest{Mode: heraldpb.SubscriptionMode_MODE_BROADCAST, Start: &heraldpb.StartPosition{At: &heraldpb.StartPosition_Offset{Offset: 42}},
				FilterType: heraldpb.FilterType_FILTER_TAG, Filter: "a || b", AckTimeoutMs: 1500, MemberName: "herald-go@" + hostname(t)}},
		{SubscribeOptions{Mode: Shared, From: AtTime(at), SQL: "x > 1", Responder: true, AutoAck: true, Name: "n"},
			&heraldpb.SubscribeRequest{Mode: heraldpb.SubscriptionMode_MODE_SHARED, Start: &heraldpb.StartPosition{At: &heraldpb.StartPosition_TimestampMs{TimestampMs: at.UnixMilli()}},
				FilterType: heraldpb.FilterType_FILTER_SQL, Filter: "x > 1", Responder: true, AutoAck: true, MemberName: "n"}},
		{SubscribeOptions{Mode: KeyShared, From: Earliest(), Orderly: true},
			&heraldpb.SubscribeRequest{Mode: heraldpb.SubscriptionMode_MODE_KEY_SHARED, Start: &heraldpb.StartPosition{At: &heraldpb.StartPosition_Earliest{Earliest: true}}, Orderly: true}},
		{SubscribeOptions{Mode: Shared, From: Earliest(), RetryPolicy: "1s,5s max-deliveries=3", DeadLetterTopic: "failed", DeadLetterExpired: true},
			&heraldpb.SubscribeRequest{Mode: heraldpb.SubscriptionMode_MODE_SHARED, Start: &heraldpb.StartPosition{At: &heraldpb.StartPosition_Earliest{Earliest: true}},
				RetryPolicy: "1s,5s max-deliveries=3", DeadLetterTopic: "failed", DeadLetterExpired: true}},
	} {
		tc.o.Group, tc.o.Topic = "g", "t"
		tc.want.Group, tc.want.Topic, tc.want.Credits = "g", "t", 7
		s := &Subscription{opts: tc.o, c: &Client{cfg: defaultClientConfig()}}
		if got := s.subscribeRequest(7).GetSubscribe(); !proto.Equal(got, tc.want) {
			t.Errorf("%v:\n got %v\nwant %v", tc.o.Mode, got, tc.want)
		}
		if tc.o.Mode.String() == "" || strings.HasPrefix(tc.o.Mode.String(), "SubscriptionMode(") {
			t.Errorf("mode %d has no name", tc.o.Mode)
		}
	}
}

func hostname(t *testing.T) string {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// A Flush answers for the acks queued before it was called, and only for
// them: an ack queued after a Flush started and lost while it waits is
// reported by the Flush that covers it, not swallowed by the earlier one.
// (The chaos run groups-dlq-seed1: a Flush blocked through a coordinator
// failover took the losses of acks queued meanwhile, and the next Flush,
// which covered those acks, returned nil.)
func TestFlushReportsLostAcksToTheFlushThatCoversThem(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	produceN(t, c, "t", 1, 0)
	var col collector
	s := subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", Mode: Shared, From: Earliest(), AckLinger: time.Hour,
		RetryBackoffMin: time.Millisecond}, func(_ context.Context, m *Delivered) { col.add(m) })
	waitFor(t, 5*time.Second, "v0 handled", func() bool { return col.len() == 1 && s.Stats().InFlight == 0 })

	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		a := f.GetAck()
		switch {
		case a == nil || len(a.Offsets) == 0:
			return fakebroker.Action{}
		case a.Offsets[0] == 0: // v0's ack: held until released
			once.Do(func() { close(held) })
			<-release
			return fakebroker.Action{}
		default: // v1's ack: refused, so it is lost
			return fakebroker.Action{Error: heraldpb.NewError(heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND, "gone")}
		}
	})
	first := make(chan error, 1)
	go func() { first <- s.Flush(testCtx(t)) }()
	<-held
	produceN(t, c, "t", 1, 0) // v1, handled and acked while the first Flush waits
	waitFor(t, 5*time.Second, "v1's ack lost", func() bool { return s.Stats().Lost == 1 })
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first flush (v0's ack, confirmed): %v", err)
	}
	if err := s.Flush(testCtx(t)); !errors.Is(err, ErrAcksLost) {
		t.Fatalf("second flush (v1's ack, lost): %v", err)
	}
	if err := s.Flush(testCtx(t)); err != nil {
		t.Fatalf("third flush (nothing new): %v", err)
	}
}

// lostAcks gives each Flush the losses among its own acks: concurrent
// Flushes both report a loss they cover, a Flush called after a verdict
// does not report it again, and folded losses are reported conservatively.
func TestLostAcksVerdicts(t *testing.T) {
	var l lostAcks
	a, b := l.begin(), l.begin() // Flush a covers seqs 1-10, b covers 1-20
	l.add(5)
	l.add(15)
	if n := l.report(20, b); n != 2 {
		t.Fatalf("b: %d lost, want 2", n)
	}
	if n := l.report(10, a); n != 1 {
		t.Fatalf("a (reported after b's verdict, but a began before it): %d lost, want 1", n)
	}
	l.end(a)
	l.end(b)
	c := l.begin()
	if n := l.report(20, c); n != 0 {
		t.Fatalf("c (after both verdicts): %d lost, want 0", n)
	}
	l.end(c)
	if len(l.runs) != 0 {
		t.Fatalf("runs kept: %+v", l.runs)
	}

	for seq := uint64(100); seq < 100+maxLostRuns+1; seq++ {
		l.add(seq)
	}
	if len(l.runs) != 1 || l.runs[0].n != maxLostRuns+1 {
		t.Fatalf("not folded: %d runs", len(l.runs))
	}
	for i, want := range []uint64{0, maxLostRuns + 1, maxLostRuns + 1, 0} {
		target := []uint64{99, 100, 100 + maxLostRuns, 100 + maxLostRuns}[i]
		f := l.begin()
		if n := l.report(target, f); n != want {
			t.Fatalf("flush %d up to %d: %d lost, want %d", i, target, n, want)
		}
		l.end(f)
	}
}

// An assign-only member grants no credits and needs no handler; it is
// refused outside Clustering mode.
func TestSubscribeAssignOnly(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 2))
	c := dial(t, b)
	produceN(t, c, "t", 10, 0)
	s, err := c.Subscribe(testCtx(t), SubscribeOptions{Group: "g", Topic: "t", AssignOnly: true, From: Earliest()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(testCtx(t))
	waitFor(t, 5*time.Second, "the subscription", func() bool { return len(b.Subscriptions()) == 1 })
	if si := b.Subscriptions()[0]; si.Granted != 0 || si.Delivered != 0 {
		t.Fatalf("assign-only member: %+v", si)
	}
	if _, err := c.Subscribe(testCtx(t), SubscribeOptions{Group: "h", Topic: "t", Mode: Shared, AssignOnly: true}, nil); err == nil || !strings.Contains(err.Error(), "AssignOnly needs Clustering") {
		t.Fatalf("AssignOnly in shared mode: %v", err)
	}
}
