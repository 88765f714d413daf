package scheduler

// Firing: due batches read, announced and appended in rounds, their fires recorded; the list of pending batches.

import (
	"cmp"
	"container/heap"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/RoaringBitmap/roaring/v2/roaring64"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"github.com/heraldmq/herald/timewheel"
	"google.golang.org/protobuf/proto"
)

// fireRound is one round of due batches: read from __schedule and
// announced (ScheduleFiring) ahead of their time, then appended to their
// partitions at their time.
type fireRound struct {
	owner   *Scheduler // the incarnation that started it
	token   uint64     // random: its appended records carry it
	entries []timewheel.Entry
	missing []uint64          // refs not yet read, ascending
	raw     map[uint64][]byte // records read (nil: missing from the log)
	built   bool              // chunks built (off the actor's goroutine)
	batches map[uint64]*heraldpb.ScheduledBatch
	chunks  []*fireChunk
	unsent  int      // chunks not yet appended (or dropped)
	done    []uint64 // appended or dropped
}

// fireChunk is one append: batches of a round due in the same millisecond
// for one partition, concatenated (encoded RecordBatches concatenate).
type fireChunk struct {
	round    *fireRound
	at       int64    // the latest time of its batches: never appended before it
	ids      []uint64 // the ids in its records' herald-schedule-id (refs, or the originals of moved ones)
	from     int64    // where its partition's log ended when it was announced
	retrying bool     // its group is counted in Scheduler.retrying
	entry    *registry.Entry
	part     uint32
	refs     []uint64
	ats      []int64
	records  []byte
	nrecs    int64 // the records in records
	backoff  time.Duration
	// Of a group's first chunk, once the group is sent: its appender, the
	// group, its producer id, the sequence of its first record, its record
	// count, and whether it waits for an earlier append.
	app     *appender
	group   []*fireChunk
	pid     uint64
	seq     int64
	count   int64
	blocked bool
}

type (
	roundBuilt   struct{ r *fireRound }
	sendTick     struct{ gen uint64 }
	resendChunks struct{ cs []*fireChunk }
	retryFiring  struct{ round *fireRound }
	retryFired   struct{}
	retryRead    struct{ round *fireRound }
)

// armTimer arms one timer for Lead before the wheel's next time, unless
// one is armed for that time or earlier.
func (s *Scheduler) armTimer() {
	mNear.Set(float64(s.wheel.Near()))
	mFar.Set(float64(s.wheel.Len() - s.wheel.Near()))
	if !s.loaded {
		return
	}
	next, ok := s.wheel.NextAt()
	if !ok {
		return
	}
	at := next - s.o.Lead.Milliseconds()
	if s.timerAt != 0 && s.timerAt <= at {
		return
	}
	s.timerGen++
	s.timerAt = at
	gen := s.timerGen
	s.after(max(time.UnixMilli(at).Sub(s.now()), 0), &fireTick{gen: gen})
}

// onTick moves the wheel to now + Lead and starts rounds with what is due
// by then.
func (s *Scheduler) onTick(ctx actor.Context) {
	before := len(s.dueQ)
	s.dueQ = s.wheel.Advance(s.nowMs()+s.o.Lead.Milliseconds(), s.dueQ)
	if d, ok := s.far.(*timewheel.DiskFar); ok {
		st := d.Stats()
		mFarBuffered.Set(float64(st.Buffered))
		mFarFiles.Set(float64(st.Files))
		if st.ReadErrors > 0 {
			// Timers of a bucket that could not be read would never fire:
			// restart, rebuilding the index from __schedule.
			s.log.Error("the far timer store lost timers; the scheduler restarts to rebuild it from __schedule", "err", d.Err())
			panic(fmt.Sprintf("scheduler: far store read failed: %v", d.Err()))
		}
	}
	s.dueQ = append(s.dueQ[:before], s.keepDue(s.dueQ[before:])...)
	mDue.Set(float64(len(s.dueQ)))
	s.startRounds(ctx)
	s.armTimer()
}

// maxRetrying bounds the batches held for appends being retried.
const maxRetrying = 65536

