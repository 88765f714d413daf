package consumer

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/sony/gobreaker/v2"
)

// Breaker is the circuit breaker of one member of one push subscription (a
// sony/gobreaker TwoStepCircuitBreaker underneath). The consumer-session
// actor asks Allow before it pushes a delivery and reports the delivery's
// outcome later: Success on ack, Failure on nack or ack timeout. When the
// member keeps failing the breaker opens and Allow answers false for
// BreakerConfig.CoolDown, so a failing downstream gets no redelivery storm;
// then it half-opens and lets BreakerConfig.Probes deliveries through. When
// all of them are acked it closes; the first probe that fails re-opens it.
//
// Outcomes arrive long after Allow and many deliveries are in flight at
// once, so Allow returns a BreakerToken that the caller keeps with the
// in-flight delivery and passes back to Success, Failure or Forget, exactly
// once. The table of outstanding tokens is bounded by
// BreakerConfig.MaxInFlight, which the session sets to the subscription's
// credit cap (Config.MaxCredits): the broker never has more unacked
// deliveries in flight to a member than it granted, so in correct use the
// bound is never reached; when it is, Allow answers false and counts
// nothing. A delivery that Allow refused was never counted and must not be
// reported. Outcomes of deliveries allowed before the latest state change
// (say, acks that arrive after the breaker opened) are dropped by gobreaker
// and do not count.
//
// Time: gobreaker reads the wall clock itself and has no clock hook, so this
// is the one type in the package that reads time, an exception to the pure
// core the package comment describes (and to injected time; a fake clock
// would mean forking gobreaker).
// The move from open to half-open happens lazily, at the first Allow or
// State after the cool-down; the session actor calls State on its tick so
// that the gauge and the state-change hook follow while delivery is paused.
//
// Ownership: one Breaker belongs to one session actor, but it is safe for
// concurrent use, so that `herald group describe` and metric scrapes may read
// it from elsewhere. The state-change hook runs after the breaker's locks
// are released, on the goroutine of the call that caused the change (a
// change caused by a concurrent call may be delivered by whichever call is
// already delivering changes), one change at a time and in order; it may
// call the Breaker.
//
// Metrics: herald_consumer_breaker_state{group,member} follows the state
// (0 closed, 1 half-open, 2 open) and herald_consumer_breaker_trips_total
// {group} counts moves to open. There must be one live Breaker per (group,
// member): Close the old one before making another, because Close deletes
// the member's gauge series.
type Breaker struct {
	group    string
	member   MemberID
	cfg      BreakerConfig
	onChange func(BreakerChange)
	gauge    prometheus.Gauge
	trips    prometheus.Counter

	mu      sync.Mutex // guards everything below, and every call into cb
	cb      *gobreaker.TwoStepCircuitBreaker[struct{}]
	tokens  map[BreakerToken]func(error)
	next    BreakerToken
	closed  bool
	last    FailReason // the most recent failure reported, for describe
	pending []BreakerChange
	firing  bool // a call is running the hook over pending
}

// BreakerToken names one allowed delivery until its outcome is reported. The
// zero token is never issued.
type BreakerToken uint64

// BreakerState is a breaker's state; its value is the gauge's.
type BreakerState uint8

const (
	// BreakerClosed: deliveries flow; failures are counted.
	BreakerClosed BreakerState = iota
	// BreakerHalfOpen: up to Probes deliveries are allowed to test the
	// member.
	BreakerHalfOpen
	// BreakerOpen: delivery to the member is paused for the cool-down.
	BreakerOpen
)

var breakerStateNames = [...]string{BreakerClosed: "closed", BreakerHalfOpen: "half-open", BreakerOpen: "open"}

// String returns "closed", "half-open" or "open", as `herald group describe`
// shows it.
func (s BreakerState) String() string {
	if int(s) < len(breakerStateNames) {
		return breakerStateNames[s]
	}
	return fmt.Sprintf("breaker-state(%d)", uint8(s))
}

func fromGobreaker(s gobreaker.State) BreakerState {
	switch s {
	case gobreaker.StateHalfOpen:
		return BreakerHalfOpen
	case gobreaker.StateOpen:
		return BreakerOpen
	default:
		return BreakerClosed
	}
}

