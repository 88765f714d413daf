package consumer

import (
	"cmp"
	"slices"
	"time"

	"github.com/heraldmq/herald/timewheel"
)

// timers finds the time-driven work of a subscription (ack deadlines of
// flights, not-before times of retries) for Tick and NextDeadline on the
// scheduler's timing wheel, instead of scanning every flight and retry.
// inflight owns it.
//
// Cancellation is lazy: an ack, nack, release, Commit, Seek or Restore
// leaves the timer of the flight or retry it ends behind. Each flight and
// retry remembers the Ref of its own timer (flight.timer, retryEntry.timer);
// a timer is live while the message it names is still there with that Ref,
// and a stale one is dropped when it comes out of the wheel: Tick takes out
// every timer due by its now, NextDeadline those before the earliest live
// one. Stale timers are bounded: when the pending timers reach
// 3×(flights+retries)+1024 (the stale ones about twice the live ones),
// the next one armed rebuilds the wheel from the live flights and retries,
// a cost linear in them that the stale timers added since the last
// rebuild pay for. Arming a timer (a delivery, a nack, a release) is
// otherwise O(1).
//
// Time: the wheel counts milliseconds since base, the now of the first
// Tick or NextDeadline; until then no timer is kept (that call builds the
// wheel from what is live). Times are compared as t.Sub(base),
// which uses the monotonic clock when both have it, as time.Time's own
// comparisons do; so the wheel's order is Before's, except for a time
// without a monotonic reading (a retry restored from `__groups`) compared
// with one that has it, after the wall clock was stepped since base: such
// a retry may be found late or early by the step (the exact time decides
// what is done, as before). Times more than 292 years from base saturate.
//
// Retries already due (not-before at or before the latest now given to
// Tick or NextDeadline, hw) need no timer: NextDeadline does not count them
// and Deliver finds them in the retry queue. Their timers are dropped when
// met, and none is armed for a retry that is due already (retryEntry.timer
// is 0). A call with a now before hw (a clock going backwards, never the
// actor's) arms those that are not due by it.
type timers struct {
	on   bool      // started: timers are kept
	base time.Time // the wheel's time 0
	w    *timewheel.Wheel
	// refs holds what every pending timer (in w or head) names, in the
	// slot Ref&0xffffffff; Ref>>32 is the slot's generation, so that a
	// freed slot's next timer has another Ref. A slot is freed when its
	// timer is taken out and dropped or handled.
	refs []timerRef
	free []uint32 // free slots of refs
	// head holds the timers taken out of the wheel, a min-heap by time (ns
	// since base) and Ref: every timer in w has Entry.At > w.Now(), every
	// one in head at or before it, so head[0] is the earliest pending
	// timer. Timers at or before w.Now() are added here directly. The
	// wheel's clock may be ahead of the caller's (NextDeadline takes the
	// earliest timer out, however far), so head may hold many timers:
	// hence a heap, O(log n) a push or pop.
	head     []headEntry
	hw       int64 // ns since base: the latest now given to Tick or NextDeadline
	buf      []timewheel.Entry
	rebuilds int // for tests
}

// timerRef is what a timer names.
type timerRef struct {
	id    msgID
	retry bool   // a retry's not-before time, else a flight's ack deadline
	gen   uint32 // the slot's generation (see timers.refs)
}

type headEntry struct {
	at  int64 // ns since base
	ref uint64
}

func (a headEntry) compare(b headEntry) int {
	return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.ref, b.ref))
}

// Stale timers allowed: see timers. staleSlack is a variable for tests.
const staleFactor = 3

var staleSlack = 1024

// since is t in the wheel's time: ns since base.
func (tm *timers) since(t time.Time) int64 { return int64(t.Sub(tm.base)) }

// msOf is the wheel slot (ms since base) of d ns since base.
func msOf(d int64) int64 {
	ms := d / int64(time.Millisecond)
	if d%int64(time.Millisecond) < 0 {
		ms--
	}
	return ms
}

