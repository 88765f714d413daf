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
//
// All of it is owned by one group-coordinator actor and is not safe for
// concurrent use. The actor feeds it log records (Append), membership
// (Join, Leave, Revoked), client requests (Request, Ack, Nack, Commit) and
// time (Deliver, Tick), pushes the Deliveries it returns, sends the Plans to
// members, and stores Encode's records in `__groups`.
package consumer

import (
	"errors"
	"fmt"
	"slices"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
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
	// key-shared mode).
	Orderly bool
	// MaxCredits caps a member's unused credits. 0 means DefaultMaxCredits.
	MaxCredits int
	// MaxPending caps, per partition and view, the messages offered by
	// Append and not yet delivered; Append refuses more. 0 means
	// DefaultMaxPending.
	MaxPending int
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
	rr      int // partition Deliver starts with
}

type memberState struct {
	credits int
	view    MemberID // Broadcast: the member itself; else ""
}

// view is one progress over the topic: the group's, or in broadcast mode one
// member's.
type view struct {
	prog    []*Progress
	pending [][]Message // offered, not yet delivered, ascending offsets
	next    []int64     // next offset to offer
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
		next:    make([]int64, s.cfg.Partitions),
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
	v := s.views[""]
	v.prog[p].Commit(off)
	floor := v.prog[p].Floor()
	for _, f := range s.fl.sorted(func(f *flight) bool { return f.id.part == p && f.id.off < floor }) {
		s.fl.remove(f.id)
	}
	s.fl.retry = slices.DeleteFunc(s.fl.retry, func(r *retryEntry) bool { return r.id.part == p && r.id.off < floor })
	v.pending[p] = slices.DeleteFunc(v.pending[p], func(m Message) bool { return m.Offset < floor })
	v.next[p] = max(v.next[p], floor)
	return nil
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

// ReadFrom is the offset from which the actor should read p's log for
// view, and how many messages Append would accept now (0: the view is
// paused, by MaxPending or by the span bound).
func (s *Sub) ReadFrom(v MemberID, p uint32) (off int64, room int) {
	w := s.views[v]
	if w == nil || int(p) >= len(w.prog) {
		return 0, 0
	}
	off = w.next[p]
	room = s.cfg.MaxPending - len(w.pending[p])
	room = int(min(int64(room), w.prog[p].Limit()-off))
	return off, max(room, 0)
}

// Append offers committed records of one partition to view, in offset
// order from ReadFrom. It returns how many it took; it stops at the first
// record at or beyond the progress limit (the span bound) or past
// MaxPending. Records below ReadFrom, or already done (after Restore), are
// taken and ignored; skipped (filtered) records are acked at once. Offsets
// must be dense from ReadFrom: a missing offset holds the floor until Commit
// or a reset moves it (the actor does so when retention removes records).
func (s *Sub) Append(v MemberID, msgs ...Message) int {
	w := s.views[v]
	if w == nil {
		return 0
	}
	for i, msg := range msgs {
		p := msg.Partition
		if int(p) >= len(w.prog) {
			return i
		}
		if msg.Offset < w.next[p] {
			continue
		}
		prog := w.prog[p]
		if msg.Offset >= prog.Limit() || len(w.pending[p]) >= s.cfg.MaxPending {
			return i
		}
		w.next[p] = msg.Offset + 1
		switch {
		case prog.Done(msg.Offset):
		case msg.Skip:
			prog.Ack(msg.Offset)
		default:
			w.pending[p] = append(w.pending[p], msg)
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
		g.Partitions = append(g.Partitions, prog.Encode(uint32(p)))
	}
	return g
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
		w.prog[pp.GetPartition()] = prog
		w.next[pp.GetPartition()] = prog.Floor()
		w.pending[pp.GetPartition()] = nil
	}
	s.views[v] = w
	return bad
}

// Seek moves view v's position in partition p to off: the progress restarts
// there with nothing acked above it, offered messages are dropped, and
// flights and redeliveries of p are forgotten (their acks become stale).
// The coordinator uses it when retention removed the records at the floor.
func (s *Sub) Seek(v MemberID, p uint32, off int64) {
	w := s.views[v]
	if w == nil || int(p) >= len(w.prog) {
		return
	}
	w.prog[p] = NewProgress(off, s.cfg.MaxSpan)
	w.next[p] = w.prog[p].Floor()
	w.pending[p] = nil
	for _, f := range s.fl.sorted(func(f *flight) bool { return f.id.view == v && f.id.part == p }) {
		s.fl.remove(f.id)
	}
	s.fl.retry = slices.DeleteFunc(s.fl.retry, func(r *retryEntry) bool { return r.id.view == v && r.id.part == p })
}

// ViewOf is the progress view m's deliveries belong to: m itself in
// broadcast mode, else "" (the group's).
func (s *Sub) ViewOf(m MemberID) MemberID {
	if s.cfg.Mode == Broadcast {
		return m
	}
	return ""
}
