package netio

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/encoding/protowire"

	heraldpb "github.com/heraldmq/herald/proto"
)

// ---- test router: an echo actor that can hold requests --------------------

// routed is what the test router hands its actor.
type routed struct {
	f       *heraldpb.Frame
	replyTo *actor.PID
}

// releaseHeld tells the echo actor to answer every held request.
type releaseHeld struct{}

// echoActor answers a Produce with a ProduceResponse whose BaseOffset is the
// request id; requests for topic "hold" wait for releaseHeld.
type echoActor struct{ held []routed }

func (a *echoActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case routed:
		if p := m.f.GetProduce(); p != nil && p.Topic == "hold" {
			a.held = append(a.held, m)
			return
		}
		a.answer(ctx, m)
	case releaseHeld:
		for _, r := range a.held {
			a.answer(ctx, r)
		}
		a.held = nil
	}
}

func (a *echoActor) answer(ctx actor.Context, r routed) {
	if fr := r.f.GetFetch(); fr != nil {
		// A Fetch is answered with max_bytes of record bytes: big responses
		// for the flow-control tests.
		ctx.Send(r.replyTo, &heraldpb.Frame{Id: r.f.Id, Body: &heraldpb.Frame_FetchResponse{
			FetchResponse: &heraldpb.FetchResponse{Batches: []*heraldpb.StoredBatch{{Records: make([]byte, fr.MaxBytes)}}},
		}})
		return
	}
	ctx.Send(r.replyTo, &heraldpb.Frame{Id: r.f.Id, Body: &heraldpb.Frame_ProduceResponse{
		ProduceResponse: &heraldpb.ProduceResponse{BaseOffset: int64(r.f.Id), Count: 1},
	}})
}

type testRouter struct {
	system *actor.ActorSystem
	echo   *actor.PID
	routed atomic.Int64              // requests routed so far
	last   atomic.Pointer[actor.PID] // replyTo of the last routed request
}

func (r *testRouter) Route(f *heraldpb.Frame, replyTo *actor.PID) {
	r.routed.Add(1)
	r.last.Store(replyTo)
	r.system.Root.Send(r.echo, routed{f, replyTo})
}

func (r *testRouter) release() { r.system.Root.Send(r.echo, releaseHeld{}) }

// ---- harness ---------------------------------------------------------------

type harness struct {
	t      *testing.T
	srv    *Server
	router *testRouter
	addr   string
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newHarness starts a Server on 127.0.0.1:0 with a real actor system and
// registers its shutdown with t.Cleanup. edit adjusts the config.
func newHarness(t *testing.T, edit func(*Config)) *harness {
	t.Helper()
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quietLogger() }))
	r := &testRouter{system: system}
	r.echo = system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &echoActor{} }))
	cfg := Config{Listen: "127.0.0.1:0", Multicore: true, EventLoops: 2, Logger: quietLogger(), NodeID: 3, ServerVersion: "test"}
	if edit != nil {
		edit(&cfg)
	}
	srv, err := NewServer(cfg, system, r)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.release()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		system.Shutdown()
	})
	return &harness{t: t, srv: srv, router: r, addr: srv.Addr().String()}
}

type client struct {
	t *testing.T
	c net.Conn
}

func (h *harness) dial() *client {
	h.t.Helper()
	c, err := net.DialTimeout("tcp", h.addr, 5*time.Second)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return &client{t: h.t, c: c}
}

func (c *client) sendRaw(b []byte) {
	c.t.Helper()
	if _, err := c.c.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *client) send(fs ...*heraldpb.Frame) {
	c.t.Helper()
	var b []byte
	for _, f := range fs {
		var err error
		if b, err = heraldpb.AppendFrame(b, f); err != nil {
			c.t.Fatal(err)
		}
	}
	c.sendRaw(b)
}

// read reads one frame, failing the test after 5s.
func (c *client) read() (*heraldpb.Frame, error) {
	_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hdr [4]byte
	if _, err := io.ReadFull(c.c, hdr[:]); err != nil {
		return nil, err
	}
	p := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if _, err := io.ReadFull(c.c, p); err != nil {
		return nil, err
	}
	return heraldpb.DecodeFrame(p)
}

func (c *client) mustRead() *heraldpb.Frame {
	c.t.Helper()
	f, err := c.read()
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return f
}

