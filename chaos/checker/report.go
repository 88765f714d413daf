// The Report: one section per check, the figures, and the text of report.txt.

package checker

import (
	"fmt"
	"strings"
	"time"
)

// Section names, in the order the report lists them.
const (
	Lost                  = "lost"
	Unknown               = "unknown"
	FailedVisible         = "failed-visible"
	Duplicated            = "duplicated"
	DuplicatedAtLeastOnce = "duplicated-at-least-once"
	Diverged              = "diverged"
	OrderProducer         = "order-producer"
	OrderKey              = "order-key"
	OrderUnpromised       = "order-unpromised"
	CommitBackwards       = "commit-backwards"
	OrderKeyShared        = "order-key-shared"
	AckedRedelivered      = "acked-redelivered"
	Early                 = "early"
	DLQBoth               = "dlq-both"
	DLQNeither            = "dlq-neither"
	DLQPending            = "dlq-pending"
	ReplyTwice            = "reply-twice"
	ReplyMisrouted        = "reply-misrouted"
	HalfLost              = "half-lost"
	HalfAborted           = "half-aborted"
	HalfUnsettled         = "half-unsettled"
	TxnLost               = "txn-lost"
	TxnPartial            = "txn-partial"
	TxnAborted            = "txn-aborted"
)

var sections = []struct {
	name, title string
	info        bool
}{
	{Lost, "acknowledged records lost", false},
	{Unknown, "records in the log that no producer sent", false},
	{FailedVisible, "records whose produce failed, visible in the log", false},
	{Duplicated, "records of idempotent producers stored twice", false},
	{DuplicatedAtLeastOnce, "records of non-idempotent producers stored twice (informational)", true},
	{Diverged, "replicas disagree", false},
	{OrderProducer, "acknowledged records out of send order, per producer and partition", false},
	{OrderKey, "acknowledged records out of send order, per producer and key", false},
	{OrderUnpromised, "unkeyed records of non-idempotent producers out of send order (informational)", true},
	{CommitBackwards, "group progress went backwards", false},
	{OrderKeyShared, "key-shared groups: a message first delivered after a later one of its key", false},
	{AckedRedelivered, "messages delivered to a group again after its ack was acknowledged", false},
	{Early, "delayed messages delivered early", false},
	{DLQBoth, "messages both acked and dead-lettered", false},
	{DLQNeither, "messages neither acked nor dead-lettered after draining", false},
	{DLQPending, "messages neither acked nor dead-lettered yet (informational, run not drained)", true},
	{ReplyTwice, "requests answered twice", false},
	{ReplyMisrouted, "replies delivered to another requester", false},
	{HalfLost, "committed half messages missing from the log", false},
	{HalfAborted, "rolled-back half messages visible in the log", false},
	{HalfUnsettled, "half messages meant to be committed, not checked (informational, run not drained)", true},
	{TxnLost, "records of committed transactions missing from the log", false},
	{TxnPartial, "transactions of unknown outcome partly visible", false},
	{TxnAborted, "records of aborted or unfinished transactions visible", false},
}

// Report is what Check found. It is JSON-serialisable; String gives the
// text of report.txt.
type Report struct {
	Ops int `json:"ops"`
	// Problems are faults of the input (invalid options, an incoherent
	// history) that make some check unreliable; any makes the report
	// invalid.
	Problems     []string     `json:"problems,omitempty"`
	Sections     []Section    `json:"sections"`
	Delay        Lateness     `json:"delay"`
	Availability Availability `json:"availability"`
}

// Section is the result of one check.
type Section struct {
	Name  string `json:"name"`
	Title string `json:"title"`
	// Informational: Count does not make the report invalid.
	Informational bool `json:"informational,omitempty"`
	// Checked: how many things the check examined (records, deliveries,
	// commits, requests).
	Checked int `json:"checked"`
	// Count: how many findings.
	Count    int       `json:"count"`
	Examples []Example `json:"examples,omitempty"`
}

// Example is one finding: the indexes of the ops that show it, the record
// values or request ids involved, and a sentence.
type Example struct {
	Ops    []int64  `json:"ops,omitempty"`
	Values []string `json:"values,omitempty"`
	Detail string   `json:"detail"`
}

// Lateness is how late delayed messages were first delivered (delivery time
// minus due time; negative when early within the tolerance).
type Lateness struct {
	Delivered int           `json:"delivered"`
	P50       time.Duration `json:"p50_ns"`
	P99       time.Duration `json:"p99_ns"`
	Max       time.Duration `json:"max_ns"`
}

