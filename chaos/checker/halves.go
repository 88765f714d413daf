// Checks of half (transactional) messages: every half meant to be
// committed is on its topic, no half meant to be rolled back is.

package checker

import "github.com/heraldmq/herald/chaos/history"

// checkHalves checks the half messages against the final logs. A half's
// intended outcome is its send's Outcome: its producer ends it so, or the
// workload's checker answers its check-back so. Duplicates and halves
// whose send certainly failed are checked with the produced records
// (Duplicated, FailedVisible).
func (c *checker) checkHalves() {
	visible := map[string]struct {
		p   part
		off int64
		pos int
	}{}
	for _, p := range c.parts() {
		for _, r := range c.reads[p] {
			for v, o := range r.first {
				if _, ok := visible[v]; !ok {
					visible[v] = struct {
						p   part
						off int64
						pos int
					}{p, o, r.pos}
				}
			}
		}
	}
	for _, v := range sortedKeys(c.produces) {
		var sends []int
		intended, stored := "", -1
		for _, i := range c.produces[v] {
			op := c.ops[i]
			if op.F != history.HalfSend {
				continue
			}
			sends = append(sends, i)
			if op.Outcome != "" {
				intended = op.Outcome
			}
			if op.Type == history.OK && stored < 0 {
				stored = i
			}
		}
		if len(sends) == 0 {
			continue
		}
		at, seen := visible[v]
		switch intended {
		case history.OutcomeRollback:
			c.checked(HalfAborted, 1)
			if seen {
				c.add(HalfAborted, c.ex(append(sends, at.pos), []string{v},
					"%s was meant to be rolled back, yet is at %v offset %d", v, at.p, at.off))
			}
		case history.OutcomeCommit:
			if stored < 0 {
				continue // never surely stored: at most once (Duplicated), or never (FailedVisible)
			}
			if !c.opts.Drained {
				c.checked(HalfUnsettled, 1)
				if !seen {
					c.add(HalfUnsettled, c.ex(sends, []string{v}, "%s (half %s) not on its topic when the run ended undrained", v, c.ops[stored].RequestID))
				}
				continue
			}
			c.checked(HalfLost, 1)
			if !seen {
				c.add(HalfLost, c.ex(sends, []string{v},
					"%s (half %s, stored) was meant to be committed, but no replica's read of %s has it", v, c.ops[stored].RequestID, c.ops[stored].Topic))
			}
		default:
			c.problem("half message %s: its send names no outcome", v)
		}
	}
}
