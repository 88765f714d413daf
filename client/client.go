// Package client is Herald's Go SDK: admin calls, a batching producer, pull
// consumers, push consumers in consumer groups (Subscribe), request-reply
// (Request, Respond), half messages (SendHalf) and transactions across
// partitions (NewTransactionalProducer, TransformExactlyOnce) over
// Herald's framed protobuf protocol.
//
// A Client holds one pipelined connection per broker address and is safe for
// concurrent use. Every call takes a context; a call whose context ends
// returns ctx.Err() promptly. Failures reported by the broker are *Error
// values (switch on Code); IsRetryable says which failures are worth
// retrying.
package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// Client is a connection pool to a Herald cluster. Create it with Dial and
// release it with Close.
type Client struct {
	cfg   clientConfig
	addrs []string // bootstrap addresses, in the order given

	publisher publisher // idempotent publishing (exchange.go)

	mu      sync.Mutex
	conns   map[string]*conn // live connection per broker address
	dialing map[string]*dialCall
	meta    map[string]*topicMeta
	brokers map[uint32]string // node id -> address, from Metadata
	// suspect holds the addresses of brokers that recently failed to
	// answer in time (or answered NOT_READY), until when: other brokers
	// are tried first (see markSuspect).
	suspect map[string]time.Time
	closed  bool
	ctx     context.Context // cancelled by Close
	cancel  context.CancelFunc

	corrID atomic.Uint64 // correlation ids of Requests
	// groups and txn are the nodes coordinating consumer groups and
	// transactions (coordinator.go).
	groups, txn coordinator
	// checkers are the transaction checkers registered, by producer group
	// (txncheck.go).
	checkers map[string]*txnChecker
}

type dialCall struct {
	done chan struct{}
	c    *conn
	err  error
}

type topicMeta struct {
	info    *heraldpb.TopicInfo
	fetched time.Time
}

// Dial connects to the first reachable broker of addrs, a comma-separated
// list of host:port, and performs Hello. Other brokers are dialled when a
// request needs them. A connection that breaks is redialled on its next use.
func Dial(ctx context.Context, addrs string, opts ...Option) (*Client, error) {
	cfg := defaultClientConfig()
	for _, o := range opts {
		o.applyClient(&cfg)
	}
	var list []string
	for _, a := range strings.Split(addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			list = append(list, a)
		}
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("herald: no broker address given")
	}
	if l := cfg.login; l != nil && l.err != nil {
		return nil, l.err
	}
	c := &Client{
		cfg:     cfg,
		addrs:   list,
		conns:   make(map[string]*conn),
		dialing: make(map[string]*dialCall),
		meta:    make(map[string]*topicMeta),
		brokers: make(map[uint32]string),
		suspect: make(map[string]time.Time),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if _, err := c.anyConn(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Close closes every connection. Outstanding requests fail with ErrClosed.
// Producers and consumers of the client stop working; close them first.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.cancel()
	conns := c.conns
	c.conns = map[string]*conn{}
	c.mu.Unlock()
	for _, cn := range conns {
		cn.close()
	}
	return nil
}

// connTo returns the live connection to addr, dialling it if needed. Only
// one dial per address runs at a time; concurrent callers share it.
func (c *Client) connTo(ctx context.Context, addr string) (*conn, error) {
	return c.connWithin(ctx, addr, 0)
}

// errDialSlow: a dial had not finished within the wait its caller gave
// it (it goes on in the background).
var errDialSlow = errors.New("herald: the broker has not answered the connection's Hello yet")

// connWithin is connTo that, with wait > 0, waits at most that long for a
// new connection's dial and then gives up with errDialSlow, marking the
// broker suspect (a frozen node's kernel accepts the TCP connection, and
// its Hello is never answered): the caller tries another broker, and the
// dial goes on, its success clearing the mark.
func (c *Client) connWithin(ctx context.Context, addr string, wait time.Duration) (*conn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if cn := c.conns[addr]; cn != nil {
		if cn.alive() {
			c.mu.Unlock()
			return cn, nil
		}
		delete(c.conns, addr)
	}
	dc := c.dialing[addr]
	if dc == nil {
		dc = &dialCall{done: make(chan struct{})}
		c.dialing[addr] = dc
		go c.dial(addr, dc)
	}
	c.mu.Unlock()
	var slow <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		slow = t.C
	}
	select {
	case <-dc.done:
		return dc.c, dc.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-slow:
		c.cfg.logger.Debug("herald: dial slow; trying another broker", "addr", addr, "after", wait)
		c.markSuspect(addr, suspectFor)
		return nil, errDialSlow
	}
}

