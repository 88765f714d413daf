package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// clusterView is the admin endpoint /cluster of a node in a cluster.
type clusterView struct {
	Self struct {
		NodeID   uint64 `json:"node_id"`
		MemberID string `json:"member_id"`
	} `json:"self"`
	Members []struct {
		NodeID   uint64 `json:"node_id"`
		MemberID string `json:"member_id"`
		Address  string `json:"address"`
	} `json:"members"`
	Rejoins int `json:"rejoins"`
}

// adminNode is a broker whose admin endpoint a helper asks: a *proc of
// this harness, or a node of a chaos cluster (chaosNode).
type adminNode interface{ AdminAddr() string }

func getView(t *testing.T, p adminNode) (clusterView, error) {
	t.Helper()
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + p.AdminAddr() + "/cluster")
	if err != nil {
		return clusterView{}, err
	}
	defer resp.Body.Close()
	var v clusterView
	err = json.NewDecoder(resp.Body).Decode(&v)
	return v, err
}

func (v clusterView) ids() []uint64 {
	var out []uint64
	for _, m := range v.Members {
		out = append(out, m.NodeID)
	}
	return out
}

func (v clusterView) memberOf(id uint64) string {
	for _, m := range v.Members {
		if m.NodeID == id {
			return m.MemberID
		}
	}
	return ""
}

// waitClusterView polls the live nodes' /cluster until each sees exactly want.
func waitClusterView[N adminNode](t *testing.T, what string, nodes map[uint64]N, want ...uint64) map[uint64]clusterView {
	t.Helper()
	deadline := time.Now().Add(40 * time.Second)
	for {
		views := map[uint64]clusterView{}
		var bad []string
		for id, p := range nodes {
			v, err := getView(t, p)
			if err != nil || !slices.Equal(v.ids(), want) {
				bad = append(bad, fmt.Sprintf("node %d sees %v (%v)", id, v.ids(), err))
			}
			views[id] = v
		}
		if len(bad) == 0 {
			return views
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: want %v; %s", what, want, strings.Join(bad, "; "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestClusterMembership: three `herald serve --node-id N --cluster ...
// --peers ...` processes see each other under their node ids. A SIGKILLed
// node leaves every view and returns under a new member id when restarted.
// A node frozen with SIGSTOP long enough for the others to drop (and so
// block) it rejoins under a new member id by itself after SIGCONT, without
// a restart.
func TestClusterMembership(t *testing.T) {
	// A peer's health endpoint is at its cluster port + 1: pick pairs.
	cl, health := map[uint64]string{}, map[uint64]string{}
	for id := uint64(1); id <= 3; id++ {
		cl[id], health[id] = pairPorts(t)
	}
	var peers []string
	for id := uint64(1); id <= 3; id++ {
		peers = append(peers, fmt.Sprintf("%d@%s", id, cl[id]))
	}
	nodes := map[uint64]*proc{}
	args := func(id uint64) []string {
		return []string{"--node-id", fmt.Sprint(id), "--cluster", cl[id], "--cluster-health", health[id], "--peers", strings.Join(peers, ",")}
	}
	for id := uint64(1); id <= 3; id++ {
		nodes[id] = startProc(t, t.TempDir(), args(id)...)
	}
	views := waitClusterView(t, "three nodes", nodes, 1, 2, 3)
	for id, v := range views {
		if v.Self.NodeID != id || v.memberOf(id) != v.Self.MemberID {
			t.Fatalf("node %d: self %+v in %+v", id, v.Self, v.Members)
		}
	}

	// SIGKILL and restart: a new member id.
	old3 := views[1].memberOf(3)
	n3 := nodes[3]
	n3.Kill(t)
	delete(nodes, 3)
	waitClusterView(t, "node 3 killed", nodes, 1, 2)
	n3.Start(t)
	nodes[3] = n3
	views = waitClusterView(t, "node 3 restarted", nodes, 1, 2, 3)
	if m := views[1].memberOf(3); m == old3 {
		t.Fatalf("node 3 returned under its old member id %s", m)
	}

	// SIGSTOP: the others drop node 2 and block its member id; after
	// SIGCONT it rejoins under a new one, in the same process.
	freezeAndRejoin(t, nodes, 2)
}

// freezeAndRejoin stops node id of a three-node cluster with SIGSTOP until
// the others drop it, resumes it with SIGCONT, and waits until it has
// rejoined under a new member id that every node sees; then checks that no
// node rejoins again over the next 5 s (more than the 3 checks a node
// missing from its own view waits before it rejoins).
func freezeAndRejoin(t *testing.T, nodes map[uint64]*proc, id uint64) {
	t.Helper()
	var others []uint64
	for o := uint64(1); o <= 3; o++ {
		if o != id {
			others = append(others, o)
		}
	}
	views := waitClusterView(t, "three nodes", nodes, 1, 2, 3)
	old := views[others[0]].memberOf(id)
	p := nodes[id]
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	delete(nodes, id)
	waitClusterView(t, fmt.Sprintf("node %d frozen", id), nodes, others...)
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	nodes[id] = p
	deadline := time.Now().Add(40 * time.Second)
	for {
		views = waitClusterView(t, fmt.Sprintf("node %d back", id), nodes, 1, 2, 3)
		now := views[id].Self.MemberID
		if views[id].Rejoins >= 1 && now != old && views[others[0]].memberOf(id) == now && views[others[1]].memberOf(id) == now {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %d did not rejoin under a new member id seen by all: rejoins %d, self %s (was %s), seen as %s and %s",
				id, views[id].Rejoins, now, old, views[others[0]].memberOf(id), views[others[1]].memberOf(id))
		}
		time.Sleep(50 * time.Millisecond)
	}
	settled := map[uint64]int{}
	for n, v := range views {
		settled[n] = v.Rejoins
	}
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		for n, v := range waitClusterView(t, "all three", nodes, 1, 2, 3) {
			if v.Rejoins != settled[n] {
				t.Fatalf("node %d rejoined again (%d rejoins, then %d)", n, settled[n], v.Rejoins)
			}
		}
	}
}

// pairPorts returns two loopback addresses with consecutive ports, both
// free a moment ago: a cluster address and its health endpoint (port + 1).
// They are picked at random below the kernel's ephemeral range, where
// nothing else binds them meanwhile: a port taken from the ephemeral range
// (port 0) can be handed to another process's outgoing connection or
// listener between this check and the node's bind, as parallel test
// packages do ("bind: address already in use" in CI).
func pairPorts(t *testing.T) (string, string) {
	t.Helper()
	lo := ephemeralLow()
	for i := 0; i < 200; i++ {
		port := 10000 + rand.IntN(lo-10001)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		ln2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+1))
		ln.Close()
		if err != nil {
			continue
		}
		ln2.Close()
		return fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf("127.0.0.1:%d", port+1)
	}
	t.Fatal("no two consecutive free ports")
	return "", ""
}

