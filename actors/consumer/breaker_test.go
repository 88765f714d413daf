package consumer

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The tests drive a real gobreaker. Durations are short, and a change that
// depends on the wall clock (the cool-down) is awaited by polling State
// with a deadline, never by sleeping a guessed amount.

// changeLog records the hook's calls.
type changeLog struct {
	mu      sync.Mutex
	changes []BreakerChange
}

func (l *changeLog) hook(c BreakerChange) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.changes = append(l.changes, c)
}

// path returns the states passed through, starting with the first From.
func (l *changeLog) path() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.changes) == 0 {
		return ""
	}
	s := []string{l.changes[0].From.String()}
	for _, c := range l.changes {
		s = append(s, c.To.String())
	}
	return strings.Join(s, " > ")
}

// newTestBreaker returns a breaker whose group is the test's name, so tests
// do not share metric series, and closes it at cleanup.
func newTestBreaker(t *testing.T, cfg BreakerConfig) (*Breaker, *changeLog) {
	t.Helper()
	l := &changeLog{}
	b, err := NewBreaker(t.Name(), "m1", cfg, l.hook)
	if err != nil {
		t.Fatalf("NewBreaker: %v", err)
	}
	t.Cleanup(func() {
		b.Close()
		ForgetBreakerGroup(t.Name())
	})
	return b, l
}

// checkFor polls fn until it returns nil or total passes.
func checkFor(t *testing.T, total, sleep time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", total, err)
		}
		time.Sleep(sleep)
	}
}

func waitState(t *testing.T, b *Breaker, want BreakerState) {
	t.Helper()
	checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if got := b.State(); got != want {
			return fmt.Errorf("state %v, want %v", got, want)
		}
		return nil
	})
}

// metric reads one series from the default registry.
func metric(t *testing.T, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue series
				}
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue(), true
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

func checkMetrics(t *testing.T, b *Breaker, state BreakerState, trips float64) {
	t.Helper()
	g, ok := metric(t, "herald_consumer_breaker_state", map[string]string{"group": b.group, "member": string(b.member)})
	if !ok || g != float64(state) {
		t.Errorf("state gauge = %v (present %v), want %v (%v)", g, ok, float64(state), state)
	}
	c, _ := metric(t, "herald_consumer_breaker_trips_total", map[string]string{"group": b.group})
	if c != trips {
		t.Errorf("trips = %v, want %v", c, trips)
	}
}

