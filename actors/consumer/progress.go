package consumer

import (
	"fmt"
	"math"
	"math/bits"
	"strings"

	heraldpb "github.com/heraldmq/herald/proto"
)

// DefaultMaxSpan is the default bound on how far above its ack floor a
// subscription's progress may reach: 64 Ki offsets, an 8 KiB bitmap.
const DefaultMaxSpan = 1 << 16

// maxMaxSpan bounds a configured span so the encoded runs always fit uint32
// and the bitmap stays at most 128 MiB.
const maxMaxSpan = 1 << 30

// Progress is one subscription's position in one partition: an ack floor
// (every offset below it is done: acknowledged, auto-acked or filtered out)
// plus the set of individually acknowledged offsets above it.
//
// The set is a bitmap over [floor, floor+maxSpan). The floor advances as gaps
// fill. Offsets at or beyond Limit() cannot be acknowledged, so the
// dispatcher must not deliver them: when one slow message holds the floor,
// delivery of that partition pauses after maxSpan offsets (not merely
// maxSpan unacked ones) until the floor moves. This bounds memory (maxSpan/8
// bytes) and the size of the stored record (see Encode) whatever the
// consumers do.
//
// Progress is pure and not safe for concurrent use; the group coordinator
// owns it.
type Progress struct {
	floor int64
	span  int
	base  int64    // offset of bit 0 of bits[0]; base <= floor < base+64
	bits  []uint64 // bit i of word w: offset base+64w+i is acknowledged
}

// NewProgress returns a progress with nothing acknowledged at or above floor.
// maxSpan <= 0 means DefaultMaxSpan; it is capped at 2^30. floor < 0 is
// treated as 0.
func NewProgress(floor int64, maxSpan int) *Progress {
	if maxSpan <= 0 {
		maxSpan = DefaultMaxSpan
	}
	maxSpan = min(maxSpan, maxMaxSpan)
	floor = max(floor, 0)
	return &Progress{floor: floor, span: maxSpan, base: floor &^ 63}
}

// Floor is the first offset not yet done. In clustering mode it is the
// Kafka-style committed offset: the offset a new owner resumes from.
func (p *Progress) Floor() int64 { return p.floor }

// Span is the configured max span.
func (p *Progress) Span() int { return p.span }

// Limit is the first offset that may not be delivered: Floor() + Span().
func (p *Progress) Limit() int64 {
	if p.floor > math.MaxInt64-int64(p.span) {
		return math.MaxInt64
	}
	return p.floor + int64(p.span)
}

// Done reports whether off is acknowledged (below the floor or in the set).
func (p *Progress) Done(off int64) bool {
	if off < p.floor {
		return true
	}
	i := off - p.base
	w := i >> 6
	return w < int64(len(p.bits)) && p.bits[w]&(1<<(i&63)) != 0
}

// Ack marks off done and advances the floor over any run of done offsets it
// completes. Acking an offset already done is a no-op. Offsets at or beyond
// Limit() are refused with ErrBeyondSpan and change nothing; negative offsets
// are ignored.
func (p *Progress) Ack(off int64) error {
	if off < p.floor {
		return nil
	}
	if off >= p.Limit() {
		return fmt.Errorf("%w: offset %d, floor %d, span %d", ErrBeyondSpan, off, p.floor, p.span)
	}
	i := off - p.base
	w := int(i >> 6)
	for w >= len(p.bits) {
		p.bits = append(p.bits, 0)
	}
	p.bits[w] |= 1 << (i & 63)
	if off == p.floor {
		p.advance()
	}
	return nil
}

// Commit moves the floor up to off (Kafka-style commit: everything below off
// is done), then over any acknowledged offsets that follow. A commit below
// the floor is a no-op; use Reset to move backwards. A commit beyond Limit()
// is allowed: it discards the set.
func (p *Progress) Commit(off int64) {
	if off <= p.floor {
		return
	}
	p.floor = off
	p.advance()
}

// Reset sets the floor to off (forwards or backwards) and forgets every
// individual ack: the `group reset` operation. off < 0 is treated as 0.
func (p *Progress) Reset(off int64) {
	*p = *NewProgress(off, p.span)
}

// advance moves the floor over done offsets and drops whole words below it.
func (p *Progress) advance() {
	for {
		i := p.floor - p.base
		w := int(i >> 6)
		if w >= len(p.bits) {
			break
		}
		ones := bits.TrailingZeros64(^(p.bits[w] >> (i & 63)))
		if ones == 0 {
			break
		}
		p.floor += int64(ones)
	}
	drop := int((p.floor - p.base) >> 6)
	if drop == 0 {
		return
	}
	if drop >= len(p.bits) {
		p.bits = p.bits[:0]
	} else {
		n := copy(p.bits, p.bits[drop:])
		clear(p.bits[n:])
		p.bits = p.bits[:n]
	}
	p.base += int64(drop) << 6
	// Trim trailing zero words so an idle progress holds no memory.
	for len(p.bits) > 0 && p.bits[len(p.bits)-1] == 0 {
		p.bits = p.bits[:len(p.bits)-1]
	}
}

