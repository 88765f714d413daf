package consumer

// Admin: start positions, group reset, describe, the summary and lag gauges.

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
)

func (c *coordinator) armStats() {
	if !c.statsArmed {
		c.statsArmed = true
		c.after(time.Second, &statsMsg{})
	}
}

// onStats refreshes the gauges and the summary, and polls the breakers so
// that an open one half-opens (gobreaker moves lazily) and delivery resumes.
func (c *coordinator) onStats(ctx actor.Context) {
	l := c.live
	if l == nil {
		// No members: the lag still moves as records arrive, and this is
		// when an operator looks at it.
		c.updateSummary()
		c.maybeIdleStop(ctx)
		c.armStats()
		return
	}
	if e := c.o.Topics.Get(l.topic); !registry.Same(e, l.entry) {
		// The topic was deleted (and maybe made again): its partition
		// actors are gone, so the subscription ends; members may subscribe
		// again to the new topic.
		c.log.Warn("the group's topic was deleted; ending its subscriptions", "topic", l.topic)
		c.endAll(ctx, heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q of group %q was deleted", l.topic, c.group))
		return
	}
	resume := false
	for _, mb := range l.members {
		if mb.breaker.State() != BreakerOpen {
			resume = true
		}
	}
	if resume {
		c.dispatch(ctx)
	}
	c.updateSummary()
	c.armStats()
}

// resolve computes an offset per partition of entry for pos and calls done
// on the coordinator.
func (c *coordinator) resolve(ctx actor.Context, entry *registry.Entry, pos *heraldpb.StartPosition, done func([]int64, *heraldpb.Error)) {
	n := len(entry.Partitions)
	op := &resolveOp{start: make([]int64, n), done: done}
	for p := 0; p < n; p++ {
		st := c.partitionStats(entry, p)
		lo, hi := st.StartOffset.Load(), st.HighWatermark.Load()
		// A partition with no replica on this node: its bounds come from
		// the node that holds one.
		cur := c.current(entry)
		remote := cur.Record != nil && p < len(cur.Dirs) && cur.Dirs[p] == ""
		list := func(spec heraldpb.OffsetSpec, ts int64) {
			id := c.id()
			c.listByID[id] = struct {
				op   *resolveOp
				part int
			}{op, p}
			op.waiting++
			ctx.Request(c.partitionPID(entry, p), &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_ListOffsets{ListOffsets: &heraldpb.ListOffsetsRequest{
				Topic: entry.Name, Partition: uint32(p), Spec: spec, TimestampMs: ts,
			}}})
		}
		switch at := pos.At.(type) {
		case *heraldpb.StartPosition_Earliest:
			if remote {
				list(heraldpb.OffsetSpec_OFFSET_SPEC_EARLIEST, 0)
				continue
			}
			op.start[p] = lo
		case *heraldpb.StartPosition_Offset:
			op.start[p] = max(at.Offset, lo)
			if !remote || hi > 0 {
				op.start[p] = min(op.start[p], hi)
			}
		case *heraldpb.StartPosition_TimestampMs:
			list(heraldpb.OffsetSpec_OFFSET_SPEC_TIMESTAMP, at.TimestampMs)
		default: // latest
			if remote {
				list(heraldpb.OffsetSpec_OFFSET_SPEC_LATEST, 0)
				continue
			}
			op.start[p] = hi
		}
	}
	if op.waiting == 0 {
		done(op.start, nil)
	}
}

func (c *coordinator) onListed(ctx actor.Context, id uint64, off int64, e *heraldpb.Error) {
	w, ok := c.listByID[id]
	if !ok {
		return
	}
	delete(c.listByID, id)
	if e != nil && w.op.failed == nil {
		w.op.failed = e
	}
	w.op.start[w.part] = off
	w.op.waiting--
	if w.op.waiting == 0 {
		w.op.done(w.op.start, w.op.failed)
	}
}

// topicName is the topic the group consumes: its live subscription's, or
// that of its newest progress (being written, or stored); "" for none.
func (c *coordinator) topicName() string {
	if l := c.live; l != nil {
		return l.topic
	}
	name := c.st.lastTop
	for _, r := range c.writeRecs {
		name = r.Topic
	}
	for _, r := range c.toWrite {
		name = r.Topic
	}
	return name
}

// resolvingErr answers a request that waits for a subscription's start
// position to be resolved.
func (c *coordinator) resolvingErr() *heraldpb.Error {
	e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "group %q is starting a subscription", c.group)
	e.RetryAfterMs = 50
	return e
}

