package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Ports every node listens on in its own namespace (each has its own
// address there).
const (
	nsClientPort  = 7420
	nsAdminPort   = 7480
	nsClusterPort = 7501
	nsHealthPort  = 7502
)

// Link is a direction between two nodes: packets From -> To.
type Link struct{ From, To uint64 }

// Network is the namespaces, veth pairs and bridge of a NetNS cluster,
// and the cuts made in it. Node-to-node cuts are blackhole routes inside
// the namespaces (iptables and nft are not installed on these machines):
// a route to To's address in From's namespace drops every packet From
// sends to To, on new and established connections alike, while the host
// (the clients) still reaches both. LinkDown takes a node's veth down,
// which cuts it off from the clients too.
//
// Cuts are counted: a link cut twice (by two overlapping nemeses) is
// restored by the second Unblock. Network is safe for concurrent use.
type Network struct {
	tag    string // pid and sequence: unique per cluster on this machine
	subnet string // "10.78.K"
	bridge string

	mu     sync.Mutex
	nodes  []uint64
	blocks map[Link]int
	down   map[uint64]int
	netem  error // nil until probed; errNetemOK once it works
	closed bool
}

var (
	netSeq     atomic.Uint32
	errNetemOK = errors.New("netem works")
	// ownName matches the interfaces and namespaces this package makes:
	// hx + b(ridge)/v(eth)/n(amespace) + creator pid in hex + s + sequence.
	ownName = regexp.MustCompile(`^hx[bvn]([0-9a-f]+)s[0-9a-f]+`)
)

// ip runs the ip command and returns its error with its output.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newNetwork sweeps what dead test processes left behind, picks a free
// 10.78.K.0/24 and makes the bridge, with the host at .254.
func newNetwork() (*Network, error) {
	if err := netnsAvailable(); err != nil {
		return nil, err
	}
	sweepStale()
	pid, seq := os.Getpid(), netSeq.Add(1)%256
	n := &Network{
		tag:    fmt.Sprintf("%xs%x", pid, seq),
		blocks: map[Link]int{},
		down:   map[uint64]int{},
	}
	n.bridge = "hxb" + n.tag
	// Test processes pick subnets at once: one at a time, under a lock
	// shared by every process on the machine.
	unlock, err := lockFile(filepath.Join(os.TempDir(), "herald-chaos-net.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	used, _ := exec.Command("ip", "-o", "-4", "addr", "show").Output()
	for i := 0; i < 256; i++ {
		k := (pid*7 + int(seq)*13 + i) % 256
		s := fmt.Sprintf("10.78.%d", k)
		if !strings.Contains(string(used), " "+s+".") {
			n.subnet = s
			break
		}
	}
	if n.subnet == "" {
		return nil, unsupported("no free 10.78.K.0/24 subnet for the bridge")
	}
	if err := ip("link", "add", n.bridge, "type", "bridge"); err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		{"link", "set", n.bridge, "up"},
		{"addr", "add", n.HostIP() + "/24", "dev", n.bridge},
	} {
		if err := ip(args...); err != nil {
			n.close()
			return nil, err
		}
	}
	return n, nil
}

// lockFile takes an exclusive flock on path (created) and returns its
// release.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// sweepStale deletes the namespaces and interfaces of this package whose
// creating process is gone (a test binary killed before its cleanup).
func sweepStale() {
	dead := func(name string) bool {
		m := ownName.FindStringSubmatch(name)
		if m == nil {
			return false
		}
		pid, err := strconv.ParseInt(m[1], 16, 64)
		if err != nil || int(pid) == os.Getpid() {
			return false
		}
		_, err = os.Stat(fmt.Sprintf("/proc/%d", pid))
		return errors.Is(err, os.ErrNotExist)
	}
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && dead(f[0]) {
				exec.Command("ip", "netns", "del", f[0]).Run()
			}
		}
	}
	if out, err := exec.Command("ip", "-o", "link", "show").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			if dead(name) {
				exec.Command("ip", "link", "del", name).Run()
			}
		}
	}
	sweepMounts()
}

