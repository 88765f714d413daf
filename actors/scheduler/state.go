package scheduler

// The scheduler's pure core: the pending set and its bookkeeping, the checks and choices made on it, and the fire rounds' grouping (no goroutines, clock, disk or network).

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/RoaringBitmap/roaring/v2/roaring64"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"github.com/heraldmq/herald/timewheel"
	"google.golang.org/protobuf/proto"
)

// state is what the scheduler knows of its delayed batches, embedded in
// the actor (which owns it): which are pending, which are being fired,
// cancelled or moved, and the decisions that follow from that. Time comes
// in as arguments; the actor does the reads, writes and timers.
type state struct {
	pending *roaring64.Bitmap               // batches scheduled and neither fired nor cancelled (durably)
	intents map[uint64]*heraldpb.FireIntent // firings without a fire, while loading

	busy       map[uint64]struct{} // refs announced, appending or appended: cancel is too late
	cancelling map[uint64]int64    // cancel being written: ref -> At if it came due meanwhile (0 if not)

	// batches compaction moved up the log: id -> current ref, and back
	moved     map[uint64]uint64
	origOf    map[uint64]uint64
	rewriting map[uint64]bool // refs being moved now

	rr uint32 // the round robin of unkeyed batches without a partition

	dedup dedup // idempotent producers' batches stored lately
}

func newState() state {
	return state{
		pending:    roaring64.New(),
		intents:    map[uint64]*heraldpb.FireIntent{},
		busy:       map[uint64]struct{}{},
		cancelling: map[uint64]int64{},
		moved:      map[uint64]uint64{},
		origOf:     map[uint64]uint64{},
		rewriting:  map[uint64]bool{},
	}
}

// ---- __schedule's events ------------------------------------------------------

// apply replays one event of __schedule at offset off. A scheduled batch
// returns its timer, for the wheel.
func (st *state) apply(off uint64, ev *heraldpb.ScheduleEvent) (timewheel.Entry, bool) {
	switch x := ev.Event.(type) {
	case *heraldpb.ScheduleEvent_Schedule:
		st.pending.Add(off)
		st.dedup.loaded(off, x.Schedule)
		if x.Schedule.Id != nil {
			st.noteMoved(x.Schedule.GetId(), off)
		}
		return timewheel.Entry{At: x.Schedule.DeliverAtMs, Ref: off}, true
	case *heraldpb.ScheduleEvent_Cancel:
		st.pending.Remove(x.Cancel.Ref)
		st.forgetMoved(x.Cancel.Ref)
	case *heraldpb.ScheduleEvent_Firing:
		for _, in := range x.Firing.Intents {
			for _, r := range in.Refs {
				st.intents[r] = in
			}
		}
	case *heraldpb.ScheduleEvent_Fired:
		for _, r := range x.Fired.Refs {
			st.pending.Remove(r)
			delete(st.intents, r)
			st.forgetMoved(r)
		}
	}
	return timewheel.Entry{}, false
}

// noteMoved records that batch id now lives at ref.
func (st *state) noteMoved(id, ref uint64) {
	if old, ok := st.moved[id]; ok {
		delete(st.origOf, old)
	}
	st.moved[id] = ref
	st.origOf[ref] = id
}

// forgetMoved drops the move record of ref, which is done (fired,
// cancelled, or moved again).
func (st *state) forgetMoved(ref uint64) {
	if id, ok := st.origOf[ref]; ok {
		delete(st.origOf, ref)
		if st.moved[id] == ref {
			delete(st.moved, id)
		}
	}
}

// fireKey is what recovery looks for in an appended record: its schedule
// id and its round's token.
func fireKey(ref, token uint64) string {
	return strconv.FormatUint(ref, 10) + "/" + tokenText(token)
}

func tokenText(token uint64) string { return fmt.Sprintf("%016x", token) }

// recovery is what recovery looks for on one partition: the fires that
// were announced and not recorded, by fireKey, from the earliest offset
// where the partition's log ended when one of them was announced.
type recovery struct {
	topic string
	part  uint32
	from  int64
	want  map[string]uint64 // fireKey -> ref
}

