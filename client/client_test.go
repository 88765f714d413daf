package client

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/client/fakebroker"
	heraldpb "github.com/heraldmq/herald/proto"
)

func newBroker(t *testing.T, opts ...fakebroker.Opt) *fakebroker.Broker {
	t.Helper()
	b, err := fakebroker.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

func dial(t *testing.T, b *fakebroker.Broker, opts ...Option) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, b.Addr(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitFor polls cond until it holds or the deadline passes.
// waitFor polls cond until it holds or d passes; a detail func, when
// given, says in the failure what the state was.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool, detail ...func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			var more string
			for _, f := range detail {
				more += ": " + f()
			}
			t.Fatalf("timed out waiting for %s%s", what, more)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestPipeliningMatchesResponsesByID(t *testing.T) {
	const n = 20
	b := newBroker(t)
	c := dial(t, b)
	ctx := testCtx(t)
	for i := 0; i < n; i++ {
		if _, err := c.CreateTopic(ctx, fmt.Sprintf("t%02d", i), &heraldpb.TopicConfig{Partitions: uint32(i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	// Later requests are answered first: responses come back in reverse.
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if d := f.GetDescribeTopic(); d != nil {
			i, _ := strconv.Atoi(d.GetName()[1:])
			return fakebroker.Action{Delay: time.Duration(n-i) * 3 * time.Millisecond}
		}
		return fakebroker.Action{}
	})
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("t%02d", i)
			ti, err := c.DescribeTopic(ctx, name)
			if err != nil {
				errs <- err
				return
			}
			if ti.GetName() != name || len(ti.GetPartitions()) != i+1 {
				errs <- fmt.Errorf("asked %s, got %s with %d partitions", name, ti.GetName(), len(ti.GetPartitions()))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := b.Connections(); got != 1 {
		t.Errorf("connections = %d, want 1", got)
	}
	if got := b.MaxInFlightSeen(); got < 2 {
		t.Errorf("max in flight seen = %d, want pipelining (>= 2)", got)
	}
}

func TestInFlightWindowRespected(t *testing.T) {
	b := newBroker(t, fakebroker.Window(4), fakebroker.Topic("t", 1))
	c := dial(t, b, WithMaxInFlight(100))
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetMetadata() != nil {
			return fakebroker.Action{Delay: 5 * time.Millisecond}
		}
		return fakebroker.Action{}
	})
	ctx := testCtx(t)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := 0; i < 60; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Metadata(ctx, "t"); err != nil {
				failed.Add(1)
				t.Log(err)
			}
		}()
	}
	wg.Wait()
	if failed.Load() != 0 || b.WindowViolations() != 0 {
		t.Fatalf("failed=%d violations=%d", failed.Load(), b.WindowViolations())
	}
	if got := b.MaxInFlightSeen(); got != 4 {
		t.Fatalf("max in flight = %d, want the negotiated 4", got)
	}
}

func TestLingerBatchesRecords(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	p := c.NewProducer(WithLinger(200*time.Millisecond), WithManualPartitions())
	ctx := testCtx(t)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < 10; i++ {
		wg.Add(1)
		p.SendAsync(ctx, &Message{Topic: "t", Partition: 0, Value: []byte{byte(i)}}, func(r Result, err error) {
			defer wg.Done()
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if el := time.Since(start); el < 150*time.Millisecond {
		t.Errorf("batch sent after %v, before the linger", el)
	}
	prod := b.Produced()
	if len(prod) != 1 || prod[0].Count != 10 {
		t.Fatalf("produce requests = %+v, want one of 10 records", prod)
	}
}

func TestBatchBytesSealsFullBatches(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	p := c.NewProducer(WithLinger(time.Hour), WithBatchBytes(1000), WithManualPartitions())
	ctx := testCtx(t)
	var done atomic.Int64
	for i := 0; i < 100; i++ {
		p.SendAsync(ctx, &Message{Topic: "t", Partition: 0, Value: make([]byte, 95)}, func(r Result, err error) {
			if err != nil {
				t.Error(err)
			}
			done.Add(1)
		})
	}
	// Full batches go without waiting for the hour-long linger.
	waitFor(t, 5*time.Second, "full batches", func() bool { return done.Load() >= 90 })
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, pr := range b.Produced() {
		if len(pr.Records) > 1000 {
			t.Errorf("batch of %d bytes exceeds 1000", len(pr.Records))
		}
		total += pr.Count
	}
	if total != 100 || done.Load() != 100 {
		t.Fatalf("stored %d records, %d callbacks; want 100", total, done.Load())
	}
}

func TestRetryHonoursRetryAfter(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	var attempts atomic.Int64
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetProduce() != nil && attempts.Add(1) <= 2 {
			e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "slow down")
			e.RetryAfterMs = 40
			return fakebroker.Action{Error: e}
		}
		return fakebroker.Action{}
	})
	p := c.NewProducer(WithRetryBackoff(time.Millisecond, 2*time.Millisecond))
	start := time.Now()
	m := &Message{Topic: "t", Value: []byte("x")}
	r, err := p.Send(testCtx(t), m)
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 80*time.Millisecond {
		t.Errorf("succeeded after %v; retry-after of 2x40ms not honoured", el)
	}
	if attempts.Load() != 3 || r.Offset != 0 || m.Offset != 0 {
		t.Fatalf("attempts=%d result=%+v", attempts.Load(), r)
	}
}

func TestNoRetryOnFinalErrorAndRetryLimit(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	var attempts atomic.Int64
	code := heraldpb.ErrorCode_MESSAGE_TOO_LARGE
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetProduce() != nil {
			attempts.Add(1)
			return fakebroker.Action{Error: heraldpb.NewError(code, "no")}
		}
		return fakebroker.Action{}
	})
	ctx := testCtx(t)
	p := c.NewProducer(WithRetryBackoff(time.Millisecond, time.Millisecond), WithMaxRetries(3), WithFailoverTimeout(0), WithManualPartitions())
	_, err := p.Send(ctx, &Message{Topic: "t", Partition: 0, Value: []byte("x")})
	var he *Error
	if !errors.As(err, &he) || he.Code != code || IsRetryable(err) || attempts.Load() != 1 {
		t.Fatalf("err=%v attempts=%d, want one attempt failing with %v", err, attempts.Load(), code)
	}
	attempts.Store(0)
	code = heraldpb.ErrorCode_NOT_LEADER
	_, err = p.Send(ctx, &Message{Topic: "t", Partition: 0, Value: []byte("x")})
	if !IsCode(err, code) || !IsRetryable(err) || attempts.Load() != 4 {
		t.Fatalf("err=%v attempts=%d, want 1+3 attempts failing with NOT_LEADER", err, attempts.Load())
	}
	// With a failover timeout, a moving leader is retried past the retry
	// count until the timeout.
	attempts.Store(0)
	p = c.NewProducer(WithRetryBackoff(time.Millisecond, time.Millisecond), WithMaxRetries(3), WithFailoverTimeout(300*time.Millisecond), WithManualPartitions())
	start := time.Now()
	_, err = p.Send(ctx, &Message{Topic: "t", Partition: 0, Value: []byte("x")})
	if !IsCode(err, code) || attempts.Load() <= 4 || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("err=%v attempts=%d after %v, want NOT_LEADER after retrying for the failover timeout", err, attempts.Load(), time.Since(start))
	}
}

