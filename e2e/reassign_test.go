package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// clusterMoves runs `herald cluster OP NODE --wait` and requires every
// move it started to finish.
func clusterMoves(t *testing.T, addrs, op, node string) {
	t.Helper()
	out, errOut, code := herald(t, "", "cluster", op, node, "--wait", "--wait-timeout", "50s", "--addr", addrs)
	t.Logf("%s %s:\n%s%s", op, node, out, errOut)
	if code != 0 || !strings.Contains(out, "all moves done") {
		t.Fatalf("%s %s: exit %d", op, node, code)
	}
}

// internalLeader is the leader of an internal topic's partition 0 as
// the cluster reports it (0: none known).
func internalLeader(t *testing.T, c *client.Client, name string) uint32 {
	info, err := c.DescribeTopic(ctxT(t, 5*time.Second), name)
	if err != nil || len(info.Partitions) != 1 {
		return 0
	}
	return info.Partitions[0].Leader
}

// awaitInternalLeader polls until an internal topic has a leader.
func awaitInternalLeader(t *testing.T, c *client.Client, name string) uint32 {
	t.Helper()
	var leader uint32
	checkFor(t, 20*time.Second, name+" has a leader", func() error {
		if leader = internalLeader(t, c, name); leader == 0 {
			return fmt.Errorf("no leader of %s", name)
		}
		return nil
	})
	return leader
}

// placement is each partition's replica set as the cluster reports it,
// once no partition is being moved.
func placement(t *testing.T, c *client.Client, topic string) ([][]uint32, error) {
	info, err := c.DescribeTopic(ctxT(t, 5*time.Second), topic)
	if err != nil {
		return nil, err
	}
	var out [][]uint32
	for _, p := range info.Partitions {
		if len(p.TargetReplicas) > 0 {
			return nil, fmt.Errorf("partition %d is moving from %v to %v", p.Id, p.Replicas, p.TargetReplicas)
		}
		out = append(out, p.Replicas)
	}
	return out, nil
}

// replicaCounts counts the replicas each node holds.
func replicaCounts(pl [][]uint32) map[uint32]int {
	out := map[uint32]int{}
	for _, reps := range pl {
		for _, r := range reps {
			out[r]++
		}
	}
	return out
}

// waitCaughtUp polls until every replica of every partition reports the
// same high watermark, each asked on its own node.
func (tc *testCluster) waitCaughtUp(t *testing.T, topic string, pl [][]uint32) {
	t.Helper()
	checkFor(t, 60*time.Second, "every replica caught up", func() error {
		for p, reps := range pl {
			var hws []int64
			for _, id := range reps {
				cc := dialNode(t, tc.nodes[uint64(id)])
				info, err := cc.DescribeTopic(ctxT(t, 5*time.Second), topic)
				cc.Close()
				if err != nil {
					return err
				}
				hws = append(hws, info.Partitions[p].HighWatermark)
			}
			if slices.Min(hws) != slices.Max(hws) {
				return fmt.Errorf("partition %d: high watermarks %v on nodes %v", p, hws, reps)
			}
		}
		return nil
	})
}

// verifyReplicas stops every node and reads the logs from disk: the
// replicas of each partition (as pl places them) are identical offset for
// offset, every acknowledged record is at its offset, no id is stored
// twice, and nodes that hold no replica of a partition have no log of it
// left.
func (tc *testCluster) verifyReplicas(t *testing.T, topic string, pl [][]uint32, acked []ackedID) {
	t.Helper()
	for _, n := range tc.nodes {
		if n.cmd != nil {
			n.Stop(t)
		}
	}
	logs := map[int32]map[int64]string{}
	for p, reps := range pl {
		var first map[int64]string
		for _, id := range reps {
			got := readReplica(t, tc.nodes[uint64(id)].DataDir(), topic, p)
			if first == nil {
				first = got
				continue
			}
			if len(got) != len(first) {
				t.Fatalf("partition %d: node %d holds %d records, node %d %d", p, id, len(got), reps[0], len(first))
			}
			for off, v := range first {
				if got[off] != v {
					t.Fatalf("partition %d offset %d: node %d has %q, node %d %q", p, off, reps[0], v, id, got[off])
				}
			}
		}
		seen := map[string]int64{}
		for off, v := range first {
			if prev, dup := seen[v]; dup {
				t.Errorf("partition %d: %s stored twice, at %d and %d", p, v, prev, off)
			}
			seen[v] = off
		}
		logs[int32(p)] = first
		for id, n := range tc.nodes {
			if slices.Contains(reps, uint32(id)) {
				continue
			}
			if dirs, _ := filepath.Glob(filepath.Join(n.DataDir(), "replicas", fmt.Sprintf("%s-%d-*", topic, p))); len(dirs) > 0 {
				t.Errorf("node %d holds no replica of partition %d but still has its log %v", id, p, dirs)
			}
		}
	}
	for _, a := range acked {
		if got := logs[a.partition][a.offset]; got != a.id {
			t.Fatalf("%s was acknowledged at %d/%d, which holds %q", a.id, a.partition, a.offset, got)
		}
	}
	t.Logf("%d acknowledged records verified on every replica", len(acked))
}

