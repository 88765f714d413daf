package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

func init() {
	register("bench", "measure produce and consume throughput and latency ('bench rr': request-reply; 'bench half': half messages)", cliRunner(benchCmd))
}

// benchHeader is the prefix of every bench record value: the send time in
// Unix nanoseconds (the intended send time under --rate, so latency
// includes queueing), then the producer's id (high 24 bits) and sequence
// number (low benchSeqBits bits).
const (
	benchHeader  = 16
	benchSeqBits = 40
)

// A bench producer allocates record values and messages benchChunk at a
// time, fewer for large records (about benchChunkBytes of values).
const (
	benchChunk      = 64
	benchChunkBytes = 64 << 10
)

// Push consumer defaults of herald bench.
const (
	benchDefaultWindow = 1024
	// benchMaxFillProducers bounds the producer ids counted with
	// --producers 0 (the run that filled the topic is not known).
	benchMaxFillProducers = 1 << 12
)

// benchGroupFlags are the bench flags that need --group.
var benchGroupFlags = []string{"mode", "window", "auto-ack", "concurrency", "from", "fail-ratio", "retry-policy"}

type benchConfig struct {
	cf             *cliFlags
	ackLog         string       // --ack-log
	acked          *benchAckSet // the acknowledged records, with --ack-log
	producers      int
	consumers      int
	size           int
	keys           int
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
	delay          time.Duration // delayed messages: latency counts from send + delay
	failRatio      float64       // push: fail this share of first deliveries (retried by policy)
	retryPolicy    string
	fireRate       float64       // delayed messages due at this aggregate rate...
	fireAfter      time.Duration // ...from this long after the start
	isolation      string        // --isolation: checked, and reported; both levels read the same
	txnSize        int           // --txn-size: records per transaction (0: no transactions)
	txnOnce        bool          // --txn-written-once: transactions written once (client.WithTxnWrittenOnce)
	txnInFlight    int           // --txn-in-flight: commits in flight per producer (CommitAsync above 1)

	// Push consumers (--group); pull consumers when group is empty.
	group       string
	mode        client.SubscriptionMode
	window      int
	autoAck     bool
	concurrency int
	from        client.StartPosition
}

