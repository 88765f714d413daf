package consumer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestPriorityPickerShares(t *testing.T) {
	pp, err := NewPriorityPicker(DefaultPriorityWeights())
	if err != nil {
		t.Fatal(err)
	}
	var all [Priorities]bool
	for p := range all {
		all[p] = true
	}
	var got [Priorities]int
	const rounds = 55 * 100 // total weight 55
	for i := 0; i < rounds; i++ {
		p, ok := pp.Pick(all)
		if !ok {
			t.Fatal("no pick with every level busy")
		}
		got[p]++
	}
	for p := range got {
		if want := (p + 1) * 100; got[p] != want {
			t.Errorf("level %d: %d picks, want %d", p, got[p], want)
		}
	}
	// Only one level busy: it gets everything; none busy: nothing.
	var only [Priorities]bool
	only[3] = true
	if p, ok := pp.Pick(only); !ok || p != 3 {
		t.Fatalf("only level 3 busy: picked %d %v", p, ok)
	}
	if _, ok := pp.Pick([Priorities]bool{}); ok {
		t.Fatal("picked with nothing busy")
	}
	if _, err := NewPriorityPicker([Priorities]int{}); err == nil {
		t.Fatal("zero weights accepted")
	}
}

// A flood at the highest level never starves a lower one: over any window
// of W picks (W the busy levels' total weight), each busy level gets its
// weight, give or take one, whatever the busy set does meanwhile.
func TestPriorityPickerNoStarvation(t *testing.T) {
	pp, _ := NewPriorityPicker(DefaultPriorityWeights())
	r := rand.New(rand.NewPCG(9, 9))
	for round := 0; round < 200; round++ {
		var busy [Priorities]bool
		busy[9] = true // the flood
		total := 10
		for p := 0; p < 9; p++ {
			if r.IntN(3) == 0 {
				busy[p] = true
				total += p + 1
			}
		}
		var got [Priorities]int
		for i := 0; i < total; i++ {
			p, _ := pp.Pick(busy)
			got[p]++
		}
		for p := range busy {
			if busy[p] && (got[p] < p || got[p] > p+2) {
				t.Fatalf("round %d: level %d got %d of %d picks, weight %d (busy %v)", round, p, got[p], total, p+1, busy)
			}
		}
	}
}

// checkLevels fails unless every view's per-level counts match its pending
// messages.
func checkLevels(t *testing.T, s *Sub) {
	t.Helper()
	for v, w := range s.views {
		for p := range w.pending {
			var want levels
			for _, m := range w.pending[p] {
				want.add(m.Priority)
			}
			if w.levels[p] != want {
				t.Fatalf("view %q partition %d: levels %v, pending has %v", v, p, w.levels[p], want)
			}
		}
	}
}

// A flood of 1000 level-9 messages ahead of 100 at level 0, taken one
// credit at a time: while both levels have messages, level 0 gets one
// delivery in every 11 (weights 10 and 1), so it is never starved; each
// level is delivered in offset order, and every message exactly once.
func TestSubPriorityFloodDoesNotStarve(t *testing.T) {
	for _, order := range []string{"flood first", "interleaved"} {
		t.Run(order, func(t *testing.T) {
			s, err := NewSub(Config{Mode: Shared, Partitions: 1, MaxPending: 2048}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Join("m"); err != nil {
				t.Fatal(err)
			}
			const high, low = 1000, 100
			msgs := make([]Message, 0, high+low)
			prio := make(map[int64]uint8)
			r := rand.New(rand.NewPCG(4, 6))
			for hi, lo := 0, 0; hi+lo < high+low; {
				var p uint8
				switch {
				case order == "flood first" && hi < high, order == "interleaved" && hi < high && (lo == low || r.IntN(11) > 0):
					p, hi = 9, hi+1
				default:
					p, lo = 0, lo+1
				}
				off := int64(len(msgs))
				msgs = append(msgs, Message{Offset: off, Priority: p})
				prio[off] = p
			}
			if n := s.Append("", msgs...); n != len(msgs) {
				t.Fatalf("Append took %d of %d", n, len(msgs))
			}
			checkLevels(t, s)
			now := time.Unix(0, 0)
			left := map[uint8]int{9: high, 0: low}
			last := map[uint8]int64{9: -1, 0: -1}
			seen := map[int64]bool{}
			var run []uint8 // levels delivered while both levels had messages
			for len(seen) < len(msgs) {
				if err := s.Request("m", 1); err != nil {
					t.Fatal(err)
				}
				both := left[9] > 0 && left[0] > 0
				ds, err := s.Deliver("m", now, 0)
				if err != nil || len(ds) != 1 {
					t.Fatalf("after %d deliveries: Deliver = %v, %v", len(seen), ds, err)
				}
				d := ds[0]
				p := prio[d.Offset]
				if seen[d.Offset] || d.Offset <= last[p] {
					t.Fatalf("offset %d (level %d) delivered twice or out of its level's order (last %d)", d.Offset, p, last[p])
				}
				seen[d.Offset], last[p] = true, d.Offset
				left[p]--
				if both {
					run = append(run, p)
				}
				if err := s.Ack("m", 0, d.Offset); err != nil {
					t.Fatal(err)
				}
				checkLevels(t, s)
			}
			lows := 0
			for i, p := range run {
				if p == 0 {
					lows++
				}
				if i >= 10 && !slices.Contains(run[i-10:i+1], 0) {
					t.Fatalf("deliveries %d-%d, both levels waiting, are all level 9", i-10, i)
				}
			}
			// About 1/11 of the early deliveries are level 0.
			if want := len(run) / 11; lows < want || lows > want+1 {
				t.Errorf("level 0 got %d of %d deliveries while both waited, want about %d", lows, len(run), want)
			}
			if ds, _ := s.Deliver("m", now, 0); len(ds) != 0 || s.Progress("", 0).Floor() != high+low {
				t.Fatalf("left over: %v, floor %d", ds, s.Progress("", 0).Floor())
			}
		})
	}
}

// Random traffic with priorities in every mode, orderly or not: the
// per-level counts always match the pending messages, no message is first
// delivered twice, each level's first deliveries keep offset order (offset
// order overall with Orderly), and draining acks everything.
func TestSubPriorityRandom(t *testing.T) {
	for _, mode := range []Mode{Clustering, Broadcast, Shared, KeyShared} {
		for _, orderly := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/orderly=%v", mode, orderly), func(t *testing.T) {
				for seed := uint64(0); seed < 10; seed++ {
					subPriorityRandom(t, mode, orderly, seed)
				}
			})
		}
	}
}

