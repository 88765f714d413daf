// Checks of the final logs: lost, unknown, failed-visible, duplicated, diverged and reordered records.

package checker

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/heraldmq/herald/chaos/history"
)

// replica is one replica's final read of a partition.
type replica struct {
	pos     int // the read op's position
	node    int
	vals    map[int64]string // offset -> value
	offsets []int64          // ascending
	first   map[string]int64 // value -> its lowest offset
}

func (r *replica) span() string {
	if len(r.offsets) == 0 {
		return "no records"
	}
	return fmt.Sprintf("%d records, offsets %d..%d", len(r.offsets), r.offsets[0], r.offsets[len(r.offsets)-1])
}

// indexReads indexes the ok final reads (a later read of the same replica
// replaces an earlier one) and picks each partition's longest as its log.
func (c *checker) indexReads() {
	c.reads = map[part][]*replica{}
	c.logs = map[part]*replica{}
	for i, op := range c.ops {
		if op.F != history.FinalRead || op.Type != history.OK {
			continue
		}
		p := part{op.Topic, op.Partition}
		r := &replica{pos: i, node: op.Node, vals: map[int64]string{}, first: map[string]int64{}}
		for _, rec := range op.Records {
			if v, dup := r.vals[rec.Offset]; dup {
				c.problem("op %d: node %d's read of %v has offset %d twice (%q, %q)", op.Index, op.Node, p, rec.Offset, v, rec.Value)
				continue
			}
			r.vals[rec.Offset] = rec.Value
			r.offsets = append(r.offsets, rec.Offset)
			if o, ok := r.first[rec.Value]; !ok || rec.Offset < o {
				r.first[rec.Value] = rec.Offset
			}
		}
		slices.Sort(r.offsets)
		rs := slices.DeleteFunc(c.reads[p], func(o *replica) bool { return o.node == r.node })
		c.reads[p] = append(rs, r)
	}
	for p, rs := range c.reads {
		slices.SortFunc(rs, func(a, b *replica) int { return cmp.Compare(a.node, b.node) })
		best := rs[0]
		for _, r := range rs[1:] {
			if len(r.offsets) > len(best.offsets) ||
				len(r.offsets) == len(best.offsets) && len(r.offsets) > 0 && r.offsets[len(r.offsets)-1] > best.offsets[len(best.offsets)-1] {
				best = r
			}
		}
		c.logs[p] = best
	}
}

// parts returns the partitions that were read, in order.
func (c *checker) parts() []part {
	return slices.SortedFunc(maps.Keys(c.reads), func(a, b part) int {
		return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
	})
}

// acked returns the position of value's first ok produce, or -1 (half
// messages are appended in the order they are committed: not here).
func (c *checker) acked(value string) int {
	for _, i := range c.produces[value] {
		if c.ops[i].Type == history.OK && c.ops[i].F == history.Produce {
			return i
		}
	}
	return -1
}

// failed reports whether every produce of value certainly failed: at least
// one fail, no ok or info, and no invoke left unfinished.
func (c *checker) failed(value string) bool {
	fails := 0
	for _, i := range c.produces[value] {
		switch c.ops[i].Type {
		case history.Fail:
			fails++
		case history.OK, history.Info:
			return false
		case history.Invoke:
			if c.done[i] < 0 {
				return false
			}
		}
	}
	return fails > 0
}

func (c *checker) idempotent(value string) bool {
	for _, i := range c.produces[value] {
		if c.ops[i].Idempotent {
			return true
		}
	}
	return false
}

func (c *checker) checkLogs() {
	// Lost: an acknowledged record missing from its partition's log.
	unread := map[part]int{}
	seen := map[string]bool{}
	noValue := 0
	for i, op := range c.ops {
		if op.F != history.Produce || op.Type != history.OK {
			continue
		}
		if op.Value == "" {
			noValue++
			continue
		}
		if seen[op.Value] {
			continue
		}
		seen[op.Value] = true
		p := part{op.Topic, op.Partition}
		log := c.logs[p]
		if log == nil {
			unread[p]++
			continue
		}
		c.checked(Lost, 1)
		if _, ok := log.first[op.Value]; !ok {
			c.add(Lost, c.ex([]int{i, log.pos}, []string{op.Value},
				"%s (%s) acknowledged at %v offset %d, missing from node %d's read (%s)",
				op.Value, op.Process, p, op.Offset, log.node, log.span()))
		}
	}
	if noValue > 0 {
		c.problem("%d acknowledged produces without a value", noValue)
	}
	for _, p := range slices.SortedFunc(maps.Keys(unread), func(a, b part) int {
		return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
	}) {
		c.problem("%v: %d acknowledged records but no final read", p, unread[p])
	}

	for v := range c.produces {
		if c.failed(v) {
			c.checked(FailedVisible, 1)
		}
	}
	// Unknown and failed-but-visible: over every replica's read.
	where := map[string]bool{}
	for _, p := range c.parts() {
		for _, r := range c.reads[p] {
			for _, o := range r.offsets {
				v := r.vals[o]
				if where[v] {
					continue
				}
				where[v] = true
				c.checked(Unknown, 1)
				switch {
				case len(c.produces[v]) == 0:
					c.add(Unknown, c.ex([]int{r.pos}, []string{v}, "%q at %v offset %d on node %d was never produced", v, p, o, r.node))
				case c.failed(v):
					c.add(FailedVisible, c.ex(append(slices.Clone(c.produces[v]), r.pos), []string{v},
						"%s failed for its producer, yet is at %v offset %d on node %d", v, p, o, r.node))
				}
			}
		}
	}

	// Duplicated: a value at two places of the logs.
	type at struct {
		p part
		o int64
	}
	places := map[string][]at{}
	var order []string
	for _, p := range c.parts() {
		log := c.logs[p]
		for _, o := range log.offsets {
			v := log.vals[o]
			if places[v] == nil {
				order = append(order, v)
			}
			places[v] = append(places[v], at{p, o})
		}
	}
	for _, v := range order {
		name := DuplicatedAtLeastOnce
		if c.idempotent(v) {
			name = Duplicated
		}
		c.checked(name, 1)
		ps := places[v]
		if len(ps) < 2 {
			continue
		}
		desc, pos := "", slices.Clone(c.produces[v])
		for i, a := range ps {
			if i > 0 {
				desc += ", "
			}
			desc += fmt.Sprintf("%v offset %d", a.p, a.o)
			pos = append(pos, c.logs[a.p].pos)
		}
		c.add(name, c.ex(pos, []string{v}, "%s stored %d times: %s", v, len(ps), desc))
	}

	// Diverged: two replicas of a partition with different values at an
	// offset that both reads cover.
	for _, p := range c.parts() {
		rs := c.reads[p]
		for i, a := range rs {
			for _, b := range rs[i+1:] {
				c.compare(p, a, b)
			}
		}
	}
}