// NS is node id's namespace name.
func (n *Network) NS(id uint64) string { return fmt.Sprintf("hxn%sn%x", n.tag, id) }

// veth is the host end of node id's veth pair.
func (n *Network) veth(id uint64) string { return fmt.Sprintf("hxv%sn%x", n.tag, id) }

// IP is node id's address.
func (n *Network) IP(id uint64) string { return fmt.Sprintf("%s.%d", n.subnet, id) }

// HostIP is the host's address on the bridge.
func (n *Network) HostIP() string { return n.subnet + ".254" }

// Bridge is the bridge's interface name.
func (n *Network) Bridge() string { return n.bridge }

// addNode makes node id's namespace and links it to the bridge.
func (n *Network) addNode(id uint64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrStopped
	}
	ns, veth := n.NS(id), n.veth(id)
	if err := ip("netns", "add", ns); err != nil {
		return err
	}
	n.nodes = append(n.nodes, id)
	for _, args := range [][]string{
		{"-n", ns, "link", "set", "lo", "up"},
		{"link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"link", "set", veth, "master", n.bridge, "up"},
		{"-n", ns, "addr", "add", n.IP(id) + "/24", "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
	} {
		if err := ip(args...); err != nil {
			return err
		}
	}
	return nil
}

// close deletes every namespace, veth and the bridge. The nodes'
// processes must be gone: a namespace outlives its name while a process
// runs in it.
func (n *Network) close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	var errs []error
	for _, id := range n.nodes {
		if err := ip("netns", "del", n.NS(id)); err != nil {
			errs = append(errs, err)
		}
		exec.Command("ip", "link", "del", n.veth(id)).Run() // gone with the namespace, normally
	}
	n.nodes = nil
	if err := ip("link", "del", n.bridge); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (n *Network) known(ids ...uint64) error {
	for _, id := range ids {
		if !slices.Contains(n.nodes, id) {
			return fmt.Errorf("%w: %d", ErrUnknownNode, id)
		}
	}
	if n.closed {
		return ErrStopped
	}
	return nil
}

// Block drops the packets from sends to to (one way; TCP between them
// stalls both ways, since from's replies are dropped too).
func (n *Network) Block(from, to uint64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.known(from, to); err != nil {
		return err
	}
	if from == to {
		return fmt.Errorf("chaos: cannot cut node %d from itself", from)
	}
	l := Link{from, to}
	if n.blocks[l] == 0 {
		if err := ip("-n", n.NS(from), "route", "add", "blackhole", n.IP(to)+"/32"); err != nil {
			return err
		}
	}
	n.blocks[l]++
	return nil
}

// Unblock undoes one Block(from, to); the link carries packets again once
// every Block of it is undone. Unblocking a link not blocked does nothing.
func (n *Network) Unblock(from, to uint64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.known(from, to); err != nil {
		return err
	}
	l := Link{from, to}
	switch n.blocks[l] {
	case 0:
		return nil
	case 1:
		if err := ip("-n", n.NS(from), "route", "del", "blackhole", n.IP(to)+"/32"); err != nil {
			return err
		}
		delete(n.blocks, l)
	default:
		n.blocks[l]--
	}
	return nil
}

// Cut blocks both directions between a and b.
func (n *Network) Cut(a, b uint64) error {
	if err := n.Block(a, b); err != nil {
		return err
	}
	if err := n.Block(b, a); err != nil {
		n.Unblock(a, b)
		return err
	}
	return nil
}

// Uncut undoes one Cut(a, b).
func (n *Network) Uncut(a, b uint64) error {
	return errors.Join(n.Unblock(a, b), n.Unblock(b, a))
}

// Blocked lists the links blocked now, sorted.
func (n *Network) Blocked() []Link {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Link, 0, len(n.blocks))
	for l := range n.blocks {
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b Link) int {
		if a.From != b.From {
			return int(a.From) - int(b.From)
		}
		return int(a.To) - int(b.To)
	})
	return out
}

