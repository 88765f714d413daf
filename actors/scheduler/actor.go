// Package scheduler is the scheduler room: delayed and scheduled delivery.
// Its actor keeps every pending delayed message in `__schedule` (raft-
// backed) and in a timing wheel (package timewheel), and fires due batches
// to their topics.
//
// This file is the actor: Receive, loading, requests and the writes to
// __schedule; fire.go fires due batches and rewrite.go compacts. Its pure
// core, the pending set and the decisions on it, is in state.go.
package scheduler

import (
	"log/slog"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	"github.com/heraldmq/herald/internal/dispatch"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"github.com/heraldmq/herald/timewheel"
	"google.golang.org/protobuf/proto"
)

// ScheduleTopic is the internal partition holding the scheduler's state:
// every delayed batch (its id is the offset of its record here), every
// cancel, and the fires.
const ScheduleTopic = "__schedule"

// ActorName is the scheduler actor's name.
const ActorName = "scheduler"

// ClockJumped tells the scheduler that its clock (Options.Now) jumped: it
// looks at its time now, fires what is due and re-arms its timers, which
// run on real time. Only a jump of the clock's monotonic reading (a test
// clock moved with time.Time.Add) moves the scheduler's time; a step of
// the wall clock alone (NTP, `date -s`, the chaos build's offset) does not
// (see Scheduler.now), so after one the look finds nothing new. The chaos
// build's /debug/faults sends it after every change of the offset; it
// costs one look at the time. Before the scheduler has loaded __schedule
// it is ignored: the end of the load looks at the time.
type ClockJumped struct{}

// Headers the scheduler adds to every record of a batch it appends to the
// batch's topic.
const (
	HeaderScheduleID = "herald-schedule-id"
	HeaderDeliverAt  = "herald-deliver-at" // Unix ms
	HeaderFireToken  = "herald-fire-token" // the fire round's random token (recovery checks it)
)

// Props returns the scheduler actor's props. The internal topic
// ScheduleTopic must exist and be writable before it starts.
func Props(o Options) *actor.Props {
	o.ensureDefaults()
	sh := &incarnations{}
	return actor.PropsFromProducer(func() actor.Actor {
		return &Scheduler{o: &o, sh: sh, log: o.Logger.With("component", "scheduler")}
	}, actor.WithDispatcher(dispatch.Shared()))
}

// incarnations is what one incarnation of the actor leaves the next when
// it restarts (after a panic): the requests it had in flight. Their
// answers still come, to the same PID; until they all have (or
// orphanWait passed), the new incarnation does not read __schedule, so it
// sees every write and append the old one made.
type incarnations struct {
	orphans map[uint64]bool
	incs    uint64 // incarnations started
}

// recoverScanFor bounds how long recovery retries reading a target
// partition that answers with a retriable error.
const recoverScanFor = 5 * time.Minute

// orphanWait bounds the wait for a previous incarnation's requests.
const orphanWait = 30 * time.Second

// reloadMinAge is the least time an incarnation runs before it reloads
// after a write of unknown outcome.
const reloadMinAge = 3 * time.Second

// Scheduler is the scheduler actor. It rebuilds the pending set and the
// timing wheel from __schedule when it starts, then:
//   - stores each delayed produce as a ScheduledBatch event and answers it
//     once durable, with the event's offset as its id;
//   - fires due batches in rounds, a few at once: Lead before their time
//     it reads them and writes a ScheduleFiring event naming where each
//     target partition's log ends; at their time it appends them (each
//     record tagged with herald-schedule-id), and then records them fired.
//     After a crash, a batch whose firing was written but not its fire is
//     looked for on its partition from that offset, so it is appended
//     once (and not before its time: one not found fires as usual);
//   - cancels by id; lists the pending batches;
//   - removes the records of __schedule below the oldest pending batch.
//
// Pending batches cost a bit in a roaring bitmap of offsets plus a 16-byte
// wheel entry while within the wheel's near window; later ones are in the
// far store (on disk in the broker).
type Scheduler struct {
	started   time.Time // when this incarnation started
	reloading bool      // a reload after a write of unknown outcome is due
	o         *Options
	sh        *incarnations
	inc       uint64 // this incarnation's number
	log       *slog.Logger
	self      *actor.PID
	sys       *actor.ActorSystem

	loaded bool
	queue  []stashed // requests that arrived while loading

	state // the pending set and its bookkeeping (state.go)

	wheel *timewheel.Wheel
	far   timewheel.FarStore

	// The scheduler's time (now): anchor is Options.Now() when this
	// incarnation started, anchorWall its wall reading alone.
	anchor, anchorWall time.Time

	// loading
	loadNext, loadHW int64
	loadHWSet        bool // loadHW is the partition's, read with the first fetch
	loadStart        time.Time
	loadRecords      int

	nextID uint64
	// epoch is the term in which this node's replica of __schedule was
	// elected, read when the scheduler loads: it stamps every fire append
	// and fences each partition before a recovery scan reads it
	// (fence.go).
	epoch      uint64
	fenced     map[fenceKey]*registry.Entry
	resetting  map[fenceKey]bool // partitions whose epoch onFenced is resetting
	waitedLead bool

	calls      map[uint64]func(*heraldpb.Frame) // answers of our requests to partition actors
	callsAt    []callAt                         // when each was sent, oldest first
	sweepArmed bool
	sched      *actor.PID // __schedule's partition actor

	// writes to __schedule: one in flight; the rest queue and go together
	wq       []writeOp
	inflight []writeOp // the write in flight
	writing  bool
	queued   int // client requests in wq

	// firing
	timerGen   uint64
	timerAt    int64 // when the armed timer fires, 0 if none
	dueQ       []timewheel.Entry
	rounds     int          // rounds between their read and their last append
	hold       []*fireChunk // announced appends waiting for their time, by time
	heldBytes  int          // their records' bytes
	sendGen    uint64
	sendAt     int64
	firedPrev  []uint64                // refs appended (or dropped) whose fire is not yet written
	firedWrite bool                    // a write of fires is queued or in flight
	rcache     []*heraldpb.StoredBatch // the last read of __schedule, for fire rounds
	rewriteOn  bool
	retrying   int // batches in appends being retried
	appenders  map[appendKey]*appender

	compactArmed bool
	listing      int
}