// BreakerChange is a state change, as passed to the hook.
type BreakerChange struct {
	Group    string
	Member   MemberID
	From, To BreakerState
}

// FailReason is why a delivery failed.
type FailReason uint8

const (
	// FailNack: the member nacked the message.
	FailNack FailReason = iota + 1
	// FailAckTimeout: the member did not ack within the ack timeout.
	FailAckTimeout
)

func (r FailReason) String() string {
	switch r {
	case FailNack:
		return "nack"
	case FailAckTimeout:
		return "ack-timeout"
	case 0:
		return "none"
	}
	return fmt.Sprintf("fail-reason(%d)", uint8(r))
}

// ErrBreakerToken: Success, Failure or Forget named a token that Allow never
// issued, whose outcome was already reported, or that Close discarded.
var ErrBreakerToken = errors.New("herald: unknown breaker token")

var (
	errBreakerNack       = errors.New("nack")
	errBreakerAckTimeout = errors.New("ack timeout")
	errBreakerExcluded   = errors.New("excluded")
)

// Defaults for BreakerConfig's zero values.
const (
	DefaultBreakerConsecutiveFailures = 5
	DefaultBreakerMinRequests         = 20
	DefaultBreakerInterval            = time.Minute
	DefaultBreakerCoolDown            = 30 * time.Second
	DefaultBreakerProbes              = 1
)

// BreakerConfig configures the breaker of each member of a push
// subscription. The breaker opens when either trip rule holds.
type BreakerConfig struct {
	// ConsecutiveFailures opens the breaker at that many failures in a row
	// (within Interval). The coordinator reports one outcome per ack or
	// nack request (the SDK batches them) and one per ack timeout. 0 means DefaultBreakerConsecutiveFailures;
	// -1 turns the rule off.
	ConsecutiveFailures int
	// FailureRatio, in (0, 1], opens the breaker when failures/outcomes
	// reaches it once MinRequests outcomes were reported within Interval.
	// Outcomes are acks plus failures: deliveries still in flight and
	// forgotten ones do not count. 0 turns the rule off.
	FailureRatio float64
	// MinRequests is the number of outcomes the ratio rule waits for. 0
	// means DefaultBreakerMinRequests. Ignored when FailureRatio is 0.
	MinRequests int
	// Interval is the window over which failures are counted while closed.
	// 0 means DefaultBreakerInterval.
	Interval time.Duration
	// BucketPeriod makes the window a rolling one made of buckets this
	// long (Interval is rounded up to a multiple of it); 0 means a fixed
	// window cleared every Interval.
	BucketPeriod time.Duration
	// CoolDown is how long the breaker stays open before it half-opens.
	// 0 means DefaultBreakerCoolDown.
	CoolDown time.Duration
	// Probes is how many deliveries the half-open breaker lets through;
	// all of them must be acked to close it. 0 means DefaultBreakerProbes.
	Probes int
	// MaxInFlight bounds the outstanding tokens; set it to the
	// subscription's credit cap. 0 means DefaultMaxCredits.
	MaxInFlight int
}

// Validate reports every problem with c at once, after defaults.
func (c BreakerConfig) Validate() error {
	var errs []string
	if c.ConsecutiveFailures < -1 {
		errs = append(errs, fmt.Sprintf("breaker consecutive failures %d < -1", c.ConsecutiveFailures))
	}
	if c.FailureRatio < 0 || c.FailureRatio > 1 || math.IsNaN(c.FailureRatio) {
		errs = append(errs, fmt.Sprintf("breaker failure ratio %v not in [0, 1]", c.FailureRatio))
	}
	if c.ConsecutiveFailures == -1 && c.FailureRatio == 0 {
		errs = append(errs, "breaker has no trip rule (consecutive failures -1 and failure ratio 0)")
	}
	for name, v := range map[string]int64{"breaker min requests": int64(c.MinRequests),
		"breaker interval": int64(c.Interval), "breaker bucket period": int64(c.BucketPeriod),
		"breaker cool-down": int64(c.CoolDown), "breaker probes": int64(c.Probes),
		"breaker max in-flight": int64(c.MaxInFlight)} {
		if v < 0 {
			errs = append(errs, fmt.Sprintf("%s %d < 0", name, v))
		}
	}
	const maxU32 = 1<<32 - 1
	for name, v := range map[string]int{"breaker consecutive failures": c.ConsecutiveFailures,
		"breaker min requests": c.MinRequests, "breaker probes": c.Probes} {
		if int64(v) > maxU32 {
			errs = append(errs, fmt.Sprintf("%s %d > %d", name, v, int64(maxU32)))
		}
	}
	interval := c.Interval
	if interval == 0 {
		interval = DefaultBreakerInterval
	}
	if c.BucketPeriod > interval {
		errs = append(errs, fmt.Sprintf("breaker bucket period %v > interval %v", c.BucketPeriod, interval))
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		return fmt.Errorf("%w: %v", ErrBadConfig, errs)
	}
	return nil
}