// benchCmd runs "herald bench": producers and consumers against one topic,
// reporting throughput and produce-to-consume latency. "herald bench rr"
// runs the request-reply benchmark instead (benchRRCmd), and "herald bench
// half" the half-message one (benchHalfCmd).
func benchCmd(ctx context.Context, args []string, io cliIO) error {
	if len(args) > 0 {
		switch args[0] {
		case "rr":
			return benchRRCmd(ctx, args[1:], io)
		case "half":
			return benchHalfCmd(ctx, args[1:], io)
		case "exchange":
			return benchExchangeCmd(ctx, args[1:], io)
		}
	}
	fs, cf := newCLIFlagSet("bench", io.err)
	benchUsage(fs, "herald bench [flags]\n  (herald bench rr [flags]: the request-reply benchmark;\n   herald bench half [flags]: half messages, SendHalf and Commit or check-backs)")
	bc := benchConfig{cf: cf}
	fs.IntVar(&bc.producers, "producers", 1, "producers, each with its own connection (0 = consume only: needs --group, --from and --count)")
	fs.IntVar(&bc.consumers, "consumers", 1, "consumers, each with its own connection (0 = produce only); pull consumers share the partitions, push consumers are members of --group")
	fs.IntVar(&bc.size, "size", 1024, "record value size in bytes (at least 16)")
	fs.IntVar(&bc.keys, "keys", 0, "give records a 4-byte key, one of N values (0 = no key; --mode key-shared needs keys)")
	acks := fs.String("acks", "all", "acknowledgement: none, leader or all")
	fs.IntVar(&bc.batchBytes, "batch-bytes", client.DefaultBatchBytes, "producer batch size in bytes")
	fs.Int64Var(&bc.bufferBytes, "buffer-bytes", client.DefaultBufferBytes, "producer buffer; without --rate, latency includes the time records wait in it")
	fs.DurationVar(&bc.linger, "linger", client.DefaultLinger, "producer linger")
	fs.IntVar(&bc.inFlight, "in-flight", 4, "batches each producer keeps in flight per partition")
	fs.Float64Var(&bc.rate, "rate", 0, "aggregate produce rate in records/s, open loop (0 = as fast as possible)")
	fs.DurationVar(&bc.duration, "duration", 10*time.Second, "how long to produce (ignored with --count)")
	fs.Int64Var(&bc.count, "count", 0, "produce this many records in total instead of running for --duration (with --producers 0: consume this many)")
	fs.StringVar(&bc.topic, "topic", "herald-bench", "topic (created if missing)")
	fs.IntVar(&bc.partitions, "partitions", 4, "partitions when the topic is created")
	fs.IntVar(&bc.replication, "replication", 0, "replication factor when the topic is created (0 = broker default)")
	fs.DurationVar(&bc.reportInterval, "report-interval", time.Second, "progress line interval (0 = none)")
	fs.DurationVar(&bc.drainTimeout, "drain-timeout", 10*time.Second, "once producing stopped, producers (flushing) and consumers give up after this long without a record completing or a new record")
	fs.DurationVar(&bc.delay, "delay", 0, "produce delayed messages (each its own scheduled batch): latency is then from each record's time (its herald-deliver-at header) to its consumption: the scheduler's fire lateness plus delivery")
	fs.Float64Var(&bc.failRatio, "fail-ratio", 0, "with --group: the handler fails (Delivered.Fail) this share of first deliveries, to be retried by --retry-policy: measures the cost of retries")
	fs.StringVar(&bc.retryPolicy, "retry-policy", "", "with --group: the subscription's retry policy (empty = the broker's)")
	fs.Float64Var(&bc.fireRate, "fire-rate", 0, "produce --count delayed messages due at this aggregate rate (records/s), the first --fire-after from the start: measures the scheduler firing at a fixed rate")
	fs.DurationVar(&bc.fireAfter, "fire-after", 20*time.Second, "with --fire-rate: when the first message is due (leave time to store them all)")
	fs.BoolVar(&bc.json, "json", false, "print the final summary as JSON on stdout (progress goes to stderr)")
	fs.StringVar(&bc.ackLog, "ack-log", "", "write which records were acknowledged to this file, for `herald verify`")
	fs.IntVar(&bc.txnSize, "txn-size", 0, "records per transaction: each producer is a transactional producer (id herald-bench-N) committing every N records; latency to ack is then to the commit (0 = no transactions)")
	fs.BoolVar(&bc.txnOnce, "txn-written-once", false, "with --txn-size: write each transaction's records once, to their partitions, instead of staging them with the coordinator")
	fs.IntVar(&bc.txnInFlight, "txn-in-flight", 1, fmt.Sprintf("with --txn-written-once: commits each producer keeps in flight (above 1: CommitAsync, the next transaction written while the last ones commit; at most %d)", client.MaxTxnCommitsInFlight))
	fs.StringVar(&bc.isolation, "isolation", isolationCommitted, isolationUsage)
	fs.StringVar(&bc.group, "group", "", "consume by push, as members of this consumer group (default: pull, fetching each partition)")
	mode := fs.String("mode", "shared", "group mode: shared, clustering or key-shared (with --group)")
	fs.IntVar(&bc.window, "window", benchDefaultWindow, "credits per consumer: records pushed and not yet handled, at most (with --group)")
	fs.BoolVar(&bc.autoAck, "auto-ack", false, "the broker counts a record done when it pushes it (with --group; default: one Ack per record)")
	fs.IntVar(&bc.concurrency, "concurrency", 1, "handler goroutines per consumer (with --group)")
	from := fs.String("from", "latest", "where a group without progress starts: earliest, latest, an OFFSET or an RFC3339 time (with --group)")
	pos, err := parseCLIArgs(fs, args)
	switch {
	case err != nil:
		return err
	case len(pos) > 0 && (pos[0] == "rr" || pos[0] == "half"):
		return usagef("%s comes first: herald bench %s [flags]", pos[0], pos[0])
	case len(pos) > 0:
		return usagef("unexpected argument %q", pos[0])
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case bc.producers < 0:
		return usagef("--producers must not be negative")
	case bc.consumers < 0:
		return usagef("--consumers must not be negative")
	case bc.producers == 0 && bc.consumers == 0:
		return usagef("--producers 0 and --consumers 0: nothing to run")
	case bc.size < benchHeader:
		return usagef("--size must be at least %d (the timestamp and sequence header)", benchHeader)
	case bc.keys < 0 || bc.keys > 1<<31:
		return usagef("--keys must be between 0 and %d", 1<<31)
	case bc.rate < 0, bc.count < 0, bc.duration <= 0 && bc.count == 0:
		return usagef("--rate and --count must not be negative, and --duration must be positive without --count")
	case bc.partitions < 1:
		return usagef("--partitions must be at least 1")
	case bc.topic == "":
		return usagef("--topic must not be empty")
	case bc.delay < 0 || bc.delay > 0 && bc.delay < time.Millisecond:
		return usagef("--delay must be 0 or at least 1ms")
	case bc.failRatio < 0 || bc.failRatio >= 1 || bc.failRatio > 0 && bc.autoAck:
		return usagef("--fail-ratio must be in [0, 1), and needs acks (not --auto-ack)")
	case bc.fireRate < 0 || bc.fireRate > 0 && (bc.count == 0 || bc.delay > 0 || bc.fireAfter <= 0):
		return usagef("--fire-rate needs --count and a positive --fire-after, and excludes --delay")
	case bc.txnSize < 0:
		return usagef("--txn-size must not be negative")
	case bc.txnInFlight < 1 || bc.txnInFlight > client.MaxTxnCommitsInFlight:
		return usagef("--txn-in-flight must be 1 to %d", client.MaxTxnCommitsInFlight)
	case bc.txnInFlight > 1 && !bc.txnOnce:
		return usagef("--txn-in-flight needs --txn-written-once")
	case bc.txnSize > 0 && bc.producers == 0:
		return usagef("--txn-size needs producers")
	case bc.txnSize > 0 && (bc.delay > 0 || bc.fireRate > 0):
		return usagef("--txn-size excludes --delay and --fire-rate: a transaction cannot hold delayed messages")
	case bc.txnSize > 0 && set["acks"] && *acks != "all":
		return usagef("--txn-size needs --acks all (a commit appends with acks all)")
	case bc.txnSize > 0 && (set["linger"] || set["in-flight"]):
		return usagef("--linger and --in-flight do not apply with --txn-size: a transactional producer stages one batch at a time, and its records wait for the commit")
	}
	if err := checkIsolation(bc.isolation); err != nil {
		return err
	}
	if bc.group == "" {
		for _, n := range benchGroupFlags {
			if set[n] {
				return usagef("--%s needs --group", n)
			}
		}
		if bc.producers == 0 {
			return usagef("--producers 0 needs --group (push consumers reading a filled topic)")
		}
	} else {
		if bc.mode, err = parseMode(*mode); err != nil {
			return err
		}
		if bc.from, err = parseStart("--from", *from); err != nil {
			return err
		}
		switch {
		case bc.mode == client.Broadcast:
			return usagef("--mode must be shared, clustering or key-shared (broadcast gives every consumer every record)")
		case bc.consumers < 1:
			return usagef("--group needs --consumers 1 or more")
		case bc.window < 1 || bc.window > client.MaxWindow:
			return usagef("--window must be between 1 and %d", client.MaxWindow)
		case bc.concurrency < 1 || bc.concurrency > client.MaxWindow:
			return usagef("--concurrency must be between 1 and %d", client.MaxWindow)
		case bc.producers == 0 && bc.count == 0:
			return usagef("--producers 0 needs --count: how many records to consume")
		case bc.producers == 0 && (!set["from"] || *from == "latest"):
			return usagef("--producers 0 needs --from earliest (or an offset or a time): a new group at latest gets nothing")
		case bc.mode == client.KeyShared && bc.producers > 0 && bc.keys == 0:
			return usagef("--mode key-shared needs --keys N: records without a key all go to one consumer")
		}
	}
	if bc.acks, err = parseCLIAcks(*acks); err != nil {
		return err
	}
	sum, err := runReported(io, bc.json, func(progress progressWriter) (*benchSummary, error) {
		s, err := runBench(ctx, &bc, progress)
		return s, cliTopicErr(err, bc.topic, bc.partitions)
	})
	if err != nil {
		return err
	}
	if sum.ProduceErrors > 0 {
		return fmt.Errorf("%s failed to produce, first: %s", plural(sum.ProduceErrors, "record"), sum.FirstError)
	}
	if ctx.Err() != nil {
		return nil // interrupted: what was done is reported
	}
	if sum.Missing > 0 {
		hint := ""
		if sum.Consumed == 0 && bc.group != "" {
			hint = "; a group with stored progress ignores --from: use a new --group, or herald group reset"
		}
		return fmt.Errorf("%d of %s %s not consumed (none new for --drain-timeout %s%s)", sum.Missing, plural(sum.Expected, "record"), wasWere(sum.Missing), bc.drainTimeout, hint)
	}
	if sum.UnexpectedDuplicates > 0 {
		return fmt.Errorf("%s %s consumed twice without a redelivery (stored twice by a producer retry, or delivered twice)", plural(sum.UnexpectedDuplicates, "record"), wasWere(sum.UnexpectedDuplicates))
	}
	return nil
}