func allow(t *testing.T, b *Breaker) BreakerToken {
	t.Helper()
	tok, ok := b.Allow()
	if !ok {
		t.Fatalf("Allow refused in state %v", b.State())
	}
	return tok
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// trip opens b (closed, consecutive rule n) with n failures.
func trip(t *testing.T, b *Breaker, n int) {
	t.Helper()
	for range n {
		must(t, b.Failure(allow(t, b), FailNack))
	}
}

func TestBreakerOpensAfterConsecutiveFailures(t *testing.T) {
	b, l := newTestBreaker(t, BreakerConfig{ConsecutiveFailures: 3, CoolDown: time.Hour})
	checkMetrics(t, b, BreakerClosed, 0)

	late := allow(t, b) // in flight across the trip
	toks := []BreakerToken{allow(t, b), allow(t, b), allow(t, b), allow(t, b)}
	must(t, b.Failure(toks[0], FailNack))
	must(t, b.Success(toks[1])) // resets the run
	must(t, b.Failure(toks[2], FailAckTimeout))
	must(t, b.Failure(toks[3], FailNack))
	if s := b.State(); s != BreakerClosed {
		t.Fatalf("after 2 consecutive failures: %v, want closed", s)
	}
	must(t, b.Failure(allow(t, b), FailAckTimeout))
	if s := b.State(); s != BreakerOpen {
		t.Fatalf("after 3 consecutive failures: %v, want open", s)
	}
	if r := b.LastFailure(); r != FailAckTimeout {
		t.Errorf("LastFailure = %v, want ack-timeout", r)
	}
	checkMetrics(t, b, BreakerOpen, 1)
	if p := l.path(); p != "closed > open" {
		t.Errorf("hook saw %q", p)
	}

	for range 10 {
		if tok, ok := b.Allow(); ok {
			t.Fatalf("Allow while open gave token %d", tok)
		}
	}
	// The ack of a delivery allowed before the trip is accepted but does not
	// count: the breaker stays open.
	must(t, b.Success(late))
	if s := b.State(); s != BreakerOpen {
		t.Fatalf("late ack moved the breaker to %v", s)
	}
	if n := b.InFlight(); n != 0 {
		t.Errorf("InFlight = %d, want 0", n)
	}
}

func TestBreakerOpensOnFailureRatio(t *testing.T) {
	b, _ := newTestBreaker(t, BreakerConfig{ConsecutiveFailures: -1, FailureRatio: 0.5, MinRequests: 4, CoolDown: time.Hour})
	// Deliveries still in flight do not count as outcomes.
	var idle []BreakerToken
	for range 20 {
		idle = append(idle, allow(t, b))
	}
	for _, f := range []bool{true, false, true} {
		tok := allow(t, b)
		if f {
			must(t, b.Failure(tok, FailNack))
		} else {
			must(t, b.Success(tok))
		}
	}
	if s := b.State(); s != BreakerClosed {
		t.Fatalf("2 failures of 3 outcomes (min 4): %v, want closed", s)
	}
	must(t, b.Success(allow(t, b)))
	if s := b.State(); s != BreakerClosed {
		t.Fatalf("an ack never trips (the rule is asked after failures): %v, want closed", s)
	}
	// The ratio rule is asked after failures: 3 of 5 >= 0.5.
	must(t, b.Failure(allow(t, b), FailNack))
	if s := b.State(); s != BreakerOpen {
		t.Fatalf("3 failures of 5 outcomes: %v, want open", s)
	}
	checkMetrics(t, b, BreakerOpen, 1)
	for _, tok := range idle {
		must(t, b.Forget(tok))
	}
}

func TestBreakerHalfOpenProbesClose(t *testing.T) {
	b, l := newTestBreaker(t, BreakerConfig{ConsecutiveFailures: 2, CoolDown: 50 * time.Millisecond, Probes: 3})
	late := allow(t, b)
	trip(t, b, 2)
	checkMetrics(t, b, BreakerOpen, 1)

	waitState(t, b, BreakerHalfOpen)
	checkMetrics(t, b, BreakerHalfOpen, 1)

	var probes []BreakerToken
	for range 3 {
		probes = append(probes, allow(t, b))
	}
	for range 5 {
		if tok, ok := b.Allow(); ok {
			t.Fatalf("half-open let a 4th probe through (token %d)", tok)
		}
	}
	// An ack from before the trip is not a probe's ack.
	must(t, b.Success(late))
	must(t, b.Success(probes[0]))
	must(t, b.Success(probes[1]))
	if s := b.State(); s != BreakerHalfOpen {
		t.Fatalf("after 2 of 3 probe acks: %v, want half-open", s)
	}
	must(t, b.Success(probes[2]))
	if s := b.State(); s != BreakerClosed {
		t.Fatalf("after 3 probe acks: %v, want closed", s)
	}
	checkMetrics(t, b, BreakerClosed, 1)
	if p := l.path(); p != "closed > open > half-open > closed" {
		t.Errorf("hook saw %q", p)
	}
	// Closed again: deliveries flow and the failure run starts afresh.
	must(t, b.Failure(allow(t, b), FailNack))
	if s := b.State(); s != BreakerClosed {
		t.Fatalf("one failure after closing: %v, want closed", s)
	}
}

func TestBreakerProbeFailureReopens(t *testing.T) {
	b, l := newTestBreaker(t, BreakerConfig{ConsecutiveFailures: 1, CoolDown: 50 * time.Millisecond, Probes: 2})
	trip(t, b, 1)
	waitState(t, b, BreakerHalfOpen)
	p1, p2 := allow(t, b), allow(t, b)
	must(t, b.Success(p1))
	must(t, b.Failure(p2, FailNack))
	// Read the log, not State: the new cool-down may already have passed.
	if p := l.path(); p != "closed > open > half-open > open" {
		t.Fatalf("hook saw %q", p)
	}
	c, _ := metric(t, "herald_consumer_breaker_trips_total", map[string]string{"group": b.group})
	if c != 2 {
		t.Errorf("trips = %v, want 2", c)
	}
	// And it half-opens again after another cool-down.
	waitState(t, b, BreakerHalfOpen)
	checkMetrics(t, b, BreakerHalfOpen, 2)
}

func TestBreakerForgetFreesProbe(t *testing.T) {
	b, _ := newTestBreaker(t, BreakerConfig{ConsecutiveFailures: 1, CoolDown: 20 * time.Millisecond})
	trip(t, b, 1)
	waitState(t, b, BreakerHalfOpen)
	p := allow(t, b)
	if _, ok := b.Allow(); ok {
		t.Fatal("second probe allowed with Probes 1")
	}
	must(t, b.Forget(p))
	if s := b.State(); s != BreakerHalfOpen {
		t.Fatalf("Forget changed the state to %v", s)
	}
	must(t, b.Success(allow(t, b)))
	if s := b.State(); s != BreakerClosed {
		t.Fatalf("probe ack: %v, want closed", s)
	}
}

func TestBreakerTokens(t *testing.T) {
	b, _ := newTestBreaker(t, BreakerConfig{ConsecutiveFailures: 2, MaxInFlight: 2, CoolDown: time.Hour})
	if err := b.Success(0); !errors.Is(err, ErrBreakerToken) {
		t.Errorf("Success(0) = %v, want ErrBreakerToken", err)
	}
	t1, t2 := allow(t, b), allow(t, b)
	if t1 == 0 || t1 == t2 {
		t.Fatalf("tokens %d, %d", t1, t2)
	}
	// The table is full: refused, and the refusal is not counted.
	if _, ok := b.Allow(); ok {
		t.Fatal("Allow beyond MaxInFlight")
	}
	if n := b.cb.Counts().Requests; n != 2 {
		t.Errorf("gobreaker counted %d requests, want 2", n)
	}
	must(t, b.Failure(t1, FailNack))
	if err := b.Failure(t1, FailNack); !errors.Is(err, ErrBreakerToken) {
		t.Errorf("second Failure of one token = %v, want ErrBreakerToken", err)
	}
	if s := b.State(); s != BreakerClosed {
		t.Fatalf("a duplicate report counted: %v", s)
	}
	t3 := allow(t, b)
	must(t, b.Forget(t2))
	must(t, b.Forget(t3))
	if n := b.InFlight(); n != 0 {
		t.Errorf("InFlight = %d, want 0", n)
	}
}

func TestBreakerClose(t *testing.T) {
	b, l := newTestBreaker(t, BreakerConfig{ConsecutiveFailures: 1, CoolDown: 10 * time.Millisecond})
	labels := map[string]string{"group": b.group, "member": "m1"}
	tok := allow(t, b)
	must(t, b.Failure(allow(t, b), FailNack))
	if _, ok := metric(t, "herald_consumer_breaker_state", labels); !ok {
		t.Fatal("no gauge series before Close")
	}
	b.Close()
	b.Close()
	if _, ok := metric(t, "herald_consumer_breaker_state", labels); ok {
		t.Error("gauge series survives Close")
	}
	if err := b.Success(tok); !errors.Is(err, ErrBreakerToken) {
		t.Errorf("Success after Close = %v, want ErrBreakerToken", err)
	}
	// The cool-down passes; the state change recreates no series and runs
	// no hook.
	before := l.path()
	waitState(t, b, BreakerHalfOpen)
	if _, ok := b.Allow(); ok {
		t.Error("Allow after Close")
	}
	if _, ok := metric(t, "herald_consumer_breaker_state", labels); ok {
		t.Error("gauge series recreated after Close")
	}
	if p := l.path(); p != before {
		t.Errorf("hook ran after Close: %q, was %q", p, before)
	}
	if _, ok := metric(t, "herald_consumer_breaker_trips_total", map[string]string{"group": b.group}); !ok {
		t.Error("Close removed the group's trip counter")
	}
	ForgetBreakerGroup(b.group)
	if _, ok := metric(t, "herald_consumer_breaker_trips_total", map[string]string{"group": b.group}); ok {
		t.Error("trip counter survives ForgetBreakerGroup")
	}
}

// The hook runs outside the breaker's locks, so it may call the breaker.
func TestBreakerHookMayCallBreaker(t *testing.T) {
	var b *Breaker
	var seen []BreakerState
	b, err := NewBreaker(t.Name(), "m1", BreakerConfig{ConsecutiveFailures: 1, CoolDown: time.Hour}, func(c BreakerChange) {
		seen = append(seen, b.State())
		_, _ = b.Allow()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ForgetBreakerGroup(t.Name())
	defer b.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if tok, ok := b.Allow(); ok {
			_ = b.Failure(tok, FailNack)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("deadlock: hook calling the breaker")
	}
	if len(seen) != 1 || seen[0] != BreakerOpen {
		t.Errorf("hook saw %v, want [open]", seen)
	}
}

func TestBreakerConcurrent(t *testing.T) {
	b, l := newTestBreaker(t, BreakerConfig{ConsecutiveFailures: 3, FailureRatio: 0.4, MinRequests: 10,
		CoolDown: time.Millisecond, Probes: 2, MaxInFlight: 64})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				tok, ok := b.Allow()
				if !ok {
					_ = b.State()
					continue
				}
				switch (g + i) % 3 {
				case 0:
					_ = b.Success(tok)
				case 1:
					_ = b.Failure(tok, FailAckTimeout)
				default:
					_ = b.Forget(tok)
				}
				_ = b.InFlight()
				_ = b.LastFailure()
			}
		})
	}
	wg.Wait()
	if n := b.InFlight(); n != 0 {
		t.Errorf("InFlight = %d after every token was reported", n)
	}
	// The hook saw a consistent chain of changes, ending in the state the
	// gauge shows.
	l.mu.Lock()
	changes := slices.Clone(l.changes)
	l.mu.Unlock()
	if len(changes) == 0 {
		t.Fatal("no state change with half the outcomes failing")
	}
	opens := 0
	for i, c := range changes {
		if i > 0 && c.From != changes[i-1].To {
			t.Fatalf("change %d: %v>%v after %v>%v", i, c.From, c.To, changes[i-1].From, changes[i-1].To)
		}
		if c.To == BreakerOpen {
			opens++
		}
	}
	last := changes[len(changes)-1].To
	checkMetrics(t, b, last, float64(opens))
}

