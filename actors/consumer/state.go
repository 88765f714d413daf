// Package consumer holds Herald's consumer groups: the group coordinator and
// the consumer-session actors, and, in this file and its siblings, their pure
// core (no goroutines, clock, disk or network; time comes in as arguments).
//
//   - Assignor (assign.go): clustering-mode partition assignment, balanced,
//     sticky and incremental (revoke, confirm, then add).
//   - Progress (progress.go): a partition position as an ack floor plus the
//     acked offsets above it, bounded by a max span, stored as
//     heraldpb.PartitionProgress in `__groups`.
//   - Sub (state.go, inflight.go): one group's subscription to one topic in
//     one mode: members and their credits, messages offered from the log,
//     delivery, in-flight tracking, acks, nacks, ack timeouts and
//     redelivery.
//   - Ring (keyshared.go): the consistent hash of key-shared mode.
//   - PriorityPicker (priority.go): which priority level of a partition's
//     pending messages Sub delivers next, by weight.
//
// All of it is owned by one group-coordinator actor and is not safe for
// concurrent use. The actor feeds it log records (Append), membership
// (Join, Leave, Revoked), client requests (Request, Ack, Nack, Commit) and
// time (Deliver, Tick), pushes the Deliveries it returns, sends the Plans to
// members, and stores Encode's records in `__groups`.
package consumer

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/retry"
)

// Mode is how a group's members share a topic's messages.
type Mode uint8

const (
	// Clustering: partitions are assigned to members (Assignor); each
	// message goes to its partition's owner, in partition order.
	Clustering Mode = iota + 1
	// Broadcast: every member receives every message; each member has its
	// own progress (its view), kept when it leaves, so it resumes on rejoin.
	Broadcast
	// Shared: any member takes any message; per-message acks; any number of
	// members.
	Shared
	// KeyShared: like Shared, but a key goes to one member at a time.
	KeyShared
)

var modeNames = map[Mode]string{Clustering: "clustering", Broadcast: "broadcast", Shared: "shared", KeyShared: "key-shared"}

