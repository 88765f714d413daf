package consumer

// The group coordinator actor: its state, Receive and the onX dispatch of what it
// serves; the concerns live beside it (subscribe.go, read.go, dispatch.go,
// acks.go, admin.go, deadletter.go, idle.go), its pure core in state.go, and the
// groups manager (manager.go) and member sessions (session.go) are the room's
// other actors.

import (
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/filter"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"github.com/heraldmq/herald/retry"
)

// storeKey names one progress record: a view of a group's subscription.
type storeKey struct{ topic, subscriber string }

func keyOf(g *heraldpb.GroupProgress) storeKey {
	return storeKey{topic: g.GetTopic(), subscriber: g.GetSubscriber()}
}

// groupStore is what survives a coordinator restart: the durable progress
// records and the summary the manager lists.
type groupStore struct {
	stored  map[storeKey]*heraldpb.GroupProgress
	lastTop string // the topic of the latest record
	summary atomic.Pointer[heraldpb.GroupSummary]

	// Since the broker started, for DescribeGroup: messages appended to the
	// dead-letter topic, and messages ended by their time-to-live.
	deadLettered, expired uint64
	// The retry policy and dead-letter topic of the latest live
	// subscription, shown while the group has no members.
	lastPolicy, lastDLQ string
}

// member is one live subscription in the group.
type member struct {
	id        MemberID
	subID     uint64
	conn      *actor.PID // the connection's netio session
	session   *actor.PID // our memberSession child
	name      string
	addr      string // the client's address
	responder bool
	breaker   *Breaker
	lane      *laneMember // responders, once ready: the router's direct call path
	// transit counts the record bytes handed to the member session and not
	// yet to the connection: PushRoom does not see them yet.
	transit *atomic.Int64
	// recBytes is the size of the records last delivered to it, on
	// average (0: none yet): how many fit in its connection's room.
	recBytes    int
	delivered   uint64
	redelivered uint64
}

// callBudget is the credits mb holds for direct calls.
func (mb *member) callBudget() int64 {
	if mb.lane == nil {
		return 0
	}
	return max(mb.lane.budget.Load(), 0)
}

// held is a message the coordinator keeps for (re)delivery.
type held struct {
	rec      []byte
	appendMs int64
}

// tokEntry is the breaker token of a message in flight.
type tokEntry struct {
	tok    BreakerToken
	member MemberID
	sent   time.Time
}

// spilled holds records read from a partition that the subscription had
// no room for yet (Sub.Append took fewer): they are offered again as room
// frees instead of being read again. At most one read's worth per view
// and partition.
type spilled struct {
	msgs []Message
	recs []held
}

type fetchKey struct {
	view  MemberID
	part  uint32
	level uint8 // a read of the partition's sub-queue of this priority (ahead.go); 0: of its log
}

// live is the group's subscription while it has members.
type live struct {
	topic      string
	entry      *registry.Entry
	mode       Mode
	filterType heraldpb.FilterType
	filterText string
	filt       *filter.Filter
	autoAck    bool
	orderly    bool
	ackTimeout time.Duration
	retry      retry.Policy
	dlqExpired bool
	dlq        dlqState

	sub        *Sub
	members    map[MemberID]*member
	bySub      map[uint64]*member
	heldG      []*heldLog            // the group view's held records per partition
	heldV      map[fetchKey]*heldLog // broadcast views'
	toks       map[msgID]tokEntry
	fetching   map[fetchKey]bool
	spill      map[fetchKey]*spilled
	responders int
	lane       *Responders // this group's entry in the directory's responders
	rr         int
	calls      []*callMsg
}

func newHeldLogs(n int) []*heldLog {
	hs := make([]*heldLog, n)
	for i := range hs {
		hs[i] = &heldLog{}
	}
	return hs
}

// held returns the held records of view's partition p.
func (l *live) held(view MemberID, p uint32) *heldLog {
	if view == "" {
		return l.heldG[p]
	}
	k := fetchKey{view: view, part: p}
	h := l.heldV[k]
	if h == nil {
		h = &heldLog{}
		l.heldV[k] = h
	}
	return h
}

// waiter is a client request answered once the progress write in flight
// (or the next one) is durable.
type waiter struct {
	to *actor.PID
	f  *heraldpb.Frame
}

// resolveOp turns a StartPosition into an offset per partition, asking the
// partition actors for timestamps.
type resolveOp struct {
	start   []int64
	waiting int
	failed  *heraldpb.Error
	done    func(start []int64, e *heraldpb.Error)
}

// Timer messages a coordinator sends itself.
type (
	deadlineMsg struct{}
	flushMsg    struct{}
	statsMsg    struct{}
	pumpMsg     struct{}
	breakerMsg  struct{ change BreakerChange }
)