// startRounds starts rounds with the due batches while fewer than
// MaxRounds are in progress.
func (s *Scheduler) startRounds(ctx actor.Context) {
	// Appends a partition keeps refusing are retried with their records in
	// memory: past maxRetrying batches, no new rounds start (the due ones
	// wait in the wheel's order, 16 bytes each) until they get through.
	for s.rounds < s.o.MaxRounds && len(s.dueQ) > 0 && s.retrying < maxRetrying && s.heldBytes < s.o.MaxHeldBytes {
		r := &fireRound{owner: s, raw: map[uint64][]byte{}, token: randomToken()}
		var n int
		r.entries, n = s.takeRound(s.dueQ, s.o.FireBatch)
		s.dueQ = s.dueQ[n:] // not slices.Delete: that copies the rest, per round
		if len(r.entries) > 0 {
			s.rounds++
			s.readRound(ctx, r)
		}
	}
	mDue.Set(float64(len(s.dueQ)))
}

// readRound reads the round's batches from __schedule: from the read
// cache (the last megabyte fetched) where it can, else one fetch from the
// smallest ref not yet read, which then becomes the cache. Refs are
// mostly in time order, so consecutive rounds read consecutive stretches
// and one fetch serves several rounds.
func (s *Scheduler) readRound(ctx actor.Context, r *fireRound) {
	if r.missing == nil {
		for _, e := range r.entries {
			r.missing = append(r.missing, e.Ref)
		}
		slices.Sort(r.missing)
		r.missing = slices.Compact(r.missing)
	}
	takeCached(s.rcache, r)
	if len(r.missing) == 0 {
		s.writeFiring(ctx, r)
		return
	}
	next := r.missing[0]
	s.call(ctx, s.sched, &heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
		Topic: ScheduleTopic, Offset: int64(next), MaxBytes: 1 << 20,
	}}}, func(f *heraldpb.Frame) {
		fr := f.GetFetchResponse()
		if fr == nil && f.GetError().GetCode() != heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE {
			s.log.Warn("reading due batches from __schedule; retrying", "err", f.GetError().GetMessage())
			s.after(100*time.Millisecond, &retryRead{round: r})
			return
		}
		s.rcache = fr.GetBatches()
		takeCached(s.rcache, r)
		if len(r.missing) > 0 && r.missing[0] == next {
			// The fetch did not reach it: below the log start or past the
			// end, which a pending batch never is. Drop it, loudly.
			s.log.Error("delayed batch missing from __schedule; dropped", "id", next)
			r.raw[next] = nil
			r.missing = r.missing[1:]
			mDropped.WithLabelValues("unreadable").Inc()
		}
		s.readRound(ctx, r)
	})
}

// writeFiring announces the round's appends, then holds them for their
// time.
func (s *Scheduler) writeFiring(ctx actor.Context, r *fireRound) {
	if !r.built {
		// Decoding thousands of batches and tagging their records takes
		// milliseconds: off the actor's goroutine, so that sends due
		// meanwhile are not held up behind it.
		self, sys := s.self, s.sys
		go func() {
			s.buildRound(r)
			sys.Root.Send(self, &roundBuilt{r: r})
		}()
		return
	}
	intents := make([]*heraldpb.FireIntent, 0, len(r.chunks))
	for _, c := range r.chunks {
		c.from = c.entry.Stats[c.part].HighWatermark.Load()
		intents = append(intents, &heraldpb.FireIntent{Refs: c.refs, Topic: c.entry.Name, Partition: c.part, FromOffset: c.from, Token: r.token})
	}
	if len(intents) == 0 {
		s.rounds--
		s.finishRound(ctx, r)
		return
	}
	ev, _ := proto.Marshal(&heraldpb.ScheduleEvent{Event: &heraldpb.ScheduleEvent_Firing{Firing: &heraldpb.ScheduleFiring{Intents: intents}}})
	s.write(ctx, writeOp{events: [][]byte{ev}, done: func(_ int64, e *heraldpb.Error) {
		if e != nil {
			s.after(100*time.Millisecond, &retryFiring{round: r})
			return
		}
		// Announced: the appends wait in hold for their time, and the
		// round's slot goes to the next round at once (holding it until
		// the last append would make the next due batches wait for it).
		s.rounds--
		for _, c := range r.chunks {
			i, _ := slices.BinarySearchFunc(s.hold, c.at, func(h *fireChunk, at int64) int { return cmp.Compare(h.at, at+1) })
			s.hold = slices.Insert(s.hold, i, c)
			s.heldBytes += len(c.records)
		}
		mHeldBytes.Set(float64(s.heldBytes))
		s.sendDue(ctx)
		s.startRounds(ctx)
	}})
	s.flushWrites(ctx)
}

