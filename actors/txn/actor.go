// Package txn is the transaction room: half (transactional) messages with
// check-back, in the RocketMQ model. Its actor, the transaction
// coordinator, keeps every half message in the internal `__txn` partition
// (raft-backed) until it is committed, then appends it to its topic (at
// its delivery time, for a delayed one), or discards it on rollback. A
// half nobody ends is checked back: the coordinator asks a live producer
// of the half's producer group (a connection that registered it) for the
// outcome, with backoff, and after the last check applies the half's
// policy (roll back, or keep it for a manual end).
//
// This file is the actor: Receive, loading and the writes to __txn;
// requests.go answers the requests, commit.go appends committed halves
// (exactly once, across crashes), check.go runs the check-backs and keeps
// the producer registrations. Its pure core is in state.go.
package txn

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	"github.com/heraldmq/herald/internal/dispatch"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"google.golang.org/protobuf/proto"
)

// Topic is the internal partition holding the coordinator's state.
const Topic = "__txn"

// ActorName is the coordinator actor's name.
const ActorName = "txn"

// Headers the coordinator adds to every record of a committed half it
// appends to the half's topic.
const (
	HeaderHalfID   = "herald-half-id"
	HeaderTxnToken = "herald-txn-token" // the commit's random token (recovery checks it)
)

// callTimeout bounds the wait for a partition's answer to a read or an
// append. A write to __txn is waited for longer: one that lands after the
// coordinator gave up would leave its state behind its log.
const (
	callTimeout  = 10 * time.Second
	writeTimeout = 60 * time.Second
)

// Props returns the coordinator's props. The internal topic Topic must
// exist before it starts.
func Props(o Options) *actor.Props {
	o.ensureDefaults()
	sh := &shared{}
	return actor.PropsFromProducer(func() actor.Actor {
		return &Coordinator{o: &o, sh: sh, log: o.Logger.With("component", "txn")}
	}, actor.WithDispatcher(dispatch.Shared()))
}

// shared is what one incarnation of the actor leaves the next (after a
// panic): its writes to __txn in flight. The next one loads __txn only
// once they are answered, so it sees every event the last one wrote.
type shared struct {
	writes []*actor.Future
}

func (s *shared) forget(f *actor.Future) {
	for i, w := range s.writes {
		if w == f {
			s.writes = append(s.writes[:i], s.writes[i+1:]...)
			return
		}
	}
}

// Coordinator is the transaction coordinator actor.
type Coordinator struct {
	o    *Options
	sh   *shared
	log  *slog.Logger
	self *actor.PID
	sys  *actor.ActorSystem
	dead bool // stopping or restarting: continuations of this incarnation do nothing

	loaded   bool
	loadedAt time.Time // (onephase.go)
	queue    []stashed // requests that arrived while loading
	// epoch is the term in which this node's replica of __txn was elected,
	// read when the coordinator loads: it stamps every append and fences
	// each partition before a recovery scan reads it (fence.go).
	epoch      uint64
	fenced     map[topicPart]*registry.Entry
	waitedLead bool               // logged that the load waits for the replica to lead
	resetting  map[topicPart]bool // partitions whose epoch onFenced is resetting

	state // the pending halves (state.go)

	loadNext, loadHW int64
	loadStart        time.Time
	loadRecords      int

	// writes to __txn: one in flight; the rest queue and go together
	wq       []writeOp
	inflight []writeOp // the write in flight
	writing  bool
	queued   int // client requests in wq

	producers     producers // check.go
	checking      int       // check-backs reading their half
	appending     int       // committed halves being appended
	checkTimerAt  int64
	checkTimerGen uint64
	dueTimerAt    int64
	dueTimerGen   uint64
	pendingChecks map[uint64]uint32 // counts to write (HalfChecks)
	// initing: transactional ids whose InitProducerId is being written.
	// Another one for the same id is answered THROTTLED until it is
	// applied: it would read the session the first one replaces.
	initing       map[string]bool
	compactArmed  bool
	txnSweepArmed bool
	openSweeping  bool                    // an open-transaction sweep is armed (markers.go)
	appenders     map[topicPart]*appender // commit.go
	routedHeld    int64                   // bytes of routed publishes' records held (routed.go)
}