func TestOrderPreservedAcrossRetries(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 2))
	c := dial(t, b)
	var n atomic.Int64
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetProduce() != nil && n.Add(1)%3 == 0 {
			return fakebroker.Action{Error: heraldpb.NewError(heraldpb.ErrorCode_NOT_LEADER, "moved")}
		}
		return fakebroker.Action{}
	})
	p := c.NewProducer(WithBatchBytes(200), WithLinger(0), WithRetryBackoff(time.Millisecond, time.Millisecond), WithManualPartitions())
	ctx := testCtx(t)
	const total = 300
	for i := 0; i < total; i++ {
		p.SendAsync(ctx, &Message{Topic: "t", Partition: int32(i % 2), Value: []byte(strconv.Itoa(i))}, func(_ Result, err error) {
			if err != nil {
				t.Error(err)
			}
		})
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for part := uint32(0); part < 2; part++ {
		recs := b.Records("t", part)
		if len(recs) != total/2 {
			t.Fatalf("partition %d has %d records, want %d", part, len(recs), total/2)
		}
		for i, r := range recs {
			if want := strconv.Itoa(2*i + int(part)); string(r.GetValue()) != want {
				t.Fatalf("partition %d record %d = %s, want %s", part, i, r.GetValue(), want)
			}
		}
	}
	if len(b.Produced()) < 10 {
		t.Fatalf("only %d batches; the test needs many retried batches", len(b.Produced()))
	}
}

