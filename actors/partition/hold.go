package partition

import (
	"fmt"
	"math"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3/raftpb"
)

// Held batches: a batch appended with a hold (ProduceRequest.hold_us and
// not_before_ms) is committed (durable, on a majority) at once but
// readable only once its hold is over, and so is everything appended
// after it: the readable end of the log (the high watermark readers see)
// stops at the first held batch. The scheduler appends due messages a
// little ahead of their time this way, so that the commit's latency is
// spent before the time rather than after it, and a message still never
// becomes readable early.
//
// A hold is a duration, never a time compared across clocks. The sender
// (the scheduler) asks for its time minus its own now (hold_us, rounded
// up). The leader decides the hold once, when it receives the request:
// hold_us, or until not_before_ms by its own clock if that is later, at
// most MaxHold (holdFor); and records it in the entry (LogEntry.hold_us).
// A leader on the sender's own clock (the same process: clock_id) holds
// until not_before_ms alone, which is exact there and does not count the
// request's trip to it.
// Every replica then holds the entry for that long from when the entry
// reached it, on its own clock: the leader from the request's receipt, a
// follower from the entry's arrival in its log (or its apply, when the
// arrival was not seen: after a restart). None of these is before the
// sender sent the request, so a constant offset between any two clocks
// cannot make the batch readable before the sender's time; a follower
// makes it readable a network hop after the leader does.
//
// Holds are measured by Clock.Now differences, which use the monotonic
// reading when the clock has one (SystemClock does): a step of the
// machine's wall clock during a hold neither shortens nor lengthens it.
// A clock whose monotonic reading jumps too (the chaos build's) ends the
// holds running when it jumps forward: each batch early by at most what
// was left of its time, which is at most how long before its time the
// sender appended it (the scheduler's AppendAhead). When it goes back,
// the hold starts again from then (rebaseHolds), late by at most the
// hold, never held for as long as the jump.
//
// A replica restarted (the actor reopened its log) while a batch may
// still be held holds it again for its whole hold from the restart
// (restoreHolds): it cannot know how much of it had passed.
//
// Every hold is capped at MaxHold (on each replica too), so a wrong clock
// or a bad request never holds a partition for longer. The leader stamps
// the batch's append time with when it becomes readable by its clock (the
// batch counts as appended then).

// MaxHold bounds how long a batch is held after its append (the default
// of Config.MaxHold).
const MaxHold = time.Second

// maxHoldLimit bounds Config.MaxHold: a hold in µs fits 32 bits.
const maxHoldLimit = time.Hour

// maxHolds bounds the held batches tracked one by one; past it, a batch
// joins the last hold (held until the later of the two times), whose
// producers are answered when it ends, up to maxHeldAnswers of them (the
// others at once). It also bounds the arrival times kept for entries not
// applied yet (heldFrom); past it an entry's hold runs from its apply.
const (
	maxHolds       = 4096
	maxHeldAnswers = 4096
)

// hold is a run of batches from base on that become readable at until,
// with the producers waiting for that. from is when the hold began; both
// are this replica's clock, with its monotonic reading when it has one.
type hold struct {
	base      int64
	from      time.Time
	until     time.Time
	committed int64 // when it was applied (Unix µs)
	answers   []heldAnswer
}

// heldAnswer is a committed proposal's answer, sent when its batch
// becomes readable.
type heldAnswer struct {
	p    proposal
	base int64
}

// heldDue wakes the actor when the first hold may end.
type heldDue struct{ gen uint64 }

// holdKey names a log entry by its term and base offset: the one leader
// of a term gives each base once.
type holdKey struct {
	term uint64
	base int64
}

// readable is the end of what readers may read: the high watermark, or
// the first held batch whose time has not come. A hold whose time has
// come is readable at once, before the timer that ends it (and wakes the
// long polls waiting for it) gets through on a busy node.
func (a *Actor) readable() int64 {
	if len(a.holds) == 0 {
		return a.hw
	}
	now := a.cfg.Clock.Now()
	for _, h := range a.holds {
		if now.Before(h.until) {
			return h.base
		}
	}
	return a.hw
}

