package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Network chaos with Linux network namespaces: each node runs in its own
// namespace with two links, one to a cluster bridge (node-to-node
// traffic) and one to a client bridge that the test reaches from the host.
// Cutting a node's cluster link leaves it running and reachable by
// clients, but alone. Needs root and iproute2 (`ip netns`); the tests are
// skipped unless HERALD_CHAOS is set:
//
//	HERALD_CHAOS=1 go test -run Chaos -v ./e2e/

// netLab is the namespaces and bridges of one test.
type netLab struct {
	t      *testing.T
	tag    string // keeps device names unique per test process
	n      int
	bridge [2]string // cluster, client
}

func (l *netLab) ns(i int) string        { return fmt.Sprintf("hn%s%d", l.tag, i) }
func (l *netLab) clusterIP(i int) string { return fmt.Sprintf("10.77.1.%d", i) }
func (l *netLab) clientIP(i int) string  { return fmt.Sprintf("10.77.2.%d", i) }
func (l *netLab) clusterLink(i int) string {
	return fmt.Sprintf("hc%s%d", l.tag, i)
}

func (l *netLab) run(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func newNetLab(t *testing.T, n int) *netLab {
	if os.Getenv("HERALD_CHAOS") == "" {
		t.Skip("set HERALD_CHAOS=1 to run the network chaos tests (needs root and ip netns)")
	}
	l := &netLab{t: t, tag: fmt.Sprintf("%x", os.Getpid()%0xfff), n: n}
	l.bridge = [2]string{"hbc" + l.tag, "hbk" + l.tag}
	t.Cleanup(func() {
		for i := 1; i <= n; i++ {
			exec.Command("ip", "netns", "del", l.ns(i)).Run()
		}
		for _, b := range l.bridge {
			exec.Command("ip", "link", "del", b).Run()
		}
	})
	for _, b := range l.bridge {
		l.run("link", "add", b, "type", "bridge")
		l.run("link", "set", b, "up")
	}
	l.run("addr", "add", "10.77.2.254/24", "dev", l.bridge[1])
	for i := 1; i <= n; i++ {
		ns := l.ns(i)
		l.run("netns", "add", ns)
		l.run("-n", ns, "link", "set", "lo", "up")
		for k, ip := range []string{l.clusterIP(i), l.clientIP(i)} {
			host := l.clusterLink(i)
			if k == 1 {
				host = fmt.Sprintf("hk%s%d", l.tag, i)
			}
			dev := fmt.Sprintf("eth%d", k)
			l.run("link", "add", host, "type", "veth", "peer", "name", dev, "netns", ns)
			l.run("link", "set", host, "master", l.bridge[k], "up")
			l.run("-n", ns, "addr", "add", ip+"/24", "dev", dev)
			l.run("-n", ns, "link", "set", dev, "up")
		}
	}
	return l
}

// cut takes node i's cluster link down (true) or up again (false).
func (l *netLab) cut(i int, down bool) {
	state := "up"
	if down {
		state = "down"
	}
	l.run("link", "set", l.clusterLink(i), state)
}

// startLabCluster starts node i in namespace i, clients and admin on the
// client network, cluster traffic on the cluster network.
func startLabCluster(t *testing.T, l *netLab) *testCluster {
	var peers []string
	for i := 1; i <= l.n; i++ {
		peers = append(peers, fmt.Sprintf("%d@%s:7501", i, l.clusterIP(i)))
	}
	tc := &testCluster{nodes: map[uint64]*proc{}}
	for i := 1; i <= l.n; i++ {
		tc.nodes[uint64(i)] = startWrapped(t, []string{"ip", "netns", "exec", l.ns(i)}, t.TempDir(),
			"--node-id", fmt.Sprint(i), "--listen", l.clientIP(i)+":7420", "--admin", l.clientIP(i)+":7480",
			"--cluster", l.clusterIP(i)+":7501", "--cluster-health", l.clusterIP(i)+":7502", "--peers", strings.Join(peers, ","))
	}
	tc.waitRegistered(t, tc.nodes)
	return tc
}

// TestChaosNetworkPartition: the leader of an RF=3 partition is cut off
// from the two other nodes while clients can still reach it. Alone it
// cannot commit: a producer talking only to it never gets an
// acknowledgement, while the majority elects a new leader and acknowledges
// writes. Once the majority has dropped it from membership, it is healed:
// it rejoins under a new member id without a restart, drops
// what it appended alone and catches up; the three replicas are identical
// on disk, hold every record the majority acknowledged and none of those
// sent to the cut-off node.
func TestChaosNetworkPartition(t *testing.T) {
	lab := newNetLab(t, 3)
	tc := startLabCluster(t, lab)
	c, err := client.Dial(ctxT(t, 10*time.Second), tc.addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CreateTopic(ctxT(t, 15*time.Second), "t", &heraldpb.TopicConfig{Partitions: 1, ReplicationFactor: 3}); err != nil {
		t.Fatal(err)
	}
	acked := map[string]int64{}
	produce := func(c *client.Client, prefix string, n int, opts ...client.ProducerOpt) (ok, failed int) {
		p := c.NewProducer(append(opts, client.WithManualPartitions())...)
		for i := 0; i < n; i++ {
			id := fmt.Sprintf("%s-%04d", prefix, i)
			r, err := p.Send(ctxT(t, 30*time.Second), &client.Message{Topic: "t", Partition: 0, Value: []byte(id)})
			if err != nil {
				failed++
				continue
			}
			ok++
			acked[id] = r.Offset
		}
		return ok, failed
	}
	if ok, _ := produce(c, "before", 100); ok != 100 {
		t.Fatalf("%d of 100 acknowledged before the cut", ok)
	}
	var old uint64
	checkFor(t, 10*time.Second, "a leader", func() error {
		if old = uint64(leaderOf(t, c, "t", 0)); old == 0 {
			return fmt.Errorf("no leader")
		}
		return nil
	})
	before, err := getView(t, tc.nodes[old])
	if err != nil {
		t.Fatal(err)
	}
	lab.cut(int(old), true)
	t.Logf("cut node %d (the leader) off the cluster network", old)

	// The minority: a client that only reaches the old leader, with no
	// retries elsewhere.
	lone, err := client.Dial(ctxT(t, 10*time.Second), tc.nodes[old].Addr(), client.WithRequestTimeout(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lone.Close()
	if ok, failed := produce(lone, "minority", 10, client.WithMaxRetries(0), client.WithFailoverTimeout(0)); ok != 0 {
		t.Fatalf("the cut-off node acknowledged %d of %d writes", ok, ok+failed)
	}
	// The majority elects a new leader and goes on.
	var others []string
	for id, p := range tc.nodes {
		if id != old {
			others = append(others, p.Addr())
		}
	}
	maj, err := client.Dial(ctxT(t, 10*time.Second), strings.Join(others, ","))
	if err != nil {
		t.Fatal(err)
	}
	defer maj.Close()
	if ok, failed := produce(maj, "majority", 300); ok != 300 {
		t.Fatalf("the majority acknowledged %d of 300 writes (%d failed)", ok, failed)
	}
	if now := uint64(leaderOf(t, maj, "t", 0)); now == old || now == 0 {
		t.Fatalf("leader after the cut: %d (was %d)", now, old)
	}
	// Again while the majority runs: the cut-off node still acknowledges nothing.
	if ok, _ := produce(lone, "minority2", 5, client.WithMaxRetries(0), client.WithFailoverTimeout(0)); ok != 0 {
		t.Fatalf("the cut-off node acknowledged %d writes after the election", ok)
	}

	// Keep it cut until the majority drops it from membership (which
	// blocks its member id for good).
	majority := map[uint64]*proc{}
	var ids []uint64
	for id, p := range tc.nodes {
		if id != old {
			majority[id] = p
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	waitClusterView(t, "the majority without the cut-off node", majority, ids...)
	lab.cut(int(old), false)
	t.Logf("healed node %d", old)
	views := waitClusterView(t, "all three after the heal", tc.nodes, 1, 2, 3)
	t.Logf("node %d's member id: %s before the cut, %s after (%d rejoins)", old, before.Self.MemberID, views[old].Self.MemberID, views[old].Rejoins)
	tc.waitRegistered(t, tc.nodes)
	if ok, _ := produce(maj, "after", 50); ok != 50 {
		t.Fatalf("%d of 50 acknowledged after the heal", ok)
	}
	checkFor(t, 30*time.Second, "the healed node caught up", func() error {
		hws, err := tc.highWatermarks(t, "t", 0)
		if err != nil {
			return err
		}
		if hws[0] != 450 || hws[1] != 450 || hws[2] != 450 {
			return fmt.Errorf("high watermarks %v, want 450", hws)
		}
		return nil
	})
	c.Close()
	lone.Close()
	maj.Close()
	for _, id := range []uint64{1, 2, 3} {
		tc.nodes[id].Stop(t)
	}
	var logs []map[int64]string
	for _, id := range []uint64{1, 2, 3} {
		logs = append(logs, readReplica(t, tc.nodes[id].DataDir(), "t", 0))
	}
	for i := 1; i < 3; i++ {
		if len(logs[i]) != len(logs[0]) {
			t.Fatalf("node %d holds %d records, node 1 %d", i+1, len(logs[i]), len(logs[0]))
		}
		for off, v := range logs[0] {
			if logs[i][off] != v {
				t.Fatalf("offset %d: node 1 has %q, node %d %q", off, v, i+1, logs[i][off])
			}
		}
	}
	for id, off := range acked {
		if logs[0][off] != id {
			t.Fatalf("%s was acknowledged at %d, which holds %q", id, off, logs[0][off])
		}
	}
	for off, v := range logs[0] {
		if strings.HasPrefix(v, "minority") {
			t.Fatalf("offset %d holds %s, sent to the cut-off node", off, v)
		}
	}
}