func TestBreakerConfigValidate(t *testing.T) {
	if err := (BreakerConfig{}).Validate(); err != nil {
		t.Errorf("zero config: %v", err)
	}
	if err := (BreakerConfig{ConsecutiveFailures: -1, FailureRatio: 1}).Validate(); err != nil {
		t.Errorf("ratio-only config: %v", err)
	}
	for _, tc := range []struct {
		cfg  BreakerConfig
		want []string
	}{
		{BreakerConfig{ConsecutiveFailures: -2}, []string{"consecutive failures -2 < -1"}},
		{BreakerConfig{ConsecutiveFailures: -1}, []string{"no trip rule"}},
		{BreakerConfig{FailureRatio: 1.5}, []string{"failure ratio 1.5 not in [0, 1]"}},
		{BreakerConfig{BucketPeriod: 2 * time.Minute}, []string{"bucket period 2m0s > interval 1m0s"}},
		{BreakerConfig{ConsecutiveFailures: -2, FailureRatio: -0.1, MinRequests: -1, Interval: -1,
			BucketPeriod: -1, CoolDown: -1, Probes: -1, MaxInFlight: -1},
			[]string{"consecutive failures -2 < -1", "failure ratio -0.1", "min requests -1 < 0", "interval -1 < 0",
				"bucket period -1 < 0", "cool-down -1 < 0", "probes -1 < 0", "max in-flight -1 < 0"}},
	} {
		err := tc.cfg.Validate()
		if !errors.Is(err, ErrBadConfig) {
			t.Errorf("%+v: %v, want ErrBadConfig", tc.cfg, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: %q lacks %q", tc.cfg, err, w)
			}
		}
		if _, err := NewBreaker("g", "m", tc.cfg, nil); !errors.Is(err, ErrBadConfig) {
			t.Errorf("NewBreaker(%+v) = %v, want ErrBadConfig", tc.cfg, err)
		}
	}
}

