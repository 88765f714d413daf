package consumer

// offWin is a window of values keyed by offset, [base, base+len), with
// holes: lookups are by index, not hash. The coordinator keeps held records
// in one per view and partition, and inflight keeps flights in one per view
// and partition. Their size is bounded by the progress span (Config.MaxSpan):
// everything kept lies between the ack floor and the next offset to offer.
type offWin[T any] struct {
	base int64 // offset of buf[head]
	head int
	buf  []slot[T]
	n    int // values held
}

type slot[T any] struct {
	v  T
	ok bool
}

func (w *offWin[T]) put(off int64, v T) {
	if w.n == 0 {
		w.base, w.head, w.buf = off, 0, w.buf[:0]
	}
	if off < w.base {
		need := int(w.base - off)
		if need > w.head {
			grown := make([]slot[T], need+len(w.buf)-w.head, need+2*(len(w.buf)-w.head))
			copy(grown[need:], w.buf[w.head:])
			w.buf, w.head = grown, need
		}
		w.head -= need
		w.base = off
	}
	i := w.head + int(off-w.base)
	for len(w.buf) <= i {
		w.buf = append(w.buf, slot[T]{})
	}
	if !w.buf[i].ok {
		w.n++
	}
	w.buf[i] = slot[T]{v: v, ok: true}
}

func (w *offWin[T]) get(off int64) (T, bool) {
	i := w.head + int(off-w.base)
	if off < w.base || i >= len(w.buf) || !w.buf[i].ok {
		var zero T
		return zero, false
	}
	return w.buf[i].v, true
}

func (w *offWin[T]) del(off int64) (T, bool) {
	i := w.head + int(off-w.base)
	if off < w.base || i >= len(w.buf) || !w.buf[i].ok {
		var zero T
		return zero, false
	}
	v := w.buf[i].v
	w.buf[i] = slot[T]{}
	w.n--
	w.trim(w.base)
	return v, true
}

// trim drops everything below floor, and the holes at the front.
func (w *offWin[T]) trim(floor int64) {
	for w.head < len(w.buf) && (w.base < floor || !w.buf[w.head].ok) {
		if w.buf[w.head].ok {
			w.buf[w.head] = slot[T]{}
			w.n--
		}
		w.head++
		w.base++
	}
	if w.head == len(w.buf) {
		w.head, w.buf = 0, w.buf[:0]
		w.base = max(w.base, floor)
		return
	}
	if w.head > 1024 && w.head > len(w.buf)/2 {
		m := copy(w.buf, w.buf[w.head:])
		clear(w.buf[m:])
		w.buf, w.head = w.buf[:m], 0
	}
}

// each calls fn for every value in offset order.
func (w *offWin[T]) each(fn func(off int64, v T)) {
	for i := w.head; i < len(w.buf); i++ {
		if w.buf[i].ok {
			fn(w.base+int64(i-w.head), w.buf[i].v)
		}
	}
}

// heldLog holds the records of one view's partition that the coordinator
// may still have to push: offered, in flight or waiting for redelivery.
type heldLog = offWin[held]
