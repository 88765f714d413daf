//go:build !race

// Several cluster nodes in one process: built without -race, like
// membership_test.go (see there).

package cluster

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Four nodes: three voters hold the controller group; the fourth
// registers through the voters' filter, is added as a learner by the
// group's leader, and from then on reads the metadata from its own
// replica. It stops announcing itself once it sees its registration, and
// the repeats it sent before (here every 50 ms) did not grow the log.
func TestControllerNonVoterBecomesLearner(t *testing.T) {
	tc, ctrls := startControllers(t, 4, nil)
	if ctrls[4].voter || !ctrls[1].voter {
		t.Fatalf("voters: %v", ctrls[1].cfg.Voters)
	}
	awaitRegistries(t, ctrls)
	if cs := ctrls[4].stats.Conf.Load(); cs == nil || !slices.Equal(cs.Learners, []uint64{4}) || !slices.Equal(cs.Voters, []uint64{1, 2, 3}) {
		t.Fatalf("node 4's replica's membership: %+v", cs)
	}
	if n := ctrls[4].Metadata().Nodes[4]; n == nil || n.MemberId != tc.nodes[4].View().Self.MemberID {
		t.Fatalf("node 4 registered as %+v", n)
	}
	// Four registrations and one learner change: the repeats were dropped.
	if applied := ctrls[4].Metadata().Applied; applied != 4 {
		t.Fatalf("the controller log holds %d records, want 4 registrations", applied)
	}
	sent := ctrls[4].sent.Load()
	time.Sleep(500 * time.Millisecond) // ten announce periods: none should be sent
	if now := ctrls[4].sent.Load(); now != sent {
		t.Fatalf("node 4 announced itself %d more times after it saw its registration", now-sent)
	}
}

// startControllers starts n nodes in this process, each with its
// controller (tweak, if set, adjusts their configs).
func startControllers(t *testing.T, n int, tweak func(*ControllerConfig)) (*testCluster, map[uint64]*Controller) {
	t.Helper()
	tc := newTestCluster(t, n)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var ids []uint64
	for id := uint64(1); id <= uint64(n); id++ {
		ids = append(ids, id)
	}
	ctrls := map[uint64]*Controller{}
	for _, id := range ids {
		local := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
		nd, err := Start(Config{NodeID: id, Bind: tc.peers[id], HealthBind: tc.health[id], Peers: tc.peers, PeerHealth: tc.health,
			Refresh: 200 * time.Millisecond, Local: local, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		tc.nodes[id] = nd
		cfg := ControllerConfig{Node: nd, Local: local, DataDir: t.TempDir(), Voters: Voters(ids),
			Self: &heraldpb.NodeRecord{NodeId: id, ClusterAddress: tc.peers[id]}, Reregister: 50 * time.Millisecond, Logger: quiet}
		if tweak != nil {
			tweak(&cfg)
		}
		c, err := StartController(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctrls[id] = c
		t.Cleanup(func() { c.Stop(); local.Shutdown() })
	}
	return tc, ctrls
}

// awaitRegistries polls until every controller's registry holds every node.
func awaitRegistries(t *testing.T, ctrls map[uint64]*Controller) {
	t.Helper()
	awaitFor(t, 30*time.Second, "every node registered on every node", func() string {
		for id, c := range ctrls {
			if n := len(c.Metadata().Nodes); n != len(ctrls) {
				return fmt.Sprintf("node %d: %d nodes", id, n)
			}
		}
		return ""
	})
}

// awaitFor polls cond until it returns "" or total passes (then fails
// with its last answer).
func awaitFor(t *testing.T, total time.Duration, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %s", total, what, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Four nodes with a checkpoint every 2 records: the four registrations
// make the leader write one, and every replica, the learner's included,
// truncates its log before it (the learner, added after the leader's log
// was truncated, may start from a raft snapshot there).
func TestControllerCheckpointTruncatesEveryReplica(t *testing.T) {
	_, ctrls := startControllers(t, 4, func(c *ControllerConfig) { c.CheckpointRecords = 2 })
	awaitRegistries(t, ctrls)
	awaitFor(t, 30*time.Second, "every replica's log starting at a checkpoint", func() string {
		for id, c := range ctrls {
			v := c.View()
			if v.Checkpoint == 0 || v.LogStart != v.Checkpoint || v.SinceCheckpoint >= 2 || len(c.Metadata().Nodes) != 4 {
				return fmt.Sprintf("node %d: %+v", id, v)
			}
		}
		return ""
	})
}

// A checkpoint over MaxCheckpointBytes (four registrations of 300 bytes
// each, and a limit of 700) is not written: the leader reports
// ErrCheckpointTooLarge in its view, no log is truncated, and the
// metadata is whole.
func TestControllerCheckpointTooLarge(t *testing.T) {
	_, ctrls := startControllers(t, 4, func(c *ControllerConfig) {
		c.CheckpointRecords, c.MaxCheckpointBytes = 2, 700
		c.Self.Rack = strings.Repeat("r", 300)
	})
	awaitRegistries(t, ctrls)
	awaitFor(t, 30*time.Second, "the leader reporting the checkpoint too large", func() string {
		leader := ctrls[1].Leader()
		if leader == 0 {
			return "no leader"
		}
		if v := ctrls[leader].View(); !strings.Contains(v.CheckpointError, ErrCheckpointTooLarge.Error()) {
			return fmt.Sprintf("leader %d: %+v", leader, v)
		}
		return ""
	})
	for id, c := range ctrls {
		if v := c.View(); v.LogStart != 0 || v.Checkpoint != 0 || len(c.Metadata().Nodes) != 4 {
			t.Fatalf("node %d: %+v", id, v)
		}
	}
}
