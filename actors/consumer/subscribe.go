package consumer

// Subscriptions: joining and leaving a group, its live state and members, and rebalancing.

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/filter"
	"github.com/heraldmq/herald/internal/dispatch"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"github.com/heraldmq/herald/retry"
)

var wireModes = map[heraldpb.SubscriptionMode]Mode{
	heraldpb.SubscriptionMode_MODE_CLUSTERING: Clustering,
	heraldpb.SubscriptionMode_MODE_BROADCAST:  Broadcast,
	heraldpb.SubscriptionMode_MODE_SHARED:     Shared,
	heraldpb.SubscriptionMode_MODE_KEY_SHARED: KeyShared,
}

func wireMode(m Mode) heraldpb.SubscriptionMode {
	for w, mm := range wireModes {
		if mm == m {
			return w
		}
	}
	return heraldpb.SubscriptionMode_MODE_CLUSTERING
}

// compileFilter parses a subscription's filter; a bad one gets
// INVALID_FILTER with the position and a caret under it.
func compileFilter(typ heraldpb.FilterType, expr string) (*filter.Filter, *heraldpb.Error) {
	var f *filter.Filter
	var err error
	switch typ {
	case heraldpb.FilterType_FILTER_NONE:
		if expr != "" {
			return nil, heraldpb.NewError(heraldpb.ErrorCode_INVALID_FILTER, "filter %q given without a filter type (tag or sql)", expr)
		}
		return nil, nil
	case heraldpb.FilterType_FILTER_TAG:
		f, err = filter.ParseTags(expr)
	case heraldpb.FilterType_FILTER_SQL:
		f, err = filter.ParseSQL(expr)
	default:
		return nil, heraldpb.NewError(heraldpb.ErrorCode_INVALID_FILTER, "unknown filter type %d", typ)
	}
	if err != nil {
		msg := err.Error()
		var se *filter.SyntaxError
		if errors.As(err, &se) {
			msg += "\n" + se.Caret(expr)
		}
		return nil, heraldpb.NewError(heraldpb.ErrorCode_INVALID_FILTER, "%s", msg)
	}
	if f.MatchesAll() {
		f = nil
	}
	return f, nil
}

