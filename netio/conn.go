package netio

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/auth"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"github.com/panjf2000/gnet/v2"
)

// conn is one client connection. Fields marked "loop" are touched only on
// the connection's gnet event loop; the rest are shared with the session
// actor and the ticker and are atomic or guarded by mu.
type conn struct {
	s     *Server
	gc    gnet.Conn
	pid   *actor.PID // the session actor; set before any frame is read
	token uint64     // random, for the connection's request-reply inbox

	helloDone  bool                    // loop
	login      *auth.Login             // loop: the login under way (Hello began it, SaslAuthenticate ends it)
	principal  atomic.Pointer[string]  // who the connection acts as (nil = anonymous); set on the loop, read by the session too
	authed     bool                    // loop: logged in (SCRAM, or a verified TLS client certificate)
	vhost      atomic.Pointer[string]  // the vhost Hello chose (nil = the default); set on the loop, read by the session
	vacct      atomic.Pointer[account] // the vhost's quota account (nil: the default vhost)
	uacct      atomic.Pointer[account] // the user's quota account (nil: no user quotas)
	peerLooked bool                    // loop: the TLS relay's registration was looked up (first traffic)
	peer       atomic.Pointer[PeerInfo]

	maxIn int64 // loop: largest payload the peer may send now (MaxFrameBytesBeforeHello until Hello)

	maxFrame    atomic.Int64 // negotiated largest payload, both directions
	window      atomic.Int64 // negotiated in-flight window
	lastActive  atomic.Int64 // unix nanos of the last frame in or out
	final       atomic.Bool  // the final error frame is written or queued: send nothing more
	closed      atomic.Bool  // OnClose ran
	lingerUntil atomic.Int64 // unix nanos; non-zero once half-closed after the final frame

	// Output accounting (see output.go). out and reserved are shared; the
	// rest is loop-only.
	out           atomic.Int64 // bytes handed to gnet and not yet written to the socket
	reserved      atomic.Int64 // response bytes routed requests may still add (responseEstimate)
	progress      atomic.Int64 // unix nanos: output last reached the socket, or became pending
	kernelQueue   atomic.Int64 // the socket's unsent bytes at the last tick (-1: not known)
	partialSince  atomic.Int64 // unix nanos: an incomplete frame is buffered since; 0 = none
	limitClosed   atomic.Bool  // a limit closed the connection (logged and counted once)
	enq           int64        // loop: bytes gnet accepted from every write so far
	sent          int64        // loop: of those, bytes known written to the socket
	slotAt        []int64      // loop: per written response, the enq offset where it ends
	slotHead      int          // loop: first live entry of slotAt
	iov           [][]byte     // loop: flushOut's writev buffers, reused
	deferSince    int64        // loop: unix nanos the produce at the head of the input was first deferred; 0 = none
	deferTimer    *time.Timer  // loop: wakes a deferred connection after the retry-after
	deferred      atomic.Bool  // reads are paused for admission until a response or deferTimer wakes the loop
	wokenFromLine atomic.Bool  // admitQueue.wakeNext woke it: if its frame still waits, it keeps its turn
	inLine        bool         // guarded by Server.admq.mu: in the admission line
	preAdmitted   int64        // loop: bytes deferProduce admitted for the frame it lets onFrame have
	paused        uint8        // loop: pauseOutput|pauseBudget; reads are paused while non-zero
	held          int64        // loop: inbound buffered bytes counted in Server.queued

	adm admitCounter // produce bytes admitted and not yet answered (admission.go)

	// Frames handed to writeThen and not yet to gnet, in order (output.go).
	omu    sync.Mutex
	opend  []outFrame
	ospare []outFrame // the list flushOut last emptied, reused

	mu       sync.Mutex
	pending  map[uint64]pendingReq  // request ids routed and not yet answered
	audits   map[uint64]*AuditEvent // administrative requests routed, reported with their answer (bounded by the window)
	inflight int                    // routed requests whose response has not left the outbound buffer
}