// start prepares the timers for a Tick or NextDeadline at now, and returns
// now in the wheel's time: on the first call it sets base and builds the
// wheel; a now before the latest one arms again the retries it makes not
// due (those without a timer: a scan of the retries).
func (fl *inflight) start(now time.Time) int64 {
	tm := &fl.tm
	if !tm.on {
		tm.on, tm.base = true, now
		tm.hw = 0
		fl.rebuild()
		return 0
	}
	d := tm.since(now)
	if d < tm.hw {
		for _, r := range fl.retry {
			if r.timer == 0 && tm.since(r.notBefore) > d {
				r.timer = tm.arm(r.id, r.notBefore, true)
			}
		}
	}
	tm.hw = d
	return d
}

// rebuild replaces the wheel by one holding a timer for each flight and
// each retry not due by hw, its clock at hw (the old one's may be ahead:
// see head). Memory kept from a time with many more timers (over twice
// what the live ones may come to) is let go.
func (fl *inflight) rebuild() {
	tm := &fl.tm
	tm.rebuilds++
	tm.w = timewheel.NewWheel(msOf(tm.hw), nil)
	if live := fl.nflights + len(fl.retry); cap(tm.refs) > 2*(staleFactor*live+staleSlack) {
		tm.refs, tm.free, tm.head = nil, nil, nil
	}
	clear(tm.refs)
	tm.refs, tm.free, tm.head = tm.refs[:0], tm.free[:0], tm.head[:0]
	fl.each(func(f *flight) { f.timer = tm.arm(f.id, f.deadline, false) })
	for _, r := range fl.retry {
		r.timer = 0
		if d := tm.since(r.notBefore); d > tm.hw {
			r.timer = tm.arm(r.id, r.notBefore, true)
		}
	}
}

// arm adds a timer at t naming id, and returns its Ref (never 0).
func (tm *timers) arm(id msgID, t time.Time, retry bool) uint64 {
	var slot uint32
	if n := len(tm.free); n > 0 {
		slot, tm.free = tm.free[n-1], tm.free[:n-1]
	} else {
		slot = uint32(len(tm.refs))
		tm.refs = append(tm.refs, timerRef{})
	}
	gen := tm.refs[slot].gen + 1
	if gen == 0 {
		gen = 1
	}
	tm.refs[slot] = timerRef{id: id, retry: retry, gen: gen}
	ref := uint64(gen)<<32 | uint64(slot)
	d := tm.since(t)
	if ms := msOf(d); ms > tm.w.Now() {
		tm.w.Add(timewheel.Entry{At: ms, Ref: ref})
	} else {
		tm.push(headEntry{at: d, ref: ref})
	}
	return ref
}

// ref is what the pending timer ref names.
func (tm *timers) ref(ref uint64) timerRef { return tm.refs[uint32(ref)] }

// forget frees the slot of a timer that is no longer pending.
func (tm *timers) forget(ref uint64) {
	slot := uint32(ref)
	tm.refs[slot] = timerRef{gen: tm.refs[slot].gen} // drop the id's string
	tm.free = append(tm.free, slot)
}

// pending is the number of pending timers, live and stale.
func (tm *timers) pending() int { return len(tm.refs) - len(tm.free) }

// tooStale reports whether the wheel should be rebuilt before another
// timer is added.
func (fl *inflight) tooStale() bool {
	return fl.tm.pending() >= staleFactor*(fl.nflights+len(fl.retry))+staleSlack
}

// armFlight keeps a timer for f's ack deadline (once started); f is in
// fl.flights already.
func (fl *inflight) armFlight(f *flight) {
	tm := &fl.tm
	if !tm.on {
		return
	}
	if fl.tooStale() {
		fl.rebuild() // arms f
		return
	}
	f.timer = tm.arm(f.id, f.deadline, false)
}

// armRetry keeps a timer for r's not-before time, unless it is due by hw
// (once started); r is in fl.retry already.
func (fl *inflight) armRetry(r *retryEntry) {
	tm := &fl.tm
	r.timer = 0
	if !tm.on || tm.since(r.notBefore) <= tm.hw {
		return
	}
	if fl.tooStale() {
		fl.rebuild() // arms r
		return
	}
	r.timer = tm.arm(r.id, r.notBefore, true)
}

// push adds e to the heap head.
func (tm *timers) push(e headEntry) {
	h := append(tm.head, e)
	for i := len(h) - 1; i > 0; {
		up := (i - 1) / 2
		if h[up].compare(h[i]) <= 0 {
			break
		}
		h[up], h[i] = h[i], h[up]
		i = up
	}
	tm.head = h
}