// Availability measures the windows without an acknowledged produce, from
// the first produce op of the run to the last.
type Availability struct {
	Acks    int    `json:"acks"`
	Longest Window `json:"longest"`
	// Faults: per fault name, in name order.
	Faults []FaultFigures `json:"faults,omitempty"`
}

// Window is a span of the run, in time since its start.
type Window struct {
	From time.Duration `json:"from_ns"`
	To   time.Duration `json:"to_ns"`
}

// Len is the window's length.
func (w Window) Len() time.Duration { return w.To - w.From }

// FaultFigures are the availability figures of one fault name.
type FaultFigures struct {
	Fault string `json:"fault"`
	Spans []Span `json:"spans"`
	// Longest: the longest window without an acknowledged produce that
	// overlaps one of the fault's spans (extended by Options.Grace).
	Longest Window `json:"longest"`
	// MaxRecovery: the longest time from one of its ends to the next
	// acknowledged produce (zero when no end was followed by one).
	MaxRecovery time.Duration `json:"max_recovery_ns"`
	// Unrecovered: ends with no acknowledged produce after them.
	Unrecovered int `json:"unrecovered,omitempty"`
}

// Span is one occurrence of a fault: from its invoke to its end (ok, or
// info when it is unknown whether the fault was undone).
type Span struct {
	Node  int           `json:"node,omitempty"`
	Start time.Duration `json:"start_ns"`
	End   time.Duration `json:"end_ns"`
	Ended bool          `json:"ended"` // false: still on when the history ends
	// Recovery: from End to the next acknowledged produce; -1 if none.
	Recovery time.Duration `json:"recovery_ns"`
}

// Valid reports whether the history shows no violation and no problem. The
// informational sections and the figures do not count.
func (r Report) Valid() bool {
	if len(r.Problems) > 0 {
		return false
	}
	for _, s := range r.Sections {
		if !s.Informational && s.Count > 0 {
			return false
		}
	}
	return true
}

// Section returns the section of that name (the zero Section if none).
func (r Report) Section(name string) Section {
	for _, s := range r.Sections {
		if s.Name == name {
			return s
		}
	}
	return Section{}
}

// String is the text of report.txt: the verdict, the problems, one
// section per check ("OK" or its count and examples), then the delay and
// availability figures.
func (r Report) String() string {
	var b strings.Builder
	verdict := "VALID"
	if !r.Valid() {
		verdict = "INVALID"
	}
	fmt.Fprintf(&b, "Herald chaos check: %s (%d ops)\n", verdict, r.Ops)
	if len(r.Problems) > 0 {
		fmt.Fprintf(&b, "\nproblems with the input (%d):\n", len(r.Problems))
		for _, p := range r.Problems {
			fmt.Fprintf(&b, "  - %s\n", p)
		}
	}
	for _, s := range r.Sections {
		fmt.Fprintf(&b, "\n%s: %s\n", s.Name, s.Title)
		switch {
		case s.Count == 0:
			fmt.Fprintf(&b, "  OK (%d checked)\n", s.Checked)
		case s.Informational:
			fmt.Fprintf(&b, "  %d of %d checked\n", s.Count, s.Checked)
		default:
			fmt.Fprintf(&b, "  VIOLATION: %d of %d checked\n", s.Count, s.Checked)
		}
		for _, e := range s.Examples {
			fmt.Fprintf(&b, "    - %s", e.Detail)
			if len(e.Ops) > 0 {
				fmt.Fprintf(&b, " (ops %s)", joinInts(e.Ops))
			}
			b.WriteString("\n")
		}
		if n := s.Count - len(s.Examples); len(s.Examples) > 0 && n > 0 {
			fmt.Fprintf(&b, "    ... and %d more\n", n)
		}
	}
	d := r.Delay
	fmt.Fprintf(&b, "\ndelayed deliveries: %d", d.Delivered)
	if d.Delivered > 0 {
		fmt.Fprintf(&b, ", lateness p50 %v, p99 %v, max %v", d.P50, d.P99, d.Max)
	}
	a := r.Availability
	fmt.Fprintf(&b, "\n\navailability: %d acknowledged produces\n", a.Acks)
	fmt.Fprintf(&b, "  longest window without one: %v (%v to %v)\n", a.Longest.Len(), a.Longest.From, a.Longest.To)
	for _, f := range a.Faults {
		fmt.Fprintf(&b, "  fault %s: %d spans, longest window %v (%v to %v), max recovery %v",
			f.Fault, len(f.Spans), f.Longest.Len(), f.Longest.From, f.Longest.To, f.MaxRecovery)
		if f.Unrecovered > 0 {
			fmt.Fprintf(&b, ", %d ends not followed by an acknowledged produce", f.Unrecovered)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func joinInts(xs []int64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}