// dial runs detached from any one caller's context, bounded by the dial
// timeout, so a caller that gives up does not fail the others waiting.
func (c *Client) dial(addr string, dc *dialCall) {
	cn, err := dialConn(c.ctx, addr, &c.cfg)
	c.mu.Lock()
	delete(c.dialing, addr)
	if err == nil {
		if c.closed {
			cn.close()
			cn, err = nil, ErrClosed
		} else {
			c.conns[addr] = cn
			delete(c.suspect, addr) // it answered Hello: not frozen
		}
	}
	c.mu.Unlock()
	if err != nil {
		c.cfg.logger.Debug("herald: dial failed", "addr", addr, "err", err)
		if !errors.Is(err, ErrClosed) {
			var he *Error
			if !errors.As(err, &he) && !errors.Is(err, ErrTLS) {
				err = fmt.Errorf("%w: %v", ErrConnectionLost, err)
			}
		}
	}
	dc.c, dc.err = cn, err
	close(dc.done)
}

// suspectFor is how long a broker that did not answer a request in time
// is tried only after the others.
const suspectFor = 10 * time.Second

// markSuspect has addr tried after the other brokers for d: it did not
// answer in time (a frozen or overloaded node) or is not ready. A
// successful dial of addr clears the mark.
func (c *Client) markSuspect(addr string, d time.Duration) {
	c.mu.Lock()
	c.suspect[addr] = time.Now().Add(d)
	c.mu.Unlock()
}

// suspectLocked reports whether addr is marked suspect. c.mu is held.
func (c *Client) suspectLocked(addr string) bool {
	until, ok := c.suspect[addr]
	if ok && time.Now().After(until) {
		delete(c.suspect, addr)
		return false
	}
	return ok
}

// anyConn returns a live connection to any broker: an existing one if there
// is one, else the first bootstrap address that can be dialled. Brokers
// marked suspect come last.
func (c *Client) anyConn(ctx context.Context) (*conn, error) {
	return c.anyConnExcept(ctx, "")
}

// anyConnExcept is anyConn that never uses the broker at except.
func (c *Client) anyConnExcept(ctx context.Context, except string) (*conn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	// The usual answer, without building the list (a request's path on
	// a single broker): the first address, when it is good and its
	// connection is up, is the one the list below would give.
	if len(c.addrs) > 0 {
		if a := c.addrs[0]; a != except && !c.suspectLocked(a) {
			if cn := c.conns[a]; cn != nil && cn.alive() {
				c.mu.Unlock()
				return cn, nil
			}
		}
	}
	addrs := c.knownAddrsLocked()
	var good, bad []string
	for _, a := range addrs {
		switch {
		case a == except:
		case c.suspectLocked(a):
			bad = append(bad, a)
		default:
			good = append(good, a)
		}
	}
	for _, a := range good {
		if cn := c.conns[a]; cn != nil && cn.alive() {
			c.mu.Unlock()
			return cn, nil
		}
	}
	c.mu.Unlock()
	var errs []error
	cands := append(good, bad...)
	for i, a := range cands {
		wait := time.Duration(0) // the last one: as long as its dial takes
		if i < len(cands)-1 {
			wait = leaderCheck
		}
		cn, err := c.connWithin(ctx, a, wait)
		if err == nil {
			return cn, nil
		}
		if ctx.Err() != nil || errors.Is(err, ErrClosed) {
			return nil, err
		}
		var he *Error
		if errors.As(err, &he) && !he.Retriable || errors.Is(err, ErrTLS) {
			return nil, err // e.g. UNSUPPORTED_VERSION, a bad certificate: another broker will say the same
		}
		errs = append(errs, err)
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return nil, fmt.Errorf("%w: %s", ErrNoBrokers, strings.Join(msgs, "; "))
}

// leaderConn returns the connection to the leader of topic/partition when
// metadata names one on another known broker; with no leader known, to
// one of the partition's replicas (a replica knows its leader and says so
// in NOT_LEADER); else any connection.
func (c *Client) leaderConn(ctx context.Context, topic string, partition int32) (*conn, error) {
	if partition >= 0 {
		c.mu.Lock()
		refetch := c.meta[topic] == nil
		c.mu.Unlock()
		if refetch { // not asked yet, or dropped after NOT_LEADER
			_, _ = c.topicInfo(ctx, topic, false)
		}
		// A replica that does not answer a new connection's Hello within
		// leaderCheck is passed over for the next (anyConn at the end).
		for _, addr := range c.partitionAddrs(topic, partition) {
			if cn, err := c.connWithin(ctx, addr, leaderCheck); err == nil {
				return cn, nil
			}
		}
	}
	return c.anyConn(ctx)
}

// partitionAddrs lists the addresses to try for topic/partition: its
// leader's, then its other replicas'. Empty on a single broker: a single
// node may advertise an address other than the one we bootstrapped from.
func (c *Client) partitionAddrs(topic string, partition int32) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	tm := c.meta[topic]
	if tm == nil || len(c.brokers) <= 1 {
		return nil
	}
	var out []string
	for _, p := range tm.info.GetPartitions() {
		if int32(p.GetId()) != partition {
			continue
		}
		if a := c.brokers[p.GetLeader()]; a != "" {
			out = append(out, a)
		}
		for _, r := range p.GetReplicas() {
			if a := c.brokers[r]; a != "" && r != p.GetLeader() {
				out = append(out, a)
			}
		}
	}
	// Brokers that did not answer in time last: a frozen leader is
	// replaced within about a second, and a replica names the new one.
	slices.SortStableFunc(out, func(a, b string) int {
		sa, sb := c.suspectLocked(a), c.suspectLocked(b)
		switch {
		case sa == sb:
			return 0
		case sb:
			return -1
		}
		return 1
	})
	return out
}

