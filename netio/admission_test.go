package netio

import (
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

// TestAdmissionFairShare drives the admission state alone: heavy
// connections are held to the limit and their share and throttled with a
// hint, while a light connection is admitted whatever the heavy ones do.
func TestAdmissionFairShare(t *testing.T) {
	const kib = 1 << 10
	a := newAdmission(1024*kib, 0) // soft threshold 512 KiB
	heavy := make([]*admitCounter, 4)
	for i := range heavy {
		heavy[i] = &admitCounter{}
	}
	light := &admitCounter{}
	now := int64(1)
	admit := func(c *admitCounter, size int64, want verdict, why string) time.Duration {
		t.Helper()
		v, ra := a.admit(c, size, now)
		if v != want {
			t.Fatalf("%s: verdict %d, want %d (inflight %d KiB, own %d KiB, active %d)",
				why, v, want, a.inflight.Load()/kib, c.own.Load()/kib, a.active.Load())
		}
		if (v == admitted) != (ra == 0) {
			t.Fatalf("%s: verdict %d with retry-after %v", why, v, ra)
		}
		return ra
	}

	// Below the soft threshold everything is admitted, even one
	// connection far over its share.
	for i := 0; i < 4; i++ {
		admit(heavy[0], 128*kib, admitted, "below the soft threshold")
	}
	// Over it: heavy[0] is alone, its share is the whole limit.
	admit(heavy[0], 256*kib, admitted, "alone, within the limit")
	// An idle connection's big request fits under the limit: admitted.
	admit(heavy[1], 256*kib, admitted, "idle connection, room under the limit")
	// Now 1 MiB in flight, two active, share 512 KiB: heavy[0] (768 KiB)
	// is over it; no rate is known yet.
	if ra := admit(heavy[0], 128*kib, throttledLimit, "heavy over its share and the limit"); ra != unknownRetryAfter {
		t.Fatalf("retry after %v before a rate is known, want %v", ra, unknownRetryAfter)
	}
	// heavy[1] is within its share (256+128 <= 512): admitted over the
	// limit.
	admit(heavy[1], 128*kib, admitted, "within its share, over the limit")
	// Idle heavies with requests bigger than a share (1 MiB/3): no room
	// under the limit.
	admit(heavy[2], 512*kib, throttledLimit, "idle, bigger than a share, no room")
	// The light connection: admitted request after request within its
	// share (1 MiB / 3 active), however far over the limit the broker is.
	for i := 0; i < 20; i++ {
		admit(light, 8*kib, admitted, "light")
	}
	if got := a.active.Load(); got != 3 {
		t.Fatalf("active %d, want 3", got)
	}

	// Drain: answers release bytes; the rate is learnt from samples. The
	// throttles above took the first sample (busy, nothing drained).
	a.release(heavy[0], 512*kib, now)
	now += 100 * ms
	a.release(heavy[0], 256*kib, now) // 768 KiB in 100ms
	if r := a.drainRate(); r != 7680*kib {
		t.Fatalf("drain rate %d B/s, want %d", r, 7680*kib)
	}
	// heavy[0] is idle again; 544 KiB in flight (heavy[1] 384, light
	// 160). Its 512 KiB request would pass the limit, and exceeds its
	// share (1 MiB / 3) by 170.7 KiB, draining at 2560 KiB/s: 66.7ms.
	ra := admit(heavy[0], 512*kib, throttledLimit, "idle, no room")
	if want := 66666 * time.Microsecond; ra < want-time.Millisecond || ra > want+time.Millisecond {
		t.Fatalf("retry after %v, want about %v", ra, want)
	}
	// Between soft and limit, over its share but not the limit.
	a.release(light, 160*kib, now)
	admit(heavy[0], 256*kib, admitted, "idle, room under the limit")
	admit(heavy[0], 384*kib, throttledShare, "over its share (1 MiB / 2), under the limit")
	// Nothing in flight: a request bigger than the limit still passes.
	a.release(heavy[0], 256*kib, now)
	a.cancel(heavy[1], 384*kib)
	if a.inflight.Load() != 0 || a.active.Load() != 0 {
		t.Fatalf("after releasing all: inflight %d active %d", a.inflight.Load(), a.active.Load())
	}
	admit(heavy[3], 2048*kib, admitted, "bigger than the limit, nothing in flight")
	a.release(heavy[3], 2048*kib, now)
	if a.inflight.Load() != 0 || a.active.Load() != 0 {
		t.Fatalf("after releasing all: inflight %d active %d", a.inflight.Load(), a.active.Load())
	}
}

// TestAdmissionRate checks the drain rate's sampling: idle intervals are
// not counted as slow drains, and the hint stays within its bounds.
func TestAdmissionRate(t *testing.T) {
	a := newAdmission(1<<20, 0)
	c := &admitCounter{}
	now := int64(time.Second)
	a.admit(c, 1000, now)
	a.release(c, 1000, now) // first sample, nothing in flight after
	now += 10 * int64(time.Second)
	a.admit(c, 1000, now)
	a.release(c, 1000, now) // the interval began idle: skipped
	if r := a.drainRate(); r != 0 {
		t.Fatalf("rate %d after an idle interval, want 0 (unknown)", r)
	}
	a.admit(c, 500, now)
	a.observe(now + int64(rateWindow)) // busy sample
	now += 2 * int64(rateWindow)
	a.release(c, 500, now) // 500 B over 100ms from a busy sample
	if r := a.drainRate(); r != 5000 {
		t.Fatalf("rate %d, want 5000", r)
	}
	if d := a.retryAfter(1<<30, 1); d != maxRetryAfter {
		t.Fatalf("retry %v, want the maximum", d)
	}
	if d := a.retryAfter(1, 1); d != minRetryAfter {
		t.Fatalf("retry %v, want the minimum", d)
	}
	// Off: every request admitted and counted.
	off := newAdmission(-1, 0)
	for i := 0; i < 100; i++ {
		if v, _ := off.admit(c, 1<<30, now); v != admitted {
			t.Fatal("admission off throttled")
		}
	}
}

// TestAdmissionTurn: while others wait in line, a connection with nothing
// in flight is admitted only within its fair share, not into the room
// under the limit, which goes to the line in its order.
func TestAdmissionTurn(t *testing.T) {
	const kib = 1 << 10
	a := newAdmission(1024*kib, 0)
	busy, idle := &admitCounter{}, &admitCounter{}
	if v, _ := a.admit(busy, 500*kib, 1); v != admitted {
		t.Fatal("first request refused")
	}
	// With idle's 520 KiB, over the soft threshold; 520 KiB is over its
	// share (1 MiB / 2) but fits under the limit.
	if v, _ := a.decide(idle, 520*kib, 1, false); v == admitted {
		t.Fatal("admitted out of turn into the room under the limit")
	}
	if v, _ := a.decide(idle, 520*kib, 1, true); v != admitted {
		t.Fatal("refused in its turn with room under the limit")
	}
	// Within its share it needs no turn.
	if v, _ := a.decide(idle, 64*kib, 1, false); v != admitted {
		t.Fatal("refused within its fair share")
	}
}

// TestLatencyControl drives the limit in force: a window with a sparse
// produce slower than the target halves it down to the floor; windows
// without one raise it back to the configured limit.
func TestLatencyControl(t *testing.T) {
	const mib = 1 << 20
	a := newAdmission(16*mib, 20*time.Millisecond)
	if a.floor != 256<<10 {
		t.Fatalf("floor %d, want 256 KiB (16 MiB / 64)", a.floor)
	}
	lightC, heavyC := &admitCounter{}, &admitCounter{}
	lightC.own.Store(64 << 10)
	heavyC.own.Store(64<<10 + 1)
	if !a.sparse(lightC, 0) || a.sparse(heavyC, 0) {
		t.Fatal("sparse: a connection with at most 64 KiB in flight")
	}
	now := int64(time.Second)
	a.adjust(now) // opens the first window
	want := int64(16 * mib)
	for range 6 { // 16 MiB halved to 256 KiB
		now += 40 * ms
		a.sampleSparse(5*ms, now)  // fast: does not count against
		a.sampleSparse(30*ms, now) // admitted 10 ms after the last cut: counts
		a.sampleSparse(50*ms, now) // admitted before it: says nothing of it
		now += int64(latencyWindow)
		a.sampleSparse(1*ms, now) // ends the window with the slow one in it
		want = max(256<<10, want/2)
		if got := a.limit.Load(); got != want {
			t.Fatalf("after a slow window: limit %d, want %d", got, want)
		}
	}
	if want != 256<<10 || a.lat.pace.Load() != 0 {
		t.Fatalf("never reached the floor (%d), or paced before it", want)
	}
	// The limit in force decides: 600 KiB in flight is over it.
	c, other := &admitCounter{}, &admitCounter{}
	a.admit(other, 600<<10, now)
	if v, _ := a.decide(c, 520<<10, now, true); v != throttledLimit {
		t.Fatalf("verdict %d over the lowered limit, want throttledLimit", v)
	}
	a.cancel(other, 600<<10)
	// Still slow at the floor: produces that are not sparse are paced,
	// from half the drain rate (64 MiB/s before one is measured) down to
	// 4 MiB/s.
	for _, wantPace := range []int64{32 * mib, 16 * mib, 8 * mib, 4 * mib, 4 * mib} {
		now += int64(latencyWindow)
		a.sampleSparse(30*ms, now) // admitted 70 ms after the last change
		if got := a.lat.pace.Load(); got != wantPace {
			t.Fatalf("pace %d B/s, want %d", got, wantPace)
		}
	}
	// The bucket, filled at 4 MiB/s, emptied here: a 256 KiB frame waits
	// for its bytes; a sparse one goes at once.
	a.lat.tokens.Store(0)
	a.lat.tokAt.Store(now)
	if wait := a.paced(&admitCounter{}, 256<<10, now); wait <= 0 {
		t.Fatal("a 256 KiB produce not paced with an empty bucket")
	}
	if wait := a.paced(&admitCounter{}, 8<<10, now); wait != 0 {
		t.Fatalf("a sparse produce paced (%v)", wait)
	}
	now += int64(100 * time.Millisecond) // 400 KiB at 4 MiB/s
	if wait := a.paced(&admitCounter{}, 256<<10, now); wait != 0 {
		t.Fatalf("a 256 KiB produce waits %v with 400 KiB in the bucket", wait)
	}
	a.take(c, 256<<10, now)
	if wait := a.paced(c, 256<<10, now); wait <= 0 {
		t.Fatal("the bucket did not pay for the produce admitted")
	}
	// A window without a slow sparse produce (this answer ends one)
	// eases the pacing first; here it ends it (4 MiB/s is over twice the
	// drain measured, 0), and leaves the limit where it was.
	a.release(c, 256<<10, now)
	if a.lat.pace.Load() != 0 || a.limit.Load() != want {
		t.Fatalf("pace %d, limit %d after a good window: want pacing ended, the limit unchanged", a.lat.pace.Load(), a.limit.Load())
	}
	// Windows with only fast sparse produces, or none, raise it by
	// 16 MiB / 32 each, to the configured limit and no further.
	for i := range 40 {
		now += int64(latencyWindow)
		if i%2 == 0 {
			a.sampleSparse(2*ms, now)
		} else {
			a.release(c, 0, now) // any answered produce ends a due window
		}
		want = min(16*mib, want+mib/2)
		if got := a.limit.Load(); got != want {
			t.Fatalf("window %d without a slow produce: limit %d, want %d", i, got, want)
		}
	}
	// After an idle spell the limit is back at once: one step per window
	// passed.
	for range 4 {
		now += int64(latencyWindow)
		a.sampleSparse(30*ms, now)
	}
	if got := a.limit.Load(); got != 1*mib {
		t.Fatalf("limit %d after four slow windows, want 1 MiB", got)
	}
	now += 10 * int64(time.Second)
	a.release(c, 0, now)
	if got := a.limit.Load(); got != 16*mib {
		t.Fatalf("limit %d after 10 s idle, want 16 MiB", got)
	}
	// Off: the limit stays.
	off := newAdmission(16*mib, 0)
	off.sampleSparse(time.Second.Nanoseconds(), now)
	off.adjust(now + time.Hour.Nanoseconds())
	if off.sparse(&admitCounter{}, now) || off.limit.Load() != 16*mib {
		t.Fatal("latency control off moved the limit")
	}
}

// TestSparseNeedsALightConnection: a produce is sparse only on a
// connection that had at most 64 KiB in flight all through this latency
// window and the last. A heavy producer whose answers come in bursts (a
// sync answers every batch it carried) has almost nothing in flight right
// after each burst; its next produce was taken for a light producer's,
// and its latency (which includes waiting for the next sync) cut the
// limit in force under the producer's own load. Pacing exempts the same
// light connections.
func TestSparseNeedsALightConnection(t *testing.T) {
	const mib = 1 << 20
	a := newAdmission(16*mib, 10*time.Millisecond)
	now := int64(time.Second)
	heavy, light := &admitCounter{}, &admitCounter{}
	for range 32 { // a pipelining producer: 32 batches of 32 KiB in flight
		if v, _ := a.admit(heavy, 32<<10, now); v != admitted {
			t.Fatalf("verdict %d under the soft limit", v)
		}
	}
	a.release(heavy, 32*32<<10, now) // one sync answers them all
	if v, _ := a.admit(heavy, 32<<10, now+ms); v != admitted || a.sparse(heavy, now+ms) {
		t.Fatal("the heavy producer's next batch, right after its burst of answers, was taken for a light producer's")
	}
	if v, _ := a.admit(light, 4<<10, now+ms); v != admitted || !a.sparse(light, now+ms) {
		t.Fatal("a light producer's produce was not sparse")
	}
	// Pacing: the heavy connection's small batch is paced, the light one's
	// is not.
	a.setPace(4 * mib)
	a.lat.tokens.Store(0)
	a.lat.tokAt.Store(now + ms)
	if wait := a.paced(heavy, 4<<10, now+ms); wait <= 0 {
		t.Fatal("a heavy connection's small batch escaped pacing")
	}
	if wait := a.paced(light, 4<<10, now+ms); wait != 0 {
		t.Fatalf("a light connection's produce paced (%v)", wait)
	}
	a.setPace(0)
	// Light again once a whole window and the one before passed with at
	// most 64 KiB in flight.
	a.release(heavy, 32<<10, now+2*ms)
	later := now + ms
	for i := range 3 {
		later += int64(latencyWindow)
		a.admit(heavy, 16<<10, later)
		sparse := a.sparse(heavy, later)
		a.release(heavy, 16<<10, later)
		if want := i >= 1; sparse != want {
			t.Fatalf("%d windows after the burst: sparse %v, want %v", i+1, sparse, want)
		}
	}
}

// TestLatencyControlSlowDisk: where even the fastest sparse produce is
// slower than the target (a slow disk), the target becomes four times
// that baseline after an epoch, so the control acts on queueing only.
func TestLatencyControlSlowDisk(t *testing.T) {
	const mib = 1 << 20
	a := newAdmission(16*mib, 10*time.Millisecond)
	now := int64(time.Second)
	a.adjust(now)
	window := func(lats ...int64) {
		now += int64(latencyWindow) - 1 // answered within the window
		for _, l := range lats {
			a.sampleSparse(l, now)
		}
		now++
		a.adjust(now)
	}
	// The first epoch: every produce takes 20-30 ms, over the 10 ms
	// target, so the limit is cut to the floor.
	for range int(baselineEpoch/latencyWindow) - 1 {
		window(20*ms, 30*ms)
	}
	if got := a.limit.Load(); got != a.floor {
		t.Fatalf("limit %d after an epoch over the target, want the floor %d", got, a.floor)
	}
	if a.lat.pace.Load() == 0 {
		t.Fatal("not paced at the floor over the target")
	}
	window(20*ms, 30*ms) // ends the epoch: pacing ends too
	if got := a.targetNow(); got != 80*ms {
		t.Fatalf("target %v, want 80ms (4 x the fastest, 20 ms)", time.Duration(got))
	}

	// The same latencies no longer cut: the limit climbs back.
	for range 40 {
		window(20*ms, 30*ms)
	}
	if got := a.limit.Load(); got != 16*mib {
		t.Fatalf("limit %d, want it back at 16 MiB", got)
	}
	// Queueing over four times the baseline still cuts.
	window(20*ms, 100*ms)
	if got := a.limit.Load(); got != 8*mib {
		t.Fatalf("limit %d after a window at 100 ms, want 8 MiB", got)
	}
}
