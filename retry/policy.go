// Package retry holds the retry and dead-letter policy that consumer groups
// apply: when a message is delivered again (Policy: fixed delays or
// exponential backoff with jitter, and the deliveries after which it is
// dead-lettered), the dead-letter topic's name, and the headers that record
// where a dead letter came from (Origin) and that a redrive strips. It is
// pure and belongs to the shared layer the actor rooms use.
package retry

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrBadPolicy marks every error of ParsePolicy and
// Policy.Validate; check it with errors.Is.
var ErrBadPolicy = errors.New("herald: bad retry policy")

// Bounds and defaults of a Policy.
const (
	// MinRetryDelay is the shortest delay a policy may name and Delay may
	// return: the scheduler fires to the millisecond.
	MinRetryDelay = time.Millisecond
	// MaxRetryDelay is the longest delay a policy may name (the
	// scheduler's longest delay).
	MaxRetryDelay = 90 * 24 * time.Hour
	// MaxRetryDelays bounds the length of a delay list.
	MaxRetryDelays = 64
	// DefaultMaxDeliveries is what MaxDeliveries 0 means.
	DefaultMaxDeliveries = 16
)

// Policy says when a subscription redelivers a message whose delivery
// failed (a nack without an explicit delay, or an ack timeout) and when it
// gives up and dead-letters it. It is a value: no clock, no randomness, no
// state; the caller passes the failed delivery count and a random draw.
//
// A policy is one of two schedules:
//
//   - A list: Delays is non-empty and the exponential fields are zero. The
//     n-th failed delivery is retried after Delays[n-1]; the last delay
//     repeats for every later failure (as NATS JetStream's BackOff does).
//     List delays are exact, with no jitter, as in NATS and in RocketMQ's
//     delay levels.
//   - Exponential: Delays is empty. The n-th failed delivery is retried after
//     min(Initial*Factor^(n-1), Cap), shortened by jitter (see Delay).
//
// The zero Policy is DefaultPolicy(): a policy whose Delays,
// Initial, Factor, Cap and Jitter are all zero takes the default exponential
// schedule, and MaxDeliveries 0 means DefaultMaxDeliveries. No other field
// has a default. Validate reports what is wrong after these defaults.
//
// Delays is shared when a policy is copied: do not change it once the policy
// is handed to a subscription.
type Policy struct {
	// Delays is the list schedule, 1 to MaxRetryDelays delays, each in
	// [MinRetryDelay, MaxRetryDelay].
	Delays []time.Duration
	// Initial is the exponential schedule's first delay, in
	// [MinRetryDelay, Cap].
	Initial time.Duration
	// Factor multiplies the delay after each failure; finite and > 1.
	Factor float64
	// Cap bounds the exponential delay before jitter, in
	// [Initial, MaxRetryDelay]; a retry never comes later than Cap.
	Cap time.Duration
	// Jitter is the fraction in [0, 1] by which Delay may shorten an
	// exponential delay; 0 means none.
	Jitter float64
	// MaxDeliveries is how many deliveries a message gets, the first one
	// included: when delivery MaxDeliveries fails the message goes to the
	// dead-letter topic instead of being retried. 0 means
	// DefaultMaxDeliveries; at least 1 otherwise.
	MaxDeliveries int
}

// DefaultPolicy is the policy of a subscription that sets none:
// exponential from 1s, doubling, capped at 10m, jitter 0.2, and
// DefaultMaxDeliveries (16) deliveries. Its 15 retry delays add up to 4023 s,
// so a message that always fails is dead-lettered at most about 67 minutes
// (plus processing and ack timeouts) after its first delivery.
func DefaultPolicy() Policy {
	return Policy{Initial: time.Second, Factor: 2, Cap: 10 * time.Minute, Jitter: 0.2,
		MaxDeliveries: DefaultMaxDeliveries}
}

// WithDefaults returns p with its zero fields replaced as the Policy
// doc says. It does not validate.
func (p Policy) WithDefaults() Policy {
	if len(p.Delays) == 0 && p.Initial == 0 && p.Factor == 0 && p.Cap == 0 && p.Jitter == 0 {
		d := DefaultPolicy()
		p.Initial, p.Factor, p.Cap, p.Jitter = d.Initial, d.Factor, d.Cap, d.Jitter
	}
	if p.MaxDeliveries == 0 {
		p.MaxDeliveries = DefaultMaxDeliveries
	}
	return p
}

