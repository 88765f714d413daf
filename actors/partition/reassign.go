package partition

import (
	"maps"
	"slices"

	"github.com/heraldmq/herald/internal/raftwire"
	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// Moving a group to another set of replicas (a reassignment). The
// controller records the target; every replica is told it (SetTarget),
// and whichever replica leads walks the group there one step at a time,
// each step taken only once the previous one is applied:
//
//  1. each target replica that is not a member yet is added as a learner
//     (its node has started an empty joining replica; one whose raft id is
//     its node id is added once it announced itself);
//  2. once every such learner replicates and is within catchUpSlack
//     entries of the commit index, a leader that is not in the target
//     hands its leadership to a target voter that is caught up;
//  3. the learners become voters and the replicas not in the target are
//     removed, in one joint-consensus change that raft leaves on its own
//     (ConfChangeV2, automatic transition);
//  4. with the target's membership in place, leadership goes to the
//     target's first replica (the preferred leader) if it is caught up,
//     and OnTargetReached reports it, so that the controller ends the move.
//
// A leader that loses its term stops; the next one resumes from whatever
// membership the group has. Removed replicas are stopped and their logs
// deleted by their nodes once the controller records the move's end.
//
// The target names replicas by raft id. A replica a move added has a raft
// id of its own (heraldpb.ReplicaRaftID), so a node that left the group and
// is added back joins as another member than its earlier replica: whatever
// the group still records of the earlier one (a voter or learner, its
// progress) belongs to an id that is not in the target, and goes. Replicas
// whose raft id is their node id (placed at creation, or added by a move
// recorded before raft ids per incarnation) keep the checks below that
// tell an empty incarnation from an earlier one of the same id.

// SetTarget tells a replica the replica set its group is being moved to
// (raft ids, the preferred leader first; nil: no move), and the move that
// started each node's replica (by node id: nodes a move added; see
// Config.JoinAs). Only the leader acts on it.
type SetTarget struct {
	Target []uint64
	Joined map[uint64]string
}

const (
	// targetStepTicks spaces the steps (raft applies a membership change
	// in a round trip; a step proposed too early is refused and retried).
	targetStepTicks = 3
	// catchUpSlack is how many entries a learner may trail the commit
	// index by and still be promoted: under load it never catches up
	// exactly, and raft brings it the rest.
	catchUpSlack = 64
)

func (a *Actor) onSetTarget(m *SetTarget) {
	// A node whose replica is now another incarnation than before (it
	// left and was added again, or its move was replaced) may still be a
	// member under the old one: with the same raft id (one that is its
	// node id), the leader's record of how far that one got would be taken
	// for the new, empty one's. It is removed from the group and added
	// afresh. (Keyed by node id.)
	for id, inc := range m.Joined {
		if old, ok := a.joined[id]; ok && old != inc {
			if a.stale == nil {
				a.stale = map[uint64]bool{}
			}
			a.stale[id] = true
		}
	}
	a.joined = maps.Clone(m.Joined)
	if slices.Equal(a.target, m.Target) {
		return
	}
	a.target = slices.Clone(m.Target)
	a.targetTransfer = false
	a.targetStep = a.ticks - targetStepTicks
	if len(a.target) > 0 {
		a.wake()
		a.log.Info("replica set target", "target", a.target)
	} else {
		a.log.Info("replica set target cleared")
	}
}

// stepTarget takes the next step towards the target (called every tick).
func (a *Actor) stepTarget() {
	if len(a.target) == 0 || !a.isLeader || a.rn == nil || a.ticks-a.targetStep < targetStepTicks {
		return
	}
	a.targetStep = a.ticks
	st := a.rn.Status()
	if len(st.Config.Voters[1]) > 0 || st.LeadTransferee != 0 || st.Applied < st.Commit {
		return // a change or a handover is under way
	}
	self := a.cfg.ReplicaID
	isVoter := func(id uint64) bool { _, ok := st.Config.Voters[0][id]; return ok }
	isLearner := func(id uint64) bool { _, ok := st.Config.Learners[id]; return ok }
	caughtUp := func(id uint64) bool {
		pr, ok := st.Progress[id]
		return ok && (id == self || (pr.State == tracker.StateReplicate && pr.Match+catchUpSlack >= st.Commit))
	}
	remove := func(what string, id uint64) {
		a.proposeChanges(what, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeRemoveNode, NodeID: id})
	}
	// replaced: the target has another raft id on id's node (the node
	// runs a later incarnation now).
	replaced := func(id uint64) bool {
		return !slices.Contains(a.target, id) && slices.ContainsFunc(a.target, func(t uint64) bool {
			return heraldpb.ReplicaNode(t) == heraldpb.ReplicaNode(id)
		})
	}
	// 0. Members that are not what the leader takes them for go first:
	// learners a replaced move left behind, members whose node runs
	// another incarnation now, and members whose (empty) replica announced
	// itself although the leader counts entries on it.
	for _, id := range sortedIDs(st.Config.Learners) {
		if !slices.Contains(a.target, id) {
			remove("removing a learner the move no longer needs", id)
			return
		}
	}
	for _, id := range sortedIDs(st.Config.Voters[0]) {
		if id != self && replaced(id) {
			remove("removing a member that another incarnation replaced", id)
			return
		}
	}
	for _, id := range a.target {
		member := isVoter(id) || isLearner(id)
		node := heraldpb.ReplicaNode(id)
		switch {
		case !member:
			delete(a.stale, node)
		case id == self:
		case id != node:
			// A raft id of its own names one incarnation: nothing of an
			// earlier one can be taken for it. But that incarnation may
			// have lost its log (its disk, or writes confirmed and never
			// synced): the leader's record of how far it got is then
			// wrong, raft never lowers it, and the replica would never
			// catch up. It is removed, and added again at once below.
			if a.announced(id) && st.Progress[id].Match > 0 {
				remove("removing a member whose replica restarted empty", id)
				return
			}
		case a.stale[node]:
			remove("removing a member that another incarnation replaced", id)
			return
		case a.announced(id) && st.Progress[id].Match > 0:
			remove("removing a member whose replica restarted empty", id)
			return
		}
	}
	// 1. Learners for the target's new replicas. One whose raft id is its
	// node id is added only once it has announced itself (the replica of
	// the move that named it, not an earlier one still answering); one
	// with a raft id of its own at once (only that incarnation answers to
	// it).
	for _, id := range a.target {
		if !isVoter(id) && !isLearner(id) {
			if node := heraldpb.ReplicaNode(id); id == node && a.joined[node] != "" && !a.announced(id) {
				return // its node has not started it yet
			}
			delete(a.joining, id)
			a.proposeChanges("adding a learner", raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddLearnerNode, NodeID: id})
			return
		}
	}
	// 2. Wait until they have caught up.
	for _, id := range a.target {
		if isLearner(id) && !caughtUp(id) {
			return
		}
	}
	// 3. A leader leaving the group hands over first.
	if !slices.Contains(a.target, self) {
		for _, id := range a.target {
			if isVoter(id) && caughtUp(id) {
				a.log.Info("handing leadership to a replica that stays", "to", id)
				a.rn.TransferLeader(id)
				return
			}
		}
	}
	// 4. One joint change: learners in, the others out.
	var changes []raftpb.ConfChangeSingle
	for _, id := range a.target {
		if isLearner(id) {
			changes = append(changes, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddNode, NodeID: id})
		}
	}
	for _, set := range []map[uint64]struct{}{st.Config.Voters[0], st.Config.Learners} {
		for _, id := range sortedIDs(set) {
			if !slices.Contains(a.target, id) {
				changes = append(changes, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeRemoveNode, NodeID: id})
			}
		}
	}
	if len(changes) > 0 {
		a.proposeChanges("moving the group", changes...)
		return
	}
	// 5. The target's membership is in place.
	if pref := a.target[0]; pref != self && !a.targetTransfer && caughtUp(pref) {
		a.targetTransfer = true
		a.log.Info("handing leadership to the preferred leader", "to", pref)
		a.rn.TransferLeader(pref)
	}
	if a.cfg.OnTargetReached != nil {
		a.cfg.OnTargetReached(slices.Clone(a.target))
	}
}

