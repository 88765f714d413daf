package partition

import (
	"slices"

	"github.com/heraldmq/herald/internal/raftwire"
	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// Quiescence: an idle replicated group stops ticking, so thousands of
// idle partitions send no heartbeats (CockroachDB's approach). The leader
// quiesces once nothing was proposed for QuiesceTicks and every replica
// has the whole log committed and applied; it tells each follower, which
// quiesces too if its own state matches. A quiesced replica still gets
// its tick messages (for retention and idle release) but does not step
// raft's clock, so no heartbeat is sent and no election timer runs.
//
// Waking: a proposal or a membership change wakes the leader; any raft
// message wakes a follower (the leader's next heartbeat or append wakes
// them all). A follower that did not quiesce keeps ticking: its election
// timeout sends pre-votes, which wake the leader (its heartbeats follow),
// while the leader and the other followers, whose election clocks stood
// still, are within their lease and ignore them. A quiesced follower
// whose leader's node leaves the membership (Config.Liveness) wakes and,
// after an election timeout, elects a new leader: an idle partition fails
// over after its leader's node is seen down, an active one as soon as its
// election timeout passes.

// maybeQuiesce quiesces an idle leader (called on each tick).
func (a *Actor) maybeQuiesce() {
	if a.cfg.Liveness == nil || !a.isLeader || a.quiesced || a.ticks-a.lastBusy < a.cfg.QuiesceTicks ||
		len(a.pending) > 0 || len(a.txn.batchWait) > 0 || len(a.txn.closing) > 0 || len(a.sessions.waiting) > 0 || a.appendsQueued > 0 || !a.stampReady || len(a.target) > 0 {
		return
	}
	st := a.rn.Status()
	if st.Applied != st.Commit || len(st.Config.Voters[1]) > 0 || st.LeadTransferee != 0 || len(st.Progress) < 2 {
		return
	}
	for _, pr := range st.Progress {
		if pr.Match != st.Commit || pr.State != tracker.StateReplicate {
			return
		}
	}
	q := &heraldpb.Quiesce{From: a.cfg.ReplicaID, Term: st.Term, Index: st.Commit}
	isr := make([]uint32, 0, len(st.Progress))
	for id, pr := range st.Progress {
		if id != a.cfg.ReplicaID {
			a.sendRaft(id, &raftwire.Message{Group: a.group(), Quiesce: q})
		}
		if !pr.IsLearner {
			isr = append(isr, uint32(heraldpb.ReplicaNode(id)))
		}
	}
	// Every voter has the whole log (checked above), so all are in sync
	// while the group is quiet. The set last published may lack one: it
	// is computed after each Ready, and a follower slow to answer (a busy
	// node) answers with a heartbeat response, which makes none; kept
	// through the quiet, it would report that follower out of sync until
	// the next write.
	slices.Sort(isr)
	if cur := a.stats.InSync.Load(); cur == nil || !slices.Equal(*cur, isr) {
		a.stats.InSync.Store(&isr)
	}
	a.setQuiesced(true)
}

// onQuiesce quiesces a follower whose state matches its leader's. One
// that has the whole log committed but not yet applied quiesces once it
// has applied it (quiesceLater).
func (a *Actor) onQuiesce(q *heraldpb.Quiesce) {
	a.quiesceAt = nil
	if a.rn == nil || a.isLeader || a.quiesced {
		return
	}
	st := a.rn.BasicStatus()
	last, err := a.store.LastIndex()
	if err != nil || st.Lead != q.From || st.Term != q.Term || st.Commit != q.Index || last != q.Index {
		return
	}
	if st.Applied != q.Index || a.appendsQueued > 0 {
		a.quiesceAt = q
		return
	}
	a.setQuiesced(true)
}

// quiesceLater quiesces a follower that was asked to before it had
// applied the whole log (called after each Ready).
func (a *Actor) quiesceLater() {
	if q := a.quiesceAt; q != nil && a.rn != nil && a.rn.BasicStatus().Applied >= q.Index && a.appendsQueued == 0 {
		a.onQuiesce(q)
	}
}

// wakes reports whether a message from another replica wakes a quiesced
// one: anything but the late answers to the leader's last heartbeats and
// appends (which raft takes as they are), and the heartbeats of the
// current leader (a leader that heartbeats is awake and quiesces its
// followers again once idle).
func (a *Actor) wakes(m *raftpb.Message) bool {
	switch {
	case m.Type == raftpb.MsgHeartbeatResp && a.isLeader:
		return false
	case m.Type == raftpb.MsgAppResp && a.isLeader && !m.Reject:
		return false
	case m.Type == raftpb.MsgHeartbeat && !a.isLeader && m.From == a.leader && m.Term == a.rn.BasicStatus().Term:
		return false
	}
	return true
}

// wake resumes ticking. A leader counts its followers in sync from now:
// they were when it quiesced, and quiet was the reason it heard nothing.
func (a *Actor) wake() {
	if !a.quiesced {
		return
	}
	a.setQuiesced(false)
	a.quiesceAt = nil
	// The periods spent quiet count now, not in the next tick: that tick
	// is one period.
	a.ticks += int(a.elapsed.Swap(0))
	if a.isLeader {
		// Awake for QuiesceTicks at least, heartbeating: a follower that
		// woke it (a restarted one campaigns: it knows no leader) learns
		// of it before it quiesces again, and then quiesces with it.
		// Before, the leader's first tick carried the periods it had been
		// quiet, so it quiesced again at once and sent its followers
		// Quiesce before any heartbeat; such a follower ignored it and
		// campaigned again an election timeout later, and again, knowing
		// no leader for a moment each time.
		a.lastBusy = a.ticks
		// (A follower whose node left the membership meanwhile is not.)
		a.rn.WithProgress(func(id uint64, _ raft.ProgressType, _ tracker.Progress) {
			if id == a.cfg.ReplicaID || a.cfg.Liveness == nil || a.cfg.Liveness(heraldpb.ReplicaNode(id)) {
				a.heardFrom(id)
			}
		})
	}
}

// quiescedTickEvery is how many tick periods one tick message stands for
// while quiesced: a follower notices its leader's node is down within a
// second, and raft's clock stands still anyway.
const quiescedTickEvery = 10

func (a *Actor) setQuiesced(q bool) {
	a.quiesced = q
	a.sleeping.Store(q)
	a.stats.Quiesced.Store(q)
	if q {
		a.m.quiesced.Set(1)
	} else {
		a.m.quiesced.Set(0)
	}
}

// quiescedTick is a tick while quiesced: a follower wakes when its
// leader's node is down.
func (a *Actor) quiescedTick() {
	if !a.isLeader && (a.leader == 0 || !a.cfg.Liveness(heraldpb.ReplicaNode(a.leader))) {
		a.log.Info("leader's node is down; waking", "leader", a.leader)
		a.wake()
	}
}
