package cluster

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// Moving partition replicas between nodes. A move (a reassignment) is
// recorded in the controller's metadata as the partition's target
// replica set; the nodes in the target start joining replicas, the
// partition's leader walks its raft group to the target's membership
// (actors/partition/reassign.go) and reports it, and the controller
// records the move's end: the target becomes the replica set, and the
// nodes that left stop their replicas and delete their logs.
//
// Moves come from three places: `herald cluster add-node|remove-node|
// rebalance` (Admin), and the controller leader's own loop (moveAway),
// which moves the replicas of nodes down longer than the grace period, or
// decommissioned, to nodes that are up.

// effective is a partition's replica set once its running move (if any)
// is done.
func effective(pa *heraldpb.PartitionAssignment) []uint64 {
	if len(pa.Target) > 0 {
		return pa.Target
	}
	return pa.Replicas
}

// applyReassign starts the moves of cmd whose partitions are not being
// moved already; md is a private copy (its topic records are not).
func applyReassign(md *Metadata, cmd *heraldpb.ControllerCommand) {
	r := cmd.GetReassignPartitions()
	t := md.Topics[r.Topic]
	if t == nil || t.RequestId != r.TopicId {
		return
	}
	var nt *heraldpb.TopicRecord
	for _, mv := range r.Partitions {
		if int(mv.Id) >= len(t.Partitions) || !validTarget(md, mv.Target, len(t.Partitions[mv.Id].Replicas)) {
			continue
		}
		cur := t.Partitions[mv.Id]
		if (len(cur.Target) > 0) != r.ReplaceRunning || slices.Equal(cur.Replicas, mv.Target) {
			continue
		}
		if r.ReplaceRunning && cur.ReassignmentId != mv.ReassignmentId {
			continue // planned against another move than the one running now
		}
		if nt == nil {
			nt = proto.Clone(t).(*heraldpb.TopicRecord)
		}
		pa := nt.Partitions[mv.Id]
		old := pa.Target
		pa.Target, pa.ReassignmentId = slices.Clone(mv.Target), cmd.RequestId
		// A node already joining under the replaced target keeps its
		// replica (and its log folder); a node dropped from it that is
		// not a replica stops its replica (it never became a voter in a
		// completed move, and a later move adds it afresh).
		for _, id := range old {
			if !slices.Contains(pa.Replicas, id) && !slices.Contains(pa.Target, id) {
				delete(pa.Joined, id)
				delete(pa.RaftIds, id)
			}
		}
		for _, id := range mv.Target {
			if !slices.Contains(pa.Replicas, id) && !slices.Contains(old, id) {
				if pa.Joined == nil {
					pa.Joined = map[uint64]string{}
				}
				pa.Joined[id] = cmd.RequestId
				assignRaftID(md, pa, id)
			}
		}
	}
	if nt != nil {
		md.Topics[r.Topic] = nt
	}
}

// assignRaftID gives node's new replica of pa (one a move adds) a raft id
// of its own: the partition's next incarnation. Without it (some
// registered node runs a version that routes raft ids as node ids, or the
// partition's incarnations ran out) the replica's raft id is its node id,
// as it was before raft ids per incarnation.
func assignRaftID(md *Metadata, pa *heraldpb.PartitionAssignment, node uint64) {
	delete(pa.RaftIds, node)
	if !raftIDsOn(md) || pa.Incarnations == math.MaxUint32 {
		return
	}
	pa.Incarnations++
	if pa.RaftIds == nil {
		pa.RaftIds = map[uint64]uint64{}
	}
	pa.RaftIds[node] = heraldpb.ReplicaRaftID(node, pa.Incarnations)
}

// raftIDsOn reports whether every registered node handles raft ids per
// replica incarnation (NodeRecord.replica_raft_ids): a node that does not
// would route a raft id as a node id, and, leading the controller group,
// write checkpoints without them.
func raftIDsOn(md *Metadata) bool {
	for _, n := range md.Nodes {
		if !n.ReplicaRaftIds {
			return false
		}
	}
	return len(md.Nodes) > 0
}