type stashed struct {
	f      *heraldpb.Frame
	sender *actor.PID
}

// writeOp is one group of events for __schedule; done gets the offset of
// its first event once the write is durable, or the error.
type writeOp struct {
	events [][]byte
	client bool
	done   func(base int64, e *heraldpb.Error)
}

// Timer and internal messages.
type (
	fireTick       struct{ gen uint64 }
	compactTick    struct{}
	retryWrite     struct{}
	reloadTick     struct{ why string }
	loadRetry      struct{}
	sweepCalls     struct{}
	scanStep       struct{ fn func() }
	settleRetry    struct{ found []uint64 }
	orphansTimeout struct{}
	listFinished   struct {
		inc  uint64
		to   *actor.PID
		f    *heraldpb.Frame
		resp *heraldpb.ListScheduledResponse
		err  *heraldpb.Error
	}
)

// Receive is the scheduler's entry point.
func (s *Scheduler) Receive(ctx actor.Context) {
	m := ctx.Message()
	if t, ok := m.(*timed); ok {
		if t.inc != s.inc {
			return // an earlier incarnation's timer
		}
		m = t.msg
	}
	switch msg := m.(type) {
	case *actor.Started:
		s.self, s.sys = ctx.Self(), ctx.ActorSystem()
		s.started, s.reloading = time.Now(), false
		s.sh.incs++
		s.inc = s.sh.incs
		s.calls = map[uint64]func(*heraldpb.Frame){}
		s.fenced, s.resetting = map[fenceKey]*registry.Entry{}, map[fenceKey]bool{}
		s.appenders = map[appendKey]*appender{}
		s.state = newState()
		s.anchor = s.o.Now()
		s.anchorWall = s.anchor.Round(0)
		if s.o.Anchor != nil {
			s.anchorWall = s.o.Anchor().Round(0)
			s.anchor = s.o.Now() // the monotonic reading that goes with it
			if d := s.anchorWall.Sub(s.anchor.Round(0)); d > time.Second || d < -time.Second {
				s.log.Warn("this node's clock differs from the cluster's: the scheduler runs on the cluster's time", "cluster_minus_node", d.Round(time.Millisecond))
			}
		}
		s.loadStart = s.anchor
		// Ids unique across restarts of the actor: answers to an earlier
		// incarnation's requests may still arrive.
		s.nextID = uint64(s.loadStart.UnixNano())
		var far timewheel.FarStore
		if s.o.NewFar != nil {
			f, err := s.o.NewFar()
			if err != nil {
				s.log.Error("opening the far timer store; keeping far timers in memory", "err", err)
			} else {
				far = f
			}
		}
		s.far = far
		s.wheel = timewheel.NewWheel(s.now().UnixMilli(), far)
		s.dedup = newDedup(s.o.DedupWindow, s.o.DedupMax)
		s.dedup.loadNowMs = s.now().UnixMilli()
		if len(s.sh.orphans) > 0 {
			s.log.Info("waiting for the previous incarnation's requests before loading", "requests", len(s.sh.orphans))
			s.after(orphanWait, &orphansTimeout{})
			return
		}
		s.load(ctx)
	case *orphansTimeout:
		if len(s.sh.orphans) > 0 {
			s.log.Warn("requests of the previous incarnation never answered; loading anyway", "requests", len(s.sh.orphans))
			clear(s.sh.orphans)
			s.load(ctx)
		}
	case *actor.Restarting, *actor.Stopping:
		if s.sh.orphans == nil {
			s.sh.orphans = map[uint64]bool{}
		}
		for id := range s.calls {
			s.sh.orphans[id] = true
		}
		// Requests waiting for a write get an answer: TIMEOUT, as the
		// write in flight may or may not have been stored.
		e := heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "the scheduler restarted before the write finished; the request may or may not have taken effect")
		e.Retriable = true
		for _, op := range append(s.inflight, s.wq...) {
			if op.client {
				op.done(-1, e)
			}
		}
		s.inflight, s.wq = nil, nil
		s.timerGen++
		if c, ok := s.far.(interface{ Close() error }); ok {
			_ = c.Close()
		}
		// The next scheduler, here after a restart or on the node that
		// leads __schedule next, counts its own: a node that stopped
		// leading must not report the pending batches it no longer holds.
		mPending.Set(0)
		mDedupEntries.Set(0)
	case *loadRetry:
		s.load(ctx)
	case *reloadTick:
		mEpochRestarts.Inc()
		panic(errStale("a write to __schedule ended with its outcome unknown: " + msg.why))
	case *fireTick:
		if msg.gen == s.timerGen {
			s.timerAt = 0
			s.onTick(ctx)
		}
	case *roundBuilt:
		if msg.r.owner == s { // else a round of an incarnation before a restart
			s.writeFiring(ctx, msg.r)
		}
	case *sweepCalls:
		s.sweep()
	case *actor.DeadLetterResponse:
		if msg.Target != nil {
			s.failCallsTo(msg.Target)
		}
	case *scanStep:
		msg.fn()
	case *settleRetry:
		s.settleRecovered(ctx, msg.found)
	case *ClockJumped:
		if !s.loaded {
			return // finishing the load looks at the time
		}
		s.timerAt, s.sendAt = 0, 0 // a clock that jumped: timers armed earlier are too late
		s.onTick(ctx)
		s.sendDue(ctx)
	case *sendTick:
		if msg.gen == s.sendGen {
			s.sendAt = 0
			s.sendDue(ctx)
		}
	case *resendChunks:
		s.sendGroup(ctx, msg.cs)
	case *retryWrite:
		s.flushWrites(ctx)
	case *retryFiring:
		s.writeFiring(ctx, msg.round)
	case *retryRead:
		s.readRound(ctx, msg.round)
	case *retryFired:
		s.firedWrite = false
		s.writeFired(ctx)
	case *compactTick:
		s.compactArmed = false
		s.pruneAppenders()
		s.compact(ctx)
	case *partition.DeleteBeforeResult:
		if !s.loaded {
			return // asked by an earlier incarnation; this one arms its own after loading
		}
		if msg.Err != nil {
			s.log.Error("compacting __schedule", "err", msg.Err)
		}
		s.armCompact()
	case *vhostChecked:
		if !msg.ok {
			e := msg.err
			if e == nil {
				e = heraldpb.NewError(heraldpb.ErrorCode_SCHEDULE_NOT_FOUND, "scheduled batch %s is not pending (unknown, delivered or cancelled)", msg.req.Id)
			}
			respond(ctx, msg.to, heraldpb.ErrorFrame(msg.f.Id, e))
			return
		}
		msg.req.Vhost = "" // checked
		s.onCancel(ctx, msg.f, msg.req, msg.to)
	case *listFinished:
		if msg.inc == s.inc {
			s.listing--
		}
		if msg.err != nil {
			respond(ctx, msg.to, heraldpb.ErrorFrame(msg.f.Id, msg.err))
		} else {
			respond(ctx, msg.to, &heraldpb.Frame{Id: msg.f.Id, Body: &heraldpb.Frame_ListScheduledResponse{ListScheduledResponse: msg.resp}})
		}
	case *heraldpb.Frame:
		if s.isInternalAnswer(msg) {
			if fn, ok := s.calls[msg.Id]; ok {
				delete(s.calls, msg.Id)
				fn(msg)
			} else if s.sh.orphans[msg.Id] {
				delete(s.sh.orphans, msg.Id)
				if len(s.sh.orphans) == 0 && s.sched == nil && !s.loaded {
					s.load(ctx) // the previous incarnation's requests are all answered
				}
			}
			return
		}
		if !s.loaded {
			if len(s.queue) >= s.o.MaxQueued {
				respond(ctx, ctx.Sender(), throttled(msg.Id, "the scheduler is still loading"))
				return
			}
			s.queue = append(s.queue, stashed{f: msg, sender: ctx.Sender()})
			return
		}
		s.onRequest(ctx, msg, ctx.Sender())
	}
}

