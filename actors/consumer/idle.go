package consumer

// Idle coordinators: a group with no members keeps its lag current for a
// while, then its coordinator stops (its progress is durable in __groups),
// and the manager keeps its summary and lag gauges current and starts it
// again on its next request.
//
// The stop is a handshake, so that no request is lost to it: the
// coordinator asks the manager (idleStop); the manager holds the group's
// requests from then on and answers stopIdle; the coordinator, having
// handled every request the manager sent before that answer, stops if it
// is still idle, or tells the manager it is busy again (idleBusy), and the
// manager sends it what it held. Only the coordinator stopping itself ends
// it, and the manager learns it from the Terminated it gets as its parent.

import (
	"fmt"
	"github.com/heraldmq/herald/registry"

	"github.com/asynkron/protoactor-go/actor"

	heraldpb "github.com/heraldmq/herald/proto"
)

type (
	// idleStop: a coordinator (pid) of group asks to stop; it has had no
	// members for Options.IdleStop and nothing to write.
	idleStop struct {
		group string
		pid   *actor.PID
	}
	// stopIdle: the manager holds the group's requests; stop if still idle.
	stopIdle struct{}
	// idleBusy: the coordinator did not stop (a request the manager sent
	// before stopIdle made it busy, or a write is in flight).
	idleBusy struct{ group string }
	// idleNotNow: the manager needs the coordinator (a compaction runs);
	// it asks again after another idle period.
	idleNotNow struct{}
)

// idle reports whether the coordinator has nothing that stopping would
// lose: no members, no subscription resolving, no progress to write.
func (c *coordinator) idle() bool {
	return c.live == nil && !c.resolving && len(c.pendingSubs) == 0 && !c.writing && len(c.toWrite) == 0 &&
		len(c.dirty) == 0 && len(c.waiters) == 0 && len(c.flushDone) == 0
}

// maybeIdleStop asks the manager to stop this coordinator once it has been
// idle for Options.IdleStop.
func (c *coordinator) maybeIdleStop(ctx actor.Context) {
	if c.o.IdleStop < 0 || c.idleAsked || !c.idle() || c.o.Clock.Now().Sub(c.idleSince) < c.o.IdleStop {
		return
	}
	if p := ctx.Parent(); p != nil {
		c.idleAsked = true
		ctx.Send(p, &idleStop{group: c.group, pid: ctx.Self()})
	}
}

// onStopIdle is the manager's answer: every request it sent before is
// handled, and it holds the next ones.
func (c *coordinator) onStopIdle(ctx actor.Context) {
	c.idleAsked = false
	if !c.idle() {
		c.idleSince = c.o.Clock.Now()
		ctx.Send(ctx.Parent(), &idleBusy{group: c.group})
		return
	}
	c.log.Debug("stopping the idle group coordinator", "idle_for", c.o.Clock.Now().Sub(c.idleSince))
	mIdleStops.Inc()
	ctx.Stop(ctx.Self())
}

// storedInfo fills gi's topic, mode and partitions from a group's newest
// progress records (recs) of topic topicName, with the lag against the
// partitions' high watermarks: what DescribeGroup shows of a group with no
// members, running or stopped.
func storedInfo(gi *heraldpb.GroupInfo, topics *registry.Registry, topicName string, recs []*heraldpb.GroupProgress) {
	gi.Topic = topicName
	var entry *registry.Entry
	if topicName != "" {
		entry = topics.Get(topicName)
	}
	for _, r := range recs {
		gi.Mode = heraldpb.SubscriptionMode(r.Mode)
		for _, pp := range r.Partitions {
			prog, err := DecodeProgress(pp, 0)
			if err != nil {
				continue
			}
			gi.Retrying += uint32(len(pp.Retries))
			gi.Partitions = append(gi.Partitions, lagOf(pp.Partition, r.Subscriber, prog.Floor(), prog, entry, ""))
		}
	}
}

// publishSummary stores the group's line of ListGroups and sets its lag
// and in-flight gauges from gi.
func publishSummary(group string, st *groupStore, gi *heraldpb.GroupInfo) {
	s := &heraldpb.GroupSummary{Group: group, Topic: gi.Topic, Mode: gi.Mode, Members: uint32(len(gi.Members))}
	for _, pl := range gi.Partitions {
		s.Lag += pl.Lag
		mLag.WithLabelValues(group, gi.Topic, fmt.Sprint(pl.Partition)).Set(float64(pl.Lag))
	}
	mInFlight.WithLabelValues(group).Set(float64(gi.InFlight))
	st.summary.Store(s)
}

// storedRecords is st's newest records of topicName, in subscriber order.
func storedRecords(st *groupStore, topicName string) []*heraldpb.GroupProgress {
	return sortedRecords(st.stored, topicName)
}
