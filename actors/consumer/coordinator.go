package consumer

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/consumer/filter"
	"github.com/heraldmq/herald/actors/partition"
	"github.com/heraldmq/herald/actors/scheduler"
	"github.com/heraldmq/herald/actors/topic"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// GroupsTopic is the internal topic that holds every group's progress.
const GroupsTopic = "__groups"

// Options configure the groups manager and its coordinators.
type Options struct {
	Topics *topic.Registry
	Dir    *Directory
	Logger *slog.Logger
	// Breaker configures every member's circuit breaker.
	Breaker BreakerConfig
	// FetchMaxBytes bounds one read of a partition for a group; 0 = 1 MiB.
	FetchMaxBytes int
	// FetchWait is the long-poll wait of a group caught up with a
	// partition; 0 = 5 s.
	FetchWait time.Duration
	// FlushDelay is how long progress that no client waits for (auto-ack,
	// filtered messages, timeouts) may stay unwritten; 0 = 100 ms.
	FlushDelay time.Duration
	// MaxCallQueue bounds the request-reply calls a group holds while no
	// responder has credit; 0 = 4096. Beyond it calls are dropped.
	MaxCallQueue int
	// MaxQueued bounds the requests the manager holds while it loads
	// __groups, and the subscribes a coordinator holds while it resolves
	// start positions; 0 = 4096. Beyond it they get THROTTLED.
	MaxQueued int
	// Push writes an encoded push straight to a connection by its session
	// id (netio.Server.Push); nil sends pushes through the connection's
	// session actor. Set it before the first subscription.
	Push func(id string, frame []byte) bool
	// PushRoom reports how many bytes of pushes a connection (by session
	// id) can take now (netio.Server.PushRoom); <= 0 holds delivery to its
	// members, credits untouched, until it has room again. nil: no bound
	// but credits.
	PushRoom func(id string) int
	// DefaultAckTimeout applies when a subscription gives none; 0 = 30 s.
	DefaultAckTimeout time.Duration
	// CompactBytes is the size of __groups above which the manager
	// compacts it; 0 = 64 MiB. CompactCheck is how often it looks; 0 = 30 s.
	CompactBytes int64
	CompactCheck time.Duration
	// RetryPolicy applies to subscriptions that name none; the zero policy
	// is scheduler.DefaultRetryPolicy().
	RetryPolicy scheduler.RetryPolicy
	// TopicManager is the topic manager, which creates a group's
	// dead-letter topic on its first dead letter (CreateTopic). Without it
	// dead letters wait until the topic exists.
	TopicManager *actor.PID
	// DeadLetterTimeout bounds the wait for the answer to a dead-letter
	// append or topic creation, after which it is retried; 0 = 30 s.
	DeadLetterTimeout time.Duration
	// IdleStop is how long a group's coordinator lives on with no members
	// before it stops (its progress is durable in __groups, and the
	// manager keeps its summary and lag gauges current and starts it again
	// on its next request); 0 = 10 min, negative = never.
	IdleStop time.Duration
	// Clock reads the time for idle stops; nil = the system clock.
	Clock Clock
}

// Clock is how the consumer package reads time, so tests can move it.
type Clock interface{ Now() time.Time }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (o *Options) ensureDefaults() {
	if o.FetchMaxBytes == 0 {
		o.FetchMaxBytes = 1 << 20
	}
	if o.FetchWait == 0 {
		o.FetchWait = 5 * time.Second
	}
	if o.FlushDelay == 0 {
		o.FlushDelay = 100 * time.Millisecond
	}
	if o.MaxCallQueue == 0 {
		o.MaxCallQueue = 4096
	}
	if o.MaxQueued == 0 {
		o.MaxQueued = 4096
	}
	if o.DefaultAckTimeout == 0 {
		o.DefaultAckTimeout = DefaultAckTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.CompactBytes == 0 {
		o.CompactBytes = 64 << 20
	}
	if o.CompactCheck == 0 {
		o.CompactCheck = 30 * time.Second
	}
	o.RetryPolicy = o.RetryPolicy.WithDefaults()
	if o.DeadLetterTimeout == 0 {
		o.DeadLetterTimeout = 30 * time.Second
	}
	if o.IdleStop == 0 {
		o.IdleStop = DefaultIdleStop
	}
	if o.Clock == nil {
		o.Clock = systemClock{}
	}
}

// DefaultIdleStop is Options.IdleStop's default.
const DefaultIdleStop = 10 * time.Minute

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
	transit     *atomic.Int64
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
	entry      *topic.Entry
	mode       Mode
	filterType heraldpb.FilterType
	filterText string
	filt       *filter.Filter
	autoAck    bool
	orderly    bool
	ackTimeout time.Duration
	retry      scheduler.RetryPolicy
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
		c.sys, c.self = ctx.ActorSystem(), ctx.Self()
		c.o.Dir.forgetCoordinator(c.self)
		c.idleSince = c.o.Clock.Now()
		c.updateSummary()
		c.armStats()
	case *stopIdle:
		c.onStopIdle(ctx)
	case *idleNotNow:
		c.idleAsked, c.idleSince = false, c.o.Clock.Now()
	case *subscribeMsg:
		c.onSubscribe(ctx, m)
	case *heraldpb.Frame:
		c.onFrame(ctx, m)
	case *memberGone:
		if c.live != nil {
			if mb := c.live.bySub[m.subID]; mb != nil && mb.id == m.member {
				c.leave(ctx, mb, time.Now())
			}
		}
	case *callMsg:
		c.onCall(ctx, m)
	case *memberReady:
		if mb := c.memberOf(m.subID); mb != nil && mb.id == m.member && mb.responder && mb.lane == nil {
			mb.lane = &laneMember{member: mb.id, subID: mb.subID, conn: mb.conn.Id}
			c.live.lane.lane.set(func(ms []*laneMember) []*laneMember { return append(ms, mb.lane) })
			c.refill(mb)
		}
	case *refillMsg:
		if c.live != nil {
			if mb := c.live.members[m.lm.member]; mb != nil && mb.lane == m.lm {
				c.refill(mb)
			}
		}
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
		// Write the latest record of every view again, so that every
		// older record of the group is superseded (compaction).
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
	case *FlushGroup:
		c.flushAll(ctx, 0)
	case *EndSessions:
		if c.live != nil {
			c.endAll(ctx, m.Reason)
		}
		ctx.Respond(&EndSessionsDone{})
	case *breakerMsg:
		if m.change.To != BreakerOpen {
			c.dispatch(ctx)
		}
	case *actor.Stopping:
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
}