// proposeChanges proposes a membership change as the leader (several
// changes: joint consensus, left automatically).
func (a *Actor) proposeChanges(what string, changes ...raftpb.ConfChangeSingle) error {
	a.wake()
	a.lastBusy = a.ticks
	cc := raftpb.ConfChangeV2{Changes: changes}
	if err := a.rn.ProposeConfChange(cc); err != nil {
		a.log.Warn("membership change refused", "what", what, "changes", cc.String(), "err", err)
		return err
	}
	a.log.Info("membership change proposed", "what", what, "changes", cc.String())
	return nil
}

func sortedIDs(set map[uint64]struct{}) []uint64 {
	out := make([]uint64, 0, len(set))
	for id := range set {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// emptyJoiner reports whether this replica was started by a move and
// holds nothing yet.
func (a *Actor) emptyJoiner() bool {
	if a.cfg.JoinAs == "" || a.store == nil {
		return false
	}
	last, err := a.store.LastIndex()
	return err == nil && last == 0
}

// announce has an empty replica that a move started tell the group it is
// there (every 5 ticks), until it hears from a leader. It goes to the nodes
// in Announce (a node id routes to that node's replica). The leader waits
// for it before adding a replica whose raft id is its node id; for one with
// a raft id of its own, it tells a leader that counts entries on it that
// it lost them.
func (a *Actor) announce() {
	if a.leader != 0 || len(a.cfg.Announce) == 0 || a.ticks-a.lastAnnounce < 5 || !a.emptyJoiner() {
		return
	}
	a.lastAnnounce = a.ticks
	j := &heraldpb.Joining{From: a.cfg.ReplicaID, Incarnation: a.cfg.JoinAs}
	for _, to := range a.cfg.Announce {
		if to != heraldpb.ReplicaNode(a.cfg.ReplicaID) {
			a.sendRaft(to, &raftwire.Message{Group: a.group(), Joining: j})
		}
	}
}

// onJoining notes an empty replica's announcement (every replica does:
// whichever leads, now or later, knows it).
func (a *Actor) onJoining(j *heraldpb.Joining) {
	if a.joining == nil {
		a.joining = map[uint64]joinSeen{}
	}
	if a.joining[j.From].incarnation != j.Incarnation {
		a.log.Info("an empty replica announced itself", "node", heraldpb.ReplicaNode(j.From), "raft_id", j.From, "incarnation", j.Incarnation)
	}
	a.joining[j.From] = joinSeen{incarnation: j.Incarnation, tick: a.ticks}
	a.wake()
}

// joinSeen is a replica's last announcement.
type joinSeen struct {
	incarnation string
	tick        int
}

// announced reports whether the replica with raft id id is, as of its
// recent announcements, the empty one the current move started on its
// node (an empty replica announces itself every 5 ticks; one that holds
// entries, or heard from a leader, stops).
func (a *Actor) announced(id uint64) bool {
	j, ok := a.joining[id]
	return ok && j.incarnation != "" && j.incarnation == a.joined[heraldpb.ReplicaNode(id)] && a.ticks-j.tick <= 20
}