// validTarget: n distinct registered nodes.
func validTarget(md *Metadata, target []uint64, n int) bool {
	if len(target) != n {
		return false
	}
	for i, id := range target {
		if md.Nodes[id] == nil || slices.Contains(target[:i], id) {
			return false
		}
	}
	return true
}

// applyComplete ends a running move.
func applyComplete(md *Metadata, c *heraldpb.CompleteReassignment) {
	t := md.Topics[c.Topic]
	if t == nil || t.RequestId != c.TopicId || int(c.Partition) >= len(t.Partitions) {
		return
	}
	if pa := t.Partitions[c.Partition]; len(pa.Target) == 0 || pa.ReassignmentId != c.ReassignmentId {
		return
	}
	nt := proto.Clone(t).(*heraldpb.TopicRecord)
	pa := nt.Partitions[c.Partition]
	pa.Replicas, pa.Target, pa.ReassignmentId = pa.Target, nil, ""
	for id := range pa.Joined {
		if !slices.Contains(pa.Replicas, id) {
			delete(pa.Joined, id)
		}
	}
	for id := range pa.RaftIds {
		if !slices.Contains(pa.Replicas, id) {
			delete(pa.RaftIds, id)
		}
	}
	md.Topics[c.Topic] = nt
}

func applyDecommission(md *Metadata, d *heraldpb.DecommissionNode) {
	if n := md.Nodes[d.NodeId]; n != nil && n.Decommissioned != d.Decommissioned {
		n = proto.Clone(n).(*heraldpb.NodeRecord)
		n.Decommissioned = d.Decommissioned
		md.Nodes[d.NodeId] = n
	}
}

// move is one planned partition move.
type move struct {
	topic    string
	part     uint32
	from     []uint64
	target   []uint64
	replace  bool   // replaces a running move's target
	replaces string // that move's id
}

// planner plans moves over the metadata: loads count each partition's
// effective replicas and moves planned so far.
type planner struct {
	md     *Metadata
	usable map[uint64]bool // nodes that may take replicas
	load   map[uint64]Load
	moves  []move
	moved  map[string]bool // topic/partition already in the plan
}

func newPlanner(md *Metadata, up func(uint64) bool) *planner {
	p := &planner{md: md, usable: map[uint64]bool{}, load: map[uint64]Load{}, moved: map[string]bool{}}
	for id, n := range md.Nodes {
		if up(id) && !n.Decommissioned {
			p.usable[id] = true
		}
	}
	for _, t := range md.Topics {
		for _, pa := range t.Partitions {
			p.add(effective(pa), 1)
		}
	}
	return p
}

func (p *planner) add(replicas []uint64, sign int) {
	for i, id := range replicas {
		l := p.load[id]
		l.Replicas += sign
		if i == 0 {
			l.Leaders += sign
		}
		p.load[id] = l
	}
}

// partitions lists the partitions that are not being moved, in a fixed
// order (topic name, then id).
func (p *planner) partitions(fn func(t *heraldpb.TopicRecord, pa *heraldpb.PartitionAssignment)) {
	for _, name := range slices.Sorted(maps.Keys(p.md.Topics)) {
		t := p.md.Topics[name]
		for _, pa := range t.Partitions {
			if len(pa.Target) == 0 && !p.moved[fmt.Sprintf("%s/%d", name, pa.Id)] {
				fn(t, pa)
			}
		}
	}
}

// plan records a move of partition pa to target.
func (p *planner) plan(t *heraldpb.TopicRecord, pa *heraldpb.PartitionAssignment, target []uint64) {
	p.add(pa.Replicas, -1)
	p.add(target, 1)
	p.moved[fmt.Sprintf("%s/%d", t.Name, pa.Id)] = true
	p.moves = append(p.moves, move{topic: t.Name, part: pa.Id, from: pa.Replicas, target: target})
}

