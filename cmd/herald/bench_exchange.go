package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/exchange"
	heraldpb "github.com/heraldmq/herald/proto"
)

// benchExchangeConfig is the configuration of "herald bench exchange".
type benchExchangeConfig struct {
	cf         *cliFlags
	mode       string // direct, topic, fanout
	producers  int
	batch      int
	size       int
	duration   time.Duration
	rounds     int
	bindings   int // topic mode
	topics     int // topic mode: destination topics; fanout: the fanout
	partitions int
	prefix     string
	json       bool
}

// benchExchangeCmd runs "herald bench exchange": in each round, the
// producers (closed loops, each on its own connection) produce --batch
// records at a time straight to the destination topics (the baseline)
// and publish --batch records at a time through the exchange, --duration
// each, in turn (odd rounds publish first). It reports records stored per second of
// both (a publish reaching 3 topics stores 3 copies), their ratio per
// round and the median, and, for a topic exchange, the time one routing
// decision takes on the same index in this process.
func benchExchangeCmd(ctx context.Context, args []string, cio cliIO) error {
	fs, cf := newCLIFlagSet("bench exchange", cio.err)
	benchUsage(fs, "herald bench exchange [flags]\n  publish through an exchange against plain produce to the same topics, alternating, --rounds times")
	bc := benchExchangeConfig{cf: cf}
	fs.StringVar(&bc.mode, "mode", "direct", "direct (1 binding), topic (--bindings patterns, keys matching 3 each) or fanout (to --topics topics)")
	fs.IntVar(&bc.producers, "producers", 4, "producers, each with its own connection, one call in flight")
	fs.IntVar(&bc.batch, "batch", 100, "records per publish and per produce")
	fs.IntVar(&bc.size, "size", 1024, "record value size in bytes")
	fs.DurationVar(&bc.duration, "duration", 5*time.Second, "how long each phase runs")
	fs.IntVar(&bc.rounds, "rounds", 3, "rounds of baseline then exchange")
	fs.IntVar(&bc.bindings, "bindings", 10_000, "topic mode: the exchange's bindings")
	fs.IntVar(&bc.topics, "topics", 0, "destination topics (0: 1 for direct, 30 for topic, 10 for fanout)")
	fs.IntVar(&bc.partitions, "partitions", 1, "partitions of each destination topic when created")
	fs.StringVar(&bc.prefix, "prefix", "bx", "prefix of the exchange's and the topics' names")
	fs.BoolVar(&bc.json, "json", false, "print the final summary as JSON on stdout (progress goes to stderr)")
	if err := parseCLIFlags(fs, args); err != nil {
		return err
	}
	if bc.topics == 0 {
		bc.topics = map[string]int{"direct": 1, "topic": 30, "fanout": 10}[bc.mode]
	}
	switch {
	case bc.mode != "direct" && bc.mode != "topic" && bc.mode != "fanout":
		return usagef("--mode %q: want direct, topic or fanout", bc.mode)
	case bc.producers < 1 || bc.batch < 1 || bc.size < 1 || bc.rounds < 1 || bc.partitions < 1:
		return usagef("--producers, --batch, --size, --rounds and --partitions must be at least 1")
	case bc.duration <= 0:
		return usagef("--duration must be positive")
	case bc.mode == "topic" && (bc.bindings < 3 || bc.topics < 3):
		return usagef("topic mode needs --bindings and --topics of at least 3")
	case bc.mode == "direct" && bc.topics != 1:
		return usagef("direct mode has one binding: --topics 1")
	}
	_, err := runReported(cio, bc.json, func(progress io.Writer) (*benchExchangeSummary, error) {
		return runBenchExchange(ctx, &bc, progress)
	})
	return err
}

// benchExchangeSummary is the final report (--json prints it as is).
type benchExchangeSummary struct {
	Mode       string    `json:"mode"`
	Producers  int       `json:"producers"`
	Batch      int       `json:"batch"`
	Size       int       `json:"size_bytes"`
	Topics     int       `json:"topics"`
	Bindings   int       `json:"bindings"`
	Copies     int       `json:"copies_per_record"`
	PhaseSecs  float64   `json:"phase_seconds"`
	Baseline   []float64 `json:"baseline_stored_per_sec"`
	Exchange   []float64 `json:"exchange_stored_per_sec"`
	Ratios     []float64 `json:"ratios"`
	Median     float64   `json:"median_ratio"`
	PublishP50 float64   `json:"publish_p50_ms"`
	PublishP99 float64   `json:"publish_p99_ms"`
	ProduceP50 float64   `json:"produce_p50_ms"`
	ProduceP99 float64   `json:"produce_p99_ms"`
	MatchP50Us float64   `json:"match_p50_us"`
	MatchP99Us float64   `json:"match_p99_us"`
	Errors     int64     `json:"errors"`
	FirstError string    `json:"first_error,omitempty"`
}

