package auth

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/auth/scramcred"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/xdg-go/scram"
)

// service is a Service requiring logins, with user alice (password
// "secret") and superuser root.
func service(t testing.TB) *Service {
	t.Helper()
	users := &Users{}
	m := map[string]*heraldpb.UserRecord{}
	for name, pw := range map[string]string{"alice": "secret", "root": "root-pw"} {
		c, err := scramcred.New(name, pw, scramcred.MinIterations)
		if err != nil {
			t.Fatal(err)
		}
		m[name] = &heraldpb.UserRecord{Name: name, ScramSha256: c}
	}
	users.Set(m)
	return New(Config{Mode: Required, Superusers: []string{"root"}, Users: users, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

// login runs a whole SCRAM-SHA-256 login of user with password, as the
// Go SDK does (the xdg-go/scram client), from remote.
func login(s *Service, user, password, remote string) (string, *heraldpb.Error) {
	c, err := scram.SHA256.NewClient(user, password, "")
	if err != nil {
		return "", heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "%v", err)
	}
	conv := c.NewConversation()
	first, _ := conv.Step("")
	l, challenge, e := s.Begin(SCRAMSHA256, []byte(first), remote)
	if e != nil {
		return "", e
	}
	final, err := conv.Step(string(challenge))
	if err != nil {
		return "", heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "client: %v", err)
	}
	reply, who, e := l.Step([]byte(final))
	if e != nil {
		return "", e
	}
	if _, err := conv.Step(string(reply)); err != nil || !conv.Valid() {
		return "", heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "the server's proof: %v", err)
	}
	return who, nil
}

func TestSCRAMLogin(t *testing.T) {
	s := service(t)
	if who, e := login(s, "alice", "secret", "10.0.0.1:5000"); e != nil || who != "alice" {
		t.Fatalf("alice: %q %v", who, e)
	}
	// A wrong password and an unknown user: the same answer, and the
	// unknown user's challenge looks like a real one (a salt and the
	// default iteration count), so the answer does not tell who exists.
	_, wrong := login(s, "alice", "nope", "10.0.0.1:5001")
	_, unknown := login(s, "mallory", "nope", "10.0.0.1:5002")
	if wrong == nil || unknown == nil || wrong.Code != heraldpb.ErrorCode_NOT_AUTHENTICATED || wrong.Message != unknown.Message {
		t.Fatalf("wrong password %v, unknown user %v: want the same NOT_AUTHENTICATED", wrong, unknown)
	}
	c, _ := scram.SHA256.NewClient("mallory", "x", "")
	first, _ := c.NewConversation().Step("")
	_, ch, e := s.Begin(SCRAMSHA256, []byte(first), "10.0.0.2:1")
	if e != nil || !strings.Contains(string(ch), ",s=") || !strings.Contains(string(ch), fmt.Sprintf(",i=%d", scramcred.DefaultIterations)) {
		t.Fatalf("unknown user's challenge %q %v", ch, e)
	}
	_, ch2, _ := s.Begin(SCRAMSHA256, []byte(first), "10.0.0.2:2")
	if salt := func(b []byte) string {
		_, after, _ := strings.Cut(string(b), ",s=")
		return after[:strings.Index(after, ",")]
	}; salt(ch) != salt(ch2) {
		t.Fatalf("an unknown user's salt changes between logins (%q, %q): that tells it apart from a real one", ch, ch2)
	}
}

func TestSCRAMRefusals(t *testing.T) {
	s := service(t)
	if _, _, e := s.Begin("PLAIN", []byte("x"), "10.0.0.1:1"); e == nil || e.Code != heraldpb.ErrorCode_NOT_AUTHENTICATED || !strings.Contains(e.Message, `"PLAIN" is not supported`) {
		t.Fatalf("PLAIN: %v", e)
	}
	if _, _, e := s.Begin(SCRAMSHA256, []byte("garbage"), "10.0.0.1:1"); e == nil || !strings.Contains(e.Message, "malformed") {
		t.Fatalf("garbage: %v", e)
	}
	// An authorization id other than the user: no impersonation.
	c, _ := scram.SHA256.NewClient("alice", "secret", "root")
	conv := c.NewConversation()
	first, _ := conv.Step("")
	l, ch, e := s.Begin(SCRAMSHA256, []byte(first), "10.0.0.1:1")
	if e != nil {
		t.Fatal(e)
	}
	final, _ := conv.Step(string(ch))
	if _, who, e := l.Step([]byte(final)); e == nil {
		t.Fatalf("alice logged in as %q with authzid root", who)
	}
	off := New(Config{Mode: Off})
	if _, _, e := off.Begin(SCRAMSHA256, []byte(first), "10.0.0.1:1"); e == nil || !strings.Contains(e.Message, "--auth off") {
		t.Fatalf("login with auth off: %v", e)
	}
}

