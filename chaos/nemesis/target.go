package nemesis

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// resolveWait bounds how long a Target waits for a leader to be agreed
// on, within the caller's context.
const resolveWait = 30 * time.Second

// Target chooses the nodes a fault hits, when the fault starts.
type Target struct {
	desc string
	pick func(ctx context.Context, e *Env) ([]uint64, error)
}

func (t Target) String() string { return t.desc }

// resolve picks the target's nodes: at least one, sorted.
func (t Target) resolve(ctx context.Context, e *Env) ([]uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, resolveWait)
	defer cancel()
	ids, err := t.pick(ctx, e)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrNoTarget, t.desc, err)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoTarget, t.desc)
	}
	slices.Sort(ids)
	return ids, nil
}

// AnyNode is one running node, chosen at random.
func AnyNode() Target {
	return Target{"a random node", func(_ context.Context, e *Env) ([]uint64, error) {
		run := e.running()
		if len(run) == 0 {
			return nil, fmt.Errorf("no node runs")
		}
		return e.shuffled(run)[:1], nil
	}}
}

// Nodes is the given nodes.
func Nodes(ids ...uint64) Target {
	return Target{fmt.Sprintf("nodes %v", ids), func(_ context.Context, e *Env) ([]uint64, error) {
		known := e.Cluster.IDs()
		for _, id := range ids {
			if !slices.Contains(known, id) {
				return nil, fmt.Errorf("no node %d", id)
			}
		}
		return slices.Clone(ids), nil
	}}
}

// PartitionLeader is the node leading topic's partition (Cluster.Leader).
func PartitionLeader(topic string, partition int32) Target {
	return Target{fmt.Sprintf("the leader of %s-%d", topic, partition), func(ctx context.Context, e *Env) ([]uint64, error) {
		l, err := e.Cluster.Leader(ctx, topic, partition)
		if err != nil {
			return nil, err
		}
		return []uint64{l}, nil
	}}
}

// PartitionFollower is a running replica of topic's partition that does
// not lead it, chosen at random.
func PartitionFollower(topic string, partition int32) Target {
	return Target{fmt.Sprintf("a follower of %s-%d", topic, partition), func(ctx context.Context, e *Env) ([]uint64, error) {
		l, err := e.Cluster.Leader(ctx, topic, partition)
		if err != nil {
			return nil, err
		}
		reps, err := replicas(ctx, e, topic, partition)
		if err != nil {
			return nil, err
		}
		var fs []uint64
		for _, r := range reps {
			if r != l && e.Cluster.Running(r) {
				fs = append(fs, r)
			}
		}
		if len(fs) == 0 {
			return nil, fmt.Errorf("replicas %v, leader %d: no running follower", reps, l)
		}
		return e.shuffled(fs)[:1], nil
	}}
}

// replicas is the replica set of topic's partition.
func replicas(ctx context.Context, e *Env, topic string, partition int32) ([]uint64, error) {
	cl, err := e.Cluster.Dial(ctx)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	info, err := cl.DescribeTopic(ctx, topic)
	if err != nil {
		return nil, err
	}
	if partition < 0 || int(partition) >= len(info.GetPartitions()) {
		return nil, fmt.Errorf("%s has %d partitions", topic, len(info.GetPartitions()))
	}
	var out []uint64
	for _, r := range info.GetPartitions()[partition].GetReplicas() {
		out = append(out, uint64(r))
	}
	return out, nil
}

// ControllerLeader is the controller group's leader.
func ControllerLeader() Target {
	return Target{"the controller leader", func(ctx context.Context, e *Env) ([]uint64, error) {
		l, err := e.Cluster.ControllerLeader(ctx)
		if err != nil {
			return nil, err
		}
		return []uint64{l}, nil
	}}
}

// NonVoter is a running node that is not one of the controller's voters,
// chosen at random (the nodes `herald cluster remove-node` accepts).
func NonVoter() Target {
	return Target{"a node that is not a controller voter", func(ctx context.Context, e *Env) ([]uint64, error) {
		voters, err := e.Cluster.ControllerVoters(ctx)
		if err != nil {
			return nil, err
		}
		var cands []uint64
		for _, id := range e.running() {
			if !slices.Contains(voters, id) {
				cands = append(cands, id)
			}
		}
		if len(cands) == 0 {
			return nil, fmt.Errorf("every running node is a controller voter (%v)", voters)
		}
		return e.shuffled(cands)[:1], nil
	}}
}

// Majority is a random majority of all the nodes (n/2+1), chosen among
// the running ones.
func Majority() Target {
	return Target{"a majority", func(_ context.Context, e *Env) ([]uint64, error) {
		need := len(e.Cluster.IDs())/2 + 1
		run := e.running()
		if len(run) < need {
			return nil, fmt.Errorf("%d nodes run, a majority is %d", len(run), need)
		}
		return e.shuffled(run)[:need], nil
	}}
}

// Minority is a random minority of all the nodes, as large as it can be
// ((n-1)/2), chosen among the running ones.
func Minority() Target {
	return Target{"a minority", func(_ context.Context, e *Env) ([]uint64, error) {
		size := (len(e.Cluster.IDs()) - 1) / 2
		run := e.running()
		if size == 0 || len(run) < size {
			return nil, fmt.Errorf("%d nodes, %d running: no minority to pick", len(e.Cluster.IDs()), len(run))
		}
		return e.shuffled(run)[:size], nil
	}}
}

// LeaderNotLeading is the leader of one of topic's first partitions
// partitions that does not also lead other's partition 0: a partition
// leader away from, say, the scheduler (other "__schedule"), for a fault
// meant to hit the one and not the other. ErrNoTarget when every leader
// of topic leads other too.
func LeaderNotLeading(topic string, partitions int32, other string) Target {
	desc := fmt.Sprintf("a leader of %s that does not lead %s", topic, other)
	return Target{desc, func(ctx context.Context, e *Env) ([]uint64, error) {
		avoid, err := e.Cluster.Leader(ctx, other, 0)
		if err != nil {
			return nil, err
		}
		for p := range partitions {
			l, err := e.Cluster.Leader(ctx, topic, p)
			if err != nil {
				return nil, err
			}
			if l != avoid {
				return []uint64{l}, nil
			}
		}
		return nil, fmt.Errorf("node %d leads every partition of %s and %s", avoid, topic, other)
	}}
}
