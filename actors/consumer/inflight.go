package consumer

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Message is a committed record offered to a subscription by the actor that
// reads the partition log.
type Message struct {
	Partition uint32
	Offset    int64
	// Key routes the message in key-shared mode; empty keys all go to one
	// member.
	Key string
	// Skip marks a record the subscription's filter rejected: it is done
	// (advances progress) without being delivered.
	Skip bool
	// Priority is the record's priority, 0 (lowest) to Priorities-1
	// (Append takes higher values as the highest). Deliver serves a
	// partition's levels by weight (see Deliver).
	Priority uint8
	// Expires is when the message's time-to-live runs out, in Unix
	// milliseconds (its batch's append time plus the record's ttl_ms, else
	// the topic's message_ttl_ms); 0 means never. Deliver never delivers an
	// expired message (see Expired).
	Expires int64
}

// Delivery is one message to push to a member (or, from Tick, one whose ack
// timed out at that member).
type Delivery struct {
	Member    MemberID
	Partition uint32
	Offset    int64
	Key       string
	// Count is how many times the message has been delivered, this one
	// included: 1 on first delivery.
	Count int
	// Dead, on a Delivery from Tick, means the timed-out delivery was the
	// last the retry policy allows: the message waits for the dead-letter
	// append (DeadLetters) instead of a retry.
	Dead bool
}

// Reasons of dead letters that do not come from a nack.
const (
	ReasonAckTimeout = "ack timeout"
	ReasonExpired    = "expired"
)

// MaxReason bounds the nack reason kept with a pending retry (and stored in
// `__groups`); longer reasons are cut to it.
const MaxReason = 256

// PolicyDelay, as the delay of a Nack, lets the subscription's retry policy
// choose the delay.
const PolicyDelay time.Duration = -1

// Expired is a message the subscription gave up because its time-to-live
// ran out before it could be delivered (again): done at once, or, with
// Config.DeadLetterExpired, waiting for the dead-letter append (Dead).
type Expired struct {
	View      MemberID
	Partition uint32
	Offset    int64
	// Count is how many times it was delivered before it expired.
	Count int
	Dead  bool
}

// DeadLetter is a message waiting to be appended to the dead-letter topic:
// its deliveries so far and why the last one failed.
type DeadLetter struct {
	View       MemberID
	Partition  uint32
	Offset     int64
	Deliveries int
	Reason     string
}

// msgID names a message within a subscription: broadcast views (one per
// member) deliver the same offset independently.
type msgID struct {
	view MemberID
	part uint32
	off  int64
}

func (a msgID) compare(b msgID) int {
	return cmp.Or(cmp.Compare(a.view, b.view), cmp.Compare(a.part, b.part), cmp.Compare(a.off, b.off))
}

// flight is a message delivered to member and not yet acked.
type flight struct {
	id       msgID
	key      string
	member   MemberID
	count    int
	deadline time.Time
	expires  int64  // Message.Expires
	timer    uint64 // Ref of its deadline's timer (see timers)
}

// retryEntry is a message to deliver again: nacked, timed out, or released
// by a member that left or gave up its partition; or, in inflight.dead, one
// waiting for its dead-letter append.
//
// An entry restored from `__groups` is not loaded until the actor's reads
// reach its offset (its offset is at or past the view's next offset): only
// then is its record held, and its key and expiry known. Deliver and
// DeadLetters skip entries that are not loaded.
type retryEntry struct {
	id        msgID
	key       string
	count     int // deliveries so far
	notBefore time.Time
	avoid     MemberID // prefer another member than this one
	reason    string   // why the last delivery failed
	expires   int64    // Message.Expires
	timer     uint64   // Ref of its not-before timer, 0 if none (see timers)
}

type keyHold struct {
	member MemberID
	n      int
}

// inflight tracks a subscription's unacked messages. Sub owns it.
type inflight struct {
	flights   map[msgID]*offWin[*flight] // by partKey: flights of a view's partition
	nflights  int
	retry     []*retryEntry // sorted by id
	dead      []*retryEntry // waiting for the dead-letter append, sorted by id
	redeliv   map[msgID]int // by partKey: flights with count > 1 (stored with the progress)
	perMember map[MemberID]int
	perPart   map[msgID]int      // key {view, part, 0}: in flight per partition (Orderly only)
	perKey    map[string]keyHold // key-shared: in flight per key, and to whom (KeyShared only)
	byPart    bool               // maintain perPart
	byKey     bool               // maintain perKey
	tm        timers             // ack deadlines and not-before times
}

