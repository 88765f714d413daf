package netio

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/internal/dispatch"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/panjf2000/gnet/v2"
	"github.com/panjf2000/gnet/v2/pkg/logging"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Router hands a decoded request to the actors. It is called on a gnet event
// loop and must not block. replyTo is the connection's session actor: the
// actor that handles the request answers by sending a *heraldpb.Frame with
// the same id to replyTo (ctx.Send, ctx.Respond or system.Root.Send). Every
// routed request must be answered exactly once, or it holds a slot of the
// connection's in-flight window until the connection closes.
type Router interface {
	Route(f *heraldpb.Frame, replyTo *actor.PID)
}

const (
	// lingerTimeout bounds how long a connection that has sent its final
	// error frame waits for the peer to close before it is closed anyway.
	lingerTimeout = 2 * time.Second
	// retryAfterInFlightMs is the retry hint of TOO_MANY_IN_FLIGHT.
	retryAfterInFlightMs = 5
	// shutdownPoll is how often Shutdown checks the in-flight count.
	shutdownPoll = 5 * time.Millisecond
)

// Server is the client-protocol server. Create it with NewServer, then Start
// it once and Shutdown it once. Its methods are safe for concurrent use.
type Server struct {
	quotas quotas // the vhosts' and users' accounts (quota.go)
	cfg    Config
	system *actor.ActorSystem
	router Router
	log    *slog.Logger

	startMu  sync.Mutex
	started  bool
	eng      gnet.Engine // set in OnBoot, before booted is closed
	addr     net.Addr    // set in OnBoot, before booted is closed
	booted   chan struct{}
	runDone  chan struct{}
	runErr   error // valid after runDone is closed
	shutting atomic.Bool

	conns    atomic.Int64 // open accepted connections
	inflight atomic.Int64 // routed requests whose response has not left its outbound buffer
	out      atomic.Int64 // pending output of every connection (conn.out)
	queued   atomic.Int64 // bytes counted against MaxQueuedRequestBytes
	adm      *admission   // produce admission (MaxInFlightProduceBytes)
	admq     admitQueue   // connections waiting for produce room, in order

	budgetMu     sync.Mutex
	budgetPaused map[*conn]struct{} // connections paused for the budget
	waking       atomic.Bool        // wakeBudgetPaused is running

	regMu    sync.Mutex
	registry map[*conn]struct{}
	sessions sync.Map // session actor id -> *conn, for Session
	tlsPeers sync.Map // the TLS relay's local address -> *PeerInfo (tls.go)
}

// Push writes an encoded server push (length prefix included, frame id 0)
// straight to connection id, skipping its session actor: for senders that
// need no ordering with the connection's responses. It reports false when
// the connection is gone, the frame exceeds its max frame, or the
// connection's pending output would pass MaxPendingOutputHard (which closes
// it); the frame is then dropped and counted. Push never refuses for the
// soft bound: senders ask PushRoom first and hold their pushes while it is
// <= 0.
// SendRaw writes an encoded push through the session actor conn (a
// RawPush): in order with the responses that actor writes.
func (s *Server) SendRaw(conn *actor.PID, frame []byte) { s.system.Root.Send(conn, RawPush(frame)) }

// WriteThen has the session actor conn write f, then send done to notify
// (see the WriteThen message).
func (s *Server) WriteThen(conn *actor.PID, f *heraldpb.Frame, notify *actor.PID, done any) {
	s.system.Root.Send(conn, &WriteThen{Frame: f, Notify: notify, Done: done})
}

func (s *Server) Push(id string, frame []byte) bool {
	v, ok := s.sessions.Load(id)
	if !ok {
		return false
	}
	c := v.(*conn)
	if c.closed.Load() || c.final.Load() || int64(len(frame)-heraldpb.HeaderLen) > c.maxFrame.Load() {
		mFramesDropped.Inc()
		return false
	}
	if !c.write(frame, false, 0) {
		return false
	}
	c.lastActive.Store(time.Now().UnixNano())
	c.chargeConsumed(len(frame)) // pushes count against the consume rates
	return true
}

