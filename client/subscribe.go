package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// SubscriptionMode says how a consumer group shares a topic among its
// members.
type SubscriptionMode int

const (
	// Clustering assigns partitions to members; each message goes to one
	// member, in partition order.
	Clustering SubscriptionMode = iota
	// Broadcast gives every message to every member.
	Broadcast
	// Shared lets any member take any message, with per-message acks.
	Shared
	// KeyShared is Shared, but one key goes to one member at a time.
	KeyShared
)

func (m SubscriptionMode) String() string {
	switch m {
	case Clustering:
		return "clustering"
	case Broadcast:
		return "broadcast"
	case Shared:
		return "shared"
	case KeyShared:
		return "key-shared"
	}
	return fmt.Sprintf("SubscriptionMode(%d)", int(m))
}

func (m SubscriptionMode) wire() heraldpb.SubscriptionMode {
	switch m {
	case Broadcast:
		return heraldpb.SubscriptionMode_MODE_BROADCAST
	case Shared:
		return heraldpb.SubscriptionMode_MODE_SHARED
	case KeyShared:
		return heraldpb.SubscriptionMode_MODE_KEY_SHARED
	}
	return heraldpb.SubscriptionMode_MODE_CLUSTERING
}

// Subscription defaults and limits.
const (
	// DefaultWindow is the credit window of a subscription: how many
	// messages the broker may have pushed and the handlers not yet finished.
	DefaultWindow = 256
	// MaxWindow is the largest Window accepted.
	MaxWindow = 1 << 16
	// DefaultAckLinger is how long acks wait for more acks to share their
	// AckRequest.
	DefaultAckLinger = time.Millisecond
	// AckBatch is the most acks one AckRequest carries; a batch that
	// reaches it is sent without waiting for the linger.
	AckBatch = 256
	// keepAliveMax is the longest a subscription waits between empty
	// AckRequests, which keep its connection inside the broker's idle
	// timeout (a third of it, when Hello says it is shorter).
	keepAliveMax = 30 * time.Second
	// ackUnitsInFlight is how many ack flushes a subscription pipelines.
	ackUnitsInFlight = 16
	// ackRetries bounds the retries of an ack request failing with a
	// retriable broker error (THROTTLED, STORAGE_ERROR, ...).
	ackRetries = 5
)

// SubscribeOptions configures Client.Subscribe. Zero fields take the
// defaults given.
type SubscribeOptions struct {
	// Group is the consumer group (required).
	Group string
	// Topic is the topic to consume (required).
	Topic string
	// Mode is how the group shares the topic; default Clustering.
	Mode SubscriptionMode
	// Tags filters on the broker by tag ("tagA || tagB", "*" for all).
	Tags string
	// SQL filters on the broker with a SQL-92 expression over headers
	// ("region = 'eu' AND price > 10"). At most one of Tags and SQL.
	SQL string
	// AutoAck makes the broker count a message as done when it pushes it:
	// at-most-once. Ack and Nack are then no-ops.
	AutoAck bool
	// Orderly asks for at most one message in flight per partition (per key
	// in KeyShared mode). Acks are then sent without linger.
	Orderly bool
	// AckTimeout is how long the broker waits for an ack before it
	// redelivers; 0 = the broker's default (30s).
	AckTimeout time.Duration
	// RetryPolicy says when the broker redelivers a message whose delivery
	// failed (Fail, or no ack within AckTimeout) and after how many
	// deliveries it dead-letters it instead: "1s,5s,30s max-deliveries=5"
	// or "exponential initial=100ms factor=2 cap=10m jitter=0.2
	// max-deliveries=16". Empty = the broker's --retry-policy.
	// A policy that does not parse is refused with INVALID_REQUEST; all
	// live members of a group must use the same (GROUP_CONFLICT).
	RetryPolicy string
	// DeadLetterTopic is where messages go after their last allowed
	// delivery fails; empty = "<Group>.dlq". The broker creates it (one
	// partition) on its first dead letter. It may not be Topic.
	DeadLetterTopic string
	// DeadLetterExpired sends messages whose TTL ran out to the dead-letter
	// topic (reason "expired") instead of dropping them.
	DeadLetterExpired bool
	// AssignOnly makes the member take part in the group's partition
	// assignment (Clustering mode only) without being pushed anything: it
	// grants no credits, and the handler may be nil. The member reads the
	// partitions Assigned gives it itself (NewPartitionConsumer) and
	// records its progress with Commit, as a Kafka consumer does.
	// GroupTransform is built on it.
	AssignOnly bool
	// Window is the credit window: the most messages pushed to this
	// subscription and not yet finished by a handler (default
	// DefaultWindow, at most MaxWindow). The client buffers at most Window
	// messages.
	Window int
	// From is where a group without stored progress starts; the zero value
	// means Latest. Ignored once the group has progress (see ResetGroup).
	From StartPosition
	// Responder makes this member answer Requests sent to the topic too
	// (see Respond).
	Responder bool
	// Name is shown by DescribeGroup. In Broadcast mode it also keys the
	// member's own position, so a member that comes back under the same
	// name resumes where it stopped (and two live members may not share
	// it); the default there is "<client id>@<host name>". In the other
	// modes the default is the broker's name for the connection.
	Name string
	// Concurrency is the number of handler goroutines (default 1). In
	// Clustering and Broadcast mode, and with Orderly, messages of one
	// partition always go to the same goroutine, so each partition is
	// handled in order; in KeyShared mode messages of one key do. In Shared
	// mode without Orderly any goroutine takes any message.
	Concurrency int
	// AckLinger is how long an ack waits for others to share its request
	// (default DefaultAckLinger; negative = none).
	AckLinger time.Duration
	// RetryBackoffMin and RetryBackoffMax bound the exponential backoff
	// between attempts to subscribe again after the connection is lost
	// (defaults DefaultRetryBackoffMin and DefaultRetryBackoffMax, as for
	// the producer). A THROTTLED retry-after is honoured when longer.
	RetryBackoffMin, RetryBackoffMax time.Duration
	// OnError, if set, is told about every failure the subscription meets
	// in the background after Subscribe returned: a lost connection or
	// session, a failed attempt to subscribe again (non-retryable ones such
	// as GROUP_CONFLICT too; the subscription keeps trying until Close),
	// acks the broker refused. It may be called from several goroutines at
	// once and must not block for long. It is not called once Close has
	// returned.
	OnError func(error)
}