// isInternalAnswer tells an answer to one of our requests (a produce or
// fetch response, or an error frame) from a client request: the router
// forwards only requests here, so the two never mix up even when a
// client's frame id equals one of ours.
func (s *Scheduler) isInternalAnswer(f *heraldpb.Frame) bool {
	switch f.Body.(type) {
	case *heraldpb.Frame_ProduceResponse, *heraldpb.Frame_FetchResponse, *heraldpb.Frame_Error:
		return true
	}
	return false
}

func respond(ctx actor.Context, to *actor.PID, f *heraldpb.Frame) {
	if to != nil {
		ctx.Send(to, f)
	}
}

func throttled(id uint64, why string) *heraldpb.Frame {
	return heraldpb.ErrorFrame(id, throttledErr(why))
}

func (s *Scheduler) id() uint64 {
	s.nextID++
	return s.nextID
}

// call sends f (whose id it sets) to pid and runs fn with the answer.
// An answer that never comes (its actor stopped: a deleted topic) would
// hold what waits for it forever; after callTimeout the call is answered
// with TIMEOUT instead.
func (s *Scheduler) call(ctx actor.Context, pid *actor.PID, f *heraldpb.Frame, fn func(*heraldpb.Frame)) {
	f.Id = s.id()
	s.calls[f.Id] = fn
	s.callsAt = append(s.callsAt, callAt{id: f.Id, at: time.Now(), pid: pid})
	if !s.sweepArmed {
		s.sweepArmed = true
		s.after(callTimeout/4, &sweepCalls{})
	}
	ctx.Request(pid, f)
}

