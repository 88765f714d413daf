package consumer

import (
	"github.com/heraldmq/herald/registry"
	"maps"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	"github.com/heraldmq/herald/internal/dispatch"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// ManagerName is the groups manager's actor name.
const ManagerName = "groups"

// Manager is the groups actor: it rebuilds every group's progress from
// `__groups` when it starts, then spawns one coordinator per group and
// routes subscriptions and group admin requests to them. Requests that
// arrive while it loads wait (up to Options.MaxQueued, then THROTTLED).
type Manager struct {
	o      *Options
	loaded bool
	queue  []queued
	groups map[string]*groupHandle

	// loading state
	loadID   uint64
	loadHW   int64
	loadNext int64
	recs     map[string]map[storeKey]*heraldpb.GroupProgress
	lastTop  map[string]string
	started  time.Time
	records  int

	// compaction of __groups
	compacting  bool
	compactGen  int
	compactFrom int64 // records below this are superseded once all answered
	compactWait int   // coordinators yet to answer
}

// compactTick and compactTimeout drive the compaction of __groups;
// summaryTick the summaries of stopped groups.
type (
	compactTick    struct{}
	compactTimeout struct{ gen int }
	summaryTick    struct{}
)

type groupHandle struct {
	pid *actor.PID // nil while stopped for idleness (idle.go)
	st  *groupStore
	// stopping: the coordinator asked to stop; its requests wait in held
	// until it stops or says it is busy.
	stopping bool
	held     []queued
}

type queued struct {
	msg    any
	sender *actor.PID
}

// Coordinators asks the manager for its coordinators' PIDs; the answer is
// a CoordinatorsList.
type Coordinators struct{}

// CoordinatorsList answers Coordinators.
type CoordinatorsList struct{ PIDs []*actor.PID }

// loadRetry asks the manager to read __groups again after a failure.
type loadRetry struct{}

// Props returns the groups manager's props. The internal topic
// GroupsTopic must exist and be writable before it starts.
func Props(o Options) *actor.Props {
	o.ensureDefaults()
	return actor.PropsFromProducer(func() actor.Actor {
		return &Manager{o: &o, groups: map[string]*groupHandle{}}
	})
}

// Receive is the manager's entry point.
func (m *Manager) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		m.started = m.o.Clock.Now()
		m.recs = map[string]map[storeKey]*heraldpb.GroupProgress{}
		m.lastTop = map[string]string{}
		m.load(ctx)
	case *loadRetry:
		m.load(ctx)
	case *compactTick:
		m.maybeCompact(ctx)
	case *compactTimeout:
		if m.compacting && msg.gen == m.compactGen {
			m.o.Logger.Warn("compaction of __groups timed out; will retry", "waiting", m.compactWait)
			m.compacting = false
			m.armCompact(ctx)
		}
	case *FlushGroupDone:
		if m.compacting && msg.Round == m.compactGen {
			m.compactWait--
			if m.compactWait == 0 {
				m.truncate(ctx)
			}
		}
	case *partition.DeleteBeforeResult:
		if msg.Err != nil {
			m.o.Logger.Error("compacting __groups", "err", msg.Err)
		} else if msg.Removed > 0 {
			m.o.Logger.Info("compacted __groups", "removed_records", msg.Removed)
			mCompactions.Inc()
		}
		m.compacting = false
		m.armCompact(ctx)
	case *heraldpb.Frame:
		if !m.loaded {
			if fr := msg.GetFetchResponse(); fr != nil && msg.Id == m.loadID {
				m.onLoaded(ctx, fr)
				return
			}
			if e := msg.GetError(); e != nil && msg.Id == m.loadID {
				m.o.Logger.Warn("reading __groups", "err", e.Message)
				self, sys := ctx.Self(), ctx.ActorSystem()
				m.o.Clock.AfterFunc(100*time.Millisecond, func() { sys.Root.Send(self, &loadRetry{}) })
				return
			}
			m.hold(ctx, msg, ctx.Sender())
			return
		}
		m.onFrame(ctx, msg, ctx.Sender())
	case *Coordinators:
		var pids []*actor.PID
		for _, h := range m.groups {
			if h.pid != nil {
				pids = append(pids, h.pid)
			}
		}
		ctx.Respond(&CoordinatorsList{PIDs: pids})
	case *idleStop:
		m.onIdleStop(ctx, msg)
	case *idleBusy:
		if h := m.groups[msg.group]; h != nil && h.stopping {
			h.stopping = false
			m.release(ctx, msg.group, h)
		}
	case *actor.Terminated:
		m.onTerminated(ctx, msg.Who)
	case *summaryTick:
		m.summarizeStopped()
		m.armSummary(ctx)
	case *subscribeMsg:
		if !m.loaded {
			m.hold(ctx, msg, nil)
			return
		}
		m.onSubscribe(ctx, msg)
	}
}

