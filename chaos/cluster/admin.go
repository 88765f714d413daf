package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/heraldmq/herald/client"
)

// pollEvery is how often the waits below ask the nodes again.
const pollEvery = 50 * time.Millisecond

// view is the part of a node's /cluster JSON (broker.startAdmin) read
// here.
type view struct {
	Controller *struct {
		Voters []uint64 `json:"voters"`
		Leader uint64   `json:"leader"`
		Nodes  []struct {
			NodeID        uint64 `json:"node_id"`
			ClientAddress string `json:"client_address"`
		} `json:"nodes"`
	} `json:"controller"`
	Ready    bool   `json:"ready"`
	NotReady string `json:"not_ready"`
}

// get does a GET of http://addr+path and returns the status and body.
func (c *Cluster) get(ctx context.Context, addr, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, body, err
}

func (c *Cluster) view(ctx context.Context, n Node) (view, error) {
	var v view
	code, body, err := c.get(ctx, n.Admin, "/cluster")
	if err != nil {
		return v, err
	}
	if code != http.StatusOK {
		return v, fmt.Errorf("GET /cluster: %d %s", code, bytes.TrimSpace(body))
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return v, fmt.Errorf("GET /cluster: %w", err)
	}
	return v, nil
}

// askable lists the nodes that can answer: running and not paused.
func (c *Cluster) askable() []Node {
	var out []Node
	for _, n := range c.Nodes() {
		if c.Running(n.ID) && !c.Paused(n.ID) {
			out = append(out, n)
		}
	}
	return out
}

// poll calls try every pollEvery until it returns done or ctx ends; then
// it returns the last reason try gave, wrapped with base.
func poll(ctx context.Context, base error, what string, try func() (done bool, why string)) error {
	for {
		done, why := try()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s: %s (%v)", base, what, why, ctx.Err())
		case <-time.After(pollEvery):
		}
	}
}

// errNotSettled is the base of Settle's error.
var errNotSettled = fmt.Errorf("chaos: cluster not settled")

// served counts the nodes that have served at least once (each
// registered itself with the controller). Every node of an attached
// cluster counts.
func (c *Cluster) served() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, p := range c.nodes {
		if p.served || !c.managed {
			n++
		}
	}
	return n
}

// Settle waits until every running, unpaused node is ready (/readyz),
// and, in a cluster, agrees with the others on a controller leader and
// holds the registration of every node that ever served, under its
// current client address.
func (c *Cluster) Settle(ctx context.Context) error {
	return poll(ctx, errNotSettled, "waiting for every node to be ready and registered", func() (bool, string) {
		total := c.served()
		addr := map[uint64]string{}
		for _, n := range c.Nodes() {
			addr[n.ID] = n.Addr
		}
		var leader uint64
		for _, n := range c.askable() {
			v, err := c.view(ctx, n)
			switch {
			case err != nil:
				return false, fmt.Sprintf("node %d: %v", n.ID, err)
			case !v.Ready:
				return false, fmt.Sprintf("node %d not ready: %s", n.ID, v.NotReady)
			case v.Controller == nil:
				continue // a single node
			case v.Controller.Leader == 0:
				return false, fmt.Sprintf("node %d knows no controller leader", n.ID)
			case leader != 0 && v.Controller.Leader != leader:
				return false, fmt.Sprintf("node %d: controller leader %d, another node says %d", n.ID, v.Controller.Leader, leader)
			case len(v.Controller.Nodes) != total:
				return false, fmt.Sprintf("node %d: %d of %d nodes registered", n.ID, len(v.Controller.Nodes), total)
			}
			leader = v.Controller.Leader
			for _, r := range v.Controller.Nodes {
				if r.ClientAddress != addr[r.NodeID] {
					return false, fmt.Sprintf("node %d: node %d registered at %s, serving at %s", n.ID, r.NodeID, r.ClientAddress, addr[r.NodeID])
				}
			}
		}
		return true, ""
	})
}