type stashed struct {
	f      *heraldpb.Frame
	sender *actor.PID
}

// writeOp is one group of events for __txn; done gets the offset of its
// first event once the write is durable, or the error.
type writeOp struct {
	events [][]byte
	client bool
	done   func(base int64, e *heraldpb.Error)
}

// Timer and internal messages.
type (
	checkTick   struct{ gen uint64 }
	dueTick     struct{ gen uint64 }
	compactTick struct{}
	retryWrite  struct{}
	loadRetry   struct{}
	lapseTick   struct{}
	txnSweep    struct{}
	retryStep   struct{ fn func() }
)

// Receive is the coordinator's entry point.
func (c *Coordinator) Receive(ctx actor.Context) {
	m := ctx.Message()
	if t, ok := m.(*timed); ok {
		if t.to != c {
			return // an earlier incarnation's timer
		}
		m = t.msg
	}
	switch msg := m.(type) {
	case *actor.Started:
		c.self, c.sys = ctx.Self(), ctx.ActorSystem()
		c.state = newState()
		c.producers = newProducers()
		c.pendingChecks = map[uint64]uint32{}
		c.appenders = map[topicPart]*appender{}
		c.fenced = map[topicPart]*registry.Entry{}
		c.resetting = map[topicPart]bool{}
		c.loadStart = time.Now()
		c.waitOrphans(ctx)
	case *actor.Restarting, *actor.Stopping:
		c.dead = true
		// Requests waiting for a write get an answer: TIMEOUT, as the
		// write in flight may or may not have been stored.
		e := heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "the transaction coordinator restarted before the write finished; the request may or may not have taken effect")
		e.Retriable = true
		e.OutcomeUnknown = true
		for _, op := range append(c.inflight, c.wq...) {
			if op.client {
				op.done(-1, e)
			}
		}
		c.wq, c.inflight = nil, nil
		for _, x := range c.queue {
			respond(ctx, x.sender, heraldpb.ErrorFrame(x.f.Id, throttledErr("the transaction coordinator is stopping")))
		}
		c.queue = nil
		// Commits queued behind an append, and sessions waiting for one,
		// have no write in flight: the same answer.
		for _, m := range c.txns {
			for _, w := range append(m.waiters, m.initWaiters...) {
				respond(ctx, w.to, heraldpb.ErrorFrame(w.id, e))
			}
			m.waiters, m.initWaiters = nil, nil
		}
		mProducers.Set(0)
		mHalfPending.Set(0) // the next coordinator, here or elsewhere, counts its own
		mTxnOpen.Set(0)
		mTxnCommitting.Set(0)
		mStagedCache.Set(0)
		mTxnIDs.Set(0)
		mRoutedBytes.Set(0)
	case *loadRetry:
		c.load(ctx)
	case *retryStep:
		msg.fn()
	case *retryWrite:
		c.flushWrites(ctx)
	case *checkTick:
		if msg.gen == c.checkTimerGen {
			c.checkTimerAt = 0
			c.runChecks(ctx)
		}
	case *dueTick:
		if msg.gen == c.dueTimerGen {
			c.dueTimerAt = 0
			c.runDue(ctx)
		}
	case *lapseTick:
		c.lapseProducers(ctx)
	case *txnSweep:
		c.sweepTxns(ctx)
	case *openSweep:
		c.sweepOpen(ctx)
	case *compactTick:
		c.compactArmed = false
		c.compact(ctx)
	case *partition.DeleteBeforeResult:
		if msg.Err != nil {
			c.log.Error("compacting __txn", "err", msg.Err)
		}
		if c.loaded {
			c.armCompact()
		}
	case *actor.Terminated:
		c.producers.dropConn(msg.Who)
	case *heraldpb.Frame:
		if !c.loaded {
			if len(c.queue) >= c.o.MaxQueued {
				respond(ctx, ctx.Sender(), heraldpb.ErrorFrame(msg.Id, throttledErr("the transaction coordinator is still loading")))
				return
			}
			c.queue = append(c.queue, stashed{f: msg, sender: ctx.Sender()})
			return
		}
		c.onRequest(ctx, msg, ctx.Sender())
	}
}

