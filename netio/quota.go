package netio

import (
	"fmt"
	"math"
	"sync"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Tenancy is what netio asks the broker about vhosts and quotas. Its
// methods are called on the event loops: they must not block.
type Tenancy interface {
	// Vhost reports whether vhost (not the default) exists, and its
	// quotas (nil: none).
	Vhost(name string) (*heraldpb.Quotas, bool)
	// UserQuotas are user's quotas (nil: none).
	UserQuotas(user string) *heraldpb.Quotas
	// Usage is a vhost's topics, partitions and stored bytes: counted now
	// when fresh, else as recently counted (at most a second ago).
	Usage(vhost string, fresh bool) (topics, partitions int, stored int64)
	// UserUsage is the same of the topics a user created (their owner).
	UserUsage(user string, fresh bool) (topics, partitions int, stored int64)
	// TopicOwner is the user that created topic (a broker name; "" for
	// none or an unknown topic).
	TopicOwner(topic string) string
}

// An account is what a vhost or a user uses of its quotas on this node:
// its connections, and its produce and consume byte rates as token
// buckets of one second's worth. Accounts live while connections hold
// them (refs), so the table is bounded by the connections.
type account struct {
	key              string // "vhost:NAME" or "user:NAME"
	refs             int    // connections holding it (quotas.mu)
	mu               sync.Mutex
	produce, consume bucket
}

// bucket is a token bucket in bytes; tokens may go below zero by one
// request's size (the request that found tokens is let through whole).
type bucket struct {
	tokens float64
	at     time.Time
}

// refill brings the bucket up to now at rate bytes/s.
func (b *bucket) refill(rate uint64, now time.Time) {
	if b.at.IsZero() {
		b.tokens, b.at = float64(rate), now
	}
	b.tokens = min(float64(rate), b.tokens+now.Sub(b.at).Seconds()*float64(rate))
	b.at = now
}

// take charges n bytes at rate bytes/s if the bucket has tokens, and
// reports whether it had; if not, how long until it has.
func (b *bucket) take(n int64, rate uint64, now time.Time) (time.Duration, bool) {
	b.refill(rate, now)
	if b.tokens <= 0 {
		return time.Duration(-b.tokens / float64(rate) * float64(time.Second)), false
	}
	b.charge(n, rate)
	return 0, true
}

// maxDebt bounds how far below zero a bucket goes, in seconds of its
// rate: one huge response never locks its account out for long.
const maxDebt = 5

// charge takes n bytes whatever the tokens (a response already sent).
func (b *bucket) charge(n int64, rate uint64) {
	b.tokens = max(-maxDebt*float64(rate), b.tokens-float64(n))
}

// quotas holds the accounts in use.
type quotas struct {
	mu       sync.Mutex
	accounts map[string]*account
}

// hold takes a connection's reference to the account key (made if new)
// and reports whether its connections were fewer than max (0 = none);
// if not, the reference is not taken.
func (q *quotas) hold(key string, max uint32) (*account, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.accounts == nil {
		q.accounts = map[string]*account{}
	}
	a := q.accounts[key]
	if a == nil {
		a = &account{key: key}
	}
	if max > 0 && a.refs >= int(max) {
		return nil, false
	}
	a.refs++
	q.accounts[key] = a
	mQuotaConns.WithLabelValues(key).Set(float64(a.refs))
	return a, true
}

// release drops a connection's reference.
func (q *quotas) release(a *account) {
	q.mu.Lock()
	defer q.mu.Unlock()
	a.refs--
	mQuotaConns.WithLabelValues(a.key).Set(float64(a.refs))
	if a.refs <= 0 {
		delete(q.accounts, a.key)
		mQuotaConns.DeleteLabelValues(a.key)
	}
}

// VhostConnections is how many connections work in vhost on this node
// (for a vhost other than the default).
func (s *Server) VhostConnections(vhost string) int {
	s.quotas.mu.Lock()
	defer s.quotas.mu.Unlock()
	if a := s.quotas.accounts["vhost:"+vhost]; a != nil {
		return a.refs
	}
	return 0
}

var (
	mQuotaConns = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_quota_connections",
		Help: "Client connections on this node per account (vhost:NAME for a vhost other than the default, user:NAME for a user with quotas).",
	}, []string{"account"})
	mQuotaBytes = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_vhost_bytes_total",
		Help: "Bytes produced (produce requests) and consumed (fetch responses) per vhost.",
	}, []string{"vhost", "direction"})
	mQuotaRefused = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_quota_refused_total",
		Help: "Requests refused by a quota, per account and quota (produce_rate, consume_rate: THROTTLED; connections, topics, partitions, stored_bytes: QUOTA_EXCEEDED).",
	}, []string{"account", "quota"})
)

