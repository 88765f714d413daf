package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/xdg-go/scram"
)

// conn is one connection to one broker. Requests are pipelined: a caller
// takes a slot of the in-flight window, registers its id, queues its encoded
// frame for the writer goroutine and waits for the reader goroutine to hand
// it the response with the same id.
//
// A window slot is released when the response arrives (or the connection
// dies), not when the caller gives up, so the broker never sees more than
// the negotiated window outstanding even when callers cancel.
type conn struct {
	addr     string
	nc       net.Conn
	log      logger
	maxFrame int    // negotiated
	window   int    // negotiated
	nodeID   uint32 // from HelloResponse
	// principal is who the broker says the connection acts as ("" =
	// anonymous).
	principal string
	server    string
	// idleTimeout is the broker's idle timeout from Hello (0 = never or
	// unknown).
	idleTimeout time.Duration

	slots  chan struct{} // in-flight semaphore: a send takes, a response returns
	nextID atomic.Uint64
	// gate holds produces to this broker after it answered THROTTLED
	// (produceGate).
	gate produceGate

	mu      sync.Mutex
	pending map[uint64]chan *heraldpb.Frame
	// hooks run on the reader goroutine when the response with their id
	// arrives, before the reader reads the next frame: Subscribe registers
	// its subscription id there, so a Delivery pushed right after the
	// SubscribeResponse finds it.
	hooks map[uint64]func(*heraldpb.Frame)
	subs  map[uint64]*subSession // push targets: subscription id -> session
	calls map[uint64]*callWaiter // pending Requests: correlation id -> waiter
	wbuf  []byte                 // frames queued for the writer
	err   error                  // why the connection died; set once
	// checkers are the check-back targets: producer group -> checker
	// (txncheck.go).
	checkers map[string]*txnChecker

	wake chan struct{} // signals the writer, capacity 1
	dead chan struct{} // closed when the connection dies

	// wmu is held by whoever writes to nc: the writer goroutine, or a
	// sender writing its own frame when nobody else is and no other
	// request waits for its response (write-through: one goroutine
	// handoff less per request when the connection is idle). Under load,
	// and while requests are in flight (writeBehind), senders queue and
	// the writer batches.
	wmu   sync.Mutex
	spare []byte // the buffer wbuf swaps with; guarded by wmu
}

// produceGate paces a connection's produce requests after the broker
// answered THROTTLED, as Kafka clients mute a connection for a broker's
// throttle time: no produce leaves before the retry-after has passed, and
// then at most limit produces are in flight on the connection, a limit
// halved by each THROTTLED (once per retry-after) and raised by one with
// each produce answered otherwise once gateQuiet has passed without a
// THROTTLED, until it is lifted. So a producer whose batches are refused
// does not send all its batches again at once to be refused again, probes
// for more room about once per gateQuiet, and one that is never throttled
// is never held.
type produceGate struct {
	mu       sync.Mutex
	limit    int       // produces in flight allowed; 0 = no limit
	inflight int       // produces in flight through the gate
	until    time.Time // no produce before this
	last     time.Time // the last THROTTLED
	changed  chan struct{}
}

// gateLift is the limit above which the gate opens fully again; gateQuiet
// how long after a THROTTLED the limit stays put.
const (
	gateLift  = 64
	gateQuiet = time.Second
)

// acquire waits for the gate to let one produce through, or ctx to end.
func (g *produceGate) acquire(ctx context.Context) error {
	for {
		g.mu.Lock()
		wait := time.Until(g.until)
		if wait <= 0 && (g.limit == 0 || g.inflight < g.limit) {
			g.inflight++
			g.mu.Unlock()
			return nil
		}
		if g.changed == nil {
			g.changed = make(chan struct{})
		}
		changed := g.changed
		g.mu.Unlock()
		var t *time.Timer
		var timer <-chan time.Time
		if wait > 0 {
			t = time.NewTimer(wait)
			timer = t.C
		}
		var err error
		select {
		case <-timer:
		case <-changed:
		case <-ctx.Done():
			err = ctx.Err()
		}
		if t != nil {
			t.Stop()
		}
		if err != nil {
			return err
		}
	}
}