func respond(ctx actor.Context, to *actor.PID, f *heraldpb.Frame) {
	if to != nil {
		ctx.Send(to, f)
	}
}

func throttledErr(why string) *heraldpb.Error {
	e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "%s", why)
	e.RetryAfterMs = 100
	return e
}

func (c *Coordinator) nowMs() int64 { return c.o.Now().UnixMilli() }

// after sends msg to the actor after d, tagged with this incarnation.
func (c *Coordinator) after(d time.Duration, msg any) {
	self, sys := c.self, c.sys
	time.AfterFunc(d, func() { sys.Root.Send(self, &timed{to: c, msg: msg}) })
}

// timed is a message the actor sent itself through after.
type timed struct {
	to  *Coordinator
	msg any
}

// request sends f to pid and runs fn on the actor with the answer (an
// error frame when none came within timeout); nothing runs once this
// incarnation is stopping or restarting.
func (c *Coordinator) request(ctx actor.Context, pid *actor.PID, f *heraldpb.Frame, timeout time.Duration, fn func(*heraldpb.Frame)) *actor.Future {
	fut := ctx.RequestFuture(pid, f, timeout)
	ctx.ReenterAfter(fut, func(res any, err error) {
		if c.dead {
			return
		}
		ans, ok := res.(*heraldpb.Frame)
		if err != nil || !ok {
			e := heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "no answer from %s: %v", pid.Id, err)
			e.Retriable = true
			ans = heraldpb.ErrorFrame(0, e)
		}
		fn(ans)
	})
	return fut
}

// ---- loading -------------------------------------------------------------

// waitOrphans waits for the writes a previous incarnation left in flight,
// then loads.
func (c *Coordinator) waitOrphans(ctx actor.Context) {
	for len(c.sh.writes) > 0 {
		f := c.sh.writes[0]
		c.sh.writes = c.sh.writes[1:]
		ctx.ReenterAfter(f, func(any, error) {
			if !c.dead {
				c.waitOrphans(ctx)
			}
		})
		return
	}
	c.load(ctx)
}

// load reads __txn from its start to the high watermark it had when the
// coordinator started: nothing else writes it.
func (c *Coordinator) load(ctx actor.Context) {
	e := c.o.Topics.Get(Topic)
	if e == nil {
		c.log.Error("internal topic is missing; retrying", "topic", Topic)
		c.after(time.Second, &loadRetry{})
		return
	}
	if c.epoch == 0 {
		if c.epoch = c.readEpoch(e); c.epoch == 0 {
			if !c.waitedLead {
				c.waitedLead = true
				c.log.Info("waiting for this node's replica of __txn to lead")
			}
			c.after(100*time.Millisecond, &loadRetry{})
			return
		}
	}
	if c.loadHW == 0 {
		c.loadHW = e.Stats[0].HighWatermark.Load()
		c.loadNext = e.Stats[0].StartOffset.Load()
	}
	if c.loadNext >= c.loadHW {
		c.recover(ctx)
		return
	}
	c.request(ctx, e.Partitions[0], &heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
		Topic: Topic, Offset: c.loadNext, MaxBytes: 4 << 20,
	}}}, callTimeout, func(f *heraldpb.Frame) {
		fr := f.GetFetchResponse()
		if fr == nil {
			if start := e.Stats[0].StartOffset.Load(); f.GetError().GetCode() == heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE && c.loadNext < start {
				c.loadNext = start // compacted meanwhile: only records of ended halves go
				c.load(ctx)
				return
			}
			c.log.Warn("reading __txn; retrying", "err", f.GetError().GetMessage())
			c.after(100*time.Millisecond, &loadRetry{})
			return
		}
		c.onLoaded(ctx, fr)
	})
}