// callTimeout bounds the wait for a target partition's answer. Writes to
// __schedule are not timed out: one that lands after its caller gave up
// would leave the scheduler's state behind its log.
const callTimeout = 10 * time.Second

type callAt struct {
	id  uint64
	at  time.Time
	pid *actor.PID
}

// failCallsTo answers the calls to pid, which is gone (a deleted topic's
// partition), with a retriable TIMEOUT: their callbacks see whether the
// topic is still there.
func (s *Scheduler) failCallsTo(pid *actor.PID) {
	for _, c := range s.callsAt {
		if fn, ok := s.calls[c.id]; ok && c.pid.Equal(pid) {
			delete(s.calls, c.id)
			e := heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "the actor %s is gone", pid.Id)
			e.Retriable = true
			fn(heraldpb.ErrorFrame(c.id, e))
		}
	}
}

// sweep answers the calls older than callTimeout with TIMEOUT.
func (s *Scheduler) sweep() {
	s.sweepArmed = false
	cut := time.Now().Add(-callTimeout)
	i := 0
	for ; i < len(s.callsAt) && s.callsAt[i].at.Before(cut); i++ {
		id := s.callsAt[i].id
		if fn, ok := s.calls[id]; ok && !s.callsAt[i].pid.Equal(s.sched) {
			delete(s.calls, id)
			s.log.Warn("no answer from a partition actor; treating it as a timeout", "after", callTimeout)
			e := heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "no answer within %v", callTimeout)
			e.Retriable = true
			fn(heraldpb.ErrorFrame(id, e))
		}
	}
	kept := s.callsAt[:0]
	for _, c := range s.callsAt[:i] {
		if _, ok := s.calls[c.id]; ok {
			kept = append(kept, c) // a __schedule write still waiting
		}
	}
	s.callsAt = append(kept, s.callsAt[i:]...)
	// Drop the answered ones from the front (the rest go as they age).
	for len(s.callsAt) > 0 {
		if _, ok := s.calls[s.callsAt[0].id]; ok {
			break
		}
		s.callsAt = s.callsAt[1:]
	}
	if len(s.calls) > 0 {
		s.sweepArmed = true
		s.after(callTimeout/4, &sweepCalls{})
	}
}

// now is the scheduler's time, on which delayed batches come due: the
// wall-clock time its clock (Options.Now) read when this incarnation
// started, advanced since by the clock's monotonic reading (time.Time.Sub
// uses it when both readings have one, as time.Now's do). A step of the
// wall clock after the start (an NTP step, `date -s`, the chaos build's
// offset) does not move it: a forward step does not make pending batches
// due sooner in real time, a step back does not delay them. The next
// start (a restart after a crash, or the scheduler moving to this node
// again) takes the wall clock as it is then, step included. Between
// steps the two readings advance at the same rate (NTP slews both), so
// the scheduler's time stays on the wall clock it started with; a
// machine whose monotonic clock stops while it is suspended puts it
// behind (late, never early). A clock without monotonic readings is
// followed as it goes.
func (s *Scheduler) now() time.Time { return s.anchorWall.Add(s.o.Now().Sub(s.anchor)) }

func (s *Scheduler) nowMs() int64 { return s.now().UnixMilli() }

// after sends msg to the actor after d, tagged with this incarnation: a
// later incarnation (after a restart) drops it, as the state it refers to
// is gone.
func (s *Scheduler) after(d time.Duration, msg any) {
	self, sys, inc := s.self, s.sys, s.inc
	time.AfterFunc(d, func() { sys.Root.Send(self, &timed{inc: inc, msg: msg}) })
}

// timed is a message the actor sent itself through after.
type timed struct {
	inc uint64
	msg any
}

// ---- loading -------------------------------------------------------------

