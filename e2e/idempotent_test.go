package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// loseProxy forwards client connections to a broker (dialled anew for each
// connection, so it follows a broker restarted on its address) and loses
// produce responses after the broker wrote the batches:
//   - every every-th produce request (every > 0): it passes the request on,
//     waits until the broker has answered it, and then cuts the client's
//     connection instead of forwarding the answer (requests pipelined on
//     that connection lose their answers too);
//   - while hold is set: it forwards no produce response, and counts the
//     successful ones it swallowed in held.
type loseProxy struct {
	t      testing.TB
	ln     net.Listener
	broker string
	every  int64
	n      atomic.Int64 // produce requests seen
	lost   atomic.Int64 // responses lost by cutting the connection
	hold   atomic.Bool
	held   atomic.Int64
	wg     sync.WaitGroup
}

func startLoseProxy(t testing.TB, broker string, every int64) *loseProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &loseProxy{t: t, ln: ln, broker: broker, every: every}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *loseProxy) Addr() string { return p.ln.Addr().String() }

func (p *loseProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.broker)
		if err != nil {
			c.Close()
			continue
		}
		p.wg.Add(1)
		go p.pipe(c, b)
	}
}

// readFrame reads one length-prefixed frame: the raw bytes and its decoded
// id and body.
func readFrame(r *bufio.Reader) ([]byte, *heraldpb.Frame, error) {
	var hdr [heraldpb.HeaderLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, nil, err
	}
	raw := make([]byte, heraldpb.HeaderLen+int(binary.BigEndian.Uint32(hdr[:])))
	copy(raw, hdr[:])
	if _, err := io.ReadFull(r, raw[heraldpb.HeaderLen:]); err != nil {
		return nil, nil, err
	}
	f, err := heraldpb.DecodeFrame(raw[heraldpb.HeaderLen:])
	return raw, f, err
}

func (p *loseProxy) pipe(c, b net.Conn) {
	defer p.wg.Done()
	var victims sync.Map // frame ids whose answers are lost
	done := make(chan struct{})
	go func() { // client -> broker
		defer close(done)
		r := bufio.NewReader(c)
		for {
			raw, f, err := readFrame(r)
			if err != nil {
				b.Close()
				return
			}
			if f.GetProduce() != nil && p.every > 0 && p.n.Add(1)%p.every == 0 {
				victims.Store(f.GetId(), true)
			}
			if _, err := b.Write(raw); err != nil {
				c.Close()
				return
			}
		}
	}()
	r := bufio.NewReader(b)
	for { // broker -> client
		raw, f, err := readFrame(r)
		if err != nil {
			c.Close()
			break
		}
		if _, lose := victims.Load(f.GetId()); lose && f.GetProduceResponse() != nil {
			p.lost.Add(1)
			c.Close()
			b.Close()
			break
		}
		if p.hold.Load() && (f.GetProduceResponse() != nil || f.GetError() != nil) {
			if f.GetProduceResponse() != nil {
				p.held.Add(1)
			}
			continue
		}
		if _, err := c.Write(raw); err != nil {
			b.Close()
			break
		}
	}
	<-done
}

// produceThrough sends total records ("<tag>-<i>") through addr with the
// producer options given, half keyed and half without key or partition, and
// returns where each was acknowledged; every send must succeed.
func produceThrough(t *testing.T, addr, topic, tag string, total int, opts ...client.ProducerOpt) map[string]ackedRecord {
	t.Helper()
	ctx := ctxT(t, 60*time.Second)
	c, err := client.Dial(ctx, addr, client.WithRequestTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := c.NewProducer(append([]client.ProducerOpt{client.WithLinger(time.Millisecond), client.WithBatchBytes(512),
		client.WithMaxRetries(100), client.WithRetryBackoff(time.Millisecond, 20*time.Millisecond)}, opts...)...)
	var mu sync.Mutex
	acked := map[string]ackedRecord{}
	var failed []error
	for i := 0; i < total; i++ {
		v := fmt.Sprintf("%s-%06d", tag, i)
		m := &client.Message{Topic: topic, Value: []byte(v)}
		if i%2 == 0 {
			m.Key = []byte(fmt.Sprintf("k%d", i%10))
		}
		p.SendAsync(ctx, m, func(r client.Result, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, err)
				return
			}
			acked[v] = ackedRecord{r.Partition, r.Offset}
		})
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if len(failed) > 0 {
		t.Fatalf("%d sends failed, first: %v", len(failed), failed[0])
	}
	return acked
}