// WaitReady waits until each node of ids answers 200 on /readyz: it has
// the cluster's metadata and every local replica is readable up to its
// high watermark.
func (c *Cluster) WaitReady(ctx context.Context, ids ...uint64) error {
	for _, id := range ids {
		n, err := c.Node(id)
		if err != nil {
			return err
		}
		err = poll(ctx, fmt.Errorf("chaos: node %d not ready", id), "waiting for /readyz", func() (bool, string) {
			if !c.Running(id) {
				return false, "not running"
			}
			code, body, err := c.get(ctx, n.Admin, "/readyz")
			if err != nil {
				return false, err.Error()
			}
			return code == http.StatusOK, strings.TrimSpace(string(body))
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// elect picks the leader that strictly more nodes report than any other
// and at least quorum do, and that runs unpaused; 0 and a reason if
// none.
func (c *Cluster) elect(votes map[uint64][]uint64, quorum int) (uint64, string) {
	var best uint64
	tie := false
	for l, vs := range votes {
		switch {
		case best == 0 || len(vs) > len(votes[best]):
			best, tie = l, false
		case len(vs) == len(votes[best]):
			tie = true
		}
	}
	switch {
	case best == 0:
		return 0, "no node knows a leader"
	case tie:
		return 0, fmt.Sprintf("the nodes disagree: %s", describeVotes(votes))
	case len(votes[best]) < quorum:
		return 0, fmt.Sprintf("fewer than %d nodes agree: %s", quorum, describeVotes(votes))
	case !c.Running(best) || c.Paused(best):
		return 0, fmt.Sprintf("node %d, reported leader, is down or paused", best)
	}
	return best, ""
}

func describeVotes(votes map[uint64][]uint64) string {
	var parts []string
	for l, vs := range votes {
		parts = append(parts, fmt.Sprintf("%v say %d", vs, l))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// Leader is the node leading topic's partition, as its replicas report it:
// it polls every running, unpaused node (each asked alone, through the
// client's DescribeTopic) until a majority of the partition's replica set
// names one leader, more than name any other, and that leader runs
// unpaused. ErrNoLeader when ctx ends first.
func (c *Cluster) Leader(ctx context.Context, topic string, partition int32) (uint64, error) {
	var leader uint64
	err := poll(ctx, ErrNoLeader, fmt.Sprintf("of %s-%d", topic, partition), func() (bool, string) {
		var mu sync.Mutex
		votes := map[uint64][]uint64{}
		rf, why := 0, "no node answered"
		var wg sync.WaitGroup
		for _, n := range c.askable() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				actx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				cl, err := client.Dial(actx, n.Addr, client.WithRequestTimeout(2*time.Second))
				if err != nil {
					return
				}
				defer cl.Close()
				info, err := cl.DescribeTopic(actx, topic)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					why = fmt.Sprintf("node %d: %v", n.ID, err)
				case int(partition) >= len(info.GetPartitions()) || partition < 0:
					why = fmt.Sprintf("node %d: %s has %d partitions", n.ID, topic, len(info.GetPartitions()))
				default:
					p := info.GetPartitions()[partition]
					rf = max(rf, len(p.GetReplicas()))
					if p.GetLeader() != 0 {
						votes[uint64(p.GetLeader())] = append(votes[uint64(p.GetLeader())], n.ID)
					}
				}
			}()
		}
		wg.Wait()
		if rf == 0 {
			return false, why
		}
		for _, vs := range votes {
			slices.Sort(vs)
		}
		leader, why = c.elect(votes, rf/2+1)
		return leader != 0, why
	})
	return leader, err
}

// ControllerLeader is the leader of the controller group: it polls every
// running, unpaused node's /cluster until a majority of the controller's
// voters names one leader, more than name any other, and that leader
// runs unpaused. ErrNoLeader when ctx ends first.
func (c *Cluster) ControllerLeader(ctx context.Context) (uint64, error) {
	var leader uint64
	err := poll(ctx, ErrNoLeader, "of the controller", func() (bool, string) {
		votes := map[uint64][]uint64{}
		voters, why := 0, "no node answered"
		for _, n := range c.askable() {
			v, err := c.view(ctx, n)
			if err != nil {
				why = fmt.Sprintf("node %d: %v", n.ID, err)
				continue
			}
			if v.Controller == nil {
				why = fmt.Sprintf("node %d runs without a controller (single node)", n.ID)
				continue
			}
			voters = max(voters, len(v.Controller.Voters))
			if l := v.Controller.Leader; l != 0 {
				votes[l] = append(votes[l], n.ID)
			}
		}
		if voters == 0 {
			return false, why
		}
		leader, why = c.elect(votes, voters/2+1)
		return leader != 0, why
	})
	return leader, err
}

// ControllerVoters lists the controller group's voters, as the first
// node that answers reports them.
func (c *Cluster) ControllerVoters(ctx context.Context) ([]uint64, error) {
	var voters []uint64
	err := poll(ctx, fmt.Errorf("chaos: controller voters unknown"), "asking /cluster", func() (bool, string) {
		why := "no node answered"
		for _, n := range c.askable() {
			v, err := c.view(ctx, n)
			switch {
			case err != nil:
				why = fmt.Sprintf("node %d: %v", n.ID, err)
			case v.Controller == nil:
				why = fmt.Sprintf("node %d runs without a controller (single node)", n.ID)
			default:
				voters = v.Controller.Voters
				return true, ""
			}
		}
		return false, why
	})
	return voters, err
}

// Faults posts body as JSON to node id's POST /debug/faults, the fault
// hooks of a herald built with -tags chaos, e.g. {"disk_delay": "50ms"}
// or {"clear": true}. ErrNoFaultHooks if the node answers 404,
// ErrFaultRejected for another non-2xx status, ErrNotRunning if the node
// is down or paused.
func (c *Cluster) Faults(ctx context.Context, id uint64, body map[string]any) error {
	n, err := c.Node(id)
	if err != nil {
		return err
	}
	if !c.Running(id) || c.Paused(id) {
		return fmt.Errorf("%w: node %d is down or paused, no fault can be set", ErrNotRunning, id)
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("chaos: fault body: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+n.Admin+"/debug/faults", bytes.NewReader(raw))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("chaos: faults on node %d: %w", id, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	switch {
	case resp.StatusCode/100 == 2:
		return nil
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%w: node %d", ErrNoFaultHooks, id)
	default:
		return fmt.Errorf("%w: node %d answered %s to %s: %s", ErrFaultRejected, id, resp.Status, raw, bytes.TrimSpace(answer))
	}
}

// Dial connects a client to the cluster, bootstrapping from every node.
func (c *Cluster) Dial(ctx context.Context, opts ...client.Option) (*client.Client, error) {
	return client.Dial(ctx, strings.Join(c.Addrs(), ","), opts...)
}
