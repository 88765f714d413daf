package consumer

// Options and their defaults for the groups manager and its coordinators.

import (
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"github.com/heraldmq/herald/retry"
)

// GroupsTopic is the internal topic that holds every group's progress.
const GroupsTopic = "__groups"

// Options configure the groups manager and its coordinators.
type Options struct {
	Topics *registry.Registry
	Dir    *Directory
	Logger *slog.Logger
	// Breaker configures every member's circuit breaker.
	Breaker BreakerConfig
	// FetchMaxBytes bounds one read of a partition for a group; 0 = 1 MiB.
	FetchMaxBytes int
	// FetchWait is the long-poll wait of a group caught up with a
	// partition; 0 = 5 s.
	FetchWait time.Duration
	// FlushDelay is how long progress that no client waits for (auto-ack,
	// filtered messages, timeouts) may stay unwritten; 0 = 100 ms.
	FlushDelay time.Duration
	// MaxCallQueue bounds the request-reply calls a group holds while no
	// responder has credit; 0 = 4096. Beyond it calls are dropped.
	MaxCallQueue int
	// MaxQueued bounds the requests the manager holds while it loads
	// __groups, and the subscribes a coordinator holds while it resolves
	// start positions; 0 = 4096. Beyond it they get THROTTLED.
	MaxQueued int
	// Push writes an encoded push straight to a connection by its session
	// id (netio.Server.Push); nil sends pushes through the connection's
	// session actor. Set it before the first subscription.
	Push func(id string, frame []byte) bool
	// PushRoom reports how many bytes of pushes a connection (by session
	// id) can take now (netio.Server.PushRoom); <= 0 holds delivery to its
	// members, credits untouched, until it has room again. nil: no bound
	// but credits.
	PushRoom func(id string) int
	// Writer writes to a connection through its session actor (the
	// broker's netio.Server); required once members subscribe.
	Writer SessionWriter
	// DefaultAckTimeout applies when a subscription gives none; 0 = 30 s.
	DefaultAckTimeout time.Duration
	// CompactBytes is the size of __groups above which the manager
	// compacts it; 0 = 64 MiB. CompactCheck is how often it looks; 0 = 30 s.
	CompactBytes int64
	CompactCheck time.Duration
	// RetryPolicy applies to subscriptions that name none; the zero policy
	// is retry.DefaultPolicy().
	RetryPolicy retry.Policy
	// TopicManager is the topic manager, which creates a group's
	// dead-letter topic on its first dead letter (CreateTopic). Without it
	// dead letters wait until the topic exists.
	TopicManager *actor.PID
	// DeadLetterTimeout bounds the wait for the answer to a dead-letter
	// append or topic creation, after which it is retried; 0 = 30 s.
	DeadLetterTimeout time.Duration
	// IdleStop is how long a group's coordinator lives on with no members
	// before it stops (its progress is durable in __groups, and the
	// manager keeps its summary and lag gauges current and starts it again
	// on its next request); 0 = 10 min, negative = never.
	IdleStop time.Duration
	// Clock reads the time and sets the timers; nil = the system clock.
	Clock Clock
}

// SessionWriter is what the consumer room needs of the network server to
// write to a connection through the connection's session actor (in order
// with the responses it writes): an encoded push, or a frame followed by a
// message of the room's own once it is written. The broker supplies it
// (netio.Server), so that the room does not import the network layer.
type SessionWriter interface {
	SendRaw(conn *actor.PID, frame []byte)
	WriteThen(conn *actor.PID, f *heraldpb.Frame, notify *actor.PID, done any)
}

// Clock is how the groups manager and its coordinators read time and set
// timers, so tests can move them.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine after d.
	AfterFunc(d time.Duration, f func())
}

type systemClock struct{}

func (systemClock) Now() time.Time                      { return time.Now() }
func (systemClock) AfterFunc(d time.Duration, f func()) { time.AfterFunc(d, f) }

func (o *Options) ensureDefaults() {
	if o.FetchMaxBytes == 0 {
		o.FetchMaxBytes = 1 << 20
	}
	if o.FetchWait == 0 {
		o.FetchWait = 5 * time.Second
	}
	if o.FlushDelay == 0 {
		o.FlushDelay = 100 * time.Millisecond
	}
	if o.MaxCallQueue == 0 {
		o.MaxCallQueue = 4096
	}
	if o.MaxQueued == 0 {
		o.MaxQueued = 4096
	}
	if o.DefaultAckTimeout == 0 {
		o.DefaultAckTimeout = DefaultAckTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.CompactBytes == 0 {
		o.CompactBytes = 64 << 20
	}
	if o.CompactCheck == 0 {
		o.CompactCheck = 30 * time.Second
	}
	o.RetryPolicy = o.RetryPolicy.WithDefaults()
	if o.DeadLetterTimeout == 0 {
		o.DeadLetterTimeout = 30 * time.Second
	}
	if o.IdleStop == 0 {
		o.IdleStop = DefaultIdleStop
	}
	if o.Clock == nil {
		o.Clock = systemClock{}
	}
}

// DefaultIdleStop is Options.IdleStop's default.
const DefaultIdleStop = 10 * time.Minute
