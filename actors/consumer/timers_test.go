package consumer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/heraldmq/herald/retry"
)

// scanExpired is Tick's old linear computation: the flights whose ack
// deadline is at or before now, ordered by id.
func scanExpired(s *Sub, now time.Time) []Delivery {
	var out []Delivery
	for _, f := range s.fl.sorted(func(f *flight) bool { return !f.deadline.After(now) }) {
		out = append(out, Delivery{Member: f.member, Partition: f.id.part, Offset: f.id.off, Key: f.key, Count: f.count})
	}
	return out
}

// scanNext is NextDeadline's old linear computation.
func scanNext(s *Sub, now time.Time) (t time.Time, ok bool) {
	s.fl.each(func(f *flight) {
		if !ok || f.deadline.Before(t) {
			t, ok = f.deadline, true
		}
	})
	for _, r := range s.fl.retry {
		if r.notBefore.After(now) && (!ok || r.notBefore.Before(t)) {
			t, ok = r.notBefore, true
		}
	}
	return t, ok
}

// checkTimers checks the timers' invariants: each flight has a pending
// timer naming it, and so does each retry not due by the latest Tick or
// NextDeadline; no pending timer is more than the wheel and head hold.
func checkTimers(t *testing.T, s *Sub) {
	t.Helper()
	tm := &s.fl.tm
	if !tm.on {
		return
	}
	if n := tm.w.Len() + len(tm.head); n != tm.pending() {
		t.Fatalf("%d timers in wheel and head, %d refs", n, tm.pending())
	}
	pending := func(ref uint64) (timerRef, bool) {
		if ref == 0 || int(uint32(ref)) >= len(tm.refs) || slices.Contains(tm.free, uint32(ref)) {
			return timerRef{}, false
		}
		tr := tm.ref(ref)
		return tr, tr.gen == uint32(ref>>32)
	}
	s.fl.each(func(f *flight) {
		if tr, ok := pending(f.timer); !ok || tr.retry || tr.id != f.id {
			t.Fatalf("flight %v has no timer (%d: %v %v)", f.id, f.timer, tr, ok)
		}
	})
	for _, r := range s.fl.retry {
		if tm.since(r.notBefore) <= tm.hw {
			continue
		}
		if tr, ok := pending(r.timer); !ok || !tr.retry || tr.id != r.id {
			t.Fatalf("retry %v at %v has no timer", r.id, r.notBefore)
		}
	}
	for i := 1; i < len(tm.head); i++ {
		if tm.head[(i-1)/2].compare(tm.head[i]) > 0 {
			t.Fatalf("head is not a heap at %d", i)
		}
	}
}

