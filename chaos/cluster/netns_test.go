package cluster

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// needNetNS skips a test where network namespaces cannot be made.
func needNetNS(t *testing.T) {
	t.Helper()
	if err := netnsAvailable(); err != nil {
		t.Skipf("network chaos: %v", err)
	}
	probe := fmt.Sprintf("hxprobe%x", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		t.Skipf("network chaos: cannot make a namespace here: %v: %s", err, out)
	}
	exec.Command("ip", "netns", "del", probe).Run()
}

func ipOut(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %v: %v: %s", args, err, out)
	}
	return string(out)
}

// reachable reports whether the host reaches node id's admin endpoint.
func reachable(c *Cluster, id uint64) bool {
	n, _ := c.Node(id)
	hc := http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get("http://" + n.Admin + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// TestNetNSCluster: three nodes, each in its namespace. The partition
// leader is cut off from the two others while the host still reaches
// it: the others elect a new leader. LinkDown cuts a node off the host
// too. netem is reported unsupported where the kernel lacks it. Stop
// leaves no namespace, interface or route behind.
func TestNetNSCluster(t *testing.T) {
	needNetNS(t)
	c := startCluster(t, Config{Nodes: 3, NetNS: true})
	nw, err := c.Net()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes() {
		if !strings.HasPrefix(n.Addr, nw.IP(n.ID)+":") || n.NetNS == "" {
			t.Fatalf("node %+v not in its namespace", n)
		}
	}
	createTopic(t, c, "t", 1, 3)
	old, err := c.Leader(ctxT(t, 20*time.Second), "t", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range c.IDs() {
		if id != old {
			if err := nw.Cut(old, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := nw.Blocked(); len(got) != 4 {
		t.Fatalf("blocked %v, want 4 links", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !reachable(c, old) {
		if time.Now().After(deadline) {
			t.Fatal("the host cannot reach the cut-off node")
		}
		time.Sleep(pollEvery) // polling interval
	}
	var others []uint64
	for _, id := range c.IDs() {
		if id != old {
			others = append(others, id)
			if err := nw.Reach(ctxT(t, time.Second), old, id); err == nil {
				t.Fatalf("node %d reaches node %d across the cut", old, id)
			}
			if err := nw.Reach(ctxT(t, time.Second), id, old); err == nil {
				t.Fatalf("node %d reaches node %d across the cut", id, old)
			}
		}
	}
	if err := nw.Reach(ctxT(t, time.Second), others[0], others[1]); err != nil {
		t.Fatalf("nodes %v do not reach each other: %v", others, err)
	}
	// The majority elects another leader; ask only it (the cut-off node
	// may still believe it leads, and the majority needs 2 of 3 votes).
	deadline = time.Now().Add(30 * time.Second)
	for {
		l, err := c.Leader(ctxT(t, 5*time.Second), "t", 0)
		if err == nil && l != old {
			t.Logf("leader %d cut off; node %d elected", old, l)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new leader after cutting node %d off: %d %v", old, l, err)
		}
		time.Sleep(pollEvery) // polling interval
	}
	if err := nw.Cut(old, old); err == nil {
		t.Fatal("cut of a node from itself accepted")
	}
	if err := nw.Block(old, 42); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("block to node 42: %v", err)
	}
	// Counted: a second cut of one link needs a second uncut.
	other := c.IDs()[0]
	if other == old {
		other = c.IDs()[1]
	}
	if err := nw.Cut(old, other); err != nil {
		t.Fatal(err)
	}
	if err := nw.Uncut(old, other); err != nil {
		t.Fatal(err)
	}
	if got := len(nw.Blocked()); got != 4 {
		t.Fatalf("%d links blocked after cut+uncut of a cut link, want 4", got)
	}
	if err := nw.Heal(); err != nil {
		t.Fatal(err)
	}
	if got := nw.Blocked(); len(got) != 0 {
		t.Fatalf("blocked after heal: %v", got)
	}
	if err := nw.Reach(ctxT(t, time.Second), old, others[0]); err != nil {
		t.Fatalf("node %d does not reach node %d after heal: %v", old, others[0], err)
	}
	if routes := ipOut(t, "-n", nw.NS(old), "route", "show"); strings.Contains(routes, "blackhole") {
		t.Fatalf("blackhole routes left after heal:\n%s", routes)
	}
	if err := c.Settle(ctxT(t, 60*time.Second)); err != nil {
		t.Fatal(err)
	}

	// LinkDown: the host cannot reach the node either.
	if err := nw.LinkDown(2); err != nil {
		t.Fatal(err)
	}
	if reachable(c, 2) {
		t.Fatal("node 2 reachable with its link down")
	}
	if err := nw.LinkUp(2); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for !reachable(c, 2) {
		if time.Now().After(deadline) {
			t.Fatal("node 2 unreachable after LinkUp")
		}
		time.Sleep(pollEvery) // polling interval
	}

	switch err := nw.Netem(1, "delay", "10ms"); {
	case errors.Is(err, ErrUnsupported):
		t.Logf("netem: %v", err)
		if !strings.Contains(err.Error(), "netem") {
			t.Fatalf("the unsupported error does not say netem is missing: %v", err)
		}
	case err != nil:
		t.Fatal(err)
	default:
		t.Log("netem works here")
		if err := nw.ClearNetem(1); err != nil {
			t.Fatal(err)
		}
	}

	bridge, ns := nw.Bridge(), nw.NS(1)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(ipOut(t, "netns", "list"), ns) {
		t.Fatalf("namespace %s left after Stop", ns)
	}
	if links := ipOut(t, "-o", "link", "show"); strings.Contains(links, bridge) || strings.Contains(links, "hxv"+nw.tag) {
		t.Fatalf("interfaces left after Stop:\n%s", links)
	}
}

// TestSweepStale: namespaces, interfaces and mounts named for a process
// that is gone are removed when a cluster starts; those of live
// processes are not.
func TestSweepStale(t *testing.T) {
	needNetNS(t)
	dead := 0x3ffff0
	for ; dead > 0x300000; dead-- {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", dead)); errors.Is(err, os.ErrNotExist) {
			break
		}
	}
	staleNS := fmt.Sprintf("hxn%xs0n1", dead)
	staleBr := fmt.Sprintf("hxb%xs0", dead)
	liveNS := fmt.Sprintf("hxn%xs0n1", 1) // pid 1 runs
	ipOut(t, "netns", "add", staleNS)
	ipOut(t, "netns", "add", liveNS)
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", staleNS).Run()
		exec.Command("ip", "netns", "del", liveNS).Run()
		exec.Command("ip", "link", "del", staleBr).Run()
	})
	ipOut(t, "link", "add", staleBr, "type", "bridge")
	mnt := t.TempDir() + fmt.Sprintf("/disk-hx%x", dead)
	if err := mountTmpfs(mnt, 1<<20); err != nil {
		t.Skipf("tmpfs: %v", err)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	sweepStale()
	if strings.Contains(ipOut(t, "netns", "list"), staleNS) {
		t.Fatal("stale namespace kept")
	}
	if !strings.Contains(ipOut(t, "netns", "list"), liveNS) {
		t.Fatal("a live process's namespace swept")
	}
	if strings.Contains(ipOut(t, "-o", "link", "show"), staleBr) {
		t.Fatal("stale bridge kept")
	}
	if raw, _ := os.ReadFile("/proc/mounts"); strings.Contains(string(raw), mnt) {
		t.Fatal("stale mount kept")
	}
}

// TestDiskBytes puts each node's data dir on a tmpfs of its own, which
// Stop unmounts.
func TestDiskBytes(t *testing.T) {
	needRoot(t, "mounting a tmpfs")
	c := startCluster(t, Config{Nodes: 1, DiskBytes: 32 << 20})
	n, _ := c.Node(1)
	if n.DiskDir == "" || !strings.HasPrefix(n.DataDir, n.DiskDir+"/") {
		t.Fatalf("node %+v", n)
	}
	raw, _ := os.ReadFile("/proc/mounts")
	if !strings.Contains(string(raw), n.DiskDir+" tmpfs") {
		t.Fatalf("%s is not a tmpfs mount", n.DiskDir)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	raw, _ = os.ReadFile("/proc/mounts")
	if strings.Contains(string(raw), n.DiskDir) {
		t.Fatalf("%s still mounted after Stop", n.DiskDir)
	}
}