// Validate reports every problem of o at once, or nil.
func (o *SubscribeOptions) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.Group == "" {
		bad("herald: subscribe: Group is required")
	}
	if o.Topic == "" {
		bad("herald: subscribe: Topic is required")
	}
	if o.Mode < Clustering || o.Mode > KeyShared {
		bad("herald: subscribe: unknown Mode %d", int(o.Mode))
	}
	if o.Tags != "" && o.SQL != "" {
		bad("herald: subscribe: set Tags or SQL, not both")
	}
	if o.DeadLetterTopic != "" && o.DeadLetterTopic == o.Topic {
		bad("herald: subscribe: DeadLetterTopic is the subscription's own topic")
	}
	if o.AckTimeout < 0 || o.AckTimeout/time.Millisecond > 1<<32-1 {
		bad("herald: subscribe: AckTimeout %s out of range", o.AckTimeout)
	}
	if o.AssignOnly && o.Mode != Clustering {
		bad("herald: subscribe: AssignOnly needs Clustering mode")
	}
	if o.Window < 0 || o.Window > MaxWindow {
		bad("herald: subscribe: Window %d outside 0..%d", o.Window, MaxWindow)
	}
	if o.Concurrency < 0 || o.Concurrency > MaxWindow {
		bad("herald: subscribe: Concurrency %d outside 0..%d", o.Concurrency, MaxWindow)
	}
	if o.RetryBackoffMin < 0 || o.RetryBackoffMax < 0 {
		bad("herald: subscribe: negative retry backoff")
	}
	return errors.Join(errs...)
}

func (o *SubscribeOptions) setDefaults() {
	if o.Window == 0 {
		o.Window = DefaultWindow
	}
	if o.Concurrency == 0 {
		o.Concurrency = 1
	}
	if o.AckLinger == 0 {
		o.AckLinger = DefaultAckLinger
	}
	if o.RetryBackoffMin == 0 {
		o.RetryBackoffMin = DefaultRetryBackoffMin
	}
	if o.RetryBackoffMax < o.RetryBackoffMin {
		o.RetryBackoffMax = max(DefaultRetryBackoffMax, o.RetryBackoffMin)
	}
	if o.From.IsZero() {
		o.From = Latest()
	}
}

// wire converts a start position; nil for the zero StartPosition.
func (s StartPosition) wire() *heraldpb.StartPosition {
	switch s.kind {
	case startEarliest:
		return &heraldpb.StartPosition{At: &heraldpb.StartPosition_Earliest{Earliest: true}}
	case startLatest:
		return &heraldpb.StartPosition{At: &heraldpb.StartPosition_Latest{Latest: true}}
	case startOffset:
		return &heraldpb.StartPosition{At: &heraldpb.StartPosition_Offset{Offset: s.offset}}
	case startTime:
		return &heraldpb.StartPosition{At: &heraldpb.StartPosition_TimestampMs{TimestampMs: s.time.UnixMilli()}}
	}
	return nil
}

// Handler handles one pushed message. If it returns without calling Ack or
// Nack, the message is acked (not in AutoAck mode, where the broker already
// counted it as done). A message is finished when its handler returns: its
// credit then goes back to the broker, and an Ack or Nack after that is
// ignored. ctx is cancelled when the Client closes or Subscription.Close
// gives up waiting for handlers.
type Handler func(ctx context.Context, m *Delivered)

// Delivered is one message pushed to a subscription.
type Delivered struct {
	// Message is the record: Topic, Partition, Offset, Key, Value, Headers,
	// Tags and Timestamp (the append time when the producer set none). The
	// byte slices may alias the buffer of the pushed frame, which the client
	// never reuses or modifies: the handler may keep them (keeping one
	// keeps that frame's buffer, shared by its messages, in memory). They
	// are capped, so appending to one never overwrites another.
	Message
	// DeliveryCount is 1 on first delivery, more on redelivery.
	DeliveryCount int
	// ReplyInbox and CorrelationID are set on a Request (request-reply)
	// delivered to a responder; such a message has Partition and Offset -1
	// and is not acked: answer it with Client.Reply.
	ReplyInbox    string
	CorrelationID uint64

	sub   *Subscription
	sess  *subSession
	state atomic.Uint32 // settleOpen, settleAcked, settleNacked
}

const (
	settleOpen uint32 = iota
	settleAcked
	settleNacked
	settleDone // skipped: its session ended
)

// IsRequest reports whether m is a Request to be answered with Reply.
func (m *Delivered) IsRequest() bool { return m.ReplyInbox != "" }

// Ack marks the message done. The ack is batched with others (see
// SubscribeOptions.AckLinger); Subscription.Flush waits until the broker
// has made it durable. Only the first Ack or Nack of a message counts, and
// only before its handler returns.
func (m *Delivered) Ack() {
	if m.sub != nil && m.state.CompareAndSwap(settleOpen, settleAcked) {
		m.sub.settle(m, false, 0, "")
	}
}

// Nack gives the message back for redelivery no earlier than delay from
// now, preferably to another member. It counts as a delivery towards the
// retry policy's max-deliveries, after which the message is dead-lettered.
func (m *Delivered) Nack(delay time.Duration) {
	if m.sub != nil && m.state.CompareAndSwap(settleOpen, settleNacked) {
		m.sub.settle(m, true, max(delay, 0), "")
	}
}

// Fail gives the message back for redelivery when the subscription's retry
// policy says (SubscribeOptions.RetryPolicy), or dead-letters it once it
// has been delivered max-deliveries times; reason travels with it (a dead
// letter carries the last one in its herald-dlq-reason header).
func (m *Delivered) Fail(reason string) {
	if m.sub != nil && m.state.CompareAndSwap(settleOpen, settleNacked) {
		m.sub.settle(m, true, -1, reason)
	}
}

// SubscriptionStats are a subscription's counters since Subscribe.
type SubscriptionStats struct {
	Delivered   uint64 // messages handed to the handlers
	Redelivered uint64 // of those, with DeliveryCount > 1
	Acked       uint64 // acks the broker confirmed (durable)
	Nacked      uint64 // nacks the broker confirmed
	InFlight    int    // messages received and not yet finished by a handler
	// Dropped counts pushed messages not handled: past the credit window
	// (a broker bug), for a session that has ended, or while closing. The
	// broker redelivers them.
	Dropped uint64
	// Lost counts acks and nacks that will never be confirmed: their
	// session ended before, or the broker refused them. Their messages are
	// redelivered.
	Lost uint64
	// Resubscribes counts sessions started again after a lost one.
	Resubscribes uint64
}