// acksGrow waits until the producers have had n more acknowledgements.
func acksGrow(t *testing.T, load *loadProducers, what string, n int) {
	t.Helper()
	from := load.count()
	checkFor(t, 60*time.Second, what, func() error {
		if got := load.count() - from; got < n {
			return fmt.Errorf("%d acked", got)
		}
		return nil
	})
}

// TestAddAndRemoveNodeUnderLoad: three nodes hold an RF=3 topic of four
// partitions while three producers write to it (acks=all). A fourth node
// starts, known to none of the others' --peers; `herald cluster add-node
// 4 --wait` moves a fair share of the replicas (and of the preferred
// leaders) to it: it joins each group as a learner, catches up from the
// log, and becomes a voter through joint consensus, while the producers
// go on. Then `herald cluster remove-node 4 --wait` moves them all back,
// and add-node 4 moves replicas to it once more.
// After each step the replica counts (over every topic, the replicated
// __groups and __schedule included) are balanced, and at the end every
// replica's log is read from disk: identical across each partition's
// replicas, every acknowledged record at its offset, nothing twice, and
// no log left on a node that holds no replica of its partition.
func TestAddAndRemoveNodeUnderLoad(t *testing.T) {
	const parts = 4
	tc, c := clusterWithTopic(t, "orders", parts)
	load := startLoad(t, tc.addrs(), "orders", 3, parts, 2*time.Millisecond)
	acksGrow(t, load, "acks before the new node", 500)

	tc.add(t, 4)
	addrs := tc.addrs()
	out, errOut, code := herald(t, "", "cluster", "add-node", "4", "--dry-run", "--addr", addrs)
	if code != 0 || !strings.Contains(out, "would move") {
		t.Fatalf("add-node --dry-run: exit %d\n%s%s", code, out, errOut)
	}
	if pl, err := placement(t, c, "orders"); err != nil || replicaCounts(pl)[4] != 0 {
		t.Fatalf("a dry run moved replicas: %v %v", pl, err)
	}
	clusterMoves(t, addrs, "add-node", "4")
	pl, err := placement(t, c, "orders")
	if err != nil {
		t.Fatal(err)
	}
	// Balanced over every topic, the replicated internal ones included.
	counts := replicaCounts(pl)
	all := map[uint32]int{}
	for _, name := range []string{"orders", "__groups", "__schedule", "__txn"} {
		ipl, err := placement(t, c, name)
		if err != nil {
			t.Fatal(err)
		}
		for id, n := range replicaCounts(ipl) {
			all[id] += n
		}
	}
	lo, hi := all[1], all[1]
	for id := uint32(1); id <= 4; id++ {
		lo, hi = min(lo, all[id]), max(hi, all[id])
	}
	if hi-lo > 1 || counts[4] == 0 {
		t.Fatalf("replicas per node after add-node: %v over all topics, %v of orders (placement %v)", all, counts, pl)
	}
	checkFor(t, 20*time.Second, "node 4 leads a partition", func() error {
		c4 := dialNode(t, tc.nodes[4])
		defer c4.Close()
		for _, name := range []string{"orders", "__groups", "__schedule", "__txn"} {
			info, err := c4.DescribeTopic(ctxT(t, 5*time.Second), name)
			if err != nil {
				return err
			}
			for _, p := range info.Partitions {
				if p.Leader == 4 {
					return nil
				}
			}
		}
		return fmt.Errorf("no partition led by node 4")
	})
	acksGrow(t, load, "acks with node 4 in the cluster", 1000)

	out, errOut, code = herald(t, "", "cluster", "remove-node", "1", "--addr", addrs)
	if code == 0 || !strings.Contains(errOut, "controller voter") {
		t.Fatalf("remove-node of a controller voter: exit %d\n%s%s", code, out, errOut)
	}
	clusterMoves(t, addrs, "remove-node", "4")
	if pl, err = placement(t, c, "orders"); err != nil {
		t.Fatal(err)
	}
	if counts := replicaCounts(pl); counts[4] != 0 || counts[1] != parts || counts[2] != parts || counts[3] != parts {
		t.Fatalf("replicas per node after remove-node: %v", counts)
	}
	acksGrow(t, load, "acks after node 4 left", 1000)

	// And back again: node 4's new replicas are new incarnations (their
	// logs named by the new move), each a raft member under a raft id of
	// its own.
	clusterMoves(t, addrs, "add-node", "4")
	if pl, err = placement(t, c, "orders"); err != nil {
		t.Fatal(err)
	}
	acksGrow(t, load, "acks with node 4 back", 1000)
	load.finish()
	load.mu.Lock()
	acked, failed, lastErr := load.acked, load.failed, load.lastErr
	load.mu.Unlock()
	t.Logf("%d records acknowledged, %d failed (last error: %v)", len(acked), failed, lastErr)
	tc.waitCaughtUp(t, "orders", pl)
	c.Close()
	tc.verifyReplicas(t, "orders", pl, acked)
	// Every replica's stored membership names the partition's nodes, and
	// node 4, added back by a move, under a raft id of its own.
	on4 := 0
	for p, reps := range pl {
		for _, id := range reps {
			voters := replicaVoters(t, tc.nodes[uint64(id)].DataDir(), "orders", p)
			var nodes []uint32
			for _, v := range voters {
				nodes = append(nodes, uint32(heraldpb.ReplicaNode(v)))
				if heraldpb.ReplicaNode(v) == 4 && id == 4 {
					on4++
					if v == 4 {
						t.Errorf("partition %d: node 4's replica, added back by a move, has its node id as raft id", p)
					}
				}
			}
			if !slices.Equal(slices.Sorted(slices.Values(nodes)), slices.Sorted(slices.Values(reps))) {
				t.Errorf("partition %d: node %d's log has voters %#x, the placement %v", p, id, voters, reps)
			}
		}
	}
	if on4 == 0 {
		t.Errorf("node 4 holds no replica of orders after add-node (placement %v)", pl)
	}
}