// newInflight tracks flights; the per-partition and per-key counts cost a
// map update per delivery and ack, so only the modes that read them keep
// them.
func newInflight(byPart, byKey bool) inflight {
	return inflight{
		byPart: byPart, byKey: byKey,
		flights:   map[msgID]*offWin[*flight]{},
		redeliv:   map[msgID]int{},
		perMember: map[MemberID]int{},
		perPart:   map[msgID]int{},
		perKey:    map[string]keyHold{},
	}
}

func partKey(id msgID) msgID { return msgID{view: id.view, part: id.part} }

func (fl *inflight) add(f *flight) {
	k := partKey(f.id)
	w := fl.flights[k]
	if w == nil {
		w = &offWin[*flight]{}
		fl.flights[k] = w
	}
	if _, dup := w.get(f.id.off); !dup {
		fl.nflights++
	}
	w.put(f.id.off, f)
	if f.count > 1 {
		fl.redeliv[k]++
	}
	fl.perMember[f.member]++
	if fl.byPart {
		fl.perPart[partKey(f.id)]++
	}
	if fl.byKey {
		h := fl.perKey[f.key]
		fl.perKey[f.key] = keyHold{member: f.member, n: h.n + 1}
	}
	fl.armFlight(f)
}

// remove drops the flight id and returns it, or nil.
func (fl *inflight) remove(id msgID) *flight {
	w := fl.flights[partKey(id)]
	if w == nil {
		return nil
	}
	f, ok := w.del(id.off)
	if !ok {
		return nil
	}
	fl.nflights--
	if f.count > 1 {
		decr(fl.redeliv, partKey(id))
	}
	decr(fl.perMember, f.member)
	if fl.byPart {
		decr(fl.perPart, partKey(id))
	}
	if !fl.byKey {
		return f
	}
	if h := fl.perKey[f.key]; h.n <= 1 {
		delete(fl.perKey, f.key)
	} else {
		fl.perKey[f.key] = keyHold{member: h.member, n: h.n - 1}
	}
	return f
}

func decr[K comparable](m map[K]int, k K) {
	if m[k] <= 1 {
		delete(m, k)
	} else {
		m[k]--
	}
}

func cmpEntry(r *retryEntry, id msgID) int { return r.id.compare(id) }

// findEntry returns the index of id in q (sorted by id), or -1.
func findEntry(q []*retryEntry, id msgID) int {
	i, ok := slices.BinarySearchFunc(q, id, cmpEntry)
	if !ok {
		return -1
	}
	return i
}

func (fl *inflight) findRetry(id msgID) int { return findEntry(fl.retry, id) }

func insertEntry(q []*retryEntry, r *retryEntry) []*retryEntry {
	i, found := slices.BinarySearchFunc(q, r.id, cmpEntry)
	if found {
		q[i] = r
		return q
	}
	return slices.Insert(q, i, r)
}

func (fl *inflight) addRetry(r *retryEntry) {
	fl.retry = insertEntry(fl.retry, r)
	fl.armRetry(r)
}

func (fl *inflight) addDead(r *retryEntry) { fl.dead = insertEntry(fl.dead, r) }

// entryRange is the index range of q's entries of view v, partition p, with
// offsets in [lo, hi).
func entryRange(q []*retryEntry, v MemberID, p uint32, lo, hi int64) (int, int) {
	i, _ := slices.BinarySearchFunc(q, msgID{view: v, part: p, off: lo}, cmpEntry)
	j, _ := slices.BinarySearchFunc(q, msgID{view: v, part: p, off: hi}, cmpEntry)
	return i, j
}

// entries returns q's entries of view v, partition p, with offsets in
// [lo, hi), aliasing q.
func entries(q []*retryEntry, v MemberID, p uint32, lo, hi int64) []*retryEntry {
	i, j := entryRange(q, v, p, lo, hi)
	return q[i:j]
}

