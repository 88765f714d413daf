// Tests of the figures, problems, options, report text and JSON, and the testdata histories.

package checker

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/chaos/history"
)

const ms = time.Millisecond

// availability builds a history of acknowledged produces around faults.
func availability() *hist {
	h := &hist{}
	nem := func(t history.Type, fault string, node int) op {
		return op{Process: "nemesis", Type: t, F: history.Nemesis, Fault: fault, Node: node}
	}
	pr := func(t history.Type, v string) op {
		return op{Process: "producer-0", Type: t, F: history.Produce, Topic: "t", Value: v}
	}
	h.at(0).add(pr(invoke, "a"), pr(ok, "a"))
	h.at(1).add(pr(invoke, "b"), pr(ok, "b"))
	h.at(2).add(pr(invoke, "c"), pr(ok, "c"))
	h.at(3).add(nem(invoke, "partition", 1), pr(invoke, "d"))
	h.at(5).add(pr(info, "d"))
	h.at(6).add(nem(ok, "partition", 1))
	h.at(9).add(pr(invoke, "e"))
	h.at(10).add(pr(ok, "e"))
	h.at(11).add(pr(invoke, "f"), pr(ok, "f"))
	h.at(20).add(nem(invoke, "kill", 2))
	h.at(21).add(nem(ok, "kill", 2))
	h.at(29).add(pr(invoke, "g"))
	h.at(30).add(pr(ok, "g"))
	h.at(31).add(nem(invoke, "kill", 1))
	h.at(32).add(nem(ok, "kill", 1))
	h.at(35).add(pr(invoke, "h"))
	h.at(40).add(nem(invoke, "pause", 3))
	h.at(41).add(nem(invoke, "clock", 1), nem(fail, "clock", 1))
	h.at(45).add(pr(info, "h"))
	h.at(50).add(op{Process: "reader", Type: ok, F: history.FinalRead, Topic: "t", Node: 1,
		Records: []history.Record{{Offset: 0, Value: "a"}, {Offset: 1, Value: "b"}, {Offset: 2, Value: "c"}, {Offset: 3, Value: "e"}, {Offset: 4, Value: "f"}, {Offset: 5, Value: "g"}}})
	return h
}

func TestAvailability(t *testing.T) {
	w := func(from, to int) Window { return Window{time.Duration(from) * ms, time.Duration(to) * ms} }
	for _, tc := range []struct {
		grace time.Duration
		want  Availability
	}{
		{0, Availability{Acks: 6, Longest: w(11, 30), Faults: []FaultFigures{
			{Fault: "kill", Longest: w(11, 30), MaxRecovery: 9 * ms, Unrecovered: 1, Spans: []Span{
				{Node: 2, Start: 20 * ms, End: 21 * ms, Ended: true, Recovery: 9 * ms},
				{Node: 1, Start: 31 * ms, End: 32 * ms, Ended: true, Recovery: -1}}},
			{Fault: "partition", Longest: w(2, 10), MaxRecovery: 4 * ms, Spans: []Span{
				{Node: 1, Start: 3 * ms, End: 6 * ms, Ended: true, Recovery: 4 * ms}}},
			{Fault: "pause", Longest: w(30, 45), Spans: []Span{
				{Node: 3, Start: 40 * ms, End: 50 * ms, Recovery: -1}}},
		}}},
		{10 * ms, Availability{Acks: 6, Longest: w(11, 30), Faults: []FaultFigures{
			{Fault: "kill", Longest: w(11, 30), MaxRecovery: 9 * ms, Unrecovered: 1, Spans: []Span{
				{Node: 2, Start: 20 * ms, End: 21 * ms, Ended: true, Recovery: 9 * ms},
				{Node: 1, Start: 31 * ms, End: 32 * ms, Ended: true, Recovery: -1}}},
			{Fault: "partition", Longest: w(11, 30), MaxRecovery: 4 * ms, Spans: []Span{
				{Node: 1, Start: 3 * ms, End: 6 * ms, Ended: true, Recovery: 4 * ms}}},
			{Fault: "pause", Longest: w(30, 45), Spans: []Span{
				{Node: 3, Start: 40 * ms, End: 50 * ms, Recovery: -1}}},
		}}},
	} {
		r := Check(availability().ops, Options{Grace: tc.grace})
		if !r.Valid() {
			t.Fatalf("grace %v: invalid:\n%s", tc.grace, r)
		}
		if !reflect.DeepEqual(r.Availability, tc.want) {
			t.Errorf("grace %v: availability\n%+v\nwant\n%+v", tc.grace, r.Availability, tc.want)
		}
	}
	if a := Check(nil, Options{}).Availability; !reflect.DeepEqual(a, Availability{}) {
		t.Errorf("empty history: %+v", a)
	}
}

