package consumer

import (
	"slices"
)

// Reading ahead by priority.
//
// A view reads each partition's log in offset order (ReadFrom, Append), and
// priorities reorder what it has read (PriorityPicker). When that read is
// stalled, because the view's pending messages are at MaxPending (a slow
// or credit-bound consumer), a high-priority record further on in the log
// would wait behind the backlog. So the coordinator also reads the
// partition's priority sub-queues (a FetchRequest with a priority level,
// answered from the partition's per-level index) from the view's read
// position on, and offers what it finds with AppendAhead: those messages
// join the pending ones out of order, up to AheadShare of MaxPending more,
// and the ordered read skips them when it reaches their offsets. The
// progress span (MaxSpan) bounds how far ahead they may lie.
//
// A message offered ahead that fails (a nack, an ack timeout) is retried
// when the ordered read reaches it, as a restored retry is.

// AheadShare is the share of MaxPending that messages offered ahead may
// add to a partition's pending messages (at least one).
const AheadShare = 4

// aheadCap is how many messages offered ahead a partition may hold pending.
func (s *Sub) aheadCap() int { return max(1, s.cfg.MaxPending/AheadShare) }

// ReadAhead is where the actor should read view v's partition p's
// sub-queue of priority level (1 to Priorities-1) from, where to stop (the
// span bound), and how many messages AppendAhead would take now (0: none;
// always 0 in orderly mode, where offset order wins).
func (s *Sub) ReadAhead(v MemberID, p uint32, level int) (from, to int64, room int) {
	w := s.views[v]
	if w == nil || int(p) >= len(w.prog) || level < 1 || level >= Priorities || s.cfg.Orderly {
		return 0, 0, 0
	}
	from = max(w.scout[p][level], w.next[p])
	to = w.prog[p].Limit()
	room = s.aheadCap() - w.aheadPending(p)
	if from >= to || room <= 0 {
		return from, to, 0
	}
	return from, to, room
}

// AppendAhead offers messages read from view v's partition p's sub-queue of
// priority level, in offset order, and records that the sub-queue was read
// up to next. It returns the indexes of the messages it took; the others
// are left to the ordered read: below the read position, at or past the
// span bound, done, filtered (Skip), in flight or waiting for a retry. It
// stops at the room ReadAhead gives, and the next read of the level starts
// at the first message it could not take.
func (s *Sub) AppendAhead(v MemberID, p uint32, level int, msgs []Message, next int64) []int {
	w := s.views[v]
	if w == nil || int(p) >= len(w.prog) || level < 1 || level >= Priorities || s.cfg.Orderly {
		return nil
	}
	prog := w.prog[p]
	room := s.aheadCap() - w.aheadPending(p)
	var took []int
	for i, m := range msgs {
		if _, dup := slices.BinarySearch(w.ahead[p], m.Offset); dup || m.Partition != p || m.Offset < w.next[p] {
			continue
		}
		if m.Offset >= prog.Limit() || room <= 0 {
			next = m.Offset
			break
		}
		id := msgID{view: v, part: p, off: m.Offset}
		if m.Skip || prog.Done(m.Offset) || s.fl.get(id) != nil || s.restored(id) != nil {
			continue
		}
		m.Priority = min(m.Priority, Priorities-1)
		w.insertPending(p, m)
		w.levels[p].add(m.Priority)
		w.ahead[p] = insertOffset(w.ahead[p], m.Offset)
		took = append(took, i)
		room--
	}
	w.scout[p][level] = max(w.scout[p][level], next)
	return took
}

// aheadPending counts view w's pending messages of partition p that were
// offered ahead: those at or past the ordered read position.
func (w *view) aheadPending(p uint32) int {
	q := w.pending[p]
	i, _ := slices.BinarySearchFunc(q, w.next[p], func(m Message, off int64) int { return cmpOff(m.Offset, off) })
	return len(q) - i
}

// insertPending adds m to partition p's pending messages in offset order.
func (w *view) insertPending(p uint32, m Message) {
	q := w.pending[p]
	if n := len(q); n == 0 || q[n-1].Offset < m.Offset {
		w.pending[p] = append(q, m)
		return
	}
	i, _ := slices.BinarySearchFunc(q, m.Offset, func(x Message, off int64) int { return cmpOff(x.Offset, off) })
	w.pending[p] = slices.Insert(q, i, m)
}

// passAhead reports whether the ordered read at offset off meets a message
// offered ahead, and forgets it (and any below off: read positions only
// move forward).
func (w *view) passAhead(p uint32, off int64) bool {
	a := w.ahead[p]
	i := 0
	for i < len(a) && a[i] < off {
		i++
	}
	hit := i < len(a) && a[i] == off
	if hit {
		i++
	}
	if i > 0 {
		w.ahead[p] = slices.Delete(a, 0, i)
	}
	return hit
}

func insertOffset(a []int64, off int64) []int64 {
	i, found := slices.BinarySearch(a, off)
	if found {
		return a
	}
	return slices.Insert(a, i, off)
}

func cmpOff(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