func (c *coordinator) after(d time.Duration, msg any) {
	sys, self := c.sys, c.self
	time.AfterFunc(d, func() { sys.Root.Send(self, msg) })
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
		c.leave(ctx, mb, time.Now())
		respond(ctx, ctx.Sender(), &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_UnsubscribeResponse{UnsubscribeResponse: &heraldpb.UnsubscribeResponse{}}})
	case *heraldpb.Frame_DescribeGroup:
		respond(ctx, ctx.Sender(), &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_DescribeGroupResponse{DescribeGroupResponse: &heraldpb.DescribeGroupResponse{Group: c.describe()}}})
	case *heraldpb.Frame_ResetGroup:
		c.onReset(ctx, f, b.ResetGroup)
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

// ---- subscribe -----------------------------------------------------------

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
	if entry == nil || topic.IsInternal(req.Topic) {
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
func (c *coordinator) retrySettings(req *heraldpb.SubscribeRequest) (scheduler.RetryPolicy, string, *heraldpb.Error) {
	policy := c.o.RetryPolicy
	if req.RetryPolicy != "" {
		p, err := scheduler.ParseRetryPolicy(req.RetryPolicy)
		if err != nil {
			return policy, "", heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "retry policy: %v", err)
		}
		policy = p
	}
	dlq := scheduler.DeadLetterTopic(c.group, req.DeadLetterTopic)
	switch {
	case dlq == req.Topic:
		return policy, "", heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "dead-letter topic %q is the group's own topic", dlq)
	case !topic.ValidName(dlq):
		return policy, "", heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "dead-letter topic %q is not a valid topic name (1-200 characters of A-Z a-z 0-9 . _ -, not starting with __); set dead_letter_topic", dlq)
	}
	return policy, dlq, nil
}

func (c *coordinator) newLive(entry *topic.Entry, req *heraldpb.SubscribeRequest, mode Mode, filt *filter.Filter, ackTimeout time.Duration, policy scheduler.RetryPolicy, dlqTopic string, start []int64) (*live, *heraldpb.Error) {
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
		_, _ = l.sub.Leave(mid, time.Now())
		respond(ctx, m.replyTo, errFrame(m.f.Id, heraldpb.ErrorCode_INTERNAL, "breaker: %v", err))
		return
	}
	mb := &member{id: mid, subID: subID, conn: m.replyTo, name: name, addr: m.addr, responder: req.Responder, breaker: br}
	hello := &heraldpb.Frame{Id: m.f.Id, Body: &heraldpb.Frame_SubscribeResponse{SubscribeResponse: &heraldpb.SubscribeResponse{
		SubscriptionId: subID, MemberId: string(mid), Partitions: uint32(len(l.entry.Partitions)),
	}}}
	maxFrame, push := m.maxFrame, c.o.Push
	mb.transit = new(atomic.Int64)
	transit := mb.transit
	mb.session = ctx.SpawnPrefix(actor.PropsFromProducer(func() actor.Actor {
		return &memberSession{member: mid, subID: subID, conn: m.replyTo, maxFrame: maxFrame, hello: hello, push: push, transit: transit}
	}), "m")
	l.members[mid] = mb
	l.bySub[subID] = mb
	c.o.Dir.addSub(subID, c.self, m.replyTo.Id)
	_ = l.sub.Request(mid, int(req.Credits))
	if mb.responder {
		l.responders++
		if l.responders == 1 {
			l.lane = &Responders{Coord: c.self, lane: &lane{}}
			c.o.Dir.setResponder(l.topic, l.lane, true)
		}
	}
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
			pl, err := l.sub.Revoked(mid, p, time.Now())
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
		c.leave(ctx, mb, time.Now())
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

// ---- reading the log -------------------------------------------------------

// pump starts a read of every partition, for every view with a live
// member, that has room and no read outstanding.
func (c *coordinator) pump(ctx actor.Context) {
	l := c.live
	if l == nil {
		return
	}
	for _, v := range l.sub.Views() {
		if v != "" && l.members[v] == nil {
			continue // a broadcast member that left: its view waits
		}
		for p := range l.entry.Partitions {
			k := fetchKey{view: v, part: uint32(p)}
			if l.spill[k] != nil {
				// Offered as room frees (dispatch); meanwhile higher
				// priorities further on may jump the queue.
				c.pumpAhead(ctx, v, uint32(p))
				continue
			}
			if l.fetching[k] {
				continue
			}
			off, room := l.sub.ReadFrom(v, uint32(p))
			if room == 0 {
				c.pumpAhead(ctx, v, uint32(p))
				continue
			}
			var wait uint32
			if off >= c.partitionStats(l.entry, p).HighWatermark.Load() {
				wait = uint32(c.o.FetchWait / time.Millisecond)
			}
			id := c.id()
			c.fetchByID[id] = k
			l.fetching[k] = true
			ctx.Request(c.partitionPID(l.entry, p), &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
				Topic: l.topic, Partition: uint32(p), Offset: off, MaxBytes: uint32(c.o.FetchMaxBytes), MaxWaitMs: wait,
			}}})
		}
	}
}