// runs calls fn for each maximal run [start, end) of acknowledged offsets
// above the floor, in order.
func (p *Progress) runs(fn func(start, end int64)) {
	start := int64(-1)
	for w, word := range p.bits {
		wb := p.base + int64(w)<<6
		if wb+64 <= p.floor {
			continue
		}
		if word == 0 || word == math.MaxUint64 {
			if (word == 0) == (start >= 0) {
				if start >= 0 {
					fn(start, wb)
					start = -1
				} else {
					start = max(wb, p.floor)
				}
			}
			continue
		}
		for b := 0; b < 64; b++ {
			off := wb + int64(b)
			if off < p.floor {
				continue
			}
			set := word&(1<<b) != 0
			if set && start < 0 {
				start = off
			} else if !set && start >= 0 {
				fn(start, off)
				start = -1
			}
		}
	}
	if start >= 0 {
		fn(start, p.base+int64(len(p.bits))<<6)
	}
}

// Pending is the number of acknowledged offsets held above the floor.
func (p *Progress) Pending() int {
	n := 0
	p.runs(func(s, e int64) { n += int(e - s) })
	return n
}

// DoneFrom is the number of done offsets at or above from: below the
// floor every offset counts, above it the acknowledged ones. DescribeGroup
// uses it to count, above a view's durable floor, what the coordinator
// holds as done in memory.
func (p *Progress) DoneFrom(from int64) int64 {
	from = max(from, 0)
	var n int64
	if from < p.floor {
		n = p.floor - from
	}
	p.runs(func(s, e int64) { n += max(e-max(s, from), 0) })
	return n
}

// String renders the progress as "floor=5 acked=[7 9-11]" (ranges inclusive).
func (p *Progress) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "floor=%d", p.floor)
	first := true
	p.runs(func(s, e int64) {
		if first {
			b.WriteString(" acked=[")
			first = false
		} else {
			b.WriteByte(' ')
		}
		if e-s == 1 {
			fmt.Fprintf(&b, "%d", s)
		} else {
			fmt.Fprintf(&b, "%d-%d", s, e-1)
		}
	})
	if !first {
		b.WriteByte(']')
	}
	return b.String()
}

// Encode returns the progress as the canonical PartitionProgress for
// partition. Its size is bounded by the span: at most one varint pair per
// run, so about maxSpan bytes in the worst (alternating) case and a few bytes
// in the usual one.
func (p *Progress) Encode(partition uint32) *heraldpb.PartitionProgress {
	m := &heraldpb.PartitionProgress{Partition: partition, AckFloor: p.floor}
	prev := p.floor + 1
	p.runs(func(s, e int64) {
		m.AckedRuns = append(m.AckedRuns, uint32(s-prev), uint32(e-s))
		prev = e
	})
	return m
}

// DecodeProgress rebuilds a progress from its stored form, for a subscription
// whose max span is maxSpan (<= 0: DefaultMaxSpan). It fails with
// ErrBadProgress, and allocates at most maxSpan/8 bytes, when the message is
// not canonical (see group.proto) or reaches past floor+maxSpan.
func DecodeProgress(m *heraldpb.PartitionProgress, maxSpan int) (*Progress, error) {
	p := NewProgress(0, maxSpan)
	if m.GetAckFloor() < 0 {
		return nil, fmt.Errorf("%w: negative floor %d", ErrBadProgress, m.GetAckFloor())
	}
	if m.GetAckFloor() > math.MaxInt64-int64(p.span) {
		return nil, fmt.Errorf("%w: floor %d too large", ErrBadProgress, m.GetAckFloor())
	}
	p.Reset(m.GetAckFloor())
	runs := m.GetAckedRuns()
	if len(runs)%2 != 0 {
		return nil, fmt.Errorf("%w: odd run list", ErrBadProgress)
	}
	limit := p.Limit()
	next := p.floor + 1
	for i := 0; i < len(runs); i += 2 {
		gap, n := int64(runs[i]), int64(runs[i+1])
		if n == 0 || (i > 0 && gap == 0) {
			return nil, fmt.Errorf("%w: run %d not canonical", ErrBadProgress, i/2)
		}
		start := next + gap
		end := start + n
		if end > limit {
			return nil, fmt.Errorf("%w: run %d ends at %d, past limit %d", ErrBadProgress, i/2, end, limit)
		}
		for off := start; off < end; off++ {
			p.setBit(off)
		}
		next = end
	}
	return p, nil
}

// setBit marks off (floor < off < Limit) without advancing the floor.
func (p *Progress) setBit(off int64) {
	i := off - p.base
	w := int(i >> 6)
	for w >= len(p.bits) {
		p.bits = append(p.bits, 0)
	}
	p.bits[w] |= 1 << (i & 63)
}
