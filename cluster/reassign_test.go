package cluster

import (
	"errors"
	"slices"
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// metadataWith builds metadata with nodes 1..n (racks from racks, if
// given) and one topic per placement.
func metadataWith(n int, racks []string, topics map[string][][]uint64) *Metadata {
	md := &Metadata{Nodes: map[uint64]*heraldpb.NodeRecord{}, Topics: map[string]*heraldpb.TopicRecord{}}
	for i := 1; i <= n; i++ {
		rec := &heraldpb.NodeRecord{NodeId: uint64(i)}
		if racks != nil {
			rec.Rack = racks[i-1]
		}
		md.Nodes[uint64(i)] = rec
	}
	for name, parts := range topics {
		t := &heraldpb.TopicRecord{Name: name, RequestId: "id-" + name, Config: &heraldpb.TopicConfig{Partitions: uint32(len(parts))}}
		for p, reps := range parts {
			t.Partitions = append(t.Partitions, &heraldpb.PartitionAssignment{Id: uint32(p), Replicas: reps})
		}
		md.Topics[name] = t
	}
	return md
}

func allUp(uint64) bool { return true }

// apply applies the plan's moves as if each had finished.
func applyPlan(t *testing.T, md *Metadata, p *planner) {
	t.Helper()
	for _, cmd := range p.commands() {
		applyCommand(md, cmd)
		r := cmd.GetReassignPartitions()
		for _, mv := range r.Partitions {
			pa := md.Topics[r.Topic].Partitions[mv.Id]
			if !slices.Equal(pa.Target, mv.Target) {
				t.Fatalf("%s-%d: target %v after the command, want %v", r.Topic, mv.Id, pa.Target, mv.Target)
			}
			applyCommand(md, &heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_CompleteReassignment{
				CompleteReassignment: &heraldpb.CompleteReassignment{Topic: r.Topic, TopicId: r.TopicId, Partition: mv.Id, ReassignmentId: cmd.RequestId}}})
		}
	}
}

func checkSpread(t *testing.T, md *Metadata, nodes []uint64) {
	t.Helper()
	loads := Loads(md)
	minR, maxR, minL, maxL := 1<<30, 0, 1<<30, 0
	for _, id := range nodes {
		l := loads[id]
		minR, maxR, minL, maxL = min(minR, l.Replicas), max(maxR, l.Replicas), min(minL, l.Leaders), max(maxL, l.Leaders)
	}
	if maxR-minR > 1 || maxL-minL > 1 {
		t.Fatalf("not balanced over %v: %v", nodes, loads)
	}
	for _, tr := range md.Topics {
		for _, pa := range tr.Partitions {
			if len(pa.Target) > 0 {
				t.Fatalf("%s-%d still moving", tr.Name, pa.Id)
			}
			for i, id := range pa.Replicas {
				if slices.Contains(pa.Replicas[:i], id) {
					t.Fatalf("%s-%d: replicas %v repeat a node", tr.Name, pa.Id, pa.Replicas)
				}
			}
		}
	}
}