// Session finds a live connection by its session actor's id (the id of the
// replyTo PID given to the Router). It returns the session PID and the
// connection's negotiated max frame payload.
func (s *Server) Session(id string) (pid *actor.PID, maxFrame int, ok bool) {
	c := s.liveConn(id)
	if c == nil {
		return nil, 0, false
	}
	return c.pid, int(c.maxFrame.Load()), true
}

// Inbox names live connection id for request-reply replies: its session
// id and a random token, so that a client cannot push replies to another
// client's connection by guessing its (sequential) session id. "" if gone.
func (s *Server) Inbox(id string) string {
	c := s.liveConn(id)
	if c == nil {
		return ""
	}
	return id + "~" + strconv.FormatUint(c.token, 36)
}

// InboxSession resolves an inbox from Inbox to its connection's session id,
// if the connection is still open and the token matches.
func (s *Server) InboxSession(inbox string) (id string, ok bool) {
	id, tok, found := strings.Cut(inbox, "~")
	if !found {
		return "", false
	}
	c := s.liveConn(id)
	if c == nil || strconv.FormatUint(c.token, 36) != tok {
		return "", false
	}
	return id, true
}

// RemoteAddr is the peer address of live connection id (the client's,
// for a connection of the TLS listener), or "".
func (s *Server) RemoteAddr(id string) string {
	if c := s.liveConn(id); c != nil {
		if p := c.peer.Load(); p != nil {
			return p.Remote
		}
		if a := c.gc.RemoteAddr(); a != nil {
			return a.String()
		}
	}
	return ""
}

// Peer is what is known of live connection id's client: its address, and
// over TLS the verified client certificate's principal.
func (s *Server) Peer(id string) (PeerInfo, bool) {
	c := s.liveConn(id)
	if c == nil {
		return PeerInfo{}, false
	}
	if p := c.peer.Load(); p != nil {
		return *p, true
	}
	if a := c.gc.RemoteAddr(); a != nil {
		return PeerInfo{Remote: a.String()}, true
	}
	return PeerInfo{}, true
}

func (s *Server) liveConn(id string) *conn {
	v, ok := s.sessions.Load(id)
	if !ok {
		return nil
	}
	c := v.(*conn)
	if c.closed.Load() || c.final.Load() {
		return nil
	}
	return c
}

// NewServer checks cfg (after EnsureDefaults) and returns a Server that is
// not yet listening. system spawns the session actors; router receives the
// requests.
func NewServer(cfg Config, system *actor.ActorSystem, router Router) (*Server, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if system == nil {
		return nil, fmt.Errorf("%w: nil actor system", ErrInvalidConfig)
	}
	if router == nil {
		return nil, fmt.Errorf("%w: nil router", ErrInvalidConfig)
	}
	return &Server{
		cfg:      cfg,
		system:   system,
		router:   router,
		log:      cfg.Logger.With("component", "netio"),
		booted:   make(chan struct{}),
		runDone:  make(chan struct{}),
		registry: make(map[*conn]struct{}),
		adm:      newAdmission(cfg.MaxInFlightProduceBytes, cfg.ProduceLatencyTarget),

		budgetPaused: make(map[*conn]struct{}),
	}, nil
}

// Start binds Listen and runs the gnet engine in the background. It returns
// once the server accepts connections, or the bind error (for example when
// the port is taken). It may be called once.
func (s *Server) Start() error {
	s.startMu.Lock()
	defer s.startMu.Unlock()
	if s.shutting.Load() {
		return ErrServerClosed
	}
	if s.started {
		return ErrAlreadyStarted
	}
	s.started = true
	opts := []gnet.Option{
		gnet.WithMulticore(s.cfg.Multicore),
		gnet.WithNumEventLoop(s.cfg.EventLoops),
		gnet.WithTicker(true),
		// A restarted broker rebinds its port while the old connections
		// are still in TIME_WAIT.
		gnet.WithReuseAddr(true),
		gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithLogger(gnetLogger{s.log}),
	}
	h := &handler{s: s}
	go func() {
		s.runErr = gnet.Run(h, "tcp://"+s.cfg.Listen, opts...)
		close(s.runDone)
	}()
	select {
	case <-s.booted:
		s.log.Info("listening", "addr", s.addr.String())
		return nil
	case <-s.runDone:
		if s.runErr == nil {
			s.runErr = errors.New("herald: gnet engine stopped before boot")
		}
		return fmt.Errorf("netio: listen %s: %w", s.cfg.Listen, s.runErr)
	}
}

