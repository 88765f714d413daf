package chaos

import (
	"slices"
	"testing"
	"time"

	"github.com/heraldmq/herald/chaos/checker"
	"github.com/heraldmq/herald/chaos/scenario"
)

// TestGoalsJudgeNoQuorumSplitsOnRecovery: a split that leaves no majority,
// or a majority killed, stops writes by design, so only its recovery is
// held to the goal; a minority cut, or a kill of one node, is held to
// both. A kill of the majority is labelled apart from other kills.
func TestGoalsJudgeNoQuorumSplitsOnRecovery(t *testing.T) {
	s := &scenario.Scenario{Goals: scenario.Goals{Unavailable: scenario.Duration(2 * time.Second), Recovery: scenario.Duration(2 * time.Second)}}
	long := checker.Window{From: time.Second, To: 10 * time.Second}
	rep := checker.Report{Availability: checker.Availability{Faults: []checker.FaultFigures{
		{Fault: "partition-majority", Longest: long, MaxRecovery: 300 * time.Millisecond},
		{Fault: "partition-minority", Longest: long, MaxRecovery: 300 * time.Millisecond},
		{Fault: "kill majority", Longest: long, MaxRecovery: 300 * time.Millisecond},
		{Fault: "kill", Longest: long, MaxRecovery: 300 * time.Millisecond},
	}}}
	want := []string{"partition-minority: writes stopped for 9s (goal 2s)", "kill: writes stopped for 9s (goal 2s)"}
	if got := goals(s, rep); !slices.Equal(got, want) {
		t.Fatalf("goals missed: %q, want %q", got, want)
	}
	rep.Availability.Faults[0].MaxRecovery = 3 * time.Second
	if got := goals(s, rep); len(got) != 3 || got[0] != "partition-majority: writes resumed 3s after it ended (goal 2s)" {
		t.Fatalf("a slow recovery after a no-majority split is not reported: %q", got)
	}
	for f, want := range map[scenario.Fault]string{
		{Kind: "kill", Target: "majority"}: "kill majority", {Kind: "pause", Target: "majority"}: "pause majority",
		{Kind: "kill", Target: "leader"}: "kill", {Kind: "partition-majority", Target: "random"}: "partition-majority",
	} {
		if got := faultLabel(f); got != want {
			t.Errorf("fault %+v labelled %q, want %q", f, got, want)
		}
	}
}
