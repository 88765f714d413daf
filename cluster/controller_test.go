//go:build !race

// Several cluster nodes in one process: built without -race, like
// membership_test.go (see there).

package cluster

import (
	"io"
	"log/slog"
	"slices"
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
	tc := newTestCluster(t, 4)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctrls := map[uint64]*Controller{}
	for id := uint64(1); id <= 4; id++ {
		local := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
		nd, err := Start(Config{NodeID: id, Bind: tc.peers[id], HealthBind: tc.health[id], Peers: tc.peers, PeerHealth: tc.health,
			Refresh: 200 * time.Millisecond, Local: local, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		tc.nodes[id] = nd
		c, err := StartController(ControllerConfig{Node: nd, Local: local, DataDir: t.TempDir(), Voters: Voters([]uint64{1, 2, 3, 4}),
			Self: &heraldpb.NodeRecord{NodeId: id, ClusterAddress: tc.peers[id]}, Reregister: 50 * time.Millisecond, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		ctrls[id] = c
		t.Cleanup(func() { c.Stop(); local.Shutdown() })
	}
	if ctrls[4].voter || !ctrls[1].voter {
		t.Fatalf("voters: %v", ctrls[1].cfg.Voters)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		done := true
		for id := uint64(1); id <= 4; id++ {
			if len(ctrls[id].Metadata().Nodes) != 4 {
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("registries: %d %d %d %d nodes", len(ctrls[1].Metadata().Nodes), len(ctrls[2].Metadata().Nodes),
				len(ctrls[3].Metadata().Nodes), len(ctrls[4].Metadata().Nodes))
		}
		time.Sleep(20 * time.Millisecond)
	}
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