// benchUsage makes -h print usage before the flags.
func benchUsage(fs *flag.FlagSet, usage string) {
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s\n", usage)
		fs.PrintDefaults()
	}
}

// benchTopic creates topic if it is missing and returns its partition count.
func benchTopic(ctx context.Context, admin *client.Client, topic string, partitions, replication int) (int, error) {
	ok, err := topicExists(ctx, admin, topic)
	if err != nil {
		return 0, err
	}
	if !ok {
		_, err := admin.CreateTopic(ctx, topic, &heraldpb.TopicConfig{Partitions: uint32(partitions), ReplicationFactor: uint32(replication)})
		if err != nil && !client.IsCode(err, heraldpb.ErrorCode_TOPIC_ALREADY_EXISTS) {
			return 0, err
		}
	}
	n, err := admin.Partitions(ctx, topic)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, fmt.Errorf("topic %s has no partitions", topic)
	}
	return n, nil
}

// benchSummary is the final report (--json prints it as is).
type benchSummary struct {
	Topic         string  `json:"topic"`
	Partitions    int     `json:"partitions"`
	Producers     int     `json:"producers"`
	Consumers     int     `json:"consumers"`
	ConsumeMode   string  `json:"consume_mode"` // pull, or the group mode
	Group         string  `json:"group,omitempty"`
	Window        int     `json:"window,omitempty"`
	AutoAck       bool    `json:"auto_ack,omitempty"`
	Concurrency   int     `json:"concurrency,omitempty"`
	Size          int     `json:"size_bytes"`
	Acks          string  `json:"acks"`
	Isolation     string  `json:"isolation"`
	Rate          float64 `json:"target_rate"`
	Seconds       float64 `json:"produce_seconds"`
	Produced      int64   `json:"produced"`
	ProduceErrors int64   `json:"produce_errors"`
	FirstError    string  `json:"first_error,omitempty"`
	// ProduceTimeouts counts the failed records whose error was a timeout
	// (a request timeout, or a deadline); they are in ProduceErrors too.
	// Throttled counts produce attempts the broker answered THROTTLED and
	// Retries the attempts sent again (THROTTLED included), summed over
	// the producers (client.ProducerStats): the producers retried them,
	// so they are not errors.
	ProduceTimeouts int64 `json:"produce_timeouts"`
	Throttled       int64 `json:"throttled"`
	Retries         int64 `json:"retries"`
	// Produce latency: from each record's send time (its intended send
	// time under --rate, so queueing in the producer counts) to its
	// acknowledgement, over the records acknowledged.
	AckLatencyP50Ms  float64 `json:"ack_latency_p50_ms"`
	AckLatencyP90Ms  float64 `json:"ack_latency_p90_ms"`
	AckLatencyP99Ms  float64 `json:"ack_latency_p99_ms"`
	AckLatencyP999Ms float64 `json:"ack_latency_p999_ms"`
	AckLatencyMaxMs  float64 `json:"ack_latency_max_ms"`
	// Transactions (--txn-size): each producer commits every TxnSize
	// records (the last transaction may hold fewer). Transactions counts
	// the commits that succeeded, TxnFailed those that did not (their
	// records are in ProduceErrors); the commit latency is Commit's (the
	// flush of the records not staged yet, then EndTxn), over the
	// successful ones. Produced counts only committed records, and the
	// ack latency runs to their transaction's commit. TxnInFlightMax is
	// the most commits one producer had in flight at once (CommitAsync,
	// --txn-in-flight above 1).
	TxnSize            int     `json:"txn_size,omitempty"`
	TxnInFlightMax     int64   `json:"txn_in_flight_max,omitempty"`
	Transactions       int64   `json:"transactions,omitempty"`
	TxnFailed          int64   `json:"txn_failed,omitempty"`
	TransactionsPerSec float64 `json:"transactions_per_sec,omitempty"`
	CommitP50Ms        float64 `json:"commit_p50_ms,omitempty"`
	CommitP90Ms        float64 `json:"commit_p90_ms,omitempty"`
	CommitP99Ms        float64 `json:"commit_p99_ms,omitempty"`
	CommitMaxMs        float64 `json:"commit_max_ms,omitempty"`
	ProducedPerSec     float64 `json:"produced_msgs_per_sec"`
	ProducedMBPerSec   float64 `json:"produced_mb_per_sec"`
	// Expected is what the consumers should see: the records produced, or
	// --count with --producers 0. Consumed counts distinct records (by
	// producer and sequence number) of this run; Missing is Expected minus
	// Consumed when positive.
	Expected         int64   `json:"expected"`
	Consumed         int64   `json:"consumed"`
	Missing          int64   `json:"missing"`
	ConsumeSeconds   float64 `json:"consume_seconds"`
	ConsumedPerSec   float64 `json:"consumed_msgs_per_sec"`
	ConsumedMBPerSec float64 `json:"consumed_mb_per_sec"`
	// Duplicates counts deliveries of records already consumed;
	// UnexpectedDuplicates the records delivered more than once without a
	// redelivery mark (DeliveryCount 1), which should not happen.
	Duplicates           int64 `json:"duplicates"`
	UnexpectedDuplicates int64 `json:"unexpected_duplicates"`
	// Redelivered counts push deliveries with DeliveryCount > 1; Ignored
	// the records consumed that this run does not count (written before
	// it, or not bench records).
	Redelivered       int64   `json:"redelivered"`
	Ignored           int64   `json:"ignored"`
	ConsumeErrors     int64   `json:"consume_errors"`
	FirstConsumeError string  `json:"first_consume_error,omitempty"`
	LatencyP50Ms      float64 `json:"latency_p50_ms"`
	LatencyP90Ms      float64 `json:"latency_p90_ms"`
	LatencyP99Ms      float64 `json:"latency_p99_ms"`
	LatencyP999Ms     float64 `json:"latency_p999_ms"`
	LatencyMaxMs      float64 `json:"latency_max_ms"`
}