// pendingReq is what the routed requests with one id hold: how many there
// are (a client may reuse an id), the response bytes reserved for them,
// their frames' bytes counted in Server.queued, and of those the produce
// bytes counted by admission.
type pendingReq struct {
	n                  int
	est, size, produce int64
	sparseAt           int64 // unix nanos a sparse produce was admitted (latency.go); 0 = not one
}

func newConn(s *Server, gc gnet.Conn) *conn {
	c := &conn{s: s, gc: gc, pending: make(map[uint64]pendingReq), token: randomToken()}
	c.maxIn = int64(s.cfg.MaxFrameBytesBeforeHello)
	c.maxFrame.Store(int64(s.cfg.MaxFrameBytes))
	c.window.Store(int64(s.cfg.MaxInFlight))
	c.lastActive.Store(time.Now().UnixNano())
	return c
}

// randomToken is an unguessable connection token (crypto/rand).
func randomToken() uint64 {
	var b [8]byte
	_, _ = crand.Read(b[:]) // never fails on Linux (Go 1.24+ panics instead)
	return binary.LittleEndian.Uint64(b[:])
}

// onFrame handles one decoded frame on the event loop. Answers netio gives
// itself are appended to out; actionFinal means out ends with the final
// error frame.
// size is the frame's length on the wire.
func (c *conn) onFrame(gc gnet.Conn, out []byte, f *heraldpb.Frame, derr error, size int) ([]byte, gnet.Action) {
	pre := c.preAdmitted // deferProduce admitted this frame
	c.preAdmitted = 0
	if pre > 0 {
		defer func() {
			if pre > 0 { // not routed after all
				c.s.adm.cancel(&c.adm, pre)
			}
		}()
	}
	switch {
	case errors.Is(derr, heraldpb.ErrUnknownBody):
		mBadFrames.WithLabelValues(badUnknownBody).Inc()
		return c.fail(gc, out, f.GetId(), heraldpb.NewError(heraldpb.ErrorCode_UNKNOWN_REQUEST, "frame has no body this broker knows"))
	case derr != nil:
		mBadFrames.WithLabelValues(badMalformed).Inc()
		return c.fail(gc, out, 0, heraldpb.NewError(heraldpb.ErrorCode_MALFORMED_FRAME, "%v", derr))
	}
	now := time.Now().UnixNano()
	c.lastActive.Store(now)
	name, isRequest := bodyKind(f)
	if !isRequest {
		mBadFrames.WithLabelValues(badNotRequest).Inc()
		return c.fail(gc, out, f.Id, heraldpb.NewError(heraldpb.ErrorCode_UNKNOWN_REQUEST, "%s is not a request", name))
	}
	mRequests.WithLabelValues(name).Inc()
	switch b := f.Body.(type) {
	case *heraldpb.Frame_Hello:
		resp, final := c.hello(f.Id, b.Hello)
		if final != nil {
			c.audit(&AuditEvent{Action: "login", Resource: "vhost " + cutName(b.Hello.GetVhost())}, final)
			return c.fail(gc, out, f.Id, final)
		}
		return c.appendFrame(out, resp), gnet.None
	case *heraldpb.Frame_SaslAuthenticate:
		resp, final := c.authenticate(f.Id, b.SaslAuthenticate)
		if final != nil {
			c.audit(&AuditEvent{Action: "login"}, final)
			return c.fail(gc, out, f.Id, final)
		}
		return c.appendFrame(out, resp), gnet.None
	}
	ev := auditOf(f) // before enter renames
	if e := c.enter(f, int64(size)); e != nil {
		c.auditRequest(ev, f, e)
		return c.appendFrame(out, heraldpb.ErrorFrame(f.Id, e)), gnet.None
	}
	if c.s.shutting.Load() {
		return c.appendFrame(out, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_SHUTTING_DOWN, "broker is shutting down"))), gnet.None
	}
	var produce int64
	if producing(f) {
		if pre == int64(size) {
			pre = 0 // counted since deferProduce
		} else if v, wait := c.s.adm.admit(&c.adm, int64(size), now); v != admitted {
			return c.appendFrame(out, heraldpb.ErrorFrame(f.Id, c.throttled(v, wait))), gnet.None
		}
		produce = int64(size)
		mProduceInflight.Add(float64(produce))
	}
	var sparseAt int64
	if produce > 0 && c.s.adm.sparse(&c.adm, now) {
		sparseAt = now
	}
	if !c.acquire(f.Id, responseEstimate(f, c.maxFrame.Load()), int64(size), produce, sparseAt) {
		if produce > 0 {
			c.s.adm.cancel(&c.adm, produce)
			mProduceInflight.Sub(float64(produce))
		}
		e := heraldpb.NewError(heraldpb.ErrorCode_TOO_MANY_IN_FLIGHT, "connection has %d requests in flight", c.window.Load())
		e.RetryAfterMs = retryAfterInFlightMs
		return c.appendFrame(out, heraldpb.ErrorFrame(f.Id, e)), gnet.None
	}
	c.auditRequest(ev, f, nil) // routed: reported with its answer
	c.s.router.Route(f, c.pid)
	return out, gnet.None
}