// get returns the flight id, or nil.
func (fl *inflight) get(id msgID) *flight {
	if w := fl.flights[partKey(id)]; w != nil {
		f, _ := w.get(id.off)
		return f
	}
	return nil
}

// each calls fn for every flight, in no particular order.
func (fl *inflight) each(fn func(*flight)) {
	for _, w := range fl.flights {
		w.each(func(_ int64, f *flight) { fn(f) })
	}
}

// sorted returns the flights matching keep, ordered by id.
func (fl *inflight) sorted(keep func(*flight) bool) []*flight {
	var fs []*flight
	fl.each(func(f *flight) {
		if keep(f) {
			fs = append(fs, f)
		}
	})
	slices.SortFunc(fs, func(a, b *flight) int { return a.id.compare(b.id) })
	return fs
}

// release moves flights to the retry queue, to go out again at once,
// preferably not to avoid. A release is not a failure: the retry policy
// does not apply (the member left or gave its partition up).
func (fl *inflight) release(fs []*flight, avoid MemberID, notBefore time.Time) {
	for _, f := range fs {
		fl.remove(f.id)
		fl.addRetry(&retryEntry{id: f.id, key: f.key, count: f.count, notBefore: notBefore, avoid: avoid, expires: f.expires})
	}
}

// Request grants m n more credits (reactive streams' request(n)): the
// number of further messages the subscription may deliver to it. Each
// delivery, first or redelivery, uses one credit; acks, nacks and timeouts
// return none (the client grants more as its handler completes). Credits are
// capped at Config.MaxCredits; n <= 0 is ignored. Hence a member never has
// more messages in flight than it has granted.
func (s *Sub) Request(m MemberID, n int) error {
	ms := s.members[m]
	if ms == nil {
		return fmt.Errorf("%w: %s", ErrUnknownMember, m)
	}
	if n > 0 {
		ms.credits = min(ms.credits+min(n, s.cfg.MaxCredits), s.cfg.MaxCredits)
	}
	return nil
}

// Credits is m's unused credit.
func (s *Sub) Credits(m MemberID) int {
	if ms := s.members[m]; ms != nil {
		return ms.credits
	}
	return 0
}

// Pause marks m as taking no deliveries for now (its circuit breaker is
// open or half-open) or, with paused false, as taking them again. In
// shared mode a redelivery that avoids the member it failed on waits only
// for members that are not paused: otherwise a member whose breaker opened
// would hold, with its unused credits, the retries of every other member
// for the whole cool-down. Unknown members are ignored.
func (s *Sub) Pause(m MemberID, paused bool) {
	if ms := s.members[m]; ms != nil {
		ms.paused = paused
	}
}

// InFlight is the number of messages delivered to m and not yet acked.
func (s *Sub) InFlight(m MemberID) int { return s.fl.perMember[m] }

