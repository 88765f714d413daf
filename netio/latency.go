package netio

import (
	"sync"
	"sync/atomic"
	"time"
)

// Latency control: the admission limit follows the latency of sparse
// produces.
//
// A light producer's request is admitted at once (it stays within its fair
// share), but it still waits behind the heavy producers' bytes in flight:
// for the CPU its hand-offs share with them, and for an fsync that commits
// the one filesystem journal their data goes through. So the bytes in
// flight that give the most throughput are not the bytes that keep a light
// producer's latency low, and only the broker sees both.
//
// A produce is sparse when its connection, with it, has at most
// sparseBytes in flight, and had at most that in flight at any time in the
// last 100 to 200 ms (two latencyWindows): a producer that sends little,
// rarely. (A heavy producer's bytes in flight dip each time a sync
// answers the batches it carried; its next produce is not a light
// producer's.) Admission
// stamps it, and its answer samples how long it took (admission to
// answer). Every latencyWindow the limit in force moves:
//
//   - down by half, not below the floor (a sixty-fourth of the configured
//     limit, at least 256 KiB), when a sparse produce answered in the
//     window, and admitted since the last cut, took longer than the
//     target;
//   - back up by a thirty-second of the configured limit per window
//     passed, not above it, otherwise, including when no sparse produce
//     was answered.
//
// Still slow with the limit at its floor (a little in flight drains fast,
// and the CPU the heavy bytes take is what the light producer waits for),
// produces that are not sparse are paced: a token bucket admits their
// bytes at half the measured drain rate, halved again each slow window
// (not below minPace), raised by an eighth each good window, and ended
// once it is over twice what drains, before the limit climbs again.
//
// The target is --produce-latency-target, or four times the fastest sparse
// produce of the previous baselineEpoch if that is more: on a disk whose
// fsync alone takes longer than the target, the control still acts on
// queueing, not on the disk's own speed.
//
// With no light producer (a few heavy ones, a benchmark) the limit stays
// at its maximum and costs nothing; with one, the heavy producers wait
// their turn in the admission line until the light one's requests are
// answered within the target. herald_produce_limit_bytes shows the limit
// in force; herald_produce_limit_cuts_total counts the cuts.

const (
	// sparseBytes: a produce is sparse when its connection, with it, has
	// at most this much in flight.
	sparseBytes = 64 << 10
	// minLatencyLimit is the least floor of the limit in force (unless the
	// configured limit is smaller).
	minLatencyLimit = 256 << 10
	// baselineEpoch is how long the fastest sparse produce is gathered
	// for the next epoch's target.
	baselineEpoch = 10 * time.Second
	// latencyWindow is how often the limit in force moves.
	latencyWindow = 100 * time.Millisecond
	// minPace is the slowest pacing rate, bytes per second.
	minPace = 4 << 20
)

// showLimit shows the limit in force (herald_produce_limit_bytes).
func (a *admission) showLimit() { mProduceLimit.Set(float64(a.limit.Load())) }

// latencyControl is the state of admission's latency control.
type latencyControl struct {
	target   int64        // nanoseconds; 0: off (the limit stays at max)
	winStart atomic.Int64 // unix nanos the window began; 0 = none yet
	winWorst atomic.Int64 // the longest sparse produce answered in the window
	// The baseline: the fastest sparse produce of the epoch (best, 0 =
	// none yet), and of the epoch before (prevBest), which sets the target.
	// Touched only by the goroutine that ends a window.
	mu             sync.Mutex // held by the goroutine that ends a window
	epochStart     int64
	best, prevBest int64
	// changedAt: unix nanos the limit or the pace was last lowered. A
	// sparse produce admitted before it waited behind the bytes let in
	// before the cut: it says nothing of the new setting.
	changedAt atomic.Int64
	winBest   atomic.Int64 // the fastest sparse produce of the window; 0 = none

	// Pacing, once the limit is at its floor: bytes per second admitted
	// for produces that are not sparse (0: not paced), and the token bucket
	// that meters them.
	pace   atomic.Int64
	tokens atomic.Int64 // bytes that may be admitted now; may go below 0
	tokAt  atomic.Int64 // unix nanos the bucket was last filled
}