// replacement picks a usable node to take the place of replica at in
// replicas: not among them, on a rack the others do not use where there
// is one, then with the fewest replicas, then the lowest id. 0: none.
func (p *planner) replacement(replicas []uint64, at int) uint64 {
	racks := map[string]bool{}
	for i, id := range replicas {
		if i != at && p.md.Nodes[id] != nil {
			racks[p.md.Nodes[id].Rack] = true
		}
	}
	best := uint64(0)
	better := func(a, b uint64) bool {
		ra, rb := !racks[p.md.Nodes[a].Rack], !racks[p.md.Nodes[b].Rack]
		if ra != rb {
			return ra
		}
		return cmp.Or(cmp.Compare(p.load[a].Replicas, p.load[b].Replicas), cmp.Compare(a, b)) < 0
	}
	for _, id := range slices.Sorted(maps.Keys(p.usable)) {
		if !slices.Contains(replicas, id) && (best == 0 || better(id, best)) {
			best = id
		}
	}
	return best
}

// replace plans moving pa's replicas on the nodes gone reports to other
// nodes; it reports false (planning nothing) when some have no place.
func (p *planner) replace(t *heraldpb.TopicRecord, pa *heraldpb.PartitionAssignment, gone func(uint64) bool) bool {
	target := slices.Clone(pa.Replicas)
	for i, id := range target {
		if !gone(id) {
			continue
		}
		if target[i] = p.replacement(target, i); target[i] == 0 {
			return false
		}
	}
	if !slices.Equal(target, pa.Replicas) {
		p.plan(t, pa, target)
	}
	return true
}

// retarget plans replacing the nodes gone reports in a running move's
// target; false when some have no place.
func (p *planner) retarget(t *heraldpb.TopicRecord, pa *heraldpb.PartitionAssignment, gone func(uint64) bool) bool {
	target := slices.Clone(pa.Target)
	for i, id := range target {
		if !gone(id) {
			continue
		}
		// Not a replica, not in the target: raft may still count the
		// replaced node, but the new one must be another.
		r := p.replacement(append(slices.Clone(target), pa.Replicas...), i)
		if r == 0 {
			return false
		}
		target[i] = r
	}
	if !slices.Equal(target, pa.Target) {
		p.add(pa.Target, -1)
		p.add(target, 1)
		p.moved[fmt.Sprintf("%s/%d", t.Name, pa.Id)] = true
		p.moves = append(p.moves, move{topic: t.Name, part: pa.Id, from: pa.Target, target: target, replace: true, replaces: pa.ReassignmentId})
	}
	return true
}

// moveReplica plans moving req.Topic's partition's replica on
// req.NodeId to req.ToNode.
func (p *planner) moveReplica(req *heraldpb.ClusterAdminRequest) error {
	t := p.md.Topics[req.Topic]
	switch {
	case t == nil:
		return heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q does not exist", req.Topic)
	case int(req.Partition) >= len(t.Partitions):
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "topic %q has %d partitions: there is no partition %d", req.Topic, len(t.Partitions), req.Partition)
	}
	pa := t.Partitions[req.Partition]
	at := slices.Index(pa.Replicas, req.NodeId)
	switch {
	case len(pa.Target) > 0:
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "%s-%d is being moved already (to %v): wait for that move to end", req.Topic, req.Partition, pa.Target)
	case at < 0:
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "%s-%d has no replica on node %d (its replicas are on %v)", req.Topic, req.Partition, req.NodeId, pa.Replicas)
	case p.md.Nodes[req.ToNode] == nil:
		return heraldpb.NewError(heraldpb.ErrorCode_NODE_NOT_FOUND, "node %d is not registered", req.ToNode)
	case !p.usable[req.ToNode]:
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "node %d is down or removed: it cannot take a replica", req.ToNode)
	case slices.Contains(pa.Replicas, req.ToNode):
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "node %d holds a replica of %s-%d already", req.ToNode, req.Topic, req.Partition)
	}
	target := slices.Clone(pa.Replicas)
	target[at] = req.ToNode
	p.plan(t, pa, target)
	return nil
}