// partitionLeader is the leader of topic/partition in the cached metadata
// (0: unknown).
func (c *Client) partitionLeader(topic string, partition int32) uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if tm := c.meta[topic]; tm != nil {
		for _, p := range tm.info.GetPartitions() {
			if int32(p.GetId()) == partition {
				return p.GetLeader()
			}
		}
	}
	return 0
}

// refreshLeader fetches topic's metadata from a broker other than the one
// at except and returns the partition's leader it names (0: unknown).
func (c *Client) refreshLeader(ctx context.Context, topic string, partition int32, except string) (uint32, error) {
	cn, err := c.anyConnExcept(ctx, except)
	if err != nil {
		return 0, err
	}
	if cn.addr == except {
		return 0, ErrNoBrokers
	}
	if _, err := c.metadataOn(ctx, cn, []string{topic}); err != nil {
		return 0, err
	}
	return c.partitionLeader(topic, partition), nil
}

// leaderMovedFrom asks a broker other than cn's, within leaderCheck, which
// node leads topic/partition. When it names a node other than cn's, it
// marks cn's broker suspect (tried last for a while: it did not answer in
// time) and returns that node; otherwise 0 (no news, or no answer). The
// answer refreshes the cached metadata, so the next leaderConn goes to the
// node named.
func (c *Client) leaderMovedFrom(ctx context.Context, cn *conn, topic string, partition int32) uint32 {
	cctx, cancel := context.WithTimeout(ctx, leaderCheck)
	defer cancel()
	leader, err := c.refreshLeader(cctx, topic, partition, cn.addr)
	if err != nil || leader == 0 || leader == cn.nodeID {
		return 0
	}
	c.markSuspect(cn.addr, suspectFor)
	return leader
}

// readFailovers bounds how many times one idempotent read (callLeader) is
// sent again to another node after its broker did not answer.
const readFailovers = 2