// countStored reads every partition and counts the copies of each value.
func countStored(t *testing.T, c *client.Client, topic string, parts int32) map[string]int {
	t.Helper()
	copies := map[string]int{}
	for part := int32(0); part < parts; part++ {
		for _, m := range readPartition(t, c, topic, part) {
			copies[string(m.Value)]++
		}
	}
	return copies
}

// TestIdempotentLostResponses produces through a proxy that loses the
// response to every 5th produce request after the broker wrote the batch.
// The idempotent producer (the SDK's default) retries each and every record
// is stored once, at the offset acknowledged; the broker counted the
// retries it answered as duplicates. The same load with idempotence off
// stores some records twice, which shows the responses were really lost
// after the writes.
func TestIdempotentLostResponses(t *testing.T) {
	forEachMode(t, nil, func(t *testing.T, n node) {
		c := dial(t, n)
		ctx := ctxT(t, 60*time.Second)
		for _, topic := range []string{"idem", "plain"} {
			if _, err := c.CreateTopic(ctx, topic, &heraldpb.TopicConfig{Partitions: 3}); err != nil {
				t.Fatal(err)
			}
		}
		px := startLoseProxy(t, n.Addr(), 5)
		const total = 3000
		acked := produceThrough(t, px.Addr(), "idem", "i", total)
		if px.lost.Load() == 0 {
			t.Fatal("the proxy lost no response")
		}
		verifyAcked(t, c, "idem", 3, acked) // every acked record at its offset, none stored twice
		if len(acked) != total {
			t.Fatalf("%d records acknowledged, want %d", len(acked), total)
		}
		if d := metricSum(t, n, "herald_produce_duplicates_total"); d == 0 {
			t.Fatal("the broker answered no retry as a duplicate")
		}
		t.Logf("idempotent: %d responses lost, every record stored once", px.lost.Load())

		lost := px.lost.Load()
		produceThrough(t, px.Addr(), "plain", "p", total, client.WithIdempotence(false))
		twice := 0
		for _, k := range countStored(t, c, "plain", 3) {
			if k > 1 {
				twice++
			}
		}
		if twice == 0 {
			t.Fatalf("idempotence off: %d responses lost and no record stored twice; the proxy did not lose responses after writes", px.lost.Load()-lost)
		}
		t.Logf("idempotence off: %d responses lost, %d records stored twice", px.lost.Load()-lost, twice)
	})
}

