// Package checker checks the history of a chaos run (chaos/history) for
// what the broker promises: no acknowledged record lost, duplicated by an
// idempotent producer or reordered, replicas that agree, group progress
// that never goes back, no redelivery after an acknowledged ack, delayed
// messages never early, every dead letter accounted for once, each request
// answered once and to its sender. It also measures the lateness of delayed
// deliveries and the windows without an acknowledged produce around each
// fault. It is pure: no goroutines, clock, disk or network.
package checker

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/heraldmq/herald/chaos/history"
)

// DefaultExamples is how many examples a section keeps when
// Options.Examples is zero.
const DefaultExamples = 5

// ErrBadOptions marks the error of Options.Validate.
var ErrBadOptions = errors.New("herald: bad checker options")

// Options tune the checks. The zero value is strict and valid.
type Options struct {
	// EarlyTolerance: a delayed message delivered at most this long before
	// its due time is not early (clock skew between the producer's and
	// the consumer's records). Zero: a delivery before its due time is
	// early.
	EarlyTolerance time.Duration
	// Grace: how long after a fault ends a window without acknowledged
	// produces still counts for that fault. Zero: up to the fault's end.
	Grace time.Duration
	// AckSettle: a delivery recorded at most this long after the group's
	// ack of the same message was acknowledged is not counted as a
	// redelivery after the ack (a push already on the wire). Zero: every
	// delivery invoked after the acknowledged ack counts.
	AckSettle time.Duration
	// Drained: the run ended by letting every group consume until idle, so
	// a message of a group with MaxDeliveries that is neither acked nor
	// dead-lettered is a violation. False: it is reported as pending.
	Drained bool
	// Examples: how many examples each section keeps. Zero:
	// DefaultExamples.
	Examples int
}

// Validate reports every negative field at once; the error matches
// ErrBadOptions.
func (o Options) Validate() error {
	var bad []string
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"EarlyTolerance", o.EarlyTolerance}, {"Grace", o.Grace}, {"AckSettle", o.AckSettle}} {
		if d.v < 0 {
			bad = append(bad, fmt.Sprintf("%s %v is negative", d.name, d.v))
		}
	}
	if o.Examples < 0 {
		bad = append(bad, fmt.Sprintf("Examples %d is negative", o.Examples))
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrBadOptions, strings.Join(bad, "; "))
}

// withDefaults fills zero Examples and clamps negative fields to zero.
func (o Options) withDefaults() Options {
	o.EarlyTolerance = max(o.EarlyTolerance, 0)
	o.Grace = max(o.Grace, 0)
	o.AckSettle = max(o.AckSettle, 0)
	if o.Examples <= 0 {
		o.Examples = DefaultExamples
	}
	return o
}

// Check checks a history and reports what it found. ops are taken in
// slice order as the order things happened (as history.Read returns them
// and the Recorder wrote them); Time is used only for the delay and
// availability figures and the tolerances. A completion (ok, fail, info)
// pairs with the oldest unfinished invoke of the same process and f (of a
// nemesis op: the same Fault and Node).
//
// Check never fails: invalid options are clamped to zero, and they and an
// incoherent history (an invalid op, an acknowledged record of a partition
// with no final read, a fault that ends without starting) are listed in
// Report.Problems, which makes the report invalid.
func Check(ops []history.Op, opts Options) Report {
	c := newChecker(ops, opts)
	c.checkLogs()
	c.checkOrder()
	c.checkCommits()
	c.checkRedelivery()
	c.checkKeyShared()
	c.checkDelays()
	c.checkDLQ()
	c.checkReplies()
	c.checkHalves()
	c.checkTxns()
	c.checkAvailability()
	return *c.r
}

// checker holds one Check's indexes over the history.
type checker struct {
	opts Options
	ops  []history.Op
	r    *Report
	sec  map[string]*Section

	inv  []int // position of each op's invoke: itself for an invoke or an unpaired completion
	done []int // position of each invoke's completion, -1 while unfinished

	produces map[string][]int // value -> positions of its produce ops (and half sends)
	reads    map[part][]*replica
	logs     map[part]*replica // the longest read of each partition
}

// part names a partition.
type part struct {
	topic     string
	partition int32
}

func (p part) String() string { return fmt.Sprintf("%s/%d", p.topic, p.partition) }

func newChecker(ops []history.Op, opts Options) *checker {
	c := &checker{opts: opts.withDefaults(), ops: ops, r: &Report{Ops: len(ops)}, sec: map[string]*Section{}}
	if err := opts.Validate(); err != nil {
		c.problem("%v", err)
	}
	for _, d := range sections {
		c.r.Sections = append(c.r.Sections, Section{Name: d.name, Title: d.title, Informational: d.info})
	}
	for i := range c.r.Sections {
		c.sec[c.r.Sections[i].Name] = &c.r.Sections[i]
	}
	bad := 0
	for _, op := range ops {
		if err := op.Validate(); err != nil {
			if bad++; bad <= c.opts.Examples {
				c.problem("op %d: %v", op.Index, err)
			}
		}
	}
	if bad > c.opts.Examples {
		c.problem("%d invalid ops in all", bad)
	}
	c.pair()
	c.produces = map[string][]int{}
	for i, op := range ops {
		if (op.F == history.Produce || op.F == history.HalfSend || op.F == history.TxnSend) && op.Value != "" {
			c.produces[op.Value] = append(c.produces[op.Value], i)
		}
	}
	c.indexReads()
	return c
}

func (c *checker) problem(format string, args ...any) {
	c.r.Problems = append(c.r.Problems, fmt.Sprintf(format, args...))
}

// add counts one finding in the named section and keeps it as an example
// while the section has fewer than Options.Examples.
func (c *checker) add(name string, ex Example) {
	s := c.sec[name]
	s.Count++
	if len(s.Examples) < c.opts.Examples {
		s.Examples = append(s.Examples, ex)
	}
}

// checked adds n to the things the named section examined.
func (c *checker) checked(name string, n int) { c.sec[name].Checked += n }

// pairKey is what pairs a completion with its invoke.
type pairKey struct {
	process string
	f       history.F
	fault   string
	node    int
}

func keyOf(op history.Op) pairKey {
	k := pairKey{process: op.Process, f: op.F}
	if op.F == history.Nemesis {
		k.fault, k.node = op.Fault, op.Node
	}
	return k
}

// pair fills inv and done: each completion takes the oldest unfinished
// invoke of its key.
func (c *checker) pair() {
	c.inv = make([]int, len(c.ops))
	c.done = make([]int, len(c.ops))
	open := map[pairKey][]int{}
	for i, op := range c.ops {
		c.inv[i], c.done[i] = i, -1
		k := keyOf(op)
		if op.Type == history.Invoke {
			open[k] = append(open[k], i)
			continue
		}
		if q := open[k]; len(q) > 0 {
			c.inv[i], c.done[q[0]] = q[0], i
			open[k] = q[1:]
		}
	}
}

// ex makes an example naming the ops at positions pos (in history order),
// the values vals and a detail.
func (c *checker) ex(pos []int, vals []string, format string, args ...any) Example {
	e := Example{Values: vals, Detail: fmt.Sprintf(format, args...)}
	for _, p := range pos {
		e.Ops = append(e.Ops, c.ops[p].Index)
	}
	slices.Sort(e.Ops)
	e.Ops = slices.Compact(e.Ops)
	return e
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
