package partition

// A damaged log (persistence/damage.go): the log found corruption on open,
// quarantined the damaged part and kept every entry before it.
//
//   - A lone voter (a single node, or a partition whose only replica is this
//     one) serves the records it kept and refuses produces with
//     PARTITION_DAMAGED, naming the offsets lost, until an operator accepts
//     the loss (RepairPartitionRequest with accept_loss). New records then
//     get offsets after every lost one.
//   - A replica of a group with other voters rebuilds from its leader. Until
//     its log holds again every index the damaged part held, it neither
//     campaigns nor grants a vote to a candidate whose log is behind what
//     its own log held before the damage: a replica missing entries it
//     once acknowledged must not help elect a leader that lacks them (the
//     class of bug Jepsen found in NATS 2.12.1). Its leader notices that the
//     replica lost entries (a rejection hinting below what it had matched)
//     and resets its record of the replica with a membership change that
//     removes and adds it back, so raft sends it the entries again.

import (
	"cmp"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"

	heraldpb "github.com/heraldmq/herald/proto"
)

// loneVoter reports whether this replica is its group's only voter.
func (a *Actor) loneVoter() bool {
	cs := a.stats.Conf.Load()
	return cs != nil && len(cs.Voters) == 1 && cs.Voters[0] == a.cfg.ReplicaID && len(cs.VotersOutgoing) == 0
}

// damagedError is the PARTITION_DAMAGED answer to a produce, or nil while
// the log is whole (or its damage accepted).
func (a *Actor) damagedError() *heraldpb.Error {
	if a.store == nil || !a.store.Damaged() {
		return nil
	}
	d, _ := a.store.Damage()
	bound := ""
	if !d.ToOffsetExact {
		bound = " at most"
	}
	e := heraldpb.NewError(heraldpb.ErrorCode_PARTITION_DAMAGED,
		"partition %s-%d is damaged: offsets %d to%s %d were lost (%s); it serves the records before them and refuses writes until `herald partition repair %s/%d --accept-loss`",
		a.cfg.Topic, a.cfg.Partition, d.FromOffset, bound, d.ToOffset-1, d.Reason, a.cfg.Topic, a.cfg.Partition)
	e.LostFrom, e.LostTo = d.FromOffset, d.ToOffset
	return e
}

// rebuilding reports whether this replica is rebuilding a damaged log from
// its leader: it must not campaign or vote.
func (a *Actor) rebuilding() bool {
	return a.store != nil && a.store.Damaged() && !a.loneVoter()
}

// filterVotes drops, while the replica rebuilds, its own requests for votes:
// it must not lead with a log that lacks entries it acknowledged. Only the
// outgoing side: see voteAllowed for the votes it grants.
func (a *Actor) filterVotes(m *raftpb.Message) bool {
	if (m.Type == raftpb.MsgVote || m.Type == raftpb.MsgPreVote) && a.rebuilding() {
		a.m.votesWithheld.Inc()
		return false
	}
	return true
}

// voteAllowed reports whether a rebuilding replica may let raft consider a
// vote request: only if the candidate's log is at least as up to date as
// this replica's log was before the damage (raft's own check compares it
// with the shorter log the damage left, and would grant too easily).
func (a *Actor) voteAllowed(m *raftpb.Message) bool {
	if (m.Type != raftpb.MsgVote && m.Type != raftpb.MsgPreVote) || !a.rebuilding() {
		return true
	}
	d, _ := a.store.Damage()
	if m.LogTerm > d.ToTerm || (m.LogTerm == d.ToTerm && m.Index >= d.ToIndex) {
		return true
	}
	a.m.votesWithheld.Inc()
	a.log.Info("withholding a vote: the candidate's log is behind what this replica held before its log was damaged",
		"candidate", m.From, "candidate_last_term", m.LogTerm, "candidate_last_index", m.Index, "damaged_term", d.ToTerm, "damaged_index", d.ToIndex)
	return false
}