func TestPartitionForKey(t *testing.T) {
	for _, k := range []string{"", "a", "user-42", "héllo"} {
		h := fnv.New32a()
		h.Write([]byte(k))
		for _, n := range []uint32{1, 3, 8, 1000} {
			if got, want := PartitionForKey([]byte(k), n), h.Sum32()%n; got != want {
				t.Errorf("PartitionForKey(%q, %d) = %d, want %d", k, n, got, want)
			}
		}
	}
	if PartitionForKey([]byte("a"), 0) != 0 {
		t.Error("n = 0 must give 0")
	}
}

func TestKeyedMessagesStableAndExplicit(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 8))
	c := dial(t, b)
	p := c.NewProducer(WithLinger(20 * time.Millisecond))
	ctx := testCtx(t)
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		key := []byte(fmt.Sprintf("k%d", i%17))
		wg.Add(1)
		p.SendAsync(ctx, &Message{Topic: "t", Key: key, Value: []byte("v")}, func(r Result, err error) {
			defer wg.Done()
			if err != nil {
				t.Error(err)
				return
			}
			if want := int32(PartitionForKey(key, 8)); r.Partition != want {
				t.Errorf("key %s went to %d, want %d", key, r.Partition, want)
			}
		})
	}
	wg.Wait()
	for _, pr := range b.Produced() {
		if !pr.Explicit {
			t.Fatalf("keyed batch sent without an explicit partition: %+v", pr)
		}
	}
}

// The zero Message goes to any partition: a keyed one to PartitionForKey,
// the others spread over the topic's partitions; Send reports where each
// went.
func TestZeroPartitionIsAny(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 4))
	c := dial(t, b)
	ctx := testCtx(t)
	p := c.NewProducer(WithBatchBytes(64), WithLinger(time.Millisecond))
	for i := 0; i < 20; i++ {
		key := []byte(fmt.Sprintf("k%d", i))
		m := &Message{Topic: "t", Key: key, Value: []byte("keyed")}
		r, err := p.Send(ctx, m)
		if want := int32(PartitionForKey(key, 4)); err != nil || r.Partition != want || m.Partition != want || m.Offset != r.Offset {
			t.Fatalf("key %s: result %+v, message partition %d offset %d, err %v; want partition %d", key, r, m.Partition, m.Offset, err, want)
		}
	}
	var mu sync.Mutex
	got := map[int32]int{}
	for i := 0; i < 400; i++ {
		p.SendAsync(ctx, &Message{Topic: "t", Value: []byte(fmt.Sprintf("%04d", i))}, func(r Result, err error) {
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			got[r.Partition]++
			mu.Unlock()
		})
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for part := int32(0); part < 4; part++ {
		if got[part] < 40 {
			t.Errorf("partition %d got %d of 400 unkeyed records: %v", part, got[part], got)
		}
	}
}

