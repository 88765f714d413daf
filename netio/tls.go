package netio

// The TLS client listener. gnet has no TLS, so TLS connections are
// terminated here with crypto/tls, each in two goroutines, and their
// plaintext is relayed over loopback to the gnet listener: every request
// then takes the same path (limits, admission, flow control, routing) as
// on the plaintext listener, and a slow TLS client slows its relay the
// same way TCP would. The relay's loopback connection is registered
// (Server.tlsPeers) before it carries a byte, so the gnet side knows the
// real peer address and the verified client certificate's principal.

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/heraldmq/herald/internal/tlsconf"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// DefaultTLSHandshakeTimeout bounds a TLS handshake.
const DefaultTLSHandshakeTimeout = 10 * time.Second

var (
	mTLSConnections = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_tls_connections",
		Help: "Open client connections on the TLS listener.",
	})
	mTLSHandshakeFailures = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_tls_handshake_failures_total",
		Help: "TLS handshakes that failed, by reason (not_tls: a plaintext client; timeout; certificate: no or a bad client certificate; other).",
	}, []string{"reason"})
	mTLSRejected = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_tls_connections_rejected_total",
		Help: "TLS connections refused because the listener had max-connections open.",
	})
)

// PeerInfo is what the TLS listener knows of a client connection.
type PeerInfo struct {
	Remote    string // the client's address
	Principal string // the verified client certificate's subject ("" without one)
}

// TLSListener accepts TLS client connections and relays them to the
// Server's gnet listener.
type TLSListener struct {
	s       *Server
	ln      net.Listener
	cfg     *tls.Config
	target  string
	slots   chan struct{}
	closing atomic.Bool
	wg      sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// relayBufs are the relay's copy buffers: two per TLS connection for its
// whole life (an idle one blocks in Read holding its buffer), one TLS
// record each, so that --max-connections TLS connections hold at most
// 32 KiB each here, besides crypto/tls's own buffers.
var relayBufs = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// ListenTLS starts a TLS listener on addr whose connections are served
// like the gnet listener's. The Server must be started. cfg is used as
// given (tlsconf builds one with reloadable certificates).
func (s *Server) ListenTLS(addr string, cfg *tls.Config) (*TLSListener, error) {
	target := s.Addr()
	if target == nil {
		return nil, ErrServerClosed
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	// The relay dials the gnet listener over loopback when it listens on
	// every interface.
	t := target.(*net.TCPAddr)
	if t.IP.IsUnspecified() {
		t = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: t.Port}
	}
	l := &TLSListener{s: s, ln: ln, cfg: cfg, target: t.String(),
		slots: make(chan struct{}, s.cfg.MaxConnections), conns: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go l.accept()
	s.log.Info("listening (TLS)", "addr", ln.Addr().String())
	return l, nil
}

// Addr is the bound address.
func (l *TLSListener) Addr() net.Addr { return l.ln.Addr() }

// Close stops accepting and closes every relayed connection.
func (l *TLSListener) Close() error {
	l.closing.Store(true)
	err := l.ln.Close()
	l.mu.Lock()
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}

func (l *TLSListener) track(c net.Conn, on bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if on {
		if l.closing.Load() {
			return false
		}
		l.conns[c] = struct{}{}
	} else {
		delete(l.conns, c)
	}
	return true
}

func (l *TLSListener) accept() {
	defer l.wg.Done()
	for wait := 5 * time.Millisecond; ; {
		nc, err := l.ln.Accept()
		if err != nil {
			if l.closing.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off.
			l.s.log.Warn("TLS listener accept failed", "err", err)
			time.Sleep(wait)
			wait = min(2*wait, time.Second)
			continue
		}
		wait = 5 * time.Millisecond
		select {
		case l.slots <- struct{}{}:
		default:
			mTLSRejected.Inc()
			nc.Close()
			continue
		}
		if !l.track(nc, true) {
			<-l.slots
			nc.Close()
			return
		}
		l.wg.Add(1)
		go l.serve(nc)
	}
}

// serve runs one TLS connection: the handshake, then the relay.
func (l *TLSListener) serve(nc net.Conn) {
	defer l.wg.Done()
	defer func() { l.track(nc, false); nc.Close(); <-l.slots }()
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	tc := tls.Server(nc, l.cfg)
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTLSHandshakeTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		l.handshakeFailed(nc, err)
		return
	}
	mTLSConnections.Inc()
	defer mTLSConnections.Dec()
	var d net.Dialer
	pc, err := d.Dial("tcp", l.target)
	if err != nil {
		l.s.log.Warn("TLS relay cannot reach the client listener", "target", l.target, "err", err)
		return
	}
	defer pc.Close()
	if p, ok := pc.(*net.TCPConn); ok {
		_ = p.SetNoDelay(true)
	}
	// Registered before any byte is relayed: the gnet side looks it up on
	// the connection's first traffic.
	local := pc.LocalAddr().String()
	l.s.tlsPeers.Store(local, &PeerInfo{Remote: nc.RemoteAddr().String(), Principal: tlsconf.Subject(tc.ConnectionState())})
	defer l.s.tlsPeers.Delete(local)
	done := make(chan struct{})
	go func() {
		defer close(done)
		relay(pc, tc) // client -> broker
		if w, ok := pc.(interface{ CloseWrite() error }); ok {
			_ = w.CloseWrite() // the broker sees the client's EOF
		}
	}()
	// A client that stops reading must not hold the relay (and its
	// connection slot) for ever: each write to it has the write-stall
	// timeout the gnet side applies to its own sockets.
	relay(stallWriter{tc, l.s.cfg.WriteStallTimeout}, pc) // broker -> client
	// The broker closed (or half-closed after a final frame): say so in
	// TLS, then end the client's side.
	_ = tc.CloseWrite()
	nc.Close()
	<-done
}

// stallWriter fails a write that makes no progress for d (0 = never).
type stallWriter struct {
	c *tls.Conn
	d time.Duration
}

func (w stallWriter) Write(b []byte) (int, error) {
	if w.d > 0 {
		_ = w.c.SetWriteDeadline(time.Now().Add(w.d))
	}
	return w.c.Write(b)
}

// relay copies from src to dst until either fails.
func relay(dst io.Writer, src io.Reader) {
	b := relayBufs.Get().(*[]byte)
	defer relayBufs.Put(b)
	_, _ = io.CopyBuffer(dst, src, *b)
}

// handshakeFailed counts a failed handshake; a plaintext Herald client
// gets a final error frame it can read.
func (l *TLSListener) handshakeFailed(nc net.Conn, err error) {
	var rh tls.RecordHeaderError
	switch {
	case errors.As(err, &rh) && rh.Conn != nil:
		mTLSHandshakeFailures.WithLabelValues("not_tls").Inc()
		_ = rh.Conn.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = rh.Conn.Write(errorBytes(0, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST,
			"this port is the TLS listener: connect with TLS (client.WithTLS, --tls-ca), or to the plaintext listener")))
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		mTLSHandshakeFailures.WithLabelValues("timeout").Inc()
	case isCertificateError(err):
		mTLSHandshakeFailures.WithLabelValues("certificate").Inc()
	default:
		mTLSHandshakeFailures.WithLabelValues("other").Inc()
	}
	l.s.log.Debug("TLS handshake failed", "remote", nc.RemoteAddr().String(), "err", err)
}

func isCertificateError(err error) bool {
	var ae tls.AlertError
	var ce *tls.CertificateVerificationError
	return errors.As(err, &ae) || errors.As(err, &ce) || strings.Contains(err.Error(), "certificate")
}