// Addr is the bound address, with the real port when Listen used port 0.
// It is nil before Start returns successfully.
func (s *Server) Addr() net.Addr {
	select {
	case <-s.booted:
		return s.addr
	default:
		return nil
	}
}

// Shutdown stops the server gracefully: new connections get a final
// SHUTTING_DOWN frame and are closed, new requests are answered with
// SHUTTING_DOWN, and it waits until every routed request has been answered
// and its response written. Then it stops the gnet engine, which closes every
// connection and stops their session actors. If ctx ends first, it stops the
// engine anyway and returns ctx's error. Shutdown of a server that never
// started returns nil.
func (s *Server) Shutdown(ctx context.Context) error {
	s.startMu.Lock()
	s.shutting.Store(true)
	started := s.started
	s.startMu.Unlock()
	if !started {
		return nil
	}
	select {
	case <-s.booted:
	case <-s.runDone:
		return nil
	}

	var ctxErr error
	tick := time.NewTicker(shutdownPoll)
	for s.inflight.Load() > 0 && ctxErr == nil {
		select {
		case <-ctx.Done():
			ctxErr = ctx.Err()
		case <-tick.C:
		}
	}
	tick.Stop()

	// Engine.Stop only signals and polls; the engine stops whatever ctx
	// says, so give it its own bound when ctx is already spent.
	stopCtx := ctx
	if ctxErr != nil {
		var cancel context.CancelFunc
		stopCtx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
	}
	if err := s.eng.Stop(stopCtx); err != nil && ctxErr == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		s.log.Warn("gnet stop", "err", err)
	}
	select {
	case <-s.runDone:
	case <-stopCtx.Done():
		if ctxErr == nil {
			ctxErr = stopCtx.Err()
		}
	}
	// OnClose stopped the session of every connection gnet closed; stop any
	// that remain (the engine was cut short).
	s.regMu.Lock()
	for c := range s.registry {
		s.system.Root.Stop(c.pid)
	}
	s.regMu.Unlock()
	return ctxErr
}

// handler implements gnet.EventHandler. Its callbacks run on gnet event
// loops (OnTick on the engine's ticker goroutine).
type handler struct {
	gnet.BuiltinEventEngine
	s *Server
}

func (h *handler) OnBoot(eng gnet.Engine) gnet.Action {
	s := h.s
	s.eng = eng
	addr, err := boundAddr(eng)
	if err != nil {
		s.log.Error("cannot read bound address", "err", err)
		return gnet.Shutdown
	}
	s.addr = addr
	close(s.booted)
	return gnet.None
}

// boundAddr reads the listener's real address from a duplicate of its fd.
func boundAddr(eng gnet.Engine) (net.Addr, error) {
	fd, err := eng.Dup()
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "herald-listener")
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	return ln.Addr(), nil
}

func (h *handler) OnOpen(gc gnet.Conn) ([]byte, gnet.Action) {
	s := h.s
	if s.shutting.Load() {
		mConnectionsRejected.WithLabelValues(reasonShuttingDown).Inc()
		return errorBytes(0, heraldpb.NewError(heraldpb.ErrorCode_SHUTTING_DOWN, "broker is shutting down")), gnet.Close
	}
	if n := s.conns.Add(1); n > int64(s.cfg.MaxConnections) {
		s.conns.Add(-1)
		mConnectionsRejected.WithLabelValues(reasonMaxConnections).Inc()
		return errorBytes(0, heraldpb.NewError(heraldpb.ErrorCode_TOO_MANY_CONNECTIONS,
			"broker is at its limit of %d connections", s.cfg.MaxConnections)), gnet.Close
	}
	c := newConn(s, gc)
	c.pid = s.system.Root.SpawnPrefix(actor.PropsFromProducer(func() actor.Actor { return &session{c: c} }, actor.WithDispatcher(dispatch.Shared())), "netio/session")
	gc.SetContext(c)
	s.regMu.Lock()
	s.registry[c] = struct{}{}
	s.regMu.Unlock()
	s.sessions.Store(c.pid.Id, c)
	mConnections.Inc()
	mConnectionsTotal.Inc()
	return nil, gnet.None
}