func (c *Coordinator) onLoaded(ctx actor.Context, fr *heraldpb.FetchResponse) {
	c.loadNext = heraldpb.ForEachStoredRecord(fr.Batches, c.loadNext, func(off int64, rec []byte) {
		c.loadRecords++
		ev, err := decodeEvent(rec)
		if err != nil {
			c.log.Warn("skipping unreadable __txn record", "offset", off, "err", err)
			return
		}
		c.state.apply(uint64(off), ev, c.defaults)
		c.state.applyTxn(uint64(off), ev, c.nowMs())
	})
	if len(fr.Batches) == 0 {
		c.loadNext = max(c.loadNext, fr.LogStartOffset)
		if fr.HighWatermark <= c.loadNext {
			c.loadHW = c.loadNext
		}
	}
	c.load(ctx)
}

// defaults resolves a half's check settings against the broker's.
func (c *Coordinator) defaults(hs *heraldpb.HalfStored) (time.Duration, uint32, bool) {
	iv := c.o.CheckInterval
	if hs.CheckIntervalMs > 0 {
		iv = time.Duration(hs.CheckIntervalMs) * time.Millisecond
	}
	mc := c.o.MaxChecks
	if hs.MaxChecks > 0 {
		mc = hs.MaxChecks
	}
	return iv, mc, hs.OnExhausted == heraldpb.HalfExhaustedPolicy_HALF_EXHAUSTED_KEEP
}

// decodeEvent reads the TxnEvent in a __txn record.
func decodeEvent(rec []byte) (*heraldpb.TxnEvent, error) {
	var ev heraldpb.TxnEvent
	if err := heraldpb.UnmarshalRecordValue(rec, &ev); err != nil {
		return nil, err
	}
	return &ev, nil
}

// finishLoad starts serving: the halves' timers are armed, and the
// requests that waited are answered.
func (c *Coordinator) finishLoad(ctx actor.Context) {
	if c.loaded {
		return
	}
	c.loaded, c.loadedAt = true, c.o.Now()
	c.armOpenSweep()
	now := c.nowMs()
	for _, h := range c.halves {
		switch h.state {
		case statePending:
			// Checks resume where they were, the next one an interval
			// from now at the earliest.
			h.nextCheck = max(h.created+h.interval.Milliseconds(), now+h.interval.Milliseconds())
			if h.checks == 0 {
				h.nextCheck = max(h.created+h.interval.Milliseconds(), now)
			}
			c.checkQ.add(h.nextCheck, h.ref)
		case stateCommitted:
			c.dueQ.add(h.deliverAt, h.ref)
		}
	}
	mHalfPending.Set(float64(len(c.halves)))
	mTxnIDs.Set(float64(len(c.txns)))
	c.gaugeOpen()
	c.log.Info("transaction coordinator loaded", "halves", len(c.halves), "transactional_ids", len(c.txns), "records", c.loadRecords,
		"took", time.Since(c.loadStart).Round(time.Millisecond))
	q := c.queue
	c.queue = nil
	for _, x := range q {
		c.onRequest(ctx, x.f, x.sender)
	}
	c.armChecks()
	c.runDue(ctx)
	c.armCompact()
	c.recoverRouted(ctx)
	for _, m := range c.txns {
		// Oldest first, each after the one before (a replay may hold more
		// than one: a crash between an append and its TxnComplete, twice).
		c.recoverJobs(ctx, m)
		if m.state == txnOpen {
			c.armTxnTimeouts()
		}
	}
	c.after(c.o.Heartbeat, &lapseTick{})
}

