// Package tlsconf builds Herald's TLS configurations from PEM files: the
// client listener's (TLS 1.3, optional client-certificate verification),
// with certificates that reload without a restart, and the clients'. It
// also writes throwaway development certificates (WriteDevCerts).
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// ServerFiles names the PEM files of a TLS listener.
type ServerFiles struct {
	Cert, Key string // the server's certificate chain and private key
	// ClientCA, when set, makes the listener require a client
	// certificate signed by one of its certificates.
	ClientCA string
}

// Server is a TLS listener's configuration whose files can be read again
// (Reload) while connections are served: a handshake uses the files as
// they were at the last successful load.
type Server struct {
	files ServerFiles
	log   *slog.Logger
	cur   atomic.Pointer[tls.Config]

	mu      sync.Mutex
	modTime map[string]time.Time // the files' mtimes at the last load
}

// NewServer loads files; an error names the file at fault.
func NewServer(files ServerFiles, log *slog.Logger) (*Server, error) {
	if files.Cert == "" || files.Key == "" {
		return nil, errors.New("tls: a certificate and its key are both needed")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{files: files, log: log}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Config is the tls.Config to serve with: each handshake takes the
// configuration loaded last.
func (s *Server) Config() *tls.Config { return s.ConfigWithALPN() }

// ConfigWithALPN is Config offering the application protocols protos
// (gRPC needs "h2").
func (s *Server) ConfigWithALPN(protos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: protos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := s.cur.Load().Clone()
			c.NextProtos = protos
			return c, nil
		},
	}
}

// PeerClient is the configuration to dial a peer that serves with the
// same files (the nodes of a cluster): it presents the certificate loaded
// last and trusts the CA bundle (ClientCA) as it was at the start.
// Leaf is the certificate in use, parsed (nil if it does not parse).
func (s *Server) Leaf() *x509.Certificate {
	c := s.cur.Load()
	if c == nil || len(c.Certificates) == 0 || len(c.Certificates[0].Certificate) == 0 {
		return nil
	}
	leaf, err := x509.ParseCertificate(c.Certificates[0].Certificate[0])
	if err != nil {
		return nil
	}
	return leaf
}

func (s *Server) PeerClient() (*tls.Config, error) {
	if s.files.ClientCA == "" {
		return nil, errors.New("tls: a peer configuration needs the CA bundle")
	}
	pool, err := loadPool(s.files.ClientCA)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    pool,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &s.cur.Load().Certificates[0], nil
		},
	}, nil
}

// Reload reads the files again. On any error the configuration in use is
// kept, and the error says which file is at fault.
func (s *Server) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	mods := map[string]time.Time{}
	for _, f := range []string{s.files.Cert, s.files.Key, s.files.ClientCA} {
		if f == "" {
			continue
		}
		st, err := os.Stat(f)
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		mods[f] = st.ModTime()
	}
	cert, err := tls.LoadX509KeyPair(s.files.Cert, s.files.Key)
	if err != nil {
		return fmt.Errorf("tls: certificate %s with key %s: %w", s.files.Cert, s.files.Key, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}
	if s.files.ClientCA != "" {
		pool, err := loadPool(s.files.ClientCA)
		if err != nil {
			return err
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	s.cur.Store(cfg)
	s.modTime = mods
	return nil
}

// Changed reports whether any of the files changed since the last load.
func (s *Server) Changed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for f, t := range s.modTime {
		if st, err := os.Stat(f); err == nil && !st.ModTime().Equal(t) {
			return true
		}
	}
	return false
}

// ReloadAndLog reloads and logs the outcome (why: what asked for it).
func (s *Server) ReloadAndLog(why string) {
	if err := s.Reload(); err != nil {
		s.log.Error("reloading TLS certificates failed; the previous ones stay in use", "why", why, "err", err)
		return
	}
	s.log.Info("TLS certificates reloaded", "why", why, "cert", s.files.Cert)
}

// ClientFiles names the PEM files of a client: the CA bundle that signs
// the brokers' certificates (empty: the system's roots), and a client
// certificate and key for brokers that require one.
type ClientFiles struct {
	CA, Cert, Key string
	// ServerName overrides the name checked against the broker's
	// certificate (default: the host of the address dialled).
	ServerName string
}

// Client returns the client configuration for files.
func Client(files ClientFiles) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, ServerName: files.ServerName}
	if files.CA != "" {
		pool, err := loadPool(files.CA)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	switch {
	case files.Cert != "" && files.Key != "":
		cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
		if err != nil {
			return nil, fmt.Errorf("tls: certificate %s with key %s: %w", files.Cert, files.Key, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case files.Cert != "" || files.Key != "":
		return nil, errors.New("tls: a client certificate and its key are both needed")
	}
	return cfg, nil
}

func loadPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls: %s holds no PEM certificate", file)
	}
	return pool, nil
}

// Subject is the principal a verified client certificate names: its
// subject's common name, or its first DNS or e-mail name; "" without one.
func Subject(state tls.ConnectionState) string {
	if len(state.VerifiedChains) == 0 || len(state.VerifiedChains[0]) == 0 {
		return ""
	}
	c := state.VerifiedChains[0][0]
	switch {
	case c.Subject.CommonName != "":
		return c.Subject.CommonName
	case len(c.DNSNames) > 0:
		return c.DNSNames[0]
	case len(c.EmailAddresses) > 0:
		return c.EmailAddresses[0]
	}
	return ""
}
