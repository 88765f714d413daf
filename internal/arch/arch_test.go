// Package arch holds the test of the house's shape: which packages may
// import which (DESIGN.md, "Layout").
package arch

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

const mod = "github.com/heraldmq/herald/"

// Actor rooms are siblings: each imports actors/partition, the shared
// layer, proto and persistence where it must, never another room, netio,
// the broker or the cluster.
var rooms = []string{"actors/topic", "actors/consumer", "actors/scheduler", "actors/txn"}

// rules maps a package (or a prefix ending in "/...") to the module
// packages it must not import (a prefix ending in "/..." covers a tree).
var rules = map[string][]string{
	"proto":            {"..."},
	"persistence/...":  {"actors/...", "netio/...", "broker/...", "cluster/...", "client/...", "cmd/...", "registry", "retry", "timewheel", "filter"},
	"actors/partition": {"actors/topic", "actors/consumer", "actors/scheduler", "actors/txn", "netio/...", "broker/...", "cluster/...", "client/...", "cmd/...", "registry", "retry", "timewheel", "filter"},
	"actors/mailbox":   {"..."},
	// The actors' dispatcher pool: a leaf every room and netio may use.
	"internal/dispatch": {"..."},
	"registry":          {"actors/topic", "actors/consumer", "actors/scheduler", "actors/txn", "netio/...", "broker/...", "cluster/...", "client/...", "cmd/..."},
	"retry":             {"actors/...", "netio/...", "broker/...", "cluster/...", "client/...", "cmd/...", "persistence/..."},
	"timewheel":         {"actors/...", "netio/...", "broker/...", "cluster/...", "client/...", "cmd/..."},
	"filter":            {"actors/...", "netio/...", "broker/...", "cluster/...", "client/...", "cmd/...", "persistence/..."},
	"netio":             {"actors/...", "broker/...", "cluster/...", "client/...", "cmd/...", "persistence/...", "chaos/..."},
	"cluster/...":       {"broker/...", "netio/...", "client/...", "cmd/...", "actors/topic", "actors/consumer", "actors/scheduler", "actors/txn", "chaos/..."},
	"client/...":        {"actors/...", "netio/...", "broker/...", "cluster/...", "cmd/...", "persistence/...", "registry", "retry", "timewheel", "filter", "internal/...", "auth"},
	"auth/...":          {"actors/...", "netio/...", "broker/...", "cluster/...", "client/...", "cmd/...", "persistence/...", "registry", "retry", "timewheel", "filter", "internal/...", "chaos/..."},
	"cmd/...":           {"actors/...", "netio/...", "cluster/...", "persistence/...", "registry", "timewheel"},
	"examples/...":      {"actors/...", "netio/...", "broker/...", "cluster/...", "cmd/...", "persistence/...", "registry", "retry", "timewheel", "filter", "internal/..."},
	// The admin API reads the cluster as a client of its node (the SDK)
	// and is told the membership through an interface: the broker
	// mounts it, the CLI shares its types.
	"adminapi": {"actors/...", "netio/...", "broker/...", "cluster/...", "cmd/...", "persistence/...", "registry", "retry", "timewheel", "internal/...", "auth", "chaos/..."},
	// The dead-letter reader and redriver: the SDK's, shared by the CLI
	// and the admin API.
	"dlq": {"actors/...", "netio/...", "broker/...", "cluster/...", "cmd/...", "persistence/...", "registry", "timewheel", "internal/...", "auth", "chaos/...", "adminapi"},
	// Routing through exchanges: shared by the broker (routing) and the
	// controller (the metadata's changes); it imports only proto.
	"exchange":          {"actors/...", "netio/...", "broker/...", "cluster/...", "client/...", "cmd/...", "persistence/...", "registry", "retry", "timewheel", "filter", "internal/...", "auth", "chaos/...", "adminapi", "dlq"},
	"internal/raftwire": {"actors/...", "netio/...", "broker/...", "cmd/...", "client/..."},
	// The chaos suite drives real brokers from outside, through the SDK
	// and the wire format, and reads data dirs with persistence; no node
	// code imports it.
	"chaos/...":  {"actors/...", "netio/...", "broker/...", "cluster/...", "cmd/...", "e2e/...", "registry", "retry", "timewheel", "filter", "internal/..."},
	"actors/...": {"chaos/..."},
	"broker/...": {"chaos/..."},
	// The chaos build's fault state is a leaf under the broker, which
	// alone wires it: the rooms and storage get its clock and filesystem
	// injected through their configs, never by importing it.
	"internal/faults": {"actors/...", "netio/...", "broker/...", "cluster/...", "client/...", "cmd/...", "registry", "retry", "timewheel", "filter", "internal/raftwire"},
}

// tagSets are the builds checked: the normal one and the chaos build
// (internal/faults), whose files import more.
var tagSets = []string{"", "chaos"}

func init() {
	for _, r := range rooms {
		var deny []string
		for _, o := range rooms {
			if o != r {
				deny = append(deny, o)
			}
		}
		rules[r] = append(deny, "netio/...", "broker/...", "cluster/...", "client/...", "cmd/...", "internal/faults")
	}
	for _, p := range []string{"persistence/...", "actors/partition", "cluster/...", "netio", "timewheel"} {
		rules[p] = append(rules[p], "internal/faults")
	}
}

func covers(pattern, pkg string) bool {
	if pattern == "..." {
		return true
	}
	if p, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == p || strings.HasPrefix(pkg, p+"/")
	}
	return pkg == pattern
}

// TestImportDirections fails on an import arrow the house does not allow
// in a package's code. Tests may reach further (a room's integration test
// starts the topic manager to have topics; e2e drives everything).
func TestImportDirections(t *testing.T) {
	checked := map[string]bool{}
	for _, tags := range tagSets {
		checkImports(t, tags, checked)
	}
	for pattern := range rules {
		if !checked[pattern] && pattern != "actors/txn" {
			t.Errorf("no package matches rule %q: the house changed shape, update the rules", pattern)
		}
	}
}

// checkImports checks the imports of every package built with tags,
// noting in checked the rules that matched a package.
func checkImports(t *testing.T, tags string, checked map[string]bool) {
	t.Helper()
	out, err := exec.Command("go", "list", "-tags", tags, "-f", "{{.ImportPath}} {{join .Imports \" \"}}", mod+"...").Output()
	if err != nil {
		t.Fatalf("go list -tags %q: %v", tags, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		pkg, _ := strings.CutPrefix(f[0], mod)
		for pattern, deny := range rules {
			if !covers(pattern, pkg) {
				continue
			}
			checked[pattern] = true
			for _, imp := range f[1:] {
				dep, ok := strings.CutPrefix(imp, mod)
				if !ok || dep == pkg || strings.HasPrefix(dep, pkg+"/") {
					continue
				}
				for _, d := range deny {
					if covers(d, dep) {
						t.Errorf("%s imports %s (tags %q): the house does not allow %s -> %s", pkg, dep, tags, pattern, d)
					}
				}
			}
		}
	}
}