// HoldRequest asks for req's batch to become readable at at (Unix ms) by
// the clock of the sender, whose time is now and whose id is clockID (0:
// none; see Config.ClockID): hold_us, the rest of the time rounded up to
// a whole µs, and not_before_ms = at for partitions on the same clock and
// those that predate hold_us. A time that has come asks for no hold (but
// not_before_ms is still set, as the scheduler always did). The partition
// caps the hold at its MaxHold.
func HoldRequest(req *heraldpb.ProduceRequest, at int64, now time.Time, clockID uint64) {
	req.NotBeforeMs = at
	req.ClockId = clockID
	req.HoldUs = 0
	if d := time.UnixMilli(at).Sub(now); d > 0 {
		req.HoldUs = ceilMicros(d)
	}
}

// holdFor is the hold the leader gives a produce request it received at
// now (0: none): until not_before_ms when the request was timed on this
// very clock (clock_id), exact here; else hold_us, or until not_before_ms
// by this clock if that is later (so never shorter than the hold by the
// leader's clock alone). At most MaxHold. The entry records it rounded up
// to a whole µs.
func (a *Actor) holdFor(req *heraldpb.ProduceRequest, now time.Time) time.Duration {
	d := time.Duration(req.HoldUs) * time.Microsecond
	if req.NotBeforeMs != 0 {
		byClock := time.UnixMilli(req.NotBeforeMs).Sub(now)
		if a.cfg.ClockID != 0 && req.ClockId == a.cfg.ClockID {
			d = byClock
		} else {
			d = max(d, byClock)
		}
	}
	return max(min(d, a.cfg.MaxHold), 0)
}

// ceilMicros is d (positive) in whole µs, rounded up.
func ceilMicros(d time.Duration) uint32 {
	return uint32(min((d+time.Microsecond-1)/time.Microsecond, math.MaxUint32))
}

// ceilMilli is t in Unix ms, rounded up.
func ceilMilli(t time.Time) int64 {
	ms := t.UnixMilli()
	if t.After(time.UnixMilli(ms)) {
		ms++
	}
	return ms
}

// noteReceipt records, on the leader, that it received the held entry k
// at now: its hold runs from then.
func (a *Actor) noteReceipt(k holdKey, now time.Time) {
	if a.heldFrom == nil {
		a.heldFrom = make(map[holdKey]time.Time)
	}
	if len(a.heldFrom) < maxHolds {
		a.heldFrom[k] = now
	}
}

// noteArrivals records when held entries of ents, about to be appended
// to this replica's log, reached it: their holds run from then (from the
// receipt on the leader, which noteReceipt recorded first).
func (a *Actor) noteArrivals(ents []raftpb.Entry) {
	var now time.Time
	for _, e := range ents {
		if e.Type != raftpb.EntryNormal || len(e.Data) == 0 {
			continue
		}
		h, _, err := heraldpb.ScanLogEntry(e.Data)
		if err != nil || h.HoldUs == 0 {
			continue
		}
		k := holdKey{term: e.Term, base: h.BaseOffset}
		if _, ok := a.heldFrom[k]; ok {
			continue
		}
		if now.IsZero() {
			now = a.cfg.Clock.Now()
		}
		a.noteReceipt(k, now)
	}
}

// sweepArrivals forgets the arrivals of entries below the high watermark
// that were not applied (replaced by a later leader's).
func (a *Actor) sweepArrivals() {
	for k := range a.heldFrom {
		if k.base < a.hw {
			delete(a.heldFrom, k)
		}
	}
}

// holdOf is the hold of an entry with header h that this replica applies
// now, as it holds it from and until; ok is false when the entry is not
// held (or its hold is over).
func (a *Actor) holdOf(term uint64, h heraldpb.LogEntryHeader, now time.Time) (from, until time.Time, ok bool) {
	switch {
	case h.HoldUs > 0:
		from = now
		k := holdKey{term: term, base: h.BaseOffset}
		if t, seen := a.heldFrom[k]; seen {
			delete(a.heldFrom, k)
			from = minTime(t, now) // (not after now: the clock went back)
		}
		until = from.Add(min(time.Duration(h.HoldUs)*time.Microsecond, a.cfg.MaxHold))
	case h.NotBeforeMs != 0:
		// Stamped by a leader that predates hold_us: its time, on this
		// replica's clock.
		from = now
		until = now.Add(min(time.UnixMilli(h.NotBeforeMs).Sub(now), a.cfg.MaxHold))
	default:
		return from, until, false
	}
	return from, until, now.Before(until)
}