func TestPercentile(t *testing.T) {
	xs := make([]time.Duration, 200)
	for i := range xs {
		xs[i] = time.Duration(i + 1)
	}
	for _, tc := range []struct {
		xs   []time.Duration
		p    int
		want time.Duration
	}{
		{nil, 50, 0}, {xs[:1], 50, 1}, {xs[:1], 99, 1}, {xs[:2], 50, 1}, {xs[:2], 99, 2},
		{xs[:100], 50, 50}, {xs[:100], 99, 99}, {xs[:100], 100, 100}, {xs, 99, 198}, {xs[:3], 0, 1},
	} {
		if got := percentile(tc.xs, tc.p); got != tc.want {
			t.Errorf("percentile(%d values, %d) = %d, want %d", len(tc.xs), tc.p, got, tc.want)
		}
	}
}

func TestProblems(t *testing.T) {
	h := clean()
	h.at(40).produce("producer-0", "orders", 5, 0, "", "p0-9", 9, true, ok)
	h.add(op{Process: "nemesis", Type: ok, F: history.Nemesis, Fault: "kill", Node: 9})
	h.add(op{Process: "x", Type: "done", F: history.Ack})
	h.add(op{Process: "reader", Type: ok, F: history.FinalRead, Topic: "extra", Node: 1,
		Records: []history.Record{{Offset: 0, Value: "p0-0"}, {Offset: 0, Value: "p0-1"}}})
	r := Check(h.ops, Options{Drained: true, Grace: -time.Second})
	want := []string{"Grace -1s is negative", "bad history op", "extra/0 has offset 0 twice", "orders/5: 1 acknowledged records but no final read",
		`fault "kill" on node 9 ends (ok) without having started`}
	if len(r.Problems) != len(want) || r.Valid() {
		t.Fatalf("problems %q (valid %v), want %d", r.Problems, r.Valid(), len(want))
	}
	all := strings.Join(r.Problems, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("no problem mentions %q in\n%s", w, all)
		}
	}
	if !strings.Contains(r.String(), "problems with the input (5)") {
		t.Errorf("report does not list the problems:\n%s", r)
	}
}

func TestOptionsValidate(t *testing.T) {
	if err := (Options{}).Validate(); err != nil {
		t.Fatal(err)
	}
	err := Options{EarlyTolerance: -1, Grace: -1, AckSettle: -1, Examples: -1}.Validate()
	if !errors.Is(err, ErrBadOptions) || strings.Count(err.Error(), "negative") != 4 {
		t.Fatalf("Validate = %v, want all four fields named", err)
	}
}

func TestReportJSONAndText(t *testing.T) {
	h := clean()
	h.setRecords("jobs", 0) // all three lost
	r := Check(h.ops, Options{Drained: true, Examples: 2})
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, r) {
		t.Fatalf("JSON round trip: %v\n%+v\nwant\n%+v", err, back, r)
	}
	s := r.Section(Lost)
	if s.Count != 3 || len(s.Examples) != 2 || s.Examples[0].Values[0] != "j-0" || s.Examples[0].Ops[0] != 17 {
		t.Fatalf("lost: %+v", s)
	}
	text := r.String()
	for _, want := range []string{
		"Herald chaos check: INVALID",
		"lost: acknowledged records lost\n  VIOLATION: 3 of 10 checked\n    - j-0 (producer-2) acknowledged at jobs/0 offset 0, missing from node 1's read (no records) (ops 17, 64)\n",
		"    ... and 1 more\n",
		"duplicated: records of idempotent producers stored twice\n  OK (7 checked)\n",
		"duplicated-at-least-once: records of non-idempotent producers stored twice (informational)\n  1 of 1 checked\n",
		"delayed deliveries: 2, lateness p50 0s, p99 1ms, max 1ms\n",
		"fault kill: 1 spans, longest window 6ms (3ms to 9ms), max recovery 1ms\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
}

// TestTestdata checks the hand-written histories in testdata/: clean.jsonl
// passes, and violations.jsonl has one of each kind, each flagged.
func TestTestdata(t *testing.T) {
	read := func(name string) []history.Op {
		f, err := os.Open("testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		ops, err := history.Read(f)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return ops
	}
	if r := Check(read("clean.jsonl"), Options{Drained: true}); !r.Valid() || len(violations(r)) != 0 {
		t.Fatalf("clean.jsonl:\n%s", r)
	}
	r := Check(read("violations.jsonl"), Options{Drained: true})
	want := map[string]int{}
	for _, s := range sections {
		if s.name != OrderUnpromised && s.name != DLQPending && s.name != HalfUnsettled {
			want[s.name] = 1
		}
	}
	want[OrderUnpromised] = 1
	if got := violations(r); !equalCounts(got, want) || r.Valid() || len(r.Problems) != 0 {
		t.Fatalf("violations.jsonl: counts %v, want %v\n%s", got, want, r)
	}
}
