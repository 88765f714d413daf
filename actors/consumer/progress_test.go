package consumer

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

func TestProgressAck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		floor int64
		span  int
		acks  []int64
		want  string
	}{
		{"nothing", 5, 0, nil, "floor=5"},
		{"in order", 0, 0, []int64{0, 1, 2}, "floor=3"},
		{"gap", 0, 0, []int64{1, 2, 4}, "floor=0 acked=[1-2 4]"},
		{"gap fills", 0, 0, []int64{1, 2, 4, 0}, "floor=3 acked=[4]"},
		{"all fill", 0, 0, []int64{3, 1, 2, 0}, "floor=4"},
		{"below floor", 10, 0, []int64{3, 10}, "floor=11"},
		{"duplicate", 0, 0, []int64{2, 2, 2}, "floor=0 acked=[2]"},
		{"across words", 60, 0, []int64{61, 62, 63, 64, 65, 200}, "floor=60 acked=[61-65 200]"},
		{"fill across words", 60, 0, []int64{61, 62, 63, 64, 65, 200, 60}, "floor=66 acked=[200]"},
		{"long run", 0, 0, seq(1, 300), "floor=0 acked=[1-299]"},
		{"long run fills", 0, 0, append(seq(1, 300), 0), "floor=300"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewProgress(tc.floor, tc.span)
			for _, a := range tc.acks {
				if err := p.Ack(a); err != nil {
					t.Fatalf("Ack(%d): %v", a, err)
				}
			}
			if got := p.String(); got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
			q, err := DecodeProgress(p.Encode(0), tc.span)
			if err != nil {
				t.Fatal(err)
			}
			if q.String() != tc.want {
				t.Fatalf("round trip: %s", q)
			}
		})
	}
}

func seq(from, to int64) []int64 {
	var s []int64
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

func TestProgressSpan(t *testing.T) {
	p := NewProgress(100, 8)
	if p.Limit() != 108 {
		t.Fatalf("limit %d", p.Limit())
	}
	if err := p.Ack(107); err != nil {
		t.Fatal(err)
	}
	if err := p.Ack(108); !errors.Is(err, ErrBeyondSpan) {
		t.Fatalf("Ack(108) = %v, want ErrBeyondSpan", err)
	}
	p.Ack(100)
	if p.Limit() != 109 || p.Ack(108) != nil {
		t.Fatalf("span did not move with the floor: %s limit %d", p, p.Limit())
	}
}

func TestProgressCommitReset(t *testing.T) {
	p := NewProgress(0, 0)
	for _, a := range []int64{2, 3, 5, 9} {
		p.Ack(a)
	}
	p.Commit(5) // below 5 done by commit, 5 was acked: floor moves to 6
	if got := p.String(); got != "floor=6 acked=[9]" {
		t.Fatal(got)
	}
	p.Commit(2) // backwards: no-op
	if p.Floor() != 6 {
		t.Fatal(p)
	}
	p.Commit(1 << 40) // far beyond the span
	if got := p.String(); got != "floor=1099511627776" {
		t.Fatal(got)
	}
	p.Reset(3)
	if got := p.String(); got != "floor=3" || p.Done(3) || !p.Done(2) {
		t.Fatal(got)
	}
}

func TestDecodeProgressRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    *heraldpb.PartitionProgress
	}{
		{"negative floor", &heraldpb.PartitionProgress{AckFloor: -1}},
		{"odd runs", &heraldpb.PartitionProgress{AckedRuns: []uint32{1}}},
		{"zero length", &heraldpb.PartitionProgress{AckedRuns: []uint32{1, 0}}},
		{"zero gap later", &heraldpb.PartitionProgress{AckedRuns: []uint32{1, 1, 0, 1}}},
		{"past span", &heraldpb.PartitionProgress{AckedRuns: []uint32{10, 10}}},
		{"huge", &heraldpb.PartitionProgress{AckedRuns: []uint32{0xffffffff, 0xffffffff}}},
		{"floor overflow", &heraldpb.PartitionProgress{AckFloor: 1<<63 - 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := DecodeProgress(tc.m, 16); !errors.Is(err, ErrBadProgress) {
				t.Fatalf("got %v, want ErrBadProgress", err)
			}
		})
	}
}

