package txn

// The coordinator's pure core: the pending half messages, rebuilt from
// __txn's events, and the decisions on them.

import (
	"container/heap"
	"fmt"
	"strconv"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
)

// halfState is where a half message is in its life.
type halfState uint8

const (
	statePending   halfState = iota // waiting for commit or rollback
	stateKept                       // checks exhausted, policy keep: waits for a manual end
	stateCommitted                  // commit written; append at its time (or being appended)
)

func (s halfState) String() string {
	switch s {
	case stateKept:
		return "kept"
	case stateCommitted:
		return "committed"
	}
	return "pending"
}

// half is a pending half message: its record in __txn is the source of
// truth for its records, read back when it is checked or appended.
type half struct {
	ref       uint64 // offset of its HalfStored event: its id
	group     string
	topic     string
	part      uint32
	created   int64 // ms
	deliverAt int64 // ms; 0: at once
	count     uint32
	size      uint32
	interval  time.Duration
	maxChecks uint32
	keep      bool

	state     halfState
	checks    uint32
	nextCheck int64 // ms; 0: none armed
	from      int64 // committed: where the target log ended at the decision
	token     uint64
	by        string
	appending bool          // an append is in flight
	ending    bool          // a commit or rollback of it is being written
	checkReg  *registration // where its last check-back went, unanswered
}

// ended remembers how recent halves ended, so that a repeated end answers
// already_ended instead of TXN_NOT_FOUND.
type ended struct {
	outcome map[uint64]bool // true: committed
	order   []uint64
	next    int
}

const endedKeep = 65536

func (e *ended) add(ref uint64, committed bool) {
	if e.outcome == nil {
		e.outcome = map[uint64]bool{}
		e.order = make([]uint64, 0, 64)
	}
	if _, ok := e.outcome[ref]; ok {
		e.outcome[ref] = committed
		return
	}
	if len(e.order) < endedKeep {
		e.order = append(e.order, ref)
	} else {
		delete(e.outcome, e.order[e.next])
		e.order[e.next] = ref
		e.next = (e.next + 1) % endedKeep
	}
	e.outcome[ref] = committed
}

// state is the set of pending halves and the queues of their timers.
type state struct {
	halves map[uint64]*half
	txns   map[string]*txnMeta // transactional ids (txns.go)
	ended  ended
	checkQ timeQ // pending halves by next check (stale entries skipped)
	dueQ   timeQ // committed halves by delivery time
	rr     uint32
	cached int64 // bytes of staged records kept in memory (txns.go)
	// routed: publishes to several partitions decided and not yet all
	// appended (routed.go), by the offset of their decision.
	routed map[uint64]*routed
	// publishers: idempotent publishers' last sequences (routed.go).
	publishers map[uint64]*publisher
}

func newState() state {
	return state{halves: map[uint64]*half{}, txns: map[string]*txnMeta{}, routed: map[uint64]*routed{}, publishers: map[uint64]*publisher{}}
}

// apply adds one __txn event, at offset off, to the state. It reports the
// halves it ended, for the caller's bookkeeping.
func (st *state) apply(off uint64, ev *heraldpb.TxnEvent, defaults func(*heraldpb.HalfStored) (time.Duration, uint32, bool)) {
	switch e := ev.Event.(type) {
	case *heraldpb.TxnEvent_Half:
		hs := e.Half
		iv, mc, keep := defaults(hs)
		st.halves[off] = &half{
			ref: off, group: hs.ProducerGroup, topic: hs.Topic, part: hs.Partition, created: hs.CreatedMs,
			deliverAt: hs.DeliverAtMs, count: hs.Count, size: uint32(len(hs.Records)),
			interval: iv, maxChecks: mc, keep: keep,
		}
	case *heraldpb.TxnEvent_Commit:
		// The first decision counts: a later commit (or rollback) of a
		// committed half is ignored, as it was refused when it came.
		if h := st.halves[e.Commit.Ref]; h != nil && h.state != stateCommitted {
			h.state, h.from, h.token, h.by = stateCommitted, e.Commit.FromOffset, e.Commit.Token, e.Commit.By
		}
	case *heraldpb.TxnEvent_Rollback:
		for _, r := range e.Rollback.Refs {
			if h, ok := st.halves[r]; ok && h.state != stateCommitted {
				delete(st.halves, r)
				st.ended.add(r, false)
			}
		}
	case *heraldpb.TxnEvent_Routed:
		r := &routed{ref: off, token: e.Routed.Token, created: e.Routed.CreatedMs}
		for _, b := range e.Routed.Batches {
			// The records stay in __txn (read back to append after a
			// reload); the caller that decided keeps its own copy.
			r.batches = append(r.batches, &heraldpb.RoutedBatch{Topic: b.Topic, Partition: b.Partition, Count: b.Count, FromOffset: b.FromOffset})
		}
		st.routed[off] = r
		if id := e.Routed.ProducerId; id != 0 {
			st.notePublisher(id, e.Routed.Sequence, off, e.Routed.CreatedMs)
		}
	case *heraldpb.TxnEvent_Publishers:
		ps := e.Publishers
		for i, id := range ps.ProducerIds {
			if i < len(ps.Sequences) && i < len(ps.UsedMs) {
				st.notePublisher(id, ps.Sequences[i], off, ps.UsedMs[i])
			}
		}
	case *heraldpb.TxnEvent_Done:
		for _, r := range e.Done.Refs {
			delete(st.routed, r)
			if _, ok := st.halves[r]; ok {
				delete(st.halves, r)
				st.ended.add(r, true)
			}
		}
	case *heraldpb.TxnEvent_Checks:
		for i, r := range e.Checks.Refs {
			if h := st.halves[r]; h != nil && i < len(e.Checks.Counts) {
				h.checks = max(h.checks, e.Checks.Counts[i])
				if h.checks >= h.maxChecks && h.keep && h.state == statePending {
					h.state = stateKept
				}
			}
		}
	}
}

