package nemesis

import (
	"context"
	"fmt"
	"strings"
	"sync"

	heraldpb "github.com/heraldmq/herald/proto"
)

// The membership nemeses move replicas with the cluster administration
// request that `herald cluster add-node|remove-node|rebalance` sends.
// They return once the controller has recorded the moves; the moves run
// on afterwards (client.WaitForMoves waits for them).

// clusterAdmin sends req through a client of the whole cluster.
func clusterAdmin(ctx context.Context, e *Env, req *heraldpb.ClusterAdminRequest) (string, error) {
	cl, err := e.Cluster.Dial(ctx)
	if err != nil {
		return "", err
	}
	defer cl.Close()
	resp, err := cl.ClusterAdmin(ctx, req)
	if err != nil {
		return "", fmt.Errorf("%v of node %d: %w", req.GetOp(), req.GetNodeId(), err)
	}
	var mv []string
	for _, m := range resp.GetMoves() {
		mv = append(mv, fmt.Sprintf("%s-%d %v->%v", m.GetTopic(), m.GetPartition(), m.GetFrom(), m.GetTo()))
	}
	return fmt.Sprintf("%d moves [%s]", len(mv), strings.Join(mv, ", ")), nil
}

// AddNode adds a spare node to the cluster at Start: the first Start
// starts a new node (Cluster.AddNode, the next free id), later ones
// reuse it (starting it again if it is down); then ADD_NODE moves a
// fair share of the replicas to it. Stop moves them off again
// (REMOVE_NODE): the spare keeps running, holding no replica.
func AddNode(e *Env) Nemesis {
	var mu sync.Mutex
	var spare uint64
	return newFault(e, "add a node", func(ctx context.Context) ([]uint64, string, undoFunc, error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case spare == 0:
			n, err := e.Cluster.AddNode(ctx)
			if err != nil {
				return nil, "", nil, err
			}
			spare = n.ID
		case !e.Cluster.Running(spare):
			if err := e.Cluster.StartNode(ctx, spare); err != nil {
				return nil, "", nil, err
			}
		}
		id := spare
		moves, err := clusterAdmin(ctx, e, &heraldpb.ClusterAdminRequest{Op: heraldpb.ClusterAdminRequest_ADD_NODE, NodeId: id})
		if err != nil {
			return []uint64{id}, fmt.Sprintf("node %d started", id), nil, err
		}
		undo := func(ctx context.Context) (string, error) {
			moves, err := clusterAdmin(ctx, e, &heraldpb.ClusterAdminRequest{Op: heraldpb.ClusterAdminRequest_REMOVE_NODE, NodeId: id})
			return fmt.Sprintf("node %d removed: %s", id, moves), err
		}
		return []uint64{id}, fmt.Sprintf("node %d added: %s", id, moves), undo, nil
	})
}

// RemoveNode decommissions the target's node at Start (REMOVE_NODE: its
// replicas move to the others; the process keeps running) and adds it
// back at Stop (ADD_NODE). The controller refuses to remove one of its
// voters: NonVoter is the target that fits.
func RemoveNode(e *Env, t Target) Nemesis {
	return newFault(e, "remove "+t.String(), func(ctx context.Context) ([]uint64, string, undoFunc, error) {
		ids, err := t.resolve(ctx, e)
		if err != nil {
			return nil, "", nil, err
		}
		if len(ids) != 1 {
			return nil, "", nil, fmt.Errorf("%w: remove one node at a time, %s is %v", ErrNoTarget, t, ids)
		}
		id := ids[0]
		moves, err := clusterAdmin(ctx, e, &heraldpb.ClusterAdminRequest{Op: heraldpb.ClusterAdminRequest_REMOVE_NODE, NodeId: id})
		if err != nil {
			return ids, "", nil, err
		}
		undo := func(ctx context.Context) (string, error) {
			moves, err := clusterAdmin(ctx, e, &heraldpb.ClusterAdminRequest{Op: heraldpb.ClusterAdminRequest_ADD_NODE, NodeId: id})
			return fmt.Sprintf("node %d added back: %s", id, moves), err
		}
		return ids, fmt.Sprintf("node %d removed: %s", id, moves), undo, nil
	})
}

// Rebalance moves replicas and preferred leaders so that every node
// holds an even share (REBALANCE). Stop has nothing to heal.
func Rebalance(e *Env) Nemesis {
	return newFault(e, "rebalance", func(ctx context.Context) ([]uint64, string, undoFunc, error) {
		moves, err := clusterAdmin(ctx, e, &heraldpb.ClusterAdminRequest{Op: heraldpb.ClusterAdminRequest_REBALANCE})
		if err != nil {
			return nil, "", nil, err
		}
		return nil, "rebalanced: " + moves, nothing("nothing to heal"), nil
	})
}
