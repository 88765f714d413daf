package netio

import (
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
// sparseBytes in flight: a producer that sends little, rarely. Admission
// stamps it, and its answer samples how long it took (admission to
// answer). Every latencyWindow the limit in force moves:
//
//   - down by half, not below the floor (a sixty-fourth of the configured
//     limit, at least 256 KiB), when a sparse produce in the window took
//     longer than the target;
//   - back up by a thirty-second of the configured limit per window
//     passed, not above it, otherwise, including when no sparse produce
//     was answered.
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
	epochStart     int64
	best, prevBest int64
	winBest        atomic.Int64 // the fastest sparse produce of the window; 0 = none
}

// sparse reports whether a produce whose connection has own bytes in
// flight with it is sampled.
func (a *admission) sparse(own int64) bool {
	return a.lat.target > 0 && a.max > 0 && own <= sparseBytes
}

// sampleSparse records a sparse produce answered after lat nanoseconds.
func (a *admission) sampleSparse(lat, now int64) {
	mSparseLatency.Observe(float64(lat) / 1e9)
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
	if !a.lat.winStart.CompareAndSwap(start, now) {
		return // another goroutine ends it
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
		a.lat.prevBest, a.lat.best, a.lat.epochStart = a.lat.best, 0, now
	}
	lim := a.limit.Load()
	if worst > a.targetNow() {
		lim = max(a.floor, lim/2)
		mProduceLimitCuts.Inc()
	} else {
		// One step per window passed: a limit cut before an idle spell is
		// back by the time produces resume.
		steps := max((now-start)/int64(latencyWindow), 1)
		lim = min(a.max, lim+steps*max(a.max/32, 1))
	}
	a.limit.Store(lim)
	mProduceLimit.Set(float64(lim))
}