// Delay is how long to wait before redelivering a message whose delivery
// number attempt just failed (1: the first delivery failed). An attempt
// below 1 counts as 1. The caller asks DeadLetter first; Delay does not.
//
// u is a uniform random number in [0, 1) drawn by the caller (values
// outside are clamped, NaN counts as 0); it only matters for an exponential
// policy with jitter, whose delay is
//
//	d = min(Initial*Factor^(attempt-1), Cap) * (1 - Jitter*u)
//
// so d is in (base*(1-Jitter), base], and u = 0 gives the schedule as
// written. Jitter only ever shortens a delay. Kafka's client backoff draws
// in base*(1±Jitter) and then clamps to its maximum, so once the schedule
// reaches the cap (where a backlog of failing messages sits) half the draws
// collapse onto exactly the cap and retry together. Shortening keeps them
// spread at the cap too, keeps Cap a true upper bound, and makes the sum of
// the written delays an upper bound on the time to the dead-letter queue,
// which is what an operator reading "cap=10m" expects. The mean delay is
// base*(1-Jitter/2).
//
// The result is always in [MinRetryDelay, MaxRetryDelay], even for a policy
// that does not Validate; Delay never panics.
func (p Policy) Delay(attempt int, u float64) time.Duration {
	p = p.WithDefaults()
	attempt = max(attempt, 1)
	var d time.Duration
	if len(p.Delays) > 0 {
		d = p.Delays[min(attempt, len(p.Delays))-1]
	} else {
		capf := float64(p.Cap)
		base := float64(p.Initial) * math.Pow(p.Factor, float64(attempt-1))
		if !(base < capf) { // also NaN
			base = capf
		}
		j := p.Jitter
		if !(j > 0) {
			j = 0
		}
		j = min(j, 1)
		if !(u > 0) {
			u = 0
		}
		u = min(u, 1)
		f := base * (1 - j*u)
		// f is at most Cap, so it converts exactly for a valid policy; an
		// invalid one (NaN, negative, beyond MaxRetryDelay) is clamped.
		switch {
		case !(f > 0):
			d = 0
		case f >= float64(MaxRetryDelay):
			d = MaxRetryDelay
		default:
			d = time.Duration(f)
		}
	}
	return min(max(d, MinRetryDelay), MaxRetryDelay)
}

// DeadLetter reports whether a message whose delivery number deliveries
// (1: the first) just failed goes to the dead-letter topic rather than
// being retried: deliveries >= MaxDeliveries (after defaults).
func (p Policy) DeadLetter(deliveries int) bool {
	return deliveries >= p.WithDefaults().MaxDeliveries
}

// Equal reports whether p and q are the same policy field by field (Policy
// holds a slice, so == does not compile). It does not apply defaults.
func (p Policy) Equal(q Policy) bool {
	return slices.Equal(p.Delays, q.Delays) && p.Initial == q.Initial && p.Factor == q.Factor &&
		p.Cap == q.Cap && p.Jitter == q.Jitter && p.MaxDeliveries == q.MaxDeliveries
}

// Validate reports every problem with p at once, after defaults, as one
// error that matches ErrBadPolicy.
func (p Policy) Validate() error {
	p = p.WithDefaults()
	var errs []string
	add := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if len(p.Delays) > 0 {
		if len(p.Delays) > MaxRetryDelays {
			add("%d delays > %d", len(p.Delays), MaxRetryDelays)
		}
		for i, d := range p.Delays {
			if r := checkRetryDelay(d); r != "" {
				add("delay %d: %s", i+1, r)
			}
		}
		if p.Initial != 0 || p.Factor != 0 || p.Cap != 0 || p.Jitter != 0 {
			add("a delay list with exponential fields (initial %v, factor %v, cap %v, jitter %v)",
				p.Initial, p.Factor, p.Cap, p.Jitter)
		}
	} else {
		if r := checkRetryDelay(p.Initial); r != "" {
			add("initial: %s", r)
		}
		if r := checkRetryFactor(p.Factor); r != "" {
			add("factor: %s", r)
		}
		if r := checkRetryDelay(p.Cap); r != "" {
			add("cap: %s", r)
		}
		if r := checkRetryJitter(p.Jitter); r != "" {
			add("jitter: %s", r)
		}
		if p.Cap < p.Initial {
			add("cap %s < initial %s", formatRetryDelay(p.Cap), formatRetryDelay(p.Initial))
		}
	}
	if p.MaxDeliveries < 1 {
		add("max deliveries %d < 1", p.MaxDeliveries)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrBadPolicy, strings.Join(errs, "; "))
	}
	return nil
}