// Subscription is one membership of a consumer group, pushed to by the
// broker over one connection and re-established on another when that
// connection dies. Create it with Client.Subscribe; end it with Close.
//
// Flow control: the subscription grants Window credits when it subscribes
// and one credit back per finished message, piggybacked on its next
// AckRequest (a request with credits only when there is nothing to ack),
// so the broker never has more than Window messages outstanding to it and
// the client never buffers more.
type Subscription struct {
	c       *Client
	opts    SubscribeOptions
	h       Handler
	queues  []chan *Delivered
	urgentN int // acks queued that make a flush urgent

	ctx       context.Context // handlers'; cancelled when everything stops
	cancel    context.CancelFunc
	runCtx    context.Context // resubscribing; cancelled at Close
	runCancel context.CancelFunc
	closing   chan struct{} // closed by Close: handle nothing more
	runDone   chan struct{} // closed when the session loop exits
	ackStop   chan struct{} // closed by Close after the final flush
	ackDone   chan struct{} // closed when the ack loop exits
	ackWake   chan struct{} // capacity 1: something to send after the linger
	ackUrgent chan struct{} // capacity 1: something to send now
	unitSlots chan struct{} // ack flushes in flight
	workers   sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
	closed    chan struct{}
	quiet     atomic.Bool // set when Close returns: OnError is not called any more

	mu        sync.Mutex
	cur       *subSession // nil while resubscribing
	isClosing bool
	held      int    // messages received and not finished
	credits   uint32 // finished since the last grant
	acks      []ackEntry
	nacks     []ackEntry
	seqQueued uint64    // acks and nacks queued, ever (the last one's seq)
	since     time.Time // when the oldest unsent ack, nack or credit queued
	units     []*ackUnit
	flushing  int           // Flush calls waiting: no linger
	progress  chan struct{} // closed and replaced when acks resolve
	assigned  map[int32]struct{}
	stats     SubscriptionStats
	lost      lostAcks // acks and nacks lost, by sequence number, for Flush
}

type ackEntry struct {
	seq       uint64
	partition uint32
	offset    int64
	delayMs   int64 // -1: the subscription's retry policy decides
	reason    string
}

// subSession is one SubscribeRequest's life on one connection. Its fields
// other than sub, cn and ended are guarded by sub.mu.
type subSession struct {
	sub    *Subscription
	cn     *conn
	id     uint64
	member string
	state  int
	ended  chan struct{} // closed when the broker no longer knows it
	endMu  sync.Once
}

const (
	sessWaiting   = iota // SubscribeRequest sent
	sessActive           // SubscribeResponse received: id is set
	sessAbandoned        // the caller gave up before the response
)

func (ss *subSession) end() { ss.endMu.Do(func() { close(ss.ended) }) }

// ackUnit is one flush: acks, nacks and credits, in one or more requests.
// lo is the lowest sequence number of its acks and nacks (MaxUint64 when
// it has none).
type ackUnit struct {
	sess *subSession
	lo   uint64
	reqs []ackReq
}

type ackReq struct {
	frame       *heraldpb.Frame
	acks, nacks int
	seqs        []uint64 // of its acks and nacks, lost together when it fails
}

// Subscribe joins opts.Group and calls h for every message the broker
// pushes, from opts.Concurrency goroutines. It returns once the broker
// accepted the subscription; retryable failures (a lost connection,
// THROTTLED) are retried with backoff until ctx ends, and the others
// (INVALID_FILTER, GROUP_CONFLICT, TOPIC_NOT_FOUND, ...) are returned.
//
// Afterwards the subscription lives until Close, independent of ctx: when
// its connection dies it subscribes again on a new one, with backoff.
// Messages that were buffered or being handled then are not acked (the
// broker redelivers them); acks of them are dropped and counted as Lost.
func (c *Client) Subscribe(ctx context.Context, opts SubscribeOptions, h Handler) (*Subscription, error) {
	if h == nil && opts.AssignOnly {
		h = func(context.Context, *Delivered) {} // never pushed to
	}
	if h == nil {
		return nil, errors.New("herald: subscribe: nil handler")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	s := &Subscription{
		c:         c,
		opts:      opts,
		h:         h,
		closing:   make(chan struct{}),
		runDone:   make(chan struct{}),
		ackStop:   make(chan struct{}),
		ackDone:   make(chan struct{}),
		ackWake:   make(chan struct{}, 1),
		ackUrgent: make(chan struct{}, 1),
		unitSlots: make(chan struct{}, ackUnitsInFlight),
		closed:    make(chan struct{}),
		progress:  make(chan struct{}),
		urgentN:   AckBatch,
	}
	if opts.Orderly || opts.AckLinger < 0 {
		s.urgentN = 1
	}
	ordered := opts.Orderly || opts.Mode != Shared
	nq := 1
	if ordered {
		nq = opts.Concurrency
	}
	s.queues = make([]chan *Delivered, nq)
	for i := range s.queues {
		s.queues[i] = make(chan *Delivered, opts.Window)
	}
	s.ctx, s.cancel = context.WithCancel(c.ctx)
	s.runCtx, s.runCancel = context.WithCancel(s.ctx)
	for i := 0; i < opts.Concurrency; i++ {
		s.workers.Add(1)
		go s.worker(s.queues[i%nq])
	}
	go s.ackLoop()

	backoff := opts.RetryBackoffMin
	for {
		ss, err := s.subscribeOnce(ctx)
		if err == nil {
			go s.run(ss)
			return s, nil
		}
		if !IsRetryable(err) || ctx.Err() != nil {
			s.stop()
			close(s.runDone)
			return nil, err
		}
		if werr := s.sleep(ctx, max(backoff, retryAfter(err))); werr != nil {
			s.stop()
			close(s.runDone)
			return nil, err
		}
		backoff = min(2*backoff, opts.RetryBackoffMax)
	}
}

// sleep waits d or until ctx ends.
func (s *Subscription) sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stop ends the workers and the ack loop without any goodbye to the broker.
func (s *Subscription) stop() {
	s.mu.Lock()
	if !s.isClosing {
		s.isClosing = true
		close(s.closing)
	}
	s.mu.Unlock()
	s.cancel()
}

func (s *Subscription) subscribeRequest(credits int) *heraldpb.Frame {
	o := &s.opts
	req := &heraldpb.SubscribeRequest{
		Group:        o.Group,
		Topic:        o.Topic,
		Mode:         o.Mode.wire(),
		AutoAck:      o.AutoAck,
		Orderly:      o.Orderly,
		AckTimeoutMs: uint32(o.AckTimeout / time.Millisecond),
		Credits:      uint32(credits),
		Start:        o.From.wire(),
		Responder:    o.Responder,
		MemberName:   o.Name,

		RetryPolicy:       o.RetryPolicy,
		DeadLetterTopic:   o.DeadLetterTopic,
		DeadLetterExpired: o.DeadLetterExpired,
	}
	if req.MemberName == "" && o.Mode == Broadcast {
		host, _ := os.Hostname()
		req.MemberName = s.c.cfg.clientID + "@" + host
	}
	switch {
	case o.Tags != "":
		req.FilterType, req.Filter = heraldpb.FilterType_FILTER_TAG, o.Tags
	case o.SQL != "":
		req.FilterType, req.Filter = heraldpb.FilterType_FILTER_SQL, o.SQL
	}
	return &heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: req}}
}