// buildRound decodes the round's records and groups its batches into
// appends: consecutive batches due in the same millisecond for the same
// partition. It runs on its own goroutine and touches only r and what is
// safe to share (the topic registry, the logger, metrics).
func (s *Scheduler) buildRound(r *fireRound) {
	r.batches = make(map[uint64]*heraldpb.ScheduledBatch, len(r.raw))
	for ref, rec := range r.raw {
		if rec == nil {
			continue
		}
		ev, err := decodeEvent(rec)
		sb := ev.GetSchedule()
		if err != nil || sb == nil {
			s.log.Error("unreadable delayed batch in __schedule; dropped", "id", ref, "err", err)
			mDropped.WithLabelValues("unreadable").Inc()
			continue
		}
		r.batches[ref] = sb
	}
	r.raw = nil
	// The round's entries are in time order; those due in the same
	// millisecond for the same partition share a chunk (one append), in
	// entry order, however the partitions interleave.
	type chunkKey struct {
		e    *registry.Entry
		part uint32
	}
	open := map[chunkKey]*fireChunk{}
	openAt := int64(math.MinInt64)
	token := tokenText(r.token)
	var extra, recs []byte // reused: each record's headers, each batch with them
	for _, e := range r.entries {
		b := r.batches[e.Ref]
		if b == nil {
			r.done = append(r.done, e.Ref)
			continue
		}
		te := s.o.Topics.Get(b.Topic)
		if te == nil || int(b.Partition) >= len(te.Partitions) {
			s.log.Warn("the topic of a delayed batch is gone; dropped", "id", e.Ref, "topic", b.Topic, "partition", b.Partition)
			mDropped.WithLabelValues("topic_gone").Inc()
			r.done = append(r.done, e.Ref)
			continue
		}
		id := e.Ref
		if b.Id != nil {
			id = b.GetId() // a copy compaction moved: users know the original id
		}
		extra = heraldpb.EncodeHeaders(extra[:0],
			[2]string{HeaderScheduleID, strconv.FormatUint(id, 10)}, [2]string{HeaderDeliverAt, strconv.FormatInt(b.DeliverAtMs, 10)},
			[2]string{HeaderFireToken, token})
		var err error
		recs, err = heraldpb.AppendBatchWithHeaders(recs[:0], b.Records, extra)
		if err != nil {
			s.log.Error("unreadable delayed batch; dropped", "id", e.Ref, "err", err)
			mDropped.WithLabelValues("unreadable").Inc()
			r.done = append(r.done, e.Ref)
			continue
		}
		limit := int(te.Config.GetMaxMessageBytes())
		if limit == 0 {
			limit = 1 << 20
		}
		if e.At != openAt {
			clear(open)
			openAt = e.At
		}
		k := chunkKey{te, b.Partition}
		cur := open[k]
		if cur == nil || len(cur.records)+len(recs) > limit {
			cur = &fireChunk{round: r, at: e.At, entry: te, part: b.Partition, backoff: 50 * time.Millisecond}
			r.chunks = append(r.chunks, cur)
			open[k] = cur
		}
		cur.refs = append(cur.refs, e.Ref)
		cur.ids = append(cur.ids, id)
		cur.ats = append(cur.ats, b.DeliverAtMs)
		cur.records = append(cur.records, recs...)
		n := int64(b.Count)
		if n == 0 { // (a record from before count was written)
			info, _ := heraldpb.ScanBatch(b.Records) // (read by AppendBatchWithHeaders: valid)
			n = int64(info.Count)
		}
		cur.nrecs += n
	}
	r.unsent = len(r.chunks)
	r.batches = nil // the chunks hold what is needed
	r.built = true
}

// sendDue appends the held chunks whose time is less than AppendAhead
// away and arms a timer for the next.
func (s *Scheduler) sendDue(ctx actor.Context) {
	ahead := s.o.AppendAhead.Milliseconds()
	now := s.nowMs()
	n := 0
	for n < len(s.hold) && s.hold[n].at-ahead <= now {
		n++
	}
	s.sendChunks(ctx, s.hold[:n]) // (their bytes count as held until sent)
	clear(s.hold[:n])
	s.hold = s.hold[n:]
	if n > 0 && len(s.dueQ) > 0 {
		s.startRounds(ctx) // sends freed room for rounds
	}
	if len(s.hold) == 0 {
		return
	}
	at := s.hold[0].at - ahead
	if s.sendAt != 0 && s.sendAt <= at {
		return
	}
	s.sendGen++
	s.sendAt = at
	s.after(max(time.UnixMilli(at).Sub(s.now()), 0), &sendTick{gen: s.sendGen})
}

