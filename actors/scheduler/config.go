package scheduler

// The scheduler's options and their defaults.

import (
	"log/slog"
	"time"

	"github.com/heraldmq/herald/actors/partition"
	"github.com/heraldmq/herald/registry"
	"github.com/heraldmq/herald/timewheel"
)

// Options configure the scheduler actor.
type Options struct {
	Topics *registry.Registry
	Logger *slog.Logger
	// NewFar opens the store of the timers beyond the wheel's near window
	// (65.536 s), empty, each time the actor (re)starts; nil keeps them in
	// memory. The broker opens a timewheel.DiskFar.
	NewFar func() (timewheel.FarStore, error)
	// MaxDelay bounds delay_ms and deliver_at_ms - now. Default 366 days.
	MaxDelay time.Duration
	// MaxPending bounds the delayed batches waiting; more are refused with
	// THROTTLED. Default 100M.
	MaxPending uint64
	// MaxQueued bounds the requests waiting for a write to __schedule (and,
	// while the scheduler loads, for it to finish); more get THROTTLED.
	// Default 65536.
	MaxQueued int
	// WriteBytes is the most one write to __schedule packs (one event
	// alone may exceed it). Default 1 MiB.
	WriteBytes int
	// FireBatch is the most batches one fire round appends. Default 4096.
	FireBatch int
	// Lead is how far ahead of their time due batches are read and
	// announced (the ScheduleFiring write), so that at their time only the
	// append remains: stalls shorter than Lead (a read from disk, a busy
	// mailbox) do not make batches late. Default 1 s: at 50k fires/s on
	// two busy cores a round took 100-300 ms from its start to its
	// announcement, and 250 ms made a tail of them late.
	Lead time.Duration
	// AppendAhead is how long before their time due batches are appended
	// to their partitions, which hold them unreadable until their time
	// (ProduceRequest.not_before_ms): the append's commit (a raft round
	// and an fsync, several ms on a busy node) happens before the time
	// instead of after it. Records appended to the same partition
	// meanwhile wait behind them, at most this long. Default 50 ms; at
	// most partition.MaxHold; negative: append at the time.
	AppendAhead time.Duration
	// MaxHeldBytes bounds the records of announced appends waiting for
	// their time: past it no new round starts until sends free some. A
	// burst of batches due together is then read as it is sent, not all
	// ahead. Default 64 MiB.
	MaxHeldBytes int
	// MaxRounds bounds the fire rounds reading or announcing at once (the
	// announced appends waiting for their time are bounded by Lead).
	// Default 4.
	MaxRounds int
	// DedupWindow is how long the scheduler remembers a delayed batch of
	// an idempotent producer (by producer id and sequence), so that a
	// retry of it is answered with the first attempt's schedule id rather
	// than stored again; __schedule keeps the records of that window.
	// Default 2 min (NATS JetStream's duplicate window); negative: none.
	DedupWindow time.Duration
	// DedupMax bounds the batches remembered; past it the oldest are
	// forgotten first. Default 100,000.
	DedupMax int
	// CompactCheck is how often the records of __schedule below the oldest
	// pending batch are removed. Default 10 s.
	CompactCheck time.Duration
	// RewriteBytes: past this size of __schedule, long-pending batches that
	// hold back its truncation are moved up the log. Default 64 MiB.
	RewriteBytes int64
	// Now is the clock; nil = time.Now. The scheduler reads its wall
	// clock once, when it starts, and from then on advances by its
	// monotonic reading (Scheduler.now): a step of the wall clock while it
	// runs does not move delayed messages.
	Now func() time.Time
	// Anchor, if set, is the wall time the scheduler starts from instead
	// of Now's wall reading: in a cluster, the cluster's time (the median
	// of the nodes' clocks), so that a step of this node's clock before
	// the scheduler starts here does not move the delayed messages the
	// scheduler before it took. It is called once per start, and may
	// take as long as its own bound (it runs before __schedule is read).
	Anchor func() time.Time
	// NoFence: no epoch, no fences (fence.go), as before they existed:
	// while a cluster is upgraded from a version whose partitions refuse
	// an epoch on the scheduler's appends.
	NoFence bool

	// crashAfterAppend (tests) is asked after a round's batches are
	// appended and before their fire is recorded: true panics the actor,
	// as a crash there would stop it.
	crashAfterAppend func() bool
	// epochOf (tests) gives the scheduler's epoch instead of the term of
	// __schedule's leader.
	epochOf func() uint64
}

func (o *Options) ensureDefaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxDelay == 0 {
		o.MaxDelay = 366 * 24 * time.Hour
	}
	if o.MaxPending == 0 {
		o.MaxPending = 100_000_000
	}
	if o.MaxQueued == 0 {
		o.MaxQueued = 65536
	}
	if o.WriteBytes == 0 {
		o.WriteBytes = 1 << 20
	}
	if o.FireBatch == 0 {
		o.FireBatch = 4096
	}
	if o.Lead == 0 {
		o.Lead = time.Second
	}
	if o.MaxRounds == 0 {
		o.MaxRounds = 4
	}
	switch {
	case o.AppendAhead == 0:
		o.AppendAhead = 50 * time.Millisecond
	case o.AppendAhead < 0:
		o.AppendAhead = 0
	case o.AppendAhead > partition.MaxHold:
		o.AppendAhead = partition.MaxHold
	}
	if o.MaxHeldBytes == 0 {
		o.MaxHeldBytes = 64 << 20
	}
	switch {
	case o.DedupWindow == 0:
		o.DedupWindow = 2 * time.Minute
	case o.DedupWindow < 0:
		o.DedupWindow, o.DedupMax = 0, -1
	}
	if o.DedupMax == 0 {
		o.DedupMax = 100_000
	}
	if o.CompactCheck == 0 {
		o.CompactCheck = 10 * time.Second
	}
	if o.RewriteBytes == 0 {
		o.RewriteBytes = 64 << 20
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}