func (s *benchSummary) print(w io.Writer) {
	cons := "pull"
	if s.Group != "" {
		ack := "manual acks"
		if s.AutoAck {
			ack = "auto-ack"
		}
		cons = fmt.Sprintf("push: group %s, %s, window %d, %s, concurrency %d", s.Group, s.ConsumeMode, s.Window, ack, s.Concurrency)
	}
	if s.Producers == 0 {
		fmt.Fprintf(w, "topic %s: %s, %s (%s), records written before this run\n",
			s.Topic, plural(s.Partitions, "partition"), plural(s.Consumers, "consumer"), cons)
	} else {
		fmt.Fprintf(w, "topic %s: %s, %s, %s (%s), %d-byte records, acks %s\n",
			s.Topic, plural(s.Partitions, "partition"), plural(s.Producers, "producer"), plural(s.Consumers, "consumer"), cons, s.Size, s.Acks)
		fmt.Fprintf(w, "produced %s in %.2fs: %.0f msg/s, %.2f MB/s (%s, %d of them timeouts; %s THROTTLED, %s)\n",
			plural(s.Produced, "record"), s.Seconds, s.ProducedPerSec, s.ProducedMBPerSec, plural(s.ProduceErrors, "error"), s.ProduceTimeouts,
			plural(s.Throttled, "attempt"), plural(s.Retries, "retry"))
		if s.TxnSize > 0 {
			fmt.Fprintf(w, "transactions of %s: %d committed, %.1f/s (%d failed); commit latency p50 %.3fms p90 %.3fms p99 %.3fms max %.3fms\n",
				plural(s.TxnSize, "record"), s.Transactions, s.TransactionsPerSec, s.TxnFailed, s.CommitP50Ms, s.CommitP90Ms, s.CommitP99Ms, s.CommitMaxMs)
		}
		if s.Produced > 0 {
			to := "ack"
			if s.TxnSize > 0 {
				to = "commit"
			}
			fmt.Fprintf(w, "latency produce-to-%s: p50 %.3fms p90 %.3fms p99 %.3fms p99.9 %.3fms max %.3fms\n",
				to, s.AckLatencyP50Ms, s.AckLatencyP90Ms, s.AckLatencyP99Ms, s.AckLatencyP999Ms, s.AckLatencyMaxMs)
		}
	}
	if s.Consumers == 0 {
		return
	}
	fmt.Fprintf(w, "consumed %d of %s in %.2fs: %.0f msg/s, %.2f MB/s; %d missing, %s (%d unexpected), %d redelivered, %d ignored\n",
		s.Consumed, plural(s.Expected, "record"), s.ConsumeSeconds, s.ConsumedPerSec, s.ConsumedMBPerSec, s.Missing, plural(s.Duplicates, "duplicate"), s.UnexpectedDuplicates, s.Redelivered, s.Ignored)
	if s.ConsumeErrors > 0 {
		fmt.Fprintf(w, "consumer errors: %d, first: %s\n", s.ConsumeErrors, s.FirstConsumeError)
	}
	switch {
	case s.Producers == 0:
		fmt.Fprintln(w, "latency produce-to-consume: not measured (--producers 0: the records were written before this run)")
	case s.Consumed == 0:
		fmt.Fprintln(w, "latency produce-to-consume: none measured (nothing consumed)")
	default:
		fmt.Fprintf(w, "latency produce-to-consume: p50 %.3fms p90 %.3fms p99 %.3fms p99.9 %.3fms max %.3fms\n",
			s.LatencyP50Ms, s.LatencyP90Ms, s.LatencyP99Ms, s.LatencyP999Ms, s.LatencyMaxMs)
	}
}

// newBenchHistogram returns a histogram of microseconds up to 5 minutes.
func newBenchHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(1, int64(5*time.Minute/time.Microsecond), 3)
}

// benchErrors counts errors and keeps the first one's text.
type benchErrors struct {
	n     atomic.Int64
	once  sync.Once
	first atomic.Value // string
}

func (e *benchErrors) add(err error) {
	e.n.Add(1)
	e.once.Do(func() { e.first.Store(cliOneLine(err).Error()) })
}

func (e *benchErrors) firstText() string {
	s, _ := e.first.Load().(string)
	return s
}

// benchStats is shared by the producer and consumer goroutines. Each
// consumer goroutine (pull: one per partition; push: one subscription)
// records into its own benchSink, so consumers do not contend on one lock;
// collect merges the sinks.
type benchStats struct {
	produced, producedBytes atomic.Int64
	produceErrs             benchErrors
	produceTimeouts         atomic.Int64
	throttled, retries      atomic.Int64 // summed as producers finish
	acks                    []*benchSink // produce-to-ack latencies, one per producer
	commits                 []*benchSink // --txn-size: commit latencies, one per producer
	transactions, txnFailed atomic.Int64
	txnInFlightMax          atomic.Int64 // the most commits one producer had in flight
	consumeErrs             benchErrors
	ignored                 atomic.Int64

	valid   benchValid
	seen    benchSeen
	latency bool  // record latencies (not with --producers 0)
	delayNs int64 // --delay: subtracted from latencies

	mu      sync.Mutex
	sinks   []*benchSink
	total   *hdrhistogram.Histogram // whole run, merged from the sinks by collect
	scratch *hdrhistogram.Histogram // the interval being collected
}

// sawTxnInFlight records that a producer had at most n commits in flight.
func (s *benchStats) sawTxnInFlight(n int64) {
	for m := s.txnInFlightMax.Load(); n > m && !s.txnInFlightMax.CompareAndSwap(m, n); m = s.txnInFlightMax.Load() {
	}
}

func newBenchStats(valid benchValid, latency bool) *benchStats {
	return &benchStats{valid: valid, latency: latency, total: newBenchHistogram(), scratch: newBenchHistogram()}
}

func (s *benchStats) newSink() *benchSink {
	k := &benchSink{hist: newBenchHistogram()}
	s.mu.Lock()
	s.sinks = append(s.sinks, k)
	s.mu.Unlock()
	return k
}

// benchInterval is what the consumers did: totals, the latency quantiles
// since the previous collect (in microseconds) and the time of the last
// record counted.
type benchInterval struct {
	consumed, bytes           int64
	lastNs                    int64
	p50, p90, p99, p999, maxV int64
}

// collect sums the sinks and moves their latencies into the run's total.
func (s *benchStats) collect() benchInterval {
	var iv benchInterval
	s.mu.Lock()
	defer s.mu.Unlock()
	s.scratch.Reset()
	for _, k := range s.sinks {
		k.mu.Lock()
		iv.consumed += k.n
		iv.bytes += k.bytes
		iv.lastNs = max(iv.lastNs, k.lastNs)
		s.scratch.Merge(k.hist)
		k.hist.Reset()
		k.mu.Unlock()
	}
	s.total.Merge(s.scratch)
	h := s.scratch
	iv.p50, iv.p90, iv.p99, iv.p999, iv.maxV = h.ValueAtQuantile(50), h.ValueAtQuantile(90), h.ValueAtQuantile(99), h.ValueAtQuantile(99.9), h.Max()
	return iv
}

