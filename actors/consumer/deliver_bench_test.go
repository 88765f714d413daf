package consumer

import (
	"testing"
	"time"
)

// benchDeliver measures Sub's part of push delivery: Append a read of 256
// messages of one partition, Deliver them to one member with 256 credits,
// ack them. prio gives message i's priority; timers starts the ack-deadline
// timers first (NextDeadline), as the coordinator does once it arms one.
func benchDeliver(b *testing.B, prio func(i int) uint8, timers bool) {
	s, err := NewSub(Config{Mode: Shared, Partitions: 1}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Join("m"); err != nil {
		b.Fatal(err)
	}
	const batch = 256
	msgs := make([]Message, batch)
	now := time.Unix(1_700_000_000, 0)
	if timers {
		s.NextDeadline(now)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n += batch {
		off, _ := s.ReadFrom("", 0)
		for i := range msgs {
			msgs[i] = Message{Offset: off + int64(i), Priority: prio(i)}
		}
		s.Append("", msgs...)
		_ = s.Request("m", batch)
		ds, _ := s.Deliver("m", now, 0)
		if len(ds) != batch {
			b.Fatalf("delivered %d of %d", len(ds), batch)
		}
		for _, d := range ds {
			_ = s.Ack("m", 0, d.Offset)
		}
		now = now.Add(time.Millisecond)
	}
}

// BenchmarkSubDeliver: per message, level 0 only (the fast path) and
// mixed levels (the picker).
func BenchmarkSubDeliver(b *testing.B) {
	b.Run("level0", func(b *testing.B) { benchDeliver(b, func(int) uint8 { return 0 }, false) })
	b.Run("mixed", func(b *testing.B) { benchDeliver(b, func(i int) uint8 { return uint8(i*7) % Priorities }, false) })
}
