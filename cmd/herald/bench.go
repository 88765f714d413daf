package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

func init() { register("bench", cliRunner(benchCmd)) }

// benchHeader is the prefix of every bench record value: the send time in
// Unix nanoseconds (the intended send time under --rate, so latency
// includes queueing) and the producer's sequence number.
const benchHeader = 16

// A bench producer allocates record values and messages benchChunk at a
// time, fewer for large records (about benchChunkBytes of values).
const (
	benchChunk      = 64
	benchChunkBytes = 64 << 10
)

type benchConfig struct {
	cf             *cliFlags
	producers      int
	consumers      int
	size           int
	acks           heraldpb.Acks
	batchBytes     int
	bufferBytes    int64
	linger         time.Duration
	inFlight       int
	rate           float64
	duration       time.Duration
	count          int64
	topic          string
	partitions     int
	replication    int
	reportInterval time.Duration
	drainTimeout   time.Duration
	json           bool
}

// benchCmd runs "herald bench": producers and consumers against one topic,
// reporting throughput and produce-to-consume latency.
func benchCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("bench", io.err)
	bc := benchConfig{cf: cf}
	fs.IntVar(&bc.producers, "producers", 1, "producers, each with its own connection")
	fs.IntVar(&bc.consumers, "consumers", 1, "consumers, each with its own connection, sharing the partitions (0 = produce only)")
	fs.IntVar(&bc.size, "size", 1024, "record value size in bytes (at least 16)")
	acks := fs.String("acks", "all", "acknowledgement: none, leader or all")
	fs.IntVar(&bc.batchBytes, "batch-bytes", client.DefaultBatchBytes, "producer batch size in bytes")
	fs.Int64Var(&bc.bufferBytes, "buffer-bytes", client.DefaultBufferBytes, "producer buffer; without --rate, latency includes the time records wait in it")
	fs.DurationVar(&bc.linger, "linger", client.DefaultLinger, "producer linger")
	fs.IntVar(&bc.inFlight, "in-flight", 4, "batches each producer keeps in flight per partition (records carry no key)")
	fs.Float64Var(&bc.rate, "rate", 0, "aggregate produce rate in records/s, open loop (0 = as fast as possible)")
	fs.DurationVar(&bc.duration, "duration", 10*time.Second, "how long to produce (ignored with --count)")
	fs.Int64Var(&bc.count, "count", 0, "produce this many records in total instead of running for --duration")
	fs.StringVar(&bc.topic, "topic", "herald-bench", "topic (created if missing)")
	fs.IntVar(&bc.partitions, "partitions", 4, "partitions when the topic is created")
	fs.IntVar(&bc.replication, "replication", 0, "replication factor when the topic is created (0 = broker default)")
	fs.DurationVar(&bc.reportInterval, "report-interval", time.Second, "progress line interval (0 = none)")
	fs.DurationVar(&bc.drainTimeout, "drain-timeout", 10*time.Second, "how long consumers may lag behind once producing stops")
	fs.BoolVar(&bc.json, "json", false, "print the final summary as JSON on stdout (progress goes to stderr)")
	if err := parseCLIFlags(fs, args, nil); err != nil {
		return err
	}
	switch {
	case bc.producers < 1:
		return usagef("--producers must be at least 1")
	case bc.consumers < 0:
		return usagef("--consumers must not be negative")
	case bc.size < benchHeader:
		return usagef("--size must be at least %d (the timestamp and sequence header)", benchHeader)
	case bc.rate < 0, bc.count < 0, bc.duration <= 0 && bc.count == 0:
		return usagef("--rate and --count must not be negative, and --duration must be positive without --count")
	case bc.partitions < 1:
		return usagef("--partitions must be at least 1")
	case bc.topic == "":
		return usagef("--topic must not be empty")
	}
	var err error
	if bc.acks, err = parseCLIAcks(*acks); err != nil {
		return err
	}
	progress := io.out
	if bc.json {
		progress = io.err
	}
	sum, err := runBench(ctx, &bc, progress)
	if err != nil {
		return cliOneLine(err)
	}
	if bc.json {
		enc := json.NewEncoder(io.out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(sum); err != nil {
			return err
		}
	} else {
		sum.print(io.out)
	}
	if sum.ProduceErrors > 0 {
		return fmt.Errorf("%d records failed to produce, first: %s", sum.ProduceErrors, sum.FirstError)
	}
	return nil
}