// callLeader sends req, an idempotent read of topic/partition (Fetch,
// ListOffsets), to the partition's leader and waits for the answer,
// bounded by the request timeout plus extra (a long poll's wait).
//
// A leader that is frozen (a stopped process, a stalled disk) does not
// answer, and its followers elect another within about a second. So once
// the answer is extra+leaderCheck late, callLeader asks another broker for
// the partition's leader every leaderCheck (leaderMovedFrom); once that
// names another node, it gives the attempt up and sends req there, the
// silent broker being tried last for a while. A request timeout or a dead
// connection has it ask another broker the same way: the request is sent
// again when that names another leader; otherwise the error is returned
// (after a timeout, with the topic's metadata dropped). At most
// readFailovers times per call. NOT_LEADER naming no leader (a node cut
// off from the others) is handled the same way (unknownLeaderMoved).
// Other errors, NOT_LEADER naming a leader included, are returned as they
// come.
func (c *Client) callLeader(ctx context.Context, topic string, partition int32, req *heraldpb.Frame, extra time.Duration) (*heraldpb.Frame, error) {
	timeout := c.cfg.requestTimeout
	if timeout > 0 {
		timeout += extra
	}
	for attempt := 0; ; attempt++ {
		cn, err := c.leaderConn(ctx, topic, partition)
		if err != nil {
			return nil, err
		}
		ch, err := cn.send(ctx, func(dst []byte, id uint64) ([]byte, error) {
			req.Id = id
			return heraldpb.AppendFrame(dst, req)
		}, nil)
		var moved uint32 // the node another broker names as leader now
		var f *heraldpb.Frame
		if err == nil {
			f, err = cn.awaitWatchedAfter(ctx, ch, timeout, extra+leaderCheck, leaderCheck, func() error {
				if moved = c.leaderMovedFrom(ctx, cn, topic, partition); moved != 0 {
					return &Error{Code: heraldpb.ErrorCode_NOT_LEADER, Retriable: true, Leader: moved,
						Message: fmt.Sprintf("node %d (%s) has not answered a request for %s-%d; node %d leads it now", cn.nodeID, cn.addr, topic, partition, moved)}
				}
				return nil
			})
		}
		if err == nil {
			return f, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		timedOut := errors.Is(err, ErrRequestTimeout)
		if moved == 0 {
			moved = c.unknownLeaderMoved(ctx, cn, topic, partition, err)
		}
		if moved == 0 && (timedOut || errors.Is(err, ErrConnectionLost)) {
			if timedOut {
				c.markSuspect(cn.addr, suspectFor)
			}
			if moved = c.leaderMovedFrom(ctx, cn, topic, partition); moved == 0 && timedOut {
				c.invalidate(topic)
			}
		}
		if moved == 0 || attempt >= readFailovers {
			return nil, err
		}
		c.cfg.logger.Debug("herald: read sent to the new leader", "topic", topic, "partition", partition,
			"from", cn.nodeID, "to", moved, "err", err)
	}
}

// unknownLeaderMoved handles a NOT_LEADER answer from cn's broker that
// names no leader. A node cut off from the others steps down within an
// election timeout and then knows no leader, while the others elect one
// within about a second: so another broker is asked (leaderMovedFrom,
// which marks cn's broker suspect when it names another node). The node
// it names is returned, and set as err's Leader; 0 when err is something
// else, or when no other broker knows better either.
func (c *Client) unknownLeaderMoved(ctx context.Context, cn *conn, topic string, partition int32, err error) uint32 {
	if err == nil {
		return 0 // (before he: every success allocates nothing)
	}
	var he *Error
	if partition < 0 || !errors.As(err, &he) || he.Code != heraldpb.ErrorCode_NOT_LEADER || he.Leader != 0 {
		return 0
	}
	moved := c.leaderMovedFrom(ctx, cn, topic, partition)
	if moved != 0 {
		he.Leader = moved
	}
	return moved
}

// notReadyMoved handles NOT_READY from cn's broker for a request to
// topic/partition: a node still starting (it has not loaded the
// cluster's metadata, or is replaying its log) leads nothing yet, yet
// metadata cached before it restarted names it. Another broker is asked
// at once; when it names another leader, that is cached and returned as
// a NOT_LEADER naming it (nothing was done), and the starting node is
// tried last for its retry-after. Otherwise err is returned as it is, to
// be waited out. For a partition the broker picks (-1), the node is only
// tried last.
func (c *Client) notReadyMoved(ctx context.Context, cn *conn, topic string, partition int32, err error) error {
	c.markSuspect(cn.addr, min(max(retryAfter(err), 100*time.Millisecond), suspectFor))
	if partition < 0 {
		return err
	}
	leader := c.leaderMovedFrom(ctx, cn, topic, partition)
	if leader == 0 {
		return err
	}
	moved := &Error{Code: heraldpb.ErrorCode_NOT_LEADER, Retriable: true, Leader: leader,
		Message: fmt.Sprintf("node %d (%s) is not ready (%v); node %d leads %s-%d", cn.nodeID, cn.addr, err, leader, topic, partition)}
	c.notLeader(topic, partition, moved)
	return moved
}

// notLeader handles a NOT_LEADER answer for topic/partition: with the
// leader named, the cached metadata points at it; otherwise, or when the
// client knows no address for the node named (its brokers came from
// metadata fetched while that node was down), the topic's metadata, and
// with it the brokers, is fetched again on next use. (Pointing at a node
// it cannot reach, the producer went to the other replicas, which named
// that node again, until its failover timeout.) The node named is no
// longer suspect.
func (c *Client) notLeader(topic string, partition int32, err error) {
	var he *Error
	if !errors.As(err, &he) || he.Leader == 0 || partition < 0 {
		c.invalidate(topic)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	tm := c.meta[topic]
	if tm == nil {
		return
	}
	addr := c.brokers[he.Leader]
	if addr == "" {
		delete(c.meta, topic)
		return
	}
	// A replica naming the leader is newer than any suspicion of it (it
	// answered NOT_READY while it restarted, or did not answer while
	// another node led): tried last, it would be asked only after the
	// replicas, which name it again, until the mark expires.
	delete(c.suspect, addr)
	info := proto.Clone(tm.info).(*heraldpb.TopicInfo)
	for _, p := range info.Partitions {
		if int32(p.GetId()) == partition {
			p.Leader = he.Leader
		}
	}
	c.meta[topic] = &topicMeta{info: info, fetched: tm.fetched}
}

// call sends one request to cn's broker, bounded by the request timeout plus
// extra (a long poll's wait).
func (c *Client) call(ctx context.Context, cn *conn, req *heraldpb.Frame, extra time.Duration) (*heraldpb.Frame, error) {
	timeout := c.cfg.requestTimeout
	if timeout > 0 {
		timeout += extra
	}
	return cn.roundTrip(ctx, req, timeout)
}

// callAny sends one request to any broker. A broker that answers
// NOT_READY (it has not loaded the cluster's metadata yet) is tried after
// the others for its retry-after; the request is sent again, elsewhere if
// another broker is reachable, until the request timeout has passed.
//
// A read (metadata, a listing: anyRead) that a broker has not answered
// within leaderCheck is sent to another broker when there is one not
// marked suspect, and the silent one is marked suspect: a frozen broker
// (a stopped process, a stalled disk) keeps its connections open and
// never answers, and a producer whose metadata went to it waited for the
// whole request timeout while the other brokers could have answered.
func (c *Client) callAny(ctx context.Context, req *heraldpb.Frame) (*heraldpb.Frame, error) {
	var deadline time.Time
	if c.cfg.requestTimeout > 0 {
		deadline = time.Now().Add(c.cfg.requestTimeout)
	}
	for {
		cn, err := c.anyConn(ctx)
		if err != nil {
			return nil, err
		}
		var f *heraldpb.Frame
		if anyRead(req) {
			f, err = c.callWatched(ctx, cn, req)
			if errors.Is(err, errSilentBroker) && (deadline.IsZero() || time.Now().Before(deadline)) {
				c.cfg.logger.Debug("herald: broker silent; asking another", "addr", cn.addr, "request", requestName(req))
				c.markSuspect(cn.addr, suspectFor)
				continue
			}
		} else {
			f, err = c.call(ctx, cn, req, 0)
		}
		if !IsCode(err, heraldpb.ErrorCode_NOT_READY) || (!deadline.IsZero() && time.Now().After(deadline)) {
			return f, err
		}
		wait := min(max(retryAfter(err), 10*time.Millisecond), time.Second)
		c.markSuspect(cn.addr, wait)
		if err := sleepCtx(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// errSilentBroker: a read was not answered within leaderCheck while
// another broker could be asked.
var errSilentBroker = errors.New("herald: the broker has not answered")

// anyRead reports whether req is a read any broker answers alike, which
// callAny may send to another broker when one does not answer.
func anyRead(req *heraldpb.Frame) bool {
	switch req.Body.(type) {
	case *heraldpb.Frame_Metadata, *heraldpb.Frame_ListTopics, *heraldpb.Frame_DescribeTopic, *heraldpb.Frame_ListExchanges,
		*heraldpb.Frame_ListUsers, *heraldpb.Frame_ListAcls, *heraldpb.Frame_ListVhosts:
		return true
	}
	return false
}

// callWatched sends the read req on cn and waits for the answer, up to
// the request timeout; while none has come it looks every leaderCheck for
// another broker to ask (one not marked suspect, other than cn's), and
// gives up with errSilentBroker once there is one.
func (c *Client) callWatched(ctx context.Context, cn *conn, req *heraldpb.Frame) (*heraldpb.Frame, error) {
	enc := func(dst []byte, id uint64) ([]byte, error) {
		req.Id = id
		return heraldpb.AppendFrame(dst, req)
	}
	// A silent broker's window may be full of requests it never answered:
	// waiting for a slot is bounded the same way.
	sctx, cancel := context.WithTimeout(ctx, leaderCheck)
	ch, err := cn.send(sctx, enc, nil)
	cancel()
	if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		if c.otherBroker(cn.addr) {
			return nil, errSilentBroker
		}
		ch, err = cn.send(ctx, enc, nil)
	}
	if err != nil {
		return nil, err
	}
	f, err := cn.awaitWatched(ctx, ch, c.cfg.requestTimeout, leaderCheck, func() error {
		if c.otherBroker(cn.addr) {
			return errSilentBroker
		}
		return nil
	})
	if errors.Is(err, ErrRequestTimeout) {
		err = fmt.Errorf("%s: %w", requestName(req), err)
	}
	return f, err
}

// otherBroker reports whether a broker other than the one at addr, and not
// marked suspect, is known (bootstrapped from, named by metadata, or
// connected).
func (c *Client) otherBroker(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range c.knownAddrsLocked() {
		if a != addr && !c.suspectLocked(a) {
			return true
		}
	}
	return false
}

// knownAddrsLocked lists every broker address the client knows, each once:
// the bootstrap addresses first, then the brokers metadata named (the
// bootstrap ones may all be gone: nodes restarted elsewhere), then those
// of its connections. c.mu is held.
func (c *Client) knownAddrsLocked() []string {
	addrs := slices.Clone(c.addrs)
	for _, id := range slices.Sorted(maps.Keys(c.brokers)) {
		if a := c.brokers[id]; !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	for a := range c.conns {
		if !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	return addrs
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func unexpected(f *heraldpb.Frame, want string) error {
	return fmt.Errorf("%w: expected %s, got %T", ErrProtocol, want, f.GetBody())
}

// Metadata returns the brokers and the named topics (all topics when none
// are named) and refreshes the client's metadata cache with them.
func (c *Client) Metadata(ctx context.Context, topics ...string) (*heraldpb.MetadataResponse, error) {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_Metadata{Metadata: &heraldpb.MetadataRequest{Topics: topics}}})
	if err != nil {
		return nil, err
	}
	return c.noteMetadata(f)
}

// metadataOn asks cn's broker for the metadata of topics and caches it.
func (c *Client) metadataOn(ctx context.Context, cn *conn, topics []string) (*heraldpb.MetadataResponse, error) {
	f, err := c.call(ctx, cn, &heraldpb.Frame{Body: &heraldpb.Frame_Metadata{Metadata: &heraldpb.MetadataRequest{Topics: topics}}}, 0)
	if err != nil {
		return nil, err
	}
	return c.noteMetadata(f)
}

// noteMetadata caches a Metadata answer's brokers and topics.
func (c *Client) noteMetadata(f *heraldpb.Frame) (*heraldpb.MetadataResponse, error) {
	r := f.GetMetadataResponse()
	if r == nil {
		return nil, unexpected(f, "MetadataResponse")
	}
	now := time.Now()
	c.mu.Lock()
	for _, b := range r.GetBrokers() {
		if b.GetAddr() != "" {
			addr := b.GetAddr()
			if c.cfg.tls != nil {
				// A TLS client connects to TLS listeners only.
				addr = b.GetTlsAddr()
			}
			if addr == "" {
				continue
			}
			c.brokers[b.GetNodeId()] = addr
		}
	}
	for _, t := range r.GetTopics() {
		c.meta[t.GetName()] = &topicMeta{info: t, fetched: now}
	}
	c.mu.Unlock()
	return r, nil
}

// topicInfo returns cached metadata for topic, fetching it when missing,
// older than the metadata max age, or when refresh is set. A topic the
// broker does not know fails with a TOPIC_NOT_FOUND *Error.
func (c *Client) topicInfo(ctx context.Context, topic string, refresh bool) (*heraldpb.TopicInfo, error) {
	c.mu.Lock()
	tm := c.meta[topic]
	c.mu.Unlock()
	if tm != nil && !refresh && time.Since(tm.fetched) < c.cfg.metadataMaxAge {
		return tm.info, nil
	}
	r, err := c.Metadata(ctx, topic)
	if err != nil {
		return nil, err
	}
	for _, t := range r.GetTopics() {
		if t.GetName() == topic {
			return t, nil
		}
	}
	c.mu.Lock()
	delete(c.meta, topic)
	c.mu.Unlock()
	return nil, &Error{Code: heraldpb.ErrorCode_TOPIC_NOT_FOUND, Message: fmt.Sprintf("topic %q not in metadata", topic)}
}

// invalidate drops cached metadata of topic, after NOT_LEADER and the like.
func (c *Client) invalidate(topic string) {
	c.mu.Lock()
	delete(c.meta, topic)
	c.mu.Unlock()
}

// CreateTopic creates a topic. cfg.Partitions must be at least 1; zero
// fields of cfg take the broker's defaults.
func (c *Client) CreateTopic(ctx context.Context, name string, cfg *heraldpb.TopicConfig) (*heraldpb.TopicInfo, error) {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: name, Config: cfg}}})
	if err != nil {
		return nil, err
	}
	r := f.GetCreateTopicResponse()
	if r == nil {
		return nil, unexpected(f, "CreateTopicResponse")
	}
	c.invalidate(name)
	return r.GetTopic(), nil
}

// DeleteTopic deletes a topic and its data.
func (c *Client) DeleteTopic(ctx context.Context, name string) error {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_DeleteTopic{DeleteTopic: &heraldpb.DeleteTopicRequest{Name: name}}})
	if err != nil {
		return err
	}
	if f.GetDeleteTopicResponse() == nil {
		return unexpected(f, "DeleteTopicResponse")
	}
	c.invalidate(name)
	return nil
}