// recoveries groups by partition the firing intents of batches still
// pending once __schedule is loaded: each may or may not have been
// appended before a crash.
func (st *state) recoveries() []recovery {
	type span struct {
		topic string
		part  uint32
	}
	byPart := map[span]*recovery{}
	var out []*recovery
	for ref, in := range st.intents {
		if !st.pending.Contains(ref) {
			continue
		}
		k := span{in.Topic, in.Partition}
		r := byPart[k]
		if r == nil {
			r = &recovery{topic: in.Topic, part: in.Partition, from: -1, want: map[string]uint64{}}
			byPart[k] = r
			out = append(out, r)
		}
		id := ref
		if o, ok := st.origOf[ref]; ok {
			id = o
		}
		r.want[fireKey(id, in.Token)] = ref
		if r.from < 0 || in.FromOffset < r.from {
			r.from = in.FromOffset
		}
	}
	rs := make([]recovery, len(out))
	for i, r := range out {
		rs[i] = *r
	}
	return rs
}

// ---- requests ------------------------------------------------------------------

// ParseID reads a schedule id.
func ParseID(id string) (uint64, bool) {
	ref, err := strconv.ParseUint(id, 10, 64)
	return ref, err == nil
}

// tagBytes bounds what AppendBatchHeaders adds to one record at fire time:
// the two headers with the longest values, and a longer length prefix.
var tagBytes = func() int {
	one, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{}}})
	tagged, _ := heraldpb.AppendBatchHeaders(one, [2]string{HeaderScheduleID, "18446744073709551615"},
		[2]string{HeaderDeliverAt, "-9223372036854775808"}, [2]string{HeaderFireToken, tokenText(1<<64 - 1)})
	return len(tagged) - len(one) + 2
}()

func throttledErr(why string) *heraldpb.Error {
	e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "%s", why)
	e.RetryAfterMs = 100
	return e
}

// checkDelayed checks a delayed produce, at now, against the broker's
// maxDelay and the topic it names (e; nil: there is none), and says when
// it is due, which partition it goes to (the one named, else its first
// key's, else the next in round robin) and how many records it holds.
func (st *state) checkDelayed(req *heraldpb.ProduceRequest, e *registry.Entry, now time.Time, maxDelay time.Duration) (at int64, part uint32, count int, _ *heraldpb.Error) {
	invalid := func(format string, args ...any) *heraldpb.Error {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, format, args...)
	}
	if req.DeliverAtMs != 0 && req.DelayMs != 0 {
		return 0, 0, 0, invalid("set deliver_at_ms or delay_ms, not both")
	}
	if req.ProducerId != 0 && req.BaseSequence < 0 {
		return 0, 0, 0, invalid("base_sequence %d is negative", req.BaseSequence)
	}
	switch {
	case req.DelayMs != 0:
		if req.DelayMs > uint64(maxDelay/time.Millisecond) {
			return 0, 0, 0, invalid("delay_ms %d is longer than the broker's max delay %v", req.DelayMs, maxDelay)
		}
		at = now.UnixMilli() + int64(req.DelayMs)
	case req.DeliverAtMs < 0:
		return 0, 0, 0, invalid("deliver_at_ms %d is negative", req.DeliverAtMs)
	default:
		if req.DeliverAtMs > now.Add(maxDelay).UnixMilli() {
			return 0, 0, 0, invalid("deliver_at_ms %d is more than the broker's max delay %v away", req.DeliverAtMs, maxDelay)
		}
		at = req.DeliverAtMs
	}
	if registry.IsInternal(req.Topic) {
		return 0, 0, 0, invalid("topic %q is internal: clients cannot produce to it", req.Topic)
	}
	if e == nil {
		return 0, 0, 0, heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q does not exist", req.Topic)
	}
	info, err := heraldpb.ScanBatch(req.Records)
	if err != nil {
		return 0, 0, 0, invalid("%v", err)
	}
	if info.Count == 0 {
		return 0, 0, 0, invalid("the batch has no records")
	}
	// At its time every record gets the scheduler's headers: the batch
	// must fit the topic's limit with them, or it could never be appended.
	if limit := int(e.Config.GetMaxMessageBytes()); limit > 0 && len(req.Records)+info.Count*tagBytes > limit {
		return 0, 0, 0, heraldpb.NewError(heraldpb.ErrorCode_MESSAGE_TOO_LARGE,
			"delayed batch of %d bytes and %d records exceeds max message size %d with the %d bytes of headers each record gets when it is delivered",
			len(req.Records), info.Count, limit, tagBytes)
	}
	n := uint32(len(e.Partitions))
	switch {
	case req.Partition != nil:
		if *req.Partition >= n {
			return 0, 0, 0, heraldpb.NewError(heraldpb.ErrorCode_PARTITION_NOT_FOUND,
				"topic %q has %d partitions; there is no partition %d", req.Topic, n, *req.Partition)
		}
		part = *req.Partition
	case len(info.FirstKey) > 0:
		part = heraldpb.PartitionForKey(info.FirstKey, n)
	default:
		part = st.rr % n
		st.rr++
	}
	return at, part, info.Count, nil
}

