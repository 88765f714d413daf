package scheduler

// Idempotent delayed produces: the batches an idempotent producer sent lately, by producer id and sequence, so that a retry is answered with the first attempt's schedule id instead of being stored again.

import (
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// A producer retries a delayed batch when it does not know whether the
// first attempt was stored: a lost answer, a timeout, or the scheduler
// moving to another node mid-request. Stored twice, the batch would fire
// twice, each time to the partition the round robin gave that attempt.
// So an idempotent producer numbers its delayed batches (producer id and
// a sequence per batch, the same on every retry), and the scheduler
// remembers the batches it stored lately: a retry of one gets the first
// attempt's answer (schedule id, partition, time).
//
// Delayed batches carry no order (they fire by their time), so a
// producer's batches may arrive in any order: what is remembered is a set
// per producer, not a next sequence. It is a window, as NATS JetStream's
// duplicate window: batches stored within DedupWindow, at most DedupMax
// of them (the oldest forgotten first). The scheduled records carry the
// producer id and sequence, and __schedule is not truncated past a
// remembered batch, so a scheduler that takes over (on another node,
// after a restart) rebuilds the window from the log.

// dedupKey names one delayed batch of an idempotent producer.
type dedupKey struct {
	pid uint64
	seq int64
}

// dedupState is what became of the first attempt of a batch.
type dedupState uint8

const (
	dedupWriting dedupState = iota // its write to __schedule is in flight
	dedupStored                    // stored: ref, part, at, count hold its answer
	// dedupUnknown: its write failed, and may yet have been stored. A
	// retry cannot be told anything until the batch is forgotten (this
	// scheduler learns no more of that write; the next one loads it).
	dedupUnknown
)

type dedupEntry struct {
	state   dedupState
	ref     uint64 // its schedule id
	part    uint32
	at      int64
	count   uint32
	loc     int64 // offset of its record in __schedule, or (until its write is answered) where the log ended before it
	created int64 // ms, when it was scheduled
	gen     uint64
}

// dedupOrder is one remembered batch in the order they were stored (the
// queue forgets from its head).
type dedupOrder struct {
	key     dedupKey
	created int64
	gen     uint64 // the entry's: a slot whose entry was forgotten or replaced is skipped
}

type dedup struct {
	window time.Duration
	max    int
	byKey  map[dedupKey]*dedupEntry
	order  []dedupOrder // oldest first; entries replaced since are skipped
	gen    uint64
	// loadNowMs is the scheduler's time when it loads __schedule: a
	// batch read there created later (a clock stepped back since) counts
	// as created then.
	loadNowMs int64
}

func newDedup(window time.Duration, max int) dedup {
	return dedup{window: window, max: max, byKey: map[dedupKey]*dedupEntry{}}
}

// lookup returns what is known of batch k, nil if nothing.
func (d *dedup) lookup(k dedupKey) *dedupEntry { return d.byKey[k] }

// add remembers batch k, created at createdMs, forgetting the oldest past
// the bound.
func (d *dedup) add(k dedupKey, e *dedupEntry) {
	if d.max <= 0 || k.pid == 0 {
		return
	}
	d.gen++
	e.gen = d.gen
	d.order = append(d.order, dedupOrder{key: k, created: e.created, gen: e.gen})
	d.byKey[k] = e
	for len(d.byKey) > d.max {
		d.popOldest()
		mDedupEvicted.Inc()
	}
	if len(d.order) > 2*max(len(d.byKey), 1024) {
		d.dropStale() // slots of forgotten batches
	}
	mDedupEntries.Set(float64(len(d.byKey)))
}

// dropStale removes the order slots of batches forgotten or replaced.
func (d *dedup) dropStale() {
	kept := d.order[:0]
	for _, o := range d.order {
		if e := d.byKey[o.key]; e != nil && e.gen == o.gen {
			kept = append(kept, o)
		}
	}
	clear(d.order[len(kept):])
	d.order = kept
}

// forget drops batch k, if e is still what is known of it (its order slot
// is skipped when it comes up).
func (d *dedup) forget(k dedupKey, e *dedupEntry) {
	if d.byKey[k] == e {
		delete(d.byKey, k)
		mDedupEntries.Set(float64(len(d.byKey)))
	}
}

func (d *dedup) popOldest() {
	o := d.order[0]
	d.order[0] = dedupOrder{}
	d.order = d.order[1:]
	if e := d.byKey[o.key]; e != nil && e.gen == o.gen {
		delete(d.byKey, o.key)
	}
}

// expire forgets the batches stored more than the window before nowMs.
func (d *dedup) expire(nowMs int64) {
	limit := nowMs - d.window.Milliseconds()
	for len(d.order) > 0 && d.order[0].created < limit {
		d.popOldest()
	}
	if cap(d.order) > 1024 && len(d.order) < cap(d.order)/4 {
		d.order = append([]dedupOrder(nil), d.order...)
	}
	mDedupEntries.Set(float64(len(d.byKey)))
}

// cut bounds __schedule's truncation: not past the record of a batch
// still remembered (the next scheduler rebuilds the window from them).
func (d *dedup) cut(cut int64) int64 {
	for _, e := range d.byKey {
		cut = min(cut, e.loc)
	}
	return cut
}

// loaded remembers a batch read from __schedule at offset off (a creation
// time after loadNowMs, from a clock stepped back since, counts as
// loadNowMs: the batch is not remembered longer than the window).
func (d *dedup) loaded(off uint64, sb *heraldpb.ScheduledBatch) {
	if sb.ProducerId == 0 {
		return
	}
	k := dedupKey{sb.ProducerId, sb.Sequence}
	if sb.Id != nil {
		if old := d.byKey[k]; old != nil && old.ref == sb.GetId() {
			// A copy compaction moved: the batch is the same, only its
			// record moved (the original's was cancelled with it).
			old.loc = int64(off)
			return
		}
	}
	ref := off
	if sb.Id != nil {
		ref = sb.GetId()
	}
	d.add(k, &dedupEntry{state: dedupStored, ref: ref, part: sb.Partition, at: sb.DeliverAtMs, count: sb.Count, loc: int64(off), created: min(sb.CreatedMs, d.loadNowMs)})
}