// release ends a produce acquire let through: throttled with the broker's
// retry-after, or not (answered otherwise, or never answered).
func (g *produceGate) release(throttled bool, retryAfter time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inflight--
	now := time.Now()
	switch {
	case throttled && now.After(g.until):
		// The first refusal of a round: halve, and wait the hint. The
		// other produces in flight then were sent before it.
		g.limit = max(1, min(g.limitOr(g.inflight+1), g.inflight+1)/2)
		g.until, g.last = now.Add(retryAfter), now
	case throttled:
		g.until, g.last = maxTime(g.until, now.Add(retryAfter)), now
	case g.limit > 0 && now.Sub(g.last) >= gateQuiet:
		if g.limit++; g.limit > gateLift {
			g.limit = 0
		}
	}
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
}

func (g *produceGate) limitOr(n int) int {
	if g.limit == 0 {
		return n
	}
	return g.limit
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// writeThroughMax bounds the queued bytes a sender writes itself; bigger
// bursts go to the writer goroutine, so a sender never blocks long in a
// write the kernel cannot take at once.
const writeThroughMax = 64 << 10

// writeBehind is how many requests may wait for their response (this one
// included) for a sender still to write its own frame. Past it the
// connection is pipelined: the broker's work for the requests ahead is
// most of this one's wait, a goroutine handoff (microseconds) little of
// it, and the frames other senders queue meanwhile share the write. A
// loopback write carries a fixed cost (the segment, the wakeup of the
// reader) that a 10 KiB request pays in full: 10-record transactions with
// 64 commits in flight made 30,000 writes a second, this way about 6,700,
// and ran at 0.559x of plain produce instead of 0.474x (medians of 3
// rounds, docs/benchmarks/runs.md, 2026-12-05 21:48).
const writeBehind = 1

// flushWrites writes everything queued. The caller holds wmu.
func (c *conn) flushWrites() error {
	c.mu.Lock()
	buf := c.wbuf
	c.wbuf = c.spare[:0]
	c.mu.Unlock()
	if len(buf) == 0 {
		c.spare = buf
		return nil
	}
	_, err := c.nc.Write(buf)
	if cap(buf) > 4<<20 {
		buf = nil // do not pin a huge buffer after a burst
	}
	c.spare = buf[:0]
	return err
}

type logger interface {
	Debug(msg string, args ...any)
	Warn(msg string, args ...any)
}

// dialConn connects to addr and performs Hello within ctx.
func dialConn(ctx context.Context, addr string, cfg *clientConfig) (*conn, error) {
	if cfg.dialTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.dialTimeout)
		defer cancel()
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if cfg.tls != nil {
		if nc, err = handshakeTLS(ctx, nc, addr, cfg.tls); err != nil {
			return nil, err
		}
	}
	c := &conn{
		addr:    addr,
		nc:      nc,
		log:     cfg.logger,
		pending: make(map[uint64]chan *heraldpb.Frame),
		subs:    make(map[uint64]*subSession),
		calls:   make(map[uint64]*callWaiter),
		wake:    make(chan struct{}, 1),
		dead:    make(chan struct{}),
	}
	br := bufio.NewReaderSize(nc, 64<<10)
	if err := c.hello(ctx, br, cfg); err != nil {
		nc.Close()
		// With TLS 1.3 the broker checks the client's certificate after
		// the client's side of the handshake: its refusal arrives here.
		var oe *net.OpError
		if cfg.tls != nil && errors.As(err, &oe) && oe.Op == "remote error" {
			return nil, fmt.Errorf("%w: %s refused the connection: %w", ErrTLS, addr, err)
		}
		return nil, err
	}
	c.slots = make(chan struct{}, c.window)
	go c.readLoop(br)
	go c.writeLoop()
	return c, nil
}

// handshakeTLS runs the TLS handshake on nc within ctx. A broker that
// answers with something other than TLS is most likely the plaintext
// listener: the error says so.
func handshakeTLS(ctx context.Context, nc net.Conn, addr string, cfg *tls.Config) (net.Conn, error) {
	cfg = cfg.Clone()
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		cfg.ServerName = host
	}
	tc := tls.Client(nc, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		nc.Close()
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) {
			return nil, fmt.Errorf("%w: %s did not answer with TLS (is it the broker's plaintext listener? TLS is served on --listen-tls): %w", ErrTLS, addr, err)
		}
		return nil, fmt.Errorf("%w: handshake with %s: %w", ErrTLS, addr, err)
	}
	return tc, nil
}

