package cluster

import (
	"errors"
	"fmt"
)

// The errors of this package, checked with errors.Is. Each returned error
// wraps one of them and says which node and why.
var (
	// ErrUnsupported: the fault or setup needs something this machine or
	// this cluster lacks (root, network namespaces, tc netem, a tmpfs data
	// dir). The message says what.
	ErrUnsupported = errors.New("chaos: unsupported here")
	// ErrUnknownNode: no node has that id.
	ErrUnknownNode = errors.New("chaos: no such node")
	// ErrNotRunning: the node's process is not running (killed or exited).
	ErrNotRunning = errors.New("chaos: node not running")
	// ErrRunning: Start of a node whose process still runs.
	ErrRunning = errors.New("chaos: node already running")
	// ErrNoLeader: no leader was agreed on by a majority of the nodes
	// before the context ended.
	ErrNoLeader = errors.New("chaos: no leader")
	// ErrNoFaultHooks: the node answered 404 to POST /debug/faults; its
	// binary was not built with -tags chaos.
	ErrNoFaultHooks = errors.New("chaos: node has no fault hooks (build herald with -tags chaos)")
	// ErrFaultRejected: the node refused a fault request (a status other
	// than 2xx and 404); the message carries the node's answer.
	ErrFaultRejected = errors.New("chaos: fault request rejected")
	// ErrNotManaged: a process operation on a cluster made by Attach,
	// whose processes run elsewhere.
	ErrNotManaged = errors.New("chaos: processes not managed here")
	// ErrStopped: the cluster was stopped.
	ErrStopped = errors.New("chaos: cluster stopped")
	// ErrInvalidConfig: Config.Validate found problems (all listed).
	ErrInvalidConfig = errors.New("chaos: invalid cluster config")
)

// unsupported returns an ErrUnsupported that says what is missing.
func unsupported(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsupported, fmt.Sprintf(format, args...))
}