func (s *benchExchangeSummary) print(w io.Writer) {
	fmt.Fprintf(w, "exchange %s: %d topics, %d bindings, %d copies per record; %d producers, %d records of %d B per call\n",
		s.Mode, s.Topics, s.Bindings, s.Copies, s.Producers, s.Batch, s.Size)
	for i := range s.Ratios {
		fmt.Fprintf(w, "round %d: produce %.0f records stored/s, publish %.0f records stored/s: %.2fx\n", i+1, s.Baseline[i], s.Exchange[i], s.Ratios[i])
	}
	fmt.Fprintf(w, "median ratio %.2fx; publish p50 %.2f ms p99 %.2f ms; produce p50 %.2f ms p99 %.2f ms\n", s.Median, s.PublishP50, s.PublishP99, s.ProduceP50, s.ProduceP99)
	if s.MatchP99Us > 0 {
		fmt.Fprintf(w, "routing one publish on the same index in this process: p50 %.2f µs p99 %.2f µs\n", s.MatchP50Us, s.MatchP99Us)
	}
	if s.Errors > 0 {
		fmt.Fprintf(w, "%d errors, first: %s\n", s.Errors, s.FirstError)
	}
}

// benchExchangeSetup declares the exchange, its topics and bindings, and
// returns the exchange's name, the routing keys to publish with, the
// topics, and the same bindings as a local table (for the match timing).
func benchExchangeSetup(ctx context.Context, c *client.Client, bc *benchExchangeConfig) (string, []string, []string, *exchange.Table, error) {
	name := bc.prefix + "-" + bc.mode
	typ, _ := exchange.ParseType(bc.mode)
	var topics []string
	for i := range bc.topics {
		t := fmt.Sprintf("%s-%s-%d", bc.prefix, bc.mode, i)
		topics = append(topics, t)
		if _, err := c.CreateTopic(ctx, t, &heraldpb.TopicConfig{Partitions: uint32(bc.partitions)}); err != nil && !client.IsCode(err, heraldpb.ErrorCode_TOPIC_ALREADY_EXISTS) {
			return "", nil, nil, nil, err
		}
	}
	if _, err := c.DeclareExchange(ctx, name, typ, ""); err != nil {
		return "", nil, nil, nil, err
	}
	md := exchange.Metadata{}
	_, _ = md.Declare(&heraldpb.ExchangeRecord{Config: &heraldpb.ExchangeConfig{Name: name, Type: typ}})
	var bindings []*heraldpb.Binding
	var keys []string
	switch bc.mode {
	case "direct":
		bindings = append(bindings, &heraldpb.Binding{Exchange: name, Topic: topics[0], Key: "k"})
		keys = []string{"k"}
	case "fanout":
		for _, t := range topics {
			bindings = append(bindings, &heraldpb.Binding{Exchange: name, Topic: t})
		}
		keys = []string{""}
	case "topic":
		// Three patterns per region: r{i}.*.created, r{i}.#, *.s{i}.*, to
		// three different topics; key r{i}.s{i}.created matches the three.
		n := bc.bindings / 3
		for i := range n {
			for j, p := range []string{"r%d.*.created", "r%d.#", "*.s%d.*"} {
				bindings = append(bindings, &heraldpb.Binding{Exchange: name, Topic: topics[(i*3+j)%len(topics)], Key: fmt.Sprintf(p, i)})
			}
			keys = append(keys, fmt.Sprintf("r%d.s%d.created", i, i))
		}
	}
	for i, b := range bindings {
		if _, err := c.Bind(ctx, b); err != nil {
			return "", nil, nil, nil, fmt.Errorf("binding %d of %d: %w", i+1, len(bindings), err)
		}
		_, _ = md.Bind(b, false)
	}
	return name, keys, topics, exchange.Build(md), nil
}