// hello runs the Hello exchange synchronously, before the reader and writer
// start, so nothing else can be sent first.
func (c *conn) hello(ctx context.Context, br *bufio.Reader, cfg *clientConfig) error {
	stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	id := c.nextID.Add(1)
	hello := &heraldpb.HelloRequest{
		ClientId:        cfg.clientID,
		ProtocolVersion: heraldpb.ProtocolVersion,
		MaxFrameBytes:   cfg.maxFrameBytes,
		MaxInFlight:     cfg.maxInFlight,
		Vhost:           cfg.vhost,
	}
	var conv *scram.ClientConversation
	if cfg.login != nil {
		conv = cfg.login.client.NewConversation()
		first, err := conv.Step("")
		if err != nil {
			return fmt.Errorf("%w: %w", ErrNotAuthenticated, err)
		}
		hello.SaslMechanism, hello.SaslData = scramMechanism, []byte(first)
	}
	f, err := c.handshakeStep(ctx, br, &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_Hello{Hello: hello}})
	if err != nil {
		return err
	}
	hr := f.GetHelloResponse()
	if hr == nil || f.GetId() != id {
		return fmt.Errorf("%w: hello answered with %T id %d", ErrProtocol, f.GetBody(), f.GetId())
	}
	c.maxFrame = int(hr.GetMaxFrameBytes())
	if c.maxFrame <= 0 || c.maxFrame > int(cfg.maxFrameBytes) {
		c.maxFrame = int(cfg.maxFrameBytes)
	}
	c.window = int(hr.GetMaxInFlight())
	if c.window <= 0 || c.window > int(cfg.maxInFlight) {
		c.window = int(cfg.maxInFlight)
	}
	c.nodeID = hr.GetNodeId()
	c.server = hr.GetServerVersion()
	c.idleTimeout = time.Duration(hr.GetIdleTimeoutMs()) * time.Millisecond
	c.principal = hr.GetPrincipal()
	if conv != nil {
		if err := c.authenticate(ctx, br, conv, hr.GetSaslData()); err != nil {
			return err
		}
	}
	_ = c.nc.SetDeadline(time.Time{})
	return nil
}

// handshakeStep writes req and reads the one frame that answers it,
// before the reader and writer start (Hello and the login); an Error
// frame is returned as the error.
func (c *conn) handshakeStep(ctx context.Context, br *bufio.Reader, req *heraldpb.Frame) (*heraldpb.Frame, error) {
	b, err := heraldpb.AppendFrame(nil, req)
	if err != nil {
		return nil, err
	}
	if _, err := c.nc.Write(b); err != nil {
		return nil, ctxErr(ctx, err)
	}
	f, err := readFrame(br, heraldpb.DefaultMaxFrameBytes)
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	if e := f.GetError(); e != nil {
		return nil, fromWire(e)
	}
	return f, nil
}

// authenticate ends the SCRAM login Hello began: it answers the broker's
// challenge and checks the broker's proof that it knows the credentials.
func (c *conn) authenticate(ctx context.Context, br *bufio.Reader, conv *scram.ClientConversation, challenge []byte) error {
	final, err := conv.Step(string(challenge))
	if err != nil {
		return fmt.Errorf("%w: %s: the broker's challenge: %w", ErrNotAuthenticated, c.addr, err)
	}
	id := c.nextID.Add(1)
	f, err := c.handshakeStep(ctx, br, &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_SaslAuthenticate{
		SaslAuthenticate: &heraldpb.SaslAuthenticateRequest{SaslData: []byte(final)},
	}})
	if err != nil {
		return err
	}
	ar := f.GetSaslAuthenticateResponse()
	if ar == nil || f.GetId() != id {
		return fmt.Errorf("%w: SaslAuthenticate answered with %T id %d", ErrProtocol, f.GetBody(), f.GetId())
	}
	if _, err := conv.Step(string(ar.GetSaslData())); err != nil || !conv.Valid() {
		return fmt.Errorf("%w: %s did not prove it knows the user's credentials: %v", ErrNotAuthenticated, c.addr, err)
	}
	c.principal = ar.GetPrincipal()
	return nil
}