func checkRetryDelay(d time.Duration) string {
	switch {
	case d < MinRetryDelay:
		return fmt.Sprintf("%s < %s", formatRetryDelay(d), formatRetryDelay(MinRetryDelay))
	case d > MaxRetryDelay:
		return fmt.Sprintf("%s > %s (90 days)", formatRetryDelay(d), formatRetryDelay(MaxRetryDelay))
	}
	return ""
}

func checkRetryFactor(f float64) string {
	if !(f > 1) || math.IsInf(f, 0) {
		return fmt.Sprintf("%v is not a finite number > 1", f)
	}
	return ""
}

func checkRetryJitter(j float64) string {
	if !(j >= 0 && j <= 1) {
		return fmt.Sprintf("%v not in [0, 1]", j)
	}
	return ""
}

// String formats p (after defaults) in the syntax of ParsePolicy, every
// field written out. For a valid p, ParsePolicy(p.String()) returns a
// policy Equal to p.WithDefaults().
func (p Policy) String() string {
	p = p.WithDefaults()
	var b strings.Builder
	if len(p.Delays) > 0 {
		for i, d := range p.Delays {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(formatRetryDelay(d))
		}
	} else {
		fmt.Fprintf(&b, "exponential initial=%s factor=%s cap=%s jitter=%s", formatRetryDelay(p.Initial),
			strconv.FormatFloat(p.Factor, 'g', -1, 64), formatRetryDelay(p.Cap),
			strconv.FormatFloat(p.Jitter, 'g', -1, 64))
	}
	fmt.Fprintf(&b, " max-deliveries=%d", p.MaxDeliveries)
	return b.String()
}

// formatRetryDelay writes d in the largest unit that holds it exactly
// ("90s" stays "90s", 2 minutes is "2m", not "2m0s"), which
// time.ParseDuration reads back unchanged.
func formatRetryDelay(d time.Duration) string {
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}, {time.Microsecond, "us"}} {
		if d%u.d == 0 {
			return strconv.FormatInt(int64(d/u.d), 10) + u.name
		}
	}
	return strconv.FormatInt(int64(d), 10) + "ns"
}

// PolicyError is the error of ParsePolicy: the first token that
// is wrong, where it is and why. It matches ErrBadPolicy.
type PolicyError struct {
	// Offset is the byte offset of Token in the parsed text.
	Offset int
	// Token is the offending text: a list item, an option ("factor=1"), the
	// schedule word, or "" for an empty text or list item.
	Token  string
	Reason string
}

func (e *PolicyError) Error() string {
	return fmt.Sprintf("%v: %q at byte %d: %s", ErrBadPolicy, e.Token, e.Offset, e.Reason)
}

// Unwrap makes errors.Is(err, ErrBadPolicy) hold.
func (e *PolicyError) Unwrap() error { return ErrBadPolicy }

// retryToken is one whitespace-separated word of a policy text.
type retryToken struct {
	off  int
	text string
}