// subscribeOnce starts a session on the group coordinator's connection
// (any connection on a single node), following NOT_COORDINATOR. It grants the credits
// the window has free (Window minus messages still held from an earlier
// session) and makes the session current before sending, so pushes that
// follow the response at once are taken.
func (s *Subscription) subscribeOnce(ctx context.Context) (*subSession, error) {
	for hop := 0; ; hop++ {
		cn, err := s.c.coordConn(ctx, &s.c.groups)
		if err != nil {
			return nil, err
		}
		ss, err := s.subscribeOn(ctx, cn)
		if s.c.follow(ctx, &s.c.groups, err, hop) {
			continue
		}
		return ss, err
	}
}

// subscribeOn starts a session on connection cn.
func (s *Subscription) subscribeOn(ctx context.Context, cn *conn) (*subSession, error) {
	ss := &subSession{sub: s, cn: cn, ended: make(chan struct{})}
	s.mu.Lock()
	if s.isClosing {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	s.cur = ss
	s.credits = 0 // finished messages are free window below
	credits := max(s.opts.Window-s.held, 0)
	if s.opts.AssignOnly {
		credits = 0
	}
	s.mu.Unlock()

	hook := func(f *heraldpb.Frame) {
		r := f.GetSubscribeResponse()
		if r == nil {
			return
		}
		s.mu.Lock()
		abandoned := ss.state == sessAbandoned
		if !abandoned {
			ss.id, ss.member, ss.state = r.GetSubscriptionId(), r.GetMemberId(), sessActive
		}
		s.mu.Unlock()
		if abandoned {
			go s.unsubscribe(cn, r.GetSubscriptionId())
			return
		}
		cn.addSession(r.GetSubscriptionId(), ss)
	}
	f, err := cn.roundTripHook(ctx, s.subscribeRequest(credits), s.c.cfg.requestTimeout, hook)
	if err == nil && f.GetSubscribeResponse() == nil {
		err = unexpected(f, "SubscribeResponse")
	}
	if err != nil {
		s.mu.Lock()
		active := ss.state == sessActive
		if !active {
			ss.state = sessAbandoned
		}
		if s.cur == ss {
			s.cur = nil
		}
		s.mu.Unlock()
		if active {
			cn.removeSession(ss.id, ss)
			go s.unsubscribe(cn, ss.id)
		}
		return nil, err
	}
	s.wakeAcks(false) // credits of messages finished meanwhile
	return ss, nil
}

// unsubscribe ends a session the subscription does not use, best effort.
func (s *Subscription) unsubscribe(cn *conn, id uint64) {
	ctx, cancel := s.requestCtx()
	defer cancel()
	_, _ = cn.roundTrip(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_Unsubscribe{Unsubscribe: &heraldpb.UnsubscribeRequest{SubscriptionId: id}}}, s.c.cfg.requestTimeout)
}

func (s *Subscription) requestCtx() (context.Context, context.CancelFunc) {
	if t := s.c.cfg.requestTimeout; t > 0 {
		return context.WithTimeout(s.c.ctx, t)
	}
	return context.WithCancel(s.c.ctx)
}

func (s *Subscription) report(err error) {
	if s.opts.OnError != nil && err != nil && !s.quiet.Load() {
		s.opts.OnError(err)
	}
}

// run watches the current session and, when it ends, subscribes again
// until Close or the client's Close.
func (s *Subscription) run(ss *subSession) {
	defer close(s.runDone)
	keep := time.NewTicker(keepAlive(ss.cn.idleTimeout))
	defer keep.Stop()
	for {
		select {
		case <-keep.C:
			// An idle subscription still talks to the broker, so that the
			// broker's idle timeout (--idle-timeout, 5 min by default) does
			// not close its connection and end its membership: an AckRequest
			// with nothing in it is answered at once.
			cur := ss
			keep.Reset(keepAlive(cur.cn.idleTimeout))
			go func() {
				_ = s.sendAck(cur, &heraldpb.Frame{Body: &heraldpb.Frame_Ack{Ack: &heraldpb.AckRequest{SubscriptionId: cur.id}}})
			}()
			continue
		case <-ss.cn.dead:
			s.endSession(ss)
			s.report(fmt.Errorf("herald: subscription %s/%s: %w", s.opts.Group, s.opts.Topic, ss.cn.deadErr()))
		case <-ss.ended:
			s.endSession(ss)
			s.report(fmt.Errorf("herald: subscription %s/%s ended by the broker", s.opts.Group, s.opts.Topic))
		case <-s.runCtx.Done():
			return
		}
		backoff := s.opts.RetryBackoffMin
		for {
			if s.runCtx.Err() != nil {
				return
			}
			next, err := s.subscribeOnce(s.runCtx)
			if err == nil {
				ss = next
				s.mu.Lock()
				s.stats.Resubscribes++
				s.mu.Unlock()
				break
			}
			if s.runCtx.Err() != nil || errors.Is(err, ErrClosed) {
				return
			}
			s.report(fmt.Errorf("herald: subscribing %s/%s again: %w", s.opts.Group, s.opts.Topic, err))
			if s.sleep(s.runCtx, max(backoff, retryAfter(err))) != nil {
				return
			}
			backoff = min(2*backoff, s.opts.RetryBackoffMax)
		}
	}
}

