package partition

import (
	"errors"
	"fmt"
	"slices"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// ChangeMembership asks a group's leader replica to change the group's
// voters and learners. Several changes go through joint consensus
// (raft's ConfChangeV2 with an automatic leave). The answer is a
// *ChangeMembershipResult once the change is proposed, not applied:
// callers watch Stats.Conf for the result. A replica that does not lead,
// or a group in joint consensus, refuses it.
type ChangeMembership struct {
	Changes []raftpb.ConfChangeSingle
}

// ChangeMembershipResult answers ChangeMembership.
type ChangeMembershipResult struct{ Err error }

// ErrChangeInProgress is the answer to a membership change proposed while
// the group has not finished applying the previous one.
var ErrChangeInProgress = errors.New("partition: a membership change is in progress")

func (a *Actor) onChangeMembership(ctx actor.Context, m *ChangeMembership) {
	answer := func(err error) {
		if ctx.Sender() != nil {
			ctx.Respond(&ChangeMembershipResult{Err: err})
		}
	}
	switch {
	case a.rn == nil:
		answer(fmt.Errorf("partition %s-%d: storage unavailable: %v", a.cfg.Topic, a.cfg.Partition, a.failure))
		return
	case !a.isLeader:
		answer(fmt.Errorf("partition %s-%d: not the leader (leader is node %d)", a.cfg.Topic, a.cfg.Partition, heraldpb.ReplicaNode(a.leader)))
		return
	case len(m.Changes) == 0:
		answer(errors.New("partition: no membership change given"))
		return
	}
	// (raft itself turns a change proposed while another is unapplied
	// into an empty entry; callers watch Stats.Conf and try again.)
	if st := a.rn.Status(); len(st.Config.Voters[1]) > 0 {
		answer(ErrChangeInProgress)
		return
	}
	if err := a.proposeChanges("requested", m.Changes...); err != nil {
		answer(err)
		return
	}
	answer(nil)
}

// checkInSync refuses an acks=all produce while fewer voters than
// MinInSync are in sync: the leader itself, and each voter the leader has
// heard from within the last election timeout and replicates to without
// probing (its log matches the leader's).
func (a *Actor) checkInSync(acks heraldpb.Acks) *heraldpb.Error {
	if a.cfg.MinInSync <= 1 || acks != heraldpb.Acks_ACKS_ALL {
		return nil
	}
	n := a.inSync()
	if n >= a.cfg.MinInSync {
		return nil
	}
	a.m.notEnoughReplicas.Inc()
	return heraldpb.NewError(heraldpb.ErrorCode_NOT_ENOUGH_REPLICAS,
		"partition %s-%d has %d in-sync replicas; acks=all needs %d", a.cfg.Topic, a.cfg.Partition, n, a.cfg.MinInSync)
}

// inSync counts the in-sync voters, the leader included. (raft's own
// RecentActive is cleared at every election timeout when CheckQuorum is
// on, so it would report a healthy follower out of sync for a heartbeat
// after each one; the actor keeps its own record of when it last heard
// from each replica.)
func (a *Actor) inSync() int {
	var buf [8]uint32
	return len(a.inSyncNodes(buf[:0]))
}

// inSyncNodes appends the node ids of the in-sync voters (as inSync
// counts them) to dst, sorted.
func (a *Actor) inSyncNodes(dst []uint32) []uint32 {
	a.rn.WithProgress(func(id uint64, typ raft.ProgressType, pr tracker.Progress) {
		if typ != raft.ProgressTypePeer || pr.IsLearner {
			return
		}
		heard, ok := a.heard[id]
		if id == a.cfg.ReplicaID || (ok && a.ticks-heard <= a.cfg.ElectionTicks && pr.State == tracker.StateReplicate) {
			dst = append(dst, uint32(heraldpb.ReplicaNode(id)))
		}
	})
	slices.Sort(dst)
	return dst
}

// heardFrom notes a raft message from replica id.
func (a *Actor) heardFrom(id uint64) {
	if a.heard == nil {
		a.heard = map[uint64]int{}
	}
	a.heard[id] = a.ticks
}
