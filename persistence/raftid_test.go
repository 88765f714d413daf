package persistence

import (
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3/raftpb"
)

// slotStateWithMoves is the state of a log whose membership history is
// full (maxConfHistory changes) of moves of an rf-replica group in which
// every member has a raft id of its own (incarnation inc, as a move
// assigns them: 6-8 bytes each where a node id takes 1-2): each move adds
// a learner, enters a joint configuration that swaps it in for a voter, and
// leaves it.
func slotStateWithMoves(rf int, inc uint32) *diskState {
	id := func(node int) uint64 { return heraldpb.ReplicaRaftID(uint64(node), inc) }
	voters := func(from int) []uint64 {
		var out []uint64
		for n := from; n < from+rf; n++ {
			out = append(out, id(n))
		}
		return out
	}
	st := &diskState{hs: raftpb.HardState{Term: 1 << 20, Vote: id(1), Commit: 1 << 40}, snapIndex: 1 << 40, snapTerm: 1 << 20, snapOffset: 1 << 50}
	index := uint64(1 << 40)
	for move := 0; len(st.confs) < maxConfHistory; move++ {
		old, next := voters(move+1), voters(move+2)
		for _, cs := range []raftpb.ConfState{
			{Voters: old, Learners: []uint64{id(move + rf + 1)}},
			{Voters: next, VotersOutgoing: old, AutoLeave: true},
			{Voters: next},
		} {
			if len(st.confs) < maxConfHistory {
				index += 1000
				st.confs = append(st.confs, confAt{index: index, cs: cs})
			}
		}
	}
	st.cs = st.confs[len(st.confs)-2].cs // joint: the largest
	st.snapCS = st.cs
	return st
}

// The raft state slot holds a full membership history of a group whose
// members all have raft ids per incarnation (the largest ids take 8 bytes),
// up to a replication factor of maxRaftIDReplicas.
func TestStateSlotHoldsIncarnationRaftIDs(t *testing.T) {
	const maxRaftIDReplicas = 8
	for rf := 1; rf <= maxRaftIDReplicas; rf++ {
		st := slotStateWithMoves(rf, 1<<20)
		if _, err := encodeSlot(st, 1); err != nil {
			t.Fatalf("replication factor %d: %v", rf, err)
		}
		t.Logf("replication factor %d: %d bytes of state", rf, len(encodeState(st)))
	}
}
