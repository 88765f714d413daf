package e2e

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/heraldmq/herald/chaos/cluster"
	"github.com/heraldmq/herald/chaos/nemesis"
	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// Network faults are written with the chaos suite's building blocks
// (docs/chaos.md): chaos/cluster starts the nodes, each in a network
// namespace of its own, and chaos/nemesis cuts the links between them.
// Clients run on the host and still reach a node cut off from its peers.
// The tests need root and iproute2, and skip without them.

// chaosNode is a node of a chaos cluster, for the helpers that ask a
// node's admin endpoint (getView, waitClusterView).
type chaosNode cluster.Node

func (n chaosNode) AdminAddr() string { return n.Admin }

// startNetNSCluster starts n nodes of the e2e binary, each in a network
// namespace of its own, and stops them (and removes the namespaces) at
// cleanup, logging the tail of each node's log if the test failed. It
// skips the test where namespaces cannot be made: without root or
// iproute2 (cluster.ErrUnsupported), or where the kernel or container
// refuses them.
func startNetNSCluster(t *testing.T, n int) *cluster.Cluster {
	t.Helper()
	cfg := cluster.Config{Binary: heraldBin, Nodes: n, Dir: t.TempDir(), NetNS: true}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); errors.Is(err, cluster.ErrUnsupported) {
		t.Skipf("network chaos: %v", err)
	}
	probe := fmt.Sprintf("hxprobe%x", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		t.Skipf("network chaos: cannot make a network namespace here: %v: %s", err, strings.TrimSpace(string(out)))
	}
	exec.Command("ip", "netns", "del", probe).Run()
	c, err := cluster.Start(ctxT(t, 2*time.Minute), cfg)
	if errors.Is(err, cluster.ErrUnsupported) {
		t.Skipf("network chaos: %v", err)
	}
	if err != nil {
		t.Fatalf("starting the cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.LogTails())
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	})
	return c
}

// chaosNodes is the cluster's nodes by id, leaving out those in skip.
func chaosNodes(c *cluster.Cluster, skip ...uint64) map[uint64]chaosNode {
	out := map[uint64]chaosNode{}
	for _, n := range c.Nodes() {
		if !slices.Contains(skip, n.ID) {
			out[n.ID] = chaosNode(n)
		}
	}
	return out
}

// produceAlone sends n records (values prefix-0000, prefix-0001, ...) to
// partition 0 of topic t on the node at addr, over a plain socket: an SDK
// client would learn the other nodes from the metadata and follow the
// partition's leader there. Each record is one idempotent produce request
// with acks=all (a fresh producer id, sequences from 0), as the SDK's
// default producer sends them: the node serves it with its own replica
// and never forwards it to the leader elsewhere (a plain produce to a
// follower is forwarded, at most once, and may be written by the leader
// after a heal). All are sent at once; it waits up to wait for the
// answers and returns how many were acknowledged, and the answers by kind
// ("acknowledged", an error code, or "no answer"). It closes the socket.
func produceAlone(t *testing.T, addr, prefix string, n int, wait time.Duration) (acked int, answers map[string]int) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer nc.Close()
	rc := &rawConn{t: t, c: nc, r: bufio.NewReader(nc)}
	rawHello(t, rc)
	part, pid := uint32(0), rand.Uint64()|1
	for i := 0; i < n; i++ {
		batch, err := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte(fmt.Sprintf("%s-%04d", prefix, i))}}})
		if err != nil {
			t.Fatal(err)
		}
		rc.send(&heraldpb.Frame{Id: uint64(i + 2), Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
			Topic: "t", Partition: &part, Acks: heraldpb.Acks_ACKS_ALL, Records: batch, ProducerId: pid, BaseSequence: int64(i)}}})
	}
	answers = map[string]int{}
	nc.SetReadDeadline(time.Now().Add(wait))
	got := 0
	for ; got < n; got++ {
		var hdr [4]byte
		if _, err := io.ReadFull(rc.r, hdr[:]); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			t.Fatalf("reading the answers of %s: %v", addr, err)
		}
		buf := make([]byte, binary.BigEndian.Uint32(hdr[:]))
		if _, err := io.ReadFull(rc.r, buf); err != nil {
			t.Fatalf("reading the answers of %s: %v", addr, err)
		}
		f, err := heraldpb.DecodeFrame(buf)
		if err != nil {
			t.Fatalf("%s sent an undecodable frame: %v", addr, err)
		}
		switch {
		case f.GetProduceResponse() != nil:
			acked++
			answers["acknowledged"]++
		case f.GetError() != nil:
			answers[f.GetError().GetCode().String()]++
		default:
			t.Fatalf("%s answered a produce with %v", addr, f)
		}
	}
	if got < n {
		answers["no answer"] = n - got
	}
	return acked, answers
}

