package retry

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// below1 is the largest float64 below 1: the top of u's range.
var below1 = math.Nextafter(1, 0)

func TestRetryDelayList(t *testing.T) {
	p := Policy{Delays: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute}}
	for _, tc := range []struct {
		attempt int
		want    time.Duration
	}{
		{math.MinInt, time.Second}, {0, time.Second}, {1, time.Second}, {2, 5 * time.Second},
		{3, 30 * time.Second}, {4, 2 * time.Minute}, {5, 10 * time.Minute},
		{6, 10 * time.Minute}, {16, 10 * time.Minute}, {math.MaxInt, 10 * time.Minute},
	} {
		// A list has no jitter: u does not matter.
		for _, u := range []float64{0, 0.5, below1} {
			if got := p.Delay(tc.attempt, u); got != tc.want {
				t.Errorf("Delay(%d, %v) = %v, want %v", tc.attempt, u, got, tc.want)
			}
		}
	}
}

func TestRetryDelayExponential(t *testing.T) {
	for _, tc := range []struct {
		p       Policy
		attempt int
		want    time.Duration
	}{
		{Policy{Initial: 100 * time.Millisecond, Factor: 2, Cap: 10 * time.Second}, 0, 100 * time.Millisecond},
		{Policy{Initial: 100 * time.Millisecond, Factor: 2, Cap: 10 * time.Second}, 1, 100 * time.Millisecond},
		{Policy{Initial: 100 * time.Millisecond, Factor: 2, Cap: 10 * time.Second}, 2, 200 * time.Millisecond},
		{Policy{Initial: 100 * time.Millisecond, Factor: 2, Cap: 10 * time.Second}, 3, 400 * time.Millisecond},
		{Policy{Initial: 100 * time.Millisecond, Factor: 2, Cap: 10 * time.Second}, 7, 6400 * time.Millisecond},
		{Policy{Initial: 100 * time.Millisecond, Factor: 2, Cap: 10 * time.Second}, 8, 10 * time.Second},
		{Policy{Initial: 100 * time.Millisecond, Factor: 2, Cap: 10 * time.Second}, 9, 10 * time.Second},
		{Policy{Initial: 100 * time.Millisecond, Factor: 2, Cap: 10 * time.Second}, 2000, 10 * time.Second},
		{Policy{Initial: 100 * time.Millisecond, Factor: 2, Cap: 10 * time.Second}, math.MaxInt, 10 * time.Second},
		{Policy{Initial: time.Second, Factor: 1.5, Cap: time.Hour}, 3, 2250 * time.Millisecond},
		// Initial == Cap: constant.
		{Policy{Initial: time.Minute, Factor: 3, Cap: time.Minute}, 1, time.Minute},
		{Policy{Initial: time.Minute, Factor: 3, Cap: time.Minute}, 5, time.Minute},
		// The longest delay.
		{Policy{Initial: time.Hour, Factor: 10, Cap: MaxRetryDelay}, 1000, MaxRetryDelay},
	} {
		if got := tc.p.Delay(tc.attempt, 0); got != tc.want {
			t.Errorf("%v: Delay(%d, 0) = %v, want %v", tc.p, tc.attempt, got, tc.want)
		}
	}
}

func TestRetryDelayJitter(t *testing.T) {
	p := Policy{Initial: time.Second, Factor: 2, Cap: 10 * time.Second, Jitter: 0.2}
	for _, tc := range []struct {
		attempt int
		u       float64
		want    time.Duration
	}{
		{1, 0, time.Second}, // u = 0: the written schedule
		{1, 0.5, 900 * time.Millisecond},
		{3, 0.25, 3800 * time.Millisecond},
		{1, below1, 800 * time.Millisecond},      // u -> 1: (1-Jitter) of it, truncated
		{10, 0, 10 * time.Second},                // at the cap
		{10, below1, 8 * time.Second},            // jitter spreads below the cap
		{10, 0.5, 9 * time.Second},               //
		{1, -1, time.Second},                     // u clamped to [0, 1]
		{1, math.NaN(), time.Second},             // NaN counts as 0
		{1, math.Inf(1), 800 * time.Millisecond}, //
		{1, 7, 800 * time.Millisecond},
	} {
		if got := p.Delay(tc.attempt, tc.u); got != tc.want {
			t.Errorf("Delay(%d, %v) = %v, want %v", tc.attempt, tc.u, got, tc.want)
		}
	}

	// Bounds: for every attempt and draw, the delay is in
	// [base*(1-Jitter), base] and never above Cap.
	for _, j := range []float64{0, 0.1, 0.2, 0.5, 1} {
		p := Policy{Initial: 3 * time.Millisecond, Factor: 1.7, Cap: 7 * time.Hour, Jitter: j}
		for attempt := 1; attempt <= 60; attempt++ {
			base := p.Delay(attempt, 0)
			lo := max(time.Duration(float64(base)*(1-j)), MinRetryDelay)
			for _, u := range []float64{0, 1e-9, 0.1, 0.5, 0.9, 0.999999, below1} {
				d := p.Delay(attempt, u)
				if d < lo || d > base || d > p.Cap {
					t.Errorf("jitter %v: Delay(%d, %v) = %v, want in [%v, %v]", j, attempt, u, d, lo, base)
				}
			}
		}
	}

	// Jitter 1 may shorten a delay to nothing; it is floored at 1 ms.
	p = Policy{Initial: time.Second, Factor: 2, Cap: time.Minute, Jitter: 1}
	if got := p.Delay(1, below1); got != MinRetryDelay {
		t.Errorf("jitter 1: Delay(1, below1) = %v, want %v", got, MinRetryDelay)
	}
}