// throttled is the THROTTLED error of a produce admission refused, and
// counts it.
func (c *conn) throttled(v verdict, wait time.Duration) *heraldpb.Error {
	reason := throttleFairShare
	if v == throttledLimit {
		reason = throttleLimit
	}
	mProduceThrottled.WithLabelValues(reason).Inc()
	a := c.s.adm
	e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED,
		"broker has %d produce bytes in flight (limit %d) over %d connections; this connection's %d are over its fair share",
		a.inflight.Load(), a.limit.Load(), a.active.Load(), c.adm.own.Load())
	e.RetryAfterMs = uint32((wait + time.Millisecond - 1) / time.Millisecond)
	return e
}

// hello negotiates the connection's limits (see the package doc) and
// begins its login if it asks for one. A refused login is the final error
// to answer instead.
func (c *conn) hello(id uint64, req *heraldpb.HelloRequest) (*heraldpb.Frame, *heraldpb.Error) {
	if c.helloDone {
		return heraldpb.ErrorFrame(id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "hello was already negotiated on this connection")), nil
	}
	if v := req.GetProtocolVersion(); v != heraldpb.ProtocolVersion {
		return heraldpb.ErrorFrame(id, heraldpb.NewError(heraldpb.ErrorCode_UNSUPPORTED_VERSION,
			"protocol version %d is not supported; this broker speaks %d", v, heraldpb.ProtocolVersion)), nil
	}
	if e := c.chooseVhost(req.GetVhost(), req.GetSaslMechanism() != ""); e != nil {
		return nil, e
	}
	var challenge []byte
	if mech := req.GetSaslMechanism(); mech != "" {
		if c.s.cfg.Auth == nil {
			return nil, heraldpb.NewError(heraldpb.ErrorCode_NOT_AUTHENTICATED, "this broker does not take logins (--auth off)")
		}
		l, ch, e := c.s.cfg.Auth.Begin(mech, req.GetSaslData(), c.remote())
		if e != nil {
			return nil, e
		}
		c.login, challenge = l, ch
	}
	c.helloDone = true
	// A frame limit too small for an error frame would make the connection
	// unusable: the floor is minNegotiatedFrame (or the server's, if lower).
	maxFrame := max(negotiate(req.GetMaxFrameBytes(), c.s.cfg.MaxFrameBytes), uint32(min(minNegotiatedFrame, c.s.cfg.MaxFrameBytes)))
	window := negotiate(req.GetMaxInFlight(), c.s.cfg.MaxInFlight)
	c.maxFrame.Store(int64(maxFrame))
	c.maxIn = int64(maxFrame)
	c.window.Store(int64(window))
	return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_HelloResponse{HelloResponse: &heraldpb.HelloResponse{
		ProtocolVersion: heraldpb.ProtocolVersion,
		MaxFrameBytes:   maxFrame,
		MaxInFlight:     window,
		NodeId:          c.s.cfg.NodeID,
		ServerVersion:   c.s.cfg.ServerVersion,
		IdleTimeoutMs:   uint32(min(c.s.cfg.IdleTimeout/time.Millisecond, math.MaxUint32)),
		SaslMechanisms:  c.mechanisms(),
		SaslData:        challenge,
		Principal:       c.principalNow(),
		Vhost:           c.vhostName(),
	}}}, nil
}