// benchSummary is the final report (--json prints it as is).
type benchSummary struct {
	Topic            string  `json:"topic"`
	Partitions       int     `json:"partitions"`
	Producers        int     `json:"producers"`
	Consumers        int     `json:"consumers"`
	Size             int     `json:"size_bytes"`
	Acks             string  `json:"acks"`
	Rate             float64 `json:"target_rate"`
	Seconds          float64 `json:"produce_seconds"`
	Produced         int64   `json:"produced"`
	ProduceErrors    int64   `json:"produce_errors"`
	FirstError       string  `json:"first_error,omitempty"`
	ProducedPerSec   float64 `json:"produced_msgs_per_sec"`
	ProducedMBPerSec float64 `json:"produced_mb_per_sec"`
	Consumed         int64   `json:"consumed"`
	ConsumedPerSec   float64 `json:"consumed_msgs_per_sec"`
	ConsumedMBPerSec float64 `json:"consumed_mb_per_sec"`
	LatencyP50Ms     float64 `json:"latency_p50_ms"`
	LatencyP99Ms     float64 `json:"latency_p99_ms"`
	LatencyP999Ms    float64 `json:"latency_p999_ms"`
	LatencyMaxMs     float64 `json:"latency_max_ms"`
}

func (s *benchSummary) print(w io.Writer) {
	fmt.Fprintf(w, "topic %s: %d partitions, %d producers, %d consumers, %d-byte records, acks %s\n",
		s.Topic, s.Partitions, s.Producers, s.Consumers, s.Size, s.Acks)
	fmt.Fprintf(w, "produced %d records in %.2fs: %.0f msg/s, %.2f MB/s (%d errors)\n",
		s.Produced, s.Seconds, s.ProducedPerSec, s.ProducedMBPerSec, s.ProduceErrors)
	fmt.Fprintf(w, "consumed %d records: %.0f msg/s, %.2f MB/s\n", s.Consumed, s.ConsumedPerSec, s.ConsumedMBPerSec)
	if s.Consumed == 0 {
		fmt.Fprintln(w, "latency produce-to-consume: none measured (nothing consumed)")
		return
	}
	fmt.Fprintf(w, "latency produce-to-consume: p50 %.3fms p99 %.3fms p99.9 %.3fms max %.3fms\n",
		s.LatencyP50Ms, s.LatencyP99Ms, s.LatencyP999Ms, s.LatencyMaxMs)
}

// benchStats is shared by the producer and consumer goroutines.
type benchStats struct {
	produced, producedBytes atomic.Int64
	consumed, consumedBytes atomic.Int64
	errors                  atomic.Int64
	errOnce                 sync.Once
	firstErr                atomic.Value // string

	mu       sync.Mutex
	total    *hdrhistogram.Histogram // microseconds, whole run
	interval *hdrhistogram.Histogram // microseconds, since the last report
}

func newBenchStats() *benchStats {
	return &benchStats{
		total:    hdrhistogram.New(1, int64(5*time.Minute/time.Microsecond), 3),
		interval: hdrhistogram.New(1, int64(5*time.Minute/time.Microsecond), 3),
	}
}

func (s *benchStats) fail(err error) {
	s.errors.Add(1)
	s.errOnce.Do(func() { s.firstErr.Store(err.Error()) })
}

// benchClock reads Unix nanoseconds as the run's start time plus the
// monotonic time since: one monotonic clock read (time.Since) per call
// instead of time.Now's wall and monotonic reads, and immune to wall clock
// steps during the run. Producers stamp records and consumers measure with
// the same clock.
type benchClock struct {
	base   time.Time
	baseNs int64
}

func newBenchClock() benchClock {
	t := time.Now()
	return benchClock{base: t, baseNs: t.UnixNano()}
}

func (c benchClock) now() int64 { return c.baseNs + int64(time.Since(c.base)) }

// record notes the latency of consumed messages, all received at nowNs
// (Unix nanoseconds). The send time is read from the value in place.
func (s *benchStats) record(nowNs int64, ms []*client.Message) {
	var n, bytes int64
	maxUs := s.total.HighestTrackableValue()
	s.mu.Lock()
	for _, m := range ms {
		if len(m.Value) < benchHeader {
			continue
		}
		sent := int64(binary.BigEndian.Uint64(m.Value))
		us := max(nowNs-sent, 0) / int64(time.Microsecond)
		us = min(max(us, 1), maxUs)
		_ = s.total.RecordValue(us)
		_ = s.interval.RecordValue(us)
		n++
		bytes += int64(len(m.Value))
	}
	s.mu.Unlock()
	s.consumed.Add(n)
	s.consumedBytes.Add(bytes)
}

func usToMs(v int64) float64 { return float64(v) / 1000 }

