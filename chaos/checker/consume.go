// Checks of consumption: group progress, redelivery after an ack, delays, dead letters, replies.

package checker

import (
	"slices"
	"time"

	"github.com/heraldmq/herald/chaos/history"
)

// gpart is a group's view of a partition.
type gpart struct {
	group, topic string
	partition    int32
}

// checkCommits flags group progress that goes back: an ok commit whose
// Offset is below one that completed before it was invoked.
func (c *checker) checkCommits() {
	type seen struct {
		pos    int   // the completion
		high   int64 // the highest offset up to and including it
		highAt int   // the position of the commit that set high
	}
	done := map[gpart][]seen{}
	for i, op := range c.ops {
		if op.F != history.Commit || op.Type != history.OK {
			continue
		}
		k := gpart{op.Group, op.Topic, op.Partition}
		list := done[k]
		c.checked(CommitBackwards, 1)
		// The completions before this commit was invoked.
		j, _ := slices.BinarySearchFunc(list, c.inv[i], func(s seen, pos int) int { return s.pos - pos })
		if j > 0 && list[j-1].high > op.Offset {
			prev := c.ops[list[j-1].highAt]
			c.add(CommitBackwards, c.ex([]int{list[j-1].highAt, i}, nil,
				"group %q on %s/%d: progress %d (%s), then %d (%s)",
				op.Group, op.Topic, op.Partition, prev.Offset, prev.Process, op.Offset, op.Process))
		}
		s := seen{pos: i, high: op.Offset, highAt: i}
		if n := len(list); n > 0 && list[n-1].high >= op.Offset {
			s.high, s.highAt = list[n-1].high, list[n-1].highAt
		}
		done[k] = append(list, s)
	}
}

// checkKeyShared flags, in a key-shared group, a message whose first
// delivery (to any member) came after the first delivery of a later
// message of the same partition and key: the mode hands each key to one
// member at a time, in order, and a message waiting to be redelivered
// holds the later ones of its key back. Redeliveries are not compared
// (a message already delivered once may come again after later ones).
func (c *checker) checkKeyShared() {
	type msg struct {
		gpart
		offset int64
	}
	type gkey struct {
		gpart
		key string
	}
	seen := map[msg]bool{}
	highest := map[gkey]int{} // the first delivery of the highest offset so far
	for i, op := range c.ops {
		if op.F != history.Consume || op.Type != history.OK || op.Mode != history.ModeKeyShared || op.DLQ || op.Key == "" {
			continue
		}
		m := msg{gpart{op.Group, op.Topic, op.Partition}, op.Offset}
		if seen[m] {
			continue
		}
		seen[m] = true
		c.checked(OrderKeyShared, 1)
		k := gkey{m.gpart, op.Key}
		if j, ok := highest[k]; ok && c.ops[j].Offset > op.Offset {
			prev := c.ops[j]
			c.add(OrderKeyShared, c.ex([]int{j, i}, []string{prev.Value, op.Value},
				"group %q on %s/%d, key %q: offset %d first delivered (to %s) after offset %d (to %s)",
				op.Group, op.Topic, op.Partition, op.Key, op.Offset, op.Process, prev.Offset, prev.Process))
			continue
		}
		highest[k] = i
	}
}

// broadcastGroups returns the groups that any op names in broadcast mode.
func (c *checker) broadcastGroups() map[string]bool {
	b := map[string]bool{}
	for _, op := range c.ops {
		if op.Mode == history.ModeBroadcast && op.Group != "" {
			b[op.Group] = true
		}
	}
	return b
}

// checkRedelivery flags a delivery to a group, invoked after that group's
// ack of the same message (group, topic, partition, offset) was
// acknowledged. Broadcast groups are left out: each member gets each
// message.
func (c *checker) checkRedelivery() {
	type msg struct {
		gpart
		offset int64
	}
	broadcast := c.broadcastGroups()
	ackedAt := map[msg]int{}
	for i, op := range c.ops {
		if op.Group == "" || broadcast[op.Group] || op.Type != history.OK {
			continue
		}
		m := msg{gpart{op.Group, op.Topic, op.Partition}, op.Offset}
		switch op.F {
		case history.Ack:
			if _, ok := ackedAt[m]; !ok {
				ackedAt[m] = i
			}
		case history.Consume:
			c.checked(AckedRedelivered, 1)
			a, ok := ackedAt[m]
			if !ok || a >= c.inv[i] {
				continue
			}
			ack := c.ops[a]
			if after := time.Duration(op.Time - ack.Time); c.opts.AckSettle > 0 && after <= c.opts.AckSettle {
				continue
			}
			c.add(AckedRedelivered, c.ex([]int{a, i}, []string{op.Value},
				"group %q: %s/%d offset %d (%s) acked by %s, then delivered to %s (attempt %d) %v later",
				op.Group, op.Topic, op.Partition, op.Offset, op.Value, ack.Process, op.Process, op.Attempt,
				time.Duration(op.Time-ack.Time)))
		}
	}
}