// TestIdempotentKillMidLoad runs idempotent producers (acks=all, with
// retries) through a proxy against a broker process, and SIGKILLs the
// broker at a moment when it has written batches whose answers the proxy
// held back; it restarts the broker on the same address and lets the
// producers go on. Those batches are retried against the restarted broker,
// which rebuilds its producer table from the log (its saved table is up to
// 10 s old, or absent) and answers them as duplicates. Every record is
// acknowledged and stored exactly once, in each writer's order.
func TestIdempotentKillMidLoad(t *testing.T) {
	n := startProc(t, t.TempDir()) // restarts listen on the same address
	c := dial(t, n)
	if _, err := c.CreateTopic(ctxT(t, 10*time.Second), "crash", &heraldpb.TopicConfig{Partitions: 3}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	px := startLoseProxy(t, n.Addr(), 0)

	const writers = 4
	var mu sync.Mutex
	acked := map[string]ackedRecord{}
	var failed []error
	sent := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			ctx := context.Background()
			wc, err := client.Dial(ctx, px.Addr(), client.WithRequestTimeout(2*time.Second))
			if err != nil {
				t.Error(err)
				return
			}
			defer wc.Close()
			// Retries outlast a restart: up to 1000, 50 ms apart at most.
			p := wc.NewProducer(client.WithLinger(time.Millisecond), client.WithMaxRetries(1000),
				client.WithRetryBackoff(5*time.Millisecond, 50*time.Millisecond), client.WithBufferBytes(1<<20))
			for i := 0; ; i++ {
				select {
				case <-stop:
					closeCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
					if err := p.Close(closeCtx); err != nil {
						t.Error(err)
					}
					cancel()
					return
				default:
				}
				v := fmt.Sprintf("w%d-%08d", w, i)
				mu.Lock()
				sent++
				mu.Unlock()
				p.SendAsync(ctx, &client.Message{Topic: "crash", Key: []byte(fmt.Sprintf("w%d", w)), Value: []byte(v)},
					func(r client.Result, err error) {
						mu.Lock()
						defer mu.Unlock()
						if err != nil {
							failed = append(failed, err)
							return
						}
						acked[v] = ackedRecord{r.Partition, r.Offset}
					})
			}
		}(w)
	}
	ackedAtLeast := func(k int) func() error {
		return func() error {
			mu.Lock()
			defer mu.Unlock()
			if len(acked) < k {
				return fmt.Errorf("%d acknowledged", len(acked))
			}
			return nil
		}
	}
	checkFor(t, 60*time.Second, "3000 acknowledged records", ackedAtLeast(3000))
	// Each writer has one batch in flight: hold back the answers until
	// every writer's batch is written and unanswered, then kill.
	px.hold.Store(true)
	checkFor(t, 30*time.Second, "a written batch of each writer held back", func() error {
		if h := px.held.Load(); h < writers {
			return fmt.Errorf("%d held", h)
		}
		return nil
	})
	n.Kill(t)
	held := px.held.Load()
	px.hold.Store(false)
	mu.Lock()
	before := len(acked)
	mu.Unlock()
	n.Start(t)
	checkFor(t, 60*time.Second, "more records acknowledged after the restart", ackedAtLeast(before+3000))
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(failed) > 0 {
		t.Fatalf("%d sends failed, first: %v", len(failed), failed[0])
	}
	if len(acked) != sent {
		t.Fatalf("%d of %d records acknowledged", len(acked), sent)
	}
	c = dial(t, n)
	verifyAcked(t, c, "crash", 3, acked)
	stored := 0
	for _, k := range countStored(t, c, "crash", 3) {
		stored += k
	}
	if stored != sent {
		t.Fatalf("%d records stored, %d sent", stored, sent)
	}
	if d := metricSum(t, n, "herald_produce_duplicates_total"); d < float64(held) {
		t.Fatalf("the restarted broker answered %v retries as duplicates; %d written batches had their answers held back", d, held)
	}
	t.Logf("%d records sent and stored once across a SIGKILL (%d acknowledged before it, %d written batches unanswered at the kill)", sent, before, held)
}

// Each batch of a partition is sent by a goroutine of its own; with
// several in flight they must still reach the broker in sequence order,
// or the partition refuses the early ones as out of order and the
// producer crawls through retries (the bench ran 13x slower when they
// raced). Nothing fails here, so the broker must see no out-of-order
// sequence at all.
func TestIdempotentPipelinedBatchesArriveInOrder(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "pipelined", 2)
	p := c.NewProducer(client.WithPartitionInFlight(5), client.WithBatchBytes(1000), client.WithLinger(0), client.WithManualPartitions())
	for i := 0; i < 20000; i++ {
		p.SendAsync(ctxT(t, 30*time.Second), &client.Message{Topic: "pipelined", Partition: int32(i % 2), Value: []byte(fmt.Sprintf("%06d", i))}, func(_ client.Result, err error) {
			if err != nil {
				t.Error(err)
			}
		})
	}
	if err := p.Close(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if ooo := metricSum(t, n, "herald_produce_out_of_order_total"); ooo != 0 {
		t.Fatalf("the broker refused %v batches as out of order", ooo)
	}
	if d := metricSum(t, n, "herald_produce_duplicates_total"); d != 0 {
		t.Fatalf("%v duplicates without a single retry", d)
	}
}

