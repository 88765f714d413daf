// Package auth is who a client connection is and what it may do: the
// login modes, the users' SCRAM credentials, the SCRAM-SHA-256 server side
// of a login (github.com/xdg-go/scram), the rate limit on failed logins,
// and the authorization of each request.
//
// It is part of the shared layer: netio asks it at Hello, at each login
// step and before routing each request; the broker feeds it the users
// from the node's metadata (the controller's in a cluster, DATA/users on a
// single node).
package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/heraldmq/herald/auth/scramcred"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/xdg-go/scram"
)

// Mode is whether a connection must log in.
type Mode int

const (
	// Off: every connection is anonymous and may do everything; a login
	// is refused (there is nothing to check it against).
	Off Mode = iota
	// Optional: a connection may log in; one that does not is anonymous.
	Optional
	// Required: a connection must log in (SCRAM, or a verified TLS client
	// certificate) before any request but Hello and SaslAuthenticate.
	Required
)

func (m Mode) String() string {
	switch m {
	case Optional:
		return "optional"
	case Required:
		return "required"
	}
	return "off"
}

// ParseMode parses --auth.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "off":
		return Off, nil
	case "optional":
		return Optional, nil
	case "required":
		return Required, nil
	}
	return Off, fmt.Errorf("--auth %q: want required, optional or off", s)
}

// SCRAMSHA256 is the SASL mechanism's name.
const SCRAMSHA256 = "SCRAM-SHA-256"

// Users is the set of users as the node's metadata has it. Set replaces it
// whole; readers never block.
type Users struct {
	m atomic.Pointer[map[string]*heraldpb.UserRecord]
}

// Set replaces the users.
func (u *Users) Set(users map[string]*heraldpb.UserRecord) { u.m.Store(&users) }

// Get returns the user, or nil.
func (u *Users) Get(name string) *heraldpb.UserRecord {
	if m := u.m.Load(); m != nil {
		return (*m)[name]
	}
	return nil
}