// load reads __schedule from its start to the high watermark it had when
// the scheduler started: nothing else writes it.
func (s *Scheduler) load(ctx actor.Context) {
	e := s.o.Topics.Get(ScheduleTopic)
	if e == nil {
		s.log.Error("internal topic is missing; delayed messages are refused", "topic", ScheduleTopic)
		return
	}
	s.sched = e.Partitions[0]
	if s.epoch == 0 && !s.o.NoFence {
		if s.epoch = s.readEpoch(e); s.epoch == 0 {
			if !s.waitedLead {
				s.waitedLead = true
				s.log.Info("waiting for this node's replica of __schedule to lead")
			}
			s.after(100*time.Millisecond, &loadRetry{})
			return
		}
	}
	if !s.loadHWSet && s.loadNext == 0 {
		s.loadNext = e.Stats[0].StartOffset.Load()
	}
	// The end to read to is the partition's own high watermark, from the
	// first read's answer: Stats may not show a write acknowledged just
	// before this incarnation started yet, and reading to it alone would
	// lose that delayed batch (TestStepBeforeTheStartDoesNotMoveDelayedMessages
	// under load).
	if s.loadHWSet && s.loadNext >= s.loadHW {
		s.recover(ctx)
		return
	}
	s.call(ctx, s.sched, &heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
		Topic: ScheduleTopic, Offset: s.loadNext, MaxBytes: 4 << 20,
	}}}, func(f *heraldpb.Frame) {
		fr := f.GetFetchResponse()
		if fr == nil {
			if start := e.Stats[0].StartOffset.Load(); f.GetError().GetCode() == heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE && s.loadNext < start {
				s.loadNext = start // removed meanwhile: only records of done batches are removed
				s.load(ctx)
				return
			}
			s.log.Warn("reading __schedule; retrying", "err", f.GetError().GetMessage())
			s.after(100*time.Millisecond, &loadRetry{})
			return
		}
		s.onLoaded(ctx, fr)
	})
}

func (s *Scheduler) onLoaded(ctx actor.Context, fr *heraldpb.FetchResponse) {
	if !s.loadHWSet {
		s.loadHW, s.loadHWSet = fr.HighWatermark, true
	}
	s.loadNext = heraldpb.ForEachStoredRecord(fr.Batches, s.loadNext, func(off int64, rec []byte) {
		s.loadRecords++
		ev, err := decodeEvent(rec)
		if err != nil {
			s.log.Warn("skipping unreadable __schedule record", "offset", off, "err", err)
			return
		}
		if t, ok := s.apply(uint64(off), ev); ok {
			s.wheel.Add(t)
		}
	})
	if len(fr.Batches) == 0 {
		s.loadNext = max(s.loadNext, fr.LogStartOffset)
		if fr.HighWatermark <= s.loadNext {
			s.loadHW = s.loadNext
		}
	}
	s.load(ctx)
}

// decodeEvent reads the ScheduleEvent in a __schedule record.
func decodeEvent(rec []byte) (*heraldpb.ScheduleEvent, error) {
	var ev heraldpb.ScheduleEvent
	if err := heraldpb.UnmarshalRecordValue(rec, &ev); err != nil {
		return nil, err
	}
	return &ev, nil
}

// recover settles the batches whose firing was written but not their
// fire: each is looked for on its partition, from where the log ended
// when the firing was written, by its herald-schedule-id header, once
// the partition is fenced against the schedulers before this one
// (fence.go). Found ones are recorded fired; the others fire again as
// due.
func (s *Scheduler) recover(ctx actor.Context) {
	rs := s.recoveries()
	s.intents = nil
	if len(rs) == 0 {
		s.finishLoad(ctx)
		return
	}
	waiting := len(rs)
	var found []uint64
	for _, r := range rs {
		e := s.o.Topics.Get(r.topic)
		if e == nil || int(r.part) >= len(e.Partitions) {
			waiting--
			continue // fires again; the topic is gone, so it is dropped then
		}
		s.fence(ctx, e, r.part, func() {
			s.scanFor(ctx, e, r.part, r.from, r.want, func(got []uint64) {
				found = append(found, got...)
				waiting--
				if waiting == 0 {
					s.settleRecovered(ctx, found)
				}
			})
		})
	}
	if waiting == 0 {
		s.settleRecovered(ctx, found)
	}
}

// scanFor reads partition p of e from offset from to its end, collecting
// the refs of want found in herald-schedule-id headers.
func (s *Scheduler) scanFor(ctx actor.Context, e *registry.Entry, p uint32, from int64, want map[string]uint64, done func([]uint64)) {
	var got []uint64
	var step func(off int64)
	began := time.Now()
	step = func(off int64) {
		if len(want) == 0 || !registry.Same(s.o.Topics.Get(e.Name), e) {
			done(got) // all found, or the topic is gone (with what was in it)
			return
		}
		// From the leader (a follower may lack committed entries): the
		// local replica when it leads, else the node's stand-in.
		s.call(ctx, s.o.Topics.Current(e).Writer(int(p)), &heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
			Topic: e.Name, Partition: p, Offset: off, MaxBytes: 4 << 20, IncludeHeld: true,
		}}}, func(f *heraldpb.Frame) {
			fr := f.GetFetchResponse()
			if fr == nil {
				if start := e.Stats[p].StartOffset.Load(); f.GetError().GetCode() == heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE && off < start {
					step(start) // retention removed the start: what it removed was appended before
					return
				}
				if heraldpb.IsRetriableCode(f.GetError().GetCode()) && time.Since(began) < recoverScanFor {
					// Busy or reopening at startup: giving up here would
					// append again what may be there.
					s.after(100*time.Millisecond, &scanStep{fn: func() { step(off) }})
					return
				}
				s.log.Warn("recovering fires: reading the target partition failed; treating the rest as not appended", "topic", e.Name, "partition", p, "err", f.GetError().GetMessage())
				done(got)
				return
			}
			next := off
			for _, b := range fr.Batches {
				next = max(next, b.BaseOffset+int64(b.Count))
				_ = heraldpb.ForEachRawRecord(b.Records, func(_ int, rec []byte) bool {
					if v, ok := heraldpb.RecordHeader(rec, HeaderScheduleID); ok {
						tok, _ := heraldpb.RecordHeader(rec, HeaderFireToken)
						k := string(v) + "/" + string(tok)
						if ref, ok := want[k]; ok {
							got = append(got, ref)
							delete(want, k)
						}
					}
					return true
				})
			}
			if next == off || next >= fr.HighWatermark {
				// The partition's own high watermark, not Stats': an answer
				// may come before Stats is updated.
				done(got)
				return
			}
			step(next)
		})
	}
	step(from)
}