func (m Mode) String() string {
	if s, ok := modeNames[m]; ok {
		return s
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode parses the CLI's mode names.
func ParseMode(s string) (Mode, error) {
	for m, n := range modeNames {
		if n == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown mode %q", ErrBadConfig, s)
}

// Defaults for Config's zero values.
const (
	DefaultAckTimeout = 30 * time.Second
	DefaultMaxCredits = 1 << 16
	DefaultMaxPending = 1024
)

// Config configures one subscription.
type Config struct {
	Mode Mode
	// Partitions is the topic's partition count; at least 1.
	Partitions int
	// AckTimeout is how long a delivered message may stay unacked before it
	// is redelivered. 0 means DefaultAckTimeout.
	AckTimeout time.Duration
	// MaxSpan bounds, per partition, how far past the ack floor delivery may
	// reach (see Progress). 0 means DefaultMaxSpan (64 Ki offsets).
	MaxSpan int
	// AutoAck acknowledges each message as it is delivered: at-most-once.
	AutoAck bool
	// Orderly allows at most one message in flight per partition (per key in
	// key-shared mode). Message priorities are then ignored: offset order
	// wins.
	Orderly bool
	// MaxCredits caps a member's unused credits. 0 means DefaultMaxCredits.
	MaxCredits int
	// MaxPending caps, per partition and view, the messages held for a
	// (re)delivery that is not in flight: offered by Append and not yet
	// delivered, waiting for a retry, or waiting for the dead-letter
	// append. Append refuses more, so while retries fill it the actor reads
	// no new records of that partition. 0 means DefaultMaxPending.
	MaxPending int
	// Retry decides when a failed delivery (a nack without a delay, an ack
	// timeout) is delivered again, and after how many deliveries a message
	// goes to the dead-letter queue instead. The zero policy is
	// retry.DefaultPolicy().
	Retry retry.Policy
	// DeadLetterExpired sends messages whose time-to-live ran out to the
	// dead-letter queue (reason ReasonExpired) instead of dropping them.
	DeadLetterExpired bool
	// Rand draws the jitter of retry delays, uniformly in [0, 1); nil
	// means math/rand/v2.
	Rand func() float64
}

// Validate reports every problem with c at once, after defaults.
func (c Config) Validate() error {
	var errs []string
	if _, ok := modeNames[c.Mode]; !ok {
		errs = append(errs, fmt.Sprintf("mode %d unknown", c.Mode))
	}
	if c.Partitions < 1 {
		errs = append(errs, fmt.Sprintf("partitions %d < 1", c.Partitions))
	}
	for name, v := range map[string]int64{"ack timeout": int64(c.AckTimeout), "max span": int64(c.MaxSpan),
		"max credits": int64(c.MaxCredits), "max pending": int64(c.MaxPending)} {
		if v < 0 {
			errs = append(errs, fmt.Sprintf("%s %d < 0", name, v))
		}
	}
	if err := c.Retry.Validate(); err != nil {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		return fmt.Errorf("%w: %v", ErrBadConfig, errs)
	}
	return nil
}

func (c *Config) ensureDefaults() {
	if c.AckTimeout == 0 {
		c.AckTimeout = DefaultAckTimeout
	}
	if c.MaxSpan == 0 {
		c.MaxSpan = DefaultMaxSpan
	}
	if c.MaxCredits == 0 {
		c.MaxCredits = DefaultMaxCredits
	}
	if c.MaxPending == 0 {
		c.MaxPending = DefaultMaxPending
	}
	c.Retry = c.Retry.WithDefaults()
}

// Sub is one consumer group's subscription to one topic: the pure state the
// group coordinator drives. See the package comment for the division of
// labour.
type Sub struct {
	cfg     Config
	start   []int64 // where a new view starts, per partition
	members map[MemberID]*memberState
	order   []MemberID // live members in join order
	views   map[MemberID]*view
	asg     *Assignor // Clustering
	ring    Ring      // KeyShared
	fl      inflight
	rr      int       // partition Deliver starts with
	expired []Expired // since the last TakeExpired
}

type memberState struct {
	credits int
	view    MemberID // Broadcast: the member itself; else ""
	paused  bool     // its breaker is not closed: it takes no (or only probe) deliveries
}

// view is one progress over the topic: the group's, or in broadcast mode one
// member's.
type view struct {
	prog    []*Progress
	pending [][]Message         // offered, not yet delivered, ascending offsets
	levels  []levels            // per partition: pending's messages by priority
	pickers []*PriorityPicker   // per partition, made when it first has priorities
	next    []int64             // next offset to offer
	ahead   [][]int64           // per partition: offsets at or past next offered ahead (ahead.go), ascending
	scout   [][Priorities]int64 // per partition and level: where its sub-queue's next read starts
}

// levels counts a partition's pending messages by priority level, so that
// Deliver knows in O(Priorities) which levels have messages, and in O(1)
// whether it may take the partition's pending messages in offset order
// (hi == 0).
type levels struct {
	n  [Priorities]int32
	hi int32 // messages above level 0
}

func (l *levels) add(prio uint8) {
	l.n[prio]++
	if prio > 0 {
		l.hi++
	}
}

func (l *levels) del(prio uint8) {
	l.n[prio]--
	if prio > 0 {
		l.hi--
	}
}

// recount rebuilds view w's counts of partition p after pending[p] was
// filtered.
func (w *view) recount(p uint32) {
	w.levels[p] = levels{}
	for _, m := range w.pending[p] {
		w.levels[p].add(m.Priority)
	}
}

// picker is the PriorityPicker of view w's partition p, made on first use.
func (w *view) picker(p uint32) *PriorityPicker {
	pk := w.pickers[p]
	if pk == nil {
		pk = &PriorityPicker{weights: DefaultPriorityWeights()}
		w.pickers[p] = pk
	}
	return pk
}

// clearPending drops view w's offered messages of partition p.
func (w *view) clearPending(p uint32) {
	w.pending[p] = nil
	w.levels[p] = levels{}
	w.pickers[p] = nil
	w.ahead[p] = nil
	w.scout[p] = [Priorities]int64{}
}

// NewSub returns a subscription with no members whose progress starts at
// start[p] for each partition (the resolved earliest, latest, offset or
// timestamp; missing entries mean 0). Restore replaces it with stored
// progress.
func NewSub(cfg Config, start []int64) (*Sub, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.ensureDefaults()
	s := &Sub{
		cfg:     cfg,
		start:   resizeSlice(slices.Clone(start), cfg.Partitions),
		members: map[MemberID]*memberState{},
		views:   map[MemberID]*view{},
		fl:      newInflight(cfg.Orderly && cfg.Mode != KeyShared, cfg.Mode == KeyShared),
	}
	if cfg.Mode == Clustering {
		s.asg = NewAssignor(cfg.Partitions)
	}
	if cfg.Mode != Broadcast {
		s.views[""] = s.newView()
	}
	return s, nil
}

func (s *Sub) newView() *view {
	v := &view{
		prog:    make([]*Progress, s.cfg.Partitions),
		pending: make([][]Message, s.cfg.Partitions),
		levels:  make([]levels, s.cfg.Partitions),
		pickers: make([]*PriorityPicker, s.cfg.Partitions),
		next:    make([]int64, s.cfg.Partitions),
		ahead:   make([][]int64, s.cfg.Partitions),
		scout:   make([][Priorities]int64, s.cfg.Partitions),
	}
	for p := range v.prog {
		v.prog[p] = NewProgress(s.start[p], s.cfg.MaxSpan)
		v.next[p] = v.prog[p].Floor()
	}
	return v
}

// Config returns the configuration with defaults applied.
func (s *Sub) Config() Config { return s.cfg }

// Members lists the live members in join order.
func (s *Sub) Members() []MemberID { return slices.Clone(s.order) }

// Assignor is the clustering-mode assignor (nil in other modes), for
// reading; change membership through Sub.
func (s *Sub) Assignor() *Assignor { return s.asg }

// Join adds m with no credits. In clustering mode the returned plan says
// which partitions move. Errors: ErrMemberExists.
func (s *Sub) Join(m MemberID) (Plan, error) {
	if s.members[m] != nil {
		return nil, fmt.Errorf("%w: %s", ErrMemberExists, m)
	}
	ms := &memberState{}
	var pl Plan
	switch s.cfg.Mode {
	case Clustering:
		var err error
		if pl, err = s.asg.Join(m); err != nil {
			return nil, err
		}
	case Broadcast:
		ms.view = m
		if s.views[m] == nil {
			s.views[m] = s.newView()
		}
	case KeyShared:
		s.ring.Add(m)
	}
	s.members[m] = ms
	s.order = append(s.order, m)
	return pl, nil
}

// Leave removes m, because it left, its session closed or it died: every
// message in flight to it is redelivered (at-least-once), at once and
// preferably elsewhere, and its credits are dropped. In clustering mode its
// partitions are free at once and the plan moves them. A broadcast member's
// view (progress) stays for its return. Errors: ErrUnknownMember.
func (s *Sub) Leave(m MemberID, now time.Time) (Plan, error) {
	if s.members[m] == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnknownMember, m)
	}
	s.fl.release(s.fl.sorted(func(f *flight) bool { return f.member == m }), m, now)
	delete(s.members, m)
	s.order = slices.DeleteFunc(s.order, func(o MemberID) bool { return o == m })
	switch s.cfg.Mode {
	case Clustering:
		return s.asg.Remove(m)
	case KeyShared:
		s.ring.Remove(m)
	}
	return nil, nil
}

// Revoked confirms that m stopped consuming partition p after a plan revoked
// it (clustering mode). Whatever m still has in flight on p is redelivered to
// the new owner, which the returned plan adds. Errors: ErrNotRevoking.
func (s *Sub) Revoked(m MemberID, p uint32, now time.Time) (Plan, error) {
	if s.asg == nil {
		return nil, fmt.Errorf("%w: not clustering mode", ErrNotRevoking)
	}
	pl, err := s.asg.Revoked(m, p)
	if err != nil {
		return nil, err
	}
	s.fl.release(s.fl.sorted(func(f *flight) bool { return f.member == m && f.id.part == p }), m, now)
	return pl, nil
}

// Commit is the Kafka-style commit of clustering mode: m, owning p, declares
// every offset below off done. Flights, redeliveries and offered messages
// below the new floor are dropped. Errors: ErrUnknownMember, ErrNotOwner.
func (s *Sub) Commit(m MemberID, p uint32, off int64) error {
	if s.members[m] == nil {
		return fmt.Errorf("%w: %s", ErrUnknownMember, m)
	}
	if s.asg == nil || !slices.Contains(s.asg.Owned(m), p) {
		return fmt.Errorf("%w: %s partition %d", ErrNotOwner, m, p)
	}
	s.skipTo("", p, off)
	return nil
}

// CommitTo moves the group's floor in p up to off, never back, whoever
// owns p: a committed transaction's consumer group offsets. Flights,
// redeliveries and offered messages below the new floor are dropped, as
// for a commit. Errors: ErrBroadcast, ErrUnknownPartition.
func (s *Sub) CommitTo(p uint32, off int64) error {
	if s.cfg.Mode == Broadcast {
		return ErrBroadcast
	}
	w := s.views[""]
	if w == nil || int(p) >= len(w.prog) {
		return fmt.Errorf("%w: %d", ErrUnknownPartition, p)
	}
	if off > w.prog[p].Floor() {
		s.skipTo("", p, off)
	}
	return nil
}

// skipTo moves view v's floor in partition p up to off, as a commit does:
// flights, retries, dead letters and offered messages below the new floor
// are dropped; what is known at or above it (acks, and messages offered
// ahead of the read, ahead.go) stays.
func (s *Sub) skipTo(v MemberID, p uint32, off int64) {
	w := s.views[v]
	w.prog[p].Commit(off)
	floor := w.prog[p].Floor()
	for _, f := range s.fl.sorted(func(f *flight) bool { return f.id.view == v && f.id.part == p && f.id.off < floor }) {
		s.fl.remove(f.id)
	}
	below := func(r *retryEntry) bool { return r.id.view == v && r.id.part == p && r.id.off < floor }
	s.fl.retry = slices.DeleteFunc(s.fl.retry, below)
	s.fl.dead = slices.DeleteFunc(s.fl.dead, below)
	w.pending[p] = slices.DeleteFunc(w.pending[p], func(m Message) bool { return m.Offset < floor })
	w.recount(p)
	w.next[p] = max(w.next[p], floor)
	w.ahead[p] = slices.DeleteFunc(w.ahead[p], func(o int64) bool { return o < w.next[p] })
}

// Views lists the progress views in order: "" (the group's) or, in
// broadcast mode, one per member that ever joined.
func (s *Sub) Views() []MemberID {
	vs := make([]MemberID, 0, len(s.views))
	for v := range s.views {
		vs = append(vs, v)
	}
	slices.Sort(vs)
	return vs
}

// Progress is view's progress in p, for reading (nil if unknown).
func (s *Sub) Progress(v MemberID, p uint32) *Progress {
	if w := s.views[v]; w != nil && int(p) < len(w.prog) {
		return w.prog[p]
	}
	return nil
}

// Start is where a view with no stored progress starts in p: the start
// position NewSub was given (0 for a partition it has none of).
func (s *Sub) Start(p uint32) int64 {
	if int(p) < len(s.start) {
		return s.start[p]
	}
	return 0
}

// ReadFrom is the offset from which the actor should read p's log for
// view, and how many messages Append would accept now (0: the view is
// paused, by MaxPending or by the span bound). Retries and dead letters
// waiting count against MaxPending, except restored ones whose records
// the reads have not reached yet: reading is what loads them.
func (s *Sub) ReadFrom(v MemberID, p uint32) (off int64, room int) {
	w := s.views[v]
	if w == nil || int(p) >= len(w.prog) {
		return 0, 0
	}
	off = w.next[p]
	room = s.cfg.MaxPending - s.window(w, v, p)
	room = int(min(int64(room), w.prog[p].Limit()-off))
	return off, max(room, 0)
}

// window is how many messages of view v's partition p count against
// MaxPending: offered in offset order (not ahead: they have their own
// bound), and loaded retries and dead letters.
func (s *Sub) window(w *view, v MemberID, p uint32) int {
	n := len(w.pending[p]) - w.aheadPending(p)
	for _, q := range [][]*retryEntry{s.fl.retry, s.fl.dead} {
		i, j := entryRange(q, v, p, math.MinInt64, w.next[p])
		n += j - i
	}
	return n
}

// restored returns the entry (a retry or a dead letter) waiting for the
// record at id, restored from `__groups` and not loaded yet, or nil.
func (s *Sub) restored(id msgID) *retryEntry {
	for _, q := range [][]*retryEntry{s.fl.retry, s.fl.dead} {
		if i := findEntry(q, id); i >= 0 {
			return q[i]
		}
	}
	return nil
}

// lastEntry is the highest offset of view v's partition p with a retry or a
// dead letter, or -1.
func (s *Sub) lastEntry(v MemberID, p uint32) int64 {
	last := int64(-1)
	for _, q := range [][]*retryEntry{s.fl.retry, s.fl.dead} {
		if _, j := entryRange(q, v, p, math.MinInt64, math.MaxInt64); j > 0 && q[j-1].id.view == v && q[j-1].id.part == p {
			last = max(last, q[j-1].id.off)
		}
	}
	return last
}

// dropEntry removes the retry or dead letter id, if any.
func (s *Sub) dropEntry(id msgID) {
	if i := findEntry(s.fl.retry, id); i >= 0 {
		s.fl.retry = slices.Delete(s.fl.retry, i, i+1)
	}
	if i := findEntry(s.fl.dead, id); i >= 0 {
		s.fl.dead = slices.Delete(s.fl.dead, i, i+1)
	}
}

// Append offers committed records of one partition to view, in offset
// order from ReadFrom. It returns how many it took; it stops at the first
// record at or beyond the progress limit (the span bound) or past
// MaxPending. Records below ReadFrom, or already done (after Restore), are
// taken and ignored; skipped (filtered) records are acked at once. A record
// with a restored retry or dead letter loads it (always taken: it was
// counted before the restart) instead of being offered as new. Offsets
// must be dense from ReadFrom: a missing offset holds the floor until Commit
// or a reset moves it (the actor does so when retention removes records).
func (s *Sub) Append(v MemberID, msgs ...Message) int {
	w := s.views[v]
	if w == nil {
		return 0
	}
	// Per partition, computed when Append meets it: the messages counted
	// against MaxPending, and the last offset with a retry or dead letter
	// (a record at or below it may load a restored one).
	cur, held, last := -1, 0, int64(-1)
	for i, msg := range msgs {
		p := msg.Partition
		if int(p) >= len(w.prog) {
			return i
		}
		if msg.Offset < w.next[p] {
			continue
		}
		prog := w.prog[p]
		if msg.Offset >= prog.Limit() {
			return i
		}
		if int(p) != cur {
			cur, held, last = int(p), s.window(w, v, p), s.lastEntry(v, p)
		}
		id := msgID{view: v, part: p, off: msg.Offset}
		var r *retryEntry
		if msg.Offset <= last {
			r = s.restored(id)
		}
		if w.passAhead(p, msg.Offset) && r == nil {
			w.next[p] = msg.Offset + 1
			continue // offered ahead: pending, in flight or done already
		}
		if r == nil && held >= s.cfg.MaxPending {
			return i
		}
		w.next[p] = msg.Offset + 1
		switch {
		case prog.Done(msg.Offset) || msg.Skip:
			if r != nil {
				s.dropEntry(id)
			}
			_ = prog.Ack(msg.Offset)
		case r != nil:
			r.key, r.expires = msg.Key, msg.Expires
			held++
		default:
			msg.Priority = min(msg.Priority, Priorities-1)
			w.insertPending(p, msg)
			w.levels[p].add(msg.Priority)
			held++
		}
	}
	return len(msgs)
}

// Encode returns view's progress as the record the coordinator stores in
// `__groups`.
func (s *Sub) Encode(group, topic string, v MemberID) *heraldpb.GroupProgress {
	w := s.views[v]
	if w == nil {
		return nil
	}
	g := &heraldpb.GroupProgress{Group: group, Topic: topic, Subscriber: string(v)}
	for p, prog := range w.prog {
		pp := prog.Encode(uint32(p))
		pp.Retries = s.encodeRetries(v, uint32(p))
		g.Partitions = append(g.Partitions, pp)
	}
	return g
}

// encodeRetries lists, by offset, what a restart must not forget about
// view v's partition p: retries waiting (their deliveries so far, not
// before when, why the last failed), dead letters waiting for their append
// (likewise), and redeliveries in flight (as retries due at once, with
// the deliveries before the one in flight: if the broker dies, the one in
// flight is as good as lost). First deliveries in flight are not listed:
// they restart from the log with count 1.
func (s *Sub) encodeRetries(v MemberID, p uint32) []*heraldpb.PendingRetry {
	var out []*heraldpb.PendingRetry
	for _, q := range [][]*retryEntry{s.fl.retry, s.fl.dead} {
		for _, r := range entries(q, v, p, math.MinInt64, math.MaxInt64) {
			pr := &heraldpb.PendingRetry{Offset: r.id.off, Deliveries: uint32(r.count), Reason: r.reason}
			if !r.notBefore.IsZero() {
				pr.NotBeforeMs = r.notBefore.UnixMilli()
			}
			out = append(out, pr)
		}
	}
	k := msgID{view: v, part: p}
	if w := s.fl.flights[k]; w != nil && s.fl.redeliv[k] > 0 {
		w.each(func(off int64, f *flight) {
			if f.count > 1 {
				out = append(out, &heraldpb.PendingRetry{Offset: off, Deliveries: uint32(f.count - 1)})
			}
		})
	}
	slices.SortFunc(out, func(a, b *heraldpb.PendingRetry) int { return cmp.Compare(a.Offset, b.Offset) })
	return out
}

// Restore installs stored progress (the latest `__groups` record for the
// view), before any Append or Join of that view's members: the actor then
// reads from each floor, and already-acked offsets are not redelivered.
// Partitions beyond the topic's count are ignored. A partition whose
// progress does not decode keeps the start position and is reported
// (ErrBadProgress); the others are installed.
func (s *Sub) Restore(g *heraldpb.GroupProgress) error {
	v := MemberID(g.GetSubscriber())
	if (s.cfg.Mode == Broadcast) != (v != "") {
		return fmt.Errorf("%w: subscriber %q in %s mode", ErrBadProgress, v, s.cfg.Mode)
	}
	w := s.views[v]
	if w == nil {
		w = s.newView()
	}
	var bad error
	for _, pp := range g.GetPartitions() {
		if int(pp.GetPartition()) >= s.cfg.Partitions {
			continue
		}
		prog, err := DecodeProgress(pp, s.cfg.MaxSpan)
		if err != nil {
			// One bad partition does not cost the others their progress.
			bad = errors.Join(bad, fmt.Errorf("partition %d: %w", pp.GetPartition(), err))
			continue
		}
		p := pp.GetPartition()
		w.prog[p] = prog
		w.next[p] = prog.Floor()
		w.clearPending(p)
		s.dropEntries(v, p)
		s.restoreRetries(v, p, prog, pp.GetRetries())
	}
	s.views[v] = w
	return bad
}

// restoreRetries installs stored retries of view v's partition p, not
// loaded until Append reaches them. An entry whose deliveries the retry
// policy counts as the last goes back to the dead-letter queue; the others
// wait for their not-before time, and their next delivery has count
// deliveries+1. Entries below the floor, acknowledged, beyond the span or
// repeated are ignored.
func (s *Sub) restoreRetries(v MemberID, p uint32, prog *Progress, rs []*heraldpb.PendingRetry) {
	for _, pr := range rs {
		off := pr.GetOffset()
		id := msgID{view: v, part: p, off: off}
		if prog.Done(off) || off >= prog.Limit() || s.restored(id) != nil {
			continue
		}
		r := &retryEntry{id: id, count: int(min(pr.GetDeliveries(), math.MaxInt32)), reason: cutReason(pr.GetReason())}
		if pr.GetNotBeforeMs() != 0 {
			r.notBefore = time.UnixMilli(pr.GetNotBeforeMs())
		}
		if r.count >= 1 && s.cfg.Retry.DeadLetter(r.count) {
			s.fl.addDead(r)
		} else {
			s.fl.addRetry(r)
		}
	}
}

// dropEntries forgets the retries and dead letters of view v's partition p.
func (s *Sub) dropEntries(v MemberID, p uint32) {
	of := func(r *retryEntry) bool { return r.id.view == v && r.id.part == p }
	s.fl.retry = slices.DeleteFunc(s.fl.retry, of)
	s.fl.dead = slices.DeleteFunc(s.fl.dead, of)
}

// DeadLetters lists, by view, partition and offset, the messages waiting
// for their dead-letter append whose records are loaded. They stay listed
// until DeadLettered, Commit or Seek ends them: the actor appends them to
// the dead-letter topic and calls DeadLettered once the append is durable.
func (s *Sub) DeadLetters() []DeadLetter {
	var out []DeadLetter
	for _, r := range s.fl.dead {
		if w := s.views[r.id.view]; w != nil && r.id.off < w.next[r.id.part] {
			out = append(out, DeadLetter{View: r.id.view, Partition: r.id.part, Offset: r.id.off, Deliveries: r.count, Reason: r.reason})
		}
	}
	return out
}

// DeadLettered marks a dead letter done: its append to the dead-letter
// topic is durable. It reports whether the message was still waiting for
// it (false: Commit, Seek or a reset ended it meanwhile).
func (s *Sub) DeadLettered(v MemberID, p uint32, off int64) bool {
	id := msgID{view: v, part: p, off: off}
	i := findEntry(s.fl.dead, id)
	if i < 0 {
		return false
	}
	s.fl.dead = slices.Delete(s.fl.dead, i, i+1)
	_ = s.views[v].prog[p].Ack(off)
	return true
}

// Retrying is the number of messages waiting to be delivered again
// (nacked, timed out or released, due or not), restored ones included.
func (s *Sub) Retrying() int { return len(s.fl.retry) }

// Seek moves view v's position in partition p to off. The coordinator uses
// it when retention removed the records at the floor (off is the log's new
// start) and when the position lies beyond the log's end (off is the end).
//
// Forward (off at or above the read position) it is a commit of off:
// everything below off is given up (flights, redeliveries, dead letters and
// offered messages there are forgotten, their acks become stale), and what
// is known at or above off stays. Messages offered ahead of the read
// (ahead.go) may lie there, acked, in flight or waiting for a retry:
// forgetting them would deliver them again.
//
// Otherwise the progress restarts at off with nothing acked above it,
// offered messages are dropped, and flights, redeliveries and dead letters
// of p are forgotten.
func (s *Sub) Seek(v MemberID, p uint32, off int64) {
	w := s.views[v]
	if w == nil || int(p) >= len(w.prog) {
		return
	}
	if off >= w.next[p] {
		s.skipTo(v, p, off)
		return
	}
	w.prog[p] = NewProgress(off, s.cfg.MaxSpan)
	w.next[p] = w.prog[p].Floor()
	w.clearPending(p)
	for _, f := range s.fl.sorted(func(f *flight) bool { return f.id.view == v && f.id.part == p }) {
		s.fl.remove(f.id)
	}
	s.dropEntries(v, p)
}

// ViewOf is the progress view m's deliveries belong to: m itself in
// broadcast mode, else "" (the group's).
func (s *Sub) ViewOf(m MemberID) MemberID {
	if s.cfg.Mode == Broadcast {
		return m
	}
	return ""
}
