package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/heraldmq/herald/actors/consumer"
)

// TestPriorityCLI: three `herald produce --priority` processes fill a
// one-partition topic with 20 records each at levels 0, 5 and 9, in that
// order; a `herald consume --group` process with a window of 1 then prints
// them highest level first by weight (the picker's order: the backlog is
// all in the group's window), each once. An orderly consumer prints them in
// offset order.
func TestPriorityCLI(t *testing.T) {
	n := startProc(t, t.TempDir())
	addr := "--addr=" + n.Addr()
	run := func(stdin string, args ...string) string {
		t.Helper()
		out, errs, code := herald(t, stdin, append(args, addr)...)
		if code != 0 {
			t.Fatalf("herald %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errs)
		}
		return out
	}
	run("", "topic", "create", "jobs", "--partitions", "1")
	var all []string
	pk, err := consumer.NewPriorityPicker(consumer.DefaultPriorityWeights())
	if err != nil {
		t.Fatal(err)
	}
	var queues [consumer.Priorities][]string
	for _, level := range []int{0, 5, 9} {
		var lines []string
		for i := 0; i < 20; i++ {
			lines = append(lines, fmt.Sprintf("p%d-%02d", level, i))
		}
		run(strings.Join(lines, "\n")+"\n", "produce", "--topic", "jobs", "--priority", fmt.Sprint(level))
		all = append(all, lines...)
		queues[level] = lines
	}
	var want []string
	for {
		var busy [consumer.Priorities]bool
		for l, q := range queues {
			busy[l] = len(q) > 0
		}
		l, ok := pk.Pick(busy)
		if !ok {
			break
		}
		want, queues[l] = append(want, queues[l][0]), queues[l][1:]
	}

	out := run("", "consume", "--topic", "jobs", "--group", "workers", "--mode", "shared", "--from", "earliest", "--window", "1", "--max", "60")
	if got := strings.Fields(out); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("by priority got\n%v\nwant\n%v", got, want)
	}
	// Level 0 is not starved: it shows up among the first 17 (weights
	// 1 + 6 + 10).
	if got := strings.Fields(out); !strings.Contains(strings.Join(got[:17], " "), "p0-00") {
		t.Fatalf("level 0 starved: %v", got[:17])
	}

	out = run("", "consume", "--topic", "jobs", "--group", "audit", "--orderly", "--from", "earliest", "--window", "8", "--max", "60")
	if got := strings.Fields(out); strings.Join(got, " ") != strings.Join(all, " ") {
		t.Fatalf("orderly got\n%v\nwant offset order\n%v", got, all)
	}
}