func (c *coordinator) onFetched(ctx actor.Context, id uint64, resp *heraldpb.FetchResponse, ferr *heraldpb.Error) {
	k, ok := c.fetchByID[id]
	delete(c.fetchByID, id)
	l := c.live
	if !ok || l == nil {
		return
	}
	delete(l.fetching, k)
	if k.level > 0 {
		c.onAheadFetched(ctx, k, resp, ferr)
		return
	}
	if ferr != nil {
		switch ferr.Code {
		case heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE:
			// Retention removed records below the position (they can never
			// be delivered): skip to the log start. A position above the
			// log's end (the topic was deleted and made again) moves back to
			// the end.
			st := c.partitionStats(l.entry, int(k.part))
			start, hw := st.StartOffset.Load(), st.HighWatermark.Load()
			off, _ := l.sub.ReadFrom(k.view, k.part)
			to := off
			cur := c.current(l.entry)
			remote := cur.Record != nil && int(k.part) < len(cur.Dirs) && cur.Dirs[k.part] == ""
			switch {
			case off < start:
				c.log.Warn("records removed by retention before the group consumed them", "partition", k.part, "from", off, "to", start)
				to = start
			case off > hw && remote:
				// Read through the stand-in: the replicas asked may lag
				// behind the position; never move it back for that (a
				// topic made again under the name ends the subscription).
			case off > hw:
				c.log.Warn("group position beyond the end of the log; moved to the end", "partition", k.part, "position", off, "end", hw)
				to = hw
			}
			if to != off {
				l.sub.Seek(k.view, k.part, to)
				l.held(k.view, k.part).trim(to)
				delete(l.spill, k)
				c.markDirty(k.view)
				c.checkRevocations(ctx)
			}
			c.armPump(10 * time.Millisecond)
		default:
			c.armPump(time.Duration(max(ferr.RetryAfterMs, 100)) * time.Millisecond)
		}
		return
	}
	off, _ := l.sub.ReadFrom(k.view, k.part)
	msgs, recs, filtered := c.messages(k, resp, off)
	c.offer(k, msgs, recs)
	if filtered > 0 {
		mFiltered.WithLabelValues(c.group).Add(float64(filtered))
		c.markDirty(k.view)
	}
	c.dispatch(ctx)
	c.pump(ctx)
}

// messages turns the records a fetch read for view k.view's partition
// k.part, from offset off on, into the subscription's messages (filtered
// ones marked Skip, counted in filtered) and the records to hold for
// delivery.
func (c *coordinator) messages(k fetchKey, resp *heraldpb.FetchResponse, off int64) (msgs []Message, recs []held, filtered int) {
	l := c.live
	prog := l.sub.Progress(k.view, k.part)
	total := 0
	for _, b := range resp.Batches {
		total += int(b.Count)
	}
	msgs = make([]Message, 0, total)
	recs = make([]held, 0, total)
	topicTTL := l.entry.Config.GetMessageTtlMs()
	for _, b := range resp.Batches {
		err := heraldpb.ForEachRawRecord(b.Records, func(i int, rec []byte) bool {
			o := b.BaseOffset + int64(i)
			if o < off {
				return true
			}
			m := Message{Partition: k.part, Offset: o, Expires: expiresAt(b.AppendTimeMs, heraldpb.RecordTTL(rec), topicTTL),
				Priority: heraldpb.RecordPriority(rec)}
			if l.mode == KeyShared {
				m.Key = string(heraldpb.RecordKey(rec))
			}
			if l.filt != nil && !prog.Done(o) {
				var r heraldpb.Record
				if proto.Unmarshal(rec, &r) == nil && !l.filt.Match(filter.FromProto(&r)) {
					m.Skip = true
					filtered++
				}
			}
			msgs = append(msgs, m)
			recs = append(recs, held{rec: rec, appendMs: b.AppendTimeMs})
			return true
		})
		if err != nil {
			c.log.Error("unreadable batch in log", "partition", k.part, "offset", b.BaseOffset, "err", err)
			break
		}
	}
	return msgs, recs, filtered
}

// pumpAhead starts, for view v's partition p whose ordered read is stalled,
// a read of the highest priority sub-queue with records past the read
// position, if the view has room for messages offered ahead and no such
// read is outstanding.
func (c *coordinator) pumpAhead(ctx actor.Context, v MemberID, p uint32) {
	l := c.live
	if l.orderly {
		return
	}
	busy := fetchKey{view: v, part: p, level: Priorities}
	if l.fetching[busy] {
		return
	}
	st := c.partitionStats(l.entry, int(p))
	for lv := Priorities - 1; lv >= 1; lv-- {
		end := st.PriorityEnd[lv].Load()
		if end == 0 {
			continue
		}
		from, to, room := l.sub.ReadAhead(v, p, lv)
		if room == 0 || from >= end {
			continue
		}
		id := c.id()
		c.fetchByID[id] = fetchKey{view: v, part: p, level: uint8(lv)}
		l.fetching[busy] = true
		ctx.Request(c.partitionPID(l.entry, int(p)), &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
			Topic: l.topic, Partition: p, Offset: from, MaxBytes: uint32(c.o.FetchMaxBytes),
			Priority: uint32(lv), EndOffset: min(to, end),
		}}})
		return
	}
}

// onAheadFetched offers what a sub-queue read found.
func (c *coordinator) onAheadFetched(ctx actor.Context, k fetchKey, resp *heraldpb.FetchResponse, ferr *heraldpb.Error) {
	l := c.live
	delete(l.fetching, fetchKey{view: k.view, part: k.part, level: Priorities})
	if ferr != nil {
		// The ordered read deals with retention; this read tries again.
		c.armPump(time.Duration(max(ferr.RetryAfterMs, 100)) * time.Millisecond)
		return
	}
	from, _, _ := l.sub.ReadAhead(k.view, k.part, int(k.level))
	msgs, recs, _ := c.messages(k, resp, from)
	took := l.sub.AppendAhead(k.view, k.part, int(k.level), msgs, resp.NextOffset)
	hl := l.held(k.view, k.part)
	for _, i := range took {
		hl.put(msgs[i].Offset, recs[i])
	}
	if len(took) > 0 {
		mAhead.WithLabelValues(c.group).Add(float64(len(took)))
	}
	c.dispatch(ctx)
	c.pump(ctx)
}