// expectError reads a frame and checks it is an error with code and id.
func (c *client) expectError(id uint64, code heraldpb.ErrorCode) *heraldpb.Error {
	c.t.Helper()
	f := c.mustRead()
	e := f.GetError()
	if e == nil || e.Code != code || f.Id != id {
		c.t.Fatalf("got frame %v, want error %v with id %d", f, code, id)
	}
	return e
}

// expectEOF checks the server closed the connection.
func (c *client) expectEOF() {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 1)
	if n, err := c.c.Read(b); err == nil || n != 0 || errors.Is(err, errTimeout) || isTimeout(err) {
		c.t.Fatalf("want EOF, got n=%d err=%v", n, err)
	}
}

var errTimeout = errors.New("timeout")

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func produce(id uint64, topic string) *heraldpb.Frame {
	return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: topic}}}
}

// roundTrip checks that c gets an answer to a fresh request.
func (c *client) roundTrip(id uint64) {
	c.t.Helper()
	c.send(produce(id, "t"))
	f := c.mustRead()
	if f.Id != id || f.GetProduceResponse().GetBaseOffset() != int64(id) {
		c.t.Fatalf("round trip %d: got %v", id, f)
	}
}

// waitFor polls cond until it holds or 5s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ---- tests -------------------------------------------------------------------

func TestPipelinedRequestsMatchedByID(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial()
	const n = 300
	var fs []*heraldpb.Frame
	for i := uint64(1); i <= n; i++ {
		fs = append(fs, produce(i, "t"))
	}
	c.send(fs...)
	seen := make(map[uint64]bool)
	for range n {
		f := c.mustRead()
		if f.GetProduceResponse().GetBaseOffset() != int64(f.Id) || seen[f.Id] {
			t.Fatalf("bad or duplicate response %v", f)
		}
		seen[f.Id] = true
	}
	if len(seen) != n {
		t.Fatalf("got %d distinct responses, want %d", len(seen), n)
	}
}

func TestHelloNegotiation(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxInFlight = 8 })
	c := h.dial()
	// A request before Hello is served with server defaults.
	c.roundTrip(1)
	c.send(&heraldpb.Frame{Id: 2, Body: &heraldpb.Frame_Hello{Hello: &heraldpb.HelloRequest{
		ClientId: "t", ProtocolVersion: heraldpb.ProtocolVersion, MaxFrameBytes: 1024, MaxInFlight: 100,
	}}})
	f := c.mustRead()
	hr := f.GetHelloResponse()
	if f.Id != 2 || hr == nil {
		t.Fatalf("want hello response, got %v", f)
	}
	if hr.ProtocolVersion != heraldpb.ProtocolVersion || hr.MaxFrameBytes != 1024 || hr.MaxInFlight != 8 || hr.NodeId != 3 || hr.ServerVersion != "test" {
		t.Fatalf("bad negotiation: %v", hr)
	}
	// A second Hello is refused, the connection stays.
	c.send(&heraldpb.Frame{Id: 3, Body: &heraldpb.Frame_Hello{Hello: &heraldpb.HelloRequest{ProtocolVersion: heraldpb.ProtocolVersion}}})
	c.expectError(3, heraldpb.ErrorCode_INVALID_REQUEST)
	c.roundTrip(4)
	// The negotiated frame limit is enforced.
	c.send(produce(5, string(make([]byte, 2000))))
	c.expectError(0, heraldpb.ErrorCode_FRAME_TOO_LARGE)
	c.expectEOF()
}

func TestHelloVersionMismatch(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial()
	c.send(&heraldpb.Frame{Id: 9, Body: &heraldpb.Frame_Hello{Hello: &heraldpb.HelloRequest{ProtocolVersion: 99}}})
	e := c.expectError(9, heraldpb.ErrorCode_UNSUPPORTED_VERSION)
	if e.Retriable {
		t.Fatal("UNSUPPORTED_VERSION must not be retriable")
	}
	// The connection stays usable and may retry Hello.
	c.send(&heraldpb.Frame{Id: 10, Body: &heraldpb.Frame_Hello{Hello: &heraldpb.HelloRequest{ProtocolVersion: heraldpb.ProtocolVersion}}})
	if f := c.mustRead(); f.GetHelloResponse().GetMaxInFlight() != DefaultMaxInFlight {
		t.Fatalf("got %v", f)
	}
}