func TestRetryDelayDefault(t *testing.T) {
	for _, p := range []Policy{{}, DefaultPolicy()} {
		var sum time.Duration
		for n := 1; n < DefaultMaxDeliveries; n++ {
			sum += p.Delay(n, 0)
		}
		if sum != 4023*time.Second {
			t.Errorf("%#v: the 15 retry delays add up to %v, want 4023s", p, sum)
		}
		if got := p.Delay(1, below1); got != 800*time.Millisecond {
			t.Errorf("%#v: Delay(1, below1) = %v, want 800ms", p, got)
		}
	}
}

// An invalid policy still gets a delay in [MinRetryDelay, MaxRetryDelay].
func TestRetryDelayInvalidPolicy(t *testing.T) {
	for _, p := range []Policy{
		{Delays: []time.Duration{-time.Second, 0, math.MaxInt64}},
		{Initial: -time.Second, Factor: 2, Cap: time.Minute},
		{Initial: time.Second, Factor: math.NaN(), Cap: time.Minute},
		{Initial: time.Second, Factor: math.Inf(1), Cap: math.MaxInt64},
		{Initial: time.Second, Factor: 0.5, Cap: time.Minute},
		{Initial: time.Second, Factor: 2, Cap: 0},
		{Initial: time.Second, Factor: 2, Cap: time.Minute, Jitter: math.NaN()},
		{Initial: time.Second, Factor: 2, Cap: time.Minute, Jitter: -3},
		{Initial: time.Second, Factor: 2, Cap: time.Minute, Jitter: 5},
		{Factor: 2},
	} {
		for _, attempt := range []int{math.MinInt, 0, 1, 2, 3, 64, math.MaxInt} {
			for _, u := range []float64{0, 0.5, below1} {
				if d := p.Delay(attempt, u); d < MinRetryDelay || d > MaxRetryDelay {
					t.Errorf("%#v: Delay(%d, %v) = %v, out of range", p, attempt, u, d)
				}
			}
		}
	}
}

func TestRetryDeadLetter(t *testing.T) {
	for _, tc := range []struct {
		max, deliveries int
		want            bool
	}{
		{3, math.MinInt, false}, {3, 0, false}, {3, 1, false}, {3, 2, false}, {3, 3, true}, {3, 4, true},
		{1, 0, false}, {1, 1, true},
		{0, 15, false}, {0, 16, true}, // 0 means DefaultMaxDeliveries
		{math.MaxInt, math.MaxInt - 1, false}, {math.MaxInt, math.MaxInt, true},
	} {
		p := Policy{MaxDeliveries: tc.max}
		if got := p.DeadLetter(tc.deliveries); got != tc.want {
			t.Errorf("MaxDeliveries %d: DeadLetter(%d) = %v, want %v", tc.max, tc.deliveries, got, tc.want)
		}
	}
}