// A fourth node joins three that hold 12 partitions of RF 3: rebalance
// moves a quarter of the replicas and of the preferred leaders to it.
func TestRebalanceOntoNewNode(t *testing.T) {
	placed, err := Place(12, 3, []NodeInfo{{ID: 1}, {ID: 2}, {ID: 3}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	md := metadataWith(4, nil, map[string][][]uint64{"orders": placed})
	p := newPlanner(md, allUp)
	p.rebalance()
	if len(p.moves) == 0 {
		t.Fatal("no moves planned")
	}
	applyPlan(t, md, p)
	checkSpread(t, md, []uint64{1, 2, 3, 4})
	if l := Loads(md)[4]; l.Replicas != 9 || l.Leaders != 3 {
		t.Fatalf("node 4 holds %+v, want 9 replicas and 3 leaders", l)
	}
	// Balanced already: nothing more to do.
	p = newPlanner(md, allUp)
	p.rebalance()
	if len(p.moves) != 0 {
		t.Fatalf("a balanced cluster got %d moves: %+v", len(p.moves), p.moves)
	}
}

// Removing a node moves each of its replicas to another node, keeping
// racks distinct where they can be.
func TestReplaceKeepsRacks(t *testing.T) {
	racks := []string{"a", "b", "c", "a", "c"}
	md := metadataWith(5, racks, map[string][][]uint64{"t": {{1, 2, 3}, {2, 3, 1}, {3, 1, 2}, {4, 2, 5}}})
	p := newPlanner(md, allUp)
	delete(p.usable, 1)
	for _, name := range []string{"t"} {
		for _, pa := range md.Topics[name].Partitions {
			if slices.Contains(pa.Replicas, 1) && !p.replace(md.Topics[name], pa, func(id uint64) bool { return id == 1 }) {
				t.Fatalf("partition %d: no replacement", pa.Id)
			}
		}
	}
	if len(p.moves) != 3 {
		t.Fatalf("%d moves, want 3: %+v", len(p.moves), p.moves)
	}
	for _, mv := range p.moves {
		at := slices.Index(mv.from, 1)
		if mv.target[at] != 4 { // node 4 is on rack a, the one node 1 leaves
			t.Fatalf("partition %d: node 1 replaced by %d, want 4 (rack a)", mv.part, mv.target[at])
		}
	}
	// With node 4 gone as well there is no rack a left: any other node.
	p = newPlanner(md, func(id uint64) bool { return id != 4 })
	delete(p.usable, 1)
	pa := md.Topics["t"].Partitions[0]
	if !p.replace(md.Topics["t"], pa, func(id uint64) bool { return id == 1 }) || p.moves[0].target[0] != 5 {
		t.Fatalf("moves %+v, want node 1 replaced by 5", p.moves)
	}
	// No node left to take it: nothing planned.
	md2 := metadataWith(3, nil, map[string][][]uint64{"t": {{1, 2, 3}}})
	p = newPlanner(md2, allUp)
	delete(p.usable, 1)
	if p.replace(md2.Topics["t"], md2.Topics["t"].Partitions[0], func(id uint64) bool { return id == 1 }) || len(p.moves) != 0 {
		t.Fatalf("replace with no free node planned %+v", p.moves)
	}
}

// A partition being moved keeps its move: a second reassignment of it is
// ignored, a completion must name the running move, and the joined ids
// name the new replicas.
func TestApplyReassignment(t *testing.T) {
	md := metadataWith(5, nil, map[string][][]uint64{"t": {{1, 2, 3}, {1, 2, 3}}})
	reassign := func(id string, part uint32, target ...uint64) {
		applyCommand(md, &heraldpb.ControllerCommand{RequestId: id, Command: &heraldpb.ControllerCommand_ReassignPartitions{
			ReassignPartitions: &heraldpb.ReassignPartitions{Topic: "t", TopicId: "id-t", Partitions: []*heraldpb.PartitionAssignment{{Id: part, Target: target}}}}})
	}
	complete := func(id string, part uint32) {
		applyCommand(md, &heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_CompleteReassignment{
			CompleteReassignment: &heraldpb.CompleteReassignment{Topic: "t", TopicId: "id-t", Partition: part, ReassignmentId: id}}})
	}
	before := md.Topics["t"]
	reassign("m1", 0, 4, 2, 3)
	if pa := md.Topics["t"].Partitions[0]; !slices.Equal(pa.Target, []uint64{4, 2, 3}) || pa.Joined[4] != "m1" || pa.ReassignmentId != "m1" {
		t.Fatalf("after the move: %v", pa)
	}
	if len(before.Partitions[0].Target) != 0 {
		t.Fatal("the earlier metadata's record changed")
	}
	reassign("m2", 0, 5, 2, 3) // running: ignored
	reassign("m3", 1, 1, 2, 9) // node 9 is not registered: ignored
	reassign("m4", 1, 1, 2)    // another size: ignored
	for _, pa := range md.Topics["t"].Partitions {
		if pa.Id == 0 && pa.ReassignmentId != "m1" || pa.Id == 1 && len(pa.Target) != 0 {
			t.Fatalf("partition %d: %v", pa.Id, pa)
		}
	}
	complete("m2", 0) // not the running move
	if len(md.Topics["t"].Partitions[0].Target) == 0 {
		t.Fatal("a completion naming another move ended the running one")
	}
	complete("m1", 0)
	if pa := md.Topics["t"].Partitions[0]; !slices.Equal(pa.Replicas, []uint64{4, 2, 3}) || len(pa.Target) != 0 || pa.Joined[4] != "m1" {
		t.Fatalf("after completion: %v", pa)
	}
	// Back to node 1: node 4's joined id goes, and node 1's new replica
	// is named by this move (its first one was deleted when it left).
	reassign("m5", 0, 1, 2, 3)
	complete("m5", 0)
	if pa := md.Topics["t"].Partitions[0]; !slices.Equal(pa.Replicas, []uint64{1, 2, 3}) || len(pa.Joined) != 1 || pa.Joined[1] != "m5" {
		t.Fatalf("after moving back: %v", pa)
	}
	// Decommissioning survives the node's next registration.
	applyCommand(md, &heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_DecommissionNode{DecommissionNode: &heraldpb.DecommissionNode{NodeId: 5, Decommissioned: true}}})
	applyCommand(md, &heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_RegisterNode{RegisterNode: &heraldpb.NodeRecord{NodeId: 5, MemberId: "again"}}})
	if n := md.Nodes[5]; !n.Decommissioned || n.MemberId != "again" {
		t.Fatalf("node 5 after registering again: %v", n)
	}
	p := newPlanner(md, allUp)
	if p.usable[5] {
		t.Fatal("a decommissioned node may take replicas")
	}
}