// Acks, nacks and redeliveries leave stale timers behind: Tick and
// NextDeadline ignore them, and the exact times (sub-millisecond included)
// come out.
func TestTimersStale(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s, err := NewSub(Config{Mode: Shared, Partitions: 1, AckTimeout: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Join("a")
	s.Append("", Message{Offset: 0}, Message{Offset: 1}, Message{Offset: 2})
	s.Request("a", 100)
	next := func(now time.Time, want time.Time) {
		t.Helper()
		got, ok := s.NextDeadline(now)
		if want.IsZero() {
			if ok {
				t.Fatalf("NextDeadline(%v) = %v, want none", now.Sub(t0), got.Sub(t0))
			}
			return
		}
		if !ok || !got.Equal(want) {
			t.Fatalf("NextDeadline(%v) = %v %v, want %v", now.Sub(t0), got.Sub(t0), ok, want.Sub(t0))
		}
		checkTimers(t, s)
	}
	// Ack before the deadline.
	s.Deliver("a", t0, 1)
	next(t0, t0.Add(time.Second))
	s.Deliver("a", t0.Add(300*time.Microsecond), 1) // same ms as offset 0's deadline
	if err := s.Ack("a", 0, 0); err != nil {
		t.Fatal(err)
	}
	next(t0, t0.Add(time.Second+300*time.Microsecond))
	if err := s.Ack("a", 0, 1); err != nil {
		t.Fatal(err)
	}
	next(t0, time.Time{})
	if ds := s.Tick(t0.Add(2 * time.Second)); len(ds) != 0 {
		t.Fatalf("Tick after the acks: %v", ds)
	}
	if n := s.fl.tm.pending(); n != 0 {
		t.Fatalf("%d timers left after the acks and a Tick past them", n)
	}

	// A nack reschedules: the flight's deadline is stale, the retry's time
	// counts; a redelivery and a second nack reschedule again.
	now := t0.Add(3 * time.Second)
	s.Deliver("a", now, 1)
	if _, err := s.Nack("a", 0, 2, 5*time.Second, "", now.Add(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	at := now.Add(5100 * time.Millisecond)
	next(now.Add(100*time.Millisecond), at)
	if ds := s.Tick(now.Add(1100 * time.Millisecond)); len(ds) != 0 { // the old deadline
		t.Fatalf("Tick at the nacked flight's deadline: %v", ds)
	}
	if ds, _ := s.Deliver("a", at, 1); len(ds) != 1 || ds[0].Count != 2 {
		t.Fatalf("redelivery: %v", ds)
	}
	next(at, at.Add(time.Second))
	if _, err := s.Nack("a", 0, 2, 10*time.Millisecond, "", at); err != nil {
		t.Fatal(err)
	}
	next(at, at.Add(10*time.Millisecond))
	// Due: no longer counted.
	next(at.Add(10*time.Millisecond), time.Time{})
	s.Deliver("a", at.Add(20*time.Millisecond), 1)
	if ds := s.Tick(at.Add(1020 * time.Millisecond)); len(ds) != 1 || ds[0].Offset != 2 || ds[0].Count != 3 {
		t.Fatalf("Tick at the redelivery's deadline: %v", ds)
	}
	checkTimers(t, s)
}

// Many messages delivered and acked leave many stale timers: the wheel is
// rebuilt from the live ones, so they stay bounded.
func TestTimersRebuildBoundsStale(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s, err := NewSub(Config{Mode: Shared, Partitions: 1, MaxSpan: 1 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Join("a")
	s.NextDeadline(t0) // starts the timers
	now := t0
	const n = 20_000
	for off := int64(0); off < n; off++ {
		s.Append("", Message{Offset: off})
		s.Request("a", 1)
		if ds, _ := s.Deliver("a", now, 0); len(ds) != 1 {
			t.Fatalf("deliver %d: %v", off, ds)
		}
		live := s.fl.nflights + len(s.fl.retry)
		if got, bound := s.fl.tm.pending(), staleFactor*live+staleSlack; got > bound {
			t.Fatalf("after %d: %d timers for %d live", off, got, live)
		}
		if off > 0 {
			if err := s.Ack("a", 0, off-1); err != nil {
				t.Fatal(err)
			}
		}
		now = now.Add(time.Millisecond)
	}
	if r := s.fl.tm.rebuilds; r < n/(2*staleSlack) {
		t.Fatalf("%d rebuilds for %d stale timers", r, n)
	}
	checkTimers(t, s)
	want := now.Add(-time.Millisecond).Add(DefaultAckTimeout)
	if got, ok := s.NextDeadline(now); !ok || !got.Equal(want) {
		t.Fatalf("NextDeadline = %v %v, want %v", got, ok, want)
	}
	if ds := s.Tick(want); len(ds) != 1 || ds[0].Offset != n-1 {
		t.Fatalf("Tick: %v", ds)
	}
}

// Tick and NextDeadline on the wheel agree with the linear scans they
// replace, over random operations: deliveries, acks, nacks with and
// without delays, leaves and joins, seeks, restarts, a clock moving by
// nanoseconds to minutes and now and then backwards, with a wall clock
// and with a monotonic one.
func TestTimersMatchScan(t *testing.T) {
	defer func(n int) { staleSlack = n }(staleSlack)
	staleSlack = 16 // rebuild often
	for _, mode := range []Mode{Shared, Broadcast, KeyShared} {
		for _, mono := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/mono=%v", mode, mono), func(t *testing.T) {
				for seed := uint64(1); seed <= 4; seed++ {
					timersModel(t, mode, mono, seed)
				}
			})
		}
	}
}

func timersModel(t *testing.T, mode Mode, mono bool, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(mode)))
	policy, err := retry.ParsePolicy("exponential initial=20ms factor=3 cap=3m jitter=0.5 max-deliveries=6")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Mode: mode, Partitions: 3, AckTimeout: time.Duration(50+rng.IntN(500)) * time.Millisecond,
		MaxPending: 64, Retry: policy, Rand: rng.Float64}
	s, err := NewSub(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	if mono {
		now = time.Now() // with a monotonic reading; so is every time derived from it
	}
	members := []MemberID{"a", "b", "c"}
	joined := map[MemberID]bool{}
	produced := make([]int64, cfg.Partitions)
	feed := func() {
		for _, v := range s.Views() {
			for p := range produced {
				off, room := s.ReadFrom(v, uint32(p))
				var msgs []Message
				for o := off; o < produced[p] && len(msgs) < room; o++ {
					msgs = append(msgs, Message{Partition: uint32(p), Offset: o, Key: fmt.Sprint("k", o%5)})
				}
				s.Append(v, msgs...)
			}
		}
	}
	pick := func() MemberID { return members[rng.IntN(len(members))] }
	for _, m := range members[:2] {
		s.Join(m)
		joined[m] = true
	}
	ticks, expiries, nexts, rebuilds := 0, 0, 0, 0
	for step := 0; step < 4000; step++ {
		m := pick()
		switch op := rng.IntN(100); {
		case op < 8:
			produced[rng.IntN(len(produced))] += int64(1 + rng.IntN(20))
		case op < 16:
			s.Request(m, 1+rng.IntN(30))
		case op < 30:
			feed()
			s.Deliver(m, now, 0)
		case op < 45:
			if fs := s.Flights(m); len(fs) > 0 {
				d := fs[rng.IntN(len(fs))]
				_ = s.Ack(m, d.Partition, d.Offset)
			} else if len(s.fl.retry) > 0 && joined[m] {
				r := s.fl.retry[rng.IntN(len(s.fl.retry))]
				if r.id.view == s.ViewOf(m) {
					_ = s.Ack(m, r.id.part, r.id.off)
				}
			}
		case op < 55:
			if fs := s.Flights(m); len(fs) > 0 {
				d := fs[rng.IntN(len(fs))]
				delay := PolicyDelay
				switch rng.IntN(4) {
				case 0:
					delay = 0
				case 1:
					delay = time.Duration(rng.Int64N(int64(3 * time.Minute)))
				case 2:
					delay = time.Duration(rng.Int64N(int64(3 * time.Millisecond)))
				}
				_, _ = s.Nack(m, d.Partition, d.Offset, delay, "", now)
			}
		case op < 58:
			if joined[m] {
				s.Leave(m, now)
			} else {
				s.Join(m)
			}
			joined[m] = !joined[m]
		case op < 59:
			v := s.ViewOf(m)
			if p := uint32(rng.IntN(cfg.Partitions)); s.Progress(v, p) != nil {
				off, _ := s.ReadFrom(v, p)
				s.Seek(v, p, off)
			}
		case op < 60:
			rebuilds += s.fl.tm.rebuilds
			old := s
			if s, err = NewSub(cfg, nil); err != nil {
				t.Fatal(err)
			}
			for _, v := range old.Views() {
				if err := s.Restore(old.Encode("g", "t", v)); err != nil {
					t.Fatal(err)
				}
			}
			for _, m := range old.Members() {
				s.Join(m)
			}
		case op < 80:
			switch k := rng.IntN(20); {
			case k < 8:
				now = now.Add(time.Duration(rng.Int64N(int64(2 * time.Millisecond))))
			case k < 14:
				now = now.Add(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
			case k < 18:
				now = now.Add(time.Duration(rng.Int64N(int64(5 * time.Second))))
			case k < 19:
				now = now.Add(time.Duration(rng.Int64N(int64(4 * time.Minute))))
			default:
				now = now.Add(-time.Duration(rng.Int64N(int64(time.Second))))
			}
		case op < 92:
			want := scanExpired(s, now)
			got := s.Tick(now)
			for i := range got {
				got[i].Dead = false
			}
			if !slices.Equal(got, want) {
				t.Fatalf("seed %d step %d: Tick(%v)\n got %v\nwant %v", seed, step, now, got, want)
			}
			if left := scanExpired(s, now); len(left) > 0 {
				t.Fatalf("seed %d step %d: expired flights left: %v", seed, step, left)
			}
			ticks++
			expiries += len(got)
		default:
			wt, wok := scanNext(s, now)
			gt, gok := s.NextDeadline(now)
			if wok != gok || !gt.Equal(wt) {
				t.Fatalf("seed %d step %d: NextDeadline(%v) = %v %v, want %v %v", seed, step, now, gt, gok, wt, wok)
			}
			nexts++
		}
		checkTimers(t, s)
	}
	rebuilds += s.fl.tm.rebuilds
	t.Logf("seed %d: %d ticks expired %d, %d NextDeadline, %d rebuilds", seed, ticks, expiries, nexts, rebuilds)
	if expiries == 0 || nexts == 0 || rebuilds < 10 {
		t.Fatalf("seed %d: %d ticks expired %d, %d NextDeadline: not exercised", seed, ticks, expiries, nexts)
	}
}