// expiresAt is when a record appended at appendMs expires (Unix ms; 0 =
// never): its own ttl_ms wins over its topic's message_ttl_ms.
func expiresAt(appendMs, recordTTL, topicTTL int64) int64 {
	ttl := recordTTL
	if ttl <= 0 {
		ttl = topicTTL
	}
	if ttl <= 0 {
		return 0
	}
	if appendMs > math.MaxInt64-ttl {
		return 0 // beyond any clock: never
	}
	return max(appendMs+ttl, 1)
}

// offer appends read records to the subscription as far as it has room,
// holding the records of messages to deliver, and spills the rest.
func (c *coordinator) offer(k fetchKey, msgs []Message, recs []held) {
	l := c.live
	prog := l.sub.Progress(k.view, k.part)
	n := l.sub.Append(k.view, msgs...)
	hl := l.held(k.view, k.part)
	for i, m := range msgs[:n] {
		if !m.Skip && !prog.Done(m.Offset) {
			hl.put(m.Offset, recs[i])
		}
	}
	if n < len(msgs) {
		l.spill[k] = &spilled{msgs: msgs[n:], recs: recs[n:]}
	} else {
		delete(l.spill, k)
	}
}

func (c *coordinator) armPump(d time.Duration) {
	if !c.pumpArmed {
		c.pumpArmed = true
		c.after(d, &pumpMsg{})
	}
}

// ---- delivery ----------------------------------------------------------------

// ackLatencySample: the ack latency histogram samples one offset in this
// many (a power of two), to keep the push path free of per-message
// bookkeeping.
const ackLatencySample = 32

// maxPushBatch bounds the messages one dispatch round hands one member.
const maxPushBatch = 4096

// dispatch pushes to every member with credits what the subscription
// gives it, calls first.
func (c *coordinator) dispatch(ctx actor.Context) {
	l := c.live
	if l == nil {
		return
	}
	order := l.sub.Members()
	if len(order) == 0 {
		return
	}
	now := time.Now()
	delivered := 0
	// Refill from the spilled reads (acks may have made room), deliver,
	// refill and deliver again while both make progress; then read more.
	c.offerSpills()
	for round := 0; round < 64; round++ {
		n := 0
		for i := range order {
			mb := l.members[order[(l.rr+i)%len(order)]]
			if mb == nil {
				continue
			}
			n += c.deliverTo(ctx, mb, now)
		}
		l.rr++
		delivered += n
		if n == 0 || !c.offerSpills() {
			break
		}
	}
	if delivered > 0 {
		c.pump(ctx)
		if !l.autoAck {
			c.armDeadlineAt(now, now.Add(l.ackTimeout))
		}
		if l.autoAck {
			c.scheduleFlush()
		}
	}
	if c.expiredSeen {
		c.expiredSeen = false
		c.pump(ctx) // expired messages made room
	}
	c.pumpDLQ(ctx) // nacks, timeouts, expiry and restored records make dead letters
}

// offerSpills offers every spilled read again and reports whether the
// subscription took any of it.
func (c *coordinator) offerSpills() bool {
	l := c.live
	took := false
	for k, sp := range l.spill {
		n := len(sp.msgs)
		c.offer(k, sp.msgs, sp.recs)
		if sp2 := l.spill[k]; sp2 == nil || len(sp2.msgs) < n {
			took = true
		}
	}
	return took
}

func (c *coordinator) deliverTo(ctx actor.Context, mb *member, now time.Time) int {
	l := c.live
	credits := l.sub.Credits(mb.id)
	if credits == 0 {
		return 0
	}
	var out []heraldpb.PushMessage
	for mb.responder && len(l.calls) > 0 && l.sub.TakeCredit(mb.id) {
		if out == nil {
			out = make([]heraldpb.PushMessage, 0, min(len(l.calls), credits))
		}
		call := l.calls[0]
		l.calls = l.calls[1:]
		out = append(out, heraldpb.PushMessage{Offset: -1, DeliveryCount: 1, Record: call.record, ReplyInbox: call.inbox, CorrelationID: call.corr})
		credits--
	}
	if len(l.calls) == 0 {
		l.calls = nil
	}
	// The breaker gates delivery: nothing while open, probes only (each
	// with a token for its outcome) while half-open; while closed outcomes
	// are recorded without tokens (Breaker.Record).
	var toks []BreakerToken
	budget := min(credits, maxPushBatch)
	switch mb.breaker.State() {
	case BreakerOpen:
		budget = 0
	case BreakerHalfOpen:
		for len(toks) < budget {
			tok, ok := mb.breaker.Allow()
			if !ok {
				break
			}
			toks = append(toks, tok)
		}
		budget = len(toks)
	}
	// The connection's pending output bounds delivery in bytes: with no
	// room, nothing is delivered (credits stay) and dispatch runs again
	// shortly; with room, messages go in steps of pushStep until it is
	// used up, so one dispatch overshoots it by at most one step.
	room, gated := 0, c.o.PushRoom != nil && mb.transit != nil
	if gated && budget > 0 {
		if room = c.o.PushRoom(mb.conn.Id) - int(mb.transit.Load()); room <= 0 {
			budget = 0
			c.armCongested()
		}
	}
	var ds []Delivery
	for budget > 0 {
		step := budget
		if gated {
			step = min(step, pushStep)
		}
		got, _ := l.sub.Deliver(mb.id, now, step)
		c.onExpired(l.sub.TakeExpired())
		ds = append(ds, got...)
		budget -= step
		if len(got) < step || !gated {
			break
		}
		if room -= c.recordBytes(l, mb, got); room <= 0 {
			c.armCongested()
			break
		}
	}
	if len(toks) > len(ds) {
		for _, t := range toks[len(ds):] {
			_ = mb.breaker.Forget(t)
		}
	}
	view := l.sub.ViewOf(mb.id)
	if len(ds) > 0 {
		out = slices.Grow(out, len(ds))
	}
	for j, d := range ds {
		id := msgID{view: view, part: d.Partition, off: d.Offset}
		hl := l.held(view, d.Partition)
		h, ok := hl.get(d.Offset)
		if !ok {
			// Cannot happen: every offered message is held until done.
			c.log.Error("no record held for delivery", "partition", d.Partition, "offset", d.Offset)
			continue
		}
		out = append(out, heraldpb.PushMessage{Partition: d.Partition, Offset: d.Offset, DeliveryCount: uint32(d.Count), AppendTimeMs: h.appendMs, Record: h.rec})
		switch {
		case l.autoAck:
			hl.del(d.Offset)
		case j < len(toks):
			l.toks[id] = tokEntry{tok: toks[j], member: mb.id, sent: now}
		case d.Offset&(ackLatencySample-1) == 0:
			l.toks[id] = tokEntry{member: mb.id, sent: now}
		}
		if d.Count > 1 {
			mb.redelivered++
			mRedelivered.WithLabelValues(c.group).Inc()
		}
	}
	if len(ds) > 0 {
		mb.delivered += uint64(len(ds))
		mDelivered.WithLabelValues(c.group).Add(float64(len(ds)))
		if l.autoAck {
			c.markDirty(view)
		}
	}
	if len(out) > 0 {
		if mb.transit != nil {
			var n int64
			for i := range out {
				n += int64(len(out[i].Record))
			}
			mb.transit.Add(n)
			ctx.Send(mb.session, &pushBatch{msgs: out, bytes: n})
		} else {
			ctx.Send(mb.session, &pushBatch{msgs: out})
		}
	}
	return len(ds)
}

