package consumer

// heldLog holds the records of one view's partition that the coordinator
// may still have to push: offered, in flight or waiting for redelivery. It
// is a window of offsets [base, base+len) with holes for offsets that need
// nothing (done, filtered out, acked), so lookups are by index, not hash.
// Its size is bounded by the progress span (Config.MaxSpan): nothing below
// the ack floor is kept once trim runs.
type heldLog struct {
	base int64 // offset of buf[head]
	head int
	buf  []held
	n    int // entries held
}

func (h *heldLog) put(off int64, x held) {
	if h.n == 0 {
		h.base, h.head, h.buf = off, 0, h.buf[:0]
	}
	if off < h.base {
		return // below the window: already done
	}
	i := h.head + int(off-h.base)
	for len(h.buf) <= i {
		h.buf = append(h.buf, held{})
	}
	if h.buf[i].rec == nil {
		h.n++
	}
	h.buf[i] = x
}

func (h *heldLog) get(off int64) (held, bool) {
	i := h.head + int(off-h.base)
	if off < h.base || i >= len(h.buf) || h.buf[i].rec == nil {
		return held{}, false
	}
	return h.buf[i], true
}

func (h *heldLog) del(off int64) {
	i := h.head + int(off-h.base)
	if off < h.base || i >= len(h.buf) || h.buf[i].rec == nil {
		return
	}
	h.buf[i] = held{}
	h.n--
	h.trim(h.base)
}

// trim drops everything below floor, and the holes at the front.
func (h *heldLog) trim(floor int64) {
	for h.head < len(h.buf) && (h.base < floor || h.buf[h.head].rec == nil) {
		if h.buf[h.head].rec != nil {
			h.buf[h.head] = held{}
			h.n--
		}
		h.head++
		h.base++
	}
	if h.head == len(h.buf) {
		h.head, h.buf = 0, h.buf[:0]
		h.base = max(h.base, floor)
		return
	}
	if h.head > 1024 && h.head > len(h.buf)/2 {
		m := copy(h.buf, h.buf[h.head:])
		clear(h.buf[m:])
		h.buf, h.head = h.buf[:m], 0
	}
}