func (s *Scheduler) settleRecovered(ctx actor.Context, found []uint64) {
	if len(found) == 0 {
		s.finishLoad(ctx)
		return
	}
	s.log.Info("batches found appended after a crash; recorded as fired", "count", len(found))
	for _, r := range found {
		s.busy[r] = struct{}{}
	}
	s.write(ctx, writeOp{events: [][]byte{firedEvent(found)}, done: func(_ int64, e *heraldpb.Error) {
		if e != nil {
			s.log.Warn("recording recovered fires; retrying", "err", e.Message)
			s.after(100*time.Millisecond, &settleRetry{found: found})
			return
		}
		for _, r := range found {
			s.pending.Remove(r)
			delete(s.busy, r)
		}
		s.finishLoad(ctx)
	}})
	s.flushWrites(ctx)
}

func (s *Scheduler) finishLoad(ctx actor.Context) {
	if s.loaded {
		return
	}
	s.loaded = true
	mPending.Set(float64(s.pending.GetCardinality()))
	s.log.Info("scheduler loaded", "pending", s.pending.GetCardinality(), "records", s.loadRecords,
		"took", time.Since(s.loadStart).Round(time.Millisecond))
	q := s.queue
	s.queue = nil
	for _, x := range q {
		s.onRequest(ctx, x.f, x.sender)
	}
	s.onTick(ctx)
	s.armCompact()
}

// ---- requests ------------------------------------------------------------

func (s *Scheduler) onRequest(ctx actor.Context, f *heraldpb.Frame, to *actor.PID) {
	switch b := f.Body.(type) {
	case *heraldpb.Frame_Produce:
		s.onSchedule(ctx, f, b.Produce, to)
	case *heraldpb.Frame_CancelScheduled:
		s.onCancel(ctx, f, b.CancelScheduled, to)
	case *heraldpb.Frame_ListScheduled:
		s.onList(ctx, f, b.ListScheduled, to)
	default:
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "the scheduler does not handle %T", f.Body)))
	}
}

func invalid(id uint64, format string, args ...any) *heraldpb.Frame {
	return heraldpb.ErrorFrame(id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, format, args...))
}

// onSchedule stores a delayed batch.
func (s *Scheduler) onSchedule(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.ProduceRequest, to *actor.PID) {
	now := s.now()
	// A retry gets its first attempt's answer, whatever became of its
	// topic since.
	key := dedupKey{req.ProducerId, req.BaseSequence}
	if key.pid != 0 {
		if d := s.dedup.lookup(key); d != nil {
			s.answerRetry(ctx, f, to, d)
			return
		}
	}
	at, part, n, e := s.checkDelayed(req, s.o.Topics.Get(req.Topic), now, s.o.MaxDelay)
	if e != nil {
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, e))
		return
	}
	if s.pending.GetCardinality()+uint64(s.queued) >= s.o.MaxPending {
		mRefused.WithLabelValues("max_pending").Inc()
		respond(ctx, to, throttled(f.Id, "the scheduler holds its maximum of pending delayed batches"))
		return
	}
	if s.queued >= s.o.MaxQueued {
		mRefused.WithLabelValues("queue_full").Inc()
		respond(ctx, to, throttled(f.Id, "the scheduler's write queue is full"))
		return
	}
	var de *dedupEntry
	if key.pid != 0 {
		// Its record goes after where __schedule ends now: truncation
		// stops there until the write's answer gives the exact offset.
		var end int64
		if e := s.o.Topics.Get(ScheduleTopic); e != nil {
			end = e.Stats[0].HighWatermark.Load()
		}
		de = &dedupEntry{state: dedupWriting, loc: end, created: now.UnixMilli()}
	}
	ev := &heraldpb.ScheduleEvent{Event: &heraldpb.ScheduleEvent_Schedule{Schedule: &heraldpb.ScheduledBatch{
		Topic: req.Topic, Partition: part, DeliverAtMs: at, CreatedMs: now.UnixMilli(), Count: uint32(n), Records: req.Records,
		ProducerId: key.pid, Sequence: key.seq,
	}}}
	raw, merr := proto.Marshal(ev)
	if merr != nil {
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "encoding: %v", merr)))
		return
	}
	if de != nil {
		s.dedup.add(key, de)
	}
	count := uint32(n)
	s.write(ctx, writeOp{events: [][]byte{raw}, client: true, done: func(base int64, werr *heraldpb.Error) {
		if werr != nil {
			switch {
			case de == nil:
			case werr.OutcomeUnknown:
				// In raft already when its partition stopped leading:
				// possibly stored all the same, so a retry must not
				// store it again. The scheduler moves with that
				// leadership, and the next one knows from the log.
				de.state = dedupUnknown
			default:
				s.dedup.forget(key, de) // refused before the log: a retry stores it
			}
			respond(ctx, to, heraldpb.ErrorFrame(f.Id, werr))
			return
		}
		ref := uint64(base)
		if de != nil {
			de.state, de.ref, de.part, de.at, de.count, de.loc = dedupStored, ref, part, at, count, base
		}
		s.pending.Add(ref)
		s.wheel.Add(timewheel.Entry{At: at, Ref: ref})
		s.armTimer()
		mScheduled.Inc()
		mPending.Set(float64(s.pending.GetCardinality()))
		respond(ctx, to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{
			Partition: part, BaseOffset: -1, Count: count, AppendTimeMs: now.UnixMilli(),
			ScheduleId: strconv.FormatUint(ref, 10), DeliverAtMs: at,
		}}})
	}})
	s.flushWrites(ctx)
}