// vhostName is the connection's vhost ("/" for the default).
func (c *conn) vhostName() string {
	if v := c.vhost.Load(); v != nil {
		return *v
	}
	return registry.DefaultVhost
}

// chooseVhost checks Hello's vhost (it must exist) and makes it the
// connection's. The principal is let into it, and takes a slot of its
// connection quota, once known: now, or when the login Hello begins ends
// (authenticate), so that a login never finished holds no slot. A refusal
// is final.
func (c *conn) chooseVhost(vhost string, loggingIn bool) *heraldpb.Error {
	if !registry.IsDefaultVhost(vhost) {
		if !c.vhostExists(vhost) {
			return heraldpb.NewError(heraldpb.ErrorCode_VHOST_NOT_FOUND, "vhost %q does not exist", cutName(vhost))
		}
		c.vhost.Store(&vhost)
	}
	if loggingIn {
		return nil
	}
	return c.enterVhost()
}

// vhostExists reports whether vhost (not the default) exists.
func (c *conn) vhostExists(vhost string) bool {
	t := c.s.cfg.Tenancy
	if t == nil {
		return false
	}
	_, ok := t.Vhost(vhost)
	return ok
}

// enterVhost lets the connection's principal into its vhost: the ACLs
// must allow it (for a vhost other than the default), and the vhost's and
// the user's connection quotas must have room.
func (c *conn) enterVhost() *heraldpb.Error {
	if vh := c.vhostName(); !registry.IsDefaultVhost(vh) && c.vacct.Load() == nil {
		if a := c.s.cfg.Auth; a != nil {
			if e := a.MayUseVhost(c.who(), vh); e != nil {
				return e
			}
		}
		q, ok := c.s.cfg.Tenancy.Vhost(vh)
		if !ok {
			return heraldpb.NewError(heraldpb.ErrorCode_VHOST_NOT_FOUND, "vhost %q does not exist", cutName(vh))
		}
		acct, ok := c.s.quotas.hold("vhost:"+vh, q.GetMaxConnections())
		if !ok {
			return quotaExceeded("vhost:"+vh, "connections", "vhost %q has its quota of %d connections on this node", vh, q.GetMaxConnections())
		}
		c.vacct.Store(acct)
	}
	if c.authed {
		return c.holdUser()
	}
	return nil
}

// holdUser takes the logged-in user's quota account. A user at its
// connection quota is refused (final).
func (c *conn) holdUser() *heraldpb.Error {
	t := c.s.cfg.Tenancy
	if t == nil || c.uacct.Load() != nil {
		return nil
	}
	user := c.who()
	if user == "" {
		return nil
	}
	// Every logged-in connection counts, so that a quota set later
	// counts the connections already open.
	q := t.UserQuotas(user)
	acct, ok := c.s.quotas.hold("user:"+user, q.GetMaxConnections())
	if !ok {
		return quotaExceeded("user:"+user, "connections", "user %q has its quota of %d connections on this node", user, q.GetMaxConnections())
	}
	c.uacct.Store(acct)
	return nil
}

// releaseAccounts gives back the connection's quota accounts (on close).
func (c *conn) releaseAccounts() {
	for _, p := range []*atomic.Pointer[account]{&c.vacct, &c.uacct} {
		if a := p.Swap(nil); a != nil {
			c.s.quotas.release(a)
		}
	}
}

// enter prepares a request for routing: its names into the broker's
// (vhost.go), then authorization and quotas. A refusal is the error to
// answer; the connection stays open.
func (c *conn) enter(f *heraldpb.Frame, size int64) *heraldpb.Error {
	vh := c.vhostName()
	if !registry.IsDefaultVhost(vh) && !c.vhostExists(vh) {
		return heraldpb.NewError(heraldpb.ErrorCode_VHOST_NOT_FOUND, "vhost %q was deleted", vh)
	}
	if e := inVhost(vh, f); e != nil {
		return e
	}
	if ct, ok := f.Body.(*heraldpb.Frame_CreateTopic); ok {
		ct.CreateTopic.Owner = c.who() // the creator's user quotas count the topic
	}
	if e := c.authorize(f); e != nil {
		return e
	}
	return c.checkQuota(f, size)
}