func (c *coordinator) onSubscribe(ctx actor.Context, m *subscribeMsg) {
	req := m.f.GetSubscribe()
	fail := func(code heraldpb.ErrorCode, format string, args ...any) {
		respond(ctx, m.replyTo, errFrame(m.f.Id, code, format, args...))
	}
	mode, ok := wireModes[req.Mode]
	if !ok {
		fail(heraldpb.ErrorCode_INVALID_REQUEST, "unknown subscription mode %d", req.Mode)
		return
	}
	if len(req.MemberName) > maxMemberName {
		fail(heraldpb.ErrorCode_INVALID_REQUEST, "member name of %d bytes exceeds %d", len(req.MemberName), maxMemberName)
		return
	}
	if mode == Broadcast && req.MemberName == "" {
		// A broadcast member's position is kept under its name, so it
		// resumes on return; a connection id would make a new one each time.
		fail(heraldpb.ErrorCode_INVALID_REQUEST, "broadcast members need a member name: their position is kept under it")
		return
	}
	entry := c.o.Topics.Get(req.Topic)
	if entry == nil || registry.IsInternal(req.Topic) {
		fail(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q does not exist", req.Topic)
		return
	}
	filt, ferr := compileFilter(req.FilterType, req.Filter)
	if ferr != nil {
		respond(ctx, m.replyTo, heraldpb.ErrorFrame(m.f.Id, ferr))
		return
	}
	policy, dlqTopic, perr := c.retrySettings(req)
	if perr != nil {
		respond(ctx, m.replyTo, heraldpb.ErrorFrame(m.f.Id, perr))
		return
	}
	if c.resolving {
		if len(c.pendingSubs) >= c.o.MaxQueued {
			e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "group %q has too many subscribes waiting", c.group)
			e.RetryAfterMs = 50
			respond(ctx, m.replyTo, heraldpb.ErrorFrame(m.f.Id, e))
			return
		}
		c.pendingSubs = append(c.pendingSubs, m)
		return
	}
	ackTimeout := time.Duration(req.AckTimeoutMs) * time.Millisecond
	if ackTimeout == 0 {
		ackTimeout = c.o.DefaultAckTimeout
	}
	if l := c.live; l != nil {
		var diffs []string
		if l.topic != req.Topic {
			diffs = append(diffs, fmt.Sprintf("topic %q (group uses %q)", req.Topic, l.topic))
		}
		if l.mode != mode {
			diffs = append(diffs, fmt.Sprintf("mode %s (group uses %s)", mode, l.mode))
		}
		if l.filterType != req.FilterType || l.filt.String() != filt.String() {
			diffs = append(diffs, fmt.Sprintf("filter %q (group uses %q)", req.Filter, l.filterText))
		}
		if l.autoAck != req.AutoAck || l.orderly != req.Orderly {
			diffs = append(diffs, fmt.Sprintf("auto-ack %v orderly %v (group uses %v, %v)", req.AutoAck, req.Orderly, l.autoAck, l.orderly))
		}
		if !l.retry.Equal(policy) {
			diffs = append(diffs, fmt.Sprintf("retry policy %q (group uses %q)", policy, l.retry))
		}
		if l.dlq.topic != dlqTopic || l.dlqExpired != req.DeadLetterExpired {
			diffs = append(diffs, fmt.Sprintf("dead-letter topic %q expired %v (group uses %q, %v)", dlqTopic, req.DeadLetterExpired, l.dlq.topic, l.dlqExpired))
		}
		if len(diffs) > 0 {
			fail(heraldpb.ErrorCode_GROUP_CONFLICT, "group %q has live members with other settings: %v", c.group, diffs)
			return
		}
		c.join(ctx, m)
		return
	}
	// First member: build the subscription from the stored progress and
	// the start position.
	c.resolving = true
	c.pendingSubs = append(c.pendingSubs, m)
	start := req.Start
	if start == nil {
		start = &heraldpb.StartPosition{At: &heraldpb.StartPosition_Latest{Latest: true}}
	}
	c.resolve(ctx, entry, start, func(offs []int64, e *heraldpb.Error) {
		c.resolving = false
		pend := c.pendingSubs
		c.pendingSubs = nil
		if e == nil {
			c.live, e = c.newLive(entry, req, mode, filt, ackTimeout, policy, dlqTopic, offs)
		}
		if e != nil {
			for _, p := range pend {
				respond(ctx, p.replyTo, heraldpb.ErrorFrame(p.f.Id, e))
			}
			return
		}
		for _, p := range pend {
			c.onSubscribe(ctx, p)
		}
		c.updateSummary()
	})
}

// retrySettings resolves a subscription's retry policy (empty: the broker's)
// and dead-letter topic, or says why they are invalid (INVALID_REQUEST).
func (c *coordinator) retrySettings(req *heraldpb.SubscribeRequest) (retry.Policy, string, *heraldpb.Error) {
	policy := c.o.RetryPolicy
	if req.RetryPolicy != "" {
		p, err := retry.ParsePolicy(req.RetryPolicy)
		if err != nil {
			return policy, "", heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "retry policy: %v", err)
		}
		policy = p
	}
	dlq := retry.DeadLetterTopic(c.group, req.DeadLetterTopic)
	switch {
	case dlq == req.Topic:
		return policy, "", heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "dead-letter topic %q is the group's own topic", dlq)
	case !registry.ValidName(dlq):
		return policy, "", heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "dead-letter topic %q is not a valid topic name (1-200 characters of A-Z a-z 0-9 . _ -, not starting with __); set dead_letter_topic", dlq)
	}
	return policy, dlq, nil
}

func (c *coordinator) newLive(entry *registry.Entry, req *heraldpb.SubscribeRequest, mode Mode, filt *filter.Filter, ackTimeout time.Duration, policy retry.Policy, dlqTopic string, start []int64) (*live, *heraldpb.Error) {
	cfg := Config{Mode: mode, Partitions: len(entry.Partitions), AckTimeout: ackTimeout, AutoAck: req.AutoAck, Orderly: req.Orderly,
		Retry: policy, DeadLetterExpired: req.DeadLetterExpired}
	sub, err := NewSub(cfg, start)
	if err != nil {
		return nil, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "%v", err)
	}
	for _, rec := range c.latestRecords(req.Topic) {
		if (mode == Broadcast) != (rec.GetSubscriber() != "") {
			continue // progress of another mode family: start afresh
		}
		if err := sub.Restore(rec); err != nil {
			c.log.Warn("ignoring stored progress", "topic", req.Topic, "subscriber", rec.GetSubscriber(), "err", err)
		}
	}
	c.st.lastPolicy, c.st.lastDLQ = policy.String(), dlqTopic
	return &live{
		topic: req.Topic, entry: entry, mode: mode, filterType: req.FilterType, filterText: req.Filter, filt: filt,
		autoAck: req.AutoAck, orderly: req.Orderly, ackTimeout: ackTimeout,
		retry: policy, dlqExpired: req.DeadLetterExpired, dlq: dlqState{topic: dlqTopic},
		sub: sub, members: map[MemberID]*member{}, bySub: map[uint64]*member{},
		heldG: newHeldLogs(len(entry.Partitions)), heldV: map[fetchKey]*heldLog{}, toks: map[msgID]tokEntry{}, fetching: map[fetchKey]bool{}, spill: map[fetchKey]*spilled{},
	}, nil
}