// ctxErr prefers the context's error over the I/O error it caused.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func readFrame(br *bufio.Reader, max int) (*heraldpb.Frame, error) {
	payload, err := readPayload(br, max)
	if err != nil {
		return nil, err
	}
	return heraldpb.DecodeFrame(payload)
}

// readPayload reads one frame and returns its payload in a new buffer that
// nothing else refers to: pushed messages alias it (see decodeDelivery), so
// it must never be reused.
func readPayload(br *bufio.Reader, max int) ([]byte, error) {
	var hdr [heraldpb.HeaderLen]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(max) {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", heraldpb.ErrFrameTooLarge, n, max)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(br, payload); err != nil {
		return nil, err
	}
	return payload, nil
}

// readLoop reads frames until the connection dies. Responses go to their
// waiting request; pushes (frame id 0: Delivery, AssignmentChange,
// ReplyDelivery, HalfCheck) go to their subscription, pending Request or
// transaction checker without blocking (see pushDelivery and push).
func (c *conn) readLoop(br *bufio.Reader) {
	for {
		payload, err := readPayload(br, c.maxFrame)
		if err != nil {
			c.fail(err)
			return
		}
		if ok, err := c.pushDelivery(payload); err != nil {
			c.fail(err)
			return
		} else if ok {
			continue
		}
		f, err := heraldpb.DecodeFrame(payload)
		if err != nil && !errors.Is(err, heraldpb.ErrUnknownBody) {
			c.fail(err)
			return
		}
		if f.GetId() == 0 && c.push(f) {
			continue
		}
		var hook func(*heraldpb.Frame)
		c.mu.Lock()
		ch, ok := c.pending[f.GetId()]
		if ok {
			delete(c.pending, f.GetId())
			if len(c.hooks) > 0 {
				if hook = c.hooks[f.GetId()]; hook != nil {
					delete(c.hooks, f.GetId())
				}
			}
		}
		c.mu.Unlock()
		if hook != nil {
			hook(f)
		}
		if !ok {
			if e := f.GetError(); e != nil {
				// An error frame for no request (id 0) precedes a close.
				c.fail(fromWire(e))
				return
			}
			c.log.Debug("herald: response for unknown id", "addr", c.addr, "id", f.GetId())
			continue
		}
		<-c.slots
		ch <- f // buffered 1, never blocks
	}
}

func (c *conn) writeLoop() {
	for {
		select {
		case <-c.wake:
		case <-c.dead:
			return
		}
		c.wmu.Lock()
		err := c.flushWrites()
		c.wmu.Unlock()
		if err != nil {
			c.fail(err)
			return
		}
	}
}

// fail kills the connection once and fails every pending request with a
// retryable error wrapping ErrConnectionLost and the cause.
func (c *conn) fail(cause error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	if errors.Is(cause, ErrClosed) {
		c.err = ErrClosed
	} else {
		c.err = fmt.Errorf("%w: %s: %v", ErrConnectionLost, c.addr, cause)
	}
	for _, w := range c.calls {
		w.ch <- nil // buffered 1 and empty while registered; under the lock, see push
	}
	pending := c.pending
	c.pending, c.hooks, c.subs, c.calls, c.checkers = nil, nil, nil, nil, nil
	c.wbuf = nil
	c.mu.Unlock()
	close(c.dead)
	c.nc.Close()
	for _, ch := range pending {
		ch <- nil
	}
	c.log.Debug("herald: connection closed", "addr", c.addr, "cause", cause)
}

func (c *conn) deadErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *conn) alive() bool {
	select {
	case <-c.dead:
		return false
	default:
		return true
	}
}

// roundTrip sends req (its Id is assigned here) and waits for the response.
// A broker Error response is returned as *Error. ctx bounds the wait for a
// window slot and for the response; timeout (if > 0) additionally bounds the
// wait for the response and yields ErrRequestTimeout.
func (c *conn) roundTrip(ctx context.Context, req *heraldpb.Frame, timeout time.Duration) (*heraldpb.Frame, error) {
	return c.roundTripHook(ctx, req, timeout, nil)
}