func TestRetryPolicyValidate(t *testing.T) {
	many := make([]time.Duration, MaxRetryDelays+1)
	for i := range many {
		many[i] = time.Second
	}
	for _, tc := range []struct {
		p    Policy
		want []string // substrings of the error; none: valid
	}{
		{Policy{}, nil},
		{DefaultPolicy(), nil},
		{Policy{Delays: []time.Duration{time.Millisecond, MaxRetryDelay}}, nil},
		{Policy{Delays: many[:MaxRetryDelays]}, nil},
		{Policy{Initial: time.Second, Factor: 1.01, Cap: time.Second, Jitter: 1, MaxDeliveries: 1}, nil},
		{Policy{Delays: many}, []string{"65 delays > 64"}},
		{Policy{Delays: []time.Duration{time.Second, 0, -time.Second, time.Microsecond, MaxRetryDelay + 1}},
			[]string{"delay 2: 0h < 1ms", "delay 3: -1s < 1ms", "delay 4: 1us < 1ms", "delay 5: 7776000000000001ns > 2160h"}},
		{Policy{Delays: []time.Duration{time.Second}, Jitter: 0.2}, []string{"a delay list with exponential fields"}},
		{Policy{Delays: []time.Duration{time.Second}, MaxDeliveries: -1}, []string{"max deliveries -1 < 1"}},
		{Policy{Initial: time.Second}, []string{"factor: 0 is not a finite number > 1", "cap: 0h < 1ms", "cap 0h < initial 1s"}},
		{Policy{Initial: time.Second, Factor: 1, Cap: time.Minute}, []string{"factor: 1 is not"}},
		{Policy{Initial: time.Second, Factor: math.Inf(1), Cap: time.Minute}, []string{"factor: +Inf is not"}},
		{Policy{Initial: time.Second, Factor: math.NaN(), Cap: time.Minute}, []string{"factor: NaN is not"}},
		{Policy{Initial: time.Second, Factor: 2, Cap: time.Minute, Jitter: 1.5}, []string{"jitter: 1.5 not in [0, 1]"}},
		{Policy{Initial: time.Second, Factor: 2, Cap: time.Minute, Jitter: math.NaN()}, []string{"jitter: NaN not in [0, 1]"}},
		{Policy{Initial: time.Hour, Factor: 2, Cap: time.Minute}, []string{"cap 1m < initial 1h"}},
		{Policy{Initial: 0, Factor: 2, Cap: 100 * 24 * time.Hour, Jitter: -0.1, MaxDeliveries: -5},
			// Every problem at once.
			[]string{"initial: 0h < 1ms", "cap: 2400h > 2160h (90 days)", "jitter: -0.1 not in", "max deliveries -5 < 1"}},
	} {
		err := tc.p.Validate()
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("%#v: Validate() = %v, want nil", tc.p, err)
			}
			continue
		}
		if !errors.Is(err, ErrBadPolicy) {
			t.Errorf("%#v: Validate() = %v, want ErrBadPolicy", tc.p, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%#v: Validate() = %q, want it to say %q", tc.p, err, w)
			}
		}
	}
}