// benchSink is one consumer goroutine's counters, guarded by mu.
type benchSink struct {
	mu       sync.Mutex
	n, bytes int64 // records counted (first receipt of a record of this run)
	lastNs   int64 // when the last one was received
	hist     *hdrhistogram.Histogram
}

// takeLocked counts the record whose value is v, received at nowNs (Unix
// nanoseconds, benchClock); redelivered says the broker marked it so. The
// caller holds k.mu.
func (s *benchStats) takeLocked(k *benchSink, nowNs int64, v []byte, redelivered bool, hdrs []client.Header) {
	sent, id, seq, ok := s.valid.parse(v)
	if !ok {
		s.ignored.Add(1)
		return
	}
	if !s.seen.add(id, seq, redelivered) {
		return
	}
	k.n++
	k.bytes += int64(len(v))
	k.lastNs = nowNs
	if s.latency {
		from := sent + s.delayNs
		if s.delayNs > 0 {
			// A delayed record: from its time, as the broker set it.
			for _, h := range hdrs {
				if h.Key == "herald-deliver-at" {
					if ms, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil {
						from = ms * int64(time.Millisecond)
					}
				}
			}
		}
		us := max(nowNs-from, 0) / int64(time.Microsecond)
		_ = k.hist.RecordValue(min(max(us, 1), k.hist.HighestTrackableValue()))
	}
}

// benchValid says which record values a run counts: bench records (a full
// header) sent at or after minNs (Unix nanoseconds) by a producer id below
// ids with a sequence number below seqs. The bounds keep records of other
// runs and other writers out of the counts and bound benchSeen's memory.
type benchValid struct {
	minNs     int64
	ids, seqs uint64
}

func (b benchValid) parse(v []byte) (sentNs int64, id, seq uint64, ok bool) {
	if len(v) < benchHeader {
		return 0, 0, 0, false
	}
	sentNs = int64(binary.BigEndian.Uint64(v))
	w := binary.BigEndian.Uint64(v[8:])
	id, seq = w>>benchSeqBits, w&(1<<benchSeqBits-1)
	return sentNs, id, seq, sentNs >= b.minNs && id < b.ids && seq < b.seqs
}

// benchSeenShards spreads benchSeen over locks by sequence number. A
// producer sends sequence s to partition (s+id) mod partitions, so with a
// shard count that is a multiple of the partition count the consumers of
// different partitions use different shards.
const benchSeenShards = 64

// benchSeen records which (producer, sequence) pairs were consumed, to count
// distinct records, duplicates, and duplicates without a redelivery mark.
// It needs two bits per sequence number up to the highest seen.
type benchSeen struct {
	shards [benchSeenShards]benchSeenShard
}

type benchSeenShard struct {
	mu         sync.Mutex
	producers  []benchBits // by producer id
	dups       int64       // deliveries of pairs already seen
	unexpected int64       // pairs seen again without a redelivery mark
	distinct   atomic.Int64
	_          [64]byte // keep shards' hot fields on separate cache lines
}

// benchBits are one producer's bitsets in one shard, indexed by
// sequence/benchSeenShards: any delivery, and a delivery not marked as a
// redelivery.
type benchBits struct{ any, first []uint64 }

// add notes a delivery and reports whether the pair is new.
func (s *benchSeen) add(id, seq uint64, redelivered bool) bool {
	sh := &s.shards[seq%benchSeenShards]
	k := seq / benchSeenShards
	w, bit := k/64, uint64(1)<<(k%64)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if id >= uint64(len(sh.producers)) {
		sh.producers = append(sh.producers, make([]benchBits, id+1-uint64(len(sh.producers)))...)
	}
	b := &sh.producers[id]
	if w >= uint64(len(b.any)) {
		n := max(int(w)+1, 2*len(b.any))
		b.any = append(b.any, make([]uint64, n-len(b.any))...)
		b.first = append(b.first, make([]uint64, n-len(b.first))...)
	}
	fresh := b.any[w]&bit == 0
	if fresh {
		b.any[w] |= bit
		sh.distinct.Add(1)
	} else {
		sh.dups++
	}
	if !redelivered {
		if b.first[w]&bit != 0 {
			sh.unexpected++
		}
		b.first[w] |= bit
	}
	return fresh
}

// distinct returns the number of distinct pairs seen; safe at any time.
func (s *benchSeen) distinct() int64 {
	var n int64
	for i := range s.shards {
		n += s.shards[i].distinct.Load()
	}
	return n
}

// dups returns the duplicate deliveries and the pairs seen again without a
// redelivery mark.
func (s *benchSeen) dups() (dups, unexpected int64) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		dups += sh.dups
		unexpected += sh.unexpected
		sh.mu.Unlock()
	}
	return dups, unexpected
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

func usToMs(v int64) float64 { return float64(v) / 1000 }

// perSec divides n by sec, 0 when sec is not positive (JSON has no Inf).
func perSec(n, sec float64) float64 {
	if sec <= 0 {
		return 0
	}
	return n / sec
}

// benchConsumers is a running set of consumers; stop ends them and waits.
type benchConsumers interface {
	stop()
}