// paced reports how long a produce of size bytes on connection c must
// wait for the pacing rate; 0: it may go now. Sparse produces (a light
// connection's) are never paced.
func (a *admission) paced(c *admitCounter, size, now int64) time.Duration {
	p := a.lat.pace.Load()
	if p == 0 || c.light(size, now) {
		return 0
	}
	burst := max(p/10, minLatencyLimit)
	at := a.lat.tokAt.Load()
	if now > at && a.lat.tokAt.CompareAndSwap(at, now) {
		add := int64(float64(p) * float64(now-at) / 1e9)
		for {
			t := a.lat.tokens.Load()
			if a.lat.tokens.CompareAndSwap(t, min(t+add, burst)) {
				break
			}
		}
	}
	need := min(size, burst)
	t := a.lat.tokens.Load()
	if t >= need {
		return 0
	}
	return max(time.Duration(float64(need-t)/float64(p)*1e9), minRetryAfter)
}

// spend takes an admitted produce's bytes (size, on c) from the pacing
// bucket.
func (a *admission) spend(c *admitCounter, size, now int64) {
	if a.lat.pace.Load() > 0 && !c.light(size, now) {
		a.lat.tokens.Add(-size)
	}
}

// setPace sets the pacing rate (0: off) and shows it.
func (a *admission) setPace(p int64) {
	a.lat.pace.Store(p)
	mProducePace.Set(float64(p))
}

// sparse reports whether a produce just admitted on connection c (its
// bytes counted) is sampled: c is light (admitCounter.light).
func (a *admission) sparse(c *admitCounter, now int64) bool {
	return a.lat.target > 0 && a.max > 0 && c.light(0, now)
}

// sampleSparse records a sparse produce answered after lat nanoseconds.
func (a *admission) sampleSparse(lat, now int64) {
	mSparseLatency.Observe(float64(lat) / 1e9)
	if now-lat < a.lat.changedAt.Load() {
		a.adjust(now)
		return // admitted before the last cut
	}
	lat = max(lat, 1)
	for {
		w := a.lat.winWorst.Load()
		if lat <= w || a.lat.winWorst.CompareAndSwap(w, lat) {
			break
		}
	}
	for {
		b := a.lat.winBest.Load()
		if b != 0 && lat >= b || a.lat.winBest.CompareAndSwap(b, lat) {
			break
		}
	}
	a.adjust(now)
}

// targetNow is the target in force: the configured one, or four times the
// previous epoch's fastest sparse produce if that is more.
func (a *admission) targetNow() int64 {
	return max(a.lat.target, 4*a.lat.prevBest)
}

// adjust ends the window when it is due and moves the limit in force.
func (a *admission) adjust(now int64) {
	if a.lat.target == 0 || a.max == 0 {
		return
	}
	start := a.lat.winStart.Load()
	if start != 0 && now-start < int64(latencyWindow) {
		return
	}
	if !a.lat.mu.TryLock() {
		return // another goroutine is ending a window
	}
	defer a.lat.mu.Unlock()
	if !a.lat.winStart.CompareAndSwap(start, now) {
		return // another goroutine ended it
	}
	worst, best := a.lat.winWorst.Swap(0), a.lat.winBest.Swap(0)
	if start == 0 {
		a.lat.epochStart = now
		return
	}
	if best > 0 && (a.lat.best == 0 || best < a.lat.best) {
		a.lat.best = best
	}
	if now-a.lat.epochStart >= int64(baselineEpoch) {
		if a.lat.best > 0 { // an epoch without a sparse produce keeps the baseline
			a.lat.prevBest = a.lat.best
		}
		a.lat.best, a.lat.epochStart = 0, now
	}
	lim, pace := a.limit.Load(), a.lat.pace.Load()
	steps := max((now-start)/int64(latencyWindow), 1)
	switch {
	case worst > a.targetNow() && lim == a.floor:
		// Still slow at the floor: pace, or pace slower.
		if pace == 0 {
			pace = a.rate.Load()
			if pace <= 0 {
				pace = 64 << 20
			}
			a.lat.tokens.Store(0)
			a.lat.tokAt.Store(now)
		}
		a.setPace(max(pace/2, minPace))
		a.lat.changedAt.Store(now)
		mProduceLimitCuts.Inc()
	case worst > a.targetNow():
		lim = max(a.floor, lim/2)
		a.lat.changedAt.Store(now)
		mProduceLimitCuts.Inc()
	case pace > 0:
		// Pacing eases off first, by an eighth per window passed, and
		// ends once it no longer holds anything back (twice what drains).
		for range min(steps, 64) {
			pace += pace / 8
		}
		if pace > 2*max(a.rate.Load(), 1) {
			pace = 0
		}
		a.setPace(pace)
	default:
		// One step per window passed: a limit cut before an idle spell is
		// back by the time produces resume.
		lim = min(a.max, lim+steps*max(a.max/32, 1))
	}
	a.limit.Store(lim)
	mProduceLimit.Set(float64(lim))
}