// checkDelays flags delayed messages delivered before their due time
// (less Options.EarlyTolerance) and measures the lateness of each delayed
// message's first delivery.
func (c *checker) checkDelays() {
	due := map[string]int{} // value -> its first produce op with a due time
	for i, op := range c.ops {
		if op.F == history.Produce && op.Due > 0 && op.Value != "" {
			if _, ok := due[op.Value]; !ok {
				due[op.Value] = i
			}
		}
	}
	first := map[string]bool{}
	var late []time.Duration
	for i, op := range c.ops {
		if op.F != history.Consume || op.Type != history.OK || op.DLQ {
			continue
		}
		p, ok := due[op.Value]
		if !ok {
			continue
		}
		c.checked(Early, 1)
		at := c.ops[p].Due
		if early := time.Duration(at - op.Time); early > c.opts.EarlyTolerance {
			c.add(Early, c.ex([]int{p, i}, []string{op.Value}, "%s due at %v, delivered to %s at %v, %v early",
				op.Value, time.Duration(at), op.Process, time.Duration(op.Time), early))
		}
		if !first[op.Value] {
			first[op.Value] = true
			late = append(late, time.Duration(op.Time-at))
		}
	}
	slices.Sort(late)
	c.r.Delay = Lateness{Delivered: len(late), P50: percentile(late, 50), P99: percentile(late, 99), Max: percentile(late, 100)}
}

// percentile is the nearest-rank p-th percentile of sorted xs (0 if
// empty).
func percentile(xs []time.Duration, p int) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	rank := (p*len(xs) + 99) / 100 // ceil(p/100 * n)
	return xs[max(rank, 1)-1]
}

// checkDLQ accounts for every acknowledged record of a topic consumed by a
// group with MaxDeliveries: finally acked (an ok ack of the group) or
// dead-lettered (a DLQ consume naming the group, or naming no group),
// never both, and never neither once the run drained.
func (c *checker) checkDLQ() {
	maxDel := map[string]int{}
	topics := map[string]map[string]bool{}
	acked := map[string]map[string]int{}  // group -> value -> ok ack
	maybe := map[string]map[string]bool{} // group -> value -> ack of unknown outcome
	dlq := map[string]map[string]int{}    // group ("" for none) -> value -> DLQ consume
	note := func(m map[string]map[string]int, g, v string, i int) {
		if m[g] == nil {
			m[g] = map[string]int{}
		}
		if _, ok := m[g][v]; !ok {
			m[g][v] = i
		}
	}
	for i, op := range c.ops {
		if op.MaxDeliveries > 0 && op.Group != "" {
			maxDel[op.Group] = max(maxDel[op.Group], op.MaxDeliveries)
		}
		switch {
		case op.F == history.Consume && op.DLQ && op.Type == history.OK:
			note(dlq, op.Group, op.Value, i)
		case op.DLQ || op.Group == "":
			// Not a group's own consumption.
		case op.F == history.Consume || op.F == history.Ack || op.F == history.Nack:
			if topics[op.Group] == nil {
				topics[op.Group] = map[string]bool{}
			}
			topics[op.Group][op.Topic] = true
			if op.F != history.Ack {
				break
			}
			switch {
			case op.Type == history.OK:
				note(acked, op.Group, op.Value, i)
			case op.Type == history.Info || op.Type == history.Invoke && c.done[i] < 0:
				if maybe[op.Group] == nil {
					maybe[op.Group] = map[string]bool{}
				}
				maybe[op.Group][op.Value] = true
			}
		}
	}
	pending := DLQPending
	if c.opts.Drained {
		pending = DLQNeither
	}
	for _, g := range sortedKeys(maxDel) {
		seen := map[string]bool{}
		for i, op := range c.ops {
			if op.F != history.Produce || op.Type != history.OK || !topics[g][op.Topic] || seen[op.Value] {
				continue
			}
			seen[op.Value] = true
			c.checked(DLQBoth, 1)
			c.checked(pending, 1)
			a, isAcked := acked[g][op.Value]
			d, isDead := dlq[g][op.Value]
			if !isDead {
				d, isDead = dlq[""][op.Value]
			}
			switch {
			case isAcked && isDead:
				c.add(DLQBoth, c.ex([]int{i, a, d}, []string{op.Value}, "group %q: %s of %s acked by %s and dead-lettered",
					g, op.Value, op.Topic, c.ops[a].Process))
			case !isAcked && !isDead && !maybe[g][op.Value]:
				c.add(pending, c.ex([]int{i}, []string{op.Value}, "group %q (max deliveries %d): %s of %s/%d offset %d neither acked nor dead-lettered",
					g, maxDel[g], op.Value, op.Topic, op.Partition, op.Offset))
			}
		}
	}
}

// checkReplies flags a request answered twice (two replies delivered for
// one RequestID) and a reply delivered to a process other than the one
// that sent the request, or to a request nobody sent.
func (c *checker) checkReplies() {
	sender := map[string]int{}
	for i, op := range c.ops {
		if op.F == history.Request && op.RequestID != "" {
			if _, ok := sender[op.RequestID]; !ok {
				sender[op.RequestID] = i
			}
		}
	}
	answers := map[string][]int{}
	var order []string
	for i, op := range c.ops {
		if op.F != history.Reply || op.Type != history.OK {
			continue
		}
		c.checked(ReplyMisrouted, 1)
		s, ok := sender[op.RequestID]
		switch {
		case !ok:
			c.add(ReplyMisrouted, c.ex([]int{i}, []string{op.RequestID}, "%s got a reply to request %q, which nobody sent", op.Process, op.RequestID))
		case c.ops[s].Process != op.Process:
			c.add(ReplyMisrouted, c.ex([]int{s, i}, []string{op.RequestID}, "request %q sent by %s, its reply delivered to %s",
				op.RequestID, c.ops[s].Process, op.Process))
		}
		if answers[op.RequestID] == nil {
			order = append(order, op.RequestID)
		}
		answers[op.RequestID] = append(answers[op.RequestID], i)
	}
	for _, id := range order {
		c.checked(ReplyTwice, 1)
		if a := answers[id]; len(a) > 1 {
			c.add(ReplyTwice, c.ex(a, []string{id}, "request %q answered %d times", id, len(a)))
		}
	}
}