func runBenchExchange(ctx context.Context, bc *benchExchangeConfig, progress io.Writer) (*benchExchangeSummary, error) {
	c, err := bc.cf.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	fmt.Fprintf(progress, "setting up the %s exchange (%d topics)...\n", bc.mode, bc.topics)
	name, keys, topics, table, err := benchExchangeSetup(ctx, c, bc)
	if err != nil {
		return nil, err
	}
	sum := &benchExchangeSummary{Mode: bc.mode, Producers: bc.producers, Batch: bc.batch, Size: bc.size, Topics: len(topics),
		PhaseSecs: bc.duration.Seconds()}
	if rec := table.Record(name); rec != nil {
		sum.Bindings = len(rec.Bindings)
	}
	// The match timing: the broker's own code on the same index.
	match := hdrhistogram.New(1, int64(time.Second), 3)
	copies := 0
	for i := range 20_000 {
		k := keys[i%len(keys)]
		t0 := time.Now()
		r, _ := table.Route(name, k, nil, func(string) bool { return true })
		_ = match.RecordValue(max(time.Since(t0).Nanoseconds(), 1))
		copies = len(r.Topics)
	}
	sum.Copies = copies
	if bc.mode == "topic" {
		sum.MatchP50Us, sum.MatchP99Us = float64(match.ValueAtQuantile(50))/1e3, float64(match.ValueAtQuantile(99))/1e3
	}
	conns := make([]*client.Client, bc.producers)
	for i := range conns {
		if conns[i], err = bc.cf.dial(ctx); err != nil {
			return nil, err
		}
		defer conns[i].Close()
	}
	value := make([]byte, bc.size)
	var errs atomic.Int64
	var firstErr sync.Once
	fail := func(err error) {
		errs.Add(1)
		firstErr.Do(func() { sum.FirstError = err.Error() })
	}
	pubLat, prodLat := newBenchHistogram(), newBenchHistogram()
	var latMu sync.Mutex
	// phase runs the producers for --duration; call does one call and
	// returns the records it stored.
	phase := func(call func(id int, rng *rand.Rand) (int, error), lat *hdrhistogram.Histogram) float64 {
		pctx, cancel := context.WithTimeout(ctx, bc.duration)
		defer cancel()
		var stored atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for id := range bc.producers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(id), 7))
				for pctx.Err() == nil {
					t0 := time.Now()
					n, err := call(id, rng)
					if err != nil {
						if pctx.Err() == nil {
							fail(err)
						}
						continue
					}
					stored.Add(int64(n))
					latMu.Lock()
					_ = lat.RecordValue(max(time.Since(t0).Microseconds(), 1))
					latMu.Unlock()
				}
			}()
		}
		wg.Wait()
		return float64(stored.Load()) / time.Since(start).Seconds()
	}
	msgs := func() []*client.Message {
		out := make([]*client.Message, bc.batch)
		for i := range out {
			out[i] = &client.Message{Value: value}
		}
		return out
	}
	producers := make([]*client.Producer, bc.producers)
	for i := range producers {
		producers[i] = conns[i].NewProducer(client.WithIdempotence(false), client.WithManualPartitions(),
			client.WithLinger(time.Hour), client.WithBatchBytes(max(1<<20, 2*bc.batch*(bc.size+64))))
	}
	produce := func(id int, rng *rand.Rand) (int, error) {
		// The baseline: the same records to a destination topic, one
		// produce request (a linger never reached, flushed at once).
		p := producers[id]
		topic := topics[(id+rng.IntN(len(topics)))%len(topics)]
		part := int32(rng.IntN(bc.partitions))
		var first error
		var mu sync.Mutex
		for _, m := range msgs() {
			m.Topic, m.Partition = topic, part
			p.SendAsync(ctx, m, func(_ client.Result, err error) {
				if err != nil {
					mu.Lock()
					first = cmpErr(first, err)
					mu.Unlock()
				}
			})
		}
		if err := p.Flush(ctx); err != nil {
			return 0, err
		}
		mu.Lock()
		defer mu.Unlock()
		return bc.batch, first
	}
	publish := func(id int, rng *rand.Rand) (int, error) {
		r, err := conns[id].Publish(ctx, name, keys[rng.IntN(len(keys))], client.PublishOptions{Mandatory: true}, msgs()...)
		if err != nil {
			return 0, err
		}
		n := 0
		for _, d := range r.Destinations {
			n += int(d.Count)
		}
		return n, nil
	}
	for round := range bc.rounds {
		// Alternate which goes first: a log that grows, or a disk that
		// warms, favours neither.
		var base, ex float64
		if round%2 == 0 {
			base = phase(produce, prodLat)
			ex = phase(publish, pubLat)
		} else {
			ex = phase(publish, pubLat)
			base = phase(produce, prodLat)
		}
		if ctx.Err() != nil {
			break
		}
		sum.Baseline = append(sum.Baseline, base)
		sum.Exchange = append(sum.Exchange, ex)
		sum.Ratios = append(sum.Ratios, ex/base)
		fmt.Fprintf(progress, "round %d: produce %.0f/s, publish %.0f/s stored: %.2fx\n", round+1, base, ex, ex/base)
	}
	if len(sum.Ratios) > 0 {
		r := slices.Clone(sum.Ratios)
		slices.Sort(r)
		sum.Median = r[len(r)/2]
	}
	sum.PublishP50, sum.PublishP99 = usToMs(pubLat.ValueAtQuantile(50)), usToMs(pubLat.ValueAtQuantile(99))
	sum.ProduceP50, sum.ProduceP99 = usToMs(prodLat.ValueAtQuantile(50)), usToMs(prodLat.ValueAtQuantile(99))
	sum.Errors = errs.Load()
	if sum.Errors > 0 {
		return sum, errors.New(sum.FirstError)
	}
	return sum, nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