func quotaExceeded(account, quota, format string, args ...any) *heraldpb.Error {
	mQuotaRefused.WithLabelValues(account, quota).Inc()
	return heraldpb.NewError(heraldpb.ErrorCode_QUOTA_EXCEEDED, "%s", fmt.Sprintf(format, args...))
}

func quotaThrottled(account, quota string, wait time.Duration, format string, args ...any) *heraldpb.Error {
	mQuotaRefused.WithLabelValues(account, quota).Inc()
	e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "%s", fmt.Sprintf(format, args...))
	e.RetryAfterMs = uint32(max(1, (wait+time.Millisecond-1)/time.Millisecond))
	return e
}

// limits are the quotas of a connection's accounts, looked up now (a
// change applies at once).
func (c *conn) limits() (vq, uq *heraldpb.Quotas) {
	t := c.s.cfg.Tenancy
	if t == nil {
		return nil, nil
	}
	if c.vacct.Load() != nil {
		vq, _ = t.Vhost(c.vhostName())
	}
	if c.uacct.Load() != nil {
		uq = t.UserQuotas(c.who())
	}
	return vq, uq
}

// checkQuota refuses a request over one of the connection's quotas:
// produce and fetch rates (THROTTLED, with the wait), and topics,
// partitions and stored bytes of the vhost (QUOTA_EXCEEDED). size is the
// request's bytes.
func (c *conn) checkQuota(f *heraldpb.Frame, size int64) *heraldpb.Error {
	vhost := c.vhostName()
	if producing(f) && !registry.IsDefaultVhost(vhost) {
		mQuotaBytes.WithLabelValues(vhost, "produce").Add(float64(size))
	}
	if t := c.s.cfg.Tenancy; t != nil {
		if p, ok := f.Body.(*heraldpb.Frame_Produce); ok {
			if e := c.ownerStorage(p.Produce.Topic); e != nil {
				return e
			}
		}
	}
	vq, uq := c.limits()
	if vq == nil && uq == nil {
		return nil
	}
	now := time.Now()
	va, ua := c.vacct.Load(), c.uacct.Load()
	rate := func(a *account, q *heraldpb.Quotas, consume bool) *heraldpb.Error {
		if a == nil || q == nil {
			return nil
		}
		r, b, name, n := q.ProduceBytesPerSec, &a.produce, "produce_rate", size
		if consume {
			r, b, name, n = q.ConsumeBytesPerSec, &a.consume, "consume_rate", 0 // charged with the response
		}
		if r == 0 {
			return nil
		}
		a.mu.Lock()
		wait, ok := b.take(n, r, now)
		a.mu.Unlock()
		if !ok {
			return quotaThrottled(a.key, name, wait, "%s is over its %s quota of %d bytes/s", a.key, name, r)
		}
		return nil
	}
	switch b := f.Body.(type) {
	case *heraldpb.Frame_Produce, *heraldpb.Frame_Publish:
		if vq != nil && vq.MaxStoredBytes > 0 {
			if _, _, stored := c.s.cfg.Tenancy.Usage(vhost, false); stored >= int64(vq.MaxStoredBytes) {
				return quotaExceeded(va.key, "stored_bytes", "vhost %q stores %d bytes, its quota is %d", vhost, stored, vq.MaxStoredBytes)
			}
		}
		if e := rate(va, vq, false); e != nil {
			return e
		}
		return rate(ua, uq, false)
	case *heraldpb.Frame_Fetch:
		if e := rate(va, vq, true); e != nil {
			return e
		}
		return rate(ua, uq, true)
	case *heraldpb.Frame_CreateTopic:
		n := int(max(1, b.CreateTopic.GetConfig().GetPartitions()))
		if vq != nil && (vq.MaxTopics > 0 || vq.MaxPartitions > 0) {
			topics, parts, _ := c.s.cfg.Tenancy.Usage(vhost, true)
			if e := countQuota(va.key, fmt.Sprintf("vhost %q", vhost), vq, topics, parts, n); e != nil {
				return e
			}
		}
		if uq != nil && (uq.MaxTopics > 0 || uq.MaxPartitions > 0) {
			topics, parts, _ := c.s.cfg.Tenancy.UserUsage(c.who(), true)
			if e := countQuota(ua.key, fmt.Sprintf("user %q", c.who()), uq, topics, parts, n); e != nil {
				return e
			}
		}
	}
	return nil
}