// mechanisms are the SASL mechanisms Hello offers.
func (c *conn) mechanisms() []string {
	if c.s.cfg.Auth == nil {
		return nil
	}
	return c.s.cfg.Auth.Mechanisms()
}

// principalNow is the principal HelloResponse reports: none while a login
// is under way.
func (c *conn) principalNow() string {
	if c.login != nil {
		return ""
	}
	return c.who()
}

// who is the connection's principal ("" = anonymous).
func (c *conn) who() string {
	if p := c.principal.Load(); p != nil {
		return *p
	}
	return ""
}

// authenticate ends the login Hello began. A failed login is the final
// error to answer instead.
func (c *conn) authenticate(id uint64, req *heraldpb.SaslAuthenticateRequest) (*heraldpb.Frame, *heraldpb.Error) {
	if c.login == nil {
		return nil, heraldpb.NewError(heraldpb.ErrorCode_NOT_AUTHENTICATED, "SaslAuthenticate without a login under way: Hello names the mechanism and carries its first message")
	}
	l := c.login
	c.login = nil
	reply, principal, e := l.Step(req.GetSaslData())
	if e != nil {
		return nil, e
	}
	c.principal.Store(&principal)
	c.authed = true
	if c.uacct.Load() != nil { // a certificate's user before this login
		c.s.quotas.release(c.uacct.Swap(nil))
	}
	if e := c.enterVhost(); e != nil {
		return nil, e
	}
	return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_SaslAuthenticateResponse{SaslAuthenticateResponse: &heraldpb.SaslAuthenticateResponse{
		SaslData: reply, Principal: principal,
	}}}, nil
}

// authorize refuses a request the connection may not make: any before its
// login when logins are required, and those its principal is not allowed.
func (c *conn) authorize(f *heraldpb.Frame) *heraldpb.Error {
	a := c.s.cfg.Auth
	if a == nil {
		return nil
	}
	if c.login != nil {
		return heraldpb.NewError(heraldpb.ErrorCode_NOT_AUTHENTICATED, "the login is under way: send SaslAuthenticate first")
	}
	if !c.authed && a.Mode() == auth.Required {
		return heraldpb.NewError(heraldpb.ErrorCode_NOT_AUTHENTICATED, "this broker requires a login (%s, or a TLS client certificate) before any request", auth.SCRAMSHA256)
	}
	return a.Authorize(c.who(), c.vhostName(), f)
}

// remote is the client's address (the TLS relay's client for its
// connections).
func (c *conn) remote() string {
	if p := c.peer.Load(); p != nil {
		return p.Remote
	}
	if a := c.gc.RemoteAddr(); a != nil {
		return a.String()
	}
	return ""
}

// minNegotiatedFrame is the smallest frame limit Hello can negotiate.
const minNegotiatedFrame = 1024

// negotiate is the smaller of the client's value (0 = no preference) and
// the server's. Validate keeps server within uint32.
func negotiate(client uint32, server int) uint32 {
	if client == 0 || int64(client) > int64(server) {
		return uint32(server)
	}
	return client
}

func (c *conn) appendFrame(out []byte, f *heraldpb.Frame) []byte {
	b, err := heraldpb.AppendFrame(out, f)
	if err != nil {
		c.s.log.Error("encode frame", "err", err)
		return out
	}
	return b
}

// fail appends the connection's one final error frame to out.
func (c *conn) fail(gc gnet.Conn, out []byte, id uint64, e *heraldpb.Error) ([]byte, gnet.Action) {
	if !c.final.CompareAndSwap(false, true) {
		return out, gnet.Close
	}
	_, _ = gc.Discard(gc.InboundBuffered())
	return c.appendFrame(out, heraldpb.ErrorFrame(id, e)), actionFinal
}

