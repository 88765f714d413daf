package netio

import (
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/encoding/protowire"
)

// Admission: overload of produce requests is fair between connections and
// explicit (THROTTLED with a retry-after), decided before queues grow.
//
// Every produce request the event loop routes is counted, by its frame
// size, broker-wide (admission.inflight) and on its connection
// (admitCounter) from the moment it is routed until its response reaches
// the connection's session (conn.answer). The loop decides each produce
// from those counters alone (atomics, no lock, no actor):
//
//   - while the broker-wide total with the request stays at or below the
//     soft threshold (half the limit), it is admitted;
//   - over it, a request is admitted while its connection's own bytes in
//     flight with it stay within the connection's fair share: the limit
//     divided by the connections with produce bytes in flight (this one
//     included). A light producer stays within its share, so it is
//     admitted however loaded the broker is, and never waits behind heavy
//     ones;
//   - a request bigger than a share, from a connection with nothing in
//     flight, is admitted while the total with it stays within the limit
//     (or when nothing at all is in flight, so that any request can pass),
//     in its turn: while such connections wait, they wait in one line
//     (admitqueue.go) and the room goes to them in order;
//   - else the connection waits: the frame stays unread at the head of its
//     input and reads pause (deferProduce) until one of the connection's
//     produces is answered or the retry-after below passes, and is decided
//     again then. A frame still refused after MaxProduceDefer (1 s) is
//     answered THROTTLED, with a retry-after of how long the connection's
//     excess over its share takes to drain at its share of the measured
//     drain rate (bytes answered per second). Waiting costs the broker
//     nothing (the bytes stay in the kernel) and keeps a pipelining
//     producer's order; answering at once made every frame the producer
//     had in flight behind the refused one a wasted read and a retry.
//
// "The limit" is the limit in force: the configured limit, unless the
// latency control (latency.go) lowered it while a light producer was slow.
//
// The limit is therefore exceeded only by connections within their share
// (whose shares sum to the limit), so the total stays below about twice
// the limit. MaxQueuedRequestBytes, which counts the same frames, remains
// the hard memory bound. The limit's job is to keep the partitions' queues
// (mailbox, raft uncommitted bytes, log writer, the fsync's dirty data)
// and the goroutines working through them short, so that the time a
// request waits in them stays near the time the broker takes to drain the
// limit.

// Admission timing constants.
const (
	// rateWindow is how often the drain rate is sampled.
	rateWindow = 100 * time.Millisecond
	// minRetryAfter and maxRetryAfter clamp the retry-after hint.
	minRetryAfter = time.Millisecond
	maxRetryAfter = time.Second
	// unknownRetryAfter is the hint before a drain rate was measured.
	unknownRetryAfter = 20 * time.Millisecond
)

// verdict is admission's decision on one produce request.
type verdict uint8

const (
	admitted verdict = iota
	// throttledShare: over the soft threshold, and the connection over its
	// fair share.
	throttledShare
	// throttledLimit: over the limit, and the connection over its share.
	throttledLimit
)

// admission is the broker-wide produce admission state. Its methods are
// pure (time comes in as now, Unix nanoseconds) and safe for concurrent
// use: admit runs on the event loops, release on session actors.
type admission struct {
	max   int64 // the configured limit; 0: admission control is off (every request admitted)
	floor int64 // the least the latency control lowers the limit to
	// limit is the limit in force: max, unless the latency control
	// (latency.go) lowered it; the soft threshold is half of it.
	limit atomic.Int64
	lat   latencyControl

	inflight atomic.Int64 // produce bytes admitted and not yet answered
	active   atomic.Int64 // connections with produce bytes in flight

	// Drain rate: bytes released per second, smoothed over samples at
	// least rateWindow apart.
	released    atomic.Int64 // bytes ever released (answered)
	sampleAt    atomic.Int64 // unix nanos of the last sample; 0 = none
	sampleBytes atomic.Int64 // released at the last sample
	sampleBusy  atomic.Bool  // produce bytes were in flight at the last sample
	rate        atomic.Int64 // bytes/s; 0 = not measured yet
}

// admitCounter is one connection's produce bytes in flight, and the most
// it had in flight at once lately: a connection is light (latency.go)
// only while both are small, so that a heavy producer whose answers come
// in bursts (a sync answers all it carried) is not taken for a light one
// each time its bytes in flight dip.
type admitCounter struct {
	own atomic.Int64
	// peak is the most own reached in the window that began at peakAt
	// (latencyWindow long), prevPeak in the window before it. Written on
	// the connection's event loop only: where bytes are taken (notePeak)
	// and where a check finds the window over (rotate).
	peak, prevPeak, peakAt atomic.Int64
}

