package client

import (
	"crypto/tls"
	"log/slog"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Option configures a Client (Dial). Producer and consumer settings have
// their own option types, ProducerOpt and ConsumerOpt, so that one cannot be
// passed where the other is expected.
type Option interface{ applyClient(*clientConfig) }

// ProducerOpt configures a Producer (Client.NewProducer).
type ProducerOpt interface{ applyProducer(*producerConfig) }

// ConsumerOpt configures a PartitionConsumer or Consumer.
type ConsumerOpt interface{ applyConsumer(*consumerConfig) }

type clientOpt func(*clientConfig)

func (f clientOpt) applyClient(c *clientConfig) { f(c) }

type producerOpt func(*producerConfig)

func (f producerOpt) applyProducer(c *producerConfig) { f(c) }

type consumerOpt func(*consumerConfig)

func (f consumerOpt) applyConsumer(c *consumerConfig) { f(c) }

// Client defaults.
const (
	DefaultDialTimeout    = 10 * time.Second
	DefaultRequestTimeout = 30 * time.Second
	// DefaultMaxInFlight is the in-flight window the client asks for in
	// Hello. The broker may negotiate it down.
	DefaultMaxInFlight = 256
	// DefaultMetadataMaxAge is how long cached topic metadata (partition
	// counts, leaders) is trusted before it is fetched again.
	DefaultMetadataMaxAge = 30 * time.Second
)

type clientConfig struct {
	clientID       string
	dialTimeout    time.Duration
	requestTimeout time.Duration
	maxInFlight    uint32
	maxFrameBytes  uint32
	metadataMaxAge time.Duration
	logger         *slog.Logger
	tls            *tls.Config
	login          *scramLogin // WithSCRAM; nil = no login
	vhost          string      // WithVhost; "" = the default
}

func defaultClientConfig() clientConfig {
	return clientConfig{
		clientID:       "herald-go",
		dialTimeout:    DefaultDialTimeout,
		requestTimeout: DefaultRequestTimeout,
		maxInFlight:    DefaultMaxInFlight,
		maxFrameBytes:  heraldpb.DefaultMaxFrameBytes,
		metadataMaxAge: DefaultMetadataMaxAge,
		logger:         slog.New(slog.DiscardHandler),
	}
}

// WithVhost makes every connection work in vhost (a tenant): every topic,
// group, transactional id and producer group the client names is that
// vhost's, and it sees nothing of the others. Default: the default vhost
// "/". A vhost that does not exist fails Dial with VHOST_NOT_FOUND.
func WithVhost(vhost string) Option { return clientOpt(func(c *clientConfig) { c.vhost = vhost }) }

// WithClientID names the client in Hello (for broker logs and metrics).
func WithClientID(id string) Option { return clientOpt(func(c *clientConfig) { c.clientID = id }) }

// WithDialTimeout bounds a TCP dial plus the Hello exchange. Default 10s.
func WithDialTimeout(d time.Duration) Option {
	return clientOpt(func(c *clientConfig) { c.dialTimeout = d })
}

// WithRequestTimeout bounds each request's wait for its response, on top of
// any deadline of the caller's context (a Fetch adds its long-poll wait).
// A request that times out fails with ErrRequestTimeout. Default 30s; zero or
// negative means no client-side timeout.
func WithRequestTimeout(d time.Duration) Option {
	return clientOpt(func(c *clientConfig) { c.requestTimeout = d })
}

// WithMaxInFlight sets the in-flight window the client asks for per
// connection (default 256). The broker answers with the negotiated window and
// the client never has more requests outstanding on a connection than that.
func WithMaxInFlight(n int) Option {
	return clientOpt(func(c *clientConfig) {
		if n > 0 {
			c.maxInFlight = uint32(n)
		}
	})
}

// WithMaxFrameBytes sets the largest frame the client asks to send or
// receive (default heraldpb.DefaultMaxFrameBytes). The broker may lower it.
func WithMaxFrameBytes(n int) Option {
	return clientOpt(func(c *clientConfig) {
		if n > 0 {
			c.maxFrameBytes = uint32(n)
		}
	})
}

// WithMetadataMaxAge sets how long cached metadata is used. Default 30s.
func WithMetadataMaxAge(d time.Duration) Option {
	return clientOpt(func(c *clientConfig) { c.metadataMaxAge = d })
}

// WithLogger sets the logger for connection events. Default: discard.
// WithTLS connects to the brokers with TLS (1.3) configured by cfg: its
// RootCAs verify the brokers' certificates (nil: the system's roots) and
// its Certificates, if any, are the client certificate for brokers that
// require one. The addresses given to Dial must be the brokers' TLS
// listeners (herald serve --listen-tls). ServerName defaults to the host
// of each address dialled.
func WithTLS(cfg *tls.Config) Option {
	return clientOpt(func(c *clientConfig) { c.tls = cfg })
}

func WithLogger(l *slog.Logger) Option {
	return clientOpt(func(c *clientConfig) {
		if l != nil {
			c.logger = l
		}
	})
}

// Producer defaults.
const (
	DefaultLinger          = 5 * time.Millisecond
	DefaultBatchBytes      = 256 << 10
	DefaultBufferBytes     = 32 << 20
	DefaultMaxRetries      = 10
	DefaultRetryBackoffMin = 10 * time.Millisecond
	DefaultRetryBackoffMax = time.Second
	// DefaultFailoverTimeout is how long a batch keeps being retried while
	// its partition's leader is moving (see WithFailoverTimeout).
	DefaultFailoverTimeout = 30 * time.Second
	// failoverBackoff caps the wait between retries while a leader moves:
	// a new leader is usually elected within about a second, and waiting
	// the full exponential backoff would add up to a second more.
	failoverBackoff = 50 * time.Millisecond
	// DefaultMaxInFlightUnpartitioned is how many batches without a
	// partition (no key, and no WithManualPartitions) may be in flight per
	// topic when the broker chooses their partition.
	DefaultMaxInFlightUnpartitioned = 4
)

type producerConfig struct {
	idempotent  bool
	acks        heraldpb.Acks
	linger      time.Duration
	batchBytes  int
	bufferBytes int64
	nonBlocking bool
	maxRetries  int
	backoffMin  time.Duration
	backoffMax  time.Duration
	failover    time.Duration
	anyInFlight int
	// manual: Message.Partition is honoured (WithManualPartitions);
	// otherwise the producer ignores it and picks the partition itself.
	manual bool
	// partInFlight is the batches in flight per partition (1 keeps order
	// across retries).
	partInFlight int
}

func defaultProducerConfig() producerConfig {
	return producerConfig{
		idempotent:   true,
		acks:         AcksAll,
		linger:       DefaultLinger,
		batchBytes:   DefaultBatchBytes,
		bufferBytes:  DefaultBufferBytes,
		maxRetries:   DefaultMaxRetries,
		backoffMin:   DefaultRetryBackoffMin,
		backoffMax:   DefaultRetryBackoffMax,
		failover:     DefaultFailoverTimeout,
		anyInFlight:  DefaultMaxInFlightUnpartitioned,
		partInFlight: 1,
	}
}

// WithIdempotence turns the idempotent producer on (the default, as in
// Kafka since 3.0) or off. The producer then has a random 64-bit producer
// id and numbers the records it sends to each partition; the partition's
// leader writes each batch once, so a retry after a lost response, a
// timeout or a leader change never stores a record twice. Records without
// a key (and without WithManualPartitions) get their partition from the
// producer (a batch at a time, round-robin over the topic's partitions,
// from metadata) instead of the broker, and at most 5 batches per
// partition are in flight (WithPartitionInFlight above 5 counts as 5).
// Delayed messages (DeliverAt, Delay) carry a producer id of their own and
// a sequence per batch: the scheduler answers a retry of a batch it stored
// within its dedup window (2 min) with the first attempt's schedule id.
//
// A batch the broker refuses with OUT_OF_ORDER_SEQUENCE fails its records
// with that *Error (not retryable). After a batch fails for good (an
// error, retries exhausted, Close giving up) the partition's next batch
// starts a new producer id, so later batches are not refused because of it.
// Off, a retried batch may be written twice (at least once).
func WithIdempotence(on bool) ProducerOpt {
	return producerOpt(func(c *producerConfig) { c.idempotent = on })
}

// WithManualPartitions makes Send and SendAsync write each message to
// Message.Partition exactly, whether or not it has a key, as Kafka clients'
// manual partitioners do. A negative Partition then fails the message with
// ErrInvalidPartition (the producer sends nothing), and one the topic does
// not have fails with the broker's PARTITION_NOT_FOUND *Error.
//
// Without it (the default) the producer ignores Message.Partition and picks
// the partition itself: PartitionForKey(Key, partitions) for a keyed
// message, and for one without a key, round-robin a batch at a time with
// idempotence (WithIdempotence), else the broker's round robin. So the
// zero Message goes to any partition:
//
//	p := c.NewProducer(client.WithManualPartitions())
//	r, err := p.Send(ctx, &client.Message{Topic: "orders", Partition: 2, Value: v})
func WithManualPartitions() ProducerOpt {
	return producerOpt(func(c *producerConfig) { c.manual = true })
}

// WithAcks sets when the broker acknowledges a batch: AcksAll (default,
// after quorum commit), AcksLeader (after the leader's write) or AcksNone
// (on receipt; results carry Offset -1):
//
//	p := c.NewProducer(client.WithAcks(client.AcksLeader))
func WithAcks(a heraldpb.Acks) ProducerOpt {
	return producerOpt(func(c *producerConfig) { c.acks = a })
}

// WithLinger sets how long a batch waits for more records before it is sent
// (default 5ms). Zero sends as soon as the partition has no batch in flight.
func WithLinger(d time.Duration) ProducerOpt {
	return producerOpt(func(c *producerConfig) {
		if d >= 0 {
			c.linger = d
		}
	})
}

// WithBatchBytes caps the encoded size of one produce batch (default
// 256 KiB). A full batch is sent without waiting for the linger. It is also
// capped by the connection's negotiated frame size.
func WithBatchBytes(n int) ProducerOpt {
	return producerOpt(func(c *producerConfig) {
		if n > 0 {
			c.batchBytes = n
		}
	})
}

// WithBufferBytes bounds the bytes of records buffered or in flight (default
// 32 MiB). When it is full SendAsync blocks until space frees up or its
// context ends, or fails at once with ErrBufferFull under WithNonBlocking.
func WithBufferBytes(n int64) ProducerOpt {
	return producerOpt(func(c *producerConfig) {
		if n > 0 {
			c.bufferBytes = n
		}
	})
}

// WithNonBlocking makes SendAsync fail with ErrBufferFull instead of
// blocking when the buffer is full.
func WithNonBlocking() ProducerOpt {
	return producerOpt(func(c *producerConfig) { c.nonBlocking = true })
}

// WithMaxRetries sets how many times a batch is retried after a retryable
// error before its records fail (default 10; 0 = never retry).
func WithMaxRetries(n int) ProducerOpt {
	return producerOpt(func(c *producerConfig) {
		if n >= 0 {
			c.maxRetries = n
		}
	})
}

// WithFailoverTimeout sets how long a batch keeps being retried while its
// partition's leader moves: after NOT_LEADER, a lost connection or no
// broker reachable, retries go on (every 50 ms at most, to the new leader
// once metadata names it) until this long after the first such failure,
// even past WithMaxRetries (default 30s; 0 = only WithMaxRetries counts).
func WithFailoverTimeout(d time.Duration) ProducerOpt {
	return producerOpt(func(c *producerConfig) {
		if d >= 0 {
			c.failover = d
		}
	})
}

// WithRetryBackoff sets the exponential backoff between retries: min, 2*min,
// ... up to max (default 10ms to 1s). A THROTTLED error's retry-after is
// honoured when it is longer.
func WithRetryBackoff(min, max time.Duration) ProducerOpt {
	return producerOpt(func(c *producerConfig) {
		if min > 0 {
			c.backoffMin = min
		}
		if max >= c.backoffMin {
			c.backoffMax = max
		}
	})
}

// WithUnpartitionedInFlight sets how many batches of records with no key
// (and no WithManualPartitions) may be in flight per topic at once
// (default 4) when the broker chooses their partition: without
// idempotence, and for delayed messages. Such records have no order to
// keep, as the broker spreads them round-robin.
func WithUnpartitionedInFlight(n int) ProducerOpt {
	return producerOpt(func(c *producerConfig) {
		if n > 0 {
			c.anyInFlight = n
		}
	})
}

// WithPartitionInFlight sets how many batches per partition may be in flight
// at once (default 1). Above 1 the producer pipelines batches to the same
// partition for throughput: they are written in the order sent unless one
// fails with a retriable error and is retried after a later batch succeeded,
// which reorders them (as Kafka's max.in.flight.requests.per.connection > 1
// without idempotence). Keep 1 where per-key order must survive retries
// without idempotence. With idempotence (the default) the setting is at
// most 5, and order survives retries while the partition remembers the
// producer: a batch refused as out of order while an earlier batch of the
// partition is unresolved is sent again, and a producer id's first batch
// to a partition is sent alone. (A partition that forgot the producer,
// see the README's limits, accepts a later batch before a retried earlier
// one, which then fails with OUT_OF_ORDER_SEQUENCE.)
func WithPartitionInFlight(n int) ProducerOpt {
	return producerOpt(func(c *producerConfig) {
		if n > 0 {
			c.partInFlight = n
		}
	})
}

// Consumer defaults.
const (
	DefaultFetchMaxBytes = 1 << 20
	DefaultFetchMaxWait  = 500 * time.Millisecond
)

type consumerConfig struct {
	maxBytes   int
	maxWait    time.Duration
	backoffMin time.Duration
	backoffMax time.Duration
}

func defaultConsumerConfig() consumerConfig {
	return consumerConfig{
		maxBytes:   DefaultFetchMaxBytes,
		maxWait:    DefaultFetchMaxWait,
		backoffMin: DefaultRetryBackoffMin,
		backoffMax: DefaultRetryBackoffMax,
	}
}

// WithFetchMaxBytes caps the bytes of one fetch response (default 1 MiB; the
// broker returns at least one batch).
func WithFetchMaxBytes(n int) ConsumerOpt {
	return consumerOpt(func(c *consumerConfig) {
		if n > 0 {
			c.maxBytes = n
		}
	})
}

// WithFetchMaxWait sets the long-poll wait of each fetch (default 500ms).
func WithFetchMaxWait(d time.Duration) ConsumerOpt {
	return consumerOpt(func(c *consumerConfig) {
		if d >= 0 {
			c.maxWait = d
		}
	})
}