// finish runs on the event loop after the final frame was handed to gc. If
// it is flushed, the socket is half-closed so the peer reads the frame and
// then EOF (closing outright with unread input would reset the connection
// and could destroy the frame), and the connection lingers until the peer
// closes or lingerTimeout passes. Otherwise gnet flushes what it can on
// Close.
func (c *conn) finish(gc gnet.Conn) gnet.Action {
	if gc.OutboundBuffered() > 0 || shutdownWrite(gc.Fd()) != nil {
		return gnet.Close
	}
	c.lingerUntil.Store(time.Now().Add(lingerTimeout).UnixNano())
	return gnet.None
}

// acquire takes an in-flight slot for request id, whose response may add
// est bytes of output and whose frame is size bytes (produce of them
// admitted by admission), or reports the window full.
func (c *conn) acquire(id uint64, est, size, produce, sparseAt int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if int64(c.inflight) >= c.window.Load() {
		return false
	}
	c.inflight++
	p := c.pending[id]
	p.n++
	p.est += est
	p.size += size
	p.produce += produce
	p.sparseAt = sparseAt
	if p.n > 1 {
		p.sparseAt = 0 // an id reused: which answer is whose is not known
	}
	c.pending[id] = p
	c.reserved.Add(est)
	c.s.addQueued(size)
	c.s.inflight.Add(1)
	mInflight.Inc()
	return true
}

// answer reports whether f answers a pending request, and marks it
// answered: its queued bytes are released, and it returns the output it
// had reserved, which write releases once the response is counted in the
// pending output. Its slot is released once the response is written.
func (c *conn) answer(id uint64) (ok bool, est int64) {
	c.mu.Lock()
	p, ok := c.pending[id]
	if !ok {
		c.mu.Unlock()
		return false, 0
	}
	est, size, produce := p.est/int64(p.n), p.size/int64(p.n), p.produce/int64(p.n)
	sparseAt := p.sparseAt
	if p.n == 1 {
		est, size, produce = p.est, p.size, p.produce
		delete(c.pending, id)
	} else {
		p.n--
		p.est -= est
		p.size -= size
		p.produce -= produce
		c.pending[id] = p
	}
	c.mu.Unlock()
	c.releaseRequest(size, produce, sparseAt)
	return true, est
}

// drained stops counting the bytes of pending request id, whose answer
// comes later (a partition holds it, written: ProduceDrained), as queued
// and admitted. Once per request: its answer then releases only its slot.
// An id in flight twice (a client that reuses ids) is left as it is:
// which one is drained is not known.
func (c *conn) drained(id uint64) {
	c.mu.Lock()
	p, ok := c.pending[id]
	if !ok || p.n != 1 || p.size == 0 && p.produce == 0 {
		c.mu.Unlock()
		return
	}
	size, produce := p.size, p.produce
	p.size, p.produce, p.sparseAt = 0, 0, 0 // (its wait is not the partition's latency)
	c.pending[id] = p
	c.mu.Unlock()
	mProduceDrained.Inc()
	c.releaseRequest(size, produce, 0)
}

// releaseRequest releases a request's size queued bytes and its produce
// admitted ones (a sparse produce admitted at sparseAt samples the latency).
func (c *conn) releaseRequest(size, produce, sparseAt int64) {
	c.s.releaseQueued(size)
	if produce <= 0 {
		return
	}
	now := time.Now().UnixNano()
	if sparseAt > 0 {
		c.s.adm.sampleSparse(now-sparseAt, now)
	}
	c.s.adm.release(&c.adm, produce, now)
	if c.deferred.CompareAndSwap(true, false) {
		_ = c.gc.Wake(nil) // its deferred produce may fit now
	}
	c.s.admq.wakeNext() // the freed bytes may fit the next in line
	mProduceInflight.Sub(float64(produce))
	mProduceDrainRate.Set(float64(c.s.adm.drainRate()))
}

// release frees one in-flight slot once its response is written (or can no
// longer be). Safe after releaseAll: it never goes below zero.
func (c *conn) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inflight == 0 {
		return
	}
	c.inflight--
	c.s.inflight.Add(-1)
	mInflight.Dec()
}