// Without WithManualPartitions a producer ignores Message.Partition, -1 and
// out-of-range values included: keyed messages go to their key's
// partition, unkeyed ones where the producer (idempotent) or the broker
// (not) spreads them.
func TestPartitionIgnoredWithoutManual(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 4))
	c := dial(t, b)
	ctx := testCtx(t)
	p := c.NewProducer()
	key := []byte("customer-42")
	want := int32(PartitionForKey(key, 4))
	for _, part := range []int32{-1, 0, (want + 1) % 4, 99} {
		if r, err := p.Send(ctx, &Message{Topic: "t", Partition: part, Key: key, Value: []byte("v")}); err != nil || r.Partition != want {
			t.Fatalf("keyed with Partition %d: %+v, %v; want partition %d", part, r, err, want)
		}
	}
	spread := map[int32]bool{}
	for i := 0; i < 8; i++ { // each Send is a batch of its own: the next goes to the next partition
		r, err := p.Send(ctx, &Message{Topic: "t", Partition: 2, Value: []byte("v")})
		if err != nil {
			t.Fatal(err)
		}
		spread[r.Partition] = true
	}
	if len(spread) != 4 {
		t.Fatalf("unkeyed records with Partition 2 went to partitions %v, want all 4", spread)
	}
	before := len(b.Produced())
	if _, err := c.NewProducer(WithIdempotence(false)).Send(ctx, &Message{Topic: "t", Partition: 3, Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if prs := b.Produced()[before:]; len(prs) != 1 || prs[0].Explicit {
		t.Fatalf("batches %+v; want one without a partition, for the broker to choose", prs)
	}
}

// WithManualPartitions writes each message to its Partition exactly, key
// or not, partition 0 included.
func TestManualPartitions(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 4))
	c := dial(t, b)
	ctx := testCtx(t)
	key := []byte("customer-42")
	other := int32(PartitionForKey(key, 4)+1) % 4
	for _, idem := range []bool{true, false} {
		p := c.NewProducer(WithManualPartitions(), WithIdempotence(idem))
		before := len(b.Produced())
		for _, m := range []*Message{
			{Topic: "t", Value: []byte("zero")},
			{Topic: "t", Partition: 3, Value: []byte("three")},
			{Topic: "t", Partition: other, Key: key, Value: []byte("keyed")},
		} {
			want := m.Partition
			r, err := p.Send(ctx, m)
			if err != nil || r.Partition != want || m.Partition != want {
				t.Fatalf("idempotence %v: %s went to %+v (message partition %d), %v; want %d", idem, m.Value, r, m.Partition, err, want)
			}
		}
		for _, pr := range b.Produced()[before:] {
			if !pr.Explicit || (pr.ProducerID != 0) != idem {
				t.Fatalf("idempotence %v: batch %+v; want an explicit partition", idem, pr)
			}
		}
	}
	want := map[uint32]int{0: 2, 3: 2}
	want[uint32(other)] += 2
	for part := uint32(0); part < 4; part++ {
		if n := len(b.Records("t", part)); n != want[part] {
			t.Errorf("partition %d holds %d records, want %d", part, n, want[part])
		}
	}
}

// With WithManualPartitions a negative partition fails at once with
// ErrInvalidPartition, nothing sent; one the topic does not have fails
// with the broker's PARTITION_NOT_FOUND. Neither is retried.
func TestManualNegativePartitionIsTypedError(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 2))
	c := dial(t, b)
	ctx := testCtx(t)
	p := c.NewProducer(WithManualPartitions(), WithRetryBackoff(time.Millisecond, time.Millisecond))
	for _, part := range []int32{-1, -2, math.MinInt32} {
		m := &Message{Topic: "t", Partition: part, Key: []byte("k"), Value: []byte("v")}
		if _, err := p.Send(ctx, m); !errors.Is(err, ErrInvalidPartition) || IsRetryable(err) || m.Partition != part {
			t.Fatalf("Send to partition %d: %v; want ErrInvalidPartition, the message unchanged", part, err)
		}
		var calls atomic.Int64
		var got error
		p.SendAsync(ctx, m, func(_ Result, err error) { calls.Add(1); got = err })
		if calls.Load() != 1 || !errors.Is(got, ErrInvalidPartition) { // called before SendAsync returns
			t.Fatalf("SendAsync to partition %d: %d callbacks, %v", part, calls.Load(), got)
		}
	}
	if n := len(b.Produced()); n != 0 || p.Buffered() != 0 {
		t.Fatalf("%d batches sent, %d buffered after refused messages", n, p.Buffered())
	}
	if _, err := p.Send(ctx, &Message{Topic: "t", Partition: 2, Value: []byte("v")}); !IsCode(err, heraldpb.ErrorCode_PARTITION_NOT_FOUND) || IsRetryable(err) {
		t.Fatalf("Send to partition 2 of 2: %v; want PARTITION_NOT_FOUND", err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestLostConnectionFailsPendingAndRedials(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	seen := make(chan struct{}, 1)
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetDescribeTopic() != nil {
			seen <- struct{}{}
			return fakebroker.Action{Drop: true}
		}
		return fakebroker.Action{}
	})
	ctx := testCtx(t)
	errc := make(chan error, 1)
	go func() {
		_, err := c.DescribeTopic(ctx, "t")
		errc <- err
	}()
	<-seen
	b.DropConnections()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrConnectionLost) || !IsRetryable(err) {
			t.Fatalf("err = %v, want retryable ErrConnectionLost", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("pending request not failed after the connection dropped")
	}
	b.SetHook(nil)
	if _, err := c.DescribeTopic(ctx, "t"); err != nil {
		t.Fatalf("after redial: %v", err)
	}
	if got := b.Connections(); got != 2 {
		t.Fatalf("connections = %d, want 2 (one redial)", got)
	}
}