// restoredHold is the hold of an entry with header h that a replica
// restarted at now holds again: its whole hold from now (how much of it
// passed before the restart is unknown), or the time of an entry stamped
// by a leader that predates hold_us, on this clock. ok is false when it
// is not held.
func (a *Actor) restoredHold(h heraldpb.LogEntryHeader, now time.Time) (until time.Time, ok bool) {
	switch {
	case h.HoldUs > 0:
		until = now.Add(min(time.Duration(h.HoldUs)*time.Microsecond, a.cfg.MaxHold))
	case h.NotBeforeMs != 0:
		until = now.Add(min(time.UnixMilli(h.NotBeforeMs).Sub(now), a.cfg.MaxHold))
	default:
		return until, false
	}
	return until, now.Before(until)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// addHold holds the batch at base from from until until; p, when set, is
// answered then.
func (a *Actor) addHold(ctx actor.Context, base int64, from, until time.Time, p *proposal) {
	if n := len(a.holds); n >= maxHolds {
		last := &a.holds[n-1]
		if until.After(last.until) {
			last.until = until
		}
		if p != nil && len(last.answers) < maxHeldAnswers {
			last.answers = append(last.answers, heldAnswer{p: *p, base: base})
		} else if p != nil {
			// Committed, and held like the others; its producer hears it now.
			a.answerHolds(ctx, []hold{{base: base, committed: a.cfg.Clock.Now().UnixMicro(), answers: []heldAnswer{{p: *p, base: base}}}})
		}
	} else {
		h := hold{base: base, from: from, until: until, committed: a.cfg.Clock.Now().UnixMicro()}
		if p != nil {
			h.answers = []heldAnswer{{p: *p, base: base}}
		}
		a.holds = append(a.holds, h)
	}
	a.m.held.Set(float64(len(a.holds)))
	a.armHold()
}

// releaseHolds makes readable the batches whose time has come, answers
// their producers, and serves the long polls they satisfy.
func (a *Actor) releaseHolds(ctx actor.Context) {
	if len(a.holds) == 0 {
		return
	}
	now := a.cfg.Clock.Now()
	a.rebaseHolds(now)
	n := 0
	for n < len(a.holds) && !now.Before(a.holds[n].until) {
		n++
	}
	if n == 0 {
		a.armHold()
		return
	}
	for _, h := range a.holds[:n] {
		holdReleaseLateness.Observe(max(now.Sub(h.until), 0).Seconds())
	}
	a.answerHolds(ctx, a.holds[:n])
	clear(a.holds[:n])
	a.holds = a.holds[n:]
	if len(a.holds) == 0 {
		a.holds = nil
	}
	a.m.held.Set(float64(len(a.holds)))
	a.serveParked(ctx)
	a.stats.HighWatermark.Store(a.readable())
	a.publishPrio()
	a.armHold()
}

// rebaseHolds starts again from now the holds that began after now: the
// clock went back since (a clock whose monotonic reading moves with its
// steps, as the chaos build's does; a step of the machine's wall clock
// does not move Go's monotonic one). Each is held for its whole length
// from now: the step makes it neither readable early nor held for as long
// as the step, only late by at most its length.
func (a *Actor) rebaseHolds(now time.Time) {
	for i := range a.holds {
		if h := &a.holds[i]; now.Before(h.from) {
			d := h.until.Sub(h.from)
			h.from, h.until = now, now.Add(d)
		}
	}
}

// dropHolds makes every held batch readable now (the log was replaced,
// or the replica stops: they are committed either way).
func (a *Actor) dropHolds(ctx actor.Context) {
	if len(a.holds) == 0 {
		return
	}
	a.answerHolds(ctx, a.holds)
	a.holds = nil
	a.m.held.Set(0)
}

// answerHolds answers the producers of holds that ended, each with the
// time its batch became readable: its time, or its commit if that came
// later (a hold that ends early, dropped, answers with now).
func (a *Actor) answerHolds(ctx actor.Context, hs []hold) {
	nowUs := a.cfg.Clock.Now().UnixMicro()
	for _, h := range hs {
		readableUs := nowUs
		if !h.until.IsZero() {
			readableUs = min(max(h.committed, h.until.UnixMicro()), nowUs)
		}
		for _, w := range h.answers {
			a.answer(ctx, w.p, func(id uint64, dup bool) *heraldpb.Frame {
				q := w.p
				q.duplicate = dup
				f := produced(id, a.cfg.Partition, w.base, q)
				f.GetProduceResponse().CommitTimeUs = readableUs
				return f
			})
		}
	}
}

// armHold arms a timer for the first hold's end, unless one is armed
// for that time already.
func (a *Actor) armHold() {
	if len(a.holds) == 0 || a.holdTimerAt.Equal(a.holds[0].until) {
		return
	}
	a.holdTimerAt = a.holds[0].until
	a.holdGen++
	gen, sys, self := a.holdGen, a.sys, a.self
	d := a.holdTimerAt.Sub(a.cfg.Clock.Now())
	time.AfterFunc(max(d, 0), func() { sys.Root.Send(self, heldDue{gen: gen}) })
}

func (a *Actor) onHeldDue(ctx actor.Context, m heldDue) {
	if m.gen != a.holdGen {
		return // a later timer replaced it
	}
	a.holdTimerAt = time.Time{}
	a.releaseHolds(ctx)
}

// restoreHolds holds again, after the log was opened, the last applied
// entries that may still have been held, each for its whole hold from now
// (restoredHold). Entries are held at most MaxHold, so only the recent
// tail can be: it reads back from the last applied entry until one whose
// append time (the leader's clock) is more than MaxHold before now by
// this replica's clock, or restoreScanLimit entries. (So a replica whose
// clock is ahead of the leader's by more than MaxHold may miss a hold
// still running when it restarted.)
func (a *Actor) restoreHolds() error {
	now := a.cfg.Clock.Now()
	nowMs := now.UnixMilli()
	first, err := a.store.FirstIndex()
	if err != nil {
		return err
	}
	last, err := a.store.LastIndex()
	if err != nil {
		return err
	}
	var found []hold
	scanned := 0
	for hi := min(a.applied, last); hi >= first && hi > 0 && scanned < restoreScanLimit; {
		lo := first
		if hi > first+63 {
			lo = hi - 63
		}
		// Entries stops at a size limit: read the range in as many calls
		// as it takes.
		var ents []raftpb.Entry
		for next := lo; next <= hi; {
			got, err := a.store.Entries(next, hi+1, 16<<20)
			if err != nil {
				return fmt.Errorf("reading entries [%d, %d] for held batches (first %d, last %d, applied %d): %w", next, hi, first, last, a.applied, err)
			}
			if len(got) == 0 {
				return fmt.Errorf("reading entries [%d, %d] for held batches: none returned", next, hi)
			}
			ents = append(ents, got...)
			next += uint64(len(got))
		}
		old := false
		for i := len(ents) - 1; i >= 0; i-- {
			e := ents[i]
			scanned++
			h, _, err := heraldpb.ScanLogEntry(e.Data)
			if e.Type != raftpb.EntryNormal || len(e.Data) == 0 || err != nil || h.AppendTimeMs == 0 {
				continue // a conf change or an empty entry
			}
			if h.AppendTimeMs+a.cfg.MaxHold.Milliseconds() < nowMs {
				old = true
				break
			}
			if until, ok := a.restoredHold(h, now); ok {
				found = append(found, hold{base: h.BaseOffset, from: now, until: until})
			}
		}
		if old || lo == first {
			break
		}
		hi = lo - 1
	}
	for i := len(found) - 1; i >= 0; i-- {
		a.addHold(nil, found[i].base, found[i].from, found[i].until, nil) // (no producers: nil ctx is not used)
	}
	a.m.held.Set(float64(len(a.holds)))
	a.holdTimerAt = time.Time{}
	a.armHold()
	return nil
}

// restoreScanLimit bounds the entries restoreHolds reads back.
const restoreScanLimit = 65536

// readWindow reads the window from offset (below end) and leaves out the
// batches from end on (holds start at a batch).
func (a *Actor) readWindow(offset int64, maxBytes int, end int64) []*heraldpb.StoredBatch {
	bs := a.win.read(offset, maxBytes)
	for i, b := range bs {
		if b.BaseOffset >= end {
			return bs[:i]
		}
	}
	return bs
}