// backoff is the wait after check k (from 1) before the next: the
// interval, doubling, at most 8 times it.
func backoff(interval time.Duration, k uint32) time.Duration {
	m := time.Duration(1) << min(max(k, 1)-1, 3)
	return interval * m
}

// FormatID is a half message's id as clients see it.
func FormatID(ref uint64) string { return strconv.FormatUint(ref, 10) }

// ParseID reads a half message's id.
func ParseID(id string) (uint64, bool) {
	v, err := strconv.ParseUint(id, 10, 64)
	return v, err == nil
}

// tagBytes bounds the headers the coordinator adds to each record of a
// committed half (herald-half-id and herald-txn-token with their values).
const tagBytes = 96

// checkHalf checks a half produce against the topic it names (e; nil: none)
// at now and says when it is delivered once committed, its partition (the
// one named, else its first key's, else the next in round robin) and how
// many records it holds.
func (st *state) checkHalf(req *heraldpb.ProduceRequest, e *registry.Entry, now time.Time, maxDelay time.Duration) (at int64, part uint32, count int, _ *heraldpb.Error) {
	invalid := func(format string, args ...any) *heraldpb.Error {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, format, args...)
	}
	h := req.GetHalf()
	switch {
	case h.GetProducerGroup() == "":
		return 0, 0, 0, invalid("a half message needs a producer_group")
	case len(h.GetProducerGroup()) > 255:
		return 0, 0, 0, invalid("producer_group is %d bytes; at most 255", len(h.GetProducerGroup()))
	case h.GetOnExhausted() != heraldpb.HalfExhaustedPolicy_HALF_EXHAUSTED_DEFAULT && h.GetOnExhausted() != heraldpb.HalfExhaustedPolicy_HALF_EXHAUSTED_ROLLBACK && h.GetOnExhausted() != heraldpb.HalfExhaustedPolicy_HALF_EXHAUSTED_KEEP:
		return 0, 0, 0, invalid("on_exhausted %d is not a policy", h.GetOnExhausted())
	case h.GetMaxChecks() > 1000:
		return 0, 0, 0, invalid("max_checks %d is more than 1000", h.GetMaxChecks())
	case h.GetCheckIntervalMs() != 0 && (h.GetCheckIntervalMs() < 100 || h.GetCheckIntervalMs() > 3_600_000):
		return 0, 0, 0, invalid("check_interval_ms %d is outside [100, 3600000]", h.GetCheckIntervalMs())
	case req.ProducerId != 0:
		return 0, 0, 0, invalid("a half message cannot be idempotent: send it with producer_id 0")
	case req.DeliverAtMs != 0 && req.DelayMs != 0:
		return 0, 0, 0, invalid("set deliver_at_ms or delay_ms, not both")
	case req.DeliverAtMs < 0:
		return 0, 0, 0, invalid("deliver_at_ms %d is negative", req.DeliverAtMs)
	case req.DelayMs > uint64(maxDelay/time.Millisecond):
		return 0, 0, 0, invalid("delay_ms %d is longer than the broker's max delay %v", req.DelayMs, maxDelay)
	case req.DeliverAtMs > now.Add(maxDelay).UnixMilli():
		return 0, 0, 0, invalid("deliver_at_ms %d is more than the broker's max delay %v away", req.DeliverAtMs, maxDelay)
	}
	at = req.DeliverAtMs
	if req.DelayMs != 0 {
		at = now.UnixMilli() + int64(req.DelayMs)
	}
	part, count, err := st.routeBatch(req, e, tagBytes, "half message")
	return at, part, count, err
}