// coordinator is the group-coordinator actor of one consumer group.
type coordinator struct {
	o     *Options
	group string
	st    *groupStore
	sys   *actor.ActorSystem
	self  *actor.PID
	log   *slog.Logger

	live        *live
	resolving   bool
	pendingSubs []*subscribeMsg

	nextID    uint64
	fetchByID map[uint64]fetchKey
	listByID  map[uint64]struct {
		op   *resolveOp
		part int
	}

	// progress writes to __groups
	waiters      []waiter
	toWrite      []*heraldpb.GroupProgress
	dirty        map[MemberID]bool
	writing      bool
	writeID      uint64
	writeRecs    []*heraldpb.GroupProgress
	writeWaiters []waiter
	flushArmed   bool
	flushDone    []flushCaller // FlushGroup and checkpoint callers waiting for the writes to finish

	deadlineAt  time.Time
	expiredSeen bool // dispatch met expired messages
	statsArmed  bool
	pumpArmed   bool
	// idleSince is when the group last had members (or the coordinator
	// started); idleAsked: an idleStop is with the manager (idle.go).
	idleSince time.Time
	idleAsked bool
	// congestedArmed: a congestedMsg is on its way.
	congestedArmed bool
	groupsLog      *actor.PID
}

func newCoordinator(o *Options, group string, st *groupStore) *coordinator {
	return &coordinator{
		o: o, group: group, st: st, log: o.Logger.With("group", group),
		fetchByID: map[uint64]fetchKey{},
		listByID: map[uint64]struct {
			op   *resolveOp
			part int
		}{},
		dirty: map[MemberID]bool{},
	}
}

func (c *coordinator) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		c.onStarted(ctx)
	case *stopIdle:
		c.onStopIdle(ctx)
	case *idleNotNow:
		c.idleAsked, c.idleSince = false, c.o.Clock.Now()
	case *subscribeMsg:
		c.onSubscribe(ctx, m)
	case *heraldpb.Frame:
		c.onFrame(ctx, m)
	case *memberGone:
		c.onMemberGone(ctx, m)
	case *callMsg:
		c.onCall(ctx, m)
	case *memberReady:
		c.onMemberReady(m)
	case *refillMsg:
		c.onRefill(m)
	case *deadlineMsg:
		c.deadlineAt = time.Time{}
		c.onDeadline(ctx)
	case *flushMsg:
		c.flushArmed = false
		c.flush(ctx)
	case *statsMsg:
		c.statsArmed = false
		c.onStats(ctx)
	case *pumpMsg:
		c.pumpArmed = false
		c.pump(ctx)
	case *congestedMsg:
		c.congestedArmed = false
		c.dispatch(ctx)
	case *dlqRetryMsg, *dlqTimeoutMsg:
		c.onDLQTimer(ctx, m)
	case *checkpoint:
		c.onCheckpoint(ctx, m)
	case *FlushGroup:
		c.flushAll(ctx, 0)
	case *EndSessions:
		if c.live != nil {
			c.endAll(ctx, m.Reason)
		}
		ctx.Respond(&EndSessionsDone{})
	case *breakerMsg:
		if c.live != nil {
			c.live.sub.Pause(m.change.Member, m.change.To != BreakerClosed)
		}
		// Open: the other members may now take the retries this one held.
		c.dispatch(ctx)
	case *actor.Stopping:
		c.onStopping()
	}
}

func (c *coordinator) onStarted(ctx actor.Context) {
	c.sys, c.self = ctx.ActorSystem(), ctx.Self()
	c.o.Dir.forgetCoordinator(c.self)
	c.idleSince = c.o.Clock.Now()
	c.updateSummary()
	c.armStats()
}

// onStopping lets go of what the group holds outside the actor: its
// members' breakers and directory entries, and its metrics.
func (c *coordinator) onStopping() {
	if c.live != nil {
		for _, mb := range c.live.members {
			mb.breaker.Close()
			c.o.Dir.removeSub(mb.subID)
		}
	}
	c.o.Dir.forgetCoordinator(c.self)
	ForgetBreakerGroup(c.group)
	deleteGroupMetrics(c.group)
}

// onMemberGone: a member's connection closed; it leaves the group.
func (c *coordinator) onMemberGone(ctx actor.Context, m *memberGone) {
	if c.live != nil {
		if mb := c.live.bySub[m.subID]; mb != nil && mb.id == m.member {
			c.leave(ctx, mb, c.o.Clock.Now())
		}
	}
}

// onMemberReady gives a responder that is ready its lane for direct calls.
func (c *coordinator) onMemberReady(m *memberReady) {
	if mb := c.memberOf(m.subID); mb != nil && mb.id == m.member && mb.responder && mb.lane == nil {
		mb.lane = &laneMember{member: mb.id, subID: mb.subID, conn: mb.conn.Id}
		c.live.lane.lane.set(func(ms []*laneMember) []*laneMember { return append(ms, mb.lane) })
		c.refill(mb)
	}
}

