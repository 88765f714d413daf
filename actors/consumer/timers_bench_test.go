package consumer

import (
	"runtime"
	"testing"
	"time"
)

// benchTimersSub returns a shared-mode subscription with n messages in
// flight (ack deadlines a hundred per ms, over n/100 ms)
// and n retries waiting (nack delays from one hour, 1 ms apart), the time
// t0 of the first delivery, and the time of the setup's last call (nothing
// is due before t0+AckTimeout). A
// NextDeadline before the first delivery starts the timers, as the
// coordinator's first deadline would; one after the nacks takes out the
// nacked flights' stale timers (a cost paid once per timer, not measured).
// The setup's garbage is collected before the measure.
func benchTimersSub(b *testing.B, n int) (s *Sub, t0, end time.Time) {
	b.Helper()
	s, err := NewSub(Config{Mode: Shared, Partitions: 1, MaxSpan: 4 * n, MaxPending: 2 * n, MaxCredits: 2 * n}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Join("m"); err != nil {
		b.Fatal(err)
	}
	_ = s.Request("m", 2*n)
	t0 = time.Unix(1_700_000_000, 0)
	now := t0
	s.NextDeadline(now)
	// A hundred messages a ms: the first n are nacked into retries, the
	// next n stay in flight.
	msgs := make([]Message, 100)
	for off := 0; off < 2*n; off += len(msgs) {
		for i := range msgs {
			msgs[i] = Message{Offset: int64(off + i)}
		}
		if got := s.Append("", msgs...); got != len(msgs) {
			b.Fatalf("appended %d of %d", got, len(msgs))
		}
		if ds, err := s.Deliver("m", now, 0); err != nil || len(ds) != len(msgs) {
			b.Fatalf("deliver: %d %v", len(ds), err)
		}
		now = now.Add(time.Millisecond)
	}
	for i := 0; i < n; i++ {
		if _, err := s.Nack("m", 0, int64(i), time.Hour+time.Duration(i)*time.Millisecond, "", now); err != nil {
			b.Fatal(err)
		}
	}
	if s.InFlight("m") != n || s.Retrying() != n {
		b.Fatalf("in flight %d, retrying %d", s.InFlight("m"), s.Retrying())
	}
	s.NextDeadline(now)
	runtime.GC() // not the setup's garbage
	return s, t0, now
}

// BenchmarkSubTimers measures the time-driven calls of the coordinator's
// deadline timer with 100k messages in flight and 100k retries waiting:
// a Tick and a NextDeadline when nothing is due (the cost the timer pays
// each time it fires, on top of the work it finds), and a step of the
// timer as it fires 1 ms apart: a Tick timing out the hundred flights due
// in that ms, then the NextDeadline that re-arms it. The flights run out
// after 1000 steps, so step needs -benchtime=1000x or less.
//
// deliver-ack is BenchmarkSubDeliver's level0 (per message: Append,
// Deliver, Ack, 256 at a time, 1 ms apart) once a NextDeadline has
// started the subscription's timers: what keeping them costs the push
// path (a timer per delivery, left stale by the ack, and the rebuilds
// that bound them).
func BenchmarkSubTimers(b *testing.B) {
	const n = 100_000
	b.Run("tick-idle", func(b *testing.B) {
		s, _, now := benchTimersSub(b, n) // before every deadline
		b.ResetTimer()
		for range b.N {
			if len(s.Tick(now)) != 0 {
				b.Fatal("expired")
			}
		}
	})
	b.Run("next-deadline", func(b *testing.B) {
		s, _, now := benchTimersSub(b, n)
		b.ResetTimer()
		for range b.N {
			if _, ok := s.NextDeadline(now); !ok {
				b.Fatal("no deadline")
			}
		}
	})
	b.Run("step", func(b *testing.B) {
		if b.N > n/100 {
			b.Skipf("%d steps: the flights run out after %d (-benchtime=%dx)", b.N, n/100, n/100)
		}
		s, t0, _ := benchTimersSub(b, n)
		now := t0.Add(DefaultAckTimeout).Add(time.Duration(n/100) * time.Millisecond)
		b.ResetTimer()
		for range b.N {
			if len(s.Tick(now)) != 100 {
				b.Fatal("not a hundred expired")
			}
			if _, ok := s.NextDeadline(now); !ok {
				b.Fatal("no deadline")
			}
			now = now.Add(time.Millisecond)
		}
	})
	b.Run("deliver-ack", func(b *testing.B) { benchDeliver(b, func(int) uint8 { return 0 }, true) })
}