// roundTripHook is roundTrip with a hook that the reader goroutine runs on
// the response (not on a connection failure) before it reads the next
// frame. The hook must not block; it runs even when the caller has given
// up waiting.
func (c *conn) roundTripHook(ctx context.Context, req *heraldpb.Frame, timeout time.Duration, hook func(*heraldpb.Frame)) (*heraldpb.Frame, error) {
	f, err := c.exchange(ctx, func(dst []byte, id uint64) ([]byte, error) {
		req.Id = id
		return heraldpb.AppendFrame(dst, req)
	}, timeout, hook)
	if errors.Is(err, ErrRequestTimeout) {
		// Say which request: a timeout is otherwise anonymous.
		err = fmt.Errorf("%s: %w", requestName(req), err)
	}
	return f, err
}

// requestName is the name of a request frame's body ("DescribeGroup").
func requestName(f *heraldpb.Frame) string {
	if f == nil || f.Body == nil {
		return "request"
	}
	name := string(f.ProtoReflect().WhichOneof(f.ProtoReflect().Descriptor().Oneofs().ByName("body")).Message().Name())
	return strings.TrimSuffix(name, "Request")
}

// awaitWatched is await that, while no response has come, calls check
// every `every` (from the waiting goroutine) and gives up with check's
// error when it returns one. The request stays registered: its window
// slot frees when the broker answers at last, or the connection dies.
func (c *conn) awaitWatched(ctx context.Context, ch chan *heraldpb.Frame, timeout, every time.Duration, check func() error) (*heraldpb.Frame, error) {
	return c.awaitWatchedAfter(ctx, ch, timeout, every, every, check)
}

// awaitWatchedAfter is awaitWatched whose first check comes after first
// rather than after every: a long-polling fetch is not checked while the
// broker may legitimately hold it.
func (c *conn) awaitWatchedAfter(ctx context.Context, ch chan *heraldpb.Frame, timeout, first, every time.Duration, check func() error) (*heraldpb.Frame, error) {
	// One timer for both the checks and the timeout (a request in flight
	// costs one timer, not two): it fires at whichever comes first.
	start := time.Now()
	next := first // since start: when the next check is due
	wait := func(elapsed time.Duration) time.Duration {
		d := next - elapsed
		if timeout > 0 {
			d = min(d, timeout-elapsed)
		}
		return max(d, 0)
	}
	t := getTimer(wait(0))
	defer putTimer(t)
	for {
		select {
		case f := <-ch:
			return c.response(ch, f)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
			elapsed := time.Since(start)
			if timeout > 0 && elapsed >= timeout {
				return nil, c.timedOut(timeout)
			}
			if elapsed >= next {
				next = elapsed + every
				if err := check(); err != nil {
					select {
					case f := <-ch: // it answered meanwhile after all
						return c.response(ch, f)
					default:
					}
					return nil, err
				}
				elapsed = time.Since(start)
			}
			t.Reset(wait(elapsed))
		}
	}
}

// exchange sends the frame that enc appends to dst (a whole length-prefixed
// frame with the given id; on error dst unchanged) and waits for the
// response, as roundTrip does.
func (c *conn) exchange(ctx context.Context, enc func(dst []byte, id uint64) ([]byte, error), timeout time.Duration, hook func(*heraldpb.Frame)) (*heraldpb.Frame, error) {
	ch, err := c.send(ctx, enc, hook)
	if err != nil {
		return nil, err
	}
	return c.await(ctx, ch, timeout)
}

// await waits for the response on ch, as roundTrip does.
func (c *conn) await(ctx context.Context, ch chan *heraldpb.Frame, timeout time.Duration) (*heraldpb.Frame, error) {
	var timer <-chan time.Time
	if timeout > 0 {
		t := getTimer(timeout)
		defer putTimer(t)
		timer = t.C
	}
	select {
	case f := <-ch:
		return c.response(ch, f)
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-timer:
		return nil, c.timedOut(timeout)
	}
}