func TestInFlightWindow(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxInFlight = 2 })
	c := h.dial()
	c.send(produce(1, "hold"), produce(2, "hold"), produce(3, "t"))
	e := c.expectError(3, heraldpb.ErrorCode_TOO_MANY_IN_FLIGHT)
	if !e.Retriable || e.RetryAfterMs == 0 {
		t.Fatalf("want retriable with retry-after, got %v", e)
	}
	if got := h.srv.inflight.Load(); got != 2 {
		t.Fatalf("inflight = %d, want 2", got)
	}
	h.router.release()
	got := map[uint64]bool{}
	for range 2 {
		got[c.mustRead().Id] = true
	}
	if !got[1] || !got[2] {
		t.Fatalf("held responses: %v", got)
	}
	waitFor(t, "in-flight released", func() bool { return h.srv.inflight.Load() == 0 })
	c.roundTrip(4)
	c.roundTrip(5)
}

// encodeRaw builds a frame from a raw payload.
func encodeRaw(payload []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(payload)))
	return append(b, payload...)
}

func TestBadFramesCloseOnlyTheirConnection(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxFrameBytes = 1 << 16 })
	good := h.dial()
	unknownBody := protowire.AppendTag(nil, 1, protowire.VarintType)
	unknownBody = protowire.AppendVarint(unknownBody, 7)
	unknownBody = protowire.AppendTag(unknownBody, 99, protowire.VarintType)
	unknownBody = protowire.AppendVarint(unknownBody, 1)
	respFrame, _ := heraldpb.AppendFrame(nil, &heraldpb.Frame{Id: 8, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{}}})
	errFrame, _ := heraldpb.AppendFrame(nil, heraldpb.ErrorFrame(11, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "x")))
	tooLarge := binary.BigEndian.AppendUint32(nil, 1<<30)
	cases := []struct {
		name   string
		input  []byte
		id     uint64
		code   heraldpb.ErrorCode
		reason string
	}{
		{"garbage", encodeRaw([]byte{0xff, 0xff, 0xff, 0xff}), 0, heraldpb.ErrorCode_MALFORMED_FRAME, badMalformed},
		{"oversized header", tooLarge, 0, heraldpb.ErrorCode_FRAME_TOO_LARGE, badTooLarge},
		{"oversized header with partial payload", append(tooLarge, make([]byte, 100)...), 0, heraldpb.ErrorCode_FRAME_TOO_LARGE, badTooLarge},
		{"unknown body", encodeRaw(unknownBody), 7, heraldpb.ErrorCode_UNKNOWN_REQUEST, badUnknownBody},
		{"response body", respFrame, 8, heraldpb.ErrorCode_UNKNOWN_REQUEST, badNotRequest},
		{"error body", errFrame, 11, heraldpb.ErrorCode_UNKNOWN_REQUEST, badNotRequest},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := testutil.ToFloat64(mBadFrames.WithLabelValues(tc.reason))
			c := h.dial()
			c.roundTrip(1)
			// A valid request pipelined before the bad frame may be answered
			// before the final frame, or dropped; nothing follows the final frame.
			b, _ := heraldpb.AppendFrame(nil, produce(2, "t"))
			c.sendRaw(append(b, tc.input...))
			got := map[uint64]bool{}
			var final *heraldpb.Frame
			for final == nil {
				f := c.mustRead()
				if f.GetError() != nil {
					final = f
				} else {
					got[f.Id] = true
				}
			}
			if len(got) > 1 || (len(got) == 1 && !got[2]) || final.Id != tc.id || final.GetError().Code != tc.code {
				t.Fatalf("responses %v, final %v; want error %v id %d", got, final, tc.code, tc.id)
			}
			c.expectEOF()
			if after := testutil.ToFloat64(mBadFrames.WithLabelValues(tc.reason)); after != before+1 {
				t.Fatalf("bad_frames{%s} went %v -> %v", tc.reason, before, after)
			}
			good.roundTrip(uint64(100 + i))
		})
	}
	t.Run("truncated then close", func(t *testing.T) {
		before := testutil.ToFloat64(mBadFrames.WithLabelValues(badTruncated))
		c := h.dial()
		c.roundTrip(1)
		c.sendRaw(append(binary.BigEndian.AppendUint32(nil, 100), 1, 2, 3))
		c.c.Close()
		waitFor(t, "truncated frame counted", func() bool {
			return testutil.ToFloat64(mBadFrames.WithLabelValues(badTruncated)) == before+1
		})
		good.roundTrip(200)
	})
}