// latestRecords is the newest progress of each view of topic: stored,
// overlaid with writes in flight and queued.
func (c *coordinator) latestRecords(topicName string) []*heraldpb.GroupProgress {
	all := map[storeKey]*heraldpb.GroupProgress{}
	for k, r := range c.st.stored {
		all[k] = r
	}
	for _, r := range c.writeRecs {
		all[keyOf(r)] = r
	}
	for _, r := range c.toWrite {
		all[keyOf(r)] = r
	}
	return sortedRecords(all, topicName)
}

// sortedRecords is the records of topicName in all, in subscriber order.
func sortedRecords(all map[storeKey]*heraldpb.GroupProgress, topicName string) []*heraldpb.GroupProgress {
	var out []*heraldpb.GroupProgress
	for k, r := range all {
		if k.topic == topicName {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *heraldpb.GroupProgress) int { return strings.Compare(a.Subscriber, b.Subscriber) })
	return out
}

func (c *coordinator) join(ctx actor.Context, m *subscribeMsg) {
	l := c.live
	req := m.f.GetSubscribe()
	subID := c.o.Dir.newSubID()
	name := req.MemberName
	if name == "" {
		name = m.replyTo.Id
	}
	mid := MemberID(fmt.Sprintf("%s#%d", name, subID))
	if l.mode == Broadcast {
		mid = MemberID(name) // a broadcast member resumes its own progress
	}
	pl, err := l.sub.Join(mid)
	if err != nil {
		respond(ctx, m.replyTo, errFrame(m.f.Id, heraldpb.ErrorCode_GROUP_CONFLICT, "member %q is already connected to group %q", mid, c.group))
		return
	}
	bcfg := c.o.Breaker
	bcfg.MaxInFlight = l.sub.Config().MaxCredits
	self, sys := c.self, c.sys
	br, err := NewBreaker(c.group, mid, bcfg, func(ch BreakerChange) { sys.Root.Send(self, &breakerMsg{change: ch}) })
	if err != nil {
		_, _ = l.sub.Leave(mid, c.o.Clock.Now())
		respond(ctx, m.replyTo, errFrame(m.f.Id, heraldpb.ErrorCode_INTERNAL, "breaker: %v", err))
		return
	}
	mb := &member{id: mid, subID: subID, conn: m.replyTo, name: name, addr: m.addr, responder: req.Responder, breaker: br}
	hello := &heraldpb.Frame{Id: m.f.Id, Body: &heraldpb.Frame_SubscribeResponse{SubscribeResponse: &heraldpb.SubscribeResponse{
		SubscriptionId: subID, MemberId: string(mid), Partitions: uint32(len(l.entry.Partitions)),
	}}}
	maxFrame, push, writer := m.maxFrame, c.o.Push, c.o.Writer
	mb.transit = new(atomic.Int64)
	transit := mb.transit
	// In the directory before the session answers the subscribe (its
	// hello): a call sent once the subscribe is answered finds the
	// responder (the call reaches this coordinator after this message).
	c.o.Dir.addSub(subID, c.self, m.replyTo.Id)
	if mb.responder {
		l.responders++
		if l.responders == 1 {
			l.lane = &Responders{Coord: c.self, lane: &lane{}}
			c.o.Dir.setResponder(l.topic, l.lane, true)
		}
	}
	mb.session = ctx.SpawnPrefix(actor.PropsFromProducer(func() actor.Actor {
		return &memberSession{member: mid, subID: subID, conn: m.replyTo, maxFrame: maxFrame, hello: hello, push: push, writer: writer, transit: transit}
	}, actor.WithDispatcher(dispatch.Shared())), "m")
	l.members[mid] = mb
	l.bySub[subID] = mb
	_ = l.sub.Request(mid, int(req.Credits))
	mMembers.WithLabelValues(c.group).Set(float64(len(l.members)))
	c.applyPlan(ctx, pl)
	c.updateSummary()
	c.armStats()
	c.pump(ctx)
	c.dispatch(ctx)
}