// ClusterAdmin asks the cluster to move partition replicas (add a node,
// remove one, rebalance). It returns the moves once the controller has
// recorded them; they run on afterwards, and each moving partition shows
// TargetReplicas in the metadata until it is done (see WaitForMoves).
func (c *Client) ClusterAdmin(ctx context.Context, req *heraldpb.ClusterAdminRequest) (*heraldpb.ClusterAdminResponse, error) {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_ClusterAdmin{ClusterAdmin: req}})
	if err != nil {
		return nil, err
	}
	r := f.GetClusterAdminResponse()
	if r == nil {
		return nil, unexpected(f, "ClusterAdminResponse")
	}
	for _, mv := range r.Moves {
		c.invalidate(mv.Topic)
	}
	return r, nil
}

// WaitForMoves polls the metadata until no partition of any topic is
// being moved, or ctx ends. It returns how many were moving at the last
// poll (0 when done).
func (c *Client) WaitForMoves(ctx context.Context, every time.Duration) (int, error) {
	for {
		topics, err := c.ListTopics(ctx)
		moving := 0
		for _, t := range topics {
			for _, p := range t.GetPartitions() {
				if len(p.GetTargetReplicas()) > 0 {
					moving++
				}
			}
		}
		if err == nil && moving == 0 {
			return 0, nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
			return moving, err
		case <-time.After(every):
		}
	}
}