// ---- writes to __txn -----------------------------------------------------

func (c *Coordinator) write(op writeOp) {
	c.wq = append(c.wq, op)
	if op.client {
		c.queued++
	}
	mWriteQueue.Set(float64(len(c.wq)))
}

// flushWrites sends the queued events as one batch unless a write is in
// flight; its answer sends the next.
func (c *Coordinator) flushWrites(ctx actor.Context) {
	e := c.o.Topics.Get(Topic)
	if c.writing || len(c.wq) == 0 || e == nil {
		return
	}
	if c.o.holdWrites != nil && c.o.holdWrites() {
		c.after(5*time.Millisecond, &retryWrite{})
		return
	}
	var batch []byte
	size, n := 0, 0
	for _, op := range c.wq {
		opSize := 0
		for _, ev := range op.events {
			opSize += len(ev) + 16
		}
		if n > 0 && size+opSize > c.o.WriteBytes {
			break
		}
		for _, ev := range op.events {
			batch = heraldpb.AppendValueRecord(batch, ev)
		}
		size += opSize
		n++
	}
	ops := c.wq[:n:n]
	c.wq = c.wq[n:]
	c.writing = true
	c.inflight = ops
	var fut *actor.Future
	fut = c.request(ctx, e.Partitions[0], &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: Topic, Partition: proto.Uint32(0), Acks: heraldpb.Acks_ACKS_ALL, Records: batch,
	}}}, writeTimeout, func(f *heraldpb.Frame) {
		c.sh.forget(fut)
		c.writing = false
		c.inflight = nil
		pr := f.GetProduceResponse()
		var err *heraldpb.Error
		base := int64(-1)
		if pr != nil {
			base = pr.BaseOffset
		} else {
			err = f.GetError()
			if err == nil {
				err = heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "unexpected answer %T from __txn", f.Body)
			}
			c.log.Warn("writing __txn", "err", err.Message)
		}
		for _, op := range ops {
			if op.client {
				c.queued--
			}
			op.done(base, err)
			if base >= 0 {
				base += int64(len(op.events))
			}
		}
		mWriteQueue.Set(float64(len(c.wq)))
		if err != nil && (err.OutcomeUnknown || err.Code == heraldpb.ErrorCode_TIMEOUT) {
			// The batch may have been stored all the same: what this
			// coordinator holds in memory may now differ from __txn (a
			// commit decision it answered as failed, which a retry would
			// decide again with another token). It starts again and
			// loads __txn, which is the truth.
			panic(fmt.Sprintf("txn: a write to __txn of unknown outcome (%s): reloading", err.Message))
		}
		if err != nil && len(c.wq) > 0 {
			c.after(100*time.Millisecond, &retryWrite{})
			return
		}
		c.flushWrites(ctx)
	})
	c.sh.writes = append(c.sh.writes, fut)
}

func event(ev *heraldpb.TxnEvent) []byte {
	b, _ := proto.Marshal(ev)
	return b
}

// ---- compaction ----------------------------------------------------------

func (c *Coordinator) armCompact() {
	if !c.compactArmed {
		c.compactArmed = true
		c.after(c.o.CompactCheck, &compactTick{})
	}
}