func runBench(ctx context.Context, bc *benchConfig, progress io.Writer) (*benchSummary, error) {
	admin, err := bc.cf.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	ok, err := topicExists(ctx, admin, bc.topic)
	if err != nil {
		return nil, err
	}
	if !ok {
		_, err := admin.CreateTopic(ctx, bc.topic, &heraldpb.TopicConfig{Partitions: uint32(bc.partitions), ReplicationFactor: uint32(bc.replication)})
		if err != nil && !client.IsCode(err, heraldpb.ErrorCode_TOPIC_ALREADY_EXISTS) {
			return nil, err
		}
	}
	nparts, err := admin.Partitions(ctx, bc.topic)
	if err != nil {
		return nil, err
	}
	if nparts == 0 {
		return nil, fmt.Errorf("topic %s has no partitions", bc.topic)
	}
	bc.partitions = nparts
	stats := newBenchStats()
	clock := newBenchClock()

	// Consumers: consumer j reads partitions j, j+C, j+2C, ...; each
	// partition starts at its high watermark, resolved before producing.
	consCtx, stopConsumers := context.WithCancel(ctx)
	defer stopConsumers()
	var consWG sync.WaitGroup
	var clients []*client.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for j := 0; j < bc.consumers && j < nparts; j++ {
		c, err := bc.cf.dial(ctx)
		if err != nil {
			return nil, err
		}
		clients = append(clients, c)
		for p := j; p < nparts; p += bc.consumers {
			pc := c.NewPartitionConsumer(bc.topic, int32(p), client.Latest(), client.WithFetchMaxWait(100*time.Millisecond))
			if err := pc.Resolve(ctx); err != nil {
				return nil, err
			}
			consWG.Add(1)
			go func() {
				defer consWG.Done()
				for consCtx.Err() == nil {
					ms, err := pc.Poll(consCtx)
					if err != nil {
						if consCtx.Err() == nil && !client.IsRetryable(err) {
							stats.fail(fmt.Errorf("consume partition %d: %w", pc.Partition(), err))
							return
						}
						continue
					}
					stats.record(clock.now(), ms)
				}
			}()
		}
	}

	// Producers.
	prodCtx, stopProducers := context.WithCancel(ctx)
	defer stopProducers()
	if bc.count == 0 {
		var cancel context.CancelFunc
		prodCtx, cancel = context.WithTimeout(prodCtx, bc.duration)
		defer cancel()
	}
	var prodWG sync.WaitGroup
	start := time.Now()
	var errs = make(chan error, bc.producers)
	for i := 0; i < bc.producers; i++ {
		c, err := bc.cf.dial(ctx)
		if err != nil {
			return nil, err
		}
		clients = append(clients, c)
		n := int64(-1)
		if bc.count > 0 {
			n = bc.count / int64(bc.producers)
			if int64(i) < bc.count%int64(bc.producers) {
				n++
			}
		}
		prodWG.Add(1)
		go func() {
			defer prodWG.Done()
			errs <- benchProduce(prodCtx, ctx, c, bc, i, n, start, clock, stats)
		}()
	}

	// Progress.
	doneProducing := make(chan struct{})
	go func() { prodWG.Wait(); close(doneProducing) }()
	var tick <-chan time.Time
	if bc.reportInterval > 0 {
		t := time.NewTicker(bc.reportInterval)
		defer t.Stop()
		tick = t.C
	}
	last := time.Now()
	var lastP, lastPB, lastC, lastCB int64
	report := func() {
		now := time.Now()
		el := now.Sub(last).Seconds()
		p, pb, c, cb := stats.produced.Load(), stats.producedBytes.Load(), stats.consumed.Load(), stats.consumedBytes.Load()
		stats.mu.Lock()
		h := stats.interval
		line := fmt.Sprintf("%6.1fs  produced %8.0f msg/s %8.2f MB/s  consumed %8.0f msg/s %8.2f MB/s  latency p50 %.2fms p99 %.2fms p99.9 %.2fms max %.2fms  errors %d",
			now.Sub(start).Seconds(), float64(p-lastP)/el, float64(pb-lastPB)/el/1e6, float64(c-lastC)/el, float64(cb-lastCB)/el/1e6,
			usToMs(h.ValueAtQuantile(50)), usToMs(h.ValueAtQuantile(99)), usToMs(h.ValueAtQuantile(99.9)), usToMs(h.Max()), stats.errors.Load())
		h.Reset()
		stats.mu.Unlock()
		fmt.Fprintln(progress, line)
		last, lastP, lastPB, lastC, lastCB = now, p, pb, c, cb
	}
wait:
	for {
		select {
		case <-tick:
			report()
		case <-doneProducing:
			break wait
		}
	}
	produceTime := time.Since(start)
	close(errs)
	for err := range errs {
		if err != nil {
			return nil, err
		}
	}
	// Let consumers catch up with what was acknowledged.
	if bc.consumers > 0 {
		deadline := time.Now().Add(bc.drainTimeout)
		for stats.consumed.Load() < stats.produced.Load() && time.Now().Before(deadline) && ctx.Err() == nil {
			select {
			case <-tick:
				report()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	consumeTime := time.Since(start)
	stopConsumers()
	consWG.Wait()

	sec := produceTime.Seconds()
	sum := &benchSummary{
		Topic: bc.topic, Partitions: nparts, Producers: bc.producers, Consumers: min(bc.consumers, nparts),
		Size: bc.size, Acks: map[heraldpb.Acks]string{cliAcksAll: "all", cliAcksLeader: "leader", cliAcksNone: "none"}[bc.acks],
		Rate: bc.rate, Seconds: sec,
		Produced: stats.produced.Load(), ProduceErrors: stats.errors.Load(),
		Consumed: stats.consumed.Load(),
	}
	if s, ok := stats.firstErr.Load().(string); ok {
		sum.FirstError = s
	}
	sum.ProducedPerSec = float64(sum.Produced) / sec
	sum.ProducedMBPerSec = float64(stats.producedBytes.Load()) / sec / 1e6
	sum.ConsumedPerSec = float64(sum.Consumed) / consumeTime.Seconds()
	sum.ConsumedMBPerSec = float64(stats.consumedBytes.Load()) / consumeTime.Seconds() / 1e6
	stats.mu.Lock()
	sum.LatencyP50Ms = usToMs(stats.total.ValueAtQuantile(50))
	sum.LatencyP99Ms = usToMs(stats.total.ValueAtQuantile(99))
	sum.LatencyP999Ms = usToMs(stats.total.ValueAtQuantile(99.9))
	sum.LatencyMaxMs = usToMs(stats.total.Max())
	stats.mu.Unlock()
	return sum, nil
}

// benchProduce runs one producer until prodCtx ends or n records (n >= 0)
// were sent, then flushes within ctx. Under --rate it paces to its share of
// the rate, open loop: each record is stamped with its intended send time.
func benchProduce(prodCtx, ctx context.Context, c *client.Client, bc *benchConfig, id int, n int64, start time.Time, clock benchClock, stats *benchStats) error {
	p := c.NewProducer(client.WithAcks(bc.acks), client.WithLinger(bc.linger), client.WithBatchBytes(bc.batchBytes), client.WithBufferBytes(bc.bufferBytes),
		client.WithUnpartitionedInFlight(bc.inFlight*max(bc.partitions, 1)), client.WithPartitionInFlight(bc.inFlight))
	var interval time.Duration
	if bc.rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(bc.producers) / bc.rate)
	}
	filler := make([]byte, bc.size-benchHeader)
	for i := range filler {
		filler[i] = byte('a' + i%26)
	}
	cb := func(_ client.Result, err error) {
		if err != nil {
			if prodCtx.Err() == nil || !(err == context.Canceled || err == context.DeadlineExceeded) {
				stats.fail(err)
			}
			return
		}
		stats.produced.Add(1)
		stats.producedBytes.Add(int64(bc.size))
	}
	// Values and messages are allocated benchChunk at a time; each record
	// gets its own (capacity-capped) value and message, never modified
	// after SendAsync.
	chunk := max(1, min(benchChunk, benchChunkBytes/bc.size))
	var values []byte
	var msgs []client.Message
	startNs := start.UnixNano()
	for seq := int64(0); n < 0 || seq < n; seq++ {
		if prodCtx.Err() != nil {
			break
		}
		var stamp int64
		if interval > 0 {
			due := time.Duration(seq) * interval
			stamp = startNs + int64(due)
			if d := due - time.Since(start); d > time.Millisecond {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-prodCtx.Done():
					t.Stop()
				}
				if prodCtx.Err() != nil {
					break
				}
			}
		} else {
			stamp = clock.now()
		}
		if len(msgs) == 0 {
			values = make([]byte, chunk*bc.size)
			msgs = make([]client.Message, chunk)
		}
		v := values[:bc.size:bc.size]
		values = values[bc.size:]
		m := &msgs[0]
		msgs = msgs[1:]
		binary.BigEndian.PutUint64(v, uint64(stamp))
		binary.BigEndian.PutUint64(v[8:], uint64(id)<<40|uint64(seq))
		copy(v[benchHeader:], filler)
		*m = client.Message{Topic: bc.topic, Partition: int32((int(seq) + id) % bc.partitions), Value: v}
		p.SendAsync(prodCtx, m, cb)
	}
	// Flush what was accepted even after SIGINT, but not forever.
	closeCtx, cancel := context.WithTimeout(context.Background(), bc.drainTimeout)
	defer cancel()
	err := p.Close(closeCtx)
	if ctx.Err() != nil {
		return nil // interrupted: report what was done
	}
	return err
}