func TestParseRetryPolicy(t *testing.T) {
	def := DefaultPolicy()
	for _, tc := range []struct {
		in   string
		want Policy
	}{
		{"1s,5s,30s,2m,10m", Policy{Delays: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second,
			2 * time.Minute, 10 * time.Minute}, MaxDeliveries: 16}},
		{"  500ms\tmax-deliveries=3\n", Policy{Delays: []time.Duration{500 * time.Millisecond}, MaxDeliveries: 3}},
		{"1.5s,1h30m,2160h", Policy{Delays: []time.Duration{1500 * time.Millisecond, 90 * time.Minute, MaxRetryDelay},
			MaxDeliveries: 16}},
		{"exponential", def},
		{"exponential max-deliveries=4", Policy{Initial: def.Initial, Factor: def.Factor, Cap: def.Cap,
			Jitter: def.Jitter, MaxDeliveries: 4}},
		{"exponential initial=100ms factor=2 cap=10m jitter=0.2", Policy{Initial: 100 * time.Millisecond,
			Factor: 2, Cap: 10 * time.Minute, Jitter: 0.2, MaxDeliveries: 16}},
		{"exponential jitter=0 cap=1h max-deliveries=1 factor=1.5 initial=1m", Policy{Initial: time.Minute,
			Factor: 1.5, Cap: time.Hour, Jitter: 0, MaxDeliveries: 1}},
		{"exponential initial=10m", Policy{Initial: 10 * time.Minute, Factor: 2, Cap: 10 * time.Minute,
			Jitter: 0.2, MaxDeliveries: 16}},
	} {
		got, err := ParsePolicy(tc.in)
		if err != nil || !got.Equal(tc.want) {
			t.Errorf("ParsePolicy(%q) = %#v, %v; want %#v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseRetryPolicyErrors(t *testing.T) {
	for _, tc := range []struct {
		in     string
		off    int
		token  string
		reason string
	}{
		{"", 0, "", "empty"},
		{" \t ", 0, "", "empty"},
		{"expo", 0, "expo", "unknown schedule"},
		{"Exponential", 0, "Exponential", "unknown schedule"},
		{"1s,,5s", 3, "", "delay 2 is empty"},
		{"1s,5s,", 6, "", "delay 3 is empty"},
		{"1s, 5s", 3, "", "delay 2 is empty (write a list without spaces)"},
		{"1s,5x", 3, "5x", "delay 2 is not a duration"},
		{"1s,0s", 3, "0s", "delay 2: 0h < 1ms"},
		{"1s,-5s", 3, "-5s", "delay 2: -5s < 1ms"},
		{"1s,500us", 3, "500us", "delay 2: 500us < 1ms"},
		{"91d", 0, "91d", "delay 1 is not a duration"},
		{"2161h", 0, "2161h", "delay 1: 2161h > 2160h (90 days)"},
		{strings.Repeat("1s,", 64) + "2s", 192, "2s", "more than 64 delays"},
		{"1s,5s jitter=0.2", 6, "jitter=0.2", "applies only to an exponential schedule"},
		{"1s factor", 3, "factor", "want an option key=value"},
		{"1s max-deliveries=0", 3, "max-deliveries=0", "max-deliveries must be an integer >= 1"},
		{"1s max-deliveries=-1", 3, "max-deliveries=-1", ">= 1"},
		{"1s max-deliveries=2.5", 3, "max-deliveries=2.5", ">= 1"},
		{"1s max-deliveries=99999999999999999999", 3, "max-deliveries=99999999999999999999", ">= 1"},
		{"1s max-deliveries=3 max-deliveries=3", 20, "max-deliveries=3", "given twice"},
		{"exponential retries=3", 12, "retries=3", "unknown option retries"},
		{"exponential =3", 12, "=3", "unknown option"},
		{"exponential initial=0s", 12, "initial=0s", "initial: 0h < 1ms"},
		{"exponential initial=fast", 12, "initial=fast", "initial is not a duration"},
		{"exponential factor=1", 12, "factor=1", "factor: 1 is not a finite number > 1"},
		{"exponential factor=0.5", 12, "factor=0.5", "factor: 0.5 is not"},
		{"exponential factor=NaN", 12, "factor=NaN", "factor: NaN is not"},
		{"exponential factor=Inf", 12, "factor=Inf", "factor: +Inf is not"},
		{"exponential factor=1e999", 12, "factor=1e999", "factor is not a number"},
		{"exponential factor=two", 12, "factor=two", "factor is not a number"},
		{"exponential jitter=1.01", 12, "jitter=1.01", "jitter: 1.01 not in [0, 1]"},
		{"exponential jitter=-0.2", 12, "jitter=-0.2", "jitter: -0.2 not in [0, 1]"},
		{"exponential jitter=0.1 jitter=0.2", 23, "jitter=0.2", "option jitter given twice"},
		{"exponential cap=91d", 12, "cap=91d", "cap is not a duration"},
		{"exponential cap=2161h", 12, "cap=2161h", "cap: 2161h > 2160h (90 days)"},
		{"exponential initial=5s cap=1s", 23, "cap=1s", "cap 1s < initial 5s"},
		{"exponential cap=500ms", 12, "cap=500ms", "cap 500ms < initial 1s"},
		{"exponential initial=1h", 12, "initial=1h", "initial 1h > cap 10m (the default); give a cap"},
	} {
		_, err := ParsePolicy(tc.in)
		var pe *PolicyError
		if !errors.Is(err, ErrBadPolicy) || !errors.As(err, &pe) {
			t.Errorf("ParsePolicy(%q) = %v, want a *PolicyError", tc.in, err)
			continue
		}
		if pe.Offset != tc.off || pe.Token != tc.token || !strings.Contains(pe.Reason, tc.reason) {
			t.Errorf("ParsePolicy(%q) = %q at %d: %q; want %q at %d: ...%q...",
				tc.in, pe.Token, pe.Offset, pe.Reason, tc.token, tc.off, tc.reason)
		}
	}

	_, err := ParsePolicy("exponential factor=1")
	if want := `herald: bad retry policy: "factor=1" at byte 12: factor: 1 is not a finite number > 1`; err == nil || err.Error() != want {
		t.Errorf("error text %q, want %q", err, want)
	}
}

func TestRetryPolicyString(t *testing.T) {
	for _, tc := range []struct {
		p    Policy
		want string
	}{
		{Policy{}, "exponential initial=1s factor=2 cap=10m jitter=0.2 max-deliveries=16"},
		{DefaultPolicy(), "exponential initial=1s factor=2 cap=10m jitter=0.2 max-deliveries=16"},
		{Policy{Delays: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute}},
			"1s,5s,30s,2m,10m max-deliveries=16"},
		{Policy{Delays: []time.Duration{1500 * time.Millisecond, 90 * time.Second, 90 * time.Minute, MaxRetryDelay,
			1001 * time.Microsecond, time.Second + 100*time.Nanosecond}, MaxDeliveries: 3},
			"1500ms,90s,90m,2160h,1001us,1000000100ns max-deliveries=3"},
		{Policy{Initial: time.Millisecond, Factor: math.Nextafter(1, 2), Cap: MaxRetryDelay, Jitter: 1e-5, MaxDeliveries: 1},
			"exponential initial=1ms factor=1.0000000000000002 cap=2160h jitter=1e-05 max-deliveries=1"},
		{Policy{Initial: time.Minute, Factor: 1e300, Cap: time.Hour, Jitter: 1, MaxDeliveries: math.MaxInt},
			"exponential initial=1m factor=1e+300 cap=1h jitter=1 max-deliveries=9223372036854775807"},
		{Policy{Initial: time.Second, Factor: 2, Cap: time.Minute, MaxDeliveries: 5},
			"exponential initial=1s factor=2 cap=1m jitter=0 max-deliveries=5"},
	} {
		s := tc.p.String()
		if s != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.p, s, tc.want)
		}
		got, err := ParsePolicy(s)
		if want := tc.p.WithDefaults(); err != nil || !got.Equal(want) {
			t.Errorf("ParsePolicy(%q) = %#v, %v; want %#v", s, got, err, want)
		}
	}
}