// Deliver chooses up to max (0: no limit) messages for m, within its
// credits, and records them in flight with an ack deadline of
// now+AckTimeout (or, with AutoAck, as done at once: at-most-once).
//
// Redeliveries due by now come first, in (partition, offset) order, then new
// messages, one partition at a time in rotation. Within a partition, new
// messages go in offset order while all of its pending ones are at
// priority 0. Otherwise each priority level is a sub-queue (in offset
// order) of the partition's pending messages, and the partition's
// PriorityPicker (one per view and partition, kept across calls) chooses
// the level of each delivery by weight (level p weighs p+1), so higher
// levels go first but a non-empty level is never starved. Priorities only
// reorder the messages offered so far (up to MaxPending per partition).
// With Orderly they are ignored: offset order wins. What m may take depends on
// the mode: in clustering only partitions it owns and is not revoking; in
// broadcast its own view; in shared anything, except that a redelivery
// avoiding m waits while another member has credit; in key-shared the keys
// it holds in flight, and otherwise those the ring gives it (for a
// redelivery, the ring skipping the avoided member). With Orderly, at most
// one message per partition (per key in key-shared) is in flight, and a
// message never overtakes an earlier one of its partition (key) that is
// waiting to be redelivered, even one delayed by a nack.
//
// A message whose time-to-live ran out by now (Message.Expires) is never
// delivered: Deliver meets it as a candidate, due redeliveries included,
// and ends it without using a credit: acked as done, or, with
// Config.DeadLetterExpired, handed to the dead-letter queue. TakeExpired
// lists them.
func (s *Sub) Deliver(m MemberID, now time.Time, max int) ([]Delivery, error) {
	ms := s.members[m]
	if ms == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnknownMember, m)
	}
	budget := ms.credits
	if max > 0 {
		budget = min(budget, max)
	}
	var out []Delivery
	if budget == 0 {
		return nil, nil
	}
	nowMs := now.UnixMilli()
	blocked := map[lockKey]bool{}
	// orderlyPass reports whether a message under lk may go now, and blocks
	// lk for the rest of this call either way.
	orderlyPass := func(id msgID, key string) bool {
		if !s.cfg.Orderly {
			return true
		}
		lk := s.lockOf(id, key)
		ok := !blocked[lk] && !s.locked(id, key)
		blocked[lk] = true
		return ok
	}

	v := s.views[ms.view]
	kept := s.fl.retry[:0]
	for _, r := range s.fl.retry {
		// An entry whose record is not loaded yet (restored) neither goes
		// nor holds back its partition: the reads that load it must not
		// wait for messages it would block.
		loaded := r.id.view == ms.view && r.id.off < v.next[r.id.part]
		if loaded && !r.notBefore.After(now) && expiredBy(r.expires, nowMs) {
			s.expire(r.id, r.key, r.count, now)
			continue
		}
		if len(out) < budget && loaded && orderlyPass(r.id, r.key) &&
			!r.notBefore.After(now) && s.eligible(m, r.id, r.key, r.avoid) {
			out = append(out, s.send(m, r.id, r.key, r.count+1, r.expires, now))
			continue
		}
		kept = append(kept, r)
	}
	clear(s.fl.retry[len(kept):])
	s.fl.retry = kept
	// Key-shared: a message waiting to be redelivered (nacked, timed out,
	// or released by a member that left) holds back the later messages
	// of its key, so each key's messages are first delivered in order and
	// no later one overtakes an earlier one that a member never handled.
	// (Orderly does this and more through orderlyPass.)
	type partKeyOf struct {
		part uint32
		key  string
	}
	var heldKeys map[partKeyOf]int64 // lowest offset waiting, per partition and key
	if s.cfg.Mode == KeyShared && !s.cfg.Orderly {
		for _, r := range s.fl.retry {
			if r.id.view != ms.view || r.id.off >= v.next[r.id.part] {
				continue // not loaded yet: holds nothing (see above)
			}
			if heldKeys == nil {
				heldKeys = map[partKeyOf]int64{}
			}
			if o, ok := heldKeys[partKeyOf{r.id.part, r.key}]; !ok || r.id.off < o {
				heldKeys[partKeyOf{r.id.part, r.key}] = r.id.off
			}
		}
	}

	n := s.cfg.Partitions
	pos := make([]int, n)
	var scans []*levelScan // per partition, made when it has priorities
	for moved := true; moved && len(out) < budget; {
		moved = false
		for j := 0; j < n && len(out) < budget; j++ {
			p := (s.rr + j) % n
			q := v.pending[p]
			if v.levels[p].hi > 0 && !s.cfg.Orderly && pos[p] < len(q) {
				if scans == nil {
					scans = make([]*levelScan, n)
				}
				if scans[p] == nil {
					scans[p] = &levelScan{}
				}
				if d, ok := s.nextByPriority(m, ms.view, v, uint32(p), scans[p], now, nowMs); ok {
					out = append(out, d)
					moved = true
				} else {
					pos[p] = len(q) // nothing more m may take here now
				}
				continue
			}
			// Only level 0 (or Orderly): in offset order.
			for pos[p] < len(q) {
				msg := &q[pos[p]]
				pos[p]++
				if msg.Offset < 0 {
					continue // taken earlier in this call
				}
				id := msgID{view: ms.view, part: uint32(p), off: msg.Offset}
				if expiredBy(msg.Expires, nowMs) {
					s.expire(id, msg.Key, 0, now)
					v.levels[p].del(msg.Priority)
					msg.Offset = -1
					continue
				}
				if !orderlyPass(id, msg.Key) {
					continue
				}
				if o, ok := heldKeys[partKeyOf{uint32(p), msg.Key}]; ok && msg.Offset > o {
					continue
				}
				if !s.eligible(m, id, msg.Key, "") {
					if s.cfg.Mode != KeyShared {
						pos[p] = len(q) // the whole partition is someone else's
					}
					continue
				}
				out = append(out, s.send(m, id, msg.Key, 1, msg.Expires, now))
				v.levels[p].del(msg.Priority)
				msg.Offset = -1
				moved = true
				break
			}
		}
	}
	if n > 0 {
		s.rr = (s.rr + 1) % n
	}
	for p, q := range v.pending {
		v.pending[p] = slices.DeleteFunc(q, func(m Message) bool { return m.Offset < 0 })
	}
	return out, nil
}

