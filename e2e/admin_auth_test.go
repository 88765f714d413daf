package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// adminGet GETs path on the admin port with HTTP basic credentials (none
// when user is "") and returns the status.
func adminGet(t *testing.T, hc *http.Client, base, path, user, pw string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+path, nil)
	if user != "" {
		req.SetBasicAuth(user, pw)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// With logins on, the admin port serves /metrics, /healthz and /readyz to
// anyone and everything else to users the ACLs allow (admin for
// /debug/...), and the audit log records who did what, from where, and
// how it ended.
func TestAdminPortAuthAndAudit(t *testing.T) {
	p, _ := startAuthBroker(t, "--admin-pprof")
	ctx := ctxT(t, 60*time.Second)
	admin := dial(t, p, client.WithSCRAM("admin", "admin-secret"))
	if err := admin.AddUser(ctx, "alice", "alice-secret", 0); err != nil {
		t.Fatal(err)
	}
	base := "http://" + p.AdminAddr()
	hc := &http.Client{Timeout: 10 * time.Second}
	for _, c := range []struct {
		path, user, pw string
		want           int
	}{
		{"/metrics", "", "", 200},
		{"/healthz", "", "", 200},
		{"/cluster", "", "", 401},
		{"/cluster", "admin", "wrong", 401},
		{"/cluster", "alice", "alice-secret", 403},
		{"/cluster", "admin", "admin-secret", 200},
		{"/debug/pprof/", "admin", "admin-secret", 200},
	} {
		if got := adminGet(t, hc, base, c.path, c.user, c.pw); got != c.want {
			t.Fatalf("GET %s as %q: %d, want %d", c.path, c.user, got, c.want)
		}
	}
	if err := admin.AlterAcls(ctx, []*heraldpb.AclRule{{Principal: "user:alice", ResourceType: heraldpb.AclResourceType_ACL_RESOURCE_CLUSTER, Operation: heraldpb.AclOperation_ACL_OP_DESCRIBE}}, nil); err != nil {
		t.Fatal(err)
	}
	if got := adminGet(t, hc, base, "/cluster", "alice", "alice-secret"); got != 200 {
		t.Fatalf("alice with describe on the cluster: %d", got)
	}
	if got := adminGet(t, hc, base, "/debug/pprof/", "alice", "alice-secret"); got != 403 {
		t.Fatalf("alice's pprof: %d, want 403 (needs admin)", got)
	}
	alice := dial(t, p, client.WithSCRAM("alice", "alice-secret"))
	if _, err := alice.CreateTopic(ctx, "x", &heraldpb.TopicConfig{Partitions: 1}); err == nil {
		t.Fatal("alice created a topic without an ACL")
	}
	if _, err := admin.CreateTopic(ctx, "audited", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	client.Dial(ctxT(t, 10*time.Second), p.Addr(), client.WithSCRAM("alice", "nope"))

	type line struct{ Principal, Remote, Vhost, Action, Resource, Outcome, Time string }
	want := []line{
		{Principal: "admin", Action: "alter_user", Resource: "alice add", Outcome: "ok"},
		{Principal: "anonymous", Action: "http GET /cluster", Outcome: "NOT_AUTHENTICATED"},
		{Principal: "alice", Action: "http GET /cluster", Outcome: "NOT_AUTHORIZED"},
		{Principal: "admin", Action: "http GET /debug/pprof/", Outcome: "ok"},
		{Principal: "admin", Action: "alter_acls", Outcome: "ok"},
		{Principal: "alice", Action: "create_topic", Resource: "x", Outcome: "NOT_AUTHORIZED"},
		{Principal: "admin", Action: "create_topic", Resource: "audited", Outcome: "ok"},
		{Principal: "anonymous", Action: "login", Outcome: "NOT_AUTHENTICATED"},
	}
	checkFor(t, 10*time.Second, "the audit log's entries", func() error {
		b, err := os.ReadFile(filepath.Join(p.DataDir(), "audit.log"))
		if err != nil {
			return err
		}
		var got []line
		for _, s := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var l line
			if err := json.Unmarshal([]byte(s), &l); err != nil {
				t.Fatalf("audit line %q: %v", s, err)
			}
			if l.Remote == "" || l.Time == "" {
				t.Fatalf("audit line without a remote or a time: %q", s)
			}
			got = append(got, l)
		}
		i := 0
		for _, l := range got {
			w := want[i]
			if l.Principal == w.Principal && l.Action == w.Action && l.Outcome == w.Outcome && (w.Resource == "" || l.Resource == w.Resource) {
				if i++; i == len(want) {
					return nil
				}
			}
		}
		return &auditMissing{want[i], string(b)}
	})
}

type auditMissing struct {
	want any
	log  string
}

func (e *auditMissing) Error() string {
	b, _ := json.Marshal(e.want)
	return "no audit entry like " + string(b) + " (in order) in:\n" + e.log
}

// --admin-tls serves the admin port over TLS with the client listener's
// certificate.
func TestAdminPortTLS(t *testing.T) {
	l := startTLSLab(t, "--admin-tls")
	pem, err := os.ReadFile(l.file("ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13}}}
	if got := adminGet(t, hc, "https://"+l.p.AdminAddr(), "/healthz", "", ""); got != 200 {
		t.Fatalf("https /healthz: %d", got)
	}
	resp, err := http.Get("http://" + l.p.AdminAddr() + "/healthz")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain http served by the TLS admin port")
		}
	}
}