// pushStep is how many messages deliverTo hands a member between checks
// of its connection's room; congestedRetry how soon a dispatch held for
// want of room runs again.
const (
	pushStep       = 64
	congestedRetry = 10 * time.Millisecond
)

// recordBytes sums the held records of ds.
func (c *coordinator) recordBytes(l *live, mb *member, ds []Delivery) int {
	view := l.sub.ViewOf(mb.id)
	n := 0
	for _, d := range ds {
		if h, ok := l.held(view, d.Partition).get(d.Offset); ok {
			n += len(h.rec)
		}
	}
	return n
}

// armCongested runs dispatch again after congestedRetry.
func (c *coordinator) armCongested() {
	if !c.congestedArmed {
		c.congestedArmed = true
		c.after(congestedRetry, &congestedMsg{})
	}
}

// congestedMsg: a dispatch held for a connection's room runs again.
type congestedMsg struct{}

// onExpired accounts for messages Deliver ended by their time-to-live:
// dropped ones are done (their records go, their progress is written
// lazily); dead-lettered ones wait for pumpDLQ.
func (c *coordinator) onExpired(es []Expired) {
	if len(es) == 0 {
		return
	}
	l := c.live
	dropped := 0
	for _, e := range es {
		delete(l.toks, msgID{view: e.View, part: e.Partition, off: e.Offset})
		if !e.Dead {
			l.held(e.View, e.Partition).del(e.Offset)
			c.dirty[e.View] = true
			dropped++
		}
	}
	c.st.expired += uint64(len(es))
	c.expiredSeen = true
	if dropped > 0 {
		mExpired.WithLabelValues(c.group, "drop").Add(float64(dropped))
		c.scheduleFlush()
	}
	if n := len(es) - dropped; n > 0 {
		mExpired.WithLabelValues(c.group, "dead_letter").Add(float64(n))
	}
}

// refill tops up a responder's call budget from its subscription credits,
// after any queued calls have had theirs.
func (c *coordinator) refill(mb *member) {
	lm := mb.lane
	if lm == nil || c.live == nil {
		return
	}
	lm.refilling.Store(false)
	if len(c.live.calls) > 0 {
		return // the queued calls take the credits first
	}
	// At most half the member's credits: the rest stay for the topic's
	// messages, which a responder receives too.
	n := int64(0)
	for lm.budget.Load()+n < callBudget && int64(c.live.sub.Credits(mb.id)) > n+1 && c.live.sub.TakeCredit(mb.id) {
		n++
	}
	lm.budget.Add(n)
}

func (c *coordinator) onCall(ctx actor.Context, m *callMsg) {
	l := c.live
	if l == nil || l.responders == 0 || l.topic != m.topic {
		return
	}
	if len(l.calls) >= c.o.MaxCallQueue {
		mCallsDropped.WithLabelValues(c.group).Inc()
		return
	}
	l.calls = append(l.calls, m)
	c.dispatch(ctx)
	mCallQueue.WithLabelValues(c.group).Set(float64(len(l.calls)))
}

// ---- acks ------------------------------------------------------------------

// ackTarget checks an ack or nack request (kind names it) and returns its
// member, or answers the request with the error and returns nil.
func (c *coordinator) ackTarget(ctx actor.Context, f *heraldpb.Frame, kind string, subID uint64, parts []uint32, offs []int64) *member {
	mb := c.memberOf(subID)
	if mb == nil {
		respond(ctx, ctx.Sender(), errFrame(f.Id, heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND, "subscription %d is not active", subID))
		return nil
	}
	if len(parts) != len(offs) {
		respond(ctx, ctx.Sender(), errFrame(f.Id, heraldpb.ErrorCode_INVALID_REQUEST, "%s has %d partitions and %d offsets", kind, len(parts), len(offs)))
		return nil
	}
	return mb
}