// sendGroup appends chunks of one partition in one request; a retriable
// refusal sends them again later.
func (s *Scheduler) sendGroup(ctx actor.Context, g []*fireChunk) {
	c0 := g[0]
	recs := c0.records
	if len(g) > 1 {
		recs = make([]byte, 0, groupBytes(g))
		for _, c := range g {
			recs = append(recs, c.records...)
		}
	}
	req := &heraldpb.ProduceRequest{Topic: c0.entry.Name, Partition: proto.Uint32(c0.part), Acks: heraldpb.Acks_ACKS_ALL, Records: recs,
		ProducerId: c0.pid, BaseSequence: c0.seq, SingleInFlight: true} // (see appender)
	pid := c0.pid
	if s.epoch != 0 { // (0: Options.NoFence)
		// Stamped with the epoch: a successor's fence refuses it (fence.go).
		req.TxnEpoch, req.Fencer = s.epoch, heraldpb.Fencer_FENCER_SCHEDULER
	}
	if s.o.AppendAhead > 0 {
		// Readable from the latest time of its chunks on, by the
		// scheduler's time: the partition holds it for the rest of that
		// time from when it gets the request, on its own clock, so that
		// no offset between the two clocks makes one early
		// (partition/hold.go). It claims no clock id, not even to the
		// partitions of its own node, which would then hold it until
		// not_before_ms by their wall clock alone: once that clock has
		// stepped forward it is ahead of the scheduler's time (now), and
		// would release the batch early. hold_us is a duration, which no
		// step moves; it counts the request's trip to the partition too.
		var at int64
		for _, c := range g {
			at = max(at, c.at)
		}
		partition.HoldRequest(req, at, s.now(), 0)
	}
	s.call(ctx, s.o.Topics.Current(c0.entry).Writer(int(c0.part)), &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: req}}, func(f *heraldpb.Frame) {
		e := f.GetError()
		resp := f.GetProduceResponse()
		ok := resp != nil
		switch {
		case ok:
		case !registry.Same(s.o.Topics.Get(c0.entry.Name), c0.entry):
			e = heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q was deleted", c0.entry.Name)
		case e.GetCode() == heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE:
			s.outOfSequence(ctx, g, pid, e)
			return
		case retriable(e):
			if e.GetCode() == heraldpb.ErrorCode_PRODUCER_FENCED {
				s.onFenced(ctx, c0.entry, c0.part, e) // retried below, refused until this scheduler stops or resets the epoch
			}
			// An error does not prove the append failed (a partition that
			// restarts answers its pending proposals with one, and may
			// commit them on reopening): look for it before sending again.
			s.verifyThenResend(ctx, g, false)
			return
		}
		s.settleGroup(ctx, g, ok, e, resp.GetCommitTimeUs())
	})
}

// verifyThenResend looks for the group's append on its partition, from
// where the log ended when it was announced; one append is all or
// nothing, so one ref found means it landed. Otherwise it sends it again
// after a backoff, with the same producer id and sequence (the partition
// answers it with the outcome of an attempt still on its way), or, when
// the partition refused the sequence of the oldest open append (newPid),
// under a new producer id.
func (s *Scheduler) verifyThenResend(ctx actor.Context, g []*fireChunk, newPid bool) {
	c0 := g[0]
	if !c0.retrying {
		c0.retrying = true
		s.retrying += groupRefs(g)
	}
	want := map[string]uint64{fireKey(c0.ids[0], c0.round.token): c0.refs[0]}
	s.scanFor(ctx, c0.entry, c0.part, c0.from, want, func(got []uint64) {
		if len(got) > 0 {
			s.settleGroup(ctx, g, true, nil, 0)
			return
		}
		if a := c0.app; newPid && a != nil && a.oldest() == c0 {
			s.renewProducer(c0)
		}
		s.after(c0.backoff, &resendChunks{cs: g})
		c0.backoff = min(2*c0.backoff, 2*time.Second)
	})
}

