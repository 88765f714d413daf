//go:build !race

// Several cluster nodes in one process: without -race, as membership_test.go.

package cluster

import (
	"context"
	"testing"
	"time"
)

// ClusterNow: a node whose clock was stepped a minute ahead gets the
// cluster's time from its two peers (the median), and so do they; with
// one peer left, the earlier of the two clocks wins; with none, the
// node's own clock.
func TestClusterNowOutvotesASteppedClock(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.now = map[uint64]func() time.Time{2: func() time.Time { return time.Now().Add(time.Minute) }}
	for id := uint64(1); id <= 3; id++ {
		tc.start(id)
	}
	check := func(what string, id uint64, wantPeers int, wantOffset time.Duration) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		now, off, peers := tc.nodes[id].ClusterNow(ctx)
		if peers != wantPeers {
			t.Fatalf("%s: node %d heard from %d peers, want %d", what, id, peers, wantPeers)
		}
		if d := off - wantOffset; d > 200*time.Millisecond || d < -200*time.Millisecond {
			t.Fatalf("%s: node %d is %v off the cluster's time, want %v", what, id, off, wantOffset)
		}
		if d := time.Since(now); d > 200*time.Millisecond || d < -200*time.Millisecond {
			t.Fatalf("%s: node %d takes %v as the cluster's time, %v from the right one", what, id, now, d)
		}
	}
	check("three nodes", 1, 2, 0)
	check("three nodes", 2, 2, -time.Minute)
	check("three nodes", 3, 2, 0)
	tc.stop(3)
	check("two nodes", 1, 1, 0)
	check("two nodes", 2, 1, -time.Minute)
	tc.stop(1)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if now, off, peers := tc.nodes[2].ClusterNow(ctx); peers != 0 || off != 0 || time.Until(now) < 59*time.Second {
		t.Fatalf("alone: %v, offset %v, %d peers; want its own clock", now, off, peers)
	}
}