// rebalance plans moves that spread replicas evenly over the usable
// nodes (counts per node differ by at most one where racks allow), then
// preferred leaders (by reordering replica sets: no data moves).
func (p *planner) rebalance() {
	usable := slices.Sorted(maps.Keys(p.usable))
	if len(usable) < 2 {
		return
	}
	extreme := func(get func(Load) int) (hi, lo uint64) {
		for _, id := range usable {
			if hi == 0 || get(p.load[id]) > get(p.load[hi]) {
				hi = id
			}
			if lo == 0 || get(p.load[id]) < get(p.load[lo]) {
				lo = id
			}
		}
		return hi, lo
	}
	replicas := func(l Load) int { return l.Replicas }
	for range 100000 {
		hi, lo := extreme(replicas)
		if p.load[hi].Replicas-p.load[lo].Replicas <= 1 {
			break
		}
		done := false
		p.partitions(func(t *heraldpb.TopicRecord, pa *heraldpb.PartitionAssignment) {
			at := slices.Index(pa.Replicas, hi)
			if done || at < 0 || slices.Contains(pa.Replicas, lo) || !p.rackOK(pa.Replicas, at, lo) {
				return
			}
			target := slices.Clone(pa.Replicas)
			target[at] = lo
			p.plan(t, pa, target)
			done = true
		})
		if !done {
			break
		}
	}
	leaders := func(l Load) int { return l.Leaders }
	for range 100000 {
		hi, lo := extreme(leaders)
		if p.load[hi].Leaders-p.load[lo].Leaders <= 1 {
			break
		}
		done := false
		swap := func(t *heraldpb.TopicRecord, pa *heraldpb.PartitionAssignment, replicas []uint64, replan bool) {
			at := slices.Index(replicas, lo)
			if done || len(replicas) == 0 || replicas[0] != hi || at < 0 {
				return
			}
			target := slices.Clone(replicas)
			target[0], target[at] = target[at], target[0]
			if replan { // a partition moved by this plan: reorder its target
				p.replan(t.Name, pa.Id, target)
			} else {
				p.plan(t, pa, target)
			}
			done = true
		}
		for i := range p.moves {
			mv := p.moves[i]
			swap(p.md.Topics[mv.topic], &heraldpb.PartitionAssignment{Id: mv.part}, mv.target, true)
		}
		p.partitions(func(t *heraldpb.TopicRecord, pa *heraldpb.PartitionAssignment) { swap(t, pa, pa.Replicas, false) })
		if !done {
			break
		}
	}
}

// replan changes the target of a planned move.
func (p *planner) replan(topic string, part uint32, target []uint64) {
	for i := range p.moves {
		if mv := &p.moves[i]; mv.topic == topic && mv.part == part {
			p.add(mv.target, -1)
			p.add(target, 1)
			mv.target = target
		}
	}
}

// rackOK: putting node to in replicas' place at does not lower the number
// of distinct racks the partition spans.
func (p *planner) rackOK(replicas []uint64, at int, to uint64) bool {
	count := func(rs []uint64) int {
		racks := map[string]bool{}
		for _, id := range rs {
			if n := p.md.Nodes[id]; n != nil {
				racks[n.Rack] = true
			}
		}
		return len(racks)
	}
	next := slices.Clone(replicas)
	next[at] = to
	return count(next) >= count(replicas)
}

// commands turns the plan into one ReassignPartitions command per topic.
func (p *planner) commands() []*heraldpb.ControllerCommand {
	byTopic := map[string]*heraldpb.ReassignPartitions{}
	var out []*heraldpb.ControllerCommand
	for _, mv := range p.moves {
		key := fmt.Sprintf("%s/%v", mv.topic, mv.replace)
		r := byTopic[key]
		if r == nil {
			r = &heraldpb.ReassignPartitions{Topic: mv.topic, TopicId: p.md.Topics[mv.topic].RequestId, ReplaceRunning: mv.replace}
			byTopic[key] = r
			out = append(out, &heraldpb.ControllerCommand{RequestId: newRequestID(),
				Command: &heraldpb.ControllerCommand_ReassignPartitions{ReassignPartitions: r}})
		}
		r.Partitions = append(r.Partitions, &heraldpb.PartitionAssignment{Id: mv.part, Target: mv.target, ReassignmentId: mv.replaces})
	}
	return out
}

