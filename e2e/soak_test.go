package e2e

import (
	"os"
	"strconv"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// TestKillLoopSoak is the long form of TestKillMidLoad: HERALD_SOAK rounds
// (e.g. HERALD_SOAK=50) of produce under load, SIGKILL, restart and a full
// check that every record ever acknowledged is still at its offset. It is
// skipped unless HERALD_SOAK is set, so the default test command stays fast:
//
//	HERALD_SOAK=50 go test -run TestKillLoopSoak -timeout 60m -v ./e2e/
func TestKillLoopSoak(t *testing.T) {
	rounds, err := strconv.Atoi(os.Getenv("HERALD_SOAK"))
	if err != nil || rounds <= 0 {
		t.Skip("set HERALD_SOAK=<rounds> to run the SIGKILL soak")
	}
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	if _, err := c.CreateTopic(ctxT(t, 10*time.Second), "soak", &heraldpb.TopicConfig{Partitions: 3}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	all := map[string]ackedRecord{}
	for round := 0; round < rounds; round++ {
		// Each round acknowledges at least 1,000 new records before the kill.
		for v, a := range loadUntilKilled(t, n, "soak", round, 1000) {
			if prev, ok := all[v]; ok && prev != a {
				t.Fatalf("round %d: %s acknowledged at %v after %v", round, v, a, prev)
			}
			all[v] = a
		}
		n.Start(t)
		c := dial(t, n)
		verifyAcked(t, c, "soak", 3, all)
		c.Close()
		t.Logf("round %d: %d acknowledged records, all present", round, len(all))
	}
}