// settleGroup records the outcome of a group's append: appended (ok),
// committed at commitUs (the partition's clock, µs; 0: unknown, now), or
// given up with e.
func (s *Scheduler) settleGroup(ctx actor.Context, g []*fireChunk, ok bool, e *heraldpb.Error, commitUs int64) {
	if g[0].retrying {
		s.retrying -= groupRefs(g)
	}
	if commitUs == 0 {
		commitUs = s.now().UnixMicro()
	}
	for _, c := range g {
		switch {
		case ok:
			for _, at := range c.ats {
				mLateness.Observe(float64(max(commitUs-at*1000, 0)) / 1e6)
			}
			mFired.Add(float64(len(c.refs)))
		case e.GetCode() == heraldpb.ErrorCode_TOPIC_NOT_FOUND || e.GetCode() == heraldpb.ErrorCode_PARTITION_NOT_FOUND:
			s.log.Warn("the topic of delayed batches is gone; dropped", "topic", c.entry.Name, "partition", c.part, "batches", len(c.refs))
			mDropped.WithLabelValues("topic_gone").Add(float64(len(c.refs)))
		default:
			s.log.Warn("a topic refused delayed batches; dropped", "topic", c.entry.Name, "partition", c.part, "batches", len(c.refs), "err", e.GetMessage())
			mDropped.WithLabelValues("refused").Add(float64(len(c.refs)))
		}
		r := c.round
		r.done = append(r.done, c.refs...)
		c.records = nil
		r.unsent--
		if r.unsent == 0 {
			if s.o.crashAfterAppend != nil && s.o.crashAfterAppend() {
				panic("scheduler: injected crash between append and fire record")
			}
			s.finishRound(ctx, r)
		}
	}
	s.appendSettled(ctx, g, ok)
}

func (s *Scheduler) finishRound(ctx actor.Context, r *fireRound) {
	s.firedPrev = append(s.firedPrev, r.done...)
	s.writeFired(ctx)
	s.startRounds(ctx)
}

// writeFired records the fires not yet written, in one write queued with
// whatever else goes to __schedule next.
func (s *Scheduler) writeFired(ctx actor.Context) {
	if s.firedWrite || len(s.firedPrev) == 0 {
		return
	}
	prev := s.firedPrev
	s.firedPrev = nil
	s.firedWrite = true
	s.write(ctx, writeOp{events: [][]byte{firedEvent(prev)}, done: func(_ int64, e *heraldpb.Error) {
		if e != nil {
			s.firedPrev = append(prev, s.firedPrev...)
			s.after(100*time.Millisecond, &retryFired{})
			return
		}
		s.firedWrite = false
		s.settleFired(prev)
		s.writeFired(ctx)
	}})
	s.flushWrites(ctx)
}

// settleFired forgets batches whose fire is durable.
func (s *Scheduler) settleFired(refs []uint64) {
	for _, r := range refs {
		s.pending.Remove(r)
		delete(s.busy, r)
		s.forgetMoved(r)
	}
	mPending.Set(float64(s.pending.GetCardinality()))
}

// ---- list ----------------------------------------------------------------

// maxListing bounds concurrent list scans.
const maxListing = 2

// onList answers ListScheduled by reading __schedule in a goroutine
// against a snapshot of the pending set: the earliest `limit` pending
// batches (of the topic, if named). Its cost is a read of __schedule.
func (s *Scheduler) onList(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.ListScheduledRequest, to *actor.PID) {
	limit := int(req.Limit)
	if limit == 0 {
		limit = 100
	}
	if limit > 10000 {
		respond(ctx, to, invalid(f.Id, "limit %d is above 10000", limit))
		return
	}
	if s.listing >= maxListing {
		respond(ctx, to, throttled(f.Id, "list scans are running"))
		return
	}
	e := s.o.Topics.Get(ScheduleTopic)
	if e == nil {
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "internal topic %s is missing", ScheduleTopic)))
		return
	}
	s.listing++
	snap := s.pending.Clone()
	for r := range s.busy {
		snap.Remove(r)
	}
	for r := range s.cancelling {
		snap.Remove(r)
	}
	from, hw := e.Stats[0].StartOffset.Load(), e.Stats[0].HighWatermark.Load()
	pid, sys, self, st, inc := e.Partitions[0], ctx.ActorSystem(), ctx.Self(), e.Stats[0], s.inc
	go func() {
		resp, err := scanPending(sys, pid, snap, from, hw, st.StartOffset.Load, req.Topic, limit)
		sys.Root.Send(self, &listFinished{inc: inc, to: to, f: f, resp: resp, err: err})
	}()
}

