//go:build !race

// These tests run several cluster nodes in one process. protoactor's
// remote.Start sets gRPC's process-wide logger every time a node starts,
// which the race detector reports against the gRPC goroutines of the nodes
// already running (a write of a dependency's global, not Herald's state), so
// they are built without -race: test.sh runs them in a second, race-free
// pass. e2e/cluster_test.go covers the same behaviour with one process per
// node under the normal suite.

package cluster

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"
)

// freeAddrs returns n loopback addresses with ports free a moment ago.
func freeAddrs(t testing.TB, n int) []string {
	t.Helper()
	var out []string
	var lns []net.Listener
	for i := 0; i < n; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().String())
	}
	for _, ln := range lns {
		ln.Close()
	}
	return out
}

type testCluster struct {
	t      testing.TB
	peers  map[uint64]string
	health map[uint64]string
	nodes  map[uint64]*Node
	now    map[uint64]func() time.Time // a node's clock (default time.Now)
}

func newTestCluster(t testing.TB, n int) *testCluster {
	addrs := freeAddrs(t, 2*n)
	tc := &testCluster{t: t, peers: map[uint64]string{}, health: map[uint64]string{}, nodes: map[uint64]*Node{}}
	for i := 0; i < n; i++ {
		id := uint64(i + 1)
		tc.peers[id], tc.health[id] = addrs[2*i], addrs[2*i+1]
	}
	t.Cleanup(func() {
		for _, nd := range tc.nodes {
			nd.Stop()
		}
	})
	return tc
}

func (tc *testCluster) start(id uint64) *Node {
	tc.t.Helper()
	nd, err := Start(Config{
		NodeID: id, Bind: tc.peers[id], HealthBind: tc.health[id], Peers: tc.peers, PeerHealth: tc.health,
		Refresh: 200 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: tc.now[id],
	})
	if err != nil {
		tc.t.Fatalf("starting node %d: %v", id, err)
	}
	tc.nodes[id] = nd
	return nd
}

func (tc *testCluster) stop(id uint64) {
	tc.nodes[id].Stop()
	delete(tc.nodes, id)
}

