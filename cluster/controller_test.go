//go:build !race

// Several cluster nodes in one process: built without -race, like
// membership_test.go (see there).

package cluster

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Four nodes: three voters hold the controller group, the fourth does not
// and cannot see the registry, so it announces itself again and again
// (here every 50 ms). It is registered once: the voters' filter drops the
// repeats, and the controller log does not grow with them.
func TestControllerNonVoterRegistersOnce(t *testing.T) {
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
		for id := uint64(1); id <= 3; id++ {
			if len(ctrls[id].Metadata().Nodes) != 4 {
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("registries: %d %d %d nodes", len(ctrls[1].Metadata().Nodes), len(ctrls[2].Metadata().Nodes), len(ctrls[3].Metadata().Nodes))
		}
		time.Sleep(20 * time.Millisecond)
	}
	applied := ctrls[1].Metadata().Applied
	sent := ctrls[4].sent.Load()
	for ctrls[4].sent.Load() < sent+20 {
		if time.Now().After(deadline) {
			t.Fatalf("the non-voter sent %d registrations", ctrls[4].sent.Load()-sent)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if now := ctrls[1].Metadata().Applied; now != applied {
		t.Fatalf("the controller log grew from %d to %d records with repeated registrations", applied, now)
	}
	if n := ctrls[2].Metadata().Nodes[4]; n == nil || n.MemberId != tc.nodes[4].View().Self.MemberID {
		t.Fatalf("node 4 registered as %+v", n)
	}
}
