package cluster

import (
	"slices"
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
)

// raftIDLog is a controller log that moves partition t-0 off node 1 and
// back, to node 4 and back, and replaces a running move, on nodes 1-5 that
// all register with replica_raft_ids (unless legacy names one that does
// not).
func raftIDLog(t *testing.T, legacy uint64) [][]byte {
	t.Helper()
	var log [][]byte
	add := func(cmd *heraldpb.ControllerCommand) { log = append(log, controllerRecord(t, cmd)) }
	for id := uint64(1); id <= 5; id++ {
		add(&heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_RegisterNode{RegisterNode: &heraldpb.NodeRecord{
			NodeId: id, MemberId: "m", ReplicaRaftIds: id != legacy}}})
	}
	add(&heraldpb.ControllerCommand{RequestId: "tid", Command: &heraldpb.ControllerCommand_CreateTopic{CreateTopic: &heraldpb.TopicRecord{
		Name: "t", Config: &heraldpb.TopicConfig{Partitions: 1, ReplicationFactor: 3},
		Partitions: []*heraldpb.PartitionAssignment{{Id: 0, Replicas: []uint64{1, 2, 3}}},
	}}})
	move := func(id string, replace, running string, target ...uint64) {
		add(&heraldpb.ControllerCommand{RequestId: id, Command: &heraldpb.ControllerCommand_ReassignPartitions{ReassignPartitions: &heraldpb.ReassignPartitions{
			Topic: "t", TopicId: "tid", ReplaceRunning: replace != "",
			Partitions: []*heraldpb.PartitionAssignment{{Id: 0, Target: target, ReassignmentId: running}}}}})
	}
	complete := func(id string) {
		add(&heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_CompleteReassignment{CompleteReassignment: &heraldpb.CompleteReassignment{
			Topic: "t", TopicId: "tid", Partition: 0, ReassignmentId: id}}})
	}
	move("m1", "", "", 4, 2, 3) // 4 joins
	complete("m1")
	move("m2", "", "", 1, 2, 3) // 1 back, 4 leaves
	complete("m2")
	move("m3", "", "", 4, 2, 5)          // 4 back, and 5 joins...
	move("m4", "replace", "m3", 4, 2, 1) // ...replaced: 5 dropped, 4 stays joining, 1 is not new
	complete("m4")
	return log
}

// The controller's apply gives every replica a move adds a raft id of its
// own (node id | incarnation << 32), from a per-partition counter: a node
// added back gets another id than its earlier replica, a node that stays
// joining across a replaced move keeps its id, and replicas placed at
// creation keep their node ids. Every replica of the controller computes
// the same ids from the same log, and they survive a checkpoint: a replica
// whose log starts at the checkpoint numbers the next incarnation alike.
func TestApplyAssignsRaftIDsPerIncarnation(t *testing.T) {
	log := raftIDLog(t, 0)
	md := emptyMetadata()
	var seen []uint64
	for _, rec := range log {
		applyAll(t, md, rec)
		if tr := md.Topics["t"]; tr != nil {
			for node, id := range tr.Partitions[0].RaftIds {
				if heraldpb.ReplicaNode(id) != node || id == node {
					t.Fatalf("node %d has raft id %#x", node, id)
				}
				if !slices.Contains(seen, id) {
					seen = append(seen, id)
				}
			}
		}
	}
	// Incarnations 1 (4, m1), 2 (1, m2), 3 and 4 (4 and 5, m3; 5 dropped).
	slices.Sort(seen)
	want := []uint64{heraldpb.ReplicaRaftID(4, 1), heraldpb.ReplicaRaftID(1, 2), heraldpb.ReplicaRaftID(4, 3), heraldpb.ReplicaRaftID(5, 4)}
	if !slices.Equal(seen, want) {
		t.Fatalf("raft ids handed out %#x, want %#x", seen, want)
	}
	pa := md.Topics["t"].Partitions[0]
	if !slices.Equal(pa.Replicas, []uint64{4, 2, 1}) || pa.Incarnations != 4 {
		t.Fatalf("partition after the moves: %v", pa)
	}
	if got := pa.RaftIDs(pa.Replicas); !slices.Equal(got, []uint64{heraldpb.ReplicaRaftID(4, 3), 2, heraldpb.ReplicaRaftID(1, 2)}) {
		t.Fatalf("replicas' raft ids %#x", got)
	}
	if len(pa.RaftIds) != 2 || len(pa.Joined) != 2 {
		t.Fatalf("raft ids %v and joined %v of nodes no longer replicas are kept", pa.RaftIds, pa.Joined)
	}

	// Another replica of the controller, applying the same log, agrees.
	again := emptyMetadata()
	applyAll(t, again, log...)
	sameMetadata(t, "the same log applied twice", md, again)

	// A replica whose log starts at a checkpoint of it, then one more move
	// on both: the counter carried over.
	truncated := emptyMetadata()
	truncated.Applied = md.Applied
	applyAll(t, truncated, checkpointRecord(t, md))
	applyAll(t, md, checkpointRecord(t, md))
	sameMetadata(t, "a log truncated before the checkpoint", md, truncated)
	next := controllerRecord(t, &heraldpb.ControllerCommand{RequestId: "m5", Command: &heraldpb.ControllerCommand_ReassignPartitions{ReassignPartitions: &heraldpb.ReassignPartitions{
		Topic: "t", TopicId: "tid", Partitions: []*heraldpb.PartitionAssignment{{Id: 0, Target: []uint64{4, 2, 5}}}}}})
	applyAll(t, md, next)
	applyAll(t, truncated, next)
	sameMetadata(t, "a move after the checkpoint", md, truncated)
	if id := truncated.Topics["t"].Partitions[0].RaftID(5); id != heraldpb.ReplicaRaftID(5, 5) {
		t.Fatalf("node 5 added after the checkpoint has raft id %#x, want incarnation 5", id)
	}
}

// While a registered node runs a version without raft ids per incarnation
// (its registration lacks replica_raft_ids), moves assign none: every
// replica keeps its node id as raft id, as before, and the counter stays.
func TestApplyRaftIDsNeedEveryNode(t *testing.T) {
	md := emptyMetadata()
	applyAll(t, md, raftIDLog(t, 5)...)
	pa := md.Topics["t"].Partitions[0]
	if len(pa.RaftIds) != 0 || pa.Incarnations != 0 || pa.Joined[4] != "m3" {
		t.Fatalf("with an old node registered: %v", pa)
	}
	if got := pa.RaftIDs(pa.Replicas); !slices.Equal(got, pa.Replicas) {
		t.Fatalf("raft ids %v, want the node ids %v", got, pa.Replicas)
	}
}

func TestReplicaRaftID(t *testing.T) {
	for _, c := range []struct {
		node uint64
		inc  uint32
		want uint64
	}{{1, 0, 1}, {7, 1, 1<<32 | 7}, {heraldpb.MaxNodeID, 3, 3<<32 | heraldpb.MaxNodeID}, {9, 1<<32 - 1, (1<<32-1)<<32 | 9}} {
		id := heraldpb.ReplicaRaftID(c.node, c.inc)
		if id != c.want || heraldpb.ReplicaNode(id) != c.node {
			t.Fatalf("ReplicaRaftID(%d, %d) = %#x (node %d), want %#x", c.node, c.inc, id, heraldpb.ReplicaNode(id), c.want)
		}
	}
}