// compare counts the offsets where replicas a and b of p disagree, within
// the range both reads cover.
func (c *checker) compare(p part, a, b *replica) {
	if len(a.offsets) == 0 || len(b.offsets) == 0 {
		return
	}
	lo := max(a.offsets[0], b.offsets[0])
	hi := min(a.offsets[len(a.offsets)-1], b.offsets[len(b.offsets)-1])
	var union []int64
	for _, o := range a.offsets {
		if o >= lo && o <= hi {
			union = append(union, o)
		}
	}
	for _, o := range b.offsets {
		if _, ok := a.vals[o]; !ok && o >= lo && o <= hi {
			union = append(union, o)
		}
	}
	slices.Sort(union)
	c.checked(Diverged, len(union))
	for _, o := range union {
		va, oka := a.vals[o]
		vb, okb := b.vals[o]
		if oka && okb && va == vb {
			continue
		}
		c.add(Diverged, c.ex([]int{a.pos, b.pos}, []string{va, vb},
			"%v offset %d: node %d has %s, node %d has %s", p, o, a.node, show(va, oka), b.node, show(vb, okb)))
	}
}

func show(v string, ok bool) string {
	if !ok {
		return "nothing"
	}
	return fmt.Sprintf("%q", v)
}

// sent is an acknowledged record found in a log.
type sent struct {
	pos    int // its ok produce op
	seq    int64
	value  string
	offset int64
}

// checkOrder walks each partition's log and checks that the acknowledged
// records of each producer, and of each producer and key, come in send
// order (Seq). The order is promised for records of an idempotent producer
// and for keyed records; unkeyed records of a non-idempotent producer may
// be reordered by the client (informational). Delayed messages (Due set)
// are appended in the order they come due, not the order they were sent:
// they are left out.
func (c *checker) checkOrder() {
	type pk struct{ producer, key string }
	for _, p := range c.parts() {
		log := c.logs[p]
		seen := map[string]bool{}
		promised, all := map[string]sent{}, map[string]sent{}
		byKey := map[pk]sent{}
		for _, o := range log.offsets {
			v := log.vals[o]
			if seen[v] {
				continue
			}
			seen[v] = true
			i := c.acked(v)
			if i < 0 {
				continue
			}
			op := c.ops[i]
			if op.Due != 0 {
				continue
			}
			cur := sent{pos: i, seq: op.Seq, value: v, offset: o}
			out := func(name string, prev sent, what string) {
				c.add(name, c.ex([]int{prev.pos, i}, []string{prev.value, v},
					"%v: %s sent %s (seq %d) before %s (seq %d)%s, but the log has %s at offset %d after %s at offset %d",
					p, op.Process, v, cur.seq, prev.value, prev.seq, what, v, o, prev.value, prev.offset))
			}
			if op.Idempotent || op.Key != "" {
				c.checked(OrderProducer, 1)
				if prev, ok := promised[op.Process]; ok && cur.seq < prev.seq {
					out(OrderProducer, prev, "")
				}
				promised[op.Process] = cur
			} else {
				c.checked(OrderUnpromised, 1)
				if prev, ok := all[op.Process]; ok && cur.seq < prev.seq {
					out(OrderUnpromised, prev, "")
				}
			}
			all[op.Process] = cur
			if op.Key != "" {
				c.checked(OrderKey, 1)
				k := pk{op.Process, op.Key}
				if prev, ok := byKey[k]; ok && cur.seq < prev.seq {
					out(OrderKey, prev, fmt.Sprintf(" with key %q", op.Key))
				}
				byKey[k] = cur
			}
		}
	}
}