func runBench(ctx context.Context, bc *benchConfig, progress io.Writer) (*benchSummary, error) {
	admin, err := bc.cf.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	nparts, err := benchTopic(ctx, admin, bc.topic, bc.partitions, bc.replication)
	if err != nil {
		return nil, err
	}
	bc.partitions = nparts
	clock := newBenchClock()
	valid := benchValid{minNs: clock.baseNs, ids: uint64(bc.producers), seqs: 1 << benchSeqBits}
	if bc.count > 0 {
		valid.seqs = uint64(bc.count) // no producer has more
	}
	if bc.producers == 0 {
		valid = benchValid{ids: benchMaxFillProducers, seqs: uint64(bc.count)}
	}
	stats := newBenchStats(valid, bc.producers > 0)
	stats.delayNs = int64(bc.delay)
	if bc.fireRate > 0 {
		stats.delayNs = 1 // latency from herald-deliver-at
	}

	var clients []*client.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	dial := func() (*client.Client, error) {
		c, err := bc.cf.dial(ctx)
		if err == nil {
			clients = append(clients, c)
		}
		return c, err
	}

	// Consumers start (pull: at each partition's high watermark; push: as
	// --from says for a new group) before anything is produced.
	start := time.Now()
	var cons benchConsumers
	var push *benchPush
	if bc.consumers > 0 {
		if bc.group == "" {
			cons, err = startBenchPull(ctx, bc, dial, clock, stats)
		} else {
			push, err = startBenchPush(ctx, bc, dial, clock, stats)
			cons = push
		}
		if err != nil {
			return nil, err
		}
		defer cons.stop()
	}

	// Producers: every connection is dialled before any producer starts,
	// so that --duration is the time all of them produce (dialling under
	// the load of the first producers took seconds).
	pclients := make([]*client.Client, bc.producers)
	for i := range pclients {
		if pclients[i], err = dial(); err != nil {
			return nil, err
		}
	}
	prodCtx, stopProducers := context.WithCancel(ctx)
	defer stopProducers()
	if bc.count == 0 {
		var cancel context.CancelFunc
		prodCtx, cancel = context.WithTimeout(prodCtx, bc.duration)
		defer cancel()
	}
	var prodWG sync.WaitGroup
	if bc.producers > 0 {
		start = time.Now()
	}
	if bc.ackLog != "" {
		bc.acked = newBenchAckSet(bc.producers)
	}
	var errs = make(chan error, bc.producers)
	producers := make([]atomic.Pointer[client.Producer], bc.producers) // for progress; nil once finished
	stats.acks = make([]*benchSink, bc.producers)
	for i := range stats.acks {
		stats.acks[i] = &benchSink{hist: newBenchHistogram()}
	}
	if bc.txnSize > 0 {
		stats.commits = make([]*benchSink, bc.producers)
		for i := range stats.commits {
			stats.commits[i] = &benchSink{hist: newBenchHistogram()}
		}
	}
	for i, c := range pclients {
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
			if bc.txnSize > 0 {
				errs <- benchProduceTxn(prodCtx, ctx, c, bc, i, n, start, clock, stats)
				return
			}
			errs <- benchProduce(prodCtx, ctx, c, bc, i, n, start, clock, stats, &producers[i])
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
		p, pb := stats.produced.Load(), stats.producedBytes.Load()
		iv := stats.collect()
		line := fmt.Sprintf("%6.1fs", now.Sub(start).Seconds())
		if bc.producers > 0 {
			line += fmt.Sprintf("  produced %8.0f msg/s %8.2f MB/s", float64(p-lastP)/el, float64(pb-lastPB)/el/1e6)
		}
		if bc.consumers > 0 {
			line += fmt.Sprintf("  consumed %8.0f msg/s %8.2f MB/s", float64(iv.consumed-lastC)/el, float64(iv.bytes-lastCB)/el/1e6)
		}
		if bc.consumers > 0 && stats.latency {
			line += fmt.Sprintf("  latency p50 %.2fms p99 %.2fms p99.9 %.2fms max %.2fms",
				usToMs(iv.p50), usToMs(iv.p99), usToMs(iv.p999), usToMs(iv.maxV))
		}
		line += fmt.Sprintf("  errors %d", stats.produceErrs.n.Load()+stats.consumeErrs.n.Load())
		if bc.producers > 0 {
			var thr int64
			for i := range producers {
				if p := producers[i].Load(); p != nil {
					thr += int64(p.Stats().Throttled)
				}
			}
			line += fmt.Sprintf("  throttled %d", stats.throttled.Load()+thr)
		}
		fmt.Fprintln(progress, line)
		last, lastP, lastPB, lastC, lastCB = now, p, pb, iv.consumed, iv.bytes
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
	if bc.acked != nil {
		if err := bc.acked.write(bc.ackLog, bc.topic, start); err != nil {
			return nil, fmt.Errorf("writing the acknowledgement log: %w", err)
		}
	}

	// Let consumers catch up with what was acknowledged (or read --count
	// records with --producers 0), as long as they make progress.
	expected := stats.produced.Load()
	if bc.producers == 0 {
		expected = bc.count
	}
	if bc.consumers > 0 {
		poll := time.NewTicker(5 * time.Millisecond)
		defer poll.Stop()
		seen, progressAt := stats.seen.distinct(), time.Now()
		waitExtra := bc.delay // delayed records arrive that much later
		if bc.fireRate > 0 {
			waitExtra = bc.fireAfter
		}
		for ctx.Err() == nil {
			n := stats.seen.distinct()
			if n >= expected {
				break
			}
			if n != seen {
				seen, progressAt = n, time.Now()
			} else if time.Since(progressAt) >= bc.drainTimeout+waitExtra {
				break
			}
			select {
			case <-tick:
				report()
			case <-poll.C:
			case <-ctx.Done():
			}
		}
		cons.stop()
	}

	sec := produceTime.Seconds()
	sum := &benchSummary{
		Topic: bc.topic, Partitions: nparts, Producers: bc.producers, Consumers: min(bc.consumers, nparts), ConsumeMode: "pull",
		Size: bc.size, Acks: map[heraldpb.Acks]string{cliAcksAll: "all", cliAcksLeader: "leader", cliAcksNone: "none"}[bc.acks], Isolation: bc.isolation,
		Rate: bc.rate, Seconds: sec,
		Produced: stats.produced.Load(), ProduceErrors: stats.produceErrs.n.Load(), FirstError: stats.produceErrs.firstText(),
		ProduceTimeouts: stats.produceTimeouts.Load(), Throttled: stats.throttled.Load(), Retries: stats.retries.Load(),
		ConsumeErrors: stats.consumeErrs.n.Load(), FirstConsumeError: stats.consumeErrs.firstText(),
		Ignored: stats.ignored.Load(),
	}
	if bc.producers == 0 {
		sum.Seconds = 0
	}
	if bc.group != "" {
		sum.Consumers, sum.ConsumeMode, sum.Group, sum.Window, sum.AutoAck, sum.Concurrency =
			bc.consumers, bc.mode.String(), bc.group, bc.window, bc.autoAck, bc.concurrency
		sum.Redelivered = push.redelivered
	}
	if len(stats.acks) > 0 {
		h := newBenchHistogram()
		for _, k := range stats.acks {
			k.mu.Lock()
			h.Merge(k.hist)
			k.mu.Unlock()
		}
		sum.AckLatencyP50Ms, sum.AckLatencyP90Ms = usToMs(h.ValueAtQuantile(50)), usToMs(h.ValueAtQuantile(90))
		sum.AckLatencyP99Ms, sum.AckLatencyP999Ms = usToMs(h.ValueAtQuantile(99)), usToMs(h.ValueAtQuantile(99.9))
		sum.AckLatencyMaxMs = usToMs(h.Max())
	}
	if bc.txnSize > 0 {
		h := newBenchHistogram()
		for _, k := range stats.commits {
			k.mu.Lock()
			h.Merge(k.hist)
			k.mu.Unlock()
		}
		sum.TxnSize, sum.Transactions, sum.TxnFailed = bc.txnSize, stats.transactions.Load(), stats.txnFailed.Load()
		sum.TxnInFlightMax = stats.txnInFlightMax.Load()
		sum.TransactionsPerSec = perSec(float64(sum.Transactions), sec)
		sum.CommitP50Ms, sum.CommitP90Ms, sum.CommitP99Ms = usToMs(h.ValueAtQuantile(50)), usToMs(h.ValueAtQuantile(90)), usToMs(h.ValueAtQuantile(99))
		sum.CommitMaxMs = usToMs(h.Max())
	}
	sum.ProducedPerSec = perSec(float64(sum.Produced), sec)
	sum.ProducedMBPerSec = perSec(float64(stats.producedBytes.Load())/1e6, sec)
	if bc.consumers > 0 {
		iv := stats.collect()
		sum.Expected, sum.Consumed = expected, iv.consumed
		sum.Missing = max(expected-iv.consumed, 0)
		sum.Duplicates, sum.UnexpectedDuplicates = stats.seen.dups()
		if iv.lastNs > 0 {
			sum.ConsumeSeconds = time.Duration(iv.lastNs - start.UnixNano()).Seconds()
		}
		sum.ConsumedPerSec = perSec(float64(iv.consumed), sum.ConsumeSeconds)
		sum.ConsumedMBPerSec = perSec(float64(iv.bytes)/1e6, sum.ConsumeSeconds)
		if stats.latency {
			stats.mu.Lock()
			h := stats.total
			sum.LatencyP50Ms, sum.LatencyP90Ms = usToMs(h.ValueAtQuantile(50)), usToMs(h.ValueAtQuantile(90))
			sum.LatencyP99Ms, sum.LatencyP999Ms = usToMs(h.ValueAtQuantile(99)), usToMs(h.ValueAtQuantile(99.9))
			sum.LatencyMaxMs = usToMs(h.Max())
			stats.mu.Unlock()
		}
	}
	return sum, nil
}

// benchPull is the pull consumers: consumer j reads partitions j, j+C,
// j+2C, ... on its own connection, one goroutine and benchSink per
// partition, each partition from the high watermark resolved at start.
type benchPull struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startBenchPull(ctx context.Context, bc *benchConfig, dial func() (*client.Client, error), clock benchClock, stats *benchStats) (*benchPull, error) {
	consCtx, cancel := context.WithCancel(ctx)
	bp := &benchPull{cancel: cancel}
	for j := 0; j < bc.consumers && j < bc.partitions; j++ {
		c, err := dial()
		if err != nil {
			bp.stop()
			return nil, err
		}
		for p := j; p < bc.partitions; p += bc.consumers {
			pc := c.NewPartitionConsumer(bc.topic, int32(p), client.Latest(), client.WithFetchMaxWait(100*time.Millisecond))
			if err := pc.Resolve(ctx); err != nil {
				bp.stop()
				return nil, err
			}
			k := stats.newSink()
			bp.wg.Add(1)
			go func() {
				defer bp.wg.Done()
				for consCtx.Err() == nil {
					ms, err := pc.Poll(consCtx)
					if err != nil {
						if consCtx.Err() == nil && !client.IsRetryable(err) {
							stats.consumeErrs.add(fmt.Errorf("consume partition %d: %w", pc.Partition(), err))
							return
						}
						continue
					}
					now := clock.now()
					k.mu.Lock()
					for _, m := range ms {
						stats.takeLocked(k, now, m.Value, false, m.Headers)
					}
					k.mu.Unlock()
				}
			}()
		}
	}
	return bp, nil
}

func (bp *benchPull) stop() {
	bp.cancel()
	bp.wg.Wait()
}

// benchPush is the push consumers: --consumers members of --group, each
// with its own connection and benchSink. Once the run has what it expects
// (stopped), handlers nack what still arrives, and stop closes the
// subscriptions, which flushes their acks.
type benchPush struct {
	subs        []*client.Subscription
	stopped     atomic.Bool
	once        sync.Once
	closeWait   time.Duration
	stats       *benchStats
	redelivered int64 // set by stop
}

func startBenchPush(ctx context.Context, bc *benchConfig, dial func() (*client.Client, error), clock benchClock, stats *benchStats) (*benchPush, error) {
	bp := &benchPush{stats: stats, closeWait: max(bc.cf.timeout, 5*time.Second)}
	for j := 0; j < bc.consumers; j++ {
		c, err := dial()
		if err != nil {
			bp.stop()
			return nil, err
		}
		k := stats.newSink()
		opts := client.SubscribeOptions{
			Group: bc.group, Topic: bc.topic, Mode: bc.mode, Window: bc.window, AutoAck: bc.autoAck,
			Concurrency: bc.concurrency, From: bc.from, Name: fmt.Sprintf("herald-bench-%d", j), RetryPolicy: bc.retryPolicy,
			OnError: func(err error) { stats.consumeErrs.add(fmt.Errorf("consumer %d: %w", j, err)) },
		}
		sub, err := c.Subscribe(ctx, opts, func(_ context.Context, d *client.Delivered) {
			now := clock.now()
			if bp.stopped.Load() {
				d.Nack(time.Second) // not ours to count: leave it to the group (no-op with auto-ack)
				return
			}
			if bc.failRatio > 0 && d.DeliveryCount == 1 && len(d.Value) >= benchHeader &&
				float64(binary.BigEndian.Uint64(d.Value[8:])%1000) < bc.failRatio*1000 {
				d.Fail("herald bench --fail-ratio") // counted when it comes back
				return
			}
			k.mu.Lock()
			stats.takeLocked(k, now, d.Value, d.DeliveryCount > 1, d.Headers)
			k.mu.Unlock()
			d.Ack() // no-op with auto-ack
		})
		if err != nil {
			bp.stop()
			return nil, fmt.Errorf("subscribe consumer %d: %w", j, err)
		}
		bp.subs = append(bp.subs, sub)
	}
	return bp, nil
}

// stop closes the subscriptions in parallel; failures (acks lost) count as
// consumer errors. Calls after the first do nothing.
func (bp *benchPush) stop() {
	bp.once.Do(func() {
		bp.stopped.Store(true)
		ctx, cancel := context.WithTimeout(context.Background(), bp.closeWait)
		defer cancel()
		var wg sync.WaitGroup
		errs := make([]error, len(bp.subs))
		for j, sub := range bp.subs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[j] = sub.Close(ctx)
			}()
		}
		wg.Wait()
		for j, sub := range bp.subs {
			if errs[j] != nil {
				bp.stats.consumeErrs.add(fmt.Errorf("close consumer %d: %w", j, errs[j]))
			}
			bp.redelivered += int64(sub.Stats().Redelivered)
		}
	})
}

