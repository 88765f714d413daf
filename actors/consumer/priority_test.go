package consumer

import (
	"math/rand/v2"
	"testing"
)

func TestPriorityPickerShares(t *testing.T) {
	pp, err := NewPriorityPicker(DefaultPriorityWeights())
	if err != nil {
		t.Fatal(err)
	}
	var all [Priorities]bool
	for p := range all {
		all[p] = true
	}
	var got [Priorities]int
	const rounds = 55 * 100 // total weight 55
	for i := 0; i < rounds; i++ {
		p, ok := pp.Pick(all)
		if !ok {
			t.Fatal("no pick with every level busy")
		}
		got[p]++
	}
	for p := range got {
		if want := (p + 1) * 100; got[p] != want {
			t.Errorf("level %d: %d picks, want %d", p, got[p], want)
		}
	}
	// Only one level busy: it gets everything; none busy: nothing.
	var only [Priorities]bool
	only[3] = true
	if p, ok := pp.Pick(only); !ok || p != 3 {
		t.Fatalf("only level 3 busy: picked %d %v", p, ok)
	}
	if _, ok := pp.Pick([Priorities]bool{}); ok {
		t.Fatal("picked with nothing busy")
	}
	if _, err := NewPriorityPicker([Priorities]int{}); err == nil {
		t.Fatal("zero weights accepted")
	}
}

// A flood at the highest level never starves a lower one: over any window
// of W picks (W the busy levels' total weight), each busy level gets its
// weight, give or take one, whatever the busy set does meanwhile.
func TestPriorityPickerNoStarvation(t *testing.T) {
	pp, _ := NewPriorityPicker(DefaultPriorityWeights())
	r := rand.New(rand.NewPCG(9, 9))
	for round := 0; round < 200; round++ {
		var busy [Priorities]bool
		busy[9] = true // the flood
		total := 10
		for p := 0; p < 9; p++ {
			if r.IntN(3) == 0 {
				busy[p] = true
				total += p + 1
			}
		}
		var got [Priorities]int
		for i := 0; i < total; i++ {
			p, _ := pp.Pick(busy)
			got[p]++
		}
		for p := range busy {
			if busy[p] && (got[p] < p || got[p] > p+2) {
				t.Fatalf("round %d: level %d got %d of %d picks, weight %d (busy %v)", round, p, got[p], total, p+1, busy)
			}
		}
	}
}