func (p *planner) response() *heraldpb.ClusterAdminResponse {
	resp := &heraldpb.ClusterAdminResponse{}
	for _, mv := range p.moves {
		resp.Moves = append(resp.Moves, &heraldpb.PartitionMove{Topic: mv.topic, Partition: mv.part, From: ids32(mv.from), To: ids32(mv.target)})
	}
	return resp
}

func ids32(ids []uint64) []uint32 {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		out[i] = uint32(id)
	}
	return out
}

// Admin runs a cluster administration request: plans its moves over this
// node's metadata and has the controller record them (unless a dry run),
// returning once this node's replica applied them. The moves themselves
// run on after it returns. Errors are *heraldpb.Error values.
func (c *Controller) Admin(ctx context.Context, req *heraldpb.ClusterAdminRequest) (*heraldpb.ClusterAdminResponse, error) {
	md := c.state.Load()
	node := md.Nodes[req.NodeId]
	up := c.cfg.Node.View().Up
	p := newPlanner(md, up)
	switch req.Op {
	case heraldpb.ClusterAdminRequest_ADD_NODE:
		if node == nil {
			return nil, heraldpb.NewError(heraldpb.ErrorCode_NODE_NOT_FOUND, "node %d is not registered: start it with --node-id %d and --peers naming this cluster first", req.NodeId, req.NodeId)
		}
		// A node just started is registered before every node's
		// membership has polled it: give it a few seconds.
		for deadline := time.Now().Add(5 * time.Second); !up(req.NodeId); {
			if time.Now().After(deadline) || !c.sleep(100*time.Millisecond) {
				return nil, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "node %d is registered but not up", req.NodeId)
			}
			up = c.cfg.Node.View().Up
		}
		p = newPlanner(md, up)
		p.usable[req.NodeId] = true
		if node.Decommissioned && !req.DryRun {
			if err := c.decommission(ctx, req.NodeId, false); err != nil {
				return nil, err
			}
		}
		p.rebalance()
	case heraldpb.ClusterAdminRequest_REMOVE_NODE:
		if node == nil {
			return nil, heraldpb.NewError(heraldpb.ErrorCode_NODE_NOT_FOUND, "node %d is not registered", req.NodeId)
		}
		if slices.Contains(c.cfg.Voters, req.NodeId) {
			return nil, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST,
				"node %d is a controller voter (the voters are nodes %v, the lowest ids of --peers); it cannot be removed", req.NodeId, c.cfg.Voters)
		}
		delete(p.usable, req.NodeId)
		var stuck []string
		p.partitions(func(t *heraldpb.TopicRecord, pa *heraldpb.PartitionAssignment) {
			if slices.Contains(pa.Replicas, req.NodeId) && !p.replace(t, pa, func(id uint64) bool { return id == req.NodeId }) {
				stuck = append(stuck, fmt.Sprintf("%s-%d", t.Name, pa.Id))
			}
		})
		if len(stuck) > 0 {
			return nil, heraldpb.NewError(heraldpb.ErrorCode_NOT_ENOUGH_REPLICAS,
				"no other node that is up can take the replicas of node %d for %d partitions (%s...)", req.NodeId, len(stuck), stuck[0])
		}
		if !req.DryRun {
			// Partitions being moved now are moved off it later by the
			// controller's loop, which also moves a decommissioned node's
			// replicas.
			if err := c.decommission(ctx, req.NodeId, true); err != nil {
				return nil, err
			}
		}
	case heraldpb.ClusterAdminRequest_REBALANCE:
		p.rebalance()
	case heraldpb.ClusterAdminRequest_MOVE_REPLICA:
		if err := p.moveReplica(req); err != nil {
			return nil, err
		}
	default:
		return nil, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "unknown cluster operation %v", req.Op)
	}
	if req.DryRun {
		return p.response(), nil
	}
	return p.response(), c.proposeMoves(ctx, p)
}