func TestAuthorizeUserAdmin(t *testing.T) {
	s := service(t)
	alter := &heraldpb.Frame{Body: &heraldpb.Frame_AlterUser{AlterUser: &heraldpb.AlterUserRequest{Name: "x"}}}
	list := &heraldpb.Frame{Body: &heraldpb.Frame_ListUsers{ListUsers: &heraldpb.ListUsersRequest{}}}
	produce := &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{}}}
	for _, tc := range []struct {
		who  string
		f    *heraldpb.Frame
		deny bool
	}{
		{"root", alter, false}, {"root", list, false},
		{"alice", alter, true}, {"alice", list, true}, {"", alter, true},
		{"alice", produce, true}, // no ACL allows it
	} {
		if e := s.Authorize(tc.who, "/", tc.f); (e != nil) != tc.deny || (e != nil && e.Code != heraldpb.ErrorCode_NOT_AUTHORIZED) {
			t.Errorf("%q %T: %v, deny %v", tc.who, tc.f.Body, e, tc.deny)
		}
	}
	if e := New(Config{Mode: Off}).Authorize("", "/", alter); e != nil {
		t.Errorf("auth off refuses user admin: %v", e)
	}
}

// Failed logins are limited per source address: the burst, then one per
// interval; other addresses are not affected; the table stays bounded.
func TestLimiter(t *testing.T) {
	l := newLimiter(3, time.Second, 100)
	now := time.Unix(1000, 0)
	for i := 0; i < 3; i++ {
		if _, ok := l.allow("a", now); !ok {
			t.Fatalf("refused before failure %d", i)
		}
		l.fail("a", now)
	}
	wait, ok := l.allow("a", now)
	if ok || wait != time.Second {
		t.Fatalf("after the burst: ok %v, wait %v; want refused for 1s", ok, wait)
	}
	if _, ok := l.allow("b", now); !ok {
		t.Fatal("another address is refused")
	}
	if _, ok := l.allow("a", now.Add(time.Second)); !ok {
		t.Fatal("refused after the refill interval")
	}
	for i := 0; i < 1000; i++ {
		l.fail(fmt.Sprintf("10.0.%d.%d", i/256, i%256), now)
	}
	if n := len(l.tables); n > 100 {
		t.Fatalf("the table holds %d addresses, over its bound of 100", n)
	}
}

func TestHost(t *testing.T) {
	for in, want := range map[string]string{"10.1.2.3:5": "10.1.2.3", "[::1]:80": "::1", "x": "x"} {
		if got := host(in); got != want {
			t.Errorf("host(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzSCRAMLogin feeds arbitrary client messages to the server side of a
// login. It guarantees: nothing panics; every refusal is NOT_AUTHENTICATED
// or THROTTLED; and no login without alice's password succeeds.
func FuzzSCRAMLogin(f *testing.F) {
	s := service(f)
	c, _ := scram.SHA256.NewClient("alice", "secret", "")
	conv := c.NewConversation()
	first, _ := conv.Step("")
	f.Add([]byte(first), []byte("c=biws,r=x,p=AAAA"))
	f.Add([]byte("n,,n=mallory,r=abc"), []byte("c=biws,r=abc,p=AAAA"))
	f.Add([]byte("y,a=root,n=alice,r=abc"), []byte(""))
	f.Add([]byte("p=tls-unique,,n=alice,r=x"), []byte("c=,r=,p="))
	f.Fuzz(func(t *testing.T, first, final []byte) {
		s.limiter = newLimiter(1<<30, time.Hour, 10) // never throttle: reach the parser every time
		l, _, e := s.Begin(SCRAMSHA256, first, "10.9.9.9:1")
		if e != nil {
			if e.Code != heraldpb.ErrorCode_NOT_AUTHENTICATED {
				t.Fatalf("Begin: %v", e)
			}
			return
		}
		_, who, e := l.Step(final)
		if e == nil {
			t.Fatalf("logged in as %q with client-final %q", who, final)
		}
		if e.Code != heraldpb.ErrorCode_NOT_AUTHENTICATED {
			t.Fatalf("Step: %v", e)
		}
		if _, _, e := l.Step(final); e == nil {
			t.Fatal("a second Step of an ended login succeeded")
		}
	})
}