// checkRebuilt clears the damage record of a rebuilding replica once its
// log holds, committed and applied, every index the damaged part held.
func (a *Actor) checkRebuilt() {
	if !a.rebuilding() {
		return
	}
	d, _ := a.store.Damage()
	last, _ := a.store.LastIndex()
	if a.applied < d.ToIndex || last < d.ToIndex {
		return
	}
	if a.clearing {
		return
	}
	a.clearing = true
	store, log, applied := a.store, a.log, a.applied
	a.writer.do(func(failed bool) {
		if failed {
			return
		}
		if err := store.ClearDamage(); err != nil {
			log.Warn("clearing the damage record", "err", err)
			return
		}
		log.Info("the damaged log was rebuilt from the leader; the replica votes again", "applied", applied, "damaged_to_index", d.ToIndex)
	})
}

// onAppReject is the leader's look at a follower's rejection: a hint below
// what the follower had matched means the follower lost entries it had
// acknowledged (a damaged log it cut). raft never lowers a match (a
// rejection below it is taken as stale), so this leader would never send
// them again, and the follower would stay behind for good; with a second
// follower damaged the same way, nothing could commit. Only a new term
// gives the group fresh progress records (every follower probed from
// scratch): the leader hands its leadership to a voter that is caught up,
// which then sends the damaged follower what it lost. With none (every
// other voter behind, or a group of two), it gives the leadership up
// itself (restartRaft: its raft node is started again from its log, and
// the election that follows, which it can win, starts a new term).
//
// (A membership change removing and adding the follower back in one
// ConfChangeV2 does not do it: raft applies two changes as a joint
// configuration, and keeps the progress of a voter of the outgoing side.
// The chaos suite's disk-faults scenario stalled a partition for 90 s on
// that: a bit flip on one follower, then a truncated segment on the other.)
func (a *Actor) onAppReject(m *raftpb.Message) {
	if !a.isLeader || a.rn == nil {
		return
	}
	st := a.rn.Status()
	pr, ok := st.Progress[m.From]
	if !ok || m.RejectHint >= pr.Match {
		return
	}
	if a.resetAsked == nil {
		a.resetAsked = map[uint64]int{}
	}
	if t, ok := a.resetAsked[m.From]; ok && a.ticks-t < 50 {
		return
	}
	if st.LeadTransferee != 0 {
		return // a handover is under way
	}
	a.resetAsked[m.From] = a.ticks
	a.m.followerResets.Inc()
	self := a.cfg.ReplicaID
	for _, id := range sortedIDs(st.Config.Voters[0]) {
		p, ok := st.Progress[id]
		if id == self || id == m.From || !ok || p.IsLearner || p.State != tracker.StateReplicate || p.Match < st.Commit {
			continue
		}
		a.log.Warn("a follower lost entries it had acknowledged (a damaged log); handing the leadership to a caught-up voter, whose fresh term sends them again",
			"follower", m.From, "matched", pr.Match, "its_last_index", m.RejectHint, "to", id)
		a.rn.TransferLeader(id)
		return
	}
	a.log.Warn("a follower lost entries it had acknowledged (a damaged log), and no other voter is caught up; restarting this leader's raft node so that a new term sends them again",
		"follower", m.From, "matched", pr.Match, "its_last_index", m.RejectHint)
	a.restartRaft = true
}

// clampHeartbeat lowers a heartbeat's commit to this replica's last index.
// A leader that counts entries this replica lost (a damaged log, cut)
// sends commits beyond its log, and raft panics on those; the lower commit
// is true as well.
func (a *Actor) clampHeartbeat(m *raftpb.Message) {
	if m.Type != raftpb.MsgHeartbeat || a.store == nil {
		return
	}
	if last, err := a.store.LastIndex(); err == nil && m.Commit > last {
		m.Commit = last
	}
}

// onRepair answers a RepairPartitionRequest: the damage record, and with
// accept_loss the loss accepted. A replica with other voters accepts only
// while its group has no leader (every replica damaged: none can rebuild
// from another); with a leader it rebuilds instead and needs no repair.
func (a *Actor) onRepair(ctx actor.Context, f *heraldpb.Frame) {
	req := f.GetRepairPartition()
	replyTo := ctx.Sender()
	if a.store == nil {
		a.reply(ctx, replyTo, heraldpb.ErrorFrame(f.Id, storageError(a.failure)))
		return
	}
	if req.AcceptLoss {
		if a.rebuilding() && a.leader != 0 {
			a.reply(ctx, replyTo, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST,
				"partition %s-%d has a leader (node %d): this replica rebuilds its log from it and needs no repair",
				a.cfg.Topic, a.cfg.Partition, heraldpb.ReplicaNode(a.leader))))
			return
		}
		// The damage record is written by the writer, in order with the
		// log's other writes; onRepaired answers.
		store, gen, send, floor, maxCommit := a.store, a.gen, a.writer.send, req.MinNextOffset, req.MaxCommitIndex
		if a.loneVoter() {
			maxCommit = 0 // its own log is the partition's
		}
		a.writer.do(func(failed bool) {
			err := error(ErrStorageFailed)
			if !failed {
				err = store.AcceptDamage(floor, maxCommit)
			}
			send(repaired{gen: gen, f: f, replyTo: replyTo, err: err, maxCommit: maxCommit})
		})
		return
	}
	a.answerRepair(ctx, f, replyTo)
}