// cancelTarget checks a cancel of schedule id and returns the batch's
// ref now (compaction may have moved it up the log).
func (st *state) cancelTarget(id string) (uint64, *heraldpb.Error) {
	ref, ok := ParseID(id)
	if !ok {
		return 0, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "schedule id %q is not a number", id)
	}
	if cur, ok := st.moved[ref]; ok {
		ref = cur // moved up the log by compaction
	}
	if st.rewriting[ref] {
		return 0, throttledErr("the batch is being moved by compaction")
	}
	notFound := func(why string) *heraldpb.Error {
		return heraldpb.NewError(heraldpb.ErrorCode_SCHEDULE_NOT_FOUND, "scheduled batch %s %s", id, why)
	}
	if _, firing := st.busy[ref]; firing {
		return 0, notFound("is being delivered")
	}
	if _, dup := st.cancelling[ref]; dup || !st.pending.Contains(ref) {
		return 0, notFound("is not pending (unknown, delivered or cancelled)")
	}
	return ref, nil
}

// ---- firing --------------------------------------------------------------------

// keepDue filters timers that came due, in place: it keeps the pending
// batches that are not being fired or cancelled. A batch whose cancel is
// being written notes its time, so that it fires after all if the cancel
// fails.
func (st *state) keepDue(due []timewheel.Entry) []timewheel.Entry {
	kept := due[:0]
	for _, e := range due {
		if !st.pending.Contains(e.Ref) {
			continue // cancelled (the wheel keeps cancelled timers until due)
		}
		if _, ok := st.busy[e.Ref]; ok {
			continue
		}
		if at, ok := st.cancelling[e.Ref]; ok {
			if at == 0 {
				st.cancelling[e.Ref] = e.At
			}
			continue
		}
		kept = append(kept, e)
	}
	return kept
}

// takeRound takes up to max batches from the front of the due queue q for
// a fire round and marks them busy; n is how much of q it went through.
func (st *state) takeRound(q []timewheel.Entry, max int) (entries []timewheel.Entry, n int) {
	for ; n < len(q) && len(entries) < max; n++ {
		e := q[n]
		if _, dup := st.busy[e.Ref]; dup {
			continue // a timer added twice (a far store kept across a restart)
		}
		if !st.pending.Contains(e.Ref) {
			continue // cancelled while it waited for a round
		}
		if at, ok := st.cancelling[e.Ref]; ok {
			if at == 0 {
				st.cancelling[e.Ref] = e.At // fires after all if the cancel fails
			}
			continue
		}
		st.busy[e.Ref] = struct{}{}
		entries = append(entries, e)
	}
	return entries, n
}

// takeCached moves the round's missing records found in the read cache
// into r.raw (aliasing the fetched bytes, which nothing modifies): one
// pass over each cached batch that holds some. Decoding them is left to
// buildRound, off the actor's goroutine.
func takeCached(cache []*heraldpb.StoredBatch, r *fireRound) {
	if len(cache) == 0 || len(r.missing) == 0 {
		return
	}
	found := map[uint64]bool{}
	mi := 0
	for _, b := range cache {
		lo, hi := uint64(b.BaseOffset), uint64(b.BaseOffset+int64(b.Count))
		for mi < len(r.missing) && r.missing[mi] < lo {
			mi++
		}
		if mi == len(r.missing) {
			break
		}
		if r.missing[mi] >= hi {
			continue
		}
		_ = heraldpb.ForEachRawRecord(b.Records, func(k int, rec []byte) bool {
			ref := lo + uint64(k)
			for mi < len(r.missing) && r.missing[mi] < ref {
				mi++
			}
			if mi == len(r.missing) {
				return false
			}
			if r.missing[mi] != ref {
				return true
			}
			r.raw[ref] = rec
			found[ref] = true
			return true
		})
	}
	if len(found) > 0 {
		r.missing = slices.DeleteFunc(r.missing, func(ref uint64) bool { return found[ref] })
	}
}