// benchProduce runs one producer until prodCtx ends or n records (n >= 0)
// were sent, then flushes within ctx. Under --rate it paces to its share of
// the rate, open loop: each record is stamped with its intended send time.
func benchProduce(prodCtx, ctx context.Context, c *client.Client, bc *benchConfig, id int, n int64, start time.Time, clock benchClock, stats *benchStats, live *atomic.Pointer[client.Producer]) error {
	p := c.NewProducer(client.WithAcks(bc.acks), client.WithLinger(bc.linger), client.WithBatchBytes(bc.batchBytes), client.WithBufferBytes(bc.bufferBytes),
		client.WithUnpartitionedInFlight(bc.inFlight*max(bc.partitions, 1)), client.WithPartitionInFlight(bc.inFlight),
		client.WithManualPartitions()) // each producer spreads its records over the partitions itself, below
	live.Store(p)
	defer func() {
		st := p.Stats()
		live.Store(nil)
		stats.throttled.Add(int64(st.Throttled))
		stats.retries.Add(int64(st.Retries))
	}()
	ack := stats.acks[id]
	var interval time.Duration
	if bc.rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(bc.producers) / bc.rate)
	}
	cb := func(_ client.Result, err error, stamp int64) {
		if err != nil {
			if prodCtx.Err() == nil || !(err == context.Canceled || err == context.DeadlineExceeded) {
				stats.produceErrs.add(err)
				if errors.Is(err, client.ErrRequestTimeout) || errors.Is(err, context.DeadlineExceeded) {
					stats.produceTimeouts.Add(1)
				}
			}
			return
		}
		stats.produced.Add(1)
		stats.producedBytes.Add(int64(bc.size))
		us := max(clock.now()-stamp, 0) / int64(time.Microsecond)
		ack.mu.Lock()
		_ = ack.hist.RecordValue(min(max(us, 1), ack.hist.HighestTrackableValue()))
		ack.mu.Unlock()
	}
	recs := newBenchRecords(bc, id)
	for seq := int64(0); n < 0 || seq < n; seq++ {
		if prodCtx.Err() != nil {
			break
		}
		stamp := pace(prodCtx, start, interval, seq, clock)
		if prodCtx.Err() != nil {
			break
		}
		m := recs.next(stamp, seq)
		m.Partition, m.Delay = int32((int(seq)+id)%bc.partitions), bc.delay
		if bc.fireRate > 0 {
			i := seq*int64(bc.producers) + int64(id)
			m.DeliverAt = start.Add(bc.fireAfter + time.Duration(float64(i)/bc.fireRate*float64(time.Second)))
		}
		if bc.acked != nil {
			seq := seq
			p.SendAsync(prodCtx, m, func(r client.Result, err error) {
				if err == nil {
					bc.acked.add(id, seq)
				}
				cb(r, err, stamp)
			})
			continue
		}
		p.SendAsync(prodCtx, m, func(r client.Result, err error) { cb(r, err, stamp) })
	}
	// Flush what was accepted even after SIGINT, but not forever: give
	// up once no record completed for --drain-timeout. A producer that
	// was throttled still drains, at its share of the broker's rate.
	closeCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		last, at := p.Buffered(), time.Now()
		for {
			select {
			case <-closeCtx.Done():
				return
			case <-t.C:
			}
			if n := p.Buffered(); n != last {
				last, at = n, time.Now()
			} else if time.Since(at) >= bc.drainTimeout {
				cancel()
				return
			}
		}
	}()
	err := p.Close(closeCtx)
	if ctx.Err() != nil {
		return nil // interrupted: report what was done
	}
	return err
}