// frameOf is the request frame of a held message and whom to answer.
func frameOf(msg any, sender *actor.PID) (*heraldpb.Frame, *actor.PID) {
	switch x := msg.(type) {
	case *heraldpb.Frame:
		return x, sender
	case *subscribeMsg:
		return x.f, x.replyTo
	}
	return nil, sender
}

func (m *Manager) hold(ctx actor.Context, msg any, sender *actor.PID) {
	if len(m.queue) >= m.o.MaxQueued {
		f, to := frameOf(msg, sender)
		e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "consumer groups are still loading")
		e.RetryAfterMs = 100
		respond(ctx, to, heraldpb.ErrorFrame(f.GetId(), e))
		return
	}
	m.queue = append(m.queue, queued{msg: msg, sender: sender})
	mGroupQueue.Set(float64(len(m.queue)))
}

// load reads __groups from its start to the high watermark it has now:
// nothing else writes it before the coordinators exist.
func (m *Manager) load(ctx actor.Context) {
	e := m.o.Topics.Get(GroupsTopic)
	if e == nil {
		m.o.Logger.Error("internal topic is missing; consumer groups start empty", "topic", GroupsTopic)
		m.finishLoad(ctx)
		return
	}
	st := e.Stats[0]
	if m.loadHW == 0 {
		m.loadHW = st.HighWatermark.Load()
		m.loadNext = st.StartOffset.Load()
	}
	if m.loadNext >= m.loadHW {
		m.finishLoad(ctx)
		return
	}
	m.loadID++
	ctx.Request(e.Partitions[0], &heraldpb.Frame{Id: m.loadID, Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
		Topic: GroupsTopic, Partition: 0, Offset: m.loadNext, MaxBytes: 4 << 20,
	}}})
}

func (m *Manager) onLoaded(ctx actor.Context, fr *heraldpb.FetchResponse) {
	for _, b := range fr.Batches {
		_ = heraldpb.ForEachRecord(b.Records, func(i int, rec, _ []byte) bool {
			off := b.BaseOffset + int64(i)
			if off < m.loadNext {
				return true
			}
			m.loadNext = off + 1
			var r heraldpb.Record
			var g heraldpb.GroupProgress
			if proto.Unmarshal(rec, &r) != nil || proto.Unmarshal(r.Value, &g) != nil || g.Group == "" {
				m.o.Logger.Warn("skipping unreadable __groups record", "offset", off)
				return true
			}
			k := keyOf(&g)
			if m.recs[g.Group] == nil {
				m.recs[g.Group] = map[storeKey]*heraldpb.GroupProgress{}
			}
			m.recs[g.Group][k] = &g
			m.lastTop[g.Group] = g.Topic
			m.records++
			return true
		})
	}
	if len(fr.Batches) == 0 && m.loadNext < m.loadHW {
		m.loadNext = max(m.loadNext, fr.LogStartOffset)
		if fr.HighWatermark <= m.loadNext {
			m.loadHW = m.loadNext
		}
	}
	m.load(ctx)
}

func (m *Manager) finishLoad(ctx actor.Context) {
	m.loaded = true
	for g, recs := range m.recs {
		m.spawn(ctx, g, recs, m.lastTop[g])
	}
	m.armCompact(ctx)
	m.armSummary(ctx)
	m.o.Logger.Info("consumer groups loaded", "groups", len(m.recs), "records", m.records, "took", m.o.Clock.Now().Sub(m.started).Round(time.Millisecond))
	m.recs, m.lastTop = nil, nil
	q := m.queue
	m.queue = nil
	mGroupQueue.Set(0)
	for _, x := range q {
		switch msg := x.msg.(type) {
		case *subscribeMsg:
			m.onSubscribe(ctx, msg)
		case *heraldpb.Frame:
			m.onFrame(ctx, msg, x.sender)
		}
	}
}

func (m *Manager) armCompact(ctx actor.Context) {
	self, sys := ctx.Self(), ctx.ActorSystem()
	m.o.Clock.AfterFunc(m.o.CompactCheck, func() { sys.Root.Send(self, &compactTick{}) })
}