// rotate starts a new peak window if the current one is over at now.
func (c *admitCounter) rotate(now int64) {
	at := c.peakAt.Load()
	d := now - at
	if d < int64(latencyWindow) {
		return
	}
	prev := int64(0)
	if d < 2*int64(latencyWindow) {
		prev = c.peak.Load()
	}
	c.prevPeak.Store(prev)
	c.peak.Store(0)
	c.peakAt.Store(now)
}

// notePeak counts own, c's bytes in flight at now, in its peak window.
func (c *admitCounter) notePeak(own, now int64) {
	c.rotate(now)
	if own > c.peak.Load() {
		c.peak.Store(own)
	}
}

// light reports whether c, with size more bytes in flight, stays a light
// producer: at most sparseBytes in flight now and at any time in this
// peak window and the one before.
func (c *admitCounter) light(size, now int64) bool {
	if c.own.Load()+size > sparseBytes {
		return false
	}
	c.rotate(now)
	return c.peak.Load() <= sparseBytes && c.prevPeak.Load() <= sparseBytes
}

func newAdmission(limit int64, target time.Duration) *admission {
	limit = max(limit, 0)
	a := &admission{max: limit, floor: min(limit, max(limit/64, minLatencyLimit))}
	a.limit.Store(limit)
	a.lat.target = int64(max(target, 0))
	a.showLimit()
	return a
}

// admit decides a produce request of size bytes on connection c. When it
// admits, the bytes are counted until release; otherwise it returns how
// long the connection should wait before sending more.
func (a *admission) admit(c *admitCounter, size, now int64) (verdict, time.Duration) {
	v, wait := a.decide(c, size, now, true)
	if v == admitted {
		a.take(c, size, now)
	}
	return v, wait
}

// decide is admit's decision, counting nothing.
//
// turn is false while other connections wait in the admission line ahead
// of c: c is then admitted only within its fair share, so that the bytes
// freed go to the connections in line in their order.
func (a *admission) decide(c *admitCounter, size, now int64, turn bool) (verdict, time.Duration) {
	if a.max == 0 {
		return admitted, 0
	}
	limit := a.limit.Load()
	total, own := a.inflight.Load(), c.own.Load()
	if wait := a.paced(c, size, now); wait > 0 {
		return throttledLimit, min(wait, maxRetryAfter)
	}
	if total+size <= limit/2 {
		return admitted, 0
	}
	act := a.active.Load()
	if own == 0 {
		act++ // c would be active
	}
	act = max(act, 1)
	share := limit / act
	if own+size <= share || own == 0 && turn && (total+size <= limit || total == 0) {
		return admitted, 0
	}
	v := throttledShare
	if total+size > limit {
		v = throttledLimit
	}
	a.observe(now)
	return v, a.retryAfter(own+size-share, act)
}

// take counts size admitted bytes on c at now.
func (a *admission) take(c *admitCounter, size, now int64) {
	a.spend(c, size, now)
	a.inflight.Add(size)
	own := c.own.Add(size)
	if own == size && size > 0 {
		a.active.Add(1)
	}
	c.notePeak(own, now)
}

// release uncounts size bytes of c whose response was sent, and counts
// them as drained.
func (a *admission) release(c *admitCounter, size, now int64) {
	a.uncount(c, size)
	a.released.Add(size)
	a.observe(now)
	a.adjust(now)
}

// cancel uncounts size bytes of c that were admitted but never served
// (the connection's window was full, or it closed): they did not drain.
func (a *admission) cancel(c *admitCounter, size int64) { a.uncount(c, size) }

func (a *admission) uncount(c *admitCounter, size int64) {
	if size == 0 {
		return
	}
	a.inflight.Add(-size)
	if c.own.Add(-size) == 0 {
		a.active.Add(-1)
	}
}

// observe samples the drain rate at most once per rateWindow. An interval
// that began with nothing in flight is skipped: idle time is not a slow
// drain.
func (a *admission) observe(now int64) {
	at := a.sampleAt.Load()
	if at != 0 && now-at < int64(rateWindow) {
		return
	}
	if !a.sampleAt.CompareAndSwap(at, now) {
		return // another goroutine samples
	}
	rel := a.released.Load()
	prev := a.sampleBytes.Swap(rel)
	busy := a.sampleBusy.Swap(a.inflight.Load() > 0)
	if at == 0 || !busy || now <= at {
		return
	}
	inst := int64(float64(rel-prev) * 1e9 / float64(now-at))
	if old := a.rate.Load(); old > 0 {
		inst = (old + inst) / 2
	}
	a.rate.Store(inst)
}