// List returns the users by name.
func (u *Users) List() []*heraldpb.UserRecord {
	m := u.m.Load()
	if m == nil {
		return nil
	}
	out := make([]*heraldpb.UserRecord, 0, len(*m))
	for _, r := range *m {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *heraldpb.UserRecord) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Config configures a Service.
type Config struct {
	Mode Mode
	// Superusers may do everything, user administration included.
	Superusers []string
	Users      *Users
	ACLs       *ACLs
	// FailedLogins is how many failed logins one source address may have
	// in a burst; afterwards one more per FailedLoginEvery. Defaults 10
	// and 6 s.
	FailedLogins     int
	FailedLoginEvery time.Duration
	// MaxTrackedAddresses bounds the limiter's table. Default 10,000.
	MaxTrackedAddresses int
	Logger              *slog.Logger
}

// Service authenticates connections and authorizes their requests. Its
// methods are safe for concurrent use.
type Service struct {
	cfg     Config
	supers  map[string]bool
	secret  []byte // keys the stand-in credentials of unknown users
	server  *scram.Server
	limiter *limiter
	pw      pwCache
}

// New makes a Service.
func New(cfg Config) *Service {
	if cfg.Users == nil {
		cfg.Users = &Users{}
	}
	if cfg.ACLs == nil {
		cfg.ACLs = &ACLs{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Service{cfg: cfg, supers: map[string]bool{}, secret: make([]byte, 32)}
	for _, n := range cfg.Superusers {
		s.supers[n] = true
	}
	_, _ = rand.Read(s.secret)
	s.server, _ = scram.SHA256.NewServer(s.lookup) // never fails
	s.limiter = newLimiter(cfg.FailedLogins, cfg.FailedLoginEvery, cfg.MaxTrackedAddresses)
	return s
}

// Mode is the service's login mode.
func (s *Service) Mode() Mode { return s.cfg.Mode }

// Mechanisms are the SASL mechanisms HelloResponse offers.
func (s *Service) Mechanisms() []string {
	if s.cfg.Mode == Off {
		return nil
	}
	return []string{SCRAMSHA256}
}

// Superuser reports whether principal is named by --superusers.
func (s *Service) Superuser(principal string) bool { return principal != "" && s.supers[principal] }

// Users is the service's user set.
func (s *Service) Users() *Users { return s.cfg.Users }

// lookup gives SCRAM the credentials of name. An unknown user gets
// stand-in credentials derived from the service's secret, so that the
// login goes on to fail at the proof exactly as a wrong password does: the
// answer never tells whether a user exists.
func (s *Service) lookup(name string) (scram.StoredCredentials, error) {
	if u := s.cfg.Users.Get(name); u != nil && u.ScramSha256 != nil {
		c := u.ScramSha256
		return scram.StoredCredentials{
			KeyFactors: scram.KeyFactors{Salt: string(c.Salt), Iters: int(c.Iterations)},
			StoredKey:  c.StoredKey, ServerKey: c.ServerKey,
		}, nil
	}
	mac := func(label string) []byte {
		h := hmac.New(sha256.New, s.secret)
		h.Write([]byte(label))
		h.Write([]byte{0})
		h.Write([]byte(name))
		return h.Sum(nil)
	}
	return scram.StoredCredentials{
		KeyFactors: scram.KeyFactors{Salt: string(mac("salt")[:16]), Iters: scramcred.DefaultIterations},
		StoredKey:  mac("stored"), ServerKey: mac("server"),
	}, nil
}

// Login is one connection's login under way. It is used from one
// goroutine (the connection's event loop).
type Login struct {
	s      *Service
	remote string // the source address, for the limiter and the log
	conv   *scram.ServerConversation
}

// ErrNotAuthenticated is the one answer to a failed login: it never says
// whether the user exists.
func errFailed() *heraldpb.Error {
	return heraldpb.NewError(heraldpb.ErrorCode_NOT_AUTHENTICATED, "authentication failed: unknown user or wrong password (%s)", SCRAMSHA256)
}

// Begin starts a login from remote (host:port) with mechanism and its
// first message, and returns the challenge. A refused start (mechanism,
// mode, or the source's failed logins over the limit) is the error to
// answer; the connection is then closed.
func (s *Service) Begin(mechanism string, first []byte, remote string) (*Login, []byte, *heraldpb.Error) {
	if s.cfg.Mode == Off {
		return nil, nil, heraldpb.NewError(heraldpb.ErrorCode_NOT_AUTHENTICATED, "this broker does not take logins (--auth off)")
	}
	if mechanism != SCRAMSHA256 {
		mFailures.WithLabelValues(reasonMechanism).Inc()
		return nil, nil, heraldpb.NewError(heraldpb.ErrorCode_NOT_AUTHENTICATED, "SASL mechanism %q is not supported; this broker takes %s", trim(mechanism), SCRAMSHA256)
	}
	if wait, ok := s.limiter.begin(host(remote), time.Now()); !ok {
		mFailures.WithLabelValues(reasonThrottled).Inc()
		e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "too many failed logins from %s; try again in %v", host(remote), wait.Round(time.Millisecond))
		e.RetryAfterMs = uint32((wait + time.Millisecond - 1) / time.Millisecond)
		return nil, nil, e
	}
	l := &Login{s: s, remote: remote, conv: s.server.NewConversation()}
	challenge, err := l.conv.Step(string(first))
	if err != nil {
		return nil, nil, l.failed(reasonMalformed, err)
	}
	return l, []byte(challenge), nil
}

// Step takes the client's final message. On success it returns the
// server's final message and the principal; a failure is the error to
// answer, and the connection is closed.
func (l *Login) Step(final []byte) ([]byte, string, *heraldpb.Error) {
	if l.conv.Done() {
		return nil, "", heraldpb.NewError(heraldpb.ErrorCode_NOT_AUTHENTICATED, "the login is already over")
	}
	reply, err := l.conv.Step(string(final))
	if err != nil || !l.conv.Valid() {
		reason := reasonPassword
		if l.s.cfg.Users.Get(l.conv.Username()) == nil {
			reason = reasonUnknownUser
		}
		return nil, "", l.failed(reason, err)
	}
	name := l.conv.Username()
	if z := l.conv.AuthzID(); z != "" && z != name {
		return nil, "", l.failed(reasonAuthzid, fmt.Errorf("authorization id %q is not the user %q", trim(z), trim(name)))
	}
	mLogins.WithLabelValues(SCRAMSHA256).Inc()
	l.s.limiter.refund(host(l.remote), time.Now())
	return []byte(reply), name, nil
}

// failed counts and logs a failed login (Begin charged its source).
func (l *Login) failed(reason string, err error) *heraldpb.Error {
	mFailures.WithLabelValues(reason).Inc()
	user := ""
	if l.conv != nil {
		user = trim(l.conv.Username())
	}
	l.s.cfg.Logger.Warn("login failed", "remote", l.remote, "user", user, "reason", reason, "err", err)
	if reason == reasonMalformed {
		return heraldpb.NewError(heraldpb.ErrorCode_NOT_AUTHENTICATED, "authentication failed: malformed %s message: %v", SCRAMSHA256, err)
	}
	return errFailed()
}

// CertificateLogin counts the login of a connection by its verified TLS
// client certificate.
func (s *Service) CertificateLogin() { mLogins.WithLabelValues("TLS").Inc() }

// Authorize decides whether principal ("" = anonymous), working in vhost,
// may make request f (its names already the broker's). nil allows it. With logins off everything is allowed; otherwise a
// superuser may do everything, internal topics are out of everyone
// else's reach, and every other request needs ACL rules allowing each
// permission it takes (deny wins; nothing allows by default).
func (s *Service) Authorize(principal, vhost string, f *heraldpb.Frame) *heraldpb.Error {
	if s.cfg.Mode == Off || s.Superuser(principal) {
		return nil
	}
	need, known := checks(vhost, f)
	if !known {
		mDenied.Inc()
		return heraldpb.NewError(heraldpb.ErrorCode_NOT_AUTHORIZED, "%s may not make a %T request: only superusers may", who(principal), f.Body)
	}
	if len(need) == 0 {
		return nil
	}
	ps := s.principals(principal)
	for _, c := range need {
		if c.typ == heraldpb.AclResourceType_ACL_RESOURCE_TOPIC && isInternal(c.name) {
			mDenied.Inc()
			return heraldpb.NewError(heraldpb.ErrorCode_NOT_AUTHORIZED, "topic %q is internal: only superusers reach it", trim(c.name))
		}
		if !s.allowed(ps, c) {
			return denied(principal, c)
		}
	}
	return nil
}

// ACLs is the service's rule set.
func (s *Service) ACLs() *ACLs { return s.cfg.ACLs }

func who(principal string) string {
	if principal == "" {
		return "an anonymous connection"
	}
	return fmt.Sprintf("user %q", principal)
}

// trim cuts a client-given string for a log or an error message.
func trim(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// host is remote without its port.
func host(remote string) string {
	if i := strings.LastIndexByte(remote, ':'); i > 0 {
		return strings.Trim(remote[:i], "[]")
	}
	return remote
}