func TestCancellationAndTimeoutsNeverHang(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1), fakebroker.Window(2))
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetDescribeTopic() != nil {
			return fakebroker.Action{Drop: true}
		}
		return fakebroker.Action{}
	})
	c := dial(t, b)
	// Fill the window with requests the broker never answers.
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		_, err := c.DescribeTopic(ctx, "t")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || IsRetryable(err) {
			t.Fatalf("call %d: err = %v, want DeadlineExceeded", i, err)
		}
	}
	// The window is still held by the abandoned requests: a new call waits
	// for a slot and still honours its context.
	ctx, cancel := context.WithCancel(context.Background())
	go func() { cancel() }()
	if _, err := c.Metadata(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want Canceled", err)
	}

	// The request timeout fails the request and the connection; the next
	// call redials.
	c2 := dial(t, b, WithRequestTimeout(50*time.Millisecond))
	_, err := c2.DescribeTopic(context.Background(), "t")
	if !errors.Is(err, ErrRequestTimeout) || !IsRetryable(err) {
		t.Fatalf("err = %v, want retryable ErrRequestTimeout", err)
	}
	if _, err := c2.Metadata(testCtx(t), "t"); err != nil {
		t.Fatalf("after timeout: %v", err)
	}

	// Close fails what is pending.
	errc := make(chan error, 1)
	go func() {
		_, err := c2.DescribeTopic(context.Background(), "t")
		errc <- err
	}()
	waitFor(t, 5*time.Second, "request in flight", func() bool { return b.MaxInFlightSeen() >= 1 })
	c2.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("pending call succeeded after Close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not fail the pending call")
	}
	if _, err := c2.Metadata(testCtx(t)); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}

func TestFlushAndCloseDeliverEverything(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 4))
	c := dial(t, b)
	p := c.NewProducer(WithLinger(time.Hour), WithBatchBytes(4096))
	ctx := testCtx(t)
	var ok atomic.Int64
	const total = 1000
	for i := 0; i < total; i++ {
		m := &Message{Topic: "t", Value: []byte(strconv.Itoa(i))}
		if i%3 == 0 {
			m.Key = []byte(strconv.Itoa(i))
		}
		p.SendAsync(ctx, m, func(_ Result, err error) {
			if err != nil {
				t.Error(err)
				return
			}
			ok.Add(1)
		})
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if ok.Load() != total || p.Buffered() != 0 {
		t.Fatalf("after Flush: %d acknowledged, %d buffered", ok.Load(), p.Buffered())
	}
	p.SendAsync(ctx, &Message{Topic: "t", Value: []byte("last")}, nil)
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	stored := 0
	for part := uint32(0); part < 4; part++ {
		stored += len(b.Records("t", part))
	}
	if stored != total+1 {
		t.Fatalf("stored %d, want %d", stored, total+1)
	}
	errc := make(chan error, 1)
	p.SendAsync(ctx, &Message{Topic: "t"}, func(_ Result, err error) { errc <- err })
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("SendAsync after Close: %v", err)
	}
}

func TestCloseGivesUpOnContext(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetProduce() != nil {
			return fakebroker.Action{Drop: true}
		}
		return fakebroker.Action{}
	})
	c := dial(t, b)
	p := c.NewProducer(WithManualPartitions())
	errc := make(chan error, 1)
	p.SendAsync(testCtx(t), &Message{Topic: "t", Partition: 0, Value: []byte("x")}, func(_ Result, err error) { errc <- err })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := p.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v", err)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("record outcome = %v, want ErrClosed", err)
	}
}

func TestBufferFull(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetProduce() != nil {
			return fakebroker.Action{Drop: true}
		}
		return fakebroker.Action{}
	})
	c := dial(t, b)
	fill := func(p *Producer) {
		p.SendAsync(testCtx(t), &Message{Topic: "t", Partition: 0, Value: make([]byte, 900)}, nil)
	}
	nb := c.NewProducer(WithBufferBytes(1000), WithNonBlocking(), WithManualPartitions())
	fill(nb)
	errc := make(chan error, 1)
	nb.SendAsync(testCtx(t), &Message{Topic: "t", Partition: 0, Value: make([]byte, 200)}, func(_ Result, err error) { errc <- err })
	if err := <-errc; !errors.Is(err, ErrBufferFull) {
		t.Fatalf("non-blocking: %v, want ErrBufferFull", err)
	}
	bl := c.NewProducer(WithBufferBytes(1000), WithManualPartitions())
	fill(bl)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	bl.SendAsync(ctx, &Message{Topic: "t", Partition: 0, Value: make([]byte, 200)}, func(_ Result, err error) { errc <- err })
	if err := <-errc; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blocking: %v, want DeadlineExceeded", err)
	}
	for _, p := range []*Producer{nb, bl} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		p.Close(ctx)
		cancel()
	}
}