// groupChunks groups the chunks due for sending (at nowUs, µs) into
// appends: those of one partition together, in order, as far as its max
// message size allows and their times agree (a scheduler that fell behind
// catches up in big appends). The groups come partition by partition, in
// the order the partitions first appear in cs.
func groupChunks(cs []*fireChunk, nowUs int64) [][]*fireChunk {
	type key struct {
		e    *registry.Entry
		part uint32
	}
	groups := map[key][][]*fireChunk{}
	var order []key
	for _, c := range cs {
		k := key{c.entry, c.part}
		g := groups[k]
		if g == nil {
			order = append(order, k)
		}
		limit := int(c.entry.Config.GetMaxMessageBytes())
		if limit == 0 {
			limit = 1 << 20
		}
		// A chunk not due yet starts its own append unless due in the
		// same millisecond as the last: an append is readable from its
		// latest time, and must not hold an earlier chunk past its own.
		if n := len(g); n == 0 || groupBytes(g[n-1])+len(c.records) > limit ||
			(c.at*1000 > nowUs && c.at != g[n-1][len(g[n-1])-1].at) {
			g = append(g, nil)
		}
		g[len(g)-1] = append(g[len(g)-1], c)
		groups[k] = g
	}
	var out [][]*fireChunk
	for _, k := range order {
		out = append(out, groups[k]...)
	}
	return out
}

func groupRefs(g []*fireChunk) int {
	n := 0
	for _, c := range g {
		n += len(c.refs)
	}
	return n
}

func groupBytes(g []*fireChunk) int {
	n := 0
	for _, c := range g {
		n += len(c.records)
	}
	return n
}

// retriable reports whether an append may succeed later: a topic that is
// throttled, short of disk, or moving leader. A deleted topic or a batch
// it refuses is not.
func retriable(e *heraldpb.Error) bool {
	switch e.GetCode() {
	case heraldpb.ErrorCode_TOPIC_NOT_FOUND, heraldpb.ErrorCode_PARTITION_NOT_FOUND,
		heraldpb.ErrorCode_MESSAGE_TOO_LARGE, heraldpb.ErrorCode_INVALID_REQUEST:
		return false
	}
	return true
}

// ---- compaction ----------------------------------------------------------------

// compactCut is where __schedule may be cut, its high watermark being
// hw: below the oldest pending or busy batch, every event concerns
// batches that are done.
func (st *state) compactCut(hw int64) int64 {
	cut := hw
	if !st.pending.IsEmpty() {
		cut = min(cut, int64(st.pending.Minimum()))
	}
	for r := range st.busy {
		cut = min(cut, int64(r))
	}
	return cut
}

// toMove picks the pending batches that pin __schedule's start at cut and
// are worth moving up the log (its high watermark being hw): those in the
// older half [cut, mid), at most rewriteMax, not being fired or
// cancelled, when they are few there (a tenth at most). None when moving
// would not pay.
func (st *state) toMove(cut, hw int64) (refs []uint64, mid int64) {
	mid = cut + (hw-cut)/2
	if mid <= cut {
		return nil, mid
	}
	it := st.pending.Iterator()
	it.AdvanceIfNeeded(uint64(cut))
	for it.HasNext() && len(refs) < rewriteMax {
		ref := it.Next()
		if int64(ref) >= mid {
			break
		}
		if _, busy := st.busy[ref]; busy {
			continue
		}
		if _, c := st.cancelling[ref]; c {
			continue
		}
		refs = append(refs, ref)
	}
	// Moving pays when the older half is mostly done batches.
	if len(refs) == 0 || int64(len(refs))*10 > mid-cut {
		return nil, mid
	}
	return refs, mid
}