// answerRetry answers a retry of an idempotent producer's delayed batch
// the scheduler knows (d): with the first attempt's answer once that is
// stored; to retry later while its write is in flight; and, when its
// write's outcome is unknown (its partition stopped leading with it in
// raft), to retry later too: the scheduler that loads __schedule next
// knows (this one reloads at once; the SDK's retries of a delayed batch
// end within 100 s, inside the window).
func (s *Scheduler) answerRetry(ctx actor.Context, f *heraldpb.Frame, to *actor.PID, d *dedupEntry) {
	switch d.state {
	case dedupStored:
		mDuplicates.WithLabelValues("stored").Inc()
		respond(ctx, to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{
			Partition: d.part, BaseOffset: -1, Count: d.count, AppendTimeMs: d.created,
			ScheduleId: strconv.FormatUint(d.ref, 10), DeliverAtMs: d.at,
		}}})
	case dedupWriting:
		mDuplicates.WithLabelValues("writing").Inc()
		respond(ctx, to, throttled(f.Id, "the first attempt of this delayed batch is being stored"))
	default:
		mDuplicates.WithLabelValues("unknown").Inc()
		e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "the first attempt of this delayed batch failed and may have been stored; the scheduler that takes over next will know")
		e.RetryAfterMs = 1000
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, e))
	}
}

func (s *Scheduler) onCancel(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.CancelScheduledRequest, to *actor.PID) {
	ref, e := s.cancelTarget(req.Id)
	if e != nil {
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, e))
		return
	}
	if req.Vhost != "" {
		s.checkVhost(ctx, f, req, to, ref)
		return
	}
	if s.queued >= s.o.MaxQueued {
		respond(ctx, to, throttled(f.Id, "the scheduler's write queue is full"))
		return
	}
	s.cancelling[ref] = 0
	ev, _ := proto.Marshal(&heraldpb.ScheduleEvent{Event: &heraldpb.ScheduleEvent_Cancel{Cancel: &heraldpb.ScheduleCancel{Ref: ref}}})
	s.write(ctx, writeOp{events: [][]byte{ev}, client: true, done: func(_ int64, werr *heraldpb.Error) {
		at := s.cancelling[ref]
		delete(s.cancelling, ref)
		if werr != nil {
			if at != 0 {
				s.wheel.Add(timewheel.Entry{At: at, Ref: ref}) // came due meanwhile: fire it after all
				s.armTimer()
			}
			respond(ctx, to, heraldpb.ErrorFrame(f.Id, werr))
			return
		}
		s.pending.Remove(ref)
		s.forgetMoved(ref)
		mCancelled.Inc()
		mPending.Set(float64(s.pending.GetCardinality()))
		respond(ctx, to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_CancelScheduledResponse{CancelScheduledResponse: &heraldpb.CancelScheduledResponse{}}})
	}})
	s.flushWrites(ctx)
}

// vhostChecked is checkVhost's answer: whether the batch a cancel names
// is of a topic of the cancel's vhost.
type vhostChecked struct {
	f   *heraldpb.Frame
	req *heraldpb.CancelScheduledRequest
	to  *actor.PID
	ok  bool
	err *heraldpb.Error
}

