package nemesis

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/heraldmq/herald/chaos/cluster"
)

// needNetNS skips a test where network namespaces cannot be made.
func needNetNS(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network chaos needs root (network namespaces)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("network chaos needs iproute2's ip command")
	}
	probe := fmt.Sprintf("hxprobe%x", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		t.Skipf("network chaos: cannot make a namespace here: %v: %s", err, out)
	}
	exec.Command("ip", "netns", "del", probe).Run()
}

// reachable reports whether the host reaches node id's admin endpoint.
func reachable(w *world, id uint64) bool {
	n, _ := w.c.Node(id)
	hc := http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get("http://" + n.Admin + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// linksOf lists the blocked links as "a>b" strings, sorted.
func linksOf(t *testing.T, w *world) []string {
	nw, err := w.c.Net()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range nw.Blocked() {
		out = append(out, fmt.Sprintf("%d>%d", l.From, l.To))
	}
	return out
}

// sees reports the connectivity between every pair of nodes as a sorted
// list of "a>b" (a reaches b's admin port from its namespace).
func sees(t *testing.T, w *world) []string {
	t.Helper()
	nw, err := w.c.Net()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range w.c.IDs() {
		for _, b := range w.c.IDs() {
			if a != b && nw.Reach(ctxT(t, time.Second), a, b) == nil {
				out = append(out, fmt.Sprintf("%d>%d", a, b))
			}
		}
	}
	return out
}

// TestNetworkNemeses runs the network faults against three real nodes,
// each in its own namespace: the leader isolated (another is elected
// while clients still reach the old one), a minority cut off, a split
// with no majority, a bridge, a flapping link, a node disconnected;
// latency and loss where netem exists. After each heal no link is cut
// and the cluster settles.
func TestNetworkNemeses(t *testing.T) {
	needNetNS(t)
	w := newWorld(t, cluster.Config{Nodes: 3, NetNS: true})
	w.createTopic("t", 1, 3)
	w.produce("t", 10, 10)

	old := w.leader("t", 0)
	iso := IsolateLeader(w.env, "t", 0)
	if ev := w.start(iso); !slices.Equal(ev.Nodes, []uint64{old}) {
		t.Fatalf("isolated %v, the leader was %d", ev.Nodes, old)
	}
	if got := linksOf(t, w); len(got) != 4 {
		t.Fatalf("blocked %v, want the 4 links of node %d", got, old)
	}
	others := rest(w.env, []uint64{old})
	if got, want := sees(t, w), []string{fmt.Sprintf("%d>%d", others[0], others[1]), fmt.Sprintf("%d>%d", others[1], others[0])}; !slices.Equal(got, want) {
		t.Fatalf("with node %d isolated the nodes reach %v, want %v", old, got, want)
	}
	checkFor(t, 10*time.Second, "the host to reach the isolated leader", func() error {
		if !reachable(w, old) {
			return errors.New("unreachable")
		}
		return nil
	})
	w.newLeader("t", 0, old)
	w.stop(iso)
	if got := linksOf(t, w); len(got) != 0 {
		t.Fatalf("blocked after heal: %v", got)
	}
	w.settle()

	cut := CutMinority(w.env)
	ev := w.start(cut)
	if len(ev.Nodes) != 1 || len(linksOf(t, w)) != 4 {
		t.Fatalf("minority %v, blocked %v", ev.Nodes, linksOf(t, w))
	}
	w.stop(cut)

	split := SplitMajority(w.env)
	w.start(split)
	if got := linksOf(t, w); len(got) != 6 {
		t.Fatalf("a split of 3 nodes into 1+1+1 blocks all 6 links, got %v", got)
	}
	if got := sees(t, w); len(got) != 0 {
		t.Fatalf("split, yet nodes reach %v", got)
	}
	w.stop(split)

	bridge := Bridge(w.env)
	w.start(bridge)
	got := linksOf(t, w)
	if len(got) != 2 {
		t.Fatalf("a bridge of 3 nodes blocks the 2 links between the sides, got %v", got)
	}
	// The two sides are the ends of the blocked links; the bridge is the third.
	var a, b uint64
	fmt.Sscanf(got[0], "%d>%d", &a, &b)
	mid := rest(w.env, []uint64{a, b})[0]
	want := []string{fmt.Sprintf("%d>%d", a, mid), fmt.Sprintf("%d>%d", b, mid), fmt.Sprintf("%d>%d", mid, a), fmt.Sprintf("%d>%d", mid, b)}
	slices.Sort(want)
	if reach := sees(t, w); !slices.Equal(reach, want) {
		t.Fatalf("bridge %d between %d and %d: nodes reach %v, want %v", mid, a, b, reach, want)
	}
	w.stop(bridge)
	if got := linksOf(t, w); len(got) != 0 {
		t.Fatalf("blocked after heal: %v", got)
	}
	if got := sees(t, w); len(got) != 6 {
		t.Fatalf("after heal the nodes reach only %v", got)
	}
	w.settle()
	w.produce("t", 5, 10)

	// A flapping link: cut at Start, then restored and cut again.
	flap := Flap(w.env, Nodes(2), 200*time.Millisecond)
	w.start(flap)
	if got := linksOf(t, w); len(got) != 4 {
		t.Fatalf("flap did not cut node 2 at start: %v", got)
	}
	checkFor(t, 10*time.Second, "three flips", func() error {
		if n := w.ev.count(flap.Name(), OpStep); n < 3 {
			return fmt.Errorf("%d flips", n)
		}
		return nil
	})
	w.stop(flap)
	if got := linksOf(t, w); len(got) != 0 {
		t.Fatalf("blocked after the flapping stopped: %v", got)
	}

	// A node off the network: the host cannot reach it either.
	disc := Disconnect(w.env, Nodes(3))
	w.start(disc)
	if reachable(w, 3) {
		t.Fatal("node 3 reachable while disconnected")
	}
	w.stop(disc)
	checkFor(t, 10*time.Second, "node 3 reachable again", func() error {
		if !reachable(w, 3) {
			return errors.New("unreachable")
		}
		return nil
	})
	w.settle()

	// Latency and loss need netem: unsupported here, and said so.
	for _, n := range []Nemesis{Latency(w.env, AnyNode(), 50*time.Millisecond, 10*time.Millisecond), Loss(w.env, AnyNode(), 5)} {
		err := n.Start(ctxT(t, 10*time.Second))
		if errors.Is(err, ErrUnsupported) {
			t.Logf("%s: %v", n.Name(), err)
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", n.Name(), err)
		}
		w.stop(n)
	}
	w.produce("t", 5, 10)
}