func (c *coordinator) onRefill(m *refillMsg) {
	if c.live != nil {
		if mb := c.live.members[m.lm.member]; mb != nil && mb.lane == m.lm {
			c.refill(mb)
		}
	}
}

// onCheckpoint writes the latest record of every view again, so that
// every older record of the group is superseded (compaction).
func (c *coordinator) onCheckpoint(ctx actor.Context, m *checkpoint) {
	pending := map[storeKey]bool{}
	for _, r := range c.writeRecs {
		pending[keyOf(r)] = true
	}
	for _, r := range c.toWrite {
		pending[keyOf(r)] = true
	}
	for _, k := range slices.SortedFunc(maps.Keys(c.st.stored), func(a, b storeKey) int {
		return strings.Compare(a.topic+"\x00"+a.subscriber, b.topic+"\x00"+b.subscriber)
	}) {
		if !pending[k] {
			c.toWrite = append(c.toWrite, c.st.stored[k])
		}
	}
	c.flushAll(ctx, m.round)
}

func (c *coordinator) after(d time.Duration, msg any) {
	sys, self := c.sys, c.self
	c.o.Clock.AfterFunc(d, func() { sys.Root.Send(self, msg) })
}

func (c *coordinator) id() uint64 {
	c.nextID++
	return c.nextID
}

func respond(ctx actor.Context, to *actor.PID, f *heraldpb.Frame) {
	if to != nil {
		ctx.Send(to, f)
	}
}

func errFrame(id uint64, code heraldpb.ErrorCode, format string, args ...any) *heraldpb.Frame {
	return heraldpb.ErrorFrame(id, heraldpb.NewError(code, format, args...))
}

func (c *coordinator) onFrame(ctx actor.Context, f *heraldpb.Frame) {
	if c.isDLQ(f) {
		c.onDLQ(ctx, f)
		return
	}
	switch b := f.Body.(type) {
	case *heraldpb.Frame_Ack:
		c.onAck(ctx, f, b.Ack)
	case *heraldpb.Frame_Nack:
		c.onNack(ctx, f, b.Nack)
	case *heraldpb.Frame_Commit:
		c.onCommit(ctx, f, b.Commit)
	case *heraldpb.Frame_Unsubscribe:
		mb := c.memberOf(b.Unsubscribe.SubscriptionId)
		if mb == nil {
			respond(ctx, ctx.Sender(), errFrame(f.Id, heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND, "subscription %d is not active", b.Unsubscribe.SubscriptionId))
			return
		}
		c.leave(ctx, mb, c.o.Clock.Now())
		respond(ctx, ctx.Sender(), &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_UnsubscribeResponse{UnsubscribeResponse: &heraldpb.UnsubscribeResponse{}}})
	case *heraldpb.Frame_DescribeGroup:
		respond(ctx, ctx.Sender(), &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_DescribeGroupResponse{DescribeGroupResponse: &heraldpb.DescribeGroupResponse{Group: c.describe()}}})
	case *heraldpb.Frame_ResetGroup:
		c.onReset(ctx, f, b.ResetGroup)
	case *heraldpb.Frame_CommitTxnOffsets:
		c.onTxnOffsets(ctx, f, b.CommitTxnOffsets.GetOffsets())
	case *heraldpb.Frame_FetchResponse:
		c.onFetched(ctx, f.Id, b.FetchResponse, nil)
	case *heraldpb.Frame_ProduceResponse:
		c.onWritten(ctx, f.Id, nil)
	case *heraldpb.Frame_ListOffsetsResponse:
		c.onListed(ctx, f.Id, b.ListOffsetsResponse.Offset, nil)
	case *heraldpb.Frame_CreateTopicResponse:
		// A dead-letter topic created after its request timed out.
	case *heraldpb.Frame_Error:
		switch {
		case f.Id == c.writeID && c.writing:
			c.onWritten(ctx, f.Id, b.Error)
		default:
			if _, ok := c.fetchByID[f.Id]; ok {
				c.onFetched(ctx, f.Id, nil, b.Error)
			} else if _, ok := c.listByID[f.Id]; ok {
				c.onListed(ctx, f.Id, 0, b.Error)
			}
		}
	default:
		respond(ctx, ctx.Sender(), errFrame(f.Id, heraldpb.ErrorCode_INVALID_REQUEST, "group coordinators do not handle %T", f.Body))
	}
}

func (c *coordinator) memberOf(subID uint64) *member {
	if c.live == nil {
		return nil
	}
	return c.live.bySub[subID]
}