func TestMaxConnections(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxConnections = 2 })
	a, b := h.dial(), h.dial()
	a.roundTrip(1)
	b.roundTrip(1)
	c := h.dial()
	c.expectError(0, heraldpb.ErrorCode_TOO_MANY_CONNECTIONS)
	c.expectEOF()
	a.roundTrip(2)
	b.c.Close()
	waitFor(t, "connection released", func() bool { return h.srv.conns.Load() == 1 })
	d := h.dial()
	d.roundTrip(1)
}

func TestIdleTimeout(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.IdleTimeout = 150 * time.Millisecond })
	idle := h.dial()
	idle.roundTrip(1)
	// A connection with a request in flight is not idle.
	busy := h.dial()
	busy.send(produce(1, "hold"))
	start := time.Now()
	idle.expectError(0, heraldpb.ErrorCode_IDLE_TIMEOUT)
	idle.expectEOF()
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("closed after %v, before the idle timeout", d)
	}
	h.router.release()
	if f := busy.mustRead(); f.Id != 1 || f.GetError() != nil {
		t.Fatalf("busy connection got %v", f)
	}
}

func TestIdleTimeoutNever(t *testing.T) {
	var cfg Config
	cfg.IdleTimeout = -1
	cfg.EnsureDefaults()
	if cfg.IdleTimeout != 0 {
		t.Fatalf("IdleTimeout = %v, want 0 (never)", cfg.IdleTimeout)
	}
	cfg.EnsureDefaults()
	if cfg.IdleTimeout != 0 {
		t.Fatal("EnsureDefaults is not idempotent")
	}
}

func TestGracefulShutdown(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial()
	c.send(produce(1, "hold"))
	waitFor(t, "request in flight", func() bool { return h.srv.inflight.Load() == 1 })

	done := make(chan error, 1)
	go func() { done <- h.srv.Shutdown(context.Background()) }()
	waitFor(t, "shutting down", h.srv.shutting.Load)

	// New requests are refused, retriably.
	c.send(produce(2, "t"))
	if e := c.expectError(2, heraldpb.ErrorCode_SHUTTING_DOWN); !e.Retriable {
		t.Fatal("SHUTTING_DOWN must be retriable")
	}
	// New connections are refused.
	n := h.dial()
	n.expectError(0, heraldpb.ErrorCode_SHUTTING_DOWN)
	n.expectEOF()
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v with a request in flight", err)
	default:
	}
	h.router.release()
	if f := c.mustRead(); f.Id != 1 || f.GetProduceResponse() == nil {
		t.Fatalf("held request answered with %v", f)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	c.expectEOF()
	if _, err := net.DialTimeout("tcp", h.addr, time.Second); err == nil {
		t.Fatal("still listening after Shutdown")
	}
}

func TestShutdownCutShort(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial()
	c.send(produce(1, "hold"))
	waitFor(t, "request in flight", func() bool { return h.srv.inflight.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := h.srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want DeadlineExceeded", err)
	}
	c.expectEOF()
	if got := h.srv.inflight.Load(); got != 0 {
		t.Fatalf("inflight = %d after the connection closed", got)
	}
}

func TestStartPortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quietLogger() }))
	srv, err := NewServer(Config{Listen: ln.Addr().String(), Logger: quietLogger()}, system, &testRouter{system: system})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err == nil {
		t.Fatal("Start succeeded on a taken port")
	}
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestConfigValidate(t *testing.T) {
	var ok Config
	ok.EnsureDefaults()
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	if ok.MaxFrameBytes != heraldpb.DefaultMaxFrameBytes || ok.MaxConnections != DefaultMaxConnections ||
		ok.IdleTimeout != DefaultIdleTimeout || ok.MaxInFlight != DefaultMaxInFlight || ok.Listen != DefaultListen {
		t.Fatalf("defaults: %+v", ok)
	}
	bad := Config{Listen: "nope", EventLoops: -1, MaxFrameBytes: 2, MaxConnections: -1, IdleTimeout: -1, MaxInFlight: -5}
	err := bad.Validate()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("got %v", err)
	}
	for _, field := range []string{"Listen", "EventLoops", "MaxFrameBytes", "MaxConnections", "IdleTimeout", "MaxInFlight"} {
		if !containsWord(err.Error(), field) {
			t.Errorf("error %q does not name %s", err, field)
		}
	}
}

func containsWord(s, w string) bool {
	for i := 0; i+len(w) <= len(s); i++ {
		if s[i:i+len(w)] == w {
			return true
		}
	}
	return false
}

var _ sync.Locker = (*sync.Mutex)(nil)
