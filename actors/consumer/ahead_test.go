package consumer

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/heraldmq/herald/retry"
)

// A priority-9 message behind a backlog larger than MaxPending is delivered
// as soon as the sub-queue read offers it, not after the backlog; the
// ordered read later skips it, so it is delivered once.
func TestSubAheadJumpsTheBacklog(t *testing.T) {
	s, err := NewSub(Config{Mode: Shared, Partitions: 1, MaxPending: 8}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Join("m"); err != nil {
		t.Fatal(err)
	}
	log := make([]Message, 200)
	for i := range log {
		log[i] = Message{Offset: int64(i)}
	}
	log[150].Priority = 9
	log[170].Priority = 9
	log[190].Priority = 5
	if n := s.Append("", log...); n != 8 {
		t.Fatalf("Append took %d, want MaxPending 8", n)
	}
	if _, room := s.ReadFrom("", 0); room != 0 {
		t.Fatalf("ordered read has room %d with MaxPending reached", room)
	}
	from, to, room := s.ReadAhead("", 0, 9)
	if from != 8 || to <= 190 || room != 2 {
		t.Fatalf("ReadAhead = %d, %d, %d; want 8, >190, 2", from, to, room)
	}
	// The sub-queue answer: two level-9 records; a third would not fit.
	took := s.AppendAhead("", 0, 9, []Message{log[150], log[170]}, 200)
	if !slices.Equal(took, []int{0, 1}) {
		t.Fatalf("AppendAhead took %v", took)
	}
	if _, _, room := s.ReadAhead("", 0, 9); room != 0 {
		t.Fatalf("room %d after filling the ahead share", room)
	}
	if f, _, _ := s.ReadAhead("", 0, 5); f != 8 {
		t.Fatalf("level 5 reads from %d, want 8 (levels have their own cursors)", f)
	}
	checkLevels(t, s)
	now := time.Unix(0, 0)
	if err := s.Request("m", 2); err != nil {
		t.Fatal(err)
	}
	ds, err := s.Deliver("m", now, 0)
	if err != nil || len(ds) != 2 || ds[0].Offset != 150 || ds[1].Offset != 170 {
		t.Fatalf("first deliveries %v (%v), want 150 and 170", ds, err)
	}
	// Deliver and ack everything; each offset exactly once.
	seen := map[int64]int{}
	for _, d := range ds {
		seen[d.Offset]++
		_ = s.Ack("m", 0, d.Offset)
	}
	next := 8
	for rounds := 0; len(seen) < len(log) && rounds < 1000; rounds++ {
		off, room := s.ReadFrom("", 0)
		if room > 0 && int(off) < len(log) {
			next = int(off)
			s.Append("", log[next:]...)
		}
		_ = s.Request("m", 3)
		ds, err := s.Deliver("m", now, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			seen[d.Offset]++
			if err := s.Ack("m", 0, d.Offset); err != nil {
				t.Fatal(err)
			}
		}
		checkLevels(t, s)
	}
	for i := range log {
		if seen[int64(i)] != 1 {
			t.Fatalf("offset %d delivered %d times", i, seen[int64(i)])
		}
	}
	if f := s.Progress("", 0).Floor(); f != int64(len(log)) {
		t.Fatalf("floor %d after acking everything, want %d", f, len(log))
	}
}

// Randomized: ordered reads, sub-queue reads, deliveries, acks, nacks and
// ack timeouts interleave; every message is delivered, none twice at the
// same time, and the floor reaches the end once all are acked.
func TestSubAheadModel(t *testing.T) {
	jumped := 0
	defer func() {
		if !t.Failed() && jumped < 100 {
			t.Errorf("only %d deliveries came from sub-queue reads: the test does not exercise them", jumped)
		}
	}()
	for seed := uint64(1); seed <= 20; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		policy, err := retry.ParsePolicy("100ms,1s max-deliveries=1000")
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewSub(Config{Mode: Shared, Partitions: 2, MaxPending: 16, AckTimeout: time.Second, Retry: policy}, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = s.Join("a")
		_, _ = s.Join("b")
		const n = 600
		logs := make([][]Message, 2)
		for p := range logs {
			for i := 0; i < n; i++ {
				m := Message{Partition: uint32(p), Offset: int64(i)}
				if r.IntN(8) == 0 {
					m.Priority = uint8(1 + r.IntN(9))
				}
				logs[p] = append(logs[p], m)
			}
		}
		acked := map[[2]int64]bool{}
		inFlight := map[[2]int64]MemberID{}
		now := time.Unix(0, 0)
		for step := 0; step < 20000 && len(acked) < 2*n; step++ {
			p := uint32(r.IntN(2))
			switch r.IntN(6) {
			case 0: // ordered read
				if off, room := s.ReadFrom("", p); room > 0 && off < n {
					s.Append("", logs[p][off:min(int(off)+r.IntN(40)+1, n)]...)
				}
			case 1: // a sub-queue read of some level
				lv := 1 + r.IntN(9)
				from, to, room := s.ReadAhead("", p, lv)
				if room == 0 {
					break
				}
				var found []Message
				next := min(to, n)
				for o := from; o < min(to, n); o++ {
					if int(logs[p][o].Priority) == lv {
						if len(found) == 4 {
							next = o
							break
						}
						found = append(found, logs[p][o])
					}
				}
				s.AppendAhead("", p, lv, found, next)
			case 2, 3:
				m := MemberID([]string{"a", "b"}[r.IntN(2)])
				_ = s.Request(m, 1+r.IntN(4))
				ds, err := s.Deliver(m, now, 0)
				if err != nil {
					t.Fatal(err)
				}
				for _, d := range ds {
					if d.Offset >= s.views[""].next[d.Partition] {
						jumped++ // offered ahead of the ordered read
					}
					k := [2]int64{int64(d.Partition), d.Offset}
					if acked[k] {
						t.Fatalf("seed %d: %v delivered after its ack", seed, k)
					}
					if who, ok := inFlight[k]; ok {
						t.Fatalf("seed %d: %v delivered to %s while in flight to %s", seed, k, m, who)
					}
					inFlight[k] = m
				}
			case 4: // ack or nack something in flight
				for k, m := range inFlight {
					if r.IntN(4) == 0 {
						if _, err := s.Nack(m, uint32(k[0]), k[1], 0, "no", now); err != nil {
							t.Fatal(err)
						}
					} else {
						if err := s.Ack(m, uint32(k[0]), k[1]); err != nil {
							t.Fatal(err)
						}
						acked[k] = true
					}
					delete(inFlight, k)
					break
				}
			case 5: // time passes: ack timeouts
				now = now.Add(300 * time.Millisecond)
				for _, d := range s.Tick(now) {
					delete(inFlight, [2]int64{int64(d.Partition), d.Offset})
				}
				for _, dl := range s.DeadLetters() { // the dead-letter appends are durable
					if s.DeadLettered(dl.View, dl.Partition, dl.Offset) {
						acked[[2]int64{int64(dl.Partition), dl.Offset}] = true
					}
				}
			}
			checkLevels(t, s)
		}
		if len(acked) != 2*n {
			var missing [][2]int64
			for p := int64(0); p < 2; p++ {
				for o := int64(0); o < n; o++ {
					if !acked[[2]int64{p, o}] {
						missing = append(missing, [2]int64{p, o})
					}
				}
			}
			for p := uint32(0); p < 2; p++ {
				off, room := s.ReadFrom("", p)
				t.Logf("partition %d: read from %d room %d, pending %d, ahead %v", p, off, room, len(s.views[""].pending[p]), s.views[""].ahead[p])
			}
			for _, re := range s.fl.retry {
				t.Logf("retry %+v now %v", *re, now)
			}
			t.Fatalf("seed %d: %d of %d acked; missing %v; in flight %v; retrying %d", seed, len(acked), 2*n, missing, inFlight, s.Retrying())
		}
		for p := uint32(0); p < 2; p++ {
			if f := s.Progress("", p).Floor(); f != n {
				t.Fatalf("seed %d: partition %d floor %d, want %d", seed, p, f, n)
			}
		}
	}
}

// Retention removes records below the ordered read position while messages
// offered ahead past it are acked, in flight or waiting for a retry: the
// coordinator's Seek to the new log start must keep what it knows about them.
// An acked one is never delivered again, one in flight is not delivered a
// second time meanwhile, and a nacked one keeps its delivery count.
func TestSubAheadSurvivesRetentionSeek(t *testing.T) {
	policy, err := retry.ParsePolicy("1ms max-deliveries=10")
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSub(Config{Mode: Shared, Partitions: 1, MaxPending: 8, Retry: policy}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Join("m"); err != nil {
		t.Fatal(err)
	}
	log := make([]Message, 200)
	for i := range log {
		log[i] = Message{Offset: int64(i)}
	}
	for _, o := range []int{150, 160, 170} {
		log[o].Priority = 9
	}
	s.Append("", log...)
	if took := s.AppendAhead("", 0, 9, []Message{log[150], log[160]}, 165); len(took) != 2 {
		t.Fatalf("AppendAhead took %v", took)
	}
	now := time.Unix(0, 0)
	_ = s.Request("m", 2)
	if ds, _ := s.Deliver("m", now, 0); len(ds) != 2 || ds[0].Offset != 150 || ds[1].Offset != 160 {
		t.Fatalf("deliveries %v, want 150 and 160", ds)
	}
	if err := s.Ack("m", 0, 150); err != nil {
		t.Fatal(err)
	}
	// 170 is delivered ahead too, and nacked: retried when the read gets there.
	if took := s.AppendAhead("", 0, 9, []Message{log[170]}, 200); len(took) != 1 {
		t.Fatalf("AppendAhead took %v", took)
	}
	_ = s.Request("m", 1)
	if ds, _ := s.Deliver("m", now, 0); len(ds) != 1 || ds[0].Offset != 170 {
		t.Fatalf("deliveries %v, want 170", ds)
	}
	if _, err := s.Nack("m", 0, 170, 0, "later", now); err != nil {
		t.Fatal(err)
	}

	// Retention removed [0, 100) before the ordered read (at 8) got there.
	s.Seek("", 0, 100)

	inFlight := map[int64]bool{160: true}
	count := map[int64]int{}
	for rounds := 0; rounds < 1000 && s.Progress("", 0).Floor() < 200; rounds++ {
		if off, room := s.ReadFrom("", 0); room > 0 && off < 200 {
			s.Append("", log[off:]...)
		}
		now = now.Add(time.Millisecond)
		_ = s.Request("m", 4)
		ds, err := s.Deliver("m", now, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			switch {
			case d.Offset < 100:
				t.Fatalf("offset %d, removed by retention, delivered", d.Offset)
			case d.Offset == 150:
				t.Fatalf("offset 150 delivered again after its ack (count %d)", d.Count)
			case inFlight[d.Offset]:
				t.Fatalf("offset %d delivered while in flight (count %d)", d.Offset, d.Count)
			}
			count[d.Offset] = d.Count
			if err := s.Ack("m", 0, d.Offset); err != nil {
				t.Fatal(err)
			}
		}
		if rounds == 50 {
			if err := s.Ack("m", 0, 160); err != nil {
				t.Fatalf("ack of 160, in flight across the seek: %v", err)
			}
			delete(inFlight, 160)
		}
		checkLevels(t, s)
	}
	if f := s.Progress("", 0).Floor(); f != 200 {
		t.Fatalf("floor %d, want 200", f)
	}
	if count[170] != 2 {
		t.Fatalf("nacked 170 redelivered with count %d, want 2", count[170])
	}
}