// ephemeralLow is the lowest port of the kernel's ephemeral range
// (32768 where it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	var lo, hi int
	if n, _ := fmt.Sscan(string(b), &lo, &hi); n != 2 || lo <= 12000 {
		return 32768
	}
	return lo
}

// startEtcd runs a real etcd on loopback for the test. Without an etcd
// binary the test is skipped, unless HERALD_REQUIRE_ETCD is set (.ci/run
// installs etcd-server and sets it), where it fails.
func startEtcd(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		if os.Getenv("HERALD_REQUIRE_ETCD") != "" {
			t.Fatal("etcd is not installed (Debian package etcd-server)")
		}
		t.Skip("etcd is not installed (Debian package etcd-server; .ci/run installs it)")
	}
	client, peer := pairPorts(t)
	cmd := exec.Command(bin, "--data-dir", t.TempDir(), "--name", "herald-test",
		"--listen-client-urls", "http://"+client, "--advertise-client-urls", "http://"+client,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "herald-test=http://"+peer)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("etcd log:\n%s", log.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + client + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return client
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd did not become healthy: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestClusterMembershipEtcd: with --cluster-provider etcd, three nodes find
// each other through a real etcd, a SIGKILLed node leaves the views, and a
// frozen node (SIGSTOP past its etcd lease, so the others drop it and block
// its member id) rejoins under a new member id after SIGCONT, without a
// restart.
func TestClusterMembershipEtcd(t *testing.T) {
	endpoint := startEtcd(t)
	nodes := map[uint64]*proc{}
	for id := uint64(1); id <= 3; id++ {
		addr, _ := pairPorts(t)
		nodes[id] = startProc(t, t.TempDir(), "--node-id", fmt.Sprint(id), "--cluster", addr,
			"--cluster-provider", "etcd", "--etcd", endpoint)
	}
	waitClusterView(t, "three nodes through etcd", nodes, 1, 2, 3)
	freezeAndRejoin(t, nodes, 3)
	nodes[2].Kill(t)
	delete(nodes, 2)
	waitClusterView(t, "node 2 killed", nodes, 1, 3)
}

type controllerView struct {
	Voter  bool     `json:"voter"`
	Voters []uint64 `json:"voters"`
	Leader uint64   `json:"leader"`
	Nodes  []struct {
		NodeID        uint64 `json:"node_id"`
		ClientAddress string `json:"client_address"`
		MemberID      string `json:"member_id"`
	} `json:"nodes"`
}

func getController(p *proc) (controllerView, clusterView, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + p.AdminAddr() + "/cluster")
	if err != nil {
		return controllerView{}, clusterView{}, err
	}
	defer resp.Body.Close()
	var v struct {
		clusterView
		Controller controllerView `json:"controller"`
	}
	err = json.NewDecoder(resp.Body).Decode(&v)
	return v.Controller, v.clusterView, err
}