// ParsePolicy parses a retry policy as the CLI and the config file
// write it: a schedule, then options, separated by spaces.
//
//	1s,5s,30s,2m,10m
//	1s,5s,30s,2m,10m max-deliveries=5
//	exponential
//	exponential initial=100ms factor=2 cap=10m jitter=0.2 max-deliveries=16
//
// The schedule is either a comma-separated list of delays (no spaces in it)
// or the word "exponential". Delays are Go durations (time.ParseDuration:
// 500ms, 1.5s, 2m, 1h30m), each in [MinRetryDelay, MaxRetryDelay]; a list
// has at most MaxRetryDelays of them. Options are key=value, each at most
// once, in any order:
//
//	initial=DURATION    exponential only; default 1s
//	factor=NUMBER       exponential only; > 1; default 2
//	cap=DURATION        exponential only; >= initial; default 10m
//	jitter=NUMBER       exponential only; in [0, 1]; default 0.2, 0 for none
//	max-deliveries=N    >= 1; default 16
//
// The result has every field set (MaxDeliveries included) and is valid. An
// error is a *PolicyError naming the first wrong token and its byte
// offset, and matches ErrBadPolicy.
func ParsePolicy(s string) (Policy, error) {
	bad := func(t retryToken, format string, args ...any) (Policy, error) {
		return Policy{}, &PolicyError{Offset: t.off, Token: t.text, Reason: fmt.Sprintf(format, args...)}
	}
	var toks []retryToken
	for i := 0; i < len(s); {
		if isRetrySpace(s[i]) {
			i++
			continue
		}
		j := i
		for j < len(s) && !isRetrySpace(s[j]) {
			j++
		}
		toks = append(toks, retryToken{i, s[i:j]})
		i = j
	}
	if len(toks) == 0 {
		return bad(retryToken{0, ""}, "empty; want a delay list such as 1s,5s,30s or exponential")
	}

	var p Policy
	sched := toks[0]
	exp := sched.text == "exponential"
	if exp {
		d := DefaultPolicy()
		p.Initial, p.Factor, p.Cap, p.Jitter = d.Initial, d.Factor, d.Cap, d.Jitter
	} else {
		if !strings.ContainsAny(sched.text, ",0123456789") {
			return bad(sched, "unknown schedule; want a delay list such as 1s,5s,30s or exponential")
		}
		off := sched.off
		items := strings.Split(sched.text, ",")
		for i, item := range items {
			t := retryToken{off, item}
			off += len(item) + 1
			if i == MaxRetryDelays {
				return bad(t, "more than %d delays", MaxRetryDelays)
			}
			if item == "" {
				if i == len(items)-1 && len(toks) > 1 {
					return bad(t, "delay %d is empty (write a list without spaces)", i+1)
				}
				return bad(t, "delay %d is empty", i+1)
			}
			d, err := time.ParseDuration(item)
			if err != nil {
				return bad(t, "delay %d is not a duration such as 500ms, 30s or 2m", i+1)
			}
			if r := checkRetryDelay(d); r != "" {
				return bad(t, "delay %d: %s", i+1, r)
			}
			p.Delays = append(p.Delays, d)
		}
	}

	seen := map[string]bool{}
	var initialTok, capTok retryToken
	for _, t := range toks[1:] {
		key, val, ok := strings.Cut(t.text, "=")
		if !ok {
			return bad(t, "want an option key=value")
		}
		if seen[key] {
			return bad(t, "option %s given twice", key)
		}
		seen[key] = true
		switch key {
		case "max-deliveries":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 {
				return bad(t, "max-deliveries must be an integer >= 1")
			}
			p.MaxDeliveries = n
			continue
		case "initial", "factor", "cap", "jitter":
			if !exp {
				return bad(t, "option %s applies only to an exponential schedule", key)
			}
		default:
			return bad(t, "unknown option %s; want initial, factor, cap, jitter or max-deliveries", key)
		}
		switch key {
		case "initial", "cap":
			d, err := time.ParseDuration(val)
			if err != nil {
				return bad(t, "%s is not a duration such as 500ms, 30s or 2m", key)
			}
			if r := checkRetryDelay(d); r != "" {
				return bad(t, "%s: %s", key, r)
			}
			if key == "initial" {
				p.Initial, initialTok = d, t
			} else {
				p.Cap, capTok = d, t
			}
		case "factor", "jitter":
			f, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return bad(t, "%s is not a number", key)
			}
			if key == "factor" {
				if r := checkRetryFactor(f); r != "" {
					return bad(t, "factor: %s", r)
				}
				p.Factor = f
			} else {
				if r := checkRetryJitter(f); r != "" {
					return bad(t, "jitter: %s", r)
				}
				p.Jitter = f
			}
		}
	}
	if exp && p.Cap < p.Initial {
		// Blame the option the user wrote: cap if given, else initial
		// (against the default cap).
		if seen["cap"] {
			return bad(capTok, "cap %s < initial %s", formatRetryDelay(p.Cap), formatRetryDelay(p.Initial))
		}
		return bad(initialTok, "initial %s > cap %s (the default); give a cap", formatRetryDelay(p.Initial),
			formatRetryDelay(p.Cap))
	}
	if p.MaxDeliveries == 0 {
		p.MaxDeliveries = DefaultMaxDeliveries
	}
	if err := p.Validate(); err != nil {
		// Every rule above is checked per token; reaching here is a bug.
		return bad(sched, "%v", err)
	}
	return p, nil
}

func isRetrySpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