// compact removes the records of __txn below what the state still needs
// (compactCut), once the sessions whose record would go are written again.
func (c *Coordinator) compact(ctx actor.Context) {
	e := c.o.Topics.Get(Topic)
	if e == nil || !c.loaded {
		return
	}
	cut := e.Stats[0].HighWatermark.Load()
	if c.writing || len(c.wq) > 0 {
		c.armCompact() // a write in flight may still name a half below the cut
		return
	}
	cut = c.state.compactCut(cut)
	start := e.Stats[0].StartOffset.Load()
	if cut <= start {
		c.armCompact()
		return
	}
	// The records of idle transactional ids and idempotent publishers
	// (the state a replay needs of them) are kept, or written again at the
	// log's end so that what lies around them can go. The cut first goes
	// for free to the oldest of them; once the log starts there, they are
	// written again only when at least twice as many records as that
	// would go (so an idle log is not rewritten round after round, and
	// each rewrite pays for itself); those idle long enough are forgotten
	// instead.
	idle := c.state.idleOffsets(cut)
	if len(idle) > 0 && idle[0] > start {
		ctx.Request(e.Partitions[0], &partition.DeleteBefore{Offset: idle[0]})
		return
	}
	if len(idle) > 0 && cut-start < 2*int64(len(idle)) {
		c.armCompact()
		return
	}
	var snaps [][]byte
	metas := c.state.sessionsBelow(cut, c.nowMs())
	for _, m := range metas {
		snaps = append(snaps, event(m.snapshotEvent()))
	}
	mTxnIDs.Set(float64(len(c.txns)))
	pubs, pubEv := c.state.publishersBelow(cut, c.nowMs())
	if pubEv != nil {
		snaps = append(snaps, event(pubEv))
	}
	if len(snaps) > 0 {
		c.write(writeOp{events: snaps, done: func(base int64, err *heraldpb.Error) {
			if err == nil {
				for i, m := range metas {
					if !m.busy() {
						m.lastOff = uint64(base) + uint64(i)
						m.sessOff = m.lastOff
					}
				}
				for _, p := range pubs {
					p.off = max(p.off, uint64(base)+uint64(len(metas)))
				}
			}
			c.armCompact()
		}})
		c.flushWrites(ctx)
		return
	}
	if cut <= start {
		c.armCompact()
		return
	}
	ctx.Request(e.Partitions[0], &partition.DeleteBefore{Offset: cut})
}

// idleOffsets is the offsets, below cut, of the records idle
// transactional ids and idempotent publishers need kept (their newest
// session record or sequences), sorted and each once.
func (st *state) idleOffsets(cut int64) []int64 {
	set := map[int64]bool{}
	for _, m := range st.txns {
		if !m.busy() && int64(m.sessOff) < cut {
			set[int64(m.sessOff)] = true
		}
	}
	for _, p := range st.publishers {
		if int64(p.off) < cut {
			set[int64(p.off)] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// compactCut lowers cut (the high watermark) to the oldest record of __txn
// that a replay still needs: pending halves, staged batches, and the
// session record of every id with a transaction open, being decided or
// appending (and each appending commit's own).
func (st *state) compactCut(cut int64) int64 {
	for ref := range st.halves {
		cut = min(cut, int64(ref))
	}
	for ref := range st.routed {
		cut = min(cut, int64(ref))
	}
	for _, m := range st.txns {
		if len(m.staged) > 0 {
			cut = min(cut, int64(m.staged[0].ref))
		}
		for _, j := range m.completing {
			// A replay needs its session record, staged batches and
			// decision until its TxnComplete.
			cut = min(cut, int64(j.sessOff))
			if len(j.staged) > 0 {
				cut = min(cut, int64(j.staged[0].ref))
			}
		}
		if m.state != txnEmpty || m.deciding {
			// Without its session record a reload would not know the id,
			// and would ignore the staged batches and the decision.
			cut = min(cut, int64(m.sessOff))
		}
	}
	return cut
}

// sessionsBelow returns the idle ids whose session record (the Init a
// replay needs to know them) is below cut, to be written again before
// the cut; ids idle past txnIDExpiry are forgotten instead. Newer events
// of an id (a TxnComplete) do not count: they cannot make it known.
func (st *state) sessionsBelow(cut, nowMs int64) []*txnMeta {
	var out []*txnMeta
	expire := nowMs - txnIDExpiry.Milliseconds()
	for id, m := range st.txns {
		if m.busy() || int64(m.sessOff) >= cut {
			continue
		}
		if m.used < expire {
			delete(st.txns, id)
			continue
		}
		out = append(out, m)
	}
	return out
}