// levelScan is where one Deliver call got to in a partition's pending
// messages, per priority level.
type levelScan struct {
	pos  [Priorities]int  // index in pending of the next message to look at
	done [Priorities]bool // the level has nothing more this member may take
}

// nextByPriority delivers to m one message of view v's (w's) partition p,
// chosen by priority: the picker names a level among those with messages,
// and m gets that level's first message it may take. When the level has
// none (expired, or all someone else's in key-shared mode), the pick is
// undone and the picker asked again without that level (which, for that
// pick, counts as idle and loses its banked credit). It reports false
// when m may take nothing from p now. Each level is scanned at most once
// per Deliver call (sc), so a call costs O(Priorities × pending).
func (s *Sub) nextByPriority(m, v MemberID, w *view, p uint32, sc *levelScan, now time.Time, nowMs int64) (Delivery, bool) {
	q, lv, pk := w.pending[p], &w.levels[p], w.picker(p)
	for {
		var busy [Priorities]bool
		for l := range busy {
			busy[l] = lv.n[l] > 0 && !sc.done[l]
		}
		saved := *pk
		l, ok := pk.Pick(busy)
		if !ok {
			*pk = saved
			return Delivery{}, false
		}
		for sc.pos[l] < len(q) {
			msg := &q[sc.pos[l]]
			sc.pos[l]++
			if msg.Offset < 0 || int(msg.Priority) != l {
				continue
			}
			id := msgID{view: v, part: p, off: msg.Offset}
			if expiredBy(msg.Expires, nowMs) {
				s.expire(id, msg.Key, 0, now)
				lv.del(msg.Priority)
				msg.Offset = -1
				continue
			}
			if !s.eligible(m, id, msg.Key, "") {
				if s.cfg.Mode != KeyShared {
					*pk = saved
					return Delivery{}, false // the whole partition is someone else's
				}
				continue
			}
			d := s.send(m, id, msg.Key, 1, msg.Expires, now)
			lv.del(msg.Priority)
			msg.Offset = -1
			return d, true
		}
		*pk = saved
		sc.done[l] = true
	}
}

func expiredBy(expires, nowMs int64) bool { return expires != 0 && nowMs >= expires }

// expire ends a message whose time-to-live ran out instead of delivering
// it (see Deliver).
func (s *Sub) expire(id msgID, key string, count int, now time.Time) {
	dead := s.cfg.DeadLetterExpired
	s.expired = append(s.expired, Expired{View: id.view, Partition: id.part, Offset: id.off, Count: count, Dead: dead})
	if dead {
		s.fl.addDead(&retryEntry{id: id, key: key, count: count, notBefore: now, reason: ReasonExpired})
		return
	}
	_ = s.views[id.view].prog[id.part].Ack(id.off)
}

// TakeExpired returns the messages ended by their time-to-live since the
// last call (see Deliver), in the order they expired, and forgets them.
func (s *Sub) TakeExpired() []Expired {
	out := s.expired
	s.expired = nil
	return out
}

// lockKey is what Orderly serialises on: a partition of a view, or a key.
type lockKey struct {
	id    msgID
	key   string
	byKey bool
}