// LinkDown takes node id's veth down: it reaches no node and no client
// (counted like Block).
func (n *Network) LinkDown(id uint64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.known(id); err != nil {
		return err
	}
	if n.down[id] == 0 {
		if err := ip("link", "set", n.veth(id), "down"); err != nil {
			return err
		}
	}
	n.down[id]++
	return nil
}

// LinkUp undoes one LinkDown(id).
func (n *Network) LinkUp(id uint64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.known(id); err != nil {
		return err
	}
	switch n.down[id] {
	case 0:
		return nil
	case 1:
		if err := ip("link", "set", n.veth(id), "up"); err != nil {
			return err
		}
		delete(n.down, id)
	default:
		n.down[id]--
	}
	return nil
}

// Heal removes every cut and brings every link up, whoever made them.
func (n *Network) Heal() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []error
	for l := range n.blocks {
		if err := ip("-n", n.NS(l.From), "route", "del", "blackhole", n.IP(l.To)+"/32"); err != nil {
			errs = append(errs, err)
		}
	}
	clear(n.blocks)
	for id := range n.down {
		if err := ip("link", "set", n.veth(id), "up"); err != nil {
			errs = append(errs, err)
		}
	}
	clear(n.down)
	return errors.Join(errs...)
}

// NetemSupported reports, as an ErrUnsupported that says why, whether
// tc netem works here (latency, loss); nil if it does. The answer is
// probed once per Network.
func (n *Network) NetemSupported() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.netem == nil {
		n.netem = probeNetem(n.bridge)
	}
	if n.netem == errNetemOK {
		return nil
	}
	return n.netem
}

func probeNetem(dev string) error {
	if _, err := exec.LookPath("tc"); err != nil {
		return unsupported("latency and loss need tc (Debian package iproute2), which is not installed")
	}
	out, err := exec.Command("tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", "1ms").CombinedOutput()
	if err != nil {
		return unsupported("latency and loss need tc netem, which this kernel lacks (no sch_netem module: %q); a userspace fault-injecting proxy between nodes would be needed",
			strings.TrimSpace(string(out)))
	}
	exec.Command("tc", "qdisc", "del", "dev", dev, "root").Run()
	return errNetemOK
}

// Netem sets node id's outgoing traffic (to nodes and clients) to the
// tc netem discipline args, e.g. "delay", "100ms", "20ms" or "loss",
// "10%"; it replaces the previous one. ErrUnsupported where netem is
// missing.
func (n *Network) Netem(id uint64, args ...string) error {
	if err := n.NetemSupported(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.known(id); err != nil {
		return err
	}
	cmd := append([]string{"netns", "exec", n.NS(id), "tc", "qdisc", "replace", "dev", "eth0", "root", "netem"}, args...)
	return ip(cmd...)
}

// ClearNetem removes node id's netem discipline, if any.
func (n *Network) ClearNetem(id uint64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.known(id); err != nil {
		return err
	}
	exec.Command("ip", "netns", "exec", n.NS(id), "tc", "qdisc", "del", "dev", "eth0", "root").Run()
	return nil
}

// Reach reports whether node from can open a TCP connection to node to's
// admin port (nil if it can), as the nodes' own traffic would go: the
// dial is made from a thread moved into from's namespace. It verifies
// that a cut took effect.
func (n *Network) Reach(ctx context.Context, from, to uint64) error {
	n.mu.Lock()
	err := n.known(from, to)
	n.mu.Unlock()
	if err != nil {
		return err
	}
	res := make(chan error, 1)
	go func() {
		// The thread goes into from's namespace and back; it is unlocked
		// only once back, so no other goroutine ever runs in from's
		// namespace. If going back fails, the thread stays locked and
		// ends with this goroutine.
		runtime.LockOSThread()
		home, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			res <- err
			return
		}
		defer home.Close()
		f, err := os.Open("/var/run/netns/" + n.NS(from))
		if err != nil {
			runtime.UnlockOSThread()
			res <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			res <- fmt.Errorf("setns %s: %w", n.NS(from), err)
			return
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(n.IP(to), strconv.Itoa(nsAdminPort)))
		if err == nil {
			conn.Close()
		}
		if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		res <- err
	}()
	return <-res
}