// checkVhost reads the batch at ref from __schedule (in a goroutine) and
// answers whether its topic is in req.Vhost: a client of one vhost cannot
// cancel another's delayed message by guessing its id. The cancel then
// runs again, checked (compaction may have moved the batch meanwhile).
func (s *Scheduler) checkVhost(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.CancelScheduledRequest, to *actor.PID, ref uint64) {
	e := s.o.Topics.Get(ScheduleTopic)
	if e == nil {
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "internal topic %s is missing", ScheduleTopic)))
		return
	}
	pid, sys, self := e.Partitions[0], ctx.ActorSystem(), ctx.Self()
	go func() {
		msg := &vhostChecked{f: f, req: req, to: to}
		res, err := sys.Root.RequestFuture(pid, &heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
			Topic: ScheduleTopic, Offset: int64(ref), MaxBytes: 1 << 20,
		}}}, 30*time.Second).Result()
		if err != nil {
			msg.err = heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "reading __schedule: %v", err)
			sys.Root.Send(self, msg)
			return
		}
		fr := res.(*heraldpb.Frame).GetFetchResponse()
		for _, b := range fr.GetBatches() {
			_ = heraldpb.ForEachRawRecord(b.Records, func(i int, rec []byte) bool {
				if uint64(b.BaseOffset+int64(i)) != ref {
					return true
				}
				if ev, err := decodeEvent(rec); err == nil && ev.GetSchedule() != nil {
					msg.ok = registry.InVhostOf(req.Vhost, ev.GetSchedule().Topic)
				}
				return false
			})
		}
		sys.Root.Send(self, msg)
	}()
}

// ---- writes to __schedule -------------------------------------------------

func (s *Scheduler) write(_ actor.Context, op writeOp) {
	s.wq = append(s.wq, op)
	if op.client {
		s.queued++
	}
	mWriteQueue.Set(float64(len(s.wq)))
}

// flushWrites sends the queued events as one batch unless a write is in
// flight; its answer sends the next.
func (s *Scheduler) flushWrites(ctx actor.Context) {
	if s.writing || len(s.wq) == 0 || s.sched == nil {
		return
	}
	var batch []byte
	size, n, events := 0, 0, 0
	for _, op := range s.wq {
		opSize := 0
		for _, ev := range op.events {
			opSize += len(ev) + 16
		}
		if n > 0 && size+opSize > s.o.WriteBytes {
			break
		}
		for _, ev := range op.events {
			batch = heraldpb.AppendValueRecord(batch, ev)
		}
		size += opSize
		events += len(op.events)
		n++
	}
	ops := s.wq[:n:n]
	s.wq = s.wq[n:]
	s.inflight = ops
	s.writing = true
	s.call(ctx, s.sched, &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: ScheduleTopic, Partition: proto.Uint32(0), Acks: heraldpb.Acks_ACKS_ALL, Records: batch,
	}}}, func(f *heraldpb.Frame) {
		s.writing = false
		s.inflight = nil
		pr := f.GetProduceResponse()
		var e *heraldpb.Error
		if pr == nil {
			e = f.GetError()
			if e == nil {
				e = heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "unexpected answer %T from __schedule", f.Body)
			}
			s.log.Warn("writing __schedule", "err", e.Message, "events", events)
		}
		base := int64(-1)
		if pr != nil {
			base = pr.BaseOffset
		}
		for _, op := range ops {
			if op.client {
				s.queued--
			}
			op.done(base, e)
			base += int64(len(op.events))
		}
		if e.GetOutcomeUnknown() && !s.reloading {
			// Its events may be in the log all the same (__schedule's
			// leader changed with them in raft, or its disk failed):
			// what this scheduler holds may lag its log, a batch stored
			// and not pending here. It starts again from the log (the
			// requests queued then are answered TIMEOUT, retriable), no
			// sooner than reloadMinAge after it started: a disk failing
			// every write must not restart it more often than its
			// supervisor allows (10 in 10 s, then it would stop).
			s.reloading = true
			s.log.Warn("a write to __schedule ended with its outcome unknown; reloading", "err", e.Message)
			s.after(max(0, reloadMinAge-time.Since(s.started)), &reloadTick{why: e.Message})
		}
		mWriteQueue.Set(float64(len(s.wq)))
		if e != nil && len(s.wq) > 0 {
			s.after(100*time.Millisecond, &retryWrite{})
			return
		}
		s.flushWrites(ctx)
	})
}

func firedEvent(refs []uint64) []byte {
	b, _ := proto.Marshal(&heraldpb.ScheduleEvent{Event: &heraldpb.ScheduleEvent_Fired{Fired: &heraldpb.ScheduleFired{Refs: refs}}})
	return b
}

// ---- compaction ----------------------------------------------------------

func (s *Scheduler) armCompact() {
	if !s.compactArmed {
		s.compactArmed = true
		s.after(s.o.CompactCheck, &compactTick{})
	}
}

// compact removes the records of __schedule below the oldest pending
// batch: every event there concerns batches that are done. (A batch that
// waits long keeps the records after it; they are removed once it fires.)
func (s *Scheduler) compact(ctx actor.Context) {
	e := s.o.Topics.Get(ScheduleTopic)
	if e == nil || !s.loaded {
		return // before the load, pending is not known: nothing may go
	}
	s.dedup.expire(s.now().UnixMilli())
	cut := s.dedup.cut(s.compactCut(e.Stats[0].HighWatermark.Load()))
	if cut <= e.Stats[0].StartOffset.Load() {
		s.maybeRewrite(ctx, e, cut)
		s.armCompact()
		return
	}
	ctx.Request(e.Partitions[0], &partition.DeleteBefore{Offset: cut})
}