// keepAlive is the keep-alive interval under a broker idle timeout.
func keepAlive(idle time.Duration) time.Duration {
	if idle > 0 {
		return max(min(keepAliveMax, idle/3), 10*time.Millisecond)
	}
	return keepAliveMax
}

// endSession forgets a dead session: its queued acks are dropped (Lost),
// its pending credits are void (the next session is granted the free
// window), and its buffered messages are skipped by the workers.
func (s *Subscription) endSession(ss *subSession) {
	s.mu.Lock()
	if s.cur == ss {
		s.cur = nil
		for _, q := range [][]ackEntry{s.acks, s.nacks} {
			for _, e := range q {
				s.loseLocked(e.seq)
			}
		}
		s.acks, s.nacks = s.acks[:0], s.nacks[:0]
		s.credits = 0
		s.assigned = nil
		s.progressLocked()
	}
	s.mu.Unlock()
	ss.cn.removeSession(ss.id, ss)
}

func (s *Subscription) progressLocked() {
	close(s.progress)
	s.progress = make(chan struct{})
}

// deliver takes messages pushed to session ss, decoded into slab by
// decodeDelivery or deliveredFromProto; it sets their Topic and owner. It
// runs on the connection's reader goroutine and never blocks: a message
// past the credit window (the broker granted fewer) is dropped, counted and
// logged.
func (s *Subscription) deliver(ss *subSession, slab []Delivered) {
	if len(slab) == 0 {
		return
	}
	for i := range slab {
		d := &slab[i]
		d.sub, d.sess = s, ss
		d.Topic = s.opts.Topic
	}
	var over, stale int
	s.mu.Lock()
	if ss != s.cur || s.isClosing {
		stale = len(slab)
		slab = nil
	}
	for i := range slab {
		d := &slab[i]
		if s.held >= s.opts.Window {
			over++
			continue
		}
		select {
		case s.route(d) <- d:
			s.held++
			s.stats.Delivered++
			if d.DeliveryCount > 1 {
				s.stats.Redelivered++
			}
		default: // cannot happen while held <= Window
			over++
		}
	}
	s.stats.Dropped += uint64(over + stale)
	s.mu.Unlock()
	if over > 0 {
		s.c.cfg.logger.Warn("herald: broker pushed past the credit window; messages dropped (they will be redelivered)",
			"group", s.opts.Group, "topic", s.opts.Topic, "dropped", over, "window", s.opts.Window)
	}
}

// deliveredFromProto converts pushed messages that proto.Unmarshal decoded
// (a Delivery frame in a shape decodeDelivery does not take, see
// deliveryBody); decodeDelivery gives the same values. A record without
// timestamp takes the append time. Topic and owner are left to deliver.
func deliveredFromProto(msgs []*heraldpb.DeliveredMessage) []Delivered {
	if len(msgs) == 0 {
		return nil
	}
	slab := make([]Delivered, len(msgs))
	for i, dm := range msgs {
		d := &slab[i]
		d.Partition = int32(dm.GetPartition())
		d.Offset = dm.GetOffset()
		d.DeliveryCount = int(dm.GetDeliveryCount())
		d.ReplyInbox = dm.GetReplyInbox()
		d.CorrelationID = dm.GetCorrelationId()
		if d.ReplyInbox != "" {
			d.Partition, d.Offset = -1, -1
		}
		recordToMessage(&d.Message, dm.GetRecord(), dm.GetAppendTimeMs())
	}
	return slab
}

// recordToMessage sets m's record fields from r. The byte slices and tags
// are r's (proto decoding already copied them out of the frame).
func recordToMessage(m *Message, r *heraldpb.Record, appendMs int64) {
	m.Key = capped(r.GetKey())
	m.Value = capped(r.GetValue())
	if hs := r.GetHeaders(); len(hs) > 0 {
		m.Headers = make([]Header, len(hs))
		for i, h := range hs {
			m.Headers[i] = Header{Key: h.GetKey(), Value: capped(h.GetValue())}
		}
	}
	if tags := r.GetTags(); len(tags) > 0 {
		m.Tags = tags[:len(tags):len(tags)]
	}
	ts := r.GetTimestampMs()
	if ts == 0 {
		ts = appendMs
	}
	if ts != 0 {
		m.Timestamp = time.UnixMilli(ts)
	}
}

// route picks the worker queue of d: by partition (by key in KeyShared
// mode, by correlation id for requests) when order matters.
func (s *Subscription) route(d *Delivered) chan *Delivered {
	n := len(s.queues)
	if n == 1 {
		return s.queues[0]
	}
	var h uint32
	switch {
	case d.ReplyInbox != "":
		h = uint32(d.CorrelationID)
	case s.opts.Mode == KeyShared:
		h = heraldpb.PartitionForKey(d.Key, uint32(n))
	default:
		h = uint32(d.Partition)
	}
	return s.queues[h%uint32(n)]
}

// assign applies an AssignmentChange of session ss: revocations first,
// then additions.
func (s *Subscription) assign(ss *subSession, added, revoked []uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss != s.cur {
		return
	}
	if s.assigned == nil {
		s.assigned = make(map[int32]struct{})
	}
	for _, p := range revoked {
		delete(s.assigned, int32(p))
	}
	for _, p := range added {
		s.assigned[int32(p)] = struct{}{}
	}
}

// Assigned returns the partitions the broker assigned to this member
// (Clustering mode), sorted; empty while resubscribing.
func (s *Subscription) Assigned() []int32 {
	s.mu.Lock()
	out := make([]int32, 0, len(s.assigned))
	for p := range s.assigned {
		out = append(out, p)
	}
	s.mu.Unlock()
	slices.Sort(out)
	return out
}

// Stats returns the subscription's counters.
func (s *Subscription) Stats() SubscriptionStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.InFlight = s.held
	return st
}

func (s *Subscription) worker(q chan *Delivered) {
	defer s.workers.Done()
	for {
		select {
		case d := <-q:
			s.handle(d)
		case <-s.closing:
			return
		case <-s.ctx.Done():
			return
		}
	}
}

