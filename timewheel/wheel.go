// Package timewheel is the hierarchical timing wheel that the scheduler
// and the consumer groups' timers use, with its far store (in memory, or
// on disk: DiskFar) for timers beyond the wheel's span. It is pure (no
// goroutines or clock; time comes in as arguments, in Unix milliseconds;
// DiskFar does its I/O through a vfs.FS) and belongs to the shared layer the
// actor rooms use. Its owner (one actor) calls it; it is not safe for
// concurrent use.
package timewheel

import (
	"container/heap"
	"fmt"
	"slices"
)

// Entry is one pending timer: when it fires (Unix ms) and what it names,
// an opaque reference the scheduler resolves (the offset of the scheduled
// record in `__schedule`). An Entry holds no pointer, so millions of them in
// slices cost the garbage collector nothing to scan.
type Entry struct {
	At  int64
	Ref uint64
}

func (e Entry) compare(f Entry) int {
	switch {
	case e.At != f.At:
		return cmpInt(e.At, f.At)
	default:
		return cmpInt(e.Ref, f.Ref)
	}
}

func cmpInt[T int64 | uint64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Wheel geometry: two levels of 256 slots. Level 0 has one slot per
// millisecond of the current 256 ms window; level 1 one slot per 256 ms of
// the current 65.536 s window (the near window). Timers beyond it wait in
// far buckets of one near window each (FarBucketMs), which a scheduler
// backed by disk may keep out of memory (FarStore); a bucket is loaded into
// the wheel when the near window reaches it.
const (
	slotBits    = 8
	slotCount   = 1 << slotBits
	slotMask    = slotCount - 1
	l1Shift     = slotBits     // ms -> level-1 slot
	farShift    = 2 * slotBits // ms -> far bucket
	FarBucketMs = 1 << farShift
)

// FarStore keeps the timers beyond the near window, by bucket (At >>
// 16, one bucket per 65.536 s). The in-memory store keeps 16 bytes per
// timer; a store on disk keeps them in the scheduler's log and only the
// bucket index in memory.
type FarStore interface {
	// Put adds e to bucket b.
	Put(b int64, e Entry)
	// Take removes and returns bucket b's entries, in any order.
	Take(b int64) []Entry
	// Remove deletes e from bucket b, reporting whether it was there.
	Remove(b int64, e Entry) bool
	// First is the smallest bucket holding entries; ok is false if none.
	First() (b int64, ok bool)
	// Len is the number of entries held.
	Len() int
}

// Wheel is a hierarchical timing wheel: Add is O(1), and Advance costs
// O(1) per fired timer plus O(1) per 256 ms window it crosses with timers
// in the wheel (empty stretches are skipped in one step). Timers fire in
// order of At, ties by Ref, never before At.
type Wheel struct {
	now    int64 // every timer with At <= now has fired
	l0     [slotCount][]Entry
	l1     [slotCount][]Entry
	n0, n1 int
	far    FarStore
	due    []Entry // added at or before now: fire at the next Advance
}

// NewWheel returns a wheel whose clock reads now (ms): timers at or before
// it fire at the next Advance. far keeps the distant timers; nil means in
// memory.
func NewWheel(now int64, far FarStore) *Wheel {
	if far == nil {
		far = newMemFar()
	}
	return &Wheel{now: now, far: far}
}

// Now is the time up to which every timer has fired.
func (w *Wheel) Now() int64 { return w.now }

// Len is the number of pending timers.
func (w *Wheel) Len() int { return w.n0 + w.n1 + w.far.Len() + len(w.due) }

// Near is the number of pending timers held in the wheel itself (the near
// window and those due), as opposed to the far store.
func (w *Wheel) Near() int { return w.n0 + w.n1 + len(w.due) }

// Add schedules e. A timer at or before Now fires at the next Advance (a
// message whose time passed while the broker was down fires at once).
func (w *Wheel) Add(e Entry) {
	switch {
	case e.At <= w.now:
		w.due = append(w.due, e)
	case e.At>>l1Shift == w.now>>l1Shift:
		w.l0[e.At&slotMask] = append(w.l0[e.At&slotMask], e)
		w.n0++
	case e.At>>farShift == w.now>>farShift:
		s := (e.At >> l1Shift) & slotMask
		w.l1[s] = append(w.l1[s], e)
		w.n1++
	default:
		w.far.Put(e.At>>farShift, e)
	}
}

// Cancel removes a pending timer, reporting whether it was pending. Its
// cost is linear in the timers of its slot or bucket.
func (w *Wheel) Cancel(e Entry) bool {
	remove := func(s []Entry) ([]Entry, bool) {
		i := slices.Index(s, e)
		if i < 0 {
			return s, false
		}
		return slices.Delete(s, i, i+1), true
	}
	var ok bool
	switch {
	case e.At <= w.now:
		w.due, ok = remove(w.due)
	case e.At>>l1Shift == w.now>>l1Shift:
		if w.l0[e.At&slotMask], ok = remove(w.l0[e.At&slotMask]); ok {
			w.n0--
		}
	case e.At>>farShift == w.now>>farShift:
		s := (e.At >> l1Shift) & slotMask
		if w.l1[s], ok = remove(w.l1[s]); ok {
			w.n1--
		}
	default:
		ok = w.far.Remove(e.At>>farShift, e)
	}
	return ok
}

// NextAt is the earliest time at which Advance may have something to
// fire, or something to move (a level-1 slot or a far bucket reaching the
// wheel): Now when timers are due already; ok is false when nothing is
// pending. It costs at most one pass over each level's 256 slots. A
// scheduler arms one timer for it.
func (w *Wheel) NextAt() (at int64, ok bool) {
	if len(w.due) > 0 {
		return w.now, true
	}
	if w.n0 > 0 {
		for t := w.now + 1; t>>l1Shift == w.now>>l1Shift; t++ {
			if len(w.l0[t&slotMask]) > 0 {
				return t, true
			}
		}
	}
	if w.n1 > 0 {
		base := w.now >> farShift << farShift
		for s := (w.now>>l1Shift)&slotMask + 1; s < slotCount; s++ {
			if len(w.l1[s]) > 0 {
				return base + s<<l1Shift, true
			}
		}
	}
	if b, ok := w.far.First(); ok {
		return max(b<<farShift, w.now+1), true
	}
	return 0, false
}

// Advance moves the clock to now (a time before Now is ignored) and
// appends to out every timer that is due, in order of At (ties by Ref),
// returning out.
func (w *Wheel) Advance(now int64, out []Entry) []Entry {
	start := len(out)
	out = w.drainDue(out)
	if now>>farShift > w.now>>farShift+1 {
		// A jump over whole near windows (a restart after downtime, an idle
		// stretch): everything before now's window is due at once.
		out = w.catchUp(now, out)
	}
	for w.now < now {
		if w.n0 == 0 && w.n1 == 0 {
			// Nothing in the near window: jump to the last ms before the
			// next far bucket (or to now) in one step.
			next := now
			if b, ok := w.far.First(); ok && b<<farShift-1 < next {
				next = b<<farShift - 1
			}
			if next > w.now {
				w.setNow(next)
				out = w.drainDue(out)
				continue
			}
		}
		if w.n0 == 0 {
			// Jump to the end of this 256 ms window.
			if end := min(w.now|slotMask, now); end > w.now {
				w.setNow(end)
				out = w.drainDue(out)
				continue
			}
		}
		t := w.now + 1
		w.setNow(t) // may cascade timers at exactly t into due
		if s := &w.l0[t&slotMask]; len(*s) > 0 {
			w.due = append(w.due, *s...)
			w.n0 -= len(*s)
			clear(*s)
			*s = (*s)[:0]
		}
		out = w.drainDue(out)
	}
	if !slices.IsSortedFunc(out[start:], Entry.compare) {
		panic("scheduler: wheel fired out of order") // a bug, never input
	}
	return out
}

// drainDue appends the due timers to out, sorted.
func (w *Wheel) drainDue(out []Entry) []Entry {
	if len(w.due) == 0 {
		return out
	}
	slices.SortFunc(w.due, Entry.compare)
	out = append(out, w.due...)
	clear(w.due)
	w.due = w.due[:0]
	return out
}

// catchUp fires, in order, everything before the near window of now, and
// moves the clock to just before that window.
func (w *Wheel) catchUp(now int64, out []Entry) []Entry {
	var batch []Entry
	for i := range w.l0 {
		batch = append(batch, w.l0[i]...)
		w.l0[i] = nil
	}
	for i := range w.l1 {
		batch = append(batch, w.l1[i]...)
		w.l1[i] = nil
	}
	w.n0, w.n1 = 0, 0
	for {
		b, ok := w.far.First()
		if !ok || b >= now>>farShift {
			break
		}
		batch = append(batch, w.far.Take(b)...)
	}
	slices.SortFunc(batch, Entry.compare)
	w.now = now>>farShift<<farShift - 1
	return append(out, batch...)
}

// setNow moves the clock forward to t within the rules of the levels: on
// entering a new 256 ms window its level-1 slot cascades into level 0, and
// on entering a new near window its far bucket loads into the levels.
// Entries already due (at or before t) go to due. t must not skip a
// window that still holds entries: Advance only jumps over empty ones.
func (w *Wheel) setNow(t int64) {
	old := w.now
	w.now = t
	if t>>farShift != old>>farShift {
		// A new near window: whatever level 1 held belonged to the old one
		// (Advance only jumps when it is empty); load the new bucket.
		for _, e := range w.far.Take(t >> farShift) {
			w.Add(e)
		}
	}
	if t>>l1Shift != old>>l1Shift {
		s := &w.l1[(t>>l1Shift)&slotMask]
		if len(*s) > 0 {
			moved := *s
			*s = nil
			w.n1 -= len(moved)
			for _, e := range moved {
				w.Add(e)
			}
		}
	}
}

// memFar is the in-memory FarStore: a slice per bucket and a heap of
// bucket numbers.
type memFar struct {
	buckets map[int64][]Entry
	order   bucketHeap
	n       int
}

func newMemFar() *memFar { return &memFar{buckets: map[int64][]Entry{}} }

func (m *memFar) Put(b int64, e Entry) {
	s, ok := m.buckets[b]
	if !ok {
		heap.Push(&m.order, b)
	}
	m.buckets[b] = append(s, e)
	m.n++
}

func (m *memFar) Take(b int64) []Entry {
	s, ok := m.buckets[b]
	if !ok {
		return nil
	}
	delete(m.buckets, b)
	m.n -= len(s)
	// The heap keeps b until it reaches the top (First drops it).
	return s
}

func (m *memFar) Remove(b int64, e Entry) bool {
	s := m.buckets[b]
	i := slices.Index(s, e)
	if i < 0 {
		return false
	}
	m.buckets[b] = slices.Delete(s, i, i+1)
	m.n--
	return true
}

func (m *memFar) First() (int64, bool) {
	for len(m.order) > 0 {
		b := m.order[0]
		if len(m.buckets[b]) > 0 {
			return b, true
		}
		delete(m.buckets, b) // emptied by Remove, or taken
		heap.Pop(&m.order)
	}
	return 0, false
}

func (m *memFar) Len() int { return m.n }

type bucketHeap []int64

func (h bucketHeap) Len() int           { return len(h) }
func (h bucketHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h bucketHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *bucketHeap) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *bucketHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// String summarises the wheel for tests and logs.
func (w *Wheel) String() string {
	return fmt.Sprintf("now=%d pending=%d level0=%d level1=%d far=%d due=%d", w.now, w.Len(), w.n0, w.n1, w.far.Len(), len(w.due))
}