func (c *BreakerConfig) ensureDefaults() {
	if c.ConsecutiveFailures == 0 {
		c.ConsecutiveFailures = DefaultBreakerConsecutiveFailures
	}
	if c.MinRequests == 0 {
		c.MinRequests = DefaultBreakerMinRequests
	}
	if c.Interval == 0 {
		c.Interval = DefaultBreakerInterval
	}
	if c.CoolDown == 0 {
		c.CoolDown = DefaultBreakerCoolDown
	}
	if c.Probes == 0 {
		c.Probes = DefaultBreakerProbes
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxCredits
	}
}

// readyToTrip is the trip rule gobreaker asks after each failure while
// closed.
func (c BreakerConfig) readyToTrip(n gobreaker.Counts) bool {
	if c.ConsecutiveFailures > 0 && n.ConsecutiveFailures >= uint32(c.ConsecutiveFailures) {
		return true
	}
	outcomes := uint64(n.TotalSuccesses) + uint64(n.TotalFailures)
	return c.FailureRatio > 0 && outcomes >= uint64(c.MinRequests) &&
		float64(n.TotalFailures) >= c.FailureRatio*float64(outcomes)
}

var (
	breakerStateGauge = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_consumer_breaker_state",
		Help: "Circuit breaker of a push subscriber: 0 closed, 1 half-open, 2 open (delivery paused).",
	}, []string{"group", "member"})
	breakerTrips = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_consumer_breaker_trips_total",
		Help: "Times a subscriber's circuit breaker opened (from closed, or again from half-open).",
	}, []string{"group"})
)

// NewBreaker returns the closed breaker of member in group and sets its gauge
// to 0. onChange, if not nil, is called on every state change (see Breaker).
// It fails with ErrBadConfig if cfg does not Validate.
func NewBreaker(group string, member MemberID, cfg BreakerConfig, onChange func(BreakerChange)) (*Breaker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.ensureDefaults()
	b := &Breaker{
		group:    group,
		member:   member,
		cfg:      cfg,
		onChange: onChange,
		gauge:    breakerStateGauge.WithLabelValues(group, string(member)),
		trips:    breakerTrips.WithLabelValues(group),
		tokens:   map[BreakerToken]func(error){},
	}
	b.gauge.Set(float64(BreakerClosed))
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         group + "/" + string(member),
		MaxRequests:  uint32(cfg.Probes),
		Interval:     cfg.Interval,
		BucketPeriod: cfg.BucketPeriod,
		Timeout:      cfg.CoolDown,
		ReadyToTrip:  cfg.readyToTrip,
		IsExcluded:   func(err error) bool { return err == errBreakerExcluded },
		// Runs inside gobreaker's lock, itself inside b.mu: record only.
		OnStateChange: func(_ string, from, to gobreaker.State) { b.changed(fromGobreaker(from), fromGobreaker(to)) },
	})
	return b, nil
}

// changed runs under b.mu (every call into cb holds it).
func (b *Breaker) changed(from, to BreakerState) {
	if b.closed {
		return
	}
	b.gauge.Set(float64(to))
	if to == BreakerOpen {
		b.trips.Inc()
	}
	if b.onChange != nil {
		b.pending = append(b.pending, BreakerChange{Group: b.group, Member: b.member, From: from, To: to})
	}
}

// unlock releases b.mu and then runs the hook over the recorded changes,
// unless another call is running it already (it will pick them up).
func (b *Breaker) unlock() {
	if b.firing || len(b.pending) == 0 {
		b.mu.Unlock()
		return
	}
	b.firing = true
	for len(b.pending) > 0 {
		batch := b.pending
		b.pending = nil
		b.mu.Unlock()
		for _, c := range batch {
			b.onChange(c)
		}
		b.mu.Lock()
	}
	b.firing = false
	b.mu.Unlock()
}

