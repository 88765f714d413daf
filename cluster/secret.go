package cluster

// The cluster secret: when TLS between nodes is off, every gRPC call
// between nodes and every request to the health endpoint carries the
// shared secret (Config.Secret), and a node refuses those that do not, so
// that a process that does not know it cannot join. The secret travels
// in the clear: on an untrusted network use mutual TLS (tls.go) instead,
// or as well.

import (
	"context"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"sync"
	"time"

	"github.com/labstack/echo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// secretHeader carries the secret, hex-encoded, in gRPC metadata and in
// HTTP requests to the health endpoint.
const secretHeader = "herald-cluster-secret"

// MinSecretBytes is the shortest cluster secret accepted.
const MinSecretBytes = 16

// secretCreds adds the secret to every gRPC call.
type secretCreds struct{ hexSecret string }

func (s secretCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{secretHeader: s.hexSecret}, nil
}

func (secretCreds) RequireTransportSecurity() bool { return false }

// secretCheck verifies the secret of incoming calls and requests, and
// logs refusals at most once a second.
type secretCheck struct {
	want []byte // hex-encoded
	n    *Node

	mu     sync.Mutex
	logged time.Time
}

func newSecretCheck(secret []byte, n *Node) *secretCheck {
	return &secretCheck{want: []byte(hex.EncodeToString(secret)), n: n}
}

func (s *secretCheck) ok(got string) bool {
	return subtle.ConstantTimeCompare([]byte(got), s.want) == 1
}

func (s *secretCheck) refused(listener, remote string) {
	mTLSRefused.WithLabelValues(listener).Inc()
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.logged) < time.Second {
		return
	}
	s.logged = time.Now()
	s.n.log.Warn("refused a connection without the cluster secret", "listener", listener, "remote", remote)
}

func (s *secretCheck) grpcOK(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(secretHeader); len(v) == 1 && s.ok(v[0]) {
		return nil
	}
	remote := ""
	if p, ok := peer.FromContext(ctx); ok {
		remote = p.Addr.String()
	}
	s.refused("grpc", remote)
	return status.Error(codes.Unauthenticated, "herald: the cluster secret is missing or wrong")
}

// serverOptions are the gRPC server's interceptors that check the secret.
func (s *secretCheck) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := s.grpcOK(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := s.grpcOK(ss.Context()); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	}
}

// middleware refuses health-endpoint requests without the secret.
func (s *secretCheck) middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if !s.ok(c.Request().Header.Get(secretHeader)) {
			s.refused("health", c.Request().RemoteAddr)
			return c.NoContent(http.StatusUnauthorized)
		}
		return next(c)
	}
}

// secretTransport adds the secret to requests to the peers' health
// endpoints.
type secretTransport struct {
	base      http.RoundTripper
	hexSecret string
}

func (t secretTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(secretHeader, t.hexSecret)
	return t.base.RoundTrip(r)
}
