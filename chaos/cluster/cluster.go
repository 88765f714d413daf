// Package cluster starts and controls a cluster of real `herald serve`
// processes for the chaos suite: SIGKILL, restart, SIGSTOP and SIGCONT of
// single nodes, nodes added while it runs, network cuts between nodes
// (each node in a network namespace of its own, see Network), data dirs
// on small tmpfs mounts, and the questions a fault needs answered (who
// leads a partition, who leads the controller) and the fault hooks of a
// `-tags chaos` build (Faults).
//
// A Cluster is safe for concurrent use. Every process it starts gets
// SIGKILL if the test process dies (Pdeathsig), and Stop removes every
// namespace, interface and mount it made; Start sweeps those left by
// test processes that died before their cleanup.
package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Node is where one node of the cluster is and where its files are.
type Node struct {
	ID uint64
	// Addr is the client listener, reachable from the test process.
	Addr string
	// Admin is the admin HTTP address (/metrics, /readyz, /cluster,
	// /debug/faults).
	Admin string
	// Cluster is the node-to-node address (--cluster).
	Cluster string
	// DataDir is the node's --data.
	DataDir string
	// LogPath is the file its stdout and stderr are appended to.
	LogPath string
	// DiskDir is the tmpfs mount that holds DataDir, where a filler file
	// can fill the node's disk ("" unless Config.DiskBytes is set).
	DiskDir string
	// NetNS is the node's network namespace ("" unless Config.NetNS).
	NetNS string
}

// proc is one node and its current process.
type proc struct {
	info   Node
	health string // --cluster-health
	peers  string // --peers, fixed at the node's first start
	cmd    *exec.Cmd
	done   chan struct{} // closed once cmd has exited; nil before the first start
	exit   error         // cmd's exit, once done is closed
	paused bool
	served bool // it served once: the controller has its registration
}

func (p *proc) running() bool {
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Cluster is a set of herald nodes, each a process this package started
// (Start) or an address only (Attach).
type Cluster struct {
	cfg     Config
	net     *Network
	http    *http.Client
	managed bool

	mu      sync.Mutex
	nodes   map[uint64]*proc
	peers   []string // id@cluster-address of every node, in start order
	ports   map[int]bool
	stopped bool
	stop    sync.Once
	stopErr error
}

// Start starts cfg.Nodes nodes, ids 1..Nodes, and waits until the cluster
// has settled (see Settle). On failure it stops what it started and
// returns an error with the tail of each node's log.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, managed: true, nodes: map[uint64]*proc{}, ports: map[int]bool{},
		http: &http.Client{Timeout: 5 * time.Second}}
	if cfg.DiskBytes > 0 {
		sweepMounts()
	}
	fail := func(err error) (*Cluster, error) {
		c.Stop()
		return nil, fmt.Errorf("%w%s", err, c.LogTails())
	}
	if cfg.NetNS {
		var err error
		if c.net, err = newNetwork(); err != nil {
			return nil, err
		}
	}
	var ps []*proc
	for id := uint64(1); id <= uint64(cfg.Nodes); id++ {
		p, err := c.plan(id)
		if err != nil {
			return fail(err)
		}
		ps = append(ps, p)
	}
	for _, p := range ps {
		p.peers = strings.Join(c.peers, ",")
		if err := c.spawn(p); err != nil {
			return fail(err)
		}
	}
	for _, p := range ps {
		if err := c.waitServing(ctx, p); err != nil {
			return fail(err)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 2*cfg.StartTimeout)
	defer cancel()
	if err := c.Settle(sctx); err != nil {
		return fail(err)
	}
	return c, nil
}

// Attach makes a Cluster of nodes that run elsewhere, known by their
// addresses only: the questions (Leader, ControllerLeader, Settle) and
// Faults work, process control returns ErrNotManaged, and every node
// counts as running.
func Attach(nodes []Node) *Cluster {
	c := &Cluster{nodes: map[uint64]*proc{}, http: &http.Client{Timeout: 5 * time.Second}}
	for _, n := range nodes {
		c.nodes[n.ID] = &proc{info: n}
	}
	return c
}