func (c *coordinator) onAck(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.AckRequest) {
	mb := c.ackTarget(ctx, f, "ack", req.SubscriptionId, req.Partitions, req.Offsets)
	if mb == nil {
		return
	}
	l := c.live
	now := time.Now()
	view := l.sub.ViewOf(mb.id)
	acked, stale := 0, 0
	for i, p := range req.Partitions {
		off := req.Offsets[i]
		if err := l.sub.Ack(mb.id, p, off); err != nil {
			stale++
			continue
		}
		id := msgID{view: view, part: p, off: off}
		if te, ok := l.toks[id]; ok {
			if owner := l.members[te.member]; owner != nil && te.tok != 0 {
				_ = owner.breaker.Success(te.tok)
			}
			mAckLatency.WithLabelValues(c.group).Observe(now.Sub(te.sent).Seconds())
			delete(l.toks, id)
		}
		l.held(view, p).del(off)
		acked++
	}
	if acked > 0 {
		mb.breaker.Record(0)
	}
	if stale > 0 {
		mStaleAcks.WithLabelValues(c.group).Add(float64(stale))
	}
	if acked > 0 {
		mAcked.WithLabelValues(c.group).Add(float64(acked))
	}
	_ = l.sub.Request(mb.id, int(req.Credits))
	defer c.refill(mb) // after dispatch has served queued calls
	ok := &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_AckResponse{AckResponse: &heraldpb.AckResponse{}}}
	if acked == 0 {
		respond(ctx, ctx.Sender(), ok)
	} else {
		c.markDirty(view)
		c.waiters = append(c.waiters, waiter{to: ctx.Sender(), f: ok})
	}
	c.checkRevocations(ctx)
	c.dispatch(ctx)
	c.pump(ctx)
	c.flush(ctx)
}

// onNack fails the named deliveries: each is retried after the request's
// delay (absent: the retry policy's) or, after its last allowed delivery,
// dead-lettered. The answer waits until the retries are durable in
// `__groups`, as acks do, so a broker restart keeps their delays and
// delivery counts.
func (c *coordinator) onNack(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.NackRequest) {
	mb := c.ackTarget(ctx, f, "nack", req.SubscriptionId, req.Partitions, req.Offsets)
	if mb == nil {
		return
	}
	l := c.live
	now := time.Now()
	view := l.sub.ViewOf(mb.id)
	delay := PolicyDelay
	if req.DelayMs != nil {
		delay = time.Duration(*req.DelayMs) * time.Millisecond
	}
	stale, failed, dead := 0, 0, false
	next := time.Time{}
	for i, p := range req.Partitions {
		r, err := l.sub.Nack(mb.id, p, req.Offsets[i], delay, req.Reason, now)
		if err != nil {
			stale++
			continue
		}
		failed++
		id := msgID{view: view, part: p, off: req.Offsets[i]}
		if te, ok := l.toks[id]; ok && te.tok != 0 {
			_ = mb.breaker.Failure(te.tok, FailNack)
		} else {
			mb.breaker.Record(FailNack)
		}
		delete(l.toks, id)
		mNacked.WithLabelValues(c.group).Inc()
		if r.Dead {
			dead = true
		} else {
			mRetries.WithLabelValues(c.group, "nack").Inc()
			if next.IsZero() || r.At.Before(next) {
				next = r.At
			}
		}
	}
	if stale > 0 {
		mStaleAcks.WithLabelValues(c.group).Add(float64(stale))
	}
	_ = l.sub.Request(mb.id, int(req.Credits))
	defer c.refill(mb)
	ok := &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_NackResponse{NackResponse: &heraldpb.NackResponse{}}}
	if failed == 0 {
		respond(ctx, ctx.Sender(), ok)
	} else {
		c.markDirty(view)
		c.waiters = append(c.waiters, waiter{to: ctx.Sender(), f: ok})
	}
	c.checkRevocations(ctx)
	if dead {
		c.pumpDLQ(ctx)
	}
	c.dispatch(ctx)
	if !next.IsZero() {
		c.armDeadlineAt(now, next)
	}
	c.flush(ctx)
}

func (c *coordinator) onCommit(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.CommitRequest) {
	mb := c.memberOf(req.SubscriptionId)
	if mb == nil {
		respond(ctx, ctx.Sender(), errFrame(f.Id, heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND, "subscription %d is not active", req.SubscriptionId))
		return
	}
	l := c.live
	if int(req.Partition) < len(l.entry.Stats) {
		if hw := c.partitionStats(l.entry, int(req.Partition)).HighWatermark.Load(); req.Offset > hw || req.Offset < 0 {
			respond(ctx, ctx.Sender(), errFrame(f.Id, heraldpb.ErrorCode_INVALID_REQUEST, "commit offset %d is outside [0, %d] (the high watermark) of partition %d", req.Offset, hw, req.Partition))
			return
		}
	}
	if err := l.sub.Commit(mb.id, req.Partition, req.Offset); err != nil {
		respond(ctx, ctx.Sender(), errFrame(f.Id, heraldpb.ErrorCode_INVALID_REQUEST, "commit: %v", err))
		return
	}
	floor := l.sub.Progress("", req.Partition).Floor()
	for id, te := range l.toks {
		if id.part == req.Partition && id.off < floor {
			if owner := l.members[te.member]; owner != nil && te.tok != 0 {
				_ = owner.breaker.Success(te.tok)
			}
			delete(l.toks, id)
		}
	}
	l.held("", req.Partition).trim(floor)
	c.markDirty("")
	c.waiters = append(c.waiters, waiter{to: ctx.Sender(), f: &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_CommitResponse{CommitResponse: &heraldpb.CommitResponse{}}}})
	c.checkRevocations(ctx)
	c.dispatch(ctx)
	c.pump(ctx)
	c.flush(ctx)
}

// ---- time ------------------------------------------------------------------

// armDeadline arms the timer for the subscription's next deadline (after
// the timer fires: NextDeadline takes the timers that went stale out of
// the subscription's timing wheel).
func (c *coordinator) armDeadline(now time.Time) {
	if l := c.live; l != nil {
		if t, ok := l.sub.NextDeadline(now); ok {
			c.armDeadlineAt(now, t)
		}
	}
}

// armDeadlineAt makes sure the timer fires no later than t. Deliveries
// call it with now+ack timeout, which is never earlier than a deadline
// already pending, so the push path never scans the flights.
func (c *coordinator) armDeadlineAt(now, t time.Time) {
	if !c.deadlineAt.IsZero() && !t.Before(c.deadlineAt) {
		return
	}
	c.deadlineAt = t
	c.after(max(t.Sub(now), time.Millisecond), &deadlineMsg{})
}