// send takes a window slot, queues the frame enc appends (under the
// connection's lock: enc must not block) and returns the channel its
// response (or nil when the connection dies) will arrive on. Pass the
// received frame to response.
func (c *conn) send(ctx context.Context, enc func(dst []byte, id uint64) ([]byte, error), hook func(*heraldpb.Frame)) (chan *heraldpb.Frame, error) {
	select {
	case c.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.dead:
		return nil, c.deadErr()
	}
	id := c.nextID.Add(1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		<-c.slots
		return nil, err
	}
	start := len(c.wbuf)
	wbuf, err := enc(c.wbuf, id)
	if err == nil && len(wbuf)-start-heraldpb.HeaderLen > c.maxFrame {
		err = fmt.Errorf("%w: request frame of %d bytes exceeds the negotiated %d", ErrRecordTooLarge, len(wbuf)-start, c.maxFrame)
		wbuf = wbuf[:start]
	}
	c.wbuf = wbuf
	if err != nil {
		c.mu.Unlock()
		<-c.slots
		return nil, err
	}
	ch := getRespChan()
	c.pending[id] = ch
	if hook != nil {
		if c.hooks == nil {
			c.hooks = make(map[uint64]func(*heraldpb.Frame))
		}
		c.hooks[id] = hook
	}
	through := len(c.wbuf) <= writeThroughMax && len(c.pending) <= writeBehind
	c.mu.Unlock()
	if through && c.wmu.TryLock() {
		err := c.flushWrites()
		c.wmu.Unlock()
		if err != nil {
			c.fail(err)
		}
	} else {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	return ch, nil
}

// response turns what arrived on a send channel into the result: the frame,
// the broker's *Error, or the connection's death.
func (c *conn) response(ch chan *heraldpb.Frame, f *heraldpb.Frame) (*heraldpb.Frame, error) {
	putRespChan(ch) // empty again, and no longer registered
	if f == nil {
		return nil, c.deadErr()
	}
	if e := f.GetError(); e != nil {
		return nil, fromWire(e)
	}
	return f, nil
}

// timedOut fails the connection after a request got no response within
// timeout: a broker that does not answer in time is presumed broken, and
// closing the connection frees the window and makes the next use redial.
func (c *conn) timedOut(timeout time.Duration) error {
	err := fmt.Errorf("%w after %s (%s)", ErrRequestTimeout, timeout, c.addr)
	c.fail(err)
	return err
}

func (c *conn) close() { c.fail(ErrClosed) }

// timers recycles the timers of requests answered: a request in flight
// costs a timer, and a new one three allocations. A timer goes back
// stopped with its channel empty, so one taken from here fires only for
// its new duration.
var timers sync.Pool

func getTimer(d time.Duration) *time.Timer {
	if t, ok := timers.Get().(*time.Timer); ok {
		t.Reset(d)
		return t
	}
	return time.NewTimer(d)
}

func putTimer(t *time.Timer) {
	if !t.Stop() {
		// (Fired and not received: with Go 1.23's timers the channel is
		// empty after Stop anyway; under GODEBUG=asynctimerchan=1 the
		// value would still be there.)
		select {
		case <-t.C:
		default:
		}
	}
	timers.Put(t)
}

// respChans recycles the response channels of completed requests. A channel
// is only put back after its one response was received, so it is empty and
// nothing else refers to it.
var respChans = sync.Pool{New: func() any { return make(chan *heraldpb.Frame, 1) }}

func getRespChan() chan *heraldpb.Frame   { return respChans.Get().(chan *heraldpb.Frame) }
func putRespChan(ch chan *heraldpb.Frame) { respChans.Put(ch) }

// pushDelivery takes a frame payload that is a Delivery push in the shape
// the broker sends (see deliveryBody): it decodes the messages with
// decodeDelivery, aliasing payload, and hands them to their subscription
// as push does, without building the heraldpb message tree. It reports
// false for any other payload, which is then decoded with
// heraldpb.DecodeFrame, and an error wrapping heraldpb.ErrMalformed for a
// malformed Delivery (the connection then fails). It runs on the reader
// goroutine and never blocks.
func (c *conn) pushDelivery(payload []byte) (bool, error) {
	body, ok := deliveryBody(payload)
	if !ok {
		return false, nil
	}
	subID, msgs, err := decodeDelivery(body)
	if err != nil {
		return true, err
	}
	c.deliver(subID, msgs)
	return true, nil
}

// deliver hands pushed messages to subscription subID; they are dropped if
// it is unknown here (ended, or cancelled).
func (c *conn) deliver(subID uint64, msgs []Delivered) {
	if ss := c.session(subID); ss != nil {
		ss.sub.deliver(ss, msgs)
	} else {
		c.log.Debug("herald: delivery for unknown subscription", "addr", c.addr, "subscription", subID, "messages", len(msgs))
	}
}

// push hands a frame with id 0 to its push target and reports whether it
// was a push. It runs on the reader goroutine and never blocks: a
// subscription buffers at most its credit window (see
// Subscription.deliver), a pending Request's channel has room for its
// one reply, and a transaction checker runs a bounded number of checks
// and drops the others (txnChecker.check). Pushes for unknown
// subscriptions, calls (ended, cancelled) or producer groups are dropped.
func (c *conn) push(f *heraldpb.Frame) bool {
	switch body := f.GetBody().(type) {
	case *heraldpb.Frame_Delivery:
		c.deliver(body.Delivery.GetSubscriptionId(), deliveredFromProto(body.Delivery.GetMessages()))
	case *heraldpb.Frame_Assignment:
		a := body.Assignment
		if ss := c.session(a.GetSubscriptionId()); ss != nil {
			ss.sub.assign(ss, a.GetAdded(), a.GetRevoked())
		}
	case *heraldpb.Frame_SubscriptionEnded:
		// The broker ended the subscription (a forced group reset, or the
		// node stopped coordinating groups): the session ends and the
		// subscription subscribes again.
		e := body.SubscriptionEnded
		if ss := c.session(e.GetSubscriptionId()); ss != nil {
			if r := e.GetReason(); r.GetCode() == heraldpb.ErrorCode_NOT_COORDINATOR {
				ss.sub.c.groups.node.Store(r.GetLeader()) // groups moved: subscribe there
			}
			ss.sub.report(fmt.Errorf("herald: subscription to %s/%s ended by the broker: %w", ss.sub.opts.Group, ss.sub.opts.Topic, fromWire(e.GetReason())))
			ss.end()
		}
	case *heraldpb.Frame_HalfCheck:
		hc := body.HalfCheck
		c.mu.Lock()
		k := c.checkers[hc.GetProducerGroup()]
		c.mu.Unlock()
		if k != nil {
			k.check(hc)
		} else {
			c.log.Debug("herald: half check for a producer group not registered here", "addr", c.addr, "group", hc.GetProducerGroup(), "id", hc.GetId())
		}
	case *heraldpb.Frame_ReplyDelivery:
		rd := body.ReplyDelivery
		c.mu.Lock()
		w := c.calls[rd.GetCorrelationId()]
		if w != nil {
			// Sent under the lock, so that once removeCall returns no
			// reply can reach the waiter any more.
			delete(c.calls, rd.GetCorrelationId())
			w.ch <- rd // buffered 1 and empty while registered
		}
		c.mu.Unlock()
		if w == nil {
			c.log.Debug("herald: reply for no pending request (late or duplicate)", "addr", c.addr, "correlation", rd.GetCorrelationId())
		}
	default:
		return false
	}
	return true
}

func (c *conn) session(id uint64) *subSession {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.subs[id]
}

// addSession makes ss the push target of subscription id; false if the
// connection is dead.
func (c *conn) addSession(id uint64, ss *subSession) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return false
	}
	c.subs[id] = ss
	return true
}

func (c *conn) removeSession(id uint64, ss *subSession) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.subs[id] == ss {
		delete(c.subs, id)
	}
}

// addCall registers w for the reply with correlation id corr; false if the
// connection is dead.
func (c *conn) addCall(corr uint64, w *callWaiter) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return false
	}
	c.calls[corr] = w
	return true
}

// removeCall unregisters corr. Once it returns, no reply is sent to its
// waiter any more.
func (c *conn) removeCall(corr uint64) {
	c.mu.Lock()
	delete(c.calls, corr)
	c.mu.Unlock()
}

// addChecker makes k the target of the check-backs of its producer group
// pushed on c; false if the connection is dead.
func (c *conn) addChecker(k *txnChecker) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return false
	}
	if c.checkers == nil {
		c.checkers = make(map[string]*txnChecker)
	}
	c.checkers[k.group] = k
	return true
}

// removeChecker undoes addChecker(k).
func (c *conn) removeChecker(k *txnChecker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.checkers[k.group] == k {
		delete(c.checkers, k.group)
	}
}