// applyPlan tells members of their partition changes and confirms the
// revocations that need no wait.
func (c *coordinator) applyPlan(ctx actor.Context, pl Plan) {
	l := c.live
	for _, ch := range pl {
		mb := l.members[ch.Member]
		if mb == nil {
			continue
		}
		ctx.Send(mb.session, &pushFrame{f: &heraldpb.Frame{Body: &heraldpb.Frame_Assignment{Assignment: &heraldpb.AssignmentChange{
			SubscriptionId: mb.subID, Added: ch.Add, Revoked: ch.Revoke,
		}}}})
	}
	if len(pl) > 0 {
		c.checkRevocations(ctx)
	}
}

// checkRevocations confirms every revoked partition whose member has
// nothing of it in flight any more, so the new owner starts after the old
// one's last ack: per-partition order holds across a rebalance.
func (c *coordinator) checkRevocations(ctx actor.Context) {
	l := c.live
	if l == nil || l.mode != Clustering {
		return
	}
	for _, mid := range l.sub.Members() {
		for _, p := range l.sub.Assignor().Revoking(mid) {
			if l.sub.InFlightIn(mid, p) > 0 {
				continue
			}
			pl, err := l.sub.Revoked(mid, p, c.o.Clock.Now())
			if err == nil {
				c.applyPlan(ctx, pl)
			}
		}
	}
}

// endAll ends every member's subscription with a SubscriptionEnded push
// saying why.
func (c *coordinator) endAll(ctx actor.Context, why *heraldpb.Error) {
	for _, mb := range c.live.members {
		ctx.Send(mb.session, &pushFrame{f: &heraldpb.Frame{Body: &heraldpb.Frame_SubscriptionEnded{SubscriptionEnded: &heraldpb.SubscriptionEnded{
			SubscriptionId: mb.subID, Reason: why,
		}}}})
		c.leave(ctx, mb, c.o.Clock.Now())
		if c.live == nil {
			return // the last one left
		}
	}
}

// leave ends member mb: its unacked messages go back for redelivery.
func (c *coordinator) leave(ctx actor.Context, mb *member, now time.Time) {
	l := c.live
	for id, te := range l.toks {
		if te.member == mb.id {
			if te.tok != 0 {
				_ = mb.breaker.Forget(te.tok)
			}
			delete(l.toks, id)
		}
	}
	pl, _ := l.sub.Leave(mb.id, now)
	mb.breaker.Close()
	ctx.Poison(mb.session) // after the pushes already queued to it
	c.o.Dir.removeSub(mb.subID)
	delete(l.members, mb.id)
	delete(l.bySub, mb.subID)
	if mb.lane != nil {
		l.lane.lane.set(func(ms []*laneMember) []*laneMember {
			return slices.DeleteFunc(ms, func(x *laneMember) bool { return x == mb.lane })
		})
	}
	if mb.responder {
		l.responders--
		if l.responders == 0 {
			c.o.Dir.setResponder(l.topic, l.lane, false)
			mCallQueue.WithLabelValues(c.group).Set(0)
			l.calls = nil
		}
	}
	mMembers.WithLabelValues(c.group).Set(float64(len(l.members)))
	if len(l.members) == 0 {
		c.dropLive(ctx)
		return
	}
	c.applyPlan(ctx, pl)
	c.updateSummary()
	c.dispatch(ctx)
}

// dropLive ends the subscription once its last member left: its progress
// is written, in-flight state is forgotten (unacked messages are
// redelivered from the stored progress to the next member), and the next
// subscriber may choose another mode or filter.
func (c *coordinator) dropLive(ctx actor.Context) {
	l := c.live
	for _, v := range l.sub.Views() {
		c.toWrite = append(c.toWrite, c.encode(v))
		delete(c.dirty, v)
	}
	for id := range c.fetchByID {
		delete(c.fetchByID, id)
	}
	c.live = nil
	c.idleSince = c.o.Clock.Now()
	mInFlight.WithLabelValues(c.group).Set(0)
	c.flush(ctx)
	c.updateSummary()
	c.armStats()
}

func (c *coordinator) encode(v MemberID) *heraldpb.GroupProgress {
	l := c.live
	g := l.sub.Encode(c.group, l.topic, v)
	g.Mode = int32(wireMode(l.mode))
	return g
}