// ListTopics lists every topic.
func (c *Client) ListTopics(ctx context.Context) ([]*heraldpb.TopicInfo, error) {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_ListTopics{ListTopics: &heraldpb.ListTopicsRequest{}}})
	if err != nil {
		return nil, err
	}
	r := f.GetListTopicsResponse()
	if r == nil {
		return nil, unexpected(f, "ListTopicsResponse")
	}
	return r.GetTopics(), nil
}

// DescribeTopic returns one topic's config and partitions.
func (c *Client) DescribeTopic(ctx context.Context, name string) (*heraldpb.TopicInfo, error) {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_DescribeTopic{DescribeTopic: &heraldpb.DescribeTopicRequest{Name: name}}})
	if err != nil {
		return nil, err
	}
	r := f.GetDescribeTopicResponse()
	if r == nil {
		return nil, unexpected(f, "DescribeTopicResponse")
	}
	return r.GetTopic(), nil
}

// Partitions returns the topic's partition count from cached metadata.
func (c *Client) Partitions(ctx context.Context, topic string) (int, error) {
	ti, err := c.topicInfo(ctx, topic, false)
	if err != nil {
		return 0, err
	}
	n := len(ti.GetPartitions())
	if n == 0 {
		n = int(ti.GetConfig().GetPartitions())
	}
	return n, nil
}