// maybeCompact starts a compaction of __groups once it holds more than
// CompactBytes: every coordinator rewrites its latest records, after which
// everything below the high watermark seen at the start is superseded and
// removed. The log then holds about one record per view.
func (m *Manager) maybeCompact(ctx actor.Context) {
	e := m.o.Topics.Get(GroupsTopic)
	if m.compacting || e == nil || e.Stats[0].SizeBytes.Load() < m.o.CompactBytes {
		m.armCompact(ctx)
		return
	}
	for _, h := range m.groups {
		if h.stopping {
			m.armCompact(ctx) // wait until it stopped or stayed
			return
		}
	}
	m.compacting = true
	m.compactGen++
	m.compactFrom = e.Stats[0].HighWatermark.Load()
	m.compactWait = len(m.groups)
	for name, h := range m.groups {
		// A stopped group's records are rewritten by its coordinator,
		// started for it (it stops again once idle).
		if h.pid == nil && !m.start(ctx, name, h) {
			m.compactWait--
			continue
		}
		ctx.Request(h.pid, &checkpoint{round: m.compactGen})
	}
	gen, self, sys := m.compactGen, ctx.Self(), ctx.ActorSystem()
	m.o.Clock.AfterFunc(time.Minute, func() { sys.Root.Send(self, &compactTimeout{gen: gen}) })
	if m.compactWait == 0 {
		m.truncate(ctx)
	}
}

func (m *Manager) truncate(ctx actor.Context) {
	e := m.o.Topics.Get(GroupsTopic)
	if e == nil {
		m.compacting = false
		return
	}
	ctx.Request(e.Partitions[0], &partition.DeleteBefore{Offset: m.compactFrom})
}

func (m *Manager) spawn(ctx actor.Context, group string, recs map[storeKey]*heraldpb.GroupProgress, lastTop string) *groupHandle {
	st := &groupStore{stored: recs, lastTop: lastTop}
	if st.stored == nil {
		st.stored = map[storeKey]*heraldpb.GroupProgress{}
	}
	h := &groupHandle{st: st}
	if !m.start(ctx, group, h) {
		return nil
	}
	m.groups[group] = h
	return h
}

// start spawns group's coordinator on h's store.
func (m *Manager) start(ctx actor.Context, group string, h *groupHandle) bool {
	o, st := m.o, h.st
	pid, err := ctx.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return newCoordinator(o, group, st) }, actor.WithDispatcher(dispatch.Shared())), "g/"+group)
	if err != nil {
		m.o.Logger.Error("spawning group coordinator", "group", group, "err", err)
		return false
	}
	h.pid = pid
	mCoordinators.Inc()
	return true
}

// send hands msg (from sender; nil for a subscribeMsg, which carries its
// own) to group's coordinator: held while it is stopping, after starting
// it again if it stopped for idleness.
func (m *Manager) send(ctx actor.Context, group string, h *groupHandle, msg any, sender *actor.PID) {
	if h.stopping {
		if len(h.held) >= m.o.MaxQueued {
			f, to := frameOf(msg, sender)
			e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "group %s is restarting its coordinator", registry.QuoteName(group))
			e.RetryAfterMs = 100
			respond(ctx, to, heraldpb.ErrorFrame(f.GetId(), e))
			return
		}
		h.held = append(h.held, queued{msg: msg, sender: sender})
		return
	}
	if h.pid == nil && !m.start(ctx, group, h) {
		f, to := frameOf(msg, sender)
		respond(ctx, to, errFrame(f.GetId(), heraldpb.ErrorCode_INTERNAL, "cannot start group %s", registry.QuoteName(group)))
		return
	}
	if sender != nil {
		ctx.RequestWithCustomSender(h.pid, msg, sender)
	} else {
		ctx.Send(h.pid, msg)
	}
}

// release sends the held requests of group (h) to its running or
// restarted coordinator.
func (m *Manager) release(ctx actor.Context, group string, h *groupHandle) {
	held := h.held
	h.held = nil
	for _, q := range held {
		m.send(ctx, group, h, q.msg, q.sender)
	}
}

// onIdleStop answers a coordinator that asks to stop: hold its requests
// and let it stop, unless a compaction needs it.
func (m *Manager) onIdleStop(ctx actor.Context, msg *idleStop) {
	h := m.groups[msg.group]
	if h == nil || !h.pid.Equal(msg.pid) || h.stopping {
		return
	}
	if m.compacting {
		ctx.Send(msg.pid, &idleNotNow{})
		return
	}
	h.stopping = true
	ctx.Send(msg.pid, &stopIdle{})
}

// onTerminated notes a coordinator that stopped: an idle one's group keeps
// its store, summary and lag (summarizeStopped), and starts again on its
// next request; held requests start it at once.
func (m *Manager) onTerminated(ctx actor.Context, who *actor.PID) {
	for name, h := range m.groups {
		if h.pid == nil || !h.pid.Equal(who) {
			continue
		}
		h.pid, h.stopping = nil, false
		mCoordinators.Dec()
		m.summarize(name, h)
		if len(h.held) > 0 {
			m.release(ctx, name, h)
		}
		return
	}
}