func (c *coordinator) onReset(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.ResetGroupRequest) {
	replyTo := ctx.Sender()
	if req.To == nil || req.To.At == nil {
		respond(ctx, replyTo, errFrame(f.Id, heraldpb.ErrorCode_INVALID_REQUEST, "reset needs a position (earliest, latest, offset or timestamp)"))
		return
	}
	if c.resolving {
		respond(ctx, replyTo, heraldpb.ErrorFrame(f.Id, c.resolvingErr()))
		return
	}
	topicName := c.topicName()
	if l := c.live; l != nil {
		if !req.Force {
			respond(ctx, replyTo, errFrame(f.Id, heraldpb.ErrorCode_GROUP_HAS_MEMBERS, "group %q has %d live members; stop them or reset with force", c.group, len(l.members)))
			return
		}
		c.endAll(ctx, heraldpb.NewError(heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND, "group %q was reset with force", c.group))
	}
	if topicName == "" {
		respond(ctx, replyTo, errFrame(f.Id, heraldpb.ErrorCode_GROUP_NOT_FOUND, "group %q has no stored progress", c.group))
		return
	}
	entry := c.o.Topics.Get(topicName)
	if entry == nil {
		respond(ctx, replyTo, errFrame(f.Id, heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q of group %q does not exist", topicName, c.group))
		return
	}
	for _, p := range req.Partitions {
		if int(p) >= len(entry.Partitions) {
			respond(ctx, replyTo, errFrame(f.Id, heraldpb.ErrorCode_PARTITION_NOT_FOUND, "topic %q has no partition %d", topicName, p))
			return
		}
	}
	c.resolving = true
	c.resolve(ctx, entry, req.To, func(start []int64, e *heraldpb.Error) {
		c.resolving = false
		defer func() {
			for _, p := range c.pendingSubs {
				c.onSubscribe(ctx, p)
			}
			c.pendingSubs = nil
		}()
		if e != nil {
			respond(ctx, replyTo, heraldpb.ErrorFrame(f.Id, e))
			return
		}
		recs := c.latestRecords(topicName)
		if len(recs) == 0 {
			recs = []*heraldpb.GroupProgress{{Group: c.group, Topic: topicName}}
		}
		for _, old := range recs {
			rec := &heraldpb.GroupProgress{Group: c.group, Topic: topicName, Subscriber: old.Subscriber, Mode: old.Mode}
			for p := range start {
				if len(req.Partitions) > 0 && !slices.Contains(req.Partitions, uint32(p)) {
					for _, op := range old.Partitions {
						if op.Partition == uint32(p) {
							rec.Partitions = append(rec.Partitions, op)
						}
					}
					continue
				}
				rec.Partitions = append(rec.Partitions, &heraldpb.PartitionProgress{Partition: uint32(p), AckFloor: start[p]})
			}
			c.toWrite = append(c.toWrite, rec)
		}
		// The answer waits until these records are written: it shows the
		// group as they leave it, not as describe (durable floors only)
		// shows it now.
		gi := c.info()
		storedInfo(gi, c.o.Topics, topicName, c.latestRecords(topicName))
		c.waiters = append(c.waiters, waiter{to: replyTo, f: &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ResetGroupResponse{ResetGroupResponse: &heraldpb.ResetGroupResponse{Group: gi}}}})
		c.flush(ctx)
	})
}

// onTxnOffsets applies a committed transaction's offsets (the
// transaction coordinator's CommitTxnOffsets): the group's position in
// each partition listed moves up to its offset, never back, whoever owns
// the partition. Answered once durable in __groups. Applying them again
// (after a crash or a failover of either coordinator) changes nothing.
func (c *coordinator) onTxnOffsets(ctx actor.Context, f *heraldpb.Frame, o *heraldpb.TxnGroupOffsets) {
	replyTo := ctx.Sender()
	fail := func(code heraldpb.ErrorCode, format string, args ...any) {
		respond(ctx, replyTo, errFrame(f.Id, code, format, args...))
	}
	if o == nil || len(o.Partitions) != len(o.Offsets) {
		fail(heraldpb.ErrorCode_INVALID_REQUEST, "group offsets: partitions and offsets do not match")
		return
	}
	if c.resolving {
		respond(ctx, replyTo, heraldpb.ErrorFrame(f.Id, c.resolvingErr()))
		return
	}
	topicName := c.topicName()
	if topicName != "" && topicName != o.Topic {
		fail(heraldpb.ErrorCode_INVALID_REQUEST, "group %q consumes topic %q, not %q", c.group, topicName, o.Topic)
		return
	}
	entry := c.o.Topics.Get(o.Topic)
	if entry == nil {
		fail(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q of group %q does not exist", o.Topic, c.group)
		return
	}
	for i, p := range o.Partitions {
		if int(p) >= len(entry.Partitions) || o.Offsets[i] < 0 {
			fail(heraldpb.ErrorCode_INVALID_REQUEST, "group offsets: partition %d, offset %d of topic %q", p, o.Offsets[i], o.Topic)
			return
		}
	}
	ok := &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_CommitTxnOffsetsResponse{CommitTxnOffsetsResponse: &heraldpb.CommitTxnOffsetsResponse{}}}
	if l := c.live; l != nil {
		for i, p := range o.Partitions {
			if err := l.sub.CommitTo(p, o.Offsets[i]); err != nil {
				fail(heraldpb.ErrorCode_INVALID_REQUEST, "group %q: %v", c.group, err)
				return
			}
			c.doneBelowFloor(p)
		}
		c.markDirty("")
		c.waiters = append(c.waiters, waiter{to: replyTo, f: ok})
		c.checkRevocations(ctx)
		c.dispatch(ctx)
		c.pump(ctx)
		c.flush(ctx)
		return
	}
	// No members: the stored progress moves forward.
	recs := c.latestRecords(o.Topic)
	rec := &heraldpb.GroupProgress{Group: c.group, Topic: o.Topic, Mode: int32(Clustering)}
	for _, r := range recs {
		if r.Subscriber != "" || Mode(r.Mode) == Broadcast {
			fail(heraldpb.ErrorCode_INVALID_REQUEST, "group %q is a broadcast group: it has no group position", c.group)
			return
		}
		rec.Mode = r.Mode
		rec.Partitions = r.Partitions
	}
	parts := map[uint32]*heraldpb.PartitionProgress{}
	for _, pp := range rec.Partitions {
		parts[pp.Partition] = pp
	}
	for i, p := range o.Partitions {
		prog := NewProgress(0, 0)
		old := parts[p]
		if old != nil {
			var err error
			// (The widest span: the group may have been written with any.)
			if prog, err = DecodeProgress(old, maxMaxSpan); err != nil {
				fail(heraldpb.ErrorCode_INTERNAL, "group %q: stored progress of partition %d: %v", c.group, p, err)
				return
			}
		}
		prog.Commit(o.Offsets[i])
		pp := prog.Encode(p)
		for _, r := range old.GetRetries() {
			if r.Offset >= pp.AckFloor {
				pp.Retries = append(pp.Retries, r)
			}
		}
		parts[p] = pp
	}
	rec.Partitions = nil
	for _, p := range slices.Sorted(maps.Keys(parts)) {
		rec.Partitions = append(rec.Partitions, parts[p])
	}
	c.toWrite = append(c.toWrite, rec)
	c.waiters = append(c.waiters, waiter{to: replyTo, f: ok})
	c.flush(ctx)
}

// ---- describe ----------------------------------------------------------------

// current is the registry's entry now for the topic entry was taken for:
// in a cluster a partition's local replica comes and goes as partitions
// move between nodes (a stand-in forwards to other nodes meanwhile), and
// the PIDs and stats held since the subscription may be gone.
func (c *coordinator) current(entry *registry.Entry) *registry.Entry {
	return c.o.Topics.Current(entry)
}

// partitionPID is the actor serving partition p (see current).
func (c *coordinator) partitionPID(entry *registry.Entry, p int) *actor.PID {
	return c.current(entry).Partitions[p]
}

// partitionStats is partition p's published state (see current).
func (c *coordinator) partitionStats(entry *registry.Entry, p int) *partition.Stats {
	return c.current(entry).Stats[p]
}

// info is the group's DescribeGroup answer without its members and
// partitions.
func (c *coordinator) info() *heraldpb.GroupInfo {
	return &heraldpb.GroupInfo{Group: c.group, DeadLettered: c.st.deadLettered, Expired: c.st.expired,
		RetryPolicy: c.st.lastPolicy, DeadLetterTopic: c.st.lastDLQ}
}

// describe is the group as DescribeGroup, ListGroups and the lag gauges
// show it. Its ack floors are durable: each is the floor in the view's
// last progress record written to __groups (or loaded from it), the floor
// a coordinator taking over now would resume from, so a failover never
// shows one go back. What the coordinator holds as done above it in
// memory (acks whose record is still being written among them) counts in
// AckedAbove, and the lag is what is not done: high watermark - floor -
// acked above, the messages the group's consumers still have to handle.
func (c *coordinator) describe() *heraldpb.GroupInfo {
	gi := c.info()
	l := c.live
	if l == nil {
		// Only written records: those still being written (a leaving
		// subscription's last progress) show once they are durable.
		storedInfo(gi, c.o.Topics, c.st.lastTop, storedRecords(c.st, c.st.lastTop))
		return gi
	}
	gi.Topic, gi.Mode, gi.FilterType, gi.Filter = l.topic, wireMode(l.mode), l.filterType, l.filterText
	gi.Retrying = uint32(l.sub.Retrying())
	for _, mid := range l.sub.Members() {
		mb := l.members[mid]
		mi := &heraldpb.MemberInfo{
			MemberId: string(mid), Name: mb.name, Address: cmp.Or(mb.addr, mb.conn.Id),
			InFlight: uint32(l.sub.InFlight(mid)), Credits: uint32(l.sub.Credits(mid) + int(mb.callBudget())),
			Delivered: mb.delivered, Redelivered: mb.redelivered,
			Breaker: heraldpb.BreakerState(mb.breaker.State()), Responder: mb.responder,
		}
		if l.mode == Clustering {
			mi.Partitions = l.sub.Assignor().Owned(mid)
		}
		gi.Members = append(gi.Members, mi)
		gi.InFlight += mi.InFlight
		gi.Redelivered += mb.redelivered
	}
	cur := c.current(l.entry)
	for _, v := range l.sub.Views() {
		stored := c.st.stored[storeKey{topic: l.topic, subscriber: string(v)}]
		for p := range l.entry.Partitions {
			owner := ""
			if l.mode == Clustering {
				if o, ok := l.sub.Assignor().Owner(uint32(p)); ok {
					owner = string(o)
				}
			}
			prog := l.sub.Progress(v, uint32(p))
			floor := durableFloor(stored, uint32(p), l.sub.Start(uint32(p)), prog)
			gi.Partitions = append(gi.Partitions, lagOf(uint32(p), string(v), floor, prog, cur, owner))
		}
	}
	return gi
}

// durableFloor is a view's floor in partition p as a coordinator taking
// over now would resume from it: the floor in stored, the view's last
// record written to __groups or loaded from it (nil: none). A view with
// no record of p yet (a subscription before its first write) shows where
// it started, start (its resolved start position, which a new coordinator
// resolves again no lower), or prog's floor where that is lower (restored
// from a record still being written, or moved back by a seek).
func durableFloor(stored *heraldpb.GroupProgress, p uint32, start int64, prog *Progress) int64 {
	if pp := partitionOf(stored, p); pp != nil {
		return pp.AckFloor
	}
	return min(start, prog.Floor())
}

// partitionOf is g's progress of partition p, or nil.
func partitionOf(g *heraldpb.GroupProgress, p uint32) *heraldpb.PartitionProgress {
	ps := g.GetPartitions()
	if int(p) < len(ps) && ps[p].GetPartition() == p {
		return ps[p] // records list their partitions in order
	}
	for _, pp := range ps {
		if pp.GetPartition() == p {
			return pp
		}
	}
	return nil
}

// lagOf is partition p's line of DescribeGroup for a view whose durable
// floor is floor and whose progress in memory is prog. AckedAbove counts
// prog's done offsets at or above floor (capped at 2^32-1; the lag is
// computed before the cap).
func lagOf(p uint32, subscriber string, floor int64, prog *Progress, entry *registry.Entry, owner string) *heraldpb.PartitionLag {
	above := prog.DoneFrom(floor)
	pl := &heraldpb.PartitionLag{Partition: p, Subscriber: subscriber, AckFloor: floor, AckedAbove: uint32(min(above, math.MaxUint32)), Owner: owner}
	if entry != nil && int(p) < len(entry.Stats) {
		pl.HighWatermark = entry.Stats[p].HighWatermark.Load()
		pl.Lag = max(pl.HighWatermark-floor-above, 0)
	}
	return pl
}

// updateSummary publishes the group's line of ListGroups and its lag
// gauges.
func (c *coordinator) updateSummary() {
	publishSummary(c.group, c.st, c.describe())
}