// runReported runs a benchmark with progress on stdout, or on stderr when
// asJSON (the summary then goes to stdout as JSON), and writes its summary.
func runReported[S interface{ print(io.Writer) }](cio cliIO, asJSON bool, run func(progress progressWriter) (S, error)) (S, error) {
	progress := cio.out
	if asJSON {
		progress = cio.err
	}
	sum, err := run(progress)
	if err != nil {
		return sum, cliOneLine(err)
	}
	if asJSON {
		enc := json.NewEncoder(cio.out)
		enc.SetIndent("", "  ")
		return sum, enc.Encode(sum)
	}
	sum.print(cio.out)
	return sum, nil
}

// progressWriter is io.Writer under a name the commands' cliIO parameter
// (called io) does not shadow.
type progressWriter = io.Writer

// pace is a rate-paced producer's record seq: with an interval it waits
// until the record's due time (start + seq*interval; returning early when
// ctx ends) and stamps the record with that time, so latency counts from
// when the record was due; without one the stamp is now.
func pace(ctx context.Context, start time.Time, interval time.Duration, seq int64, clock benchClock) int64 {
	if interval <= 0 {
		return clock.now()
	}
	due := time.Duration(seq) * interval
	if d := due - time.Since(start); d > time.Millisecond {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	return start.UnixNano() + int64(due)
}

// benchRecords makes a bench producer's records: each its own
// (capacity-capped) value and message, never modified after SendAsync,
// allocated benchChunk at a time.
type benchRecords struct {
	bc           *benchConfig
	id           int
	chunk        int
	filler       []byte
	values, keys []byte
	msgs         []client.Message
}

func newBenchRecords(bc *benchConfig, id int) *benchRecords {
	filler := make([]byte, bc.size-benchHeader)
	for i := range filler {
		filler[i] = byte('a' + i%26)
	}
	return &benchRecords{bc: bc, id: id, chunk: max(1, min(benchChunk, benchChunkBytes/bc.size)), filler: filler}
}

// next is record seq of the producer, stamped: to bc.topic, with its key
// when bc.keys is set.
func (r *benchRecords) next(stamp, seq int64) *client.Message {
	bc := r.bc
	if len(r.msgs) == 0 {
		r.values = make([]byte, r.chunk*bc.size)
		r.msgs = make([]client.Message, r.chunk)
		if bc.keys > 0 {
			r.keys = make([]byte, r.chunk*4)
		}
	}
	v := r.values[:bc.size:bc.size]
	r.values = r.values[bc.size:]
	m := &r.msgs[0]
	r.msgs = r.msgs[1:]
	binary.BigEndian.PutUint64(v, uint64(stamp))
	binary.BigEndian.PutUint64(v[8:], uint64(r.id)<<benchSeqBits|uint64(seq))
	copy(v[benchHeader:], r.filler)
	*m = client.Message{Topic: bc.topic, Value: v}
	if bc.keys > 0 {
		m.Key = r.keys[:4:4]
		r.keys = r.keys[4:]
		binary.BigEndian.PutUint32(m.Key, uint32(seq%int64(bc.keys)))
	}
	return m
}