// TestClusterController: three nodes form the controller group (a raft
// group over the cluster transport, one replica per node) and every node
// registers itself in it: all three replicas hold the same registry with
// each node's client address and current member id, and agree on the
// leader. SIGKILL of the controller leader: the two others elect a new one
// and keep the registry; the killed node, restarted, registers again under
// its new member id.
func TestClusterController(t *testing.T) {
	cl, health := map[uint64]string{}, map[uint64]string{}
	var peers []string
	for id := uint64(1); id <= 3; id++ {
		cl[id], health[id] = pairPorts(t)
		peers = append(peers, fmt.Sprintf("%d@%s", id, cl[id]))
	}
	nodes := map[uint64]*proc{}
	for id := uint64(1); id <= 3; id++ {
		nodes[id] = startProc(t, t.TempDir(), "--node-id", fmt.Sprint(id), "--cluster", cl[id],
			"--cluster-health", health[id], "--peers", strings.Join(peers, ","))
	}
	// agreed waits until every live node's controller has one leader in
	// live, and a registry of all three nodes with their client addresses
	// and current member ids.
	agreed := func(what string, live map[uint64]*proc) uint64 {
		t.Helper()
		deadline := time.Now().Add(40 * time.Second)
		for {
			var leader uint64
			var bad []string
			for id, p := range live {
				cv, v, err := getController(p)
				switch {
				case err != nil:
					bad = append(bad, fmt.Sprintf("node %d: %v", id, err))
				case cv.Leader == 0 || live[cv.Leader] == nil || (leader != 0 && cv.Leader != leader):
					bad = append(bad, fmt.Sprintf("node %d: leader %d", id, cv.Leader))
				case len(cv.Nodes) != 3:
					bad = append(bad, fmt.Sprintf("node %d: %d nodes registered", id, len(cv.Nodes)))
				default:
					leader = cv.Leader
					for _, n := range cv.Nodes {
						q := nodes[n.NodeID]
						if q == nil || n.ClientAddress != q.Addr() {
							bad = append(bad, fmt.Sprintf("node %d: record %+v", id, n))
						} else if lp := live[n.NodeID]; lp != nil {
							if _, lv, err := getController(lp); err == nil && lv.Self.MemberID != n.MemberID {
								bad = append(bad, fmt.Sprintf("node %d: node %d registered as %s, is %s", id, n.NodeID, n.MemberID, lv.Self.MemberID))
							}
						}
					}
					_ = v
				}
			}
			if len(bad) == 0 {
				return leader
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s", what, strings.Join(bad, "; "))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	first := agreed("three nodes", nodes)

	dead := nodes[first]
	dead.Kill(t)
	live := map[uint64]*proc{}
	for id, p := range nodes {
		if id != first {
			live[id] = p
		}
	}
	if next := agreed("controller leader killed", live); next == first {
		t.Fatalf("the killed node %d still leads", first)
	}
	dead.Start(t)
	agreed("killed node back", nodes)
}