// replicaVoters reads the voters (raft ids) of the membership stored with a
// replica's log (its node stopped).
func replicaVoters(t *testing.T, dataDir, topic string, part int) []uint64 {
	t.Helper()
	log := openReplica(t, dataDir, topic, part)
	defer log.Close()
	_, cs, err := log.InitialState()
	if err != nil {
		t.Fatalf("state of the replica of %s-%d in %s: %v", topic, part, dataDir, err)
	}
	return cs.Voters
}

// TestReplicasMoveOffDeadNode: four nodes, an RF=3 topic of four
// partitions, and a replica grace period of 3 s. A node that holds
// replicas is SIGKILLed under load; once it has been down for the grace
// period the controller re-creates its replicas on the other nodes
// (learner, catch-up, joint consensus), so every partition has three live
// replicas again. The node then comes back: it finds it holds no replica
// any more, stops them and deletes their logs. The logs on disk agree.
func TestReplicasMoveOffDeadNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four brokers")
	}
	const parts = 4
	tc := startCluster(t, 4, "--replica-grace", "3s")
	c, err := client.Dial(ctxT(t, 10*time.Second), tc.addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CreateTopic(ctxT(t, 15*time.Second), "orders", &heraldpb.TopicConfig{Partitions: parts, ReplicationFactor: 3}); err != nil {
		t.Fatal(err)
	}
	load := startLoad(t, tc.addrs(), "orders", 3, parts, 2*time.Millisecond)
	acksGrow(t, load, "acks before the kill", 500)
	pl, err := placement(t, c, "orders")
	if err != nil {
		t.Fatal(err)
	}
	// The victim: not node 1 (the test's client reaches the cluster
	// through every node, but the controller leader is likelier among
	// 1-3); any node with replicas would do.
	victim := uint32(4)
	if replicaCounts(pl)[victim] == 0 {
		t.Fatalf("node 4 holds no replica: %v", pl)
	}
	tc.nodes[uint64(victim)].Kill(t)
	killed := time.Now()
	checkFor(t, 60*time.Second, "the dead node's replicas re-created elsewhere", func() error {
		pl, err = placement(t, c, "orders")
		if err != nil {
			return err
		}
		if n := replicaCounts(pl)[victim]; n > 0 {
			return fmt.Errorf("node %d still holds %d replicas: %v", victim, n, pl)
		}
		return nil
	})
	t.Logf("replicas moved off node %d %v after its kill: %v", victim, time.Since(killed).Round(100*time.Millisecond), pl)
	acksGrow(t, load, "acks after the move", 1000)

	tc.nodes[uint64(victim)].Start(t)
	tc.waitRegistered(t, tc.nodes)
	checkFor(t, 30*time.Second, "the returning node dropped its old replicas", func() error {
		dirs, _ := filepath.Glob(filepath.Join(tc.nodes[uint64(victim)].DataDir(), "replicas", "orders-*"))
		if len(dirs) > 0 {
			return fmt.Errorf("still there: %v", dirs)
		}
		return nil
	})
	load.finish()
	load.mu.Lock()
	acked := load.acked
	load.mu.Unlock()
	tc.waitCaughtUp(t, "orders", pl)
	c.Close()
	tc.verifyReplicas(t, "orders", pl, acked)
}