func TestFetchSkipsAndStampsRecords(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	ctx := testCtx(t)
	p := c.NewProducer(WithLinger(time.Hour), WithManualPartitions())
	stamp := time.UnixMilli(1_700_000_000_000)
	for i := 0; i < 5; i++ {
		m := &Message{Topic: "t", Partition: 0, Key: []byte("k"), Value: []byte(strconv.Itoa(i)),
			Headers: []Header{{Key: "h", Value: []byte("v")}}, Tags: []string{"a"}}
		if i == 4 {
			m.Timestamp = stamp
		}
		p.SendAsync(ctx, m, nil)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(b.Produced()); n != 1 {
		t.Fatalf("%d batches, want 1 so that the fetch must skip", n)
	}
	res, err := c.Fetch(ctx, "t", 0, 2, 1<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Messages) != 3 || res.NextOffset != 5 || res.HighWatermark != 5 {
		t.Fatalf("got %d messages next=%d hw=%d", len(res.Messages), res.NextOffset, res.HighWatermark)
	}
	for i, m := range res.Messages {
		if m.Offset != int64(i+2) || string(m.Value) != strconv.Itoa(i+2) || m.Partition != 0 || m.Topic != "t" ||
			len(m.Headers) != 1 || m.Tags[0] != "a" || string(m.Key) != "k" {
			t.Errorf("message %d = %+v", i, m)
		}
		if m.Timestamp.IsZero() || (i == 2) != m.Timestamp.Equal(stamp) {
			t.Errorf("message %d timestamp %v", i, m.Timestamp)
		}
	}
	if _, err := c.Fetch(ctx, "t", 0, 99, 0, 0); !IsCode(err, heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE) {
		t.Fatalf("fetch past end: %v", err)
	}
}

func TestFetchLongPollWakesOnProduce(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	ctx := testCtx(t)
	resc := make(chan *FetchResult, 1)
	go func() {
		res, err := c.Fetch(ctx, "t", 0, 0, 0, 5*time.Second)
		if err != nil {
			t.Error(err)
		}
		resc <- res
	}()
	waitFor(t, 5*time.Second, "fetch in flight", func() bool { return b.MaxInFlightSeen() >= 1 })
	start := time.Now()
	if _, err := c.NewProducer(WithManualPartitions()).Send(ctx, &Message{Topic: "t", Partition: 0, Value: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	res := <-resc
	if res == nil || len(res.Messages) != 1 || time.Since(start) > 3*time.Second {
		t.Fatalf("long poll: %+v", res)
	}
}

func TestConsumers(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 3))
	c := dial(t, b)
	ctx := testCtx(t)
	p := c.NewProducer(WithManualPartitions())
	send := func(from, to int) {
		for i := from; i < to; i++ {
			p.SendAsync(ctx, &Message{Topic: "t", Partition: int32(i % 3), Value: []byte(strconv.Itoa(i))}, nil)
		}
		if err := p.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	send(0, 30)

	pc := c.NewPartitionConsumer("t", 1, Earliest(), WithFetchMaxWait(10*time.Millisecond))
	var got []string
	for len(got) < 10 {
		ms, err := pc.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			got = append(got, string(m.Value))
		}
	}
	if got[0] != "1" || got[9] != "28" {
		t.Fatalf("partition 1 = %v", got)
	}
	if pos, ok := pc.Position(); !ok || pos != 10 || pc.HighWatermark() != 10 {
		t.Fatalf("position %d %v hw %d", pos, ok, pc.HighWatermark())
	}

	all := c.NewConsumer("t", Earliest(), nil, WithFetchMaxWait(50*time.Millisecond))
	defer all.Close()
	latest := c.NewConsumer("t", Latest(), nil, WithFetchMaxWait(50*time.Millisecond))
	defer latest.Close()
	seen := map[string]bool{}
	for len(seen) < 30 {
		ms, err := all.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			seen[string(m.Value)] = true
		}
	}
	// The latest consumer starts at its first Poll; poll once with a short
	// context so its start is resolved before producing.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	if ms, err := latest.Poll(short); len(ms) != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("latest before produce: %d messages, %v", len(ms), err)
	}
	cancel()
	send(30, 33)
	var fresh []string
	for len(fresh) < 3 {
		ms, err := latest.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			fresh = append(fresh, string(m.Value))
		}
	}
	if len(fresh) != 3 {
		t.Fatalf("latest consumer got %v", fresh)
	}
	if pos := latest.Positions(); pos[0] != 11 || pos[1] != 11 || pos[2] != 11 {
		t.Fatalf("positions %v", pos)
	}
	all.Close()
	if _, err := all.Poll(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Poll after Close: %v", err)
	}
}

