package cluster

// Mutual TLS between nodes: the gRPC transport (protoactor remote) and
// the health endpoint both serve and dial with certificates the cluster CA
// signed, so a process without one cannot take part: its connections are
// refused during the handshake (logged, herald_cluster_tls_refused_total),
// it is never polled into the membership, and it cannot reach the
// controller to register.

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"google.golang.org/grpc/credentials"
)

// TLS configures mutual TLS between nodes.
type TLS struct {
	// Server serves the cluster port and the health endpoint; it must
	// require and verify client certificates (the cluster CA).
	Server *tls.Config
	// Client dials the peers: a node certificate, and the cluster CA as
	// roots.
	Client *tls.Config
}

var mTLSRefused = promauto.NewCounterVec(prometheus.CounterOpts{
	Name: "herald_cluster_refused_total",
	Help: "Connections to the cluster port or the health endpoint refused: in the TLS handshake (no or a bad certificate), or without the cluster secret; by listener (grpc, health).",
}, []string{"listener"})

// scheme is the health endpoint's URL scheme.
func (n *Node) scheme() string {
	if n.cfg.TLS != nil {
		return "https://"
	}
	return "http://"
}

// httpClient is the client for the peers' health endpoints.
func httpClient(t *TLS, secret []byte) *http.Client {
	c := &http.Client{Timeout: 2 * time.Second}
	if t != nil {
		c.Transport = &http.Transport{TLSClientConfig: t.Client.Clone(), ForceAttemptHTTP2: false}
	}
	if len(secret) > 0 {
		base := c.Transport
		if base == nil {
			base = http.DefaultTransport
		}
		c.Transport = secretTransport{base: base, hexSecret: hex.EncodeToString(secret)}
	}
	return c
}

// loggedCreds logs and counts the connections the gRPC server refuses in
// the handshake: an uninvited process trying to join.
type loggedCreds struct {
	credentials.TransportCredentials
	n *Node
}

func (c loggedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		mTLSRefused.WithLabelValues("grpc").Inc()
		c.n.log.Warn("refused a connection to the cluster port: TLS handshake failed (no certificate of the cluster CA?)",
			"remote", raw.RemoteAddr().String(), "err", err)
	}
	return conn, info, err
}

func (c loggedCreds) Clone() credentials.TransportCredentials {
	return loggedCreds{TransportCredentials: c.TransportCredentials.Clone(), n: c.n}
}

// tlsListener serves the health endpoint with TLS, logging refused
// handshakes.
type tlsListener struct {
	net.Listener
	cfg *tls.Config
	n   *Node
}

func (l tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &handshakeLogged{Conn: tls.Server(c, l.cfg), n: l.n}, nil
}

// handshakeLogged runs the handshake on first use and logs a refusal.
type handshakeLogged struct {
	net.Conn
	n    *Node
	done bool
}

func (h *handshakeLogged) Read(b []byte) (int, error) {
	if !h.done {
		h.done = true
		tc := h.Conn.(*tls.Conn)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			mTLSRefused.WithLabelValues("health").Inc()
			h.n.log.Warn("refused a connection to the health endpoint: TLS handshake failed (no certificate of the cluster CA?)",
				"remote", tc.RemoteAddr().String(), "err", err)
			return 0, err
		}
	}
	return h.Conn.Read(b)
}
