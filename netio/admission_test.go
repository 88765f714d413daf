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
	a := newAdmission(1024 * kib) // soft threshold 512 KiB
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
	a := newAdmission(1 << 20)
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
	off := newAdmission(-1)
	for i := 0; i < 100; i++ {
		if v, _ := off.admit(c, 1<<30, now); v != admitted {
			t.Fatal("admission off throttled")
		}
	}
}