// TestGroupReadsPartitionsHeldElsewhere: three nodes, a topic of three
// partitions with one replica each, so each node holds one partition.
// Consumer groups subscribed through a client that knows only node 1 are
// coordinated by the leader of __groups (the client follows
// NOT_COORDINATOR there), which reads the two partitions it holds no
// replica of through its stand-in, which forwards the fetches to the
// nodes that hold them. A group starting from the earliest record gets
// all 300; one starting at the latest (resolved on the nodes that hold
// the partitions, not from the coordinator's empty view of them) gets
// only the 30 produced after it subscribed.
func TestGroupReadsPartitionsHeldElsewhere(t *testing.T) {
	tc := startCluster(t, 3)
	c, err := client.Dial(ctxT(t, 10*time.Second), tc.addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CreateTopic(ctxT(t, 15*time.Second), "spread", &heraldpb.TopicConfig{Partitions: 3, ReplicationFactor: 1}); err != nil {
		t.Fatal(err)
	}
	pl, err := placement(t, c, "spread")
	if err != nil {
		t.Fatal(err)
	}
	if counts := replicaCounts(pl); counts[1] != 1 || counts[2] != 1 || counts[3] != 1 {
		t.Fatalf("placement %v: want one partition per node", pl)
	}
	produce := func(prefix string, n int) {
		t.Helper()
		p := c.NewProducer(client.WithAcks(heraldpb.Acks_ACKS_ALL), client.WithManualPartitions())
		for i := 0; i < n; i++ {
			if _, err := p.Send(ctxT(t, 10*time.Second), &client.Message{Topic: "spread", Partition: int32(i % 3), Value: fmt.Appendf(nil, "%s-%03d", prefix, i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	produce("early", 300)
	c1 := dialNode(t, tc.nodes[1])
	defer c1.Close()
	all, late := newSeen(), newSeen()
	subscribeT(t, c1, client.SubscribeOptions{Topic: "spread", Group: "all", From: client.Earliest()}, func(_ context.Context, m *client.Delivered) { all.add("a", m) })
	subscribeT(t, c1, client.SubscribeOptions{Topic: "spread", Group: "late", From: client.Latest()}, func(_ context.Context, m *client.Delivered) { late.add("l", m) })
	checkFor(t, 20*time.Second, "group all has every early record", func() error {
		if n := all.distinct(); n != 300 {
			return fmt.Errorf("%d of 300", n)
		}
		return nil
	})
	produce("later", 30)
	checkFor(t, 20*time.Second, "both groups have the later records", func() error {
		if n := all.distinct(); n != 330 {
			return fmt.Errorf("group all: %d of 330", n)
		}
		if n := late.distinct(); n != 30 {
			return fmt.Errorf("group late: %d of 30", n)
		}
		return nil
	})
	late.mu.Lock()
	defer late.mu.Unlock()
	for v := range late.n {
		if !strings.HasPrefix(v, "later-") {
			t.Fatalf("group late got %q, produced before it subscribed", v)
		}
	}
}

// TestGroupCoordinatorFailover: three nodes, an RF=3 topic, and a
// consumer group whose client knows all three. Groups are coordinated by
// the leader of the replicated __groups topic; that node is SIGKILLed
// while producers write. Another node's replica of __groups becomes
// leader, its groups manager rebuilds the group's progress from it, and
// the subscription (ended with the connection) subscribes again there:
// every acknowledged record is delivered, records acknowledged by the
// consumer before the kill are not delivered again beyond those whose
// progress was not yet committed, and group admin requests follow the
// coordinator too.
func TestGroupCoordinatorFailover(t *testing.T) {
	const parts = 3
	tc, c := clusterWithTopic(t, "orders", parts)
	coordinator := func() uint32 { return internalLeader(t, c, "__groups") }
	coord := awaitInternalLeader(t, c, "__groups")
	cc, err := client.Dial(ctxT(t, 10*time.Second), tc.addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	seen := newSeen()
	subscribeT(t, cc, client.SubscribeOptions{Topic: "orders", Group: "g", From: client.Earliest()}, func(_ context.Context, m *client.Delivered) {
		seen.add("m", m)
		m.Ack()
	})
	load := startLoad(t, tc.addrs(), "orders", 2, parts, 2*time.Millisecond)
	checkFor(t, 20*time.Second, "deliveries before the kill", func() error {
		if n := seen.distinct(); n < 500 {
			return fmt.Errorf("%d delivered", n)
		}
		return nil
	})
	if gi, err := cc.DescribeGroup(ctxT(t, 10*time.Second), "g"); err != nil || len(gi.Members) != 1 {
		t.Fatalf("describe group before the kill: %v %v", gi, err)
	}
	tc.nodes[uint64(coord)].Kill(t)
	killed := time.Now()
	t.Logf("killed node %d, the group coordinator", coord)
	var next uint32
	checkFor(t, 30*time.Second, "another node coordinates groups", func() error {
		if next = coordinator(); next == 0 || next == coord {
			return fmt.Errorf("leader of __groups: %d", next)
		}
		return nil
	})
	before := seen.distinct()
	checkFor(t, 30*time.Second, "deliveries resume", func() error {
		if n := seen.distinct(); n < before+500 {
			return fmt.Errorf("%d delivered since", n-before)
		}
		return nil
	})
	t.Logf("node %d coordinates groups now; deliveries resumed %v after the kill", next, time.Since(killed).Round(100*time.Millisecond))
	load.finish()
	load.mu.Lock()
	acked := load.acked
	load.mu.Unlock()
	checkFor(t, 30*time.Second, "every acknowledged record delivered", func() error {
		seen.mu.Lock()
		defer seen.mu.Unlock()
		missing := 0
		for _, a := range acked {
			if seen.n[a.id] == 0 {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d acknowledged records not delivered", missing, len(acked))
		}
		return nil
	})
	if gi, err := cc.DescribeGroup(ctxT(t, 10*time.Second), "g"); err != nil || len(gi.Members) != 1 {
		t.Fatalf("describe group after the failover: %v %v", gi, err)
	}
	t.Logf("%d records acknowledged to producers, %d deliveries of %d distinct records", len(acked), seen.total(), seen.distinct())
}

// TestDelayedMessagesSurviveSchedulerFailover: three nodes; __schedule is
// a replicated topic and the scheduler runs on its leader. Sixty delayed
// messages (4 s) are produced through a client that knows all nodes (each
// goes to its partition's leader, which forwards it to the scheduler's
// node when that is another), then the scheduler's node is SIGKILLed.
// The new leader of __schedule starts a scheduler that indexes the
// pending batches from its replica and fires them: every message is
// delivered, none before its time.
func TestDelayedMessagesSurviveSchedulerFailover(t *testing.T) {
	tc, c := clusterWithTopic(t, "orders", 3)
	leaderOfInternal := func(name string) uint32 { return internalLeader(t, c, name) }
	sched := awaitInternalLeader(t, c, "__schedule")
	cc, err := client.Dial(ctxT(t, 10*time.Second), tc.addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	type delivery struct {
		at    time.Time
		count int
	}
	var mu sync.Mutex
	got := map[string]*delivery{}
	subscribeT(t, cc, client.SubscribeOptions{Topic: "orders", Group: "delayed", From: client.Earliest()}, func(_ context.Context, m *client.Delivered) {
		mu.Lock()
		d := got[string(m.Value)]
		if d == nil {
			d = &delivery{at: time.Now()}
			got[string(m.Value)] = d
		}
		d.count++
		mu.Unlock()
		m.Ack()
	})
	const n, delay = 60, 4 * time.Second
	p := c.NewProducer(client.WithAcks(heraldpb.Acks_ACKS_ALL), client.WithManualPartitions())
	sent := time.Now()
	for i := 0; i < n; i++ {
		if _, err := p.Send(ctxT(t, 10*time.Second), &client.Message{Topic: "orders", Partition: int32(i % 3), Value: fmt.Appendf(nil, "d-%03d", i), Delay: delay}); err != nil {
			t.Fatalf("delayed produce %d: %v", i, err)
		}
	}
	tc.nodes[uint64(sched)].Kill(t)
	t.Logf("%d delayed messages acknowledged in %v; killed node %d, which ran the scheduler", n, time.Since(sent).Round(time.Millisecond), sched)
	defer func() {
		if t.Failed() {
			for id, nd := range tc.nodes {
				if nd.cmd == nil {
					continue
				}
				resp, err := http.Get("http://" + nd.AdminAddr() + "/metrics")
				if err != nil {
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				for _, line := range strings.Split(string(body), "\n") {
					if strings.HasPrefix(line, "herald_schedule") || strings.HasPrefix(line, "herald_remote_partition") || strings.HasPrefix(line, "herald_cluster_forwarded") || strings.HasPrefix(line, "herald_not_enough") {
						t.Logf("node %d: %s", id, line)
					}
				}
			}
		}
	}()
	checkFor(t, 40*time.Second, "every delayed message delivered", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(got) != n {
			return fmt.Errorf("%d of %d delivered", len(got), n)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	first := time.Time{}
	for v, d := range got {
		if d.at.Before(sent.Add(delay)) {
			t.Fatalf("%s delivered %v after the first send, before its delay of %v", v, d.at.Sub(sent), delay)
		}
		if first.IsZero() || d.at.Before(first) {
			first = d.at
		}
	}
	if next := leaderOfInternal("__schedule"); next == 0 || next == sched {
		t.Fatalf("leader of __schedule after the kill: %d", next)
	}
	t.Logf("all %d delivered; the first %v after the first send", n, first.Sub(sent).Round(time.Millisecond))
}

// TestSingleNodeRestartsAsCluster: a node that ran alone (with its
// node-local __groups and __schedule) restarts as a one-node cluster. Its
// old internal topics stay on disk unserved, the controller creates the
// replicated ones, and consumer groups and delayed messages work there;
// its ordinary topic is still served as a local topic.
func TestSingleNodeRestartsAsCluster(t *testing.T) {
	dir := t.TempDir()
	alone := startProc(t, dir)
	c := dial(t, alone)
	createTopic(t, c, "before", 1)
	produceN(t, c, "before", "b", 10, 1)
	c.Close()
	alone.Stop(t)

	cl, health := pairPorts(t)
	n := startProc(t, dir, "--node-id", "1", "--cluster", cl, "--cluster-health", health, "--peers", "1@"+cl)
	if !strings.Contains(n.logs(), "node-local internal topic") {
		t.Fatalf("no warning about the old internal topics:\n%s", n.logs())
	}
	c = dial(t, n)
	defer c.Close()
	checkFor(t, 20*time.Second, "a topic created in the cluster", func() error {
		// THROTTLED (retriable) until the node's registration is applied.
		_, err := c.CreateTopic(ctxT(t, 15*time.Second), "after", &heraldpb.TopicConfig{Partitions: 1})
		if err != nil && !client.IsRetryable(err) {
			t.Fatalf("creating a topic: %v", err)
		}
		return err
	})
	seen := newSeen()
	checkFor(t, 20*time.Second, "__groups and __schedule replicated", func() error {
		for _, name := range []string{"__groups", "__schedule"} {
			info, err := c.DescribeTopic(ctxT(t, 5*time.Second), name)
			if err != nil {
				return err
			}
			if info.Partitions[0].Leader != 1 {
				return fmt.Errorf("%s has no leader yet", name)
			}
		}
		return nil
	})
	for _, topicName := range []string{"before", "after"} {
		subscribeT(t, c, client.SubscribeOptions{Topic: topicName, Group: "g-" + topicName, From: client.Earliest()}, func(_ context.Context, m *client.Delivered) {
			seen.add("m", m)
			m.Ack()
		})
	}
	p := c.NewProducer(client.WithAcks(heraldpb.Acks_ACKS_ALL), client.WithManualPartitions())
	if _, err := p.Send(ctxT(t, 10*time.Second), &client.Message{Topic: "after", Partition: 0, Value: []byte("delayed"), Delay: 500 * time.Millisecond}); err != nil {
		t.Fatalf("delayed produce: %v", err)
	}
	checkFor(t, 20*time.Second, "the old records and the delayed one delivered", func() error {
		if got := seen.distinct(); got != 11 {
			return fmt.Errorf("%d of 11 delivered", got)
		}
		return nil
	})
}