func (m *Manager) armSummary(ctx actor.Context) {
	self, sys := ctx.Self(), ctx.ActorSystem()
	m.o.Clock.AfterFunc(time.Second, func() { sys.Root.Send(self, &summaryTick{}) })
}

// summarizeStopped keeps the summary and lag gauges of groups whose
// coordinator stopped current: records keep arriving while nobody reads.
func (m *Manager) summarizeStopped() {
	for name, h := range m.groups {
		if h.pid == nil {
			m.summarize(name, h)
		}
	}
}

func (m *Manager) summarize(name string, h *groupHandle) {
	gi := &heraldpb.GroupInfo{Group: name}
	storedInfo(gi, m.o.Topics, h.st.lastTop, storedRecords(h.st, h.st.lastTop))
	publishSummary(name, h.st, gi)
}

func (m *Manager) onSubscribe(ctx actor.Context, msg *subscribeMsg) {
	req := msg.f.GetSubscribe()
	if e := registry.CheckGroupName(req.Group); e != nil {
		respond(ctx, msg.replyTo, heraldpb.ErrorFrame(msg.f.Id, e))
		return
	}
	h := m.groups[req.Group]
	if h != nil {
		m.send(ctx, req.Group, h, msg, nil)
		return
	}
	{
		// A group that does not exist yet is only made for a subscription
		// that can succeed, so that no client can pile up coordinators.
		if e := m.o.Topics.Get(req.Topic); e == nil || registry.IsInternal(req.Topic) {
			if !m.o.Topics.Synced() && !registry.IsInternal(req.Topic) {
				respond(ctx, msg.replyTo, heraldpb.ErrorFrame(msg.f.Id, registry.NotReady(req.Topic)))
				return
			}
			respond(ctx, msg.replyTo, errFrame(msg.f.Id, heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q does not exist", req.Topic))
			return
		}
		if _, ferr := compileFilter(req.FilterType, req.Filter); ferr != nil {
			respond(ctx, msg.replyTo, heraldpb.ErrorFrame(msg.f.Id, ferr))
			return
		}
		if h = m.spawn(ctx, req.Group, nil, ""); h == nil {
			respond(ctx, msg.replyTo, errFrame(msg.f.Id, heraldpb.ErrorCode_INTERNAL, "cannot start group %q", req.Group))
			return
		}
	}
	ctx.Send(h.pid, msg)
}

func (m *Manager) onFrame(ctx actor.Context, f *heraldpb.Frame, sender *actor.PID) {
	var group string
	switch b := f.Body.(type) {
	case *heraldpb.Frame_ListGroups:
		resp := &heraldpb.ListGroupsResponse{}
		for _, name := range slices.Sorted(maps.Keys(m.groups)) {
			if s := m.groups[name].st.summary.Load(); s != nil && (s.Members > 0 || s.Topic != "") {
				resp.Groups = append(resp.Groups, s)
			}
		}
		respond(ctx, sender, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListGroupsResponse{ListGroupsResponse: resp}})
		return
	case *heraldpb.Frame_DescribeGroup:
		group = b.DescribeGroup.Group
	case *heraldpb.Frame_ResetGroup:
		group = b.ResetGroup.Group
	case *heraldpb.Frame_CommitTxnOffsets:
		// A committed transaction's offsets: they may be the group's
		// first progress.
		o := b.CommitTxnOffsets.GetOffsets()
		if e := registry.CheckGroupName(o.GetGroup()); e != nil {
			respond(ctx, sender, heraldpb.ErrorFrame(f.Id, e))
			return
		}
		if m.groups[o.Group] == nil {
			if e := m.o.Topics.Get(o.Topic); e == nil || registry.IsInternal(o.Topic) {
				if e == nil && !m.o.Topics.Synced() {
					respond(ctx, sender, heraldpb.ErrorFrame(f.Id, registry.NotReady(o.Topic)))
					return
				}
				respond(ctx, sender, errFrame(f.Id, heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %s does not exist", registry.QuoteName(o.Topic)))
				return
			}
			if m.spawn(ctx, o.Group, nil, "") == nil {
				respond(ctx, sender, errFrame(f.Id, heraldpb.ErrorCode_INTERNAL, "cannot start group %s", registry.QuoteName(o.Group)))
				return
			}
		}
		group = o.Group
	default:
		respond(ctx, sender, errFrame(f.Id, heraldpb.ErrorCode_INVALID_REQUEST, "the groups manager does not handle %T", f.Body))
		return
	}
	h := m.groups[group]
	if h == nil {
		respond(ctx, sender, errFrame(f.Id, heraldpb.ErrorCode_GROUP_NOT_FOUND, "group %s does not exist", registry.QuoteName(group)))
		return
	}
	m.send(ctx, group, h, f, sender)
}
