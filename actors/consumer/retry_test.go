package consumer

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/heraldmq/herald/retry"
)

// An exponential policy with jitter retries the n-th failure after a delay
// in [d*(1-jitter), d], d = min(initial*factor^(n-1), cap), whatever the
// draw; the clock is the test's.
func TestSubRetryJitterBounds(t *testing.T) {
	policy, err := retry.ParsePolicy("exponential initial=100ms factor=2 cap=1s jitter=0.2 max-deliveries=100")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	draws := []float64{0, 0.5, 0.999999}
	i := 0
	sub, err := NewSub(Config{Mode: Shared, Partitions: 1, Retry: policy, Rand: func() float64 {
		i++
		if i <= len(draws) {
			return draws[i-1]
		}
		return rng.Float64()
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sub.Join("a")
	sub.Append("", Message{Offset: 0})
	now := time.Unix(1000, 0)
	spread := map[time.Duration]bool{}
	for n := 1; n <= 40; n++ {
		sub.Request("a", 1)
		ds, _ := sub.Deliver("a", now, 0)
		if len(ds) != 1 || ds[0].Count != n {
			t.Fatalf("delivery %d: %v", n, ds)
		}
		r, err := sub.Nack("a", 0, 0, PolicyDelay, "x", now)
		if err != nil || r.Dead {
			t.Fatalf("nack %d: %v %v", n, r, err)
		}
		d := min(100*time.Millisecond<<(n-1), time.Second)
		if n > 5 {
			d = time.Second
		}
		got := r.At.Sub(now)
		if lo := time.Duration(float64(d) * 0.8); got < lo || got > d {
			t.Fatalf("failure %d: delay %v outside [%v, %v]", n, got, lo, d)
		}
		if n > 5 {
			spread[got] = true
		}
		now = r.At
	}
	if len(spread) < 10 {
		t.Fatalf("jitter does not spread the capped delays: %v", spread)
	}
}

// The policy is validated with the rest of the Config.
func TestConfigValidatesRetryPolicy(t *testing.T) {
	_, err := NewSub(Config{Mode: Shared, Partitions: 1, Retry: retry.Policy{Delays: []time.Duration{0}}}, nil)
	if !errors.Is(err, ErrBadConfig) {
		t.Fatalf("NewSub with a zero delay: %v", err)
	}
}

// In shared mode a redelivery avoids the member it failed on while another
// member has credit, but not while that member is paused (its breaker
// open): then the retry goes back to the member that failed it rather than
// waiting out the cool-down. This stalled a workload in CI for 30 s.
func TestSharedRetrySkipsPausedMembers(t *testing.T) {
	policy, err := retry.ParsePolicy("exponential initial=100ms factor=2 cap=1s max-deliveries=5")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := NewSub(Config{Mode: Shared, Partitions: 1, Retry: policy}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []MemberID{"a", "b"} {
		if _, err := sub.Join(m); err != nil {
			t.Fatal(err)
		}
		if err := sub.Request(m, 10); err != nil {
			t.Fatal(err)
		}
	}
	sub.Append("", Message{Offset: 0})
	now := time.Unix(1000, 0)
	ds, _ := sub.Deliver("a", now, 0)
	if len(ds) != 1 {
		t.Fatalf("first delivery: %v", ds)
	}
	r, err := sub.Nack("a", 0, 0, PolicyDelay, "x", now)
	if err != nil || r.Dead {
		t.Fatalf("nack: %v %v", r, err)
	}
	now = r.At
	if ds, _ := sub.Deliver("a", now, 0); len(ds) != 0 {
		t.Fatalf("the retry went back to a while b has credit: %v", ds)
	}
	sub.Pause("b", true)
	ds, _ = sub.Deliver("a", now, 0)
	if len(ds) != 1 || ds[0].Offset != 0 || ds[0].Count != 2 {
		t.Fatalf("with b paused, a should get the retry: %v", ds)
	}
	sub.Pause("b", false)
	sub.Pause("nobody", true) // unknown members are ignored
}

// Key-shared: a message waiting for redelivery holds back the later
// messages of its key (not other keys), so no later message of a key is
// first delivered before an earlier one was handled.
func TestKeySharedRetryHoldsItsKey(t *testing.T) {
	policy, err := retry.ParsePolicy("1s max-deliveries=5")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := NewSub(Config{Mode: KeyShared, Partitions: 1, Retry: policy}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Join("a"); err != nil {
		t.Fatal(err)
	}
	if err := sub.Request("a", 10); err != nil {
		t.Fatal(err)
	}
	sub.Append("", Message{Offset: 0, Key: "k"})
	now := time.Unix(1000, 0)
	if ds, _ := sub.Deliver("a", now, 0); len(ds) != 1 {
		t.Fatalf("first delivery: %v", ds)
	}
	r, err := sub.Nack("a", 0, 0, PolicyDelay, "x", now)
	if err != nil || r.Dead {
		t.Fatalf("nack: %v %v", r, err)
	}
	sub.Append("", Message{Offset: 1, Key: "k"}, Message{Offset: 2, Key: "other"})
	ds, _ := sub.Deliver("a", now, 0)
	if len(ds) != 1 || ds[0].Offset != 2 {
		t.Fatalf("with k's offset 0 waiting: %v, want only offset 2 (another key)", ds)
	}
	ds, _ = sub.Deliver("a", r.At, 0)
	if len(ds) != 2 || ds[0].Offset != 0 || ds[0].Count != 2 || ds[1].Offset != 1 {
		t.Fatalf("once the retry is due: %v, want offset 0 again, then 1", ds)
	}
}