// handle runs the handler on d unless d's session has ended or the
// subscription is closing, acks d if the handler left it open, and returns
// d's credit.
func (s *Subscription) handle(d *Delivered) {
	s.mu.Lock()
	live := d.sess == s.cur && !s.isClosing
	s.mu.Unlock()
	if live {
		s.h(s.ctx, d)
	}
	// A handler that left d open acks it: queued here, in the one locked
	// section that also returns d's credit (an explicit Ack or Nack
	// queued itself already).
	ack := live && d.state.CompareAndSwap(settleOpen, settleAcked)
	d.state.CompareAndSwap(settleOpen, settleDone) // later Acks and Nacks are no-ops
	s.mu.Lock()
	urgent := false
	if ack {
		urgent = s.queueSettleLocked(d, false, 0, "")
	}
	s.held--
	if !s.isClosing {
		s.markPendingLocked()
		s.credits++
	}
	urgent = urgent || s.credits >= uint32(max(s.opts.Window/2, 1))
	s.mu.Unlock()
	s.wakeAcks(urgent)
}

func (s *Subscription) pendingLocked() bool {
	return len(s.acks) > 0 || len(s.nacks) > 0 || s.credits > 0
}

// markPendingLocked starts the linger when the queue was empty.
func (s *Subscription) markPendingLocked() {
	if !s.pendingLocked() {
		s.since = time.Now()
	}
}

// settle queues an ack or nack of d for the next flush.
// A negative delay leaves it to the retry policy.
func (s *Subscription) settle(d *Delivered, nack bool, delay time.Duration, reason string) {
	s.mu.Lock()
	urgent := s.queueSettleLocked(d, nack, delay, reason)
	s.mu.Unlock()
	s.wakeAcks(urgent)
}

// queueSettleLocked queues d's ack or nack for the broker and reports
// whether enough are queued to send at once. s.mu is held.
func (s *Subscription) queueSettleLocked(d *Delivered, nack bool, delay time.Duration, reason string) bool {
	if s.opts.AutoAck || d.IsRequest() {
		return false // done on the broker already; requests are not in the log
	}
	s.seqQueued++
	if d.sess != s.cur {
		s.loseLocked(s.seqQueued) // its session ended: the broker redelivers it
		return false
	}
	e := ackEntry{seq: s.seqQueued, partition: uint32(d.Partition), offset: d.Offset}
	s.markPendingLocked()
	if nack {
		e.delayMs = -1
		if delay >= 0 {
			e.delayMs = int64(min(delay/time.Millisecond, 1<<32-1))
		}
		e.reason = reason
		s.nacks = append(s.nacks, e)
	} else {
		s.acks = append(s.acks, e)
	}
	return len(s.acks)+len(s.nacks) >= s.urgentN
}

func (s *Subscription) wakeAcks(urgent bool) {
	ch := s.ackWake
	if urgent {
		ch = s.ackUrgent
	}
	select {
	case ch <- struct{}{}:
	default:
	}
}

// ackLoop sends queued acks, nacks and credits: once the oldest has waited
// the linger, or at once on Flush, in Orderly mode, or when the credits to
// return reach half the window. When AckBatch acks are queued it sends
// whole batches at once and lets the rest wait for their linger. Up to
// ackUnitsInFlight flushes are in flight; what queues meanwhile goes in the
// next one.
func (s *Subscription) ackLoop() {
	defer close(s.ackDone)
	t := time.NewTimer(time.Hour)
	t.Stop()
	idle := func() bool { // waits for news; false when stopping
		select {
		case <-s.ackWake:
		case <-s.ackUrgent:
		case <-s.ackStop:
			return false
		case <-s.ctx.Done():
			return false
		}
		return true
	}
	for {
		s.mu.Lock()
		pending, since := s.pendingLocked(), s.since
		full, byCount := s.urgentLocked()
		s.mu.Unlock()
		if !pending {
			if !idle() {
				return
			}
			continue
		}
		if !full && !byCount {
			if wait := time.Until(since.Add(s.opts.AckLinger)); wait > 0 {
				t.Reset(wait)
				select {
				case <-t.C:
				case <-s.ackUrgent:
					t.Stop()
					continue
				case <-s.ackStop:
					t.Stop()
					return
				case <-s.ctx.Done():
					t.Stop()
					return
				}
			}
			full = true // the linger is over
		}
		select {
		case s.unitSlots <- struct{}{}:
		case <-s.ackStop:
			return
		case <-s.ctx.Done():
			return
		}
		u := s.takeUnit(full)
		if u == nil { // no active session yet: wait for one
			<-s.unitSlots
			if !idle() {
				return
			}
			continue
		}
		go s.sendUnit(u)
	}
}

// urgentLocked says whether to send now: everything (full: Flush,
// Orderly, no linger, half the window's credits to return), or whole
// batches of acks (byCount).
func (s *Subscription) urgentLocked() (full, byCount bool) {
	n := len(s.acks) + len(s.nacks)
	full = s.flushing > 0 || s.isClosing || (s.urgentN == 1 && n > 0) || s.credits >= uint32(max(s.opts.Window/2, 1))
	return full, n >= s.urgentN
}

