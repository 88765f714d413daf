// Availability figures: windows without an acknowledged produce, per fault, and recovery.

package checker

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/heraldmq/herald/chaos/history"
)

// checkAvailability measures, from the first produce op to the last, the
// windows between acknowledged produces; the longest overall and, per
// fault name, the longest overlapping one of its spans (plus Grace); and
// the time from each fault's end to the next acknowledged produce.
func (c *checker) checkAvailability() {
	var start, end int64 = -1, 0
	var acks []int64
	for _, op := range c.ops {
		if op.F != history.Produce {
			continue
		}
		if start < 0 {
			start = op.Time
		}
		end = max(end, op.Time)
		if op.Type == history.OK {
			acks = append(acks, op.Time)
		}
	}
	a := &c.r.Availability
	a.Acks = len(acks)
	slices.Sort(acks)
	var windows []Window
	if start >= 0 {
		prev := start
		for _, t := range append(acks, end) {
			windows = append(windows, Window{From: time.Duration(prev), To: time.Duration(max(t, prev))})
			prev = t
		}
		a.Longest = longest(windows, func(Window) bool { return true })
	}

	spans := c.spans()
	for _, name := range slices.Sorted(maps.Keys(spans)) {
		f := FaultFigures{Fault: name, Spans: spans[name]}
		for i, s := range f.Spans {
			if !s.Ended {
				continue
			}
			j, _ := slices.BinarySearch(acks, int64(s.End))
			if j == len(acks) {
				f.Unrecovered++
				continue
			}
			f.Spans[i].Recovery = time.Duration(acks[j]) - s.End
			f.MaxRecovery = max(f.MaxRecovery, f.Spans[i].Recovery)
		}
		f.Longest = longest(windows, func(w Window) bool {
			for _, s := range f.Spans {
				to := s.End
				if s.Ended {
					to += c.opts.Grace
				}
				if w.From < to && s.Start < w.To {
					return true
				}
			}
			return false
		})
		a.Faults = append(a.Faults, f)
	}
}

// longest returns the longest of the windows that keep holds for (the
// first of equals), or the zero Window.
func longest(windows []Window, keep func(Window) bool) Window {
	var best Window
	for _, w := range windows {
		if w.Len() > best.Len() && keep(w) {
			best = w
		}
	}
	return best
}

// spans pairs each fault's start (a nemesis invoke) with its end (ok or
// info; a fail means it never started), per fault name in start order. A
// fault still on when the history ends is taken to last until its last op.
func (c *checker) spans() map[string][]Span {
	var last int64
	if n := len(c.ops); n > 0 {
		last = c.ops[n-1].Time
	}
	out := map[string][]Span{}
	for i, op := range c.ops {
		if op.F != history.Nemesis {
			continue
		}
		if op.Type != history.Invoke {
			if c.inv[i] == i {
				c.problem("op %d: fault %q on node %d ends (%s) without having started", op.Index, op.Fault, op.Node, op.Type)
			}
			continue
		}
		s := Span{Node: op.Node, Start: time.Duration(op.Time), End: time.Duration(last), Recovery: -1}
		if d := c.done[i]; d >= 0 {
			if c.ops[d].Type == history.Fail {
				continue
			}
			s.End, s.Ended = time.Duration(c.ops[d].Time), true
		}
		out[op.Fault] = append(out[op.Fault], s)
	}
	for _, ss := range out {
		slices.SortStableFunc(ss, func(a, b Span) int { return cmp.Compare(a.Start, b.Start) })
	}
	return out
}
