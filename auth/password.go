package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"sync"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/xdg-go/scram"
)

// Passwords given in the clear (HTTP basic on the admin port) are checked
// against the same SCRAM credentials: the stored key derived from the
// password with the user's salt and iterations must match. A success is
// remembered for passwordCacheTTL (by a hash of the password, never the
// password), so a scraper does not pay PBKDF2 on every request.

const (
	passwordCacheTTL = time.Minute
	passwordCacheMax = 1024
)

type pwEntry struct {
	hash      [32]byte
	storedKey string // the credentials it matched: a new password drops it
	at        time.Time
}

type pwCache struct {
	mu sync.Mutex
	m  map[string]pwEntry
}

// CheckPassword reports whether password is user's, from remote (whose
// failures count against the login limiter, as SCRAM's do). A refusal is
// NOT_AUTHENTICATED, or THROTTLED past the limiter.
func (s *Service) CheckPassword(user, password, remote string) *heraldpb.Error {
	now := time.Now()
	cached := func() bool {
		cred, _ := s.lookup(user)
		sum := sha256.Sum256([]byte(user + "\x00" + password))
		s.pw.mu.Lock()
		defer s.pw.mu.Unlock()
		e, ok := s.pw.m[user]
		return ok && e.hash == sum && e.storedKey == string(cred.StoredKey) && now.Sub(e.at) < passwordCacheTTL
	}
	if cached() {
		return nil // a password checked within the minute: no PBKDF2, no charge
	}
	if wait, ok := s.limiter.begin(host(remote), now); !ok {
		mFailures.WithLabelValues(reasonThrottled).Inc()
		e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "too many failed logins from %s; try again in %v", host(remote), wait.Round(time.Millisecond))
		e.RetryAfterMs = uint32((wait + time.Millisecond - 1) / time.Millisecond)
		return e
	}
	cred, _ := s.lookup(user) // stand-in credentials for an unknown user: the same work, the same answer
	sum := sha256.Sum256([]byte(user + "\x00" + password))
	ok := false
	if c, err := scram.SHA256.NewClient(user, password, ""); err == nil {
		got, err := c.GetStoredCredentialsWithError(cred.KeyFactors)
		ok = err == nil && hmac.Equal(got.StoredKey, cred.StoredKey) && s.cfg.Users.Get(user) != nil
	}
	if !ok {
		reason := reasonPassword
		if s.cfg.Users.Get(user) == nil {
			reason = reasonUnknownUser
		}
		mFailures.WithLabelValues(reason).Inc()
		s.cfg.Logger.Warn("login failed", "remote", remote, "user", trim(user), "reason", reason, "mechanism", "password")
		return errFailed()
	}
	mLogins.WithLabelValues("password").Inc()
	s.limiter.refund(host(remote), now)
	s.pw.mu.Lock()
	if s.pw.m == nil || len(s.pw.m) >= passwordCacheMax {
		s.pw.m = map[string]pwEntry{}
	}
	s.pw.m[user] = pwEntry{hash: sum, storedKey: string(cred.StoredKey), at: now}
	s.pw.mu.Unlock()
	return nil
}

// MayOnCluster decides whether principal may describe (or, with admin,
// administer) the cluster: the admin port's endpoints.
func (s *Service) MayOnCluster(principal string, admin bool) *heraldpb.Error {
	if s.cfg.Mode == Off || s.Superuser(principal) {
		return nil
	}
	c := clusterCheck(opDescribe)
	if admin {
		c = clusterCheck(opAdmin)
	}
	if s.allowed(s.principals(principal), c) {
		return nil
	}
	return denied(principal, c)
}
