//go:build !race

// Several cluster nodes in one process: built without -race, like
// membership_test.go (see there).

package cluster

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// replicaNode is one node of the test: its cluster membership, its local
// actor system and its replica of partition t-0.
type replicaNode struct {
	id    uint64
	node  *Node
	local *actor.ActorSystem
	pid   *actor.PID
	stats *partition.Stats
}

// A raft group with one replica on each of three nodes, its messages
// carried by the cluster transport (protoactor remote between the nodes'
// cluster actor systems): it elects a leader, commits on a majority, and
// after the leader's node goes away the two others elect a new leader and
// go on; every acknowledged record is on both survivors at its offset.
func TestTransportReplicatesAcrossNodes(t *testing.T) {
	tc := newTestCluster(t, 3)
	dir := t.TempDir()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var nodes []*replicaNode
	for id := uint64(1); id <= 3; id++ {
		local := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
		nd, err := Start(Config{
			NodeID: id, Bind: tc.peers[id], HealthBind: tc.health[id], Peers: tc.peers, PeerHealth: tc.health,
			Refresh: 200 * time.Millisecond, Local: local, Logger: quiet,
		})
		if err != nil {
			t.Fatal(err)
		}
		tc.nodes[id] = nd
		rn := &replicaNode{id: id, node: nd, local: local, stats: &partition.Stats{}}
		rdir := filepath.Join(dir, fmt.Sprint(id))
		props, err := partition.Props(local, partition.Config{
			Topic: "t", Partition: 0, ReplicaID: id, Peers: map[uint64]*actor.PID{1: nil, 2: nil, 3: nil}, Transport: nd,
			Open: func() (partition.Storage, error) {
				return persistence.Open(persistence.Options{Dir: rdir, Group: "t-0", Logger: quiet})
			},
			TickInterval: 20 * time.Millisecond, Logger: quiet,
		}, rn.stats)
		if err != nil {
			t.Fatal(err)
		}
		if rn.pid, err = local.Root.SpawnNamed(props, partition.Name("t", 0)); err != nil {
			t.Fatal(err)
		}
		nd.Register(partition.Name("t", 0), rn.pid)
		nodes = append(nodes, rn)
		t.Cleanup(func() { local.Root.StopFuture(rn.pid).Wait(); local.Shutdown() })
	}
	tc.waitView("three nodes", 1, 2, 3)

	leaderOf := func(live map[uint64]bool) *replicaNode {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			var l uint64
			agree := true
			for _, rn := range nodes {
				if !live[rn.id] {
					continue
				}
				got := rn.stats.Leader.Load()
				if got == 0 || !live[got] || (l != 0 && got != l) {
					agree = false
					break
				}
				l = got
			}
			if agree && l != 0 && nodes[l-1].stats.Writable.Load() {
				return nodes[l-1]
			}
			if time.Now().After(deadline) {
				t.Fatal("no leader the live replicas agree on")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	acked := map[int64]string{}
	produce := func(rn *replicaNode, round string, n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			v := fmt.Sprintf("%s-%d", round, i)
			batch, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte(v)}}})
			res, err := rn.local.Root.RequestFuture(rn.pid, &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
				Topic: "t", Records: batch,
			}}}, 10*time.Second).Result()
			if err != nil {
				t.Fatalf("produce %s: %v", v, err)
			}
			r := res.(*heraldpb.Frame).GetProduceResponse()
			if r == nil {
				t.Fatalf("produce %s: %v", v, res.(*heraldpb.Frame).GetError())
			}
			acked[r.BaseOffset] = v
		}
	}
	live := map[uint64]bool{1: true, 2: true, 3: true}
	first := leaderOf(live)
	produce(first, "before", 30)

	// The leader's node goes away: its replica stops and it leaves.
	first.local.Root.StopFuture(first.pid).Wait()
	tc.stop(first.id)
	delete(live, first.id)
	next := leaderOf(live)
	if next.id == first.id {
		t.Fatal("the stopped replica still leads")
	}
	produce(next, "after", 30)

	for _, rn := range nodes {
		if !live[rn.id] {
			continue
		}
		deadline := time.Now().Add(10 * time.Second)
		for rn.stats.HighWatermark.Load() < 60 {
			if time.Now().After(deadline) {
				t.Fatalf("replica %d stuck at %d", rn.id, rn.stats.HighWatermark.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
		res, err := rn.local.Root.RequestFuture(rn.pid, &heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
			Topic: "t", MaxBytes: 1 << 20,
		}}}, 10*time.Second).Result()
		if err != nil {
			t.Fatal(err)
		}
		got := map[int64]string{}
		for _, b := range res.(*heraldpb.Frame).GetFetchResponse().GetBatches() {
			var rb heraldpb.RecordBatch
			_ = proto.Unmarshal(b.Records, &rb)
			for i, r := range rb.Records {
				got[b.BaseOffset+int64(i)] = string(r.Value)
			}
		}
		for off, v := range acked {
			if got[off] != v {
				t.Fatalf("replica %d: offset %d holds %q, acknowledged %q", rn.id, off, got[off], v)
			}
		}
	}
	if len(acked) != 60 {
		t.Fatalf("%d distinct offsets acknowledged, want 60", len(acked))
	}
}