// TestIdempotentDelayedLostResponses is TestIdempotentLostResponses for
// delayed messages: the proxy loses the answer to every 3rd delayed
// produce after the scheduler stored the batch, and the idempotent
// producer retries it with the same producer id and sequence. The
// scheduler answers the retry with the first attempt's schedule id, so
// every message fires once. With idempotence off the same load fires some
// twice (each attempt its own batch, on the partition the round robin
// gave it), which shows the answers were lost after the writes.
func TestIdempotentDelayedLostResponses(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	ctx := ctxT(t, 90*time.Second)
	for _, topic := range []string{"idem", "plain"} {
		if _, err := c.CreateTopic(ctx, topic, &heraldpb.TopicConfig{Partitions: 3}); err != nil {
			t.Fatal(err)
		}
	}
	px := startLoseProxy(t, n.Addr(), 3)
	const total = 60
	send := func(topic string, opts ...client.ProducerOpt) {
		t.Helper()
		pc, err := client.Dial(ctx, px.Addr(), client.WithRequestTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		p := pc.NewProducer(append([]client.ProducerOpt{client.WithLinger(time.Millisecond), client.WithMaxRetries(100),
			client.WithRetryBackoff(time.Millisecond, 20*time.Millisecond)}, opts...)...)
		for i := range total {
			if _, err := p.Send(ctx, &client.Message{Topic: topic, Value: []byte(fmt.Sprintf("%s-%03d", topic, i)), Delay: 500 * time.Millisecond}); err != nil {
				t.Fatalf("delayed send %d to %s: %v", i, topic, err)
			}
		}
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// fired waits until every message of topic has fired, and a sentinel
	// sent after them too (due after all of them, it is appended after
	// them on its partition), then counts the copies.
	fired := func(topic string) map[string]int {
		t.Helper()
		if _, err := c.NewProducer().Send(ctx, &client.Message{Topic: topic, Value: []byte("sentinel"), Delay: time.Second}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			copies := countStored(t, c, topic, 3)
			all := copies["sentinel"] > 0
			for i := range total {
				all = all && copies[fmt.Sprintf("%s-%03d", topic, i)] > 0
			}
			if all {
				return copies
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the sentinel did not fire; stored %v", topic, copies)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	send("idem")
	lost := px.lost.Load()
	if lost == 0 {
		t.Fatal("the proxy lost no answer")
	}
	copies := fired("idem")
	for i := range total {
		if v := fmt.Sprintf("idem-%03d", i); copies[v] != 1 {
			t.Errorf("%s fired %d times, want once", v, copies[v])
		}
	}
	if d := metricSum(t, n, `herald_scheduler_duplicates_total{outcome="stored"}`); d == 0 {
		t.Fatal("the scheduler answered no retry as a duplicate")
	}
	t.Logf("idempotent: %d answers lost, every delayed message fired once", lost)

	send("plain", client.WithIdempotence(false))
	twice := 0
	for v, k := range fired("plain") {
		if k > 1 && v != "sentinel" {
			twice++
		}
	}
	if twice == 0 {
		t.Fatalf("idempotence off: %d answers lost and no message fired twice; the proxy did not lose answers after the writes", px.lost.Load()-lost)
	}
	t.Logf("idempotence off: %d answers lost, %d messages fired twice", px.lost.Load()-lost, twice)
}
