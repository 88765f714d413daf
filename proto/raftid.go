package heraldpb

import "math"

// Raft ids of partition replicas. A replica placed when its topic was
// created has its node id as raft id. A replica a move added gets a raft id
// of its own, assigned by the controller's apply (PartitionAssignment's
// raft_ids): its node id in the low 32 bits and the partition's incarnation
// number in the high 32 bits. So a node that leaves a partition and is added
// back later never reuses the raft id of its earlier replica, and any raft
// id maps back to the node holding it by masking. Node ids therefore fit in
// 32 bits (MaxNodeID), as they do in the client protocol already.

// MaxNodeID is the largest node id: raft ids keep the node id in their low
// 32 bits.
const MaxNodeID uint64 = math.MaxUint32

// ReplicaRaftID is the raft id of incarnation inc of node's replica (inc 0:
// the node id itself).
func ReplicaRaftID(node uint64, inc uint32) uint64 {
	return node&MaxNodeID | uint64(inc)<<32
}

// ReplicaNode is the node that holds the replica with raft id id.
func ReplicaNode(id uint64) uint64 { return id & MaxNodeID }

// RaftID is the raft id of node's replica of the partition: the one a move
// assigned it, else its node id.
func (pa *PartitionAssignment) RaftID(node uint64) uint64 {
	if id, ok := pa.GetRaftIds()[node]; ok {
		return id
	}
	return node
}

// RaftIDs maps nodes to the raft ids of their replicas of the partition.
func (pa *PartitionAssignment) RaftIDs(nodes []uint64) []uint64 {
	if nodes == nil {
		return nil
	}
	out := make([]uint64, len(nodes))
	for i, n := range nodes {
		out[i] = pa.RaftID(n)
	}
	return out
}