// plan makes node id's directories, mount and namespace and picks its
// addresses, and adds it to c.peers.
func (c *Cluster) plan(id uint64) (*proc, error) {
	if id > MaxNodes {
		return nil, fmt.Errorf("chaos: node id %d is above MaxNodes (%d)", id, MaxNodes)
	}
	dir := filepath.Join(c.cfg.Dir, fmt.Sprintf("node-%d", id))
	p := &proc{info: Node{ID: id, DataDir: filepath.Join(dir, "data"), LogPath: filepath.Join(c.cfg.Dir, fmt.Sprintf("node-%d.log", id))}}
	set := func(f func(*Node)) {
		c.mu.Lock()
		f(&p.info)
		c.mu.Unlock()
	}
	c.mu.Lock()
	c.nodes[id] = p // from here on Stop cleans it up
	c.mu.Unlock()
	if c.cfg.DiskBytes > 0 {
		disk := filepath.Join(dir, diskDirName())
		if err := mountTmpfs(disk, c.cfg.DiskBytes); err != nil {
			return nil, err
		}
		set(func(n *Node) { n.DiskDir, n.DataDir = disk, filepath.Join(disk, "data") })
	}
	if err := os.MkdirAll(p.info.DataDir, 0o755); err != nil {
		return nil, err
	}
	if c.net != nil {
		if err := c.net.addNode(id); err != nil {
			return nil, err
		}
		a := c.net.IP(id)
		set(func(n *Node) {
			n.NetNS = c.net.NS(id)
			n.Addr = net.JoinHostPort(a, strconv.Itoa(nsClientPort))
			n.Admin = net.JoinHostPort(a, strconv.Itoa(nsAdminPort))
			n.Cluster = net.JoinHostPort(a, strconv.Itoa(nsClusterPort))
			p.health = net.JoinHostPort(a, strconv.Itoa(nsHealthPort))
		})
	} else {
		base, err := c.freePorts(4)
		if err != nil {
			return nil, err
		}
		at := func(i int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(base+i)) }
		// The health endpoint must be at the cluster port + 1.
		set(func(n *Node) { n.Addr, n.Admin, n.Cluster, p.health = at(0), at(1), at(2), at(3) })
	}
	c.mu.Lock()
	c.peers = append(c.peers, fmt.Sprintf("%d@%s", id, p.info.Cluster))
	c.mu.Unlock()
	return p, nil
}

// freePorts finds n consecutive loopback ports, free now and below the
// ephemeral range (so that no client connection takes one as its source
// port while its node is down), that no node of c uses.
func (c *Cluster) freePorts(n int) (int, error) {
	lo, hi := 20000, 32768
	if raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var elo, ehi int
		if _, err := fmt.Sscan(string(raw), &elo, &ehi); err == nil {
			switch {
			case elo > lo+1000:
				hi = elo
			case ehi < 64000:
				lo, hi = ehi+1, 65535
			default:
				lo, hi = 1024, 65535
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
try:
	for attempt := 0; attempt < 500; attempt++ {
		base := lo + rand.IntN(hi-lo-n)
		for i := 0; i < n; i++ {
			if c.ports[base+i] {
				continue try
			}
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(base+i)))
			if err != nil {
				continue try
			}
			ln.Close()
		}
		for i := 0; i < n; i++ {
			c.ports[base+i] = true
		}
		return base, nil
	}
	return 0, fmt.Errorf("chaos: no %d consecutive free loopback ports in [%d, %d)", n, lo, hi)
}