func TestIsRetryable(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{ErrClosed, false},
		{context.Canceled, false},
		{context.DeadlineExceeded, false},
		{fmt.Errorf("x: %w", ErrConnectionLost), true},
		{ErrRequestTimeout, true},
		{fromWire(heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "")), true},
		{fromWire(&heraldpb.Error{Code: heraldpb.ErrorCode_NOT_LEADER}), true}, // flag omitted, code retriable
		{fromWire(heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "")), false},
	}
	for _, tc := range cases {
		if got := IsRetryable(tc.err); got != tc.want {
			t.Errorf("IsRetryable(%v) = %v", tc.err, got)
		}
	}
}

func TestDialFailures(t *testing.T) {
	b := newBroker(t)
	ctx := testCtx(t)
	// The first address refuses; the second works.
	dead := newBroker(t)
	deadAddr := dead.Addr()
	dead.Close()
	c, err := Dial(ctx, deadAddr+","+b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := Dial(ctx, deadAddr); !errors.Is(err, ErrNoBrokers) {
		t.Fatalf("dial dead: %v", err)
	}
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetHello() != nil {
			return fakebroker.Action{Error: heraldpb.NewError(heraldpb.ErrorCode_UNSUPPORTED_VERSION, "v9 only")}
		}
		return fakebroker.Action{}
	})
	if _, err := Dial(ctx, b.Addr()); !IsCode(err, heraldpb.ErrorCode_UNSUPPORTED_VERSION) {
		t.Fatalf("dial with bad version: %v", err)
	}
}

// A transaction's commit batch goes past a connection's produce gate: a
// partition may hold it, written, until the producer's commit before it
// arrives, and held at the gate's last slot it kept that one out (both
// waited for the partition to give up on it, 10 s). Other produces still
// wait for the gate.
func TestCommitBatchSkipsTheGate(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	c := dial(t, b)
	p := c.NewProducer()
	cn, err := c.leaderConn(testCtx(t), "t", 0)
	if err != nil {
		t.Fatal(err)
	}
	cn.gate.mu.Lock()
	cn.gate.until = time.Now().Add(time.Hour) // as after a THROTTLED with a long retry-after
	cn.gate.mu.Unlock()
	part := uint32(0)
	key := batchKey{topic: "t", partition: 0}
	plain := make(chan error, 1)
	go func() {
		_, _, err := p.produceOnce(&heraldpb.ProduceRequest{Topic: "t", Partition: &part, Acks: heraldpb.Acks_ACKS_ALL}, key, func() {})
		plain <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		cn.gate.mu.Lock()
		waiting := cn.gate.changed != nil
		cn.gate.mu.Unlock()
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the plain produce never waited at the gate")
		}
		time.Sleep(time.Millisecond)
	}
	commit := make(chan error, 1)
	go func() {
		_, sent, err := p.produceOnce(&heraldpb.ProduceRequest{Topic: "t", Partition: &part, Acks: heraldpb.Acks_ACKS_ALL,
			TxnBatch: true, TransactionalId: "x", ProducerId: 1, CommitTxn: true}, key, func() {})
		if !sent {
			err = fmt.Errorf("not sent: %v", err)
		}
		commit <- err
	}()
	select {
	case err := <-commit:
		var he *Error
		if err != nil && !errors.As(err, &he) {
			t.Fatalf("the commit batch: %v", err) // (the broker's refusal is an answer)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the commit batch waited at the closed gate")
	}
	_ = p.Close(testCtx(t))
	if err := <-plain; !errors.Is(err, ErrClosed) {
		t.Fatalf("the plain produce: %v, want ErrClosed (held at the gate until the producer closed)", err)
	}
}