// takeUnit takes queued acks, nacks and credits into one flush: all of
// them when full, else whole AckBatches of acks plus the nacks and credits.
// It returns nil when there is nothing to send or no active session to send
// it on.
func (s *Subscription) takeUnit(full bool) *ackUnit {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.cur
	if ss == nil || ss.state != sessActive || !s.pendingLocked() {
		return nil
	}
	// Queued nacks take every queued ack with them: the broker's circuit
	// breaker counts a member's failures in a row, and acks lingering
	// behind later nacks would hide the member's successes from it.
	nAcks := len(s.acks)
	if !full && len(s.nacks) == 0 {
		nAcks -= nAcks % AckBatch
	}
	u := &ackUnit{sess: ss, lo: math.MaxUint64}
	credits := s.credits
	s.credits = 0
	for i := 0; i < nAcks; i += AckBatch {
		chunk := s.acks[i:min(i+AckBatch, nAcks)]
		r := &heraldpb.AckRequest{SubscriptionId: ss.id, Credits: credits,
			Partitions: make([]uint32, len(chunk)), Offsets: make([]int64, len(chunk))}
		seqs := make([]uint64, len(chunk))
		for j, e := range chunk {
			r.Partitions[j], r.Offsets[j] = e.partition, e.offset
			seqs[j] = e.seq
			u.lo = min(u.lo, e.seq)
		}
		u.reqs = append(u.reqs, ackReq{frame: &heraldpb.Frame{Body: &heraldpb.Frame_Ack{Ack: r}}, acks: len(chunk), seqs: seqs})
		credits = 0
	}
	if len(s.nacks) > 0 {
		// One NackRequest per distinct delay and reason.
		slices.SortStableFunc(s.nacks, func(a, b ackEntry) int {
			return cmp.Or(cmp.Compare(a.delayMs, b.delayMs), cmp.Compare(a.reason, b.reason))
		})
		for i := 0; i < len(s.nacks); {
			j := i
			for j < len(s.nacks) && s.nacks[j].delayMs == s.nacks[i].delayMs && s.nacks[j].reason == s.nacks[i].reason && j-i < AckBatch {
				j++
			}
			r := &heraldpb.NackRequest{SubscriptionId: ss.id, Credits: credits, Reason: s.nacks[i].reason,
				Partitions: make([]uint32, j-i), Offsets: make([]int64, j-i)}
			if d := s.nacks[i].delayMs; d >= 0 {
				r.DelayMs = proto.Uint32(uint32(d))
			}
			seqs := make([]uint64, j-i)
			for k, e := range s.nacks[i:j] {
				r.Partitions[k], r.Offsets[k] = e.partition, e.offset
				seqs[k] = e.seq
				u.lo = min(u.lo, e.seq)
			}
			u.reqs = append(u.reqs, ackReq{frame: &heraldpb.Frame{Body: &heraldpb.Frame_Nack{Nack: r}}, nacks: j - i, seqs: seqs})
			credits = 0
			i = j
		}
	}
	if credits > 0 {
		r := &heraldpb.AckRequest{SubscriptionId: ss.id, Credits: credits}
		u.reqs = append(u.reqs, ackReq{frame: &heraldpb.Frame{Body: &heraldpb.Frame_Ack{Ack: r}}})
	}
	if len(u.reqs) == 0 {
		return nil
	}
	s.acks = append(s.acks[:0], s.acks[nAcks:]...)
	s.nacks = s.nacks[:0]
	s.units = append(s.units, u)
	if len(s.acks) > 0 {
		s.since = time.Now() // the rest lingers from now
	}
	return u
}

// doneLocked is the highest sequence number up to which every ack and nack
// has been resolved: confirmed, refused or dropped.
func (s *Subscription) doneLocked() uint64 {
	done := s.seqQueued
	if len(s.acks) > 0 {
		done = min(done, s.acks[0].seq-1)
	}
	for _, e := range s.nacks {
		done = min(done, e.seq-1)
	}
	for _, u := range s.units {
		if u.lo != math.MaxUint64 {
			done = min(done, u.lo-1)
		}
	}
	return done
}

// sendUnit sends one flush's requests in order and records the outcome.
// Credits are never sent twice: a request failing with a retriable error
// (TOO_MANY_IN_FLIGHT, THROTTLED: not applied) is retried as it is by
// sendAck, and one failing otherwise may have granted its credits before
// failing, so they are not granted again. Under-granting costs throughput
// until the next session; over-granting would break the window.
func (s *Subscription) sendUnit(u *ackUnit) {
	defer func() { <-s.unitSlots }()
	var acked, nacked int
	// The requests of a unit are pipelined: an AckResponse waits for the
	// progress write (an fsync), and credits ride on the first request.
	errs := make([]error, len(u.reqs))
	var wg sync.WaitGroup
	for i, r := range u.reqs[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i+1] = s.sendAck(u.sess, r.frame)
		}()
	}
	errs[0] = s.sendAck(u.sess, u.reqs[0].frame)
	wg.Wait()
	var lost []uint64
	for i, r := range u.reqs {
		err := errs[i]
		if err == nil {
			acked += r.acks
			nacked += r.nacks
			continue
		}
		lost = append(lost, r.seqs...)
		if IsCode(err, heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND) {
			u.sess.end()
		}
		if u.sess.cn.alive() {
			s.report(fmt.Errorf("herald: acks of %s/%s refused: %w", s.opts.Group, s.opts.Topic, err))
		}
	}
	s.mu.Lock()
	s.units = slices.DeleteFunc(s.units, func(x *ackUnit) bool { return x == u })
	s.stats.Acked += uint64(acked)
	s.stats.Nacked += uint64(nacked)
	for _, seq := range lost {
		s.loseLocked(seq)
	}
	s.progressLocked()
	s.mu.Unlock()
}

// sendAck sends one ack or nack request, retrying retriable broker errors
// (THROTTLED, STORAGE_ERROR) with backoff while the session is current.
func (s *Subscription) sendAck(ss *subSession, f *heraldpb.Frame) error {
	backoff := s.opts.RetryBackoffMin
	for attempt := 0; ; attempt++ {
		_, err := ss.cn.roundTrip(s.ctx, f, s.c.cfg.requestTimeout)
		var he *Error
		if err == nil || !errors.As(err, &he) || !he.Retriable || attempt >= ackRetries {
			return err
		}
		s.mu.Lock()
		current := s.cur == ss
		s.mu.Unlock()
		if !current || s.sleep(s.ctx, max(backoff, he.RetryAfter)) != nil {
			return err
		}
		backoff = min(2*backoff, s.opts.RetryBackoffMax)
	}
}

// Flush sends every queued ack and nack now and waits until the broker has
// confirmed (made durable) each one queued before the call, or ctx ends.
// It returns nil only when every one of them was confirmed. It fails with
// ErrAcksLost if one of them could not be confirmed (its session ended or
// the broker refused it; those messages are redelivered) and no Flush that
// returned before this call reported it. Acks queued after the call are
// left to a later Flush, even when they are lost while this one waits.
func (s *Subscription) Flush(ctx context.Context) error {
	s.mu.Lock()
	target := s.seqQueued
	since := s.lost.begin()
	s.flushing++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.flushing--
		s.lost.end(since)
		s.mu.Unlock()
	}()
	s.wakeAcks(true)
	for {
		s.mu.Lock()
		if s.doneLocked() >= target {
			lost := s.lost.report(target, since)
			s.mu.Unlock()
			if lost > 0 {
				return fmt.Errorf("%w: %d of %s/%s", ErrAcksLost, lost, s.opts.Group, s.opts.Topic)
			}
			return nil
		}
		ch := s.progress
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.ctx.Done():
			return ErrClosed
		}
	}
}

// activeSession returns the current session if it has been accepted.
func (s *Subscription) activeSession() (*subSession, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.isClosing:
		return nil, ErrClosed
	case s.cur == nil || s.cur.state != sessActive:
		return nil, fmt.Errorf("%w: subscription %s/%s is subscribing again", ErrConnectionLost, s.opts.Group, s.opts.Topic)
	}
	return s.cur, nil
}