func (h *handler) OnClose(gc gnet.Conn, _ error) gnet.Action {
	c, ok := gc.Context().(*conn)
	if !ok {
		return gnet.None // refused in OnOpen
	}
	gc.SetContext(nil)
	s := h.s
	c.releaseAccounts()
	if c.deferTimer != nil {
		c.deferTimer.Stop()
	}
	if gc.InboundBuffered() > 0 && !c.final.Load() && c.deferSince == 0 {
		mBadFrames.WithLabelValues(badTruncated).Inc()
	}
	c.closed.Store(true)
	// Output gnet accepted and did not write is dropped with the
	// connection (gnet tries once more after OnClose, but it is no longer
	// ours to count); writes still queued uncount themselves when gnet
	// calls them back with an error.
	c.sync(gc)
	c.subOut(c.enq - c.sent)
	c.enq = c.sent
	c.setHeld(0)
	if c.paused != 0 {
		c.paused = 0
		mPausedConns.Dec()
		s.budgetMu.Lock()
		delete(s.budgetPaused, c)
		s.budgetMu.Unlock()
	}
	c.releaseAll()
	s.regMu.Lock()
	delete(s.registry, c)
	s.regMu.Unlock()
	s.sessions.Delete(c.pid.Id)
	s.conns.Add(-1)
	mConnections.Dec()
	// Poison, not Stop: responses already queued are processed (and
	// dropped, counted) before the session stops.
	s.system.Root.Poison(c.pid)
	return gnet.None
}

// OnTraffic serves the connection's buffered frames (see serve). gnet also
// calls it for Wake, which netio uses to re-examine a paused connection on
// its event loop.
func (h *handler) OnTraffic(gc gnet.Conn) gnet.Action {
	c, ok := gc.Context().(*conn)
	if !ok {
		_, _ = gc.Discard(gc.InboundBuffered())
		return gnet.None
	}
	if !c.peerLooked {
		// A TLS relay registers its connection before relaying a byte.
		c.peerLooked = true
		if a := gc.RemoteAddr(); a != nil {
			if p, ok := h.s.tlsPeers.Load(a.String()); ok {
				pi := p.(*PeerInfo)
				c.peer.Store(pi)
				if pi.Principal != "" && h.s.cfg.Auth != nil {
					// A verified client certificate logs the connection
					// in as its subject (a SCRAM login may replace it).
					c.principal.Store(&pi.Principal)
					c.authed = true
					h.s.cfg.Auth.CertificateLogin()
				}
			}
		}
	}
	c.sync(gc)
	return h.s.serve(c, gc)
}

// OnOutboundWritten (the patched gnet's OutboundHandler) runs when buffered
// output reached the socket: slots free, and a connection paused because
// its output was full may go on.
func (h *handler) OnOutboundWritten(gc gnet.Conn, _ int) {
	if c, ok := gc.Context().(*conn); ok {
		c.afterWrite(gc)
	}
}