// waitView polls until every running node sees exactly the node ids want.
func (tc *testCluster) waitView(what string, want ...uint64) {
	tc.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok := true
		for _, nd := range tc.nodes {
			var got []uint64
			for _, m := range nd.View().Members {
				got = append(got, m.NodeID)
			}
			if !slices.Equal(got, want) {
				ok = false
				if time.Now().After(deadline) {
					tc.t.Fatalf("%s: node %d sees %v, want %v", what, nd.cfg.NodeID, got, want)
				}
			}
		}
		if ok {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func memberOf(v View, id uint64) Member {
	for _, m := range v.Members {
		if m.NodeID == id {
			return m
		}
	}
	return Member{}
}

// Three nodes see each other under their node ids; a stopped node leaves
// every view, and comes back under a new member id when it starts again.
func TestMembershipJoinLeaveReturn(t *testing.T) {
	tc := newTestCluster(t, 3)
	for id := uint64(1); id <= 3; id++ {
		tc.start(id)
	}
	tc.waitView("three nodes", 1, 2, 3)
	for id, nd := range tc.nodes {
		v := nd.View()
		if v.Self.NodeID != id || memberOf(v, id).MemberID != v.Self.MemberID || !memberOf(v, id).Self {
			t.Fatalf("node %d: self %+v, member %+v", id, v.Self, memberOf(v, id))
		}
		if got := memberOf(v, 2).Address; got != tc.peers[2] {
			t.Fatalf("node %d sees node 2 at %s, want %s", id, got, tc.peers[2])
		}
	}
	old := tc.nodes[3].View().Self.MemberID
	tc.stop(3)
	tc.waitView("node 3 stopped", 1, 2)
	tc.start(3)
	tc.waitView("node 3 back", 1, 2, 3)
	if now := memberOf(tc.nodes[1].View(), 3).MemberID; now == old || now == "" {
		t.Fatalf("node 3 came back under member id %q (was %q)", now, old)
	}
}

// A node the others blocked (as after a cut: they saw it leave) notices,
// and rejoins under a new member id without a restart.
func TestMembershipBlockedNodeRejoins(t *testing.T) {
	tc := newTestCluster(t, 3)
	for id := uint64(1); id <= 3; id++ {
		tc.start(id)
	}
	tc.waitView("three nodes", 1, 2, 3)
	old := tc.nodes[3].View().Self.MemberID
	for _, id := range []uint64{1, 2} {
		nd := tc.nodes[id]
		nd.mu.Lock()
		nd.inc.cl.Remote.BlockList().Block(old)
		nd.mu.Unlock()
	}
	deadline := time.Now().Add(30 * time.Second)
	for tc.nodes[3].View().Rejoins == 0 {
		if time.Now().After(deadline) {
			t.Fatal("node 3 did not rejoin after being blocked")
		}
		time.Sleep(20 * time.Millisecond)
	}
	tc.waitView("node 3 rejoined", 1, 2, 3)
	for _, id := range []uint64{1, 2} {
		if m := memberOf(tc.nodes[id].View(), 3); m.MemberID == old {
			t.Fatalf("node %d still sees node 3 under its blocked member id", id)
		}
	}
}

// blockingPeer is a fake peer's health endpoint that answers whether it
// blocked a member id: those in block.
type blockingPeer struct {
	srv   *httptest.Server
	mu    sync.Mutex
	block map[string]bool
}

func newBlockingPeer(t *testing.T) *blockingPeer {
	p := &blockingPeer{block: map[string]bool{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		defer p.mu.Unlock()
		fmt.Fprintf(w, `{"blocked":%v}`, p.block[r.URL.Query().Get("member")])
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *blockingPeer) set(member string, blocked bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.block[member] = blocked
}

// startWithFakePeer starts node 1 whose one peer, node 2, is p.
func startWithFakePeer(t *testing.T, p *blockingPeer) (*Node, string) {
	addrs := freeAddrs(t, 2)
	nd, err := Start(Config{
		NodeID: 1, Bind: addrs[0], HealthBind: addrs[1],
		Peers:      map[uint64]string{1: addrs[0], 2: "127.0.0.1:1"},
		PeerHealth: map[uint64]string{1: addrs[1], 2: p.srv.Listener.Addr().String()},
		Refresh:    100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nd.Stop)
	return nd, addrs[1]
}

// failRejoins makes the node's next joins fail (its health address is
// taken), and returns a func that lets them succeed again.
func failRejoins(t *testing.T, nd *Node, health string) func() {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// busy stays taken to the end: a join that read the busy address
	// must not find it free.
	t.Cleanup(func() { busy.Close() })
	nd.mu.Lock()
	nd.cfg.HealthBind = busy.Addr().String()
	nd.mu.Unlock()
	return func() {
		nd.mu.Lock()
		nd.cfg.HealthBind = health
		nd.mu.Unlock()
	}
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A rejoin that fails leaves the node without a live incarnation: it keeps
// trying to rejoin even when no peer says it is blocked any more (the peer
// restarted and forgot its block list), rather than stay out for good.
func TestMembershipFailedRejoinRetries(t *testing.T) {
	peer := newBlockingPeer(t)
	nd, health := startWithFakePeer(t, peer)
	first := nd.View().Self.MemberID
	firstSys := nd.System()
	allow := failRejoins(t, nd, health)
	peer.set(first, true)
	waitFor(t, "the old incarnation to stop", 10*time.Second, firstSys.IsStopped)
	time.Sleep(3 * time.Second) // every retry of that rejoin fails
	peer.set(first, false)
	allow()
	waitFor(t, "a live incarnation under a new member id", 20*time.Second, func() bool {
		v := nd.View()
		return v.Self.MemberID != first && !nd.System().IsStopped() && memberOf(v, 1).MemberID == v.Self.MemberID
	})
}

// Stop does not wait out the retries of a rejoin that keeps failing.
func TestMembershipStopDuringFailingRejoin(t *testing.T) {
	peer := newBlockingPeer(t)
	nd, health := startWithFakePeer(t, peer)
	first := nd.View().Self.MemberID
	firstSys := nd.System()
	defer failRejoins(t, nd, health)()
	peer.set(first, true)
	waitFor(t, "the old incarnation to stop", 10*time.Second, firstSys.IsStopped)
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	nd.Stop()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Stop took %v during a failing rejoin", d)
	}
}