// Leaders alone out of balance: rebalance reorders replica sets without
// moving data.
func TestRebalanceLeadersOnly(t *testing.T) {
	var parts [][]uint64
	for range 6 {
		parts = append(parts, []uint64{1, 2, 3})
	}
	md := metadataWith(3, nil, map[string][][]uint64{"t": parts})
	p := newPlanner(md, allUp)
	p.rebalance()
	for _, mv := range p.moves {
		a, b := slices.Sorted(slices.Values(mv.from)), slices.Sorted(slices.Values(mv.target))
		if !slices.Equal(a, b) {
			t.Fatalf("move %+v changes the replica set", mv)
		}
	}
	applyPlan(t, md, p)
	checkSpread(t, md, []uint64{1, 2, 3})
}

// A running move to a node that is gone gets another node in its place
// (replace_running); the node that stays in the target keeps its joined
// id, the one dropped loses it. Without the flag a running move is kept;
// with it, a partition that is not moving is left alone.
func TestRetargetGoneNode(t *testing.T) {
	md := metadataWith(6, nil, map[string][][]uint64{"t": {{1, 2, 3}, {1, 2, 3}}})
	applyCommand(md, &heraldpb.ControllerCommand{RequestId: "m1", Command: &heraldpb.ControllerCommand_ReassignPartitions{
		ReassignPartitions: &heraldpb.ReassignPartitions{Topic: "t", TopicId: "id-t", Partitions: []*heraldpb.PartitionAssignment{{Id: 0, Target: []uint64{4, 5, 3}}}}}})
	gone := func(id uint64) bool { return id == 4 }
	p := newPlanner(md, func(id uint64) bool { return id != 4 })
	if !p.retarget(md.Topics["t"], md.Topics["t"].Partitions[0], gone) || len(p.moves) != 1 {
		t.Fatalf("retarget planned %+v", p.moves)
	}
	mv := p.moves[0]
	if !mv.replace || mv.target[0] == 4 || slices.Contains([]uint64{1, 2, 3, 5}, mv.target[0]) || mv.target[1] != 5 || mv.target[2] != 3 {
		t.Fatalf("retarget move %+v", mv)
	}
	cmds := p.commands()
	if len(cmds) != 1 || !cmds[0].GetReassignPartitions().ReplaceRunning {
		t.Fatalf("commands %v", cmds)
	}
	// The same move without the flag: ignored, the running one stays.
	plain := proto.Clone(cmds[0]).(*heraldpb.ControllerCommand)
	plain.GetReassignPartitions().ReplaceRunning = false
	applyCommand(md, plain)
	if pa := md.Topics["t"].Partitions[0]; pa.ReassignmentId != "m1" {
		t.Fatalf("a plain reassignment replaced a running move: %v", pa)
	}
	applyCommand(md, cmds[0])
	pa := md.Topics["t"].Partitions[0]
	if !slices.Equal(pa.Target, mv.target) || pa.ReassignmentId != cmds[0].RequestId || pa.Joined[5] != "m1" ||
		pa.Joined[mv.target[0]] != cmds[0].RequestId || pa.Joined[4] != "" {
		t.Fatalf("after the replacement: %v", pa)
	}
	// Replacing a partition that is not moving does nothing.
	stale := proto.Clone(cmds[0]).(*heraldpb.ControllerCommand) // planned against m1, which is no longer running
	stale.RequestId = "m4"
	stale.GetReassignPartitions().Partitions[0].Target = []uint64{6, 5, 3}
	applyCommand(md, stale)
	if pa := md.Topics["t"].Partitions[0]; pa.ReassignmentId != cmds[0].RequestId {
		t.Fatalf("a replacement planned against an earlier move applied: %v", pa)
	}
	applyCommand(md, &heraldpb.ControllerCommand{RequestId: "m3", Command: &heraldpb.ControllerCommand_ReassignPartitions{
		ReassignPartitions: &heraldpb.ReassignPartitions{Topic: "t", TopicId: "id-t", ReplaceRunning: true, Partitions: []*heraldpb.PartitionAssignment{{Id: 1, Target: []uint64{1, 2, 6}}}}}})
	if pa := md.Topics["t"].Partitions[1]; len(pa.Target) != 0 {
		t.Fatalf("replace_running started a move: %v", pa)
	}
}