// FuzzParseRetryPolicy guarantees that ParsePolicy never panics; that
// its errors are *PolicyError values matching ErrBadPolicy whose
// Token sits at Offset in the input; and that a policy it returns is valid,
// has every field set, prints with String to a text that parses back to an
// Equal policy, and yields delays within the schedule's bounds.
func FuzzParseRetryPolicy(f *testing.F) {
	f.Add(DefaultPolicy().String())
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePolicy(s)
		if err != nil {
			var pe *PolicyError
			if !errors.Is(err, ErrBadPolicy) || !errors.As(err, &pe) {
				t.Fatalf("ParsePolicy(%q) = %v, want a *PolicyError", s, err)
			}
			if pe.Offset < 0 || pe.Offset+len(pe.Token) > len(s) || s[pe.Offset:pe.Offset+len(pe.Token)] != pe.Token {
				t.Fatalf("ParsePolicy(%q): token %q not at byte %d", s, pe.Token, pe.Offset)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("ParsePolicy(%q) = %#v, which does not Validate: %v", s, p, err)
		}
		if !p.Equal(p.WithDefaults()) {
			t.Fatalf("ParsePolicy(%q) = %#v, with fields left to defaults", s, p)
		}
		q, err := ParsePolicy(p.String())
		if err != nil || !q.Equal(p) {
			t.Fatalf("ParsePolicy(%q) = %#v; its String %q parses to %#v, %v", s, p, p.String(), q, err)
		}
		prev := time.Duration(0)
		for attempt := 1; attempt <= 70; attempt++ {
			d := p.Delay(attempt, 0)
			if len(p.Delays) > 0 {
				if want := p.Delays[min(attempt, len(p.Delays))-1]; d != want {
					t.Fatalf("%v: Delay(%d, 0) = %v, want %v", p, attempt, d, want)
				}
			} else if d < prev || d < p.Initial || d > p.Cap {
				t.Fatalf("%v: Delay(%d, 0) = %v after %v, want non-decreasing in [initial, cap]", p, attempt, d, prev)
			}
			prev = d
			if j := p.Delay(attempt, below1); j > d || j < MinRetryDelay {
				t.Fatalf("%v: Delay(%d, below1) = %v, want in [1ms, %v]", p, attempt, j, d)
			}
		}
		if p.DeadLetter(p.MaxDeliveries-1) || !p.DeadLetter(p.MaxDeliveries) {
			t.Fatalf("%v: DeadLetter boundary not at %d", p, p.MaxDeliveries)
		}
	})
}