// onRepaired answers a repair whose acceptance the writer recorded.
func (a *Actor) onRepaired(ctx actor.Context, m repaired) {
	if m.gen != a.gen || a.store == nil {
		a.reply(ctx, m.replyTo, heraldpb.ErrorFrame(m.f.Id, storageError(cmp.Or(m.err, ErrStorageFailed))))
		return
	}
	a.writer.drain()
	if m.err != nil {
		a.reply(ctx, m.replyTo, heraldpb.ErrorFrame(m.f.Id, storageError(m.err)))
		return
	}
	if a.isLeader && a.stampReady {
		a.tail = max(a.tail, a.store.NextOffset())
	}
	a.log.Warn("an operator accepted the loss of the damaged log", "next_offset", a.store.NextOffset())
	a.answerRepair(ctx, m.f, m.replyTo)
	if m.maxCommit > 0 && a.applied > m.maxCommit {
		// Raft cannot lower a commit it applied: start it again on the
		// log, from the lowered commit.
		a.log.Warn("reopening the log from its lowered commit index", "applied", a.applied, "commit", m.maxCommit)
		a.failure = fmt.Errorf("partition %s-%d is reopening its log after an accepted loss", a.cfg.Topic, a.cfg.Partition)
		a.closeLog(ctx, heraldpb.NewError(heraldpb.ErrorCode_NOT_LEADER, "partition %s-%d is reopening its log", a.cfg.Topic, a.cfg.Partition))
		a.reopenAt = a.cfg.Clock.Now()
	}
}

// answerRepair answers a RepairPartitionRequest with the damage record.
func (a *Actor) answerRepair(ctx actor.Context, f *heraldpb.Frame, replyTo *actor.PID) {
	r := &heraldpb.RepairPartitionResponse{NextOffset: a.store.NextOffset(), Node: uint32(heraldpb.ReplicaNode(a.cfg.ReplicaID))}
	r.LastIndex, _ = a.store.LastIndex()
	if a.isLeader && a.stampReady {
		r.NextOffset = a.tail
	}
	if d, ok := a.store.Damage(); ok {
		r.Damaged, r.Accepted = true, d.Accepted
		r.LostFrom, r.LostTo, r.LostToExact = d.FromOffset, d.ToOffset, d.ToOffsetExact
		r.Reason, r.Quarantine = d.Reason, d.Quarantine
	}
	a.publish()
	a.reply(ctx, replyTo, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_RepairPartitionResponse{RepairPartitionResponse: r}})
}

// leaderlessDamage is the PARTITION_DAMAGED answer of a rebuilding replica
// whose group has had no leader for a while (three election timeouts):
// likely every replica is damaged, and writes wait for an operator. Nil
// otherwise (the caller answers NOT_LEADER).
func (a *Actor) leaderlessDamage() *heraldpb.Error {
	if !a.rebuilding() || a.leader != 0 || a.ticks-a.leaderSeenTick < 3*a.cfg.ElectionTicks {
		return nil
	}
	e := a.damagedError()
	if e != nil {
		e.Message += "; the partition has no leader: if every replica is damaged, `herald partition repair --accept-loss` accepts the loss on all of them"
	}
	return e
}

// acceptedGap reports whether base starts the first batch after an accepted
// loss that began at hw: the offsets between were lost, not skipped.
func (a *Actor) acceptedGap(hw, base int64) bool {
	d, ok := a.store.Damage()
	return ok && d.Accepted && hw == d.FromOffset && base == d.ToOffset
}