// pop removes head[0], the earliest timer, and forgets it.
func (tm *timers) pop() {
	tm.forget(tm.head[0].ref)
	tm.take()
}

// take removes head[0] from the heap, keeping its ref.
func (tm *timers) take() {
	h := tm.head
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	for i := 0; ; {
		c := 2*i + 1
		if c >= n {
			break
		}
		if c+1 < n && h[c+1].compare(h[c]) < 0 {
			c++
		}
		if h[i].compare(h[c]) <= 0 {
			break
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
	tm.head = h
}

// liveFlight is the flight the timer ref names if it is still that
// flight's timer, else nil.
func (fl *inflight) liveFlight(ref uint64, tr timerRef) *flight {
	if tr.retry {
		return nil
	}
	if f := fl.get(tr.id); f != nil && f.timer == ref {
		return f
	}
	return nil
}

// liveRetry is the retry the timer ref names if it is still that retry's
// timer, else nil.
func (fl *inflight) liveRetry(ref uint64, tr timerRef) *retryEntry {
	if !tr.retry {
		return nil
	}
	if i := fl.findRetry(tr.id); i >= 0 && fl.retry[i].timer == ref {
		return fl.retry[i]
	}
	return nil
}

// pull advances the wheel to ms and moves the timers it fires to head,
// dropping the stale ones.
func (fl *inflight) pull(ms int64) {
	tm := &fl.tm
	tm.buf = tm.w.Advance(ms, tm.buf[:0])
	for _, e := range tm.buf {
		tr := tm.ref(e.Ref)
		if f := fl.liveFlight(e.Ref, tr); f != nil {
			tm.push(headEntry{at: tm.since(f.deadline), ref: e.Ref})
		} else if r := fl.liveRetry(e.Ref, tr); r != nil {
			tm.push(headEntry{at: tm.since(r.notBefore), ref: e.Ref})
		} else {
			tm.forget(e.Ref) // stale
		}
	}
	tm.buf = tm.buf[:0]
}

// first returns the earliest pending timer, taking timers out of the wheel
// (moving its clock past now if need be) until head has one; ok is false
// when no timer is pending.
func (fl *inflight) first() (headEntry, bool) {
	tm := &fl.tm
	for len(tm.head) == 0 {
		at, ok := tm.w.NextAt()
		if !ok {
			return headEntry{}, false
		}
		fl.pull(at)
	}
	return tm.head[0], true
}

// expired removes from the timers, and returns ordered by id, the flights
// whose ack deadline is at or before now (d: now in the wheel's time),
// dropping stale timers and those of retries due by now on the way.
func (fl *inflight) expired(now time.Time, d int64) []*flight {
	tm := &fl.tm
	fl.pull(msOf(d))
	var fs []*flight
	var keep []headEntry
	for len(tm.head) > 0 && tm.head[0].at <= d {
		h := tm.head[0]
		tr := tm.ref(h.ref)
		if f := fl.liveFlight(h.ref, tr); f != nil {
			if f.deadline.After(now) {
				keep = append(keep, h) // the clocks disagree (see timers)
				tm.take()
				continue
			}
			fs = append(fs, f)
		} else if r := fl.liveRetry(h.ref, tr); r != nil {
			if r.notBefore.After(now) {
				keep = append(keep, h)
				tm.take()
				continue
			}
			r.timer = 0 // due: Deliver finds it
		}
		tm.pop()
	}
	for _, h := range keep {
		tm.push(h)
	}
	slices.SortFunc(fs, func(a, b *flight) int { return a.id.compare(b.id) })
	return fs
}

// next is the earliest ack deadline of a flight, or not-before time after
// now of a retry (see NextDeadline); ok is false if there is none.
func (fl *inflight) next(now time.Time) (time.Time, bool) {
	tm := &fl.tm
	for {
		h, ok := fl.first()
		if !ok {
			return time.Time{}, false
		}
		tr := tm.ref(h.ref)
		if f := fl.liveFlight(h.ref, tr); f != nil {
			return f.deadline, true
		}
		if r := fl.liveRetry(h.ref, tr); r != nil {
			if r.notBefore.After(now) {
				return r.notBefore, true
			}
			r.timer = 0 // due: Deliver finds it
		}
		tm.pop()
	}
}
