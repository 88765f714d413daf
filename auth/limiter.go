package auth

import (
	"sync"
	"time"
)

// limiter bounds failed logins per source address: a token bucket per
// address, one token per failure, refilled at one per every. An address
// without tokens is refused until the next one. The table is bounded: when
// full, addresses whose bucket is full again are dropped, and if none is,
// an arbitrary one (Go's map order) makes room, so a flood of sources can
// neither grow memory nor lock the others out.
type limiter struct {
	mu     sync.Mutex
	burst  float64
	every  time.Duration
	max    int
	tables map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

func newLimiter(burst int, every time.Duration, max int) *limiter {
	if burst <= 0 {
		burst = 10
	}
	if every <= 0 {
		every = 6 * time.Second
	}
	if max <= 0 {
		max = 10_000
	}
	return &limiter{burst: float64(burst), every: every, max: max, tables: map[string]*bucket{}}
}

// refill brings b up to now.
func (l *limiter) refill(b *bucket, now time.Time) {
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(l.burst, b.tokens+float64(d)/float64(l.every))
		b.at = now
	}
}

// allow reports whether addr may try a login now, and if not, how long
// until it may.
func (l *limiter) allow(addr string, now time.Time) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.tables[addr]
	if b == nil {
		return 0, true
	}
	l.refill(b, now)
	if b.tokens >= 1 {
		return 0, true
	}
	return time.Duration((1 - b.tokens) * float64(l.every)), false
}

// begin charges addr one login attempt up front, so that parallel logins
// from one address cannot all pass before their failures count. It
// reports whether addr had a token, and if not, how long until it has.
// A login that succeeds gives its token back (refund).
func (l *limiter) begin(addr string, now time.Time) (time.Duration, bool) {
	if wait, ok := l.allow(addr, now); !ok {
		return wait, false
	}
	l.fail(addr, now)
	return 0, true
}

// refund gives back the token of a login that succeeded.
func (l *limiter) refund(addr string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b := l.tables[addr]; b != nil {
		l.refill(b, now)
		b.tokens = min(l.burst, b.tokens+1)
	}
}

// fail charges addr a failed login.
func (l *limiter) fail(addr string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.tables[addr]
	if b == nil {
		if len(l.tables) >= l.max {
			l.evict(now)
		}
		b = &bucket{tokens: l.burst, at: now}
		l.tables[addr] = b
	}
	l.refill(b, now)
	b.tokens = max(0, b.tokens-1)
	mLimited.Set(float64(len(l.tables)))
}

// evict makes room for one address.
func (l *limiter) evict(now time.Time) {
	for a, b := range l.tables {
		l.refill(b, now)
		if b.tokens >= l.burst {
			delete(l.tables, a)
		}
	}
	for a := range l.tables {
		if len(l.tables) < l.max {
			break
		}
		delete(l.tables, a)
	}
}