// TestChaosNetworkPartition: the leader of an RF=3 partition is cut off
// from the two other nodes (nemesis.IsolateLeader) while clients can
// still reach it. Alone it cannot commit: writes sent to it alone are
// never acknowledged, before the majority's election or after it, while
// the majority elects a new leader and acknowledges writes. Once the
// majority has dropped it from membership, the links are restored: the
// membership heals without a restart, the node drops what it appended
// alone and catches up; the three replicas are identical on disk, hold
// every record the majority acknowledged and none of those sent to the
// cut-off node.
//
// Which node rejoins under a new member id is a race. The majority
// blocks the cut-off node's member id, and the cut-off node, which saw
// the two others leave, blocks theirs. After the heal each node asks its
// peers whether they blocked it; the first to find out rejoins, and its
// new incarnation has forgotten its own blocks. So either the cut-off
// node rejoins, or the two others do and it keeps its member id (about
// half the runs here).
func TestChaosNetworkPartition(t *testing.T) {
	c := startNetNSCluster(t, 3)
	var (
		mu       sync.Mutex
		isolated []uint64
	)
	env := nemesis.NewEnv(c, 1, func(ev nemesis.Event) {
		t.Log(ev)
		if ev.Op == nemesis.OpStart {
			mu.Lock()
			isolated = ev.Nodes
			mu.Unlock()
		}
	})
	cl, err := c.Dial(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.CreateTopic(ctxT(t, 15*time.Second), "t", &heraldpb.TopicConfig{Partitions: 1, ReplicationFactor: 3}); err != nil {
		t.Fatal(err)
	}
	acked := map[string]int64{}
	produce := func(cl *client.Client, prefix string, n int) (ok, failed int) {
		p := cl.NewProducer(client.WithManualPartitions())
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
	if ok, _ := produce(cl, "before", 100); ok != 100 {
		t.Fatalf("%d of 100 acknowledged before the cut", ok)
	}
	before := waitClusterView(t, "three nodes before the cut", chaosNodes(c), 1, 2, 3)

	cut := nemesis.IsolateLeader(env, "t", 0)
	if err := cut.Start(ctxT(t, 40*time.Second)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	cutOff := isolated
	mu.Unlock()
	if len(cutOff) != 1 {
		t.Fatalf("isolated nodes %v, want the leader alone", cutOff)
	}
	old := cutOff[0]
	oldNode, err := c.Node(old)
	if err != nil {
		t.Fatal(err)
	}

	// The minority: writes sent to the old leader alone.
	if ok, answers := produceAlone(t, oldNode.Addr, "minority", 10, 3*time.Second); ok != 0 {
		t.Fatalf("the cut-off node acknowledged %d of 10 writes: %v", ok, answers)
	} else {
		t.Logf("the cut-off node's answers to 10 writes: %v", answers)
	}
	// The majority elects a new leader and goes on.
	majority := chaosNodes(c, old)
	var others []string
	var ids []uint64
	for _, id := range c.IDs() {
		if n, ok := majority[id]; ok {
			others = append(others, n.Addr)
			ids = append(ids, id)
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
	// Every node is asked alone: a majority of the replicas must name the
	// new leader, whatever the cut-off node believes.
	if now, err := c.Leader(ctxT(t, 10*time.Second), "t", 0); err != nil || now == old {
		t.Fatalf("leader after the cut: %d (was %d): %v", now, old, err)
	}
	// Again while the majority runs: the cut-off node still acknowledges nothing.
	if ok, answers := produceAlone(t, oldNode.Addr, "minority2", 5, 3*time.Second); ok != 0 {
		t.Fatalf("the cut-off node acknowledged %d of 5 writes after the election: %v", ok, answers)
	} else {
		t.Logf("the cut-off node's answers to 5 writes after the election: %v", answers)
	}

	// Keep it cut until the majority drops it from membership (which
	// blocks its member id for good).
	waitClusterView(t, "the majority without the cut-off node", majority, ids...)
	if err := cut.Stop(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	// The blocks the cut left are resolved by rejoins under new member
	// ids, in the same processes (which side: see above): then every node
	// sees the three, each under the member id it gives itself.
	var views map[uint64]clusterView
	checkFor(t, 40*time.Second, "the three nodes agreeing on their members after the heal", func() error {
		views = waitClusterView(t, "all three after the heal", chaosNodes(c), 1, 2, 3)
		rejoins := 0
		for id, v := range views {
			rejoins += v.Rejoins
			for other, w := range views {
				if w.memberOf(id) != v.Self.MemberID {
					return fmt.Errorf("node %d sees node %d as %s, which calls itself %s", other, id, w.memberOf(id), v.Self.MemberID)
				}
			}
		}
		if rejoins == 0 {
			return fmt.Errorf("no node rejoined under a new member id")
		}
		return nil
	})
	for _, id := range c.IDs() {
		if !c.Running(id) {
			t.Fatalf("node %d's process exited", id)
		}
		v := views[id]
		t.Logf("node %d: member id %s before the cut, %s after (%d rejoins)", id, before[id].Self.MemberID, v.Self.MemberID, v.Rejoins)
	}
	if err := c.Settle(ctxT(t, 40*time.Second)); err != nil {
		t.Fatal(err)
	}
	if ok, _ := produce(maj, "after", 50); ok != 50 {
		t.Fatalf("%d of 50 acknowledged after the heal", ok)
	}
	checkFor(t, 30*time.Second, "the healed node caught up", func() error {
		hws, err := highWatermarksAt(t, "t", 0, c.Addrs()...)
		if err != nil {
			return err
		}
		for i, hw := range hws {
			if hw != 450 {
				return fmt.Errorf("node %d's high watermark %d (all %v), want 450", c.IDs()[i], hw, hws)
			}
		}
		return nil
	})
	cl.Close()
	maj.Close()
	for _, id := range c.IDs() {
		if err := c.Shutdown(ctxT(t, 30*time.Second), id); err != nil {
			t.Fatal(err)
		}
	}
	var logs []map[int64]string
	for _, n := range c.Nodes() {
		logs = append(logs, readReplica(t, n.DataDir, "t", 0))
	}
	for i := 1; i < len(logs); i++ {
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