func (c *coordinator) onDeadline(ctx actor.Context) {
	l := c.live
	if l == nil {
		return
	}
	now := time.Now()
	expired := l.sub.Tick(now)
	dead := false
	for _, d := range expired {
		id := msgID{view: l.sub.ViewOf(d.Member), part: d.Partition, off: d.Offset}
		c.dirty[id.view] = true // the retry's delay and count, written lazily
		if d.Dead {
			dead = true
		} else {
			mRetries.WithLabelValues(c.group, "timeout").Inc()
		}
		te, ok := l.toks[id]
		delete(l.toks, id)
		switch owner := l.members[d.Member]; {
		case owner == nil:
		case ok && te.tok != 0:
			_ = owner.breaker.Failure(te.tok, FailAckTimeout)
		default:
			owner.breaker.Record(FailAckTimeout)
		}
	}
	if len(expired) > 0 {
		mAckTimeouts.WithLabelValues(c.group).Add(float64(len(expired)))
		c.checkRevocations(ctx)
		c.scheduleFlush()
	}
	if dead {
		c.pumpDLQ(ctx)
	}
	c.dispatch(ctx)
	c.armDeadline(now)
}

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
	if e := c.o.Topics.Get(l.topic); !topic.Same(e, l.entry) {
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

// ---- progress writes ---------------------------------------------------------

func (c *coordinator) markDirty(v MemberID) {
	c.dirty[v] = true
	c.scheduleFlush()
}

func (c *coordinator) scheduleFlush() {
	if !c.flushArmed {
		c.flushArmed = true
		c.after(c.o.FlushDelay, &flushMsg{})
	}
}

// maxMemberName bounds a member's name (it is stored in `__groups` as a
// broadcast member's position key).
const maxMemberName = 256

// maxWriteBytes bounds one progress write (a batch of GroupProgress
// records), well under the broker's max message size.
const maxWriteBytes = 256 << 10

// flush writes the dirty progress to __groups unless a write is in flight;
// the acks waiting are answered when it is durable. One write at a time
// keeps the records in order and batches the acks that arrive meanwhile.
func (c *coordinator) flush(ctx actor.Context) {
	if c.writing {
		return
	}
	if c.live != nil {
		for _, v := range slices.Sorted(maps.Keys(c.dirty)) {
			if c.live.sub.Progress(v, 0) != nil {
				c.toWrite = append(c.toWrite, c.encode(v))
			}
		}
	}
	clear(c.dirty)
	if len(c.toWrite) == 0 {
		for _, w := range c.waiters {
			respond(ctx, w.to, w.f)
		}
		c.waiters = nil
		return
	}
	if c.groupsLog == nil {
		e := c.o.Topics.Get(GroupsTopic)
		if e == nil {
			c.failWaiters(ctx, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "internal topic %s is missing", GroupsTopic))
			return
		}
		c.groupsLog = e.Partitions[0]
	}
	batch := &heraldpb.RecordBatch{}
	size, n := 0, 0
	for _, r := range c.toWrite {
		v, err := proto.Marshal(r)
		if err != nil {
			c.log.Error("encoding progress", "err", err)
			n++
			continue
		}
		if n > 0 && size+len(v) > maxWriteBytes {
			break
		}
		batch.Records = append(batch.Records, &heraldpb.Record{Key: []byte(c.group), Value: v})
		size += len(v)
		n++
	}
	c.writeRecs = c.toWrite[:n:n]
	c.toWrite = slices.Clone(c.toWrite[n:])
	if len(c.toWrite) == 0 {
		c.writeWaiters, c.waiters = c.waiters, nil
	}
	recs, err := proto.Marshal(batch)
	if err != nil || len(batch.Records) == 0 {
		c.log.Error("encoding progress batch", "err", err)
		c.writeRecs = nil
		return
	}
	c.writing = true
	c.writeID = c.id()
	ctx.Request(c.groupsLog, &heraldpb.Frame{Id: c.writeID, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: GroupsTopic, Partition: proto.Uint32(0), Acks: heraldpb.Acks_ACKS_ALL, Records: recs,
	}}})
}

func (c *coordinator) onWritten(ctx actor.Context, id uint64, e *heraldpb.Error) {
	if !c.writing || id != c.writeID {
		return
	}
	c.writing = false
	if e != nil {
		mProgressWrites.WithLabelValues("failed").Inc()
		if !e.Retriable {
			// Retrying cannot help (say, a record over the log's max
			// message size): the acks waiting for it fail, and the records
			// are dropped rather than wedging every later write. The views'
			// next records carry their progress again.
			c.log.Error("dropping group progress records that cannot be written", "records", len(c.writeRecs), "err", e.Message)
			for _, w := range c.writeWaiters {
				respond(ctx, w.to, heraldpb.ErrorFrame(w.f.Id, e))
			}
			c.writeRecs, c.writeWaiters = nil, nil
			if c.live != nil {
				for _, v := range c.live.sub.Views() {
					c.dirty[v] = true
				}
			}
			c.scheduleFlush()
			c.answerFlushed(ctx)
			return
		}
		c.log.Warn("writing group progress", "err", e.Message)
		c.toWrite = append(c.writeRecs, c.toWrite...)
		c.waiters = append(c.writeWaiters, c.waiters...)
		c.writeRecs, c.writeWaiters = nil, nil
		c.after(time.Duration(max(e.RetryAfterMs, 50))*time.Millisecond, &flushMsg{})
		c.flushArmed = true
		return
	}
	mProgressWrites.WithLabelValues("ok").Add(float64(len(c.writeRecs)))
	for _, r := range c.writeRecs {
		c.st.stored[keyOf(r)] = r
		c.st.lastTop = r.Topic
	}
	for _, w := range c.writeWaiters {
		respond(ctx, w.to, w.f)
	}
	c.writeRecs, c.writeWaiters = nil, nil
	if c.live == nil {
		c.updateSummary()
	}
	if len(c.toWrite) > 0 || len(c.waiters) > 0 || len(c.dirty) > 0 {
		c.flush(ctx)
	}
	c.answerFlushed(ctx)
}

