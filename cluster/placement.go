package cluster

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// Placement: which nodes hold a new topic's partition replicas, and which
// replica is each partition's preferred leader. The controller calls it
// when a topic is created (and when it re-creates the replicas of a node
// gone longer than the grace period, for one partition at a time). It is
// pure: the same inputs give the same answer on every node.

// NodeInfo is a node as placement sees it.
type NodeInfo struct {
	ID   uint64
	Rack string // "" when racks are not set
}

// Load is what a node holds already: replicas, and how many of them it
// leads (is the preferred leader of).
type Load struct {
	Replicas int
	Leaders  int
}

// ErrNotEnoughNodes is returned when the replication factor exceeds the
// nodes available.
var ErrNotEnoughNodes = errors.New("herald: not enough nodes for the replication factor")

// Place assigns rf replicas to each of partitions new partitions over
// nodes, given the load they carry already (missing: none). Each
// partition's replicas are on distinct nodes, on as many distinct racks as
// there are (up to rf), and the first replica is the preferred leader.
// Replicas and leaders are spread evenly: each goes to the node with the
// least of them so far (ties: the lower id), so that from equal loads the
// counts per node differ by at most one wherever racks allow. The result
// is deterministic.
func Place(partitions, rf int, nodes []NodeInfo, load map[uint64]Load) ([][]uint64, error) {
	if partitions < 0 || rf < 1 {
		return nil, fmt.Errorf("herald: placement of %d partitions with replication factor %d", partitions, rf)
	}
	ids := map[uint64]bool{}
	for _, n := range nodes {
		if n.ID == 0 || ids[n.ID] {
			return nil, fmt.Errorf("herald: placement: node id %d is zero or repeated", n.ID)
		}
		ids[n.ID] = true
	}
	if rf > len(nodes) {
		return nil, fmt.Errorf("%w: replication factor %d, %d nodes", ErrNotEnoughNodes, rf, len(nodes))
	}
	cur := map[uint64]Load{}
	for _, n := range nodes {
		cur[n.ID] = load[n.ID]
	}
	racks := map[string]bool{}
	for _, n := range nodes {
		racks[n.Rack] = true
	}
	out := make([][]uint64, partitions)
	for p := range out {
		// The leader: fewest leaders, then fewest replicas, then id.
		leader := slices.MinFunc(nodes, func(a, b NodeInfo) int {
			la, lb := cur[a.ID], cur[b.ID]
			return cmp.Or(cmp.Compare(la.Leaders, lb.Leaders), cmp.Compare(la.Replicas, lb.Replicas), cmp.Compare(a.ID, b.ID))
		})
		reps := []uint64{leader.ID}
		usedRack := map[string]bool{leader.Rack: true}
		for len(reps) < rf {
			// A follower: on a rack this partition does not use yet while
			// there is one; then fewest replicas, then id.
			freshRack := len(usedRack) < len(racks)
			best, ok := NodeInfo{}, false
			for _, n := range nodes {
				if slices.Contains(reps, n.ID) || (freshRack && usedRack[n.Rack]) {
					continue
				}
				if !ok || cmp.Or(cmp.Compare(cur[n.ID].Replicas, cur[best.ID].Replicas), cmp.Compare(n.ID, best.ID)) < 0 {
					best, ok = n, true
				}
			}
			reps = append(reps, best.ID)
			usedRack[best.Rack] = true
		}
		for i, id := range reps {
			l := cur[id]
			l.Replicas++
			if i == 0 {
				l.Leaders++
			}
			cur[id] = l
		}
		out[p] = reps
	}
	return out, nil
}