// PartitionRepair is one replica's damage record, as RepairPartition
// returns it. Damaged is false for a whole log; Node names the replica's
// node.
type PartitionRepair = heraldpb.RepairPartitionResponse

// RepairPartition asks every replica of topic/partition about damage to
// its log (on a single broker, the one replica) and, with acceptLoss,
// accepts the loss where no whole copy is left:
//   - a single replica that is damaged becomes writable again;
//   - in a replicated partition with a replica whose log is whole, nothing
//     is accepted: the damaged replicas rebuild from the leader by
//     themselves;
//   - in one whose every replica is damaged (it has no leader and is
//     read-only), each accepts the loss with the largest lost end of them
//     all as its floor, so whichever leads next reuses no offset any of
//     them lost.
//
// It returns the replicas' records after the call. It is an operator's
// command: see `herald partition repair`.
func (c *Client) RepairPartition(ctx context.Context, topic string, partition uint32, acceptLoss bool) ([]*PartitionRepair, error) {
	addrs := c.replicaAddrs(ctx, topic, partition)
	ask := func(addr string, accept bool, floor int64, maxCommit uint64) (*PartitionRepair, error) {
		req := &heraldpb.Frame{Body: &heraldpb.Frame_RepairPartition{RepairPartition: &heraldpb.RepairPartitionRequest{
			Topic: topic, Partition: partition, AcceptLoss: accept, MinNextOffset: floor, MaxCommitIndex: maxCommit,
		}}}
		var (
			f   *heraldpb.Frame
			err error
		)
		if addr == "" {
			f, err = c.callAny(ctx, req)
		} else {
			cn, cerr := c.connTo(ctx, addr)
			if cerr != nil {
				return nil, cerr
			}
			f, err = c.call(ctx, cn, req, 0)
		}
		if err != nil {
			return nil, err
		}
		r := f.GetRepairPartitionResponse()
		if r == nil {
			return nil, unexpected(f, "RepairPartitionResponse")
		}
		return r, nil
	}
	var out []*PartitionRepair
	floor, whole, shortest := int64(0), false, uint64(math.MaxUint64)
	for _, a := range addrs {
		r, err := ask(a, false, 0, 0)
		if err != nil {
			return nil, fmt.Errorf("replica at %s: %w", a, err)
		}
		out = append(out, r)
		if !r.GetDamaged() {
			whole = true
		} else if !r.GetAccepted() {
			floor = max(floor, r.GetLostTo())
		}
		shortest = min(shortest, r.GetLastIndex())
	}
	// Every replica keeps its commit index within the shortest log kept,
	// so that none holds one past the log of whichever leads next.
	maxCommit := uint64(0)
	if len(addrs) > 1 {
		maxCommit = max(shortest, 1)
	}
	if !acceptLoss || (whole && len(addrs) > 1) {
		return out, nil
	}
	for i, a := range addrs {
		if !out[i].GetDamaged() || out[i].GetAccepted() {
			continue
		}
		r, err := ask(a, true, floor, maxCommit)
		if err != nil {
			return out, fmt.Errorf("accepting the loss at %s: %w", a, err)
		}
		out[i] = r
	}
	return out, nil
}

// replicaAddrs lists the addresses of the nodes holding replicas of
// topic/partition, from fresh metadata; a single "" (any connection) on a
// single broker or when metadata names none.
func (c *Client) replicaAddrs(ctx context.Context, topic string, partition uint32) []string {
	ti, err := c.topicInfo(ctx, topic, true)
	if err != nil {
		return []string{""}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.brokers) <= 1 {
		return []string{""}
	}
	var out []string
	for _, p := range ti.GetPartitions() {
		if p.GetId() != partition {
			continue
		}
		for _, n := range p.GetReplicas() {
			if a := c.brokers[n]; a != "" {
				out = append(out, a)
			}
		}
	}
	if len(out) == 0 {
		return []string{""}
	}
	return out
}
