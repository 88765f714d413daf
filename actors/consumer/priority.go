package consumer

import "fmt"

// Priorities is the number of message priority levels, 0 (lowest) to 9.
const Priorities = 10

// PriorityPicker chooses which priority level's sub-queue delivers next,
// by smooth weighted round robin (as nginx balances upstreams): every pick
// adds each non-empty level's weight to its credit, takes the level with
// the most credit (the higher level on a tie) and charges it the total
// weight of the non-empty levels. Higher levels go first in proportion to
// their weights, and a level with messages is never starved: out of any
// run of W picks, where W is the sum of the non-empty levels' weights,
// level p gets its weight's share w_p, give or take one. Pure and
// deterministic; the coordinator owns one per partition view.
type PriorityPicker struct {
	weights [Priorities]int
	credit  [Priorities]int
}

// DefaultPriorityWeights gives level p the weight p+1: a flood at level 9
// leaves level 0 one pick in eleven when only those two have messages.
func DefaultPriorityWeights() [Priorities]int {
	var w [Priorities]int
	for p := range w {
		w[p] = p + 1
	}
	return w
}

// NewPriorityPicker returns a picker with the given weights, each at
// least 1.
func NewPriorityPicker(weights [Priorities]int) (*PriorityPicker, error) {
	for p, w := range weights {
		if w < 1 {
			return nil, fmt.Errorf("%w: priority %d weight %d < 1", ErrBadConfig, p, w)
		}
	}
	return &PriorityPicker{weights: weights}, nil
}

// Pick returns the level to deliver from next, given which levels have
// messages waiting (nonEmpty[p]); ok is false when none has.
func (pp *PriorityPicker) Pick(nonEmpty [Priorities]bool) (level int, ok bool) {
	total, best := 0, -1
	for p := Priorities - 1; p >= 0; p-- {
		if !nonEmpty[p] {
			pp.credit[p] = 0 // an idle level does not bank credit
			continue
		}
		pp.credit[p] += pp.weights[p]
		total += pp.weights[p]
		if best < 0 || pp.credit[p] > pp.credit[best] {
			best = p
		}
	}
	if best < 0 {
		return 0, false
	}
	pp.credit[best] -= total
	return best, true
}
