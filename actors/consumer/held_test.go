package consumer

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestHeldLogModel checks heldLog against a map under random operations.
func TestHeldLogModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var h heldLog
	model := map[int64]held{}
	floor, next := int64(0), int64(0)
	rec := func(off int64) held { return held{rec: []byte{byte(off)}, appendMs: off} }
	for step := 0; step < 200000; step++ {
		switch r.IntN(4) {
		case 0, 1: // offer the next offsets
			for n := r.IntN(5); n > 0; n-- {
				if r.IntN(4) != 0 { // some are filtered: never held
					h.put(next, rec(next))
					model[next] = rec(next)
				}
				next++
			}
		case 2: // ack a random held one, or put back an earlier one
			if next > floor {
				off := floor + r.Int64N(next-floor)
				if r.IntN(3) == 0 {
					h.put(off, rec(off))
					model[off] = rec(off)
				} else {
					h.del(off)
					delete(model, off)
				}
			}
		case 3: // the floor advances
			if next > floor && r.IntN(8) == 0 {
				floor += r.Int64N(next - floor + 1)
				h.trim(floor)
				for off := range model {
					if off < floor {
						delete(model, off)
					}
				}
			}
		}
		if h.n != len(model) {
			t.Fatalf("step %d: n=%d model %d", step, h.n, len(model))
		}
		off := floor + r.Int64N(next-floor+3) - 1
		got, ok := h.get(off)
		want, wok := model[off]
		if ok != wok || got.appendMs != want.appendMs {
			t.Fatalf("step %d: get(%d) = %v %v, want %v %v", step, off, got, ok, want, wok)
		}
	}
	var offs []int64
	h.each(func(off int64, _ held) { offs = append(offs, off) })
	if len(offs) != len(model) || !slices.IsSorted(offs) {
		t.Fatalf("each visited %d (sorted %v), model %d", len(offs), slices.IsSorted(offs), len(model))
	}
	if len(h.buf) > 4096 {
		t.Fatalf("window grew to %d entries", len(h.buf))
	}
}