// Allow reports whether a delivery may be pushed to the member now, and if
// so returns the token to report its outcome with. It answers false while
// the breaker is open, while all half-open probes are out, and when
// MaxInFlight tokens are outstanding or the breaker is closed for good
// (Close); a refused delivery is not counted.
func (b *Breaker) Allow() (BreakerToken, bool) {
	b.mu.Lock()
	defer b.unlock()
	if b.closed || len(b.tokens) >= b.cfg.MaxInFlight {
		return 0, false
	}
	done, err := b.cb.Allow()
	if err != nil {
		return 0, false
	}
	b.next++
	b.tokens[b.next] = done
	return b.next, true
}

// Success reports that the delivery of tok was acked.
func (b *Breaker) Success(tok BreakerToken) error { return b.report(tok, 0, nil) }

// Failure reports that the delivery of tok failed: nacked (FailNack) or not
// acked in time (FailAckTimeout). Any other reason counts as a nack.
func (b *Breaker) Failure(tok BreakerToken, reason FailReason) error {
	if reason == FailAckTimeout {
		return b.report(tok, reason, errBreakerAckTimeout)
	}
	return b.report(tok, reason, errBreakerNack)
}

// Forget gives tok up with no outcome: the delivery was withdrawn (member
// left, partition revoked, session closing) rather than acked or failed. It
// counts neither way, and a half-open breaker may let another probe through
// in its place.
func (b *Breaker) Forget(tok BreakerToken) error { return b.report(tok, 0, errBreakerExcluded) }

func (b *Breaker) report(tok BreakerToken, reason FailReason, err error) error {
	b.mu.Lock()
	defer b.unlock()
	done, ok := b.tokens[tok]
	if !ok {
		return fmt.Errorf("%w %d", ErrBreakerToken, tok)
	}
	delete(b.tokens, tok)
	if reason != 0 {
		b.last = reason
	}
	done(err)
	return nil
}

// Record counts one outcome that has no token, if the breaker is closed:
// success when reason is 0, else a failure for reason. The push path uses
// tokens only for half-open probes; while closed it reports each failure
// (nack, ack timeout) with Record and each ack request that acked anything
// as one success, which is what the consecutive-failures rule needs and
// costs one call per ack batch instead of two per message. (The ratio rule
// then sees ack batches, not messages, as its successes.) It reports
// whether the outcome was counted.
func (b *Breaker) Record(reason FailReason) bool {
	b.mu.Lock()
	defer b.unlock()
	if b.closed || b.cb.State() != gobreaker.StateClosed {
		return false
	}
	done, err := b.cb.Allow()
	if err != nil {
		return false
	}
	switch reason {
	case 0:
		done(nil)
	case FailAckTimeout:
		b.last = reason
		done(errBreakerAckTimeout)
	default:
		b.last = reason
		done(errBreakerNack)
	}
	return true
}

// State returns the breaker's state, first moving it from open to half-open
// if the cool-down has passed (which updates the gauge and runs the hook).
func (b *Breaker) State() BreakerState {
	b.mu.Lock()
	defer b.unlock()
	return fromGobreaker(b.cb.State())
}

// InFlight returns the number of outstanding tokens.
func (b *Breaker) InFlight() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.tokens)
}

// LastFailure returns the reason of the most recent Failure, or 0 if none.
func (b *Breaker) LastFailure() FailReason {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last
}

// Close retires the breaker when its member leaves or its session ends: it
// deletes the member's gauge series, discards the outstanding tokens, and
// from then on Allow answers false and no hook runs. The group's trip
// counter stays (other members share it); ForgetBreakerGroup removes it.
// Close is idempotent.
func (b *Breaker) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	b.tokens = nil
	b.pending = nil
	breakerStateGauge.DeleteLabelValues(b.group, string(b.member))
}

// ForgetBreakerGroup deletes the group's trip counter series; the
// coordinator calls it when the group is deleted, after closing every
// member's Breaker.
func ForgetBreakerGroup(group string) {
	breakerTrips.DeleteLabelValues(group)
}
