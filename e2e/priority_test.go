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

// TestPriorityJumpsBacklogAcrossRestart: three level-9 records behind a
// backlog of 3,000 at level 0 come out among a new group's first
// deliveries (the group reads the partition's level-9 sub-queue while its
// ordered read waits behind the backlog), after a SIGKILL (the sub-queues
// are rebuilt from the log) and after a clean restart (they are loaded
// from their file).
func TestPriorityJumpsBacklogAcrossRestart(t *testing.T) {
	n := startProc(t, t.TempDir())
	run := func(stdin string, args ...string) string {
		t.Helper()
		out, errs, code := herald(t, stdin, append(args, "--addr="+n.Addr())...)
		if code != 0 {
			t.Fatalf("herald %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errs)
		}
		return out
	}
	run("", "topic", "create", "jobs", "--partitions", "1")
	run("", "produce", "--topic", "jobs", "--count", "3000", "--size", "40")
	run("urgent-0\nurgent-1\nurgent-2\n", "produce", "--topic", "jobs", "--priority", "9")
	for i, restart := range []func(){
		func() {},
		func() { n.Kill(t); n.Start(t) },
		func() { n.Stop(t); n.Start(t) },
	} {
		restart()
		out := run("", "consume", "--topic", "jobs", "--group", fmt.Sprintf("g%d", i), "--mode", "shared",
			"--from", "earliest", "--window", "1", "--max", "100")
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		urgent := 0
		for _, l := range lines {
			if strings.HasPrefix(l, "urgent-") {
				urgent++
			}
		}
		if len(lines) != 100 || urgent != 3 {
			t.Fatalf("restart %d: %d lines, %d of the 3 urgent ones among them:\n%s", i, len(lines), urgent, out)
		}
	}
}