// Commit marks every offset of partition below offset as done (Clustering
// mode; the member must own the partition) and returns once the broker has
// made it durable.
func (s *Subscription) Commit(ctx context.Context, partition int32, offset int64) error {
	if partition < 0 {
		return fmt.Errorf("herald: Commit needs a partition, got %d", partition)
	}
	ss, err := s.activeSession()
	if err != nil {
		return err
	}
	f, err := ss.cn.roundTrip(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_Commit{Commit: &heraldpb.CommitRequest{
		SubscriptionId: ss.id, Partition: uint32(partition), Offset: offset}}}, s.c.cfg.requestTimeout)
	if err != nil {
		if IsCode(err, heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND) {
			ss.end()
		}
		return err
	}
	if f.GetCommitResponse() == nil {
		return unexpected(f, "CommitResponse")
	}
	return nil
}

// Close leaves the group: it stops handing out messages (buffered ones are
// not handled), waits for running handlers, flushes their acks, then sends
// UnsubscribeRequest, after which the broker redelivers the unacked
// messages to other members. If ctx ends while handlers still run, their
// context is cancelled, the subscription unsubscribes without waiting for
// them, and Close returns ctx.Err(). It returns ErrAcksLost when acks could
// not be confirmed. Calling Close again returns the first call's result.
func (s *Subscription) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.closeErr = s.close(ctx)
		close(s.closed)
	})
	<-s.closed
	return s.closeErr
}

func (s *Subscription) close(ctx context.Context) error {
	s.mu.Lock()
	if !s.isClosing {
		s.isClosing = true
		close(s.closing)
	}
	s.mu.Unlock()
	s.runCancel()
	<-s.runDone

	var errs []error
	handlers := make(chan struct{})
	go func() {
		s.workers.Wait()
		close(handlers)
	}()
	select {
	case <-handlers:
		if err := s.Flush(ctx); err != nil {
			errs = append(errs, err)
		}
	case <-ctx.Done():
		errs = append(errs, ctx.Err())
		s.cancel() // tell the handlers
	}
	close(s.ackStop)
	<-s.ackDone
	// Wait for flushes still in flight (credits only, or all of them when
	// ctx ended), so none fails after the unsubscribe.
	for range ackUnitsInFlight {
		select {
		case s.unitSlots <- struct{}{}:
		case <-ctx.Done():
		}
	}

	s.mu.Lock()
	ss := s.cur
	s.cur = nil
	active := ss != nil && ss.state == sessActive
	s.mu.Unlock()
	if active && ss.cn.alive() {
		uctx, cancel := ctx, context.CancelFunc(func() {})
		if ctx.Err() != nil {
			uctx, cancel = s.requestCtx()
		}
		_, err := ss.cn.roundTrip(uctx, &heraldpb.Frame{Body: &heraldpb.Frame_Unsubscribe{Unsubscribe: &heraldpb.UnsubscribeRequest{SubscriptionId: ss.id}}}, s.c.cfg.requestTimeout)
		cancel()
		if err != nil && !IsCode(err, heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND) {
			errs = append(errs, err)
		}
		ss.cn.removeSession(ss.id, ss)
	}
	s.quiet.Store(true)
	s.cancel()
	return errors.Join(errs...)
}

// loseLocked counts the ack or nack with sequence number seq as lost: it
// will never be confirmed. s.mu is held.
func (s *Subscription) loseLocked(seq uint64) {
	s.stats.Lost++
	s.lost.add(seq)
}

// maxLostRuns bounds the losses a subscription remembers for Flush. Past
// it (that many losses while no Flush reports them) they are folded into
// one run, which Flush reports conservatively: to every Flush that covers
// any part of it, until one covers all of it.
const maxLostRuns = 4096

// lostAcks remembers lost acks and nacks by sequence number, so that each
// Flush reports the losses among the acks queued before it was called, and
// not those of acks queued later. Flush verdicts are numbered from 1; a
// Flush call is known by how many verdicts were given before it (since).
// A run is forgotten once every Flush still waiting began after the verdict
// that reported it. Guarded by Subscription.mu.
type lostAcks struct {
	runs     []lostRun
	verdicts uint64         // Flush verdicts given so far
	waiting  map[uint64]int // Flush calls waiting, by since
}

// lostRun is n losses with sequence numbers in [lo, hi] (lo == hi unless
// folded), first reported by verdict reported (0: not yet).
type lostRun struct {
	lo, hi, n uint64
	reported  uint64
}

func (l *lostAcks) add(seq uint64) {
	l.runs = append(l.runs, lostRun{lo: seq, hi: seq, n: 1})
	if len(l.runs) <= maxLostRuns {
		return
	}
	l.gc()
	if len(l.runs) <= maxLostRuns {
		return
	}
	f := lostRun{lo: math.MaxUint64}
	all := true
	for _, r := range l.runs {
		f.lo, f.hi, f.n = min(f.lo, r.lo), max(f.hi, r.hi), f.n+r.n
		f.reported = max(f.reported, r.reported)
		all = all && r.reported != 0
	}
	if !all {
		f.reported = 0
	}
	l.runs = append(l.runs[:0], f)
}

// begin registers a Flush call and returns its since.
func (l *lostAcks) begin() uint64 {
	if l.waiting == nil {
		l.waiting = map[uint64]int{}
	}
	l.waiting[l.verdicts]++
	return l.verdicts
}

// end unregisters the Flush call begun with since.
func (l *lostAcks) end(since uint64) {
	if l.waiting[since]--; l.waiting[since] <= 0 {
		delete(l.waiting, since)
	}
	l.gc()
}

// report is the verdict of the Flush call begun with since whose acks are
// those with sequence numbers up to target: how many of them were lost and
// not reported by a verdict given before the call.
func (l *lostAcks) report(target, since uint64) uint64 {
	l.verdicts++
	var n uint64
	for i := range l.runs {
		r := &l.runs[i]
		if r.lo > target || (r.reported != 0 && r.reported <= since) {
			continue
		}
		n += r.n
		if r.reported == 0 && r.hi <= target {
			r.reported = l.verdicts
		}
	}
	return n
}

// gc forgets the runs that no waiting or later Flush can report.
func (l *lostAcks) gc() {
	oldest := uint64(math.MaxUint64)
	for since := range l.waiting {
		oldest = min(oldest, since)
	}
	l.runs = slices.DeleteFunc(l.runs, func(r lostRun) bool { return r.reported != 0 && r.reported <= oldest })
}