// releaseAll frees every slot, reservation and queued byte of a closed
// connection.
func (c *conn) releaseAll() {
	c.mu.Lock()
	c.s.inflight.Add(-int64(c.inflight))
	mInflight.Sub(float64(c.inflight))
	c.inflight = 0
	var size, produce int64
	for _, p := range c.pending {
		c.reserved.Add(-p.est)
		size += p.size
		produce += p.produce
	}
	clear(c.pending)
	c.mu.Unlock()
	c.s.releaseQueued(size)
	if produce > 0 {
		c.s.adm.cancel(&c.adm, produce)
		mProduceInflight.Sub(float64(produce))
		c.s.admq.wakeNext() // the room freed goes to the next in line
	}
}

func (c *conn) inflightCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inflight
}

// session is the connection's actor. It owns nothing but the write path:
// every *heraldpb.Frame it receives is encoded and written to the
// connection, and a response to a pending request frees its in-flight slot
// once written. Its mailbox holds at most the in-flight window of responses
// (plus any server pushes, which their own credits bound).
type session struct{ c *conn }

func (a *session) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *heraldpb.Frame:
		a.onFrame(m)
	case RawPush:
		a.onRaw(m)
	case *heraldpb.ProduceDrained:
		a.c.drained(m.FrameId)
	case *WriteThen:
		a.onFrame(m.Frame)
		if m.Done != nil {
			ctx.Send(m.Notify, m.Done)
		} else {
			ctx.Send(m.Notify, &Written{})
		}
	case *actor.Stopping:
		a.c.releaseAll()
	}
}

// WriteThen asks the session actor to write Frame (a response or a push)
// and then send Written to Notify: from then on, frames the notified actor
// writes with Server.Push go out after Frame.
type WriteThen struct {
	Frame  *heraldpb.Frame
	Notify *actor.PID
	// Done, when not nil, is sent instead of Written: the notified actor's
	// own message, so that it need not know netio's types.
	Done any
}

// Written answers WriteThen.
type Written struct{}

// RawPush is a server push already encoded as a whole frame (length prefix
// included), written as it is. Senders build it with heraldpb's encoders and
// keep it within the connection's max frame (Server.Session tells it); a
// bigger one is dropped and counted. Pushes are never responses: their
// frame id must be 0.
type RawPush []byte

func (a *session) onRaw(b RawPush) {
	c := a.c
	if c.closed.Load() || c.final.Load() || int64(len(b)-heraldpb.HeaderLen) > c.maxFrame.Load() {
		mFramesDropped.Inc()
		return
	}
	if c.write(b, false, 0) {
		c.lastActive.Store(time.Now().UnixNano())
	}
}

func (a *session) onFrame(f *heraldpb.Frame) {
	c := a.c
	isResponse, est := c.answer(f.Id)
	if isResponse {
		c.auditAnswer(f)
		if a := c.s.cfg.Auth; a != nil {
			f = a.FilterResponse(c.who(), f) // listings show only what the principal may describe
		}
		f = ofVhost(c.vhostName(), f) // the broker's names back into the vhost's
	}
	if c.closed.Load() || c.final.Load() {
		c.reserved.Add(-est)
		mFramesDropped.Inc()
		if isResponse {
			c.release()
		}
		return
	}
	buf, err := heraldpb.AppendFrame(nil, f)
	if err != nil {
		c.s.log.Error("encode response", "id", f.Id, "err", err)
		buf = errorBytes(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "response could not be encoded"))
	} else if max := c.maxFrame.Load(); int64(len(buf)-heraldpb.HeaderLen) > max {
		c.s.log.Error("response exceeds max frame", "id", f.Id, "bytes", len(buf)-heraldpb.HeaderLen, "max", max)
		buf = errorBytes(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL,
			"response of %d bytes exceeds the negotiated max frame of %d", len(buf)-heraldpb.HeaderLen, max))
	}
	if c.write(buf, isResponse, est) {
		c.lastActive.Store(time.Now().UnixNano())
		if _, ok := f.Body.(*heraldpb.Frame_FetchResponse); ok {
			c.chargeConsumed(len(buf))
		}
	}
}
