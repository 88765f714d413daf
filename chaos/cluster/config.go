package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// MaxNodes bounds Config.Nodes plus the nodes added later: node ids are
// 1..MaxNodes, so that a namespace's interface name and its address fit.
const MaxNodes = 200

// Config describes a cluster of `herald serve` processes.
type Config struct {
	// Binary is the herald executable (required). A relative path is
	// made absolute.
	Binary string
	// Nodes is how many nodes Start starts, with node ids 1..Nodes (1 to
	// MaxNodes). Every one is in every other's --peers, so the first
	// three (at most) are the controller's voters.
	Nodes int
	// Dir holds each node's files (required; created if missing):
	// Dir/node-N/data is its data dir and Dir/node-N.log its stderr and
	// stdout, appended to at each start.
	Dir string
	// NetNS runs each node in a network namespace of its own, joined by a
	// veth pair to one bridge in the host namespace, with an address of
	// its own (10.78.K.N/24; the host is 10.78.K.254). The host, where
	// the clients run, reaches every node through the bridge; Net then
	// cuts links between nodes. Needs root and iproute2. Without NetNS
	// the nodes listen on loopback ports.
	NetNS bool
	// Args are extra `herald serve` flags for every node, as
	// "--name=value" or "--name", "value". The flags the cluster sets
	// (--node-id, --data, --listen, --admin, --cluster, --cluster-health,
	// --peers) are refused.
	Args []string
	// Env is added to every node's environment ("KEY=VALUE").
	Env []string
	// DiskBytes, when positive, puts each node's data dir on a tmpfs of
	// that many bytes of its own (at least 1 MiB; needs root), which a
	// nemesis can fill up (DiskFull). Zero: the data dirs are plain
	// directories under Dir.
	DiskBytes int64
	// StartTimeout bounds how long a node may take to serve after its
	// process starts (Start, StartNode, AddNode); Start waits up to twice
	// that for the whole cluster to settle. Zero means 60 s.
	StartTimeout time.Duration
}

// reserved are the serve flags the cluster sets itself.
var reserved = []string{"node-id", "data", "listen", "admin", "cluster", "cluster-health", "peers"}

// EnsureDefaults fills the zero fields that have a default and makes
// Binary and Dir absolute.
func (c *Config) EnsureDefaults() {
	if c.StartTimeout == 0 {
		c.StartTimeout = 60 * time.Second
	}
	if c.Binary != "" {
		if abs, err := filepath.Abs(c.Binary); err == nil {
			c.Binary = abs
		}
	}
	if c.Dir != "" {
		if abs, err := filepath.Abs(c.Dir); err == nil {
			c.Dir = abs
		}
	}
}

// Validate reports every problem with c at once, as one error wrapping
// ErrInvalidConfig (and ErrUnsupported when the machine lacks what c
// asks for).
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Binary == "" {
		add("Binary: the herald executable is required")
	} else if st, err := os.Stat(c.Binary); err != nil {
		add("Binary: %v", err)
	} else if st.IsDir() || st.Mode()&0o111 == 0 {
		add("Binary: %s is not an executable file", c.Binary)
	}
	if c.Nodes < 1 || c.Nodes > MaxNodes {
		add("Nodes: %d, want 1 to %d", c.Nodes, MaxNodes)
	}
	if c.Dir == "" {
		add("Dir: required")
	}
	for _, a := range c.Args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		for _, r := range reserved {
			if name == r {
				add("Args: --%s is set by the cluster for each node", r)
			}
		}
	}
	for _, e := range c.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			add("Env: %q is not KEY=VALUE", e)
		}
	}
	if c.DiskBytes < 0 || (c.DiskBytes > 0 && c.DiskBytes < 1<<20) {
		add("DiskBytes: %d, want 0 (no tmpfs) or at least 1 MiB", c.DiskBytes)
	}
	if c.StartTimeout < 0 {
		add("StartTimeout: %v is negative", c.StartTimeout)
	}
	if c.NetNS {
		if err := netnsAvailable(); err != nil {
			errs = append(errs, fmt.Errorf("NetNS: %w", err))
		}
	}
	if c.DiskBytes > 0 && os.Geteuid() != 0 {
		errs = append(errs, fmt.Errorf("DiskBytes: %w", unsupported("mounting a tmpfs per data dir needs root")))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
}

// netnsAvailable reports why network namespaces cannot be used here, or
// nil.
func netnsAvailable() error {
	if os.Geteuid() != 0 {
		return unsupported("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return unsupported("network namespaces need iproute2's ip command (Debian package iproute2)")
	}
	return nil
}