func subPriorityRandom(t *testing.T, mode Mode, orderly bool, seed uint64) {
	const parts = 3
	r := rand.New(rand.NewPCG(seed, 77))
	s, err := NewSub(Config{Mode: mode, Partitions: parts, Orderly: orderly, MaxPending: 40, AckTimeout: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	members := []MemberID{"a", "b", "c"}
	for _, m := range members {
		if _, err := s.Join(m); err != nil {
			t.Fatal(err)
		}
	}
	if a := s.Assignor(); a != nil {
		for _, m := range members {
			for _, p := range a.Revoking(m) {
				if _, err := s.Revoked(m, p, time.Unix(0, 0)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	log := make([][]Message, parts)
	feed := func() {
		for _, v := range s.Views() {
			for p := range log {
				off, room := s.ReadFrom(v, uint32(p))
				if off < int64(len(log[p])) {
					s.Append(v, log[p][off:min(int64(len(log[p])), off+int64(room))]...)
				}
			}
		}
	}
	type ref struct {
		view MemberID
		part uint32
		off  int64
	}
	first := map[ref]bool{}
	type lane struct {
		view MemberID
		part uint32
		prio uint8
	}
	lastFirst := map[lane]int64{}
	inFlight := map[MemberID][]Delivery{}
	now := time.Unix(1000, 0)
	deliver := func(m MemberID) {
		ds, err := s.Deliver(m, now, 0)
		if err != nil {
			t.Fatal(err)
		}
		checkLevels(t, s)
		for _, d := range ds {
			v := s.ViewOf(m)
			inFlight[m] = append(inFlight[m], d)
			if d.Count != 1 {
				continue
			}
			k := ref{v, d.Partition, d.Offset}
			if first[k] {
				t.Fatalf("seed %d: %v first-delivered twice", seed, k)
			}
			first[k] = true
			l := lane{v, d.Partition, log[d.Partition][d.Offset].Priority}
			if orderly && mode != KeyShared {
				l.prio = 0 // the whole partition is one lane
			}
			if last, ok := lastFirst[l]; ok && d.Offset < last && mode != KeyShared {
				t.Fatalf("seed %d: %v delivered after offset %d of its lane", seed, k, last)
			}
			lastFirst[l] = max(lastFirst[l], d.Offset)
		}
	}
	for step := 0; step < 400; step++ {
		m := members[r.IntN(len(members))]
		switch op := r.IntN(10); {
		case op < 2:
			p := r.IntN(parts)
			for i := r.IntN(8); i >= 0; i-- {
				prio := uint8(0)
				if r.IntN(2) == 0 {
					prio = uint8(r.IntN(Priorities))
				}
				log[p] = append(log[p], Message{Partition: uint32(p), Offset: int64(len(log[p])), Key: fmt.Sprint("k", r.IntN(5)), Priority: prio})
			}
			feed()
			checkLevels(t, s)
		case op < 4:
			_ = s.Request(m, 1+r.IntN(5))
		case op < 7:
			deliver(m)
		case op < 9 && len(inFlight[m]) > 0:
			i := r.IntN(len(inFlight[m]))
			d := inFlight[m][i]
			inFlight[m] = slices.Delete(inFlight[m], i, i+1)
			if r.IntN(6) == 0 {
				_, _ = s.Nack(m, d.Partition, d.Offset, time.Second, "", now)
			} else {
				_ = s.Ack(m, d.Partition, d.Offset)
			}
		default:
			now = now.Add(500 * time.Millisecond)
			s.Tick(now)
		}
	}
	// Drain: everything is eventually acked.
	for round := 0; ; round++ {
		if round > 1000 {
			t.Fatalf("seed %d: not drained", seed)
		}
		feed()
		for _, d := range s.DeadLetters() {
			s.DeadLettered(d.View, d.Partition, d.Offset)
		}
		for _, m := range members {
			_ = s.Request(m, 10)
			deliver(m)
			for _, d := range inFlight[m] {
				_ = s.Ack(m, d.Partition, d.Offset)
			}
			inFlight[m] = nil
		}
		now = now.Add(time.Second)
		done := true
		for _, v := range s.Views() {
			for p := range log {
				if s.Progress(v, uint32(p)).Floor() != int64(len(log[p])) {
					done = false
				}
			}
		}
		if done {
			break
		}
	}
}