// countQuota refuses a topic of n partitions past q's topics or
// partitions, given what who has.
func countQuota(account, who string, q *heraldpb.Quotas, topics, parts, n int) *heraldpb.Error {
	if q.MaxTopics > 0 && topics >= int(q.MaxTopics) {
		return quotaExceeded(account, "topics", "%s has %d topics, its quota is %d", who, topics, q.MaxTopics)
	}
	if q.MaxPartitions > 0 && parts+n > int(q.MaxPartitions) {
		return quotaExceeded(account, "partitions", "%s has %d partitions, %d more would pass its quota of %d", who, parts, n, q.MaxPartitions)
	}
	return nil
}

// ownerStorage refuses a produce to a topic whose owner (the user that
// created it) stores its quota of bytes already.
func (c *conn) ownerStorage(topic string) *heraldpb.Error {
	t := c.s.cfg.Tenancy
	owner := t.TopicOwner(topic)
	if owner == "" {
		return nil
	}
	q := t.UserQuotas(owner)
	if q == nil || q.MaxStoredBytes == 0 {
		return nil
	}
	if _, _, stored := t.UserUsage(owner, false); stored >= int64(q.MaxStoredBytes) {
		return quotaExceeded("user:"+owner, "stored_bytes", "user %q's topics store %d bytes, its quota is %d", owner, stored, q.MaxStoredBytes)
	}
	return nil
}

// chargeConsumed counts a fetch response's bytes against the consume
// rates (from the session actor).
func (c *conn) chargeConsumed(n int) {
	if vh := c.vhostName(); !registry.IsDefaultVhost(vh) {
		mQuotaBytes.WithLabelValues(vh, "consume").Add(float64(n))
	}
	vq, uq := c.limits()
	now := time.Now()
	for _, x := range []struct {
		a *account
		q *heraldpb.Quotas
	}{{c.vacct.Load(), vq}, {c.uacct.Load(), uq}} {
		if x.a != nil && x.q != nil && x.q.ConsumeBytesPerSec > 0 {
			x.a.mu.Lock()
			x.a.consume.refill(x.q.ConsumeBytesPerSec, now)
			x.a.consume.charge(int64(n), x.q.ConsumeBytesPerSec)
			x.a.mu.Unlock()
		}
	}
}

// consumeRoom is how many bytes the connection's consume quotas let it
// take now (math.MaxInt64 without one): the consumer groups' pushes wait
// while it is not positive, and retry shortly (their congestion timer).
func (c *conn) consumeRoom() int64 {
	vq, uq := c.limits()
	room := int64(math.MaxInt64)
	now := time.Now()
	for _, x := range []struct {
		a *account
		q *heraldpb.Quotas
	}{{c.vacct.Load(), vq}, {c.uacct.Load(), uq}} {
		if x.a == nil || x.q == nil || x.q.ConsumeBytesPerSec == 0 {
			continue
		}
		x.a.mu.Lock()
		x.a.consume.refill(x.q.ConsumeBytesPerSec, now)
		if t := int64(x.a.consume.tokens); t < room {
			room = t
		}
		x.a.mu.Unlock()
	}
	return room
}