func (s *Sub) lockOf(id msgID, key string) lockKey {
	if s.cfg.Mode == KeyShared {
		return lockKey{key: key, byKey: true}
	}
	return lockKey{id: partKey(id)}
}

func (s *Sub) locked(id msgID, key string) bool {
	if s.cfg.Mode == KeyShared {
		return s.fl.perKey[key].n > 0
	}
	return s.fl.perPart[partKey(id)] > 0
}

// eligible reports whether m may take the message now (see Deliver).
func (s *Sub) eligible(m MemberID, id msgID, key string, avoid MemberID) bool {
	switch s.cfg.Mode {
	case Clustering:
		o, ok := s.asg.Owner(id.part)
		return ok && o == m
	case Broadcast:
		return id.view == m
	case KeyShared:
		if h, ok := s.fl.perKey[key]; ok {
			return h.member == m
		}
		return s.ring.PickExcept([]byte(key), avoid) == m
	default: // Shared
		if avoid == m {
			for _, o := range s.order {
				if o != m && s.members[o].credits > 0 && !s.members[o].paused {
					return false
				}
			}
		}
		return true
	}
}

// send uses one of m's credits to deliver id.
func (s *Sub) send(m MemberID, id msgID, key string, count int, expires int64, now time.Time) Delivery {
	s.members[m].credits--
	if s.cfg.AutoAck {
		s.views[id.view].prog[id.part].Ack(id.off)
	} else {
		s.fl.add(&flight{id: id, key: key, member: m, count: count, deadline: now.Add(s.cfg.AckTimeout), expires: expires})
	}
	return Delivery{Member: m, Partition: id.part, Offset: id.off, Key: key, Count: count}
}

// Ack marks a delivered message done and advances the progress floor. An ack
// from m is accepted for any message of its view that is in flight (to m or,
// after m's ack timed out, to another member) or waiting for redelivery: the
// work was done. Acking a message already done is a no-op. Errors:
// ErrUnknownMember, ErrNotDelivered (never delivered, or out of range).
func (s *Sub) Ack(m MemberID, p uint32, off int64) error {
	id, prog, err := s.lookup(m, p, off)
	if err != nil {
		return err
	}
	if s.fl.remove(id) == nil {
		i := s.fl.findRetry(id)
		if i < 0 {
			if prog.Done(off) {
				return nil
			}
			return fmt.Errorf("%w: partition %d offset %d", ErrNotDelivered, p, off)
		}
		s.fl.retry = slices.Delete(s.fl.retry, i, i+1)
	}
	return prog.Ack(off)
}

// Retry is what became of a failed delivery (Nack, Tick).
type Retry struct {
	// Dead: the delivery was the last the retry policy allows; the message
	// waits for its dead-letter append (DeadLetters).
	Dead bool
	// At is when the message may be delivered again (not Dead).
	At time.Time
}

// Nack gives back a message in flight to m, to be redelivered (preferably
// to another member) no earlier than now+delay, or, with delay
// PolicyDelay, after the retry policy's delay for its delivery count. An
// explicit delay counts as a failed delivery like any other: when the
// policy says the delivery was the last (RetryPolicy.DeadLetter), the
// message goes to the dead-letter queue instead, with reason (cut to
// MaxReason bytes). Errors: ErrUnknownMember, ErrNotInFlight.
func (s *Sub) Nack(m MemberID, p uint32, off int64, delay time.Duration, reason string, now time.Time) (Retry, error) {
	id, _, err := s.lookup(m, p, off)
	if err != nil {
		return Retry{}, err
	}
	f := s.fl.get(id)
	if f == nil || f.member != m {
		return Retry{}, fmt.Errorf("%w: %s partition %d offset %d", ErrNotInFlight, m, p, off)
	}
	return s.fail(f, delay, reason, now), nil
}

// fail ends flight f as failed: a retry after delay (PolicyDelay: the
// policy's), preferably to another member, or a dead letter.
func (s *Sub) fail(f *flight, delay time.Duration, reason string, now time.Time) Retry {
	s.fl.remove(f.id)
	r := &retryEntry{id: f.id, key: f.key, count: f.count, avoid: f.member, reason: cutReason(reason), expires: f.expires}
	if s.cfg.Retry.DeadLetter(f.count) {
		r.notBefore = now
		s.fl.addDead(r)
		return Retry{Dead: true}
	}
	if delay < 0 {
		delay = s.cfg.Retry.Delay(f.count, s.rand())
	}
	r.notBefore = now.Add(delay)
	s.fl.addRetry(r)
	return Retry{At: r.notBefore}
}