// proposeMoves has the controller record planned moves and waits until
// this node's replica shows each partition being moved (by this plan or
// by another that came first).
func (c *Controller) proposeMoves(ctx context.Context, p *planner) error {
	for _, cmd := range p.commands() {
		r := cmd.GetReassignPartitions()
		err := c.await(ctx, cmd, func(md *Metadata) bool {
			t := md.Topics[r.Topic]
			if t == nil || t.RequestId != r.TopicId {
				return true // deleted meanwhile
			}
			for _, mv := range r.Partitions {
				if pa := t.Partitions[mv.Id]; len(pa.Target) == 0 && !slices.Equal(pa.Replicas, mv.Target) {
					return false
				}
			}
			return true
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (c *Controller) decommission(ctx context.Context, node uint64, on bool) error {
	cmd := &heraldpb.ControllerCommand{RequestId: newRequestID(), Command: &heraldpb.ControllerCommand_DecommissionNode{
		DecommissionNode: &heraldpb.DecommissionNode{NodeId: node, Decommissioned: on}}}
	return c.await(ctx, cmd, func(md *Metadata) bool { n := md.Nodes[node]; return n == nil || n.Decommissioned == on })
}

// CompleteReassignment has the controller record the end of a move whose
// group reached its target, and waits until this node's replica applied
// it (or the move is no longer running).
func (c *Controller) CompleteReassignment(ctx context.Context, topic, topicID string, part uint32, reassignmentID string) error {
	cmd := &heraldpb.ControllerCommand{RequestId: newRequestID(), Command: &heraldpb.ControllerCommand_CompleteReassignment{
		CompleteReassignment: &heraldpb.CompleteReassignment{Topic: topic, TopicId: topicID, Partition: part, ReassignmentId: reassignmentID}}}
	return c.await(ctx, cmd, func(md *Metadata) bool {
		t := md.Topics[topic]
		return t == nil || t.RequestId != topicID || int(part) >= len(t.Partitions) || t.Partitions[part].ReassignmentId != reassignmentID
	})
}

// moveAway runs on every node and acts on the controller group's leader:
// every second it moves the replicas of nodes that have been down longer
// than the grace period, or are decommissioned, to nodes that are up, at
// most MaxMoves partitions being moved at a time. (A new leader starts
// its own clock: a node's grace period runs from when this leader first
// saw it down.)
func (c *Controller) moveAway() {
	defer c.done.Done()
	downSince := map[uint64]time.Time{}
	for c.sleep(time.Second) {
		if c.leader() != c.cfg.Self.NodeId {
			clear(downSince)
			continue
		}
		md := c.state.Load()
		view := c.cfg.Node.View()
		now := time.Now()
		gone := map[uint64]bool{}
		for id, n := range md.Nodes {
			if view.Up(id) {
				delete(downSince, id)
			} else if _, ok := downSince[id]; !ok {
				downSince[id] = now
			}
			if t, ok := downSince[id]; n.Decommissioned || (ok && now.Sub(t) >= c.cfg.ReplicaGrace) {
				gone[id] = true
			}
		}
		if len(gone) == 0 {
			continue
		}
		p := newPlanner(md, view.Up)
		running := 0
		for _, t := range md.Topics {
			for _, pa := range t.Partitions {
				if len(pa.Target) > 0 {
					running++
				}
			}
		}
		isGone := func(id uint64) bool { return gone[id] }
		// Running moves to a node that is gone would wait for it forever:
		// another node takes its place in the target.
		for _, name := range slices.Sorted(maps.Keys(md.Topics)) {
			for _, pa := range md.Topics[name].Partitions {
				if slices.ContainsFunc(pa.Target, isGone) {
					p.retarget(md.Topics[name], pa, isGone)
				}
			}
		}
		p.partitions(func(t *heraldpb.TopicRecord, pa *heraldpb.PartitionAssignment) {
			if running >= c.cfg.MaxMoves || !slices.ContainsFunc(pa.Replicas, isGone) {
				return
			}
			before := len(p.moves)
			p.replace(t, pa, isGone)
			running += len(p.moves) - before
		})
		for _, cmd := range p.commands() {
			r := cmd.GetReassignPartitions()
			c.log.Info("moving replicas off nodes that are gone", "topic", r.Topic, "partitions", len(r.Partitions), "gone", slices.Sorted(maps.Keys(gone)))
			c.propose(cmd) // the next round sees whether it applied
		}
	}
}