// retryAfter is how long excess bytes take to drain at a fair share (one
// of act connections) of the measured drain rate, clamped to
// [minRetryAfter, maxRetryAfter].
func (a *admission) retryAfter(excess, act int64) time.Duration {
	rate := a.rate.Load()
	if rate <= 0 {
		return unknownRetryAfter
	}
	per := float64(rate) / float64(act)
	d := time.Duration(float64(excess) / per * float64(time.Second))
	return min(max(d, minRetryAfter), maxRetryAfter)
}

// drainRate is the measured drain rate in bytes per second (0: unknown).
func (a *admission) drainRate() int64 { return a.rate.Load() }

// deferProduce, on the event loop, decides whether the frame at the head of
// the connection's input (payload, n bytes on the wire) waits: a produce
// over the connection's fair share stays in the input, reads pause
// (pauseThrottle), and the loop looks again when one of the connection's
// produces is answered or after the retry-after admission computes.
// Nothing is read, decoded or refused meanwhile, so a producer that
// pipelines keeps its order, the broker spends no work on bytes it would
// throw away, and TCP flow control slows the producer. Once the frame has
// waited MaxProduceDefer, it goes on to onFrame, which answers THROTTLED.
func (c *conn) deferProduce(gc gnet.Conn, payload []byte, n int) bool {
	maxDefer := int64(c.s.cfg.MaxProduceDefer)
	if c.s.adm.max == 0 || maxDefer <= 0 || !isProduce(payload) {
		c.deferSince = 0
		return false
	}
	now := time.Now().UnixNano()
	front := c.wokenFromLine.Swap(false)
	v, wait := c.s.adm.decide(&c.adm, int64(n), now, front || c.s.admq.empty())
	if v == admitted {
		// Counted now: another loop could take the room before onFrame.
		c.s.adm.take(&c.adm, int64(n), now)
		c.preAdmitted = int64(n)
		c.deferSince = 0
		if front {
			c.s.admq.wakeNext() // room may be left for the next in line
		}
		return false
	}
	if c.deferSince == 0 {
		c.deferSince = now
	} else if now-c.deferSince >= maxDefer {
		c.deferSince = 0
		return false // onFrame answers THROTTLED
	}
	mProduceDeferred.Inc()
	c.deferred.Store(true)
	if c.adm.own.Load() == 0 {
		// Nothing of its own in flight to wake it: it waits in line for
		// bytes any connection frees.
		c.s.admq.wait(c, front)
		c.s.admq.wakeAfter(wait)
	}
	c.pause(gc, pauseThrottle)
	wait = min(wait, time.Duration(maxDefer-(now-c.deferSince)))
	if c.deferTimer == nil {
		c.deferTimer = time.AfterFunc(wait, func() {
			if c.deferred.CompareAndSwap(true, false) {
				_ = gc.Wake(nil)
			}
		})
	} else {
		c.deferTimer.Reset(wait)
	}
	return true
}

// isProduce reports whether an encoded Frame's body is a ProduceRequest
// or a PublishRequest,
// reading only its top-level field tags. As in protobuf decoding, the last
// field of the body oneof wins. It never panics; a payload it cannot walk
// is not a produce (DecodeFrame then reports it).
func isProduce(payload []byte) bool {
	last := protowire.Number(0)
	for len(payload) > 0 {
		num, typ, n := protowire.ConsumeTag(payload)
		if n < 0 {
			return false
		}
		payload = payload[n:]
		m := protowire.ConsumeFieldValue(num, typ, payload)
		if m < 0 {
			return false
		}
		payload = payload[m:]
		if bodyFields[num] {
			last = num
		}
	}
	return last == produceField || last == publishField
}

// producing reports whether a decoded frame writes records: a produce or
// a publish through an exchange (admitted, and charged to produce quotas,
// alike).
func producing(f *heraldpb.Frame) bool {
	switch f.Body.(type) {
	case *heraldpb.Frame_Produce, *heraldpb.Frame_Publish:
		return true
	}
	return false
}

// produceField and publishField are Frame.produce's and Frame.publish's
// field numbers; bodyFields are the field numbers of Frame's body oneof.
var produceField, publishField, bodyFields = func() (protowire.Number, protowire.Number, map[protowire.Number]bool) {
	d := (&heraldpb.Frame{}).ProtoReflect().Descriptor()
	body := map[protowire.Number]bool{}
	fs := d.Oneofs().ByName("body").Fields()
	for i := range fs.Len() {
		body[fs.Get(i).Number()] = true
	}
	return d.Fields().ByName("produce").Number(), d.Fields().ByName("publish").Number(), body
}()