// TestProgressModel checks Progress against a map over random acks.
func TestProgressModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 200; iter++ {
		span := 1 + r.IntN(300)
		p := NewProgress(int64(r.IntN(100)), span)
		done := map[int64]bool{}
		for i := int64(0); i < p.Floor(); i++ {
			done[i] = true
		}
		for step := 0; step < 500; step++ {
			off := p.Floor() + int64(r.IntN(span+5)) - 2
			err := p.Ack(off)
			if off >= p.Floor()+int64(span) && off >= 0 && !done[off] {
				if !errors.Is(err, ErrBeyondSpan) {
					t.Fatalf("Ack(%d) beyond span: %v", off, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("Ack(%d): %v", off, err)
			}
			done[off] = true
			f := int64(0)
			for done[f] {
				f++
			}
			if p.Floor() != f {
				t.Fatalf("floor %d, model %d", p.Floor(), f)
			}
			for o := f; o < f+int64(span); o++ {
				if p.Done(o) != done[o] {
					t.Fatalf("Done(%d) = %v", o, p.Done(o))
				}
			}
			from := f + int64(r.IntN(2*span+10)) - int64(span) - 5
			want := int64(0)
			for o := range done {
				if o >= from && o >= 0 { // negative acks are ignored
					want++
				}
			}
			if got := p.DoneFrom(from); got != want {
				t.Fatalf("%s: DoneFrom(%d) = %d, model %d", p, from, got, want)
			}
		}
		q, err := DecodeProgress(p.Encode(3), span)
		if err != nil || q.String() != p.String() {
			t.Fatalf("round trip %s -> %v %v", p, q, err)
		}
	}
}

// FuzzProgress feeds arbitrary bytes to the `__groups` read path:
// proto.Unmarshal of a PartitionProgress, then DecodeProgress with a small
// span. It guarantees: DecodeProgress never panics; it succeeds exactly on
// canonical input within the span; a decoded progress re-encodes to the same
// floor and runs, acks above it stay within the span, and the floor never
// moves backwards.
func FuzzProgress(f *testing.F) {
	const span = 1024
	f.Fuzz(func(t *testing.T, buf []byte) {
		var m heraldpb.PartitionProgress
		if proto.Unmarshal(buf, &m) != nil {
			return
		}
		p, err := DecodeProgress(&m, span)
		if err != nil {
			if !errors.Is(err, ErrBadProgress) {
				t.Fatalf("error not ErrBadProgress: %v", err)
			}
			return
		}
		e := p.Encode(m.Partition)
		m.ProtoReflect().SetUnknown(nil) // unknown fields are skipped, not kept
		m.Retries = nil                  // Sub.Restore reads those, not DecodeProgress
		if !proto.Equal(e, &m) {
			t.Fatalf("re-encoded %v, decoded from %v", e, &m)
		}
		floor := p.Floor()
		for _, b := range buf {
			off := p.Floor() + int64(b)*5
			err := p.Ack(off)
			if off < p.Limit() && err != nil {
				t.Fatal(err)
			}
		}
		if p.Floor() < floor || p.Pending() > span {
			t.Fatalf("bad progress after acks: %s", p)
		}
	})
}

// A partition whose stored progress does not decode keeps its start; the
// others keep their progress.
func TestRestoreSkipsBadPartition(t *testing.T) {
	sub, err := NewSub(Config{Mode: Shared, Partitions: 3}, []int64{500, 500, 500})
	if err != nil {
		t.Fatal(err)
	}
	g := &heraldpb.GroupProgress{Partitions: []*heraldpb.PartitionProgress{
		{Partition: 0, AckFloor: 7},
		{Partition: 1, AckFloor: 3, AckedRuns: []uint32{0}}, // zero-length run: not canonical
		{Partition: 2, AckFloor: 200},
	}}
	if err := sub.Restore(g); !errors.Is(err, ErrBadProgress) {
		t.Fatalf("Restore: %v, want ErrBadProgress", err)
	}
	for p, want := range []int64{7, 500, 200} {
		if got := sub.Progress("", uint32(p)).Floor(); got != want {
			t.Errorf("partition %d floor %d, want %d", p, got, want)
		}
	}
}

// Redeliveries already due do not wait on time: NextDeadline skips them
// (else a due redelivery nobody can take would re-arm the timer every ms).
func TestNextDeadlineSkipsDueRedeliveries(t *testing.T) {
	now := time.Unix(1000, 0)
	sub, _ := NewSub(Config{Mode: Shared, Partitions: 1, AckTimeout: time.Second}, nil)
	sub.Join("a")
	sub.Append("", Message{Offset: 0}, Message{Offset: 1})
	sub.Request("a", 2)
	sub.Deliver("a", now, 0)
	if _, err := sub.Nack("a", 0, 0, 0, "", now); err != nil { // due at once
		t.Fatal(err)
	}
	if _, err := sub.Nack("a", 0, 1, 5*time.Second, "", now); err != nil {
		t.Fatal(err)
	}
	if at, ok := sub.NextDeadline(now); !ok || !at.Equal(now.Add(5*time.Second)) {
		t.Fatalf("NextDeadline = %v %v, want the delayed nack's time", at, ok)
	}
	if _, ok := sub.NextDeadline(now.Add(10 * time.Second)); ok {
		t.Fatal("a deadline although every redelivery is due")
	}
}
