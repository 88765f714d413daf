package txn

// The transaction coordinator's options and their defaults.

import (
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
)

// Pusher writes an encoded server push to a client connection (its session
// actor); the broker hands in the network server's.
type Pusher interface {
	SendRaw(conn *actor.PID, frame []byte)
}

// Options configure the transaction coordinator.
type Options struct {
	Topics *registry.Registry
	Logger *slog.Logger
	// Push writes HalfCheck pushes to producers' connections.
	Push Pusher
	// CheckInterval is the default wait before a half message's first
	// check-back (HalfOptions.check_interval_ms overrides it). Default 6 s.
	CheckInterval time.Duration
	// MaxChecks is the default number of check-backs before the exhausted
	// policy applies. Default 15.
	MaxChecks uint32
	// MaxPending bounds the half messages pending (waiting for an outcome,
	// or committed and waiting for their time or their append); more are
	// refused with THROTTLED. Default 100,000.
	MaxPending int
	// MaxProducers bounds the producer registrations (connection, group);
	// more are refused with THROTTLED. Default 65,536.
	MaxProducers int
	// MaxQueued bounds the requests waiting for a write to __txn (and, while
	// the coordinator loads, for it to finish); more get THROTTLED.
	// Default 65,536.
	MaxQueued int
	// WriteBytes is the most one write to __txn packs (one event alone may
	// exceed it). Default 1 MiB.
	WriteBytes int
	// MaxDelay bounds a half message's delivery delay. Default 366 days.
	MaxDelay time.Duration
	// Heartbeat is how often producers repeat their registration.
	// Default 2 s; a registration not repeated for 3 heartbeats lapses.
	Heartbeat time.Duration
	// CompactCheck is how often the records of __txn below the oldest
	// pending half are removed. Default 10 s.
	CompactCheck time.Duration
	// MaxChecksInFlight bounds the check-backs reading their half from
	// __txn at once; due ones wait for the next tick. Default 256.
	MaxChecksInFlight int
	// TxnTimeout is the default transaction timeout (InitProducerId's
	// transaction_timeout_ms 0); MaxTxnTimeout the largest one allowed.
	// Defaults 60 s and 15 min. An open transaction older than its timeout
	// is aborted; TxnSweep is how often they are looked for (default 1 s).
	TxnTimeout    time.Duration
	MaxTxnTimeout time.Duration
	TxnSweep      time.Duration
	// OpenTxnSweep is how often the coordinator asks every partition's
	// leader for the transactions written once open there longer than
	// this, and ends the ones nobody will (markers.go). Default 10 s.
	OpenTxnSweep time.Duration
	// FenceWait bounds how long InitProducerId of a new session waits for
	// every partition's leader to hold the fence of the session it
	// replaces (default 5 s); past it the session starts, and the
	// partitions not reached yet are fenced as their leaders answer.
	FenceWait time.Duration
	// Now is the clock; nil = time.Now.
	Now func() time.Time
	// GroupOffsets applies a committed transaction's offsets of one
	// consumer group (a CommitTxnOffsets frame) at the groups
	// coordinator, wherever it runs, and returns its answer. It may
	// block (the coordinator calls it from a goroutine of its own).
	GroupOffsets func(*heraldpb.Frame) (*heraldpb.Frame, error)

	// crashAfterAppend (tests) is asked after a committed half is appended
	// and before its HalfDone is written: true panics the actor there.
	crashAfterAppend func() bool
	// crashAfterRoutedAppend (tests) is asked after each batch of a
	// routed publish is appended; true panics the actor there.
	crashAfterRoutedAppend func() bool
	// failScan (tests), when it answers true, turns the answer to one read
	// of a recovery scan into an INTERNAL error.
	failScan func() bool
	// holdAppends (tests), while it answers true, keeps committed
	// transactions from starting their appends.
	holdAppends func() bool
	// holdWrites (tests), while it answers true, keeps writes to __txn
	// queued.
	holdWrites func() bool
	// epochOf (tests) gives the coordinator's epoch instead of the term of
	// __txn's leader.
	epochOf func() uint64
	// interceptAppend (tests) is shown each append before it is sent to
	// partition pid; true keeps it from being sent (the test holds it).
	interceptAppend func(pid *actor.PID, f *heraldpb.Frame) bool
	// failSweep (tests) is shown each sweep before it is sent; true fails
	// it as a leader that did not answer would.
	failSweep func(req *heraldpb.ListOpenTxnsRequest) bool
	// onePhaseLease (tests) replaces onePhaseLease.
	onePhaseLease time.Duration
}

func (o *Options) ensureDefaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.CheckInterval <= 0 {
		o.CheckInterval = 6 * time.Second
	}
	if o.MaxChecks == 0 {
		o.MaxChecks = 15
	}
	if o.MaxPending <= 0 {
		o.MaxPending = 100_000
	}
	if o.MaxProducers <= 0 {
		o.MaxProducers = 65_536
	}
	if o.MaxQueued <= 0 {
		o.MaxQueued = 65_536
	}
	if o.WriteBytes <= 0 {
		o.WriteBytes = 1 << 20
	}
	if o.MaxDelay <= 0 {
		o.MaxDelay = 366 * 24 * time.Hour
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 2 * time.Second
	}
	if o.CompactCheck <= 0 {
		o.CompactCheck = 10 * time.Second
	}
	if o.MaxChecksInFlight <= 0 {
		o.MaxChecksInFlight = 256
	}
	if o.TxnTimeout <= 0 {
		o.TxnTimeout = time.Minute
	}
	if o.MaxTxnTimeout <= 0 {
		o.MaxTxnTimeout = 15 * time.Minute
	}
	o.MaxTxnTimeout = max(o.MaxTxnTimeout, o.TxnTimeout)
	if o.FenceWait <= 0 {
		o.FenceWait = 5 * time.Second
	}
	if o.OpenTxnSweep <= 0 {
		o.OpenTxnSweep = 10 * time.Second
	}
	if o.TxnSweep <= 0 {
		o.TxnSweep = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}