// serve, on the event loop, splits and decodes every whole frame buffered
// on gc and hands each off, while the connection's output has room; then it
// pauses or resumes reading (output, budget) and keeps the frame deadline.
// Answers netio gives itself are written with gc.Write.
func (s *Server) serve(c *conn, gc gnet.Conn) gnet.Action {
	if c.final.Load() {
		// After the final frame: discard until the peer closes.
		_, _ = gc.Discard(gc.InboundBuffered())
		c.setHeld(0)
		c.partialSince.Store(0)
		return gnet.None
	}
	if c.paused&pauseThrottle != 0 {
		if c.deferred.Load() {
			return gnet.None // its produce still waits for its turn
		}
		c.unpause(gc, pauseThrottle)
	}
	var out []byte
	action := gnet.None
	consumed := false
	full, deferred := false, false
	for action == gnet.None {
		if full = c.outputFull(); full {
			break
		}
		hdr, err := gc.Peek(heraldpb.HeaderLen)
		if err != nil {
			break // fewer than HeaderLen bytes buffered
		}
		_, _, err = heraldpb.SplitFrame(hdr, int(c.maxIn))
		if errors.Is(err, heraldpb.ErrFrameTooLarge) {
			mBadFrames.WithLabelValues(badTooLarge).Inc()
			if !c.helloDone && c.maxIn < c.maxFrame.Load() {
				err = fmt.Errorf("%w (before Hello)", err)
			}
			out, action = c.fail(gc, out, 0, heraldpb.NewError(heraldpb.ErrorCode_FRAME_TOO_LARGE, "%v", err))
			break
		}
		total := heraldpb.HeaderLen + int(uint32(hdr[0])<<24|uint32(hdr[1])<<16|uint32(hdr[2])<<8|uint32(hdr[3]))
		if gc.InboundBuffered() < total {
			break
		}
		buf, err := gc.Peek(total)
		if err != nil {
			break
		}
		payload, n, err := heraldpb.SplitFrame(buf, int(c.maxIn))
		if err != nil {
			break // cannot happen: the header was checked above
		}
		if c.deferProduce(gc, payload, n) {
			deferred = true
			break
		}
		f, derr := heraldpb.DecodeFrame(payload)
		_, _ = gc.Discard(n)
		consumed = true
		out, action = c.onFrame(gc, out, f, derr, n)
	}
	if len(out) > 0 {
		c.writeLoop(gc, out)
	}
	if action == actionFinal {
		return c.finish(gc)
	}
	if action != gnet.None || c.closed.Load() {
		return action
	}
	if full {
		c.pause(gc, pauseOutput)
	} else {
		c.unpause(gc, pauseOutput)
	}
	buffered := int64(gc.InboundBuffered())
	c.setHeld(buffered)
	switch {
	case buffered == 0 || full || deferred:
		// Nothing incomplete, or whole frames wait for output room: the
		// client is not slow to send (WriteStallTimeout covers the rest).
		c.partialSince.Store(0)
	case consumed || c.partialSince.Load() == 0:
		c.partialSince.Store(time.Now().UnixNano())
	}
	if buffered > 0 && s.queued.Load() >= s.cfg.MaxQueuedRequestBytes {
		c.pause(gc, pauseBudget)
	} else if s.queued.Load() < s.cfg.MaxQueuedRequestBytes {
		c.unpause(gc, pauseBudget)
	}
	return gnet.None
}

// actionFinal is an internal marker: the final error frame is in out, and
// the connection must be finished (half-closed, lingered) once it is written.
const actionFinal gnet.Action = -1