// spawn starts p's process; the node's log gets a header line.
func (c *Cluster) spawn(p *proc) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return ErrStopped
	}
	in := p.info
	args := []string{"serve", "--node-id", strconv.FormatUint(in.ID, 10), "--data", in.DataDir,
		"--listen", in.Addr, "--admin", in.Admin, "--cluster", in.Cluster, "--cluster-health", p.health,
		"--peers", p.peers,
		// The harness's clients, checker and /cluster polls do not log
		// in; the nodes sit on private test addresses (network
		// namespaces), where --auth would default to required.
		"--auth", "off"}
	args = append(args, c.cfg.Args...)
	name := c.cfg.Binary
	if in.NetNS != "" {
		args = append([]string{"netns", "exec", in.NetNS, name}, args...)
		name = "ip"
	}
	logf, err := os.OpenFile(in.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	fmt.Fprintf(logf, "--- chaos %s: starting node %d: %s %s\n", time.Now().Format(time.RFC3339Nano), in.ID, name, strings.Join(args, " "))
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), c.cfg.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If the test process dies, so do its brokers. (ip netns exec execs
	// the broker in place, which keeps the signal.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := startOnSpawnThread(cmd); err != nil {
		return fmt.Errorf("chaos: starting node %d: %w", in.ID, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.exit, p.paused = cmd, done, nil, false
	go func() {
		err := cmd.Wait()
		c.mu.Lock()
		p.exit = err
		c.mu.Unlock()
		close(done)
	}()
	return nil
}

// spawnReqs carries the commands to start to the spawn thread.
var (
	spawnOnce sync.Once
	spawnReqs chan spawnReq
)

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// startOnSpawnThread starts cmd from one OS thread that lives as long as
// the process. Pdeathsig fires when the thread that forked the child
// exits, not the process: a broker forked from a thread that the Go
// runtime later ends (a goroutine that exits locked to its thread, as
// namespace code does) would be killed with it.
func startOnSpawnThread(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnReqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: this goroutine never returns
			for r := range spawnReqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	r := spawnReq{cmd, make(chan error, 1)}
	spawnReqs <- r
	return <-r.done
}

// waitServing polls node p's /healthz until it answers 200, its process
// exits, Config.StartTimeout passes or ctx ends.
func (c *Cluster) waitServing(ctx context.Context, p *proc) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StartTimeout)
	defer cancel()
	c.mu.Lock()
	done, in := p.done, p.info
	c.mu.Unlock()
	for {
		select {
		case <-done:
			c.mu.Lock()
			exit := p.exit
			c.mu.Unlock()
			return fmt.Errorf("chaos: node %d exited before serving (%v)", in.ID, exit)
		default:
		}
		if code, _, err := c.get(ctx, in.Admin, "/healthz"); err == nil && code == http.StatusOK {
			c.mu.Lock()
			p.served = true
			c.mu.Unlock()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chaos: node %d not serving at %s: %w", in.ID, in.Admin, ctx.Err())
		case <-done:
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// node returns node id.
func (c *Cluster) node(id uint64) (*proc, error) {
	p := c.nodes[id]
	if p == nil {
		return nil, fmt.Errorf("%w: %d", ErrUnknownNode, id)
	}
	return p, nil
}

// live returns node id's process if it runs.
func (c *Cluster) live(id uint64) (*proc, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.managed {
		return nil, ErrNotManaged
	}
	if c.stopped {
		return nil, ErrStopped
	}
	p, err := c.node(id)
	if err != nil {
		return nil, err
	}
	if !p.running() {
		return nil, fmt.Errorf("%w: node %d", ErrNotRunning, id)
	}
	return p, nil
}

// Node returns node id's addresses and paths.
func (c *Cluster) Node(id uint64) (Node, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, err := c.node(id)
	if err != nil {
		return Node{}, err
	}
	return p.info, nil
}

// IDs lists every node's id, running or not, sorted.
func (c *Cluster) IDs() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := make([]uint64, 0, len(c.nodes))
	for id := range c.nodes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Nodes returns every node, sorted by id.
func (c *Cluster) Nodes() []Node {
	var out []Node
	for _, id := range c.IDs() {
		if n, err := c.Node(id); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// Addrs is every node's client address, sorted by node id: what a client
// bootstraps from (join with "," for client.Dial).
func (c *Cluster) Addrs() []string {
	var out []string
	for _, n := range c.Nodes() {
		out = append(out, n.Addr)
	}
	return out
}

// Net is the cluster's network, ErrUnsupported without Config.NetNS.
func (c *Cluster) Net() (*Network, error) {
	if c.net == nil {
		return nil, unsupported("network faults need a cluster started with NetNS (as root)")
	}
	return c.net, nil
}

// Running reports whether node id's process runs (paused or not). Every
// node of an attached cluster counts as running.
func (c *Cluster) Running(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.nodes[id]
	if !c.managed {
		return p != nil
	}
	return p != nil && p.running()
}

// Paused reports whether node id's process is stopped by Pause.
func (c *Cluster) Paused(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.nodes[id]
	return p != nil && p.running() && p.paused
}

// Kill sends SIGKILL to node id and waits for its process to exit (a
// paused node too). ErrNotRunning if it does not run.
func (c *Cluster) Kill(id uint64) error {
	p, err := c.live(id)
	if err != nil {
		return err
	}
	c.mu.Lock()
	cmd, done := p.cmd, p.done
	c.mu.Unlock()
	if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("chaos: killing node %d: %w", id, err)
	}
	<-done
	return nil
}

// Shutdown stops node id gracefully (SIGTERM, and SIGCONT if paused) and
// waits for it to exit. If ctx ends first it is killed, and the error
// says so; an exit status other than 0 is an error too.
func (c *Cluster) Shutdown(ctx context.Context, id uint64) error {
	p, err := c.live(id)
	if err != nil {
		return err
	}
	c.mu.Lock()
	cmd, done := p.cmd, p.done
	c.mu.Unlock()
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Process.Signal(syscall.SIGCONT)
	select {
	case <-done:
	case <-ctx.Done():
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("chaos: node %d did not exit after SIGTERM, killed: %w", id, ctx.Err())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.exit != nil {
		return fmt.Errorf("chaos: node %d exited with %v after SIGTERM", id, p.exit)
	}
	return nil
}

// StartNode starts node id again, on its data dir and addresses, and
// waits until it serves (/healthz; it may not be ready: see WaitReady).
// ErrRunning if it runs.
func (c *Cluster) StartNode(ctx context.Context, id uint64) error {
	c.mu.Lock()
	if !c.managed {
		c.mu.Unlock()
		return ErrNotManaged
	}
	p, err := c.node(id)
	if err == nil && p.running() {
		err = fmt.Errorf("%w: node %d", ErrRunning, id)
	}
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if err := c.spawn(p); err != nil {
		return err
	}
	if err := c.waitServing(ctx, p); err != nil {
		return fmt.Errorf("%w%s", err, c.logTail(id))
	}
	return nil
}

// signal sends sig to node id's process and records whether it is paused.
func (c *Cluster) signal(id uint64, sig syscall.Signal, paused bool) error {
	p, err := c.live(id)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("chaos: %v to node %d: %w", sig, id, err)
	}
	p.paused = paused
	return nil
}

// Pause freezes node id with SIGSTOP.
func (c *Cluster) Pause(id uint64) error { return c.signal(id, syscall.SIGSTOP, true) }

// Resume thaws node id with SIGCONT.
func (c *Cluster) Resume(id uint64) error { return c.signal(id, syscall.SIGCONT, false) }

// AddNode starts a new node with the next free id. Its --peers lists
// every node and itself; the running nodes' do not list it, and learn
// its addresses from the controller's metadata (as `herald cluster
// add-node` expects). It waits until the node serves and every running
// node sees it registered. It holds no replicas until a replica move
// (ClusterAdmin ADD_NODE) gives it some.
func (c *Cluster) AddNode(ctx context.Context) (Node, error) {
	c.mu.Lock()
	if !c.managed || c.stopped {
		c.mu.Unlock()
		if c.stopped {
			return Node{}, ErrStopped
		}
		return Node{}, ErrNotManaged
	}
	var id uint64
	for n := range c.nodes {
		id = max(id, n)
	}
	id++
	c.mu.Unlock()
	p, err := c.plan(id)
	if err != nil {
		return Node{}, err
	}
	c.mu.Lock()
	p.peers = strings.Join(c.peers, ",")
	c.mu.Unlock()
	if err := c.spawn(p); err != nil {
		return Node{}, err
	}
	if err := c.waitServing(ctx, p); err != nil {
		// Left down: a node that never served is not waited for.
		c.Kill(id)
		return Node{}, fmt.Errorf("%w%s", err, c.logTail(id))
	}
	if err := c.Settle(ctx); err != nil {
		return Node{}, err
	}
	return c.Node(id)
}

// Stop kills every node, waits for them to exit, then removes the
// namespaces, interfaces and mounts. Data dirs and logs stay in Dir
// (on a tmpfs they go with the mount). Later calls return the first
// call's result.
func (c *Cluster) Stop() error {
	c.stop.Do(func() {
		c.mu.Lock()
		c.stopped = true
		var dones []chan struct{}
		for _, p := range c.nodes {
			if p.running() {
				p.cmd.Process.Kill()
				dones = append(dones, p.done)
			}
		}
		c.mu.Unlock()
		for _, d := range dones {
			<-d
		}
		var errs []error
		if c.net != nil {
			errs = append(errs, c.net.close())
		}
		c.mu.Lock()
		for _, p := range c.nodes {
			if p.info.DiskDir != "" {
				errs = append(errs, unmount(p.info.DiskDir))
			}
		}
		c.mu.Unlock()
		c.stopErr = errors.Join(errs...)
	})
	return c.stopErr
}

// logTail returns the last lines of node id's log, for error messages.
func (c *Cluster) logTail(id uint64) string {
	n, err := c.Node(id)
	if err != nil || n.LogPath == "" {
		return ""
	}
	raw, err := os.ReadFile(n.LogPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	// Before the tail, the warnings, errors and leadership changes from
	// earlier (a failed run's nodes are deleted with its directory; these
	// are what its log keeps to explain it).
	cut := max(0, len(lines)-15)
	var notable []string
	for _, l := range lines[:cut] {
		noise := strings.Contains(l, "level=ERROR") && strings.Contains(l, "EndpointWriter")
		if !noise && (strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") ||
			strings.Contains(l, "leader") || strings.Contains(l, "snapshot")) {
			notable = append(notable, l)
		}
	}
	notable = notable[max(0, len(notable)-40):]
	lines = lines[cut:]
	return fmt.Sprintf("\n--- node %d's log %s: its last %d warnings, errors and leadership lines before its last lines:\n%s\n--- its last lines:\n%s",
		id, n.LogPath, len(notable), strings.Join(notable, "\n"), strings.Join(lines, "\n"))
}

// LogTails is the last lines of every node's log, and its notable lines
// before them, for a failed test or run to show.
func (c *Cluster) LogTails() string {
	var b bytes.Buffer
	for _, id := range c.IDs() {
		b.WriteString(c.logTail(id))
	}
	return b.String()
}