func (s *Sub) rand() float64 {
	if s.cfg.Rand != nil {
		return s.cfg.Rand()
	}
	return rand.Float64()
}

// cutReason bounds a nack reason to MaxReason bytes of valid UTF-8.
func cutReason(r string) string {
	if len(r) <= MaxReason {
		return r
	}
	return strings.ToValidUTF8(r[:MaxReason], "")
}

func (s *Sub) lookup(m MemberID, p uint32, off int64) (msgID, *Progress, error) {
	ms := s.members[m]
	if ms == nil {
		return msgID{}, nil, fmt.Errorf("%w: %s", ErrUnknownMember, m)
	}
	if int(p) >= s.cfg.Partitions {
		return msgID{}, nil, fmt.Errorf("%w: no partition %d", ErrNotDelivered, p)
	}
	return msgID{view: ms.view, part: p, off: off}, s.views[ms.view].prog[p], nil
}

// Tick expires every flight whose ack deadline is at or before now: a
// failed delivery (reason ReasonAckTimeout), which the retry policy
// redelivers after its delay, preferably to another member, or sends to
// the dead-letter queue (Delivery.Dead). It returns the expired messages
// (for metrics and the circuit breaker), ordered by partition and offset.
// A timing wheel finds them (see timers), so a call costs O(log n) for
// each timer it takes out up to now (the flights it expires, the stale
// timers of messages acked, nacked or released since, the timers of
// retries that came due), n being the flights and retries, plus O(1) for
// each 256 ms window of time it moves the wheel over while timers are
// pending. The first call builds the wheel from the flights and retries,
// and one whose now is before an earlier call's scans the retries (both
// linear in them).
func (s *Sub) Tick(now time.Time) []Delivery {
	fs := s.fl.expired(now, s.fl.start(now))
	var out []Delivery
	for _, f := range fs {
		r := s.fail(f, PolicyDelay, ReasonAckTimeout, now)
		out = append(out, Delivery{Member: f.member, Partition: f.id.part, Offset: f.id.off, Key: f.key, Count: f.count, Dead: r.Dead})
	}
	return out
}

// NextDeadline is the earliest time after now at which Tick or Deliver
// would do something new by time alone: an ack deadline, or a nack delay
// ending. Redeliveries already due are not counted: they wait for a member
// that may take them (credits, a join), not for time, and the actor's next
// Deliver picks them up. ok is false when nothing waits on time. The actor
// arms one timer for it. The time is exact, never a stale timer's: the
// call takes out the timers up to the earliest live one, which costs as
// in Tick (the stale and due ones it meets are dropped).
func (s *Sub) NextDeadline(now time.Time) (t time.Time, ok bool) {
	s.fl.start(now)
	return s.fl.next(now)
}

// InFlightIn is the number of messages of partition p in flight to m.
// Its cost is linear in the messages in flight.
func (s *Sub) InFlightIn(m MemberID, p uint32) int {
	n := 0
	if w := s.fl.flights[msgID{view: s.ViewOf(m), part: p}]; w != nil {
		w.each(func(_ int64, f *flight) {
			if f.member == m {
				n++
			}
		})
	}
	return n
}

// TakeCredit uses one of m's credits for something other than a log
// message (a request-reply call), reporting whether m had one.
func (s *Sub) TakeCredit(m MemberID) bool {
	ms := s.members[m]
	if ms == nil || ms.credits == 0 {
		return false
	}
	ms.credits--
	return true
}

// Flights lists the messages in flight to m as (partition, offset) pairs,
// ordered.
func (s *Sub) Flights(m MemberID) []Delivery {
	var out []Delivery
	for _, f := range s.fl.sorted(func(f *flight) bool { return f.member == m }) {
		out = append(out, Delivery{Member: m, Partition: f.id.part, Offset: f.id.off, Key: f.key, Count: f.count})
	}
	return out
}