// checkpoint asks a coordinator to rewrite all its records (compaction
// round round); it answers FlushGroupDone{Round: round} like FlushGroup.
type checkpoint struct{ round int }

// FlushGroup asks a coordinator to write all its progress; it answers
// FlushGroupDone once nothing is left unwritten. Graceful shutdown uses it.
type FlushGroup struct{}

// EndSessions ends every member's subscription with a SubscriptionEnded
// push giving Reason (this node stops coordinating groups: its clients
// subscribe again where groups are coordinated now). The answer is
// EndSessionsDone.
type EndSessions struct{ Reason *heraldpb.Error }

// EndSessionsDone answers EndSessions.
type EndSessionsDone struct{}

// FlushGroupDone answers FlushGroup (Round 0) and the compaction
// checkpoints (their round).
type FlushGroupDone struct{ Round int }

type flushCaller struct {
	pid   *actor.PID
	round int
}

// flushAll writes every view's progress and answers the sender with
// FlushGroupDone{Round: round} once nothing is left unwritten.
func (c *coordinator) flushAll(ctx actor.Context, round int) {
	if c.live != nil {
		for _, v := range c.live.sub.Views() {
			c.dirty[v] = true
		}
	}
	c.flushDone = append(c.flushDone, flushCaller{pid: ctx.Sender(), round: round})
	c.flush(ctx)
	c.answerFlushed(ctx)
}

func (c *coordinator) answerFlushed(ctx actor.Context) {
	if c.writing || len(c.toWrite) > 0 || len(c.dirty) > 0 {
		return
	}
	for _, p := range c.flushDone {
		ctx.Send(p.pid, &FlushGroupDone{Round: p.round})
	}
	c.flushDone = nil
}

func (c *coordinator) failWaiters(ctx actor.Context, e *heraldpb.Error) {
	for _, w := range c.waiters {
		respond(ctx, w.to, heraldpb.ErrorFrame(w.f.Id, e))
	}
	c.waiters = nil
}

// ---- start positions and reset ---------------------------------------------

// resolve computes an offset per partition of entry for pos and calls done
// on the coordinator.
func (c *coordinator) resolve(ctx actor.Context, entry *topic.Entry, pos *heraldpb.StartPosition, done func([]int64, *heraldpb.Error)) {
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

func (c *coordinator) onReset(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.ResetGroupRequest) {
	replyTo := ctx.Sender()
	if req.To == nil || req.To.At == nil {
		respond(ctx, replyTo, errFrame(f.Id, heraldpb.ErrorCode_INVALID_REQUEST, "reset needs a position (earliest, latest, offset or timestamp)"))
		return
	}
	if c.resolving {
		e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "group %q is starting a subscription", c.group)
		e.RetryAfterMs = 50
		respond(ctx, replyTo, heraldpb.ErrorFrame(f.Id, e))
		return
	}
	topicName := c.st.lastTop
	for _, r := range c.writeRecs {
		topicName = r.Topic
	}
	for _, r := range c.toWrite {
		topicName = r.Topic
	}
	if l := c.live; l != nil {
		topicName = l.topic
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
		// describe sees the queued records: the group as it will be.
		c.waiters = append(c.waiters, waiter{to: replyTo, f: &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ResetGroupResponse{ResetGroupResponse: &heraldpb.ResetGroupResponse{Group: c.describe()}}}})
		c.flush(ctx)
	})
}

// ---- describe ----------------------------------------------------------------

// current is the registry's entry now for the topic entry was taken for:
// in a cluster a partition's local replica comes and goes as partitions
// move between nodes (a stand-in forwards to other nodes meanwhile), and
// the PIDs and stats held since the subscription may be gone.
func (c *coordinator) current(entry *topic.Entry) *topic.Entry { return c.o.Topics.Current(entry) }

// partitionPID is the actor serving partition p (see current).
func (c *coordinator) partitionPID(entry *topic.Entry, p int) *actor.PID {
	return c.current(entry).Partitions[p]
}

// partitionStats is partition p's published state (see current).
func (c *coordinator) partitionStats(entry *topic.Entry, p int) *partition.Stats {
	return c.current(entry).Stats[p]
}

func (c *coordinator) describe() *heraldpb.GroupInfo {
	gi := &heraldpb.GroupInfo{Group: c.group, DeadLettered: c.st.deadLettered, Expired: c.st.expired,
		RetryPolicy: c.st.lastPolicy, DeadLetterTopic: c.st.lastDLQ}
	l := c.live
	if l == nil {
		storedInfo(gi, c.o.Topics, c.st.lastTop, c.latestRecords(c.st.lastTop))
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
	for _, v := range l.sub.Views() {
		for p := range l.entry.Partitions {
			owner := ""
			if l.mode == Clustering {
				if o, ok := l.sub.Assignor().Owner(uint32(p)); ok {
					owner = string(o)
				}
			}
			gi.Partitions = append(gi.Partitions, lagOf(uint32(p), string(v), l.sub.Progress(v, uint32(p)), c.current(l.entry), owner))
		}
	}
	return gi
}

func lagOf(p uint32, subscriber string, prog *Progress, entry *topic.Entry, owner string) *heraldpb.PartitionLag {
	pl := &heraldpb.PartitionLag{Partition: p, Subscriber: subscriber, AckFloor: prog.Floor(), AckedAbove: uint32(prog.Pending()), Owner: owner}
	if entry != nil && int(p) < len(entry.Stats) {
		pl.HighWatermark = entry.Stats[p].HighWatermark.Load()
		pl.Lag = max(pl.HighWatermark-pl.AckFloor-int64(pl.AckedAbove), 0)
	}
	return pl
}

// updateSummary publishes the group's line of ListGroups and its lag
// gauges.
func (c *coordinator) updateSummary() {
	publishSummary(c.group, c.st, c.describe())
}