// OnTick enforces the idle timeout and ends lingering connections. It runs
// on the engine's ticker goroutine, so it touches connections only through
// atomics and gnet's concurrency-safe calls.
func (h *handler) OnTick() (time.Duration, gnet.Action) {
	s := h.s
	now := time.Now().UnixNano()
	idle := s.cfg.IdleTimeout
	stall, frameTimeout := int64(s.cfg.WriteStallTimeout), int64(s.cfg.FrameTimeout)
	s.regMu.Lock()
	for c := range s.registry {
		if until := c.lingerUntil.Load(); until != 0 {
			if now > until {
				_ = c.gc.Close()
			}
			continue
		}
		if stall > 0 && c.out.Load() > 0 {
			// gnet learns that the socket drained only once the kernel
			// reports it writable, after about a third of its send buffer
			// (up to MiBs) is free: a slow, steady reader would look
			// stalled. The kernel's own unsent count moving down is
			// progress too.
			if q, ok := unsentBytes(c.gc.Fd()); ok {
				if prev := c.kernelQueue.Swap(int64(q)); q < int(prev) {
					c.progress.Store(now)
				}
			}
		}
		if stall > 0 && c.out.Load() > 0 && now-c.progress.Load() > stall {
			c.closeFor(reasonWriteStall, "pending output made no progress",
				"pending_bytes", c.out.Load(), "timeout", s.cfg.WriteStallTimeout)
			continue
		}
		if since := c.partialSince.Load(); frameTimeout > 0 && since != 0 && now-since > frameTimeout && !c.final.Load() {
			c.failFrameTimeout()
			continue
		}
		if idle <= 0 || c.final.Load() || now-c.lastActive.Load() < int64(idle) || c.inflightCount() > 0 {
			continue
		}
		c.failAsync(heraldpb.NewError(heraldpb.ErrorCode_IDLE_TIMEOUT, "no frame for %v", idle))
	}
	s.regMu.Unlock()
	// A safety net for wake-ups that raced with a pause.
	if s.queued.Load() < s.cfg.MaxQueuedRequestBytes {
		s.wakeBudgetPaused()
	}
	return tickInterval(min(nonZero(idle), nonZero(s.cfg.WriteStallTimeout), nonZero(s.cfg.FrameTimeout))), gnet.None
}

// nonZero maps 0 (never) to a duration longer than any timeout.
func nonZero(d time.Duration) time.Duration {
	if d <= 0 {
		return time.Duration(math.MaxInt64)
	}
	return d
}

// tickInterval checks connections about four times per shortest timeout,
// at most once per second and at least every 10ms.
func tickInterval(idle time.Duration) time.Duration {
	d := time.Second
	if idle > 0 && idle/4 < d {
		d = idle / 4
	}
	return max(d, 10*time.Millisecond)
}

// requestTypes maps each Frame body field whose message is named
// "...Request" to its field name, the requests_total label.
var (
	bodyOneof    = (&heraldpb.Frame{}).ProtoReflect().Descriptor().Oneofs().ByName("body")
	requestTypes = func() map[protoreflect.FieldNumber]string {
		m := make(map[protoreflect.FieldNumber]string)
		fields := bodyOneof.Fields()
		for i := 0; i < fields.Len(); i++ {
			fd := fields.Get(i)
			if fd.Message() != nil && strings.HasSuffix(string(fd.Message().Name()), "Request") {
				m[fd.Number()] = string(fd.Name())
			}
		}
		return m
	}()
)

// bodyKind returns the body's oneof field name and whether it is a request.
func bodyKind(f *heraldpb.Frame) (name string, isRequest bool) {
	fd := f.ProtoReflect().WhichOneof(bodyOneof)
	if fd == nil {
		return "", false
	}
	name, isRequest = requestTypes[fd.Number()]
	if !isRequest {
		name = string(fd.Name())
	}
	return name, isRequest
}

// errorBytes encodes an error frame. Encoding an Error cannot fail.
func errorBytes(id uint64, e *heraldpb.Error) []byte {
	b, _ := heraldpb.AppendFrame(nil, heraldpb.ErrorFrame(id, e))
	return b
}

// gnetLogger routes gnet's logs to slog.
type gnetLogger struct{ l *slog.Logger }

func (g gnetLogger) Debugf(format string, args ...any) { g.l.Debug(fmt.Sprintf(format, args...)) }
func (g gnetLogger) Infof(format string, args ...any)  { g.l.Debug(fmt.Sprintf(format, args...)) }
func (g gnetLogger) Warnf(format string, args ...any)  { g.l.Warn(fmt.Sprintf(format, args...)) }
func (g gnetLogger) Errorf(format string, args ...any) { g.l.Error(fmt.Sprintf(format, args...)) }
func (g gnetLogger) Fatalf(format string, args ...any) { g.l.Error(fmt.Sprintf(format, args...)) }

var _ logging.Logger = gnetLogger{}