// scanPending reads __schedule [from, hw) and keeps the `limit` earliest
// pending batches.
func scanPending(sys *actor.ActorSystem, pid *actor.PID, pending *roaring64.Bitmap, from, hw int64, start func() int64, topicName string, limit int) (*heraldpb.ListScheduledResponse, *heraldpb.Error) {
	h := &infoHeap{}
	for off := from; off < hw; {
		res, err := sys.Root.RequestFuture(pid, &heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
			Topic: ScheduleTopic, Offset: off, MaxBytes: 4 << 20,
		}}}, 30*time.Second).Result()
		if err != nil {
			return nil, heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "reading __schedule: %v", err)
		}
		f, _ := res.(*heraldpb.Frame)
		fr := f.GetFetchResponse()
		if fr == nil {
			if f.GetError().GetCode() == heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE && off < hw {
				// Compacted meanwhile (what was below is done): on from
				// the log's start as the partition has it (its published
				// Stats may not show the truncation yet).
				ls := start()
				if res, err := sys.Root.RequestFuture(pid, &heraldpb.Frame{Body: &heraldpb.Frame_ListOffsets{ListOffsets: &heraldpb.ListOffsetsRequest{
					Topic: ScheduleTopic, Spec: heraldpb.OffsetSpec_OFFSET_SPEC_EARLIEST,
				}}}, 30*time.Second).Result(); err == nil {
					if lr := res.(*heraldpb.Frame).GetListOffsetsResponse(); lr != nil {
						ls = max(ls, lr.LogStartOffset)
					}
				}
				if off < ls {
					off = ls
					continue
				}
			}
			return nil, f.GetError()
		}
		next := off
		for _, b := range fr.Batches {
			next = max(next, b.BaseOffset+int64(b.Count))
			_ = heraldpb.ForEachRawRecord(b.Records, func(i int, rec []byte) bool {
				ref := uint64(b.BaseOffset + int64(i))
				if int64(ref) < off || !pending.Contains(ref) {
					return true
				}
				ev, err := decodeEvent(rec)
				sb := ev.GetSchedule()
				if err != nil || sb == nil || topicName != "" && sb.Topic != topicName {
					return true
				}
				id := ref
				if sb.Id != nil {
					id = sb.GetId()
				}
				heap.Push(h, &heraldpb.ScheduledInfo{Id: strconv.FormatUint(id, 10), Topic: sb.Topic, Partition: sb.Partition,
					DeliverAtMs: sb.DeliverAtMs, Count: sb.Count, Bytes: uint32(len(sb.Records)), CreatedMs: sb.CreatedMs})
				if h.Len() > limit {
					heap.Pop(h) // the latest
				}
				return true
			})
		}
		if next == off {
			break
		}
		off = next
	}
	out := make([]*heraldpb.ScheduledInfo, h.Len())
	for i := len(out) - 1; i >= 0; i-- {
		out[i] = heap.Pop(h).(*heraldpb.ScheduledInfo)
	}
	return &heraldpb.ListScheduledResponse{Scheduled: out, Pending: pending.GetCardinality(), FireLateness: fireLateness()}, nil
}

// infoHeap is a max-heap by (deliver time, id): its top is the latest kept.
type infoHeap []*heraldpb.ScheduledInfo

func later(a, b *heraldpb.ScheduledInfo) bool {
	if a.DeliverAtMs != b.DeliverAtMs {
		return a.DeliverAtMs > b.DeliverAtMs
	}
	x, _ := strconv.ParseUint(a.Id, 10, 64)
	y, _ := strconv.ParseUint(b.Id, 10, 64)
	return x > y
}

func (h infoHeap) Len() int           { return len(h) }
func (h infoHeap) Less(i, j int) bool { return later(h[i], h[j]) }
func (h infoHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *infoHeap) Push(x any)        { *h = append(*h, x.(*heraldpb.ScheduledInfo)) }
func (h *infoHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// randomToken is a fire round's token: unguessable, so a client cannot
// forge a record recovery would take for an append.
func randomToken() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return binary.LittleEndian.Uint64(b[:])
}