// routeBatch checks a produce's batch against its topic (e; nil: none),
// with tags bytes of headers added to each record when it is appended,
// and picks its partition: the one named, else its first key's, else the
// next in round robin. It returns the partition and the record count.
func (st *state) routeBatch(req *heraldpb.ProduceRequest, e *registry.Entry, tags int, what string) (part uint32, count int, _ *heraldpb.Error) {
	invalid := func(format string, args ...any) *heraldpb.Error {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, format, args...)
	}
	switch {
	case registry.IsInternal(req.Topic):
		return 0, 0, invalid("topic %q is internal: clients cannot produce to it", req.Topic)
	case e == nil:
		return 0, 0, heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q does not exist", req.Topic)
	}
	info, err := heraldpb.ScanBatch(req.Records)
	if err != nil {
		return 0, 0, invalid("%v", err)
	}
	if info.Count == 0 {
		return 0, 0, invalid("the batch has no records")
	}
	limit := int(e.Config.GetMaxMessageBytes())
	if limit == 0 {
		limit = 1 << 20
	}
	if len(req.Records)+info.Count*tags > limit {
		return 0, 0, heraldpb.NewError(heraldpb.ErrorCode_MESSAGE_TOO_LARGE,
			"%s of %d bytes and %d records exceeds max message size %d with the %d bytes of headers each record gets when it is committed",
			what, len(req.Records), info.Count, limit, tags)
	}
	n := uint32(len(e.Partitions))
	switch {
	case req.Partition != nil:
		if *req.Partition >= n {
			return 0, 0, heraldpb.NewError(heraldpb.ErrorCode_PARTITION_NOT_FOUND,
				"topic %q has %d partitions; there is no partition %d", req.Topic, n, *req.Partition)
		}
		part = *req.Partition
	case len(info.FirstKey) > 0:
		part = heraldpb.PartitionForKey(info.FirstKey, n)
	default:
		part = st.rr % n
		st.rr++
	}
	return part, info.Count, nil
}

// endTarget finds the half an EndHalf names, or says why there is none.
func (st *state) endTarget(req *heraldpb.EndHalfRequest) (*half, *heraldpb.Error, bool) {
	ref, ok := ParseID(req.Id)
	if !ok {
		return nil, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "half message id %q is not a number", req.Id), false
	}
	switch req.Action {
	case heraldpb.HalfAction_HALF_COMMIT, heraldpb.HalfAction_HALF_ROLLBACK:
	case heraldpb.HalfAction_HALF_UNKNOWN:
		if !req.FromCheck {
			return nil, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "unknown is only an answer to a check-back (from_check)"), false
		}
	default:
		return nil, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "action %d is not commit, rollback or unknown", req.Action), false
	}
	commit := req.Action == heraldpb.HalfAction_HALF_COMMIT
	h := st.halves[ref]
	if h == nil {
		if c, ok := st.ended.outcome[ref]; ok {
			if req.Action == heraldpb.HalfAction_HALF_UNKNOWN || c == commit {
				return nil, nil, true // already ended this way
			}
			was := "rolled back"
			if c {
				was = "committed"
			}
			return nil, heraldpb.NewError(heraldpb.ErrorCode_TXN_NOT_FOUND, "half message %s was already %s", req.Id, was), false
		}
		return nil, heraldpb.NewError(heraldpb.ErrorCode_TXN_NOT_FOUND, "half message %s is not pending (unknown id, or ended long ago)", req.Id), false
	}
	if req.ProducerGroup != "" && req.ProducerGroup != h.group {
		return nil, heraldpb.NewError(heraldpb.ErrorCode_TXN_NOT_FOUND, "half message %s is not of producer group %q", req.Id, req.ProducerGroup), false
	}
	if h.ending {
		return nil, throttledErr(fmt.Sprintf("half message %s is being ended", req.Id)), false
	}
	if h.state == stateCommitted {
		if req.Action == heraldpb.HalfAction_HALF_ROLLBACK {
			return nil, heraldpb.NewError(heraldpb.ErrorCode_TXN_NOT_FOUND, "half message %s was already committed", req.Id), false
		}
		return h, nil, true
	}
	return h, nil, false
}

// info describes h for ListTxn.
func (h *half) info() *heraldpb.HalfInfo {
	return &heraldpb.HalfInfo{
		Id: FormatID(h.ref), ProducerGroup: h.group, Topic: h.topic, Partition: h.part, CreatedMs: h.created,
		State: h.state.String(), Checks: h.checks, MaxChecks: h.maxChecks, NextCheckMs: h.nextCheck,
		DeliverAtMs: h.deliverAt, Count: h.count, Bytes: h.size,
	}
}

func (h *half) String() string {
	return fmt.Sprintf("half %d (%s, %s/%d)", h.ref, h.group, h.topic, h.part)
}

// timeQ is a min-heap of (time, ref); entries that no longer match their
// half's timer are skipped when popped.
type timeQ []timeEntry

type timeEntry struct {
	at  int64
	ref uint64
}

func (q timeQ) Len() int { return len(q) }
func (q timeQ) Less(i, j int) bool {
	return q[i].at < q[j].at || q[i].at == q[j].at && q[i].ref < q[j].ref
}
func (q timeQ) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *timeQ) Push(x any)   { *q = append(*q, x.(timeEntry)) }
func (q *timeQ) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

func (q *timeQ) add(at int64, ref uint64) { heap.Push(q, timeEntry{at: at, ref: ref}) }

// pop removes and returns the earliest entry; the queue must not be empty.
func (q *timeQ) pop() timeEntry { return heap.Pop(q).(timeEntry) }

// next is the earliest time queued.
func (q timeQ) next() (int64, bool) {
	if len(q) == 0 {
		return 0, false
	}
	return q[0].at, true
}