func TestBreakerStateString(t *testing.T) {
	for s, want := range map[BreakerState]string{BreakerClosed: "closed", BreakerHalfOpen: "half-open", BreakerOpen: "open", 7: "breaker-state(7)"} {
		if got := s.String(); got != want {
			t.Errorf("%d: %q, want %q", s, got, want)
		}
	}
}

func TestBreakerRecord(t *testing.T) {
	b, l := newTestBreaker(t, BreakerConfig{ConsecutiveFailures: 3, CoolDown: 50 * time.Millisecond})
	for _, r := range []FailReason{FailNack, FailNack, 0} {
		if !b.Record(r) {
			t.Fatalf("closed breaker refused outcome %v", r)
		}
	}
	b.Record(FailAckTimeout)
	b.Record(FailNack)
	if s := b.State(); s != BreakerClosed {
		t.Fatalf("success did not reset the run: %v", s)
	}
	b.Record(FailNack)
	if s := b.State(); s != BreakerOpen {
		t.Fatalf("after 3 recorded failures: %v", s)
	}
	if b.Record(0) {
		t.Fatal("open breaker counted an outcome")
	}
	waitState(t, b, BreakerHalfOpen)
	if b.Record(0) {
		t.Fatal("half-open breaker counted a tokenless outcome (only probes count)")
	}
	must(t, b.Success(allow(t, b)))
	if s := b.State(); s != BreakerClosed {
		t.Fatalf("after the probe's ack: %v", s)
	}
	if p := l.path(); p != "closed > open > half-open > closed" {
		t.Errorf("hook saw %q", p)
	}
}