// MOVE_REPLICA moves one replica of one partition to the node asked for,
// in place (the preferred leader keeps its slot), and refuses what it
// cannot do with a typed error.
func TestMoveReplica(t *testing.T) {
	md := metadataWith(4, nil, map[string][][]uint64{"orders": {{1, 2, 3}, {2, 3, 1}}})
	req := func(topic string, part uint32, from, to uint64) *heraldpb.ClusterAdminRequest {
		return &heraldpb.ClusterAdminRequest{Op: heraldpb.ClusterAdminRequest_MOVE_REPLICA, Topic: topic, Partition: part, NodeId: from, ToNode: to}
	}
	p := newPlanner(md, allUp)
	if err := p.moveReplica(req("orders", 1, 3, 4)); err != nil {
		t.Fatal(err)
	}
	applyPlan(t, md, p)
	if got := md.Topics["orders"].Partitions[1].Replicas; !slices.Equal(got, []uint64{2, 4, 1}) {
		t.Fatalf("replicas after moving 3 to 4: %v, want [2 4 1]", got)
	}
	for _, c := range []struct {
		req  *heraldpb.ClusterAdminRequest
		code heraldpb.ErrorCode
		up   func(uint64) bool
	}{
		{req("nope", 0, 1, 4), heraldpb.ErrorCode_TOPIC_NOT_FOUND, allUp},
		{req("orders", 2, 1, 4), heraldpb.ErrorCode_INVALID_REQUEST, allUp},
		{req("orders", 0, 4, 1), heraldpb.ErrorCode_INVALID_REQUEST, allUp}, // no replica on 4
		{req("orders", 0, 1, 2), heraldpb.ErrorCode_INVALID_REQUEST, allUp}, // 2 holds one
		{req("orders", 0, 1, 9), heraldpb.ErrorCode_NODE_NOT_FOUND, allUp},
		{req("orders", 0, 1, 4), heraldpb.ErrorCode_INVALID_REQUEST, func(id uint64) bool { return id != 4 }}, // 4 down
	} {
		err := newPlanner(md, c.up).moveReplica(c.req)
		var he *heraldpb.Error
		if !errors.As(err, &he) || he.Code != c.code {
			t.Fatalf("%+v: %v, want %v", c.req, err, c.code)
		}
	}
}
