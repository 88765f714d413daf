package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// writeSecret writes a password file and returns its path.
func writeSecret(t *testing.T, dir, name, password string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startAuthBroker starts a broker that requires logins, with superuser
// admin (password "admin-secret") made by --bootstrap-user.
func startAuthBroker(t *testing.T, extra ...string) (*proc, string) {
	t.Helper()
	secrets := t.TempDir()
	adminPW := writeSecret(t, secrets, "admin.pw", "admin-secret")
	p := startProc(t, t.TempDir(), append([]string{"--auth", "required",
		"--bootstrap-user", "admin", "--bootstrap-password-file", adminPW}, extra...)...)
	return p, adminPW
}

// A broker with --auth required: a connection that has not logged in is
// refused every request with NOT_AUTHENTICATED; a wrong password and an
// unknown user get the same answer; users made with the CLI log in and
// work, but only a superuser administers users; the users survive a
// restart; and the broker stays up through all of it.
func TestAuthSCRAM(t *testing.T) {
	p, adminPW := startAuthBroker(t)
	ctx := ctxT(t, 60*time.Second)

	// Anonymous: Hello works, every request is refused.
	anon := dial(t, p)
	_, err := anon.CreateTopic(ctx, "orders", &heraldpb.TopicConfig{Partitions: 1})
	if !errors.Is(err, client.ErrNotAuthenticated) || !strings.Contains(err.Error(), "requires a login") {
		t.Fatalf("anonymous create: %v, want NOT_AUTHENTICATED", err)
	}
	if _, err := anon.ListUsers(ctx); !errors.Is(err, client.ErrNotAuthenticated) {
		t.Fatalf("anonymous list users: %v", err)
	}

	// The CLI, as the bootstrap superuser, adds alice (password on stdin).
	as := []string{"--addr", p.Addr(), "--user", "admin", "--password-file", adminPW}
	out, errOut, code := herald(t, "alice-secret\n", append([]string{"user", "add", "alice"}, as...)...)
	if code != 0 || out != "created user alice\n" {
		t.Fatalf("user add: %d %q %q", code, out, errOut)
	}
	out, errOut, code = herald(t, "", append([]string{"user", "list"}, as...)...)
	if code != 0 || !strings.Contains(out, "USER") || !regexpLine(out, `^admin\s+SCRAM-SHA-256\s+8192\s+true\s`) || !regexpLine(out, `^alice\s+SCRAM-SHA-256\s+8192\s+false\s`) {
		t.Fatalf("user list: %d %q %q", code, out, errOut)
	}
	_, errOut, code = herald(t, "x\n", append([]string{"user", "add", "alice"}, as...)...)
	if code == 0 || !strings.Contains(errOut, "USER_ALREADY_EXISTS") {
		t.Fatalf("user add twice: %d %q", code, errOut)
	}

	// alice may do nothing until an ACL says so.
	alice := dial(t, p, client.WithSCRAM("alice", "alice-secret"))
	if _, err := alice.CreateTopic(ctx, "orders", &heraldpb.TopicConfig{Partitions: 1}); !errors.Is(err, client.ErrNotAuthorized) ||
		!strings.Contains(err.Error(), `user "alice" may not create topic "orders"`) {
		t.Fatalf("create without an ACL: %v", err)
	}
	out, errOut, code = herald(t, "", append([]string{"acl", "add", "--principal", "user:alice", "--operation", "all", "--topic", "orders"}, as...)...)
	if code != 0 || out != "added: allow user:alice all on topic orders\n" {
		t.Fatalf("acl add: %d %q %q", code, out, errOut)
	}
	if who, err := alice.Principal(ctx); err != nil || who != "alice" {
		t.Fatalf("principal: %q %v", who, err)
	}
	if _, err := alice.CreateTopic(ctx, "orders", &heraldpb.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.NewProducer().Send(ctx, &client.Message{Topic: "orders", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	// ... but administers no users.
	if err := alice.DeleteUser(ctx, "admin"); !errors.Is(err, client.ErrNotAuthorized) || !strings.Contains(err.Error(), `user "alice" may not admin on the cluster`) {
		t.Fatalf("alice deletes admin: %v, want NOT_AUTHORIZED", err)
	}

	// A wrong password and an unknown user: the same clear error.
	for _, opt := range []client.Option{client.WithSCRAM("alice", "wrong"), client.WithSCRAM("mallory", "x")} {
		_, err := client.Dial(ctxT(t, 10*time.Second), p.Addr(), opt)
		if !errors.Is(err, client.ErrNotAuthenticated) || !strings.Contains(err.Error(), "authentication failed: unknown user or wrong password") {
			t.Fatalf("bad login: %v", err)
		}
	}

	// passwd: the old password stops working, the new one works.
	_, errOut, code = herald(t, "alice-new\n", append([]string{"user", "passwd", "alice"}, as...)...)
	if code != 0 {
		t.Fatalf("user passwd: %d %q", code, errOut)
	}
	if _, err := client.Dial(ctxT(t, 10*time.Second), p.Addr(), client.WithSCRAM("alice", "alice-secret")); !errors.Is(err, client.ErrNotAuthenticated) {
		t.Fatalf("old password after passwd: %v", err)
	}

	// The users survive a restart.
	p.Stop(t)
	p.Start(t)
	alice2 := dial(t, p, client.WithSCRAM("alice", "alice-new"))
	if _, err := alice2.NewProducer().Send(ctxT(t, 30*time.Second), &client.Message{Topic: "orders", Value: []byte("after restart")}); err != nil {
		t.Fatal(err)
	}
	out, _, code = herald(t, "", append([]string{"user", "delete", "alice"}, as...)...)
	if code != 0 || out != "deleted user alice\n" {
		t.Fatalf("user delete: %d %q", code, out)
	}
	if _, err := client.Dial(ctxT(t, 10*time.Second), p.Addr(), client.WithSCRAM("alice", "alice-new")); !errors.Is(err, client.ErrNotAuthenticated) {
		t.Fatalf("deleted user logs in: %v", err)
	}
	if _, err := alice2.NewProducer().Send(ctxT(t, 30*time.Second), &client.Message{Topic: "orders", Value: []byte("still logged in")}); err != nil {
		t.Fatalf("a connection logged in before the delete: %v", err)
	}
}

// Failed logins from one address are rate-limited: past the burst the
// broker answers THROTTLED with a retry-after, counts it, and stays up.
func TestAuthFailedLoginsAreRateLimited(t *testing.T) {
	p, _ := startAuthBroker(t)
	var throttled error
	for i := 0; i < 30 && throttled == nil; i++ {
		_, err := client.Dial(ctxT(t, 10*time.Second), p.Addr(), client.WithSCRAM("mallory", "guess"))
		switch {
		case err != nil && strings.Contains(err.Error(), "THROTTLED"):
			throttled = err
		case !errors.Is(err, client.ErrNotAuthenticated):
			t.Fatalf("login %d: %v", i, err)
		}
	}
	if throttled == nil || !strings.Contains(throttled.Error(), "too many failed logins from 127.0.0.1; try again in") {
		t.Fatalf("30 failed logins were never throttled (last: %v)", throttled)
	}
	if v := metricLabelled(t, p, `herald_auth_failures_total{reason="throttled"}`); v < 1 {
		t.Fatalf("throttled failures counted %v", v)
	}
	if v := metricLabelled(t, p, `herald_auth_failures_total{reason="unknown_user"}`); v < 10 {
		t.Fatalf("unknown_user failures counted %v", v)
	}
	// A good login from the same address waits its turn too (the limit is
	// per address), and the broker still serves.
	if code := httpStatus(t, "http://"+p.AdminAddr()+"/healthz"); code != 200 {
		t.Fatalf("healthz: %d", code)
	}
}

// A verified TLS client certificate logs its connection in as its
// subject: with --auth required it needs no password.
func TestAuthByClientCertificate(t *testing.T) {
	l := startTLSLab(t, "--auth", "required")
	c, err := l.dial(t, l.clientTLS(t, l.file("ca.pem"), "alice"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	if who, err := c.Principal(ctx); err != nil || who != "alice" {
		t.Fatalf("principal: %q %v", who, err)
	}
	// Logged in as alice: refused by the ACLs (none allow her anything),
	// not for want of a login.
	if _, err := c.CreateTopic(ctx, "orders", &heraldpb.TopicConfig{Partitions: 1}); !errors.Is(err, client.ErrNotAuthorized) || !strings.Contains(err.Error(), `user "alice" may not create`) {
		t.Fatalf("create as alice without an ACL: %v", err)
	}
	// The plaintext listener of the same broker still requires a login.
	anon := dial(t, l.p)
	if _, err := anon.ListTopics(ctx); !errors.Is(err, client.ErrNotAuthenticated) {
		t.Fatalf("plaintext anonymous: %v", err)
	}
}

// In a cluster the users and ACLs live in the controller's replicated
// metadata: a user added through one node logs in at every node, a rule
// added through one node holds at every node, also after the
// controller's leader is killed.
func TestAuthUsersReplicated(t *testing.T) {
	secrets := t.TempDir()
	adminPW := writeSecret(t, secrets, "admin.pw", "admin-secret")
	// The harness reads /cluster without a login: open it.
	tc := startCluster(t, 3, "--auth", "required", "--bootstrap-user", "admin", "--bootstrap-password-file", adminPW,
		"--admin-open", "/metrics,/healthz,/readyz,/cluster")
	login := func(p *proc, user, pw string) error {
		c, err := client.Dial(ctxT(t, 10*time.Second), p.Addr(), client.WithSCRAM(user, pw))
		if err == nil {
			c.Close()
		}
		return err
	}
	// --bootstrap-user reaches the controller once it has a leader.
	checkFor(t, 30*time.Second, "the bootstrap user logs in at node 1", func() error { return login(tc.nodes[1], "admin", "admin-secret") })
	admin := dial(t, tc.nodes[1], client.WithSCRAM("admin", "admin-secret"))
	if err := admin.AddUser(ctxT(t, 30*time.Second), "bob", "bob-secret", 0); err != nil {
		t.Fatal(err)
	}
	for id, p := range tc.nodes {
		checkFor(t, 10*time.Second, fmt.Sprintf("bob logs in at node %d", id), func() error { return login(p, "bob", "bob-secret") })
	}
	// ACL rules are replicated the same way.
	if err := admin.AlterAcls(ctxT(t, 30*time.Second), []*heraldpb.AclRule{{Principal: "user:bob", ResourceType: heraldpb.AclResourceType_ACL_RESOURCE_CLUSTER, Operation: heraldpb.AclOperation_ACL_OP_ADMIN}}, nil); err != nil {
		t.Fatal(err)
	}
	for id, p := range tc.nodes {
		checkFor(t, 10*time.Second, fmt.Sprintf("bob administers at node %d", id), func() error {
			c, err := client.Dial(ctxT(t, 10*time.Second), p.Addr(), client.WithSCRAM("bob", "bob-secret"))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.ListUsers(ctxT(t, 10*time.Second))
			return err
		})
	}
	cv, _, err := getController(tc.nodes[1])
	if err != nil {
		t.Fatal(err)
	}
	tc.nodes[cv.Leader].Kill(t)
	for id, p := range tc.nodes {
		if id == cv.Leader {
			continue
		}
		if err := login(p, "bob", "bob-secret"); err != nil {
			t.Fatalf("bob at node %d after the controller leader's kill: %v", id, err)
		}
	}
}

// regexpLine reports whether a line of out matches pattern.
func regexpLine(out, pattern string) bool {
	return regexp.MustCompile(`(?m)` + pattern).MatchString(out)
}

// httpStatus is the status of a GET of url (0 if it failed).
func httpStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// metricLabelled reads one metric line (with its labels) from a node's
// /metrics; -1 if absent.
func metricLabelled(t *testing.T, p *proc, series string) float64 {
	t.Helper()
	return metricValue(t, p, series)
}

// aclCase is one request type: do makes the request as the client, and
// rules are the ACL rules that allow it.
type aclCase struct {
	name  string
	rules []*heraldpb.AclRule
	do    func(ctx context.Context, c *client.Client) error
}

func allow(principal string, typ heraldpb.AclResourceType, name string, op heraldpb.AclOperation) *heraldpb.AclRule {
	return &heraldpb.AclRule{Principal: principal, ResourceType: typ, Resource: name, Operation: op}
}

// Every request type is refused with NOT_AUTHORIZED without the ACL that
// allows it (the message names the operation and the resource), and
// allowed once the rule is added: on a real broker, through the SDK.
func TestACLEveryRequestType(t *testing.T) {
	p, _ := startAuthBroker(t)
	ctx := ctxT(t, 120*time.Second)
	admin := dial(t, p, client.WithSCRAM("admin", "admin-secret"))
	if err := admin.AddUser(ctx, "carol", "carol-secret", 0); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"t", "sched", "secret", "offs", "rpc"} {
		if _, err := admin.CreateTopic(ctx, name, &heraldpb.TopicConfig{Partitions: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.NewProducer().Send(ctx, &client.Message{Topic: "t", Value: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	const (
		topicT   = heraldpb.AclResourceType_ACL_RESOURCE_TOPIC
		groupT   = heraldpb.AclResourceType_ACL_RESOURCE_GROUP
		clusterT = heraldpb.AclResourceType_ACL_RESOURCE_CLUSTER
		txnT     = heraldpb.AclResourceType_ACL_RESOURCE_TRANSACTIONAL_ID
		pgT      = heraldpb.AclResourceType_ACL_RESOURCE_PRODUCER_GROUP
	)
	u := "user:carol"
	cases := []aclCase{
		{"CreateTopic", []*heraldpb.AclRule{allow(u, topicT, "made", heraldpb.AclOperation_ACL_OP_CREATE)}, func(ctx context.Context, c *client.Client) error {
			_, err := c.CreateTopic(ctx, "made", &heraldpb.TopicConfig{Partitions: 1})
			return err
		}},
		{"DescribeTopic", []*heraldpb.AclRule{allow(u, topicT, "t", heraldpb.AclOperation_ACL_OP_DESCRIBE)}, func(ctx context.Context, c *client.Client) error {
			_, err := c.DescribeTopic(ctx, "t")
			return err
		}},
		{"Produce", []*heraldpb.AclRule{allow(u, topicT, "t", heraldpb.AclOperation_ACL_OP_PRODUCE)}, func(ctx context.Context, c *client.Client) error {
			_, err := c.NewProducer().Send(ctx, &client.Message{Topic: "t", Value: []byte("y")})
			return err
		}},
		{"Fetch", []*heraldpb.AclRule{allow(u, topicT, "t", heraldpb.AclOperation_ACL_OP_CONSUME)}, func(ctx context.Context, c *client.Client) error {
			_, err := c.Fetch(ctx, "t", 0, 0, 1<<20, 0)
			return err
		}},
		{"Subscribe and DescribeGroup", []*heraldpb.AclRule{allow(u, topicT, "t", heraldpb.AclOperation_ACL_OP_CONSUME), allow(u, groupT, "g", heraldpb.AclOperation_ACL_OP_CONSUME)}, func(ctx context.Context, c *client.Client) error {
			sub, err := c.Subscribe(ctx, client.SubscribeOptions{Group: "g", Topic: "t", Mode: client.Shared, From: client.Earliest()}, func(context.Context, *client.Delivered) {})
			if err != nil {
				return err
			}
			defer sub.Close(ctx)
			_, err = c.DescribeGroup(ctx, "g")
			return err
		}},
		{"ResetGroup", []*heraldpb.AclRule{allow(u, groupT, "g", heraldpb.AclOperation_ACL_OP_ALTER)}, func(ctx context.Context, c *client.Client) error {
			_, err := c.ResetGroup(ctx, "g", client.Earliest(), true)
			return err
		}},
		{"InitProducerId", []*heraldpb.AclRule{allow(u, txnT, "tx", heraldpb.AclOperation_ACL_OP_PRODUCE)}, func(ctx context.Context, c *client.Client) error {
			tp, err := c.NewTransactionalProducer(ctx, "tx")
			if err == nil {
				tp.Close(ctx)
			}
			return err
		}},
		{"Half message", []*heraldpb.AclRule{allow(u, topicT, "t", heraldpb.AclOperation_ACL_OP_PRODUCE), allow(u, pgT, "pg", heraldpb.AclOperation_ACL_OP_PRODUCE)}, func(ctx context.Context, c *client.Client) error {
			h, err := c.SendHalf(ctx, &client.Message{Topic: "t", Value: []byte("h")}, client.HalfOptions{ProducerGroup: "pg"})
			if err != nil {
				return err
			}
			_, err = h.Commit(ctx)
			return err
		}},
		{"ListScheduled", []*heraldpb.AclRule{allow(u, topicT, "sched", heraldpb.AclOperation_ACL_OP_DESCRIBE)}, func(ctx context.Context, c *client.Client) error {
			_, _, err := c.ListScheduled(ctx, "sched", 10)
			return err
		}},
		{"ListOffsets", []*heraldpb.AclRule{allow(u, topicT, "offs", heraldpb.AclOperation_ACL_OP_DESCRIBE)}, func(ctx context.Context, c *client.Client) error {
			_, err := c.ListOffsets(ctx, "offs", 0, heraldpb.OffsetSpec_OFFSET_SPEC_LATEST, time.Time{})
			return err
		}},
		{"Call (request-reply)", []*heraldpb.AclRule{allow(u, topicT, "rpc", heraldpb.AclOperation_ACL_OP_PRODUCE)}, func(ctx context.Context, c *client.Client) error {
			_, err := c.Request(ctx, "rpc", &client.Message{Value: []byte("ping")})
			if client.IsCode(err, heraldpb.ErrorCode_NO_RESPONDERS) {
				return nil // past the ACL: nobody answers
			}
			return err
		}},
		{"RegisterProducer (check-back)", []*heraldpb.AclRule{allow(u, pgT, "checked", heraldpb.AclOperation_ACL_OP_PRODUCE)}, func(ctx context.Context, c *client.Client) error {
			stop, err := c.RegisterTransactionChecker(ctx, "checked", func(context.Context, *client.HalfCheck) client.HalfAction { return client.HalfCommit })
			if err == nil {
				stop()
			}
			return err
		}},
		{"ListTxn of a producer group", []*heraldpb.AclRule{allow(u, pgT, "listed", heraldpb.AclOperation_ACL_OP_DESCRIBE)}, func(ctx context.Context, c *client.Client) error {
			_, _, err := c.ListTxn(ctx, "listed", 10)
			return err
		}},
		{"Transaction (produce, EndTxn)", []*heraldpb.AclRule{allow(u, txnT, "tx2", heraldpb.AclOperation_ACL_OP_PRODUCE), allow(u, topicT, "t", heraldpb.AclOperation_ACL_OP_PRODUCE)}, func(ctx context.Context, c *client.Client) error {
			tp, err := c.NewTransactionalProducer(ctx, "tx2")
			if err != nil {
				return err
			}
			defer tp.Close(ctx)
			if err := tp.Begin(); err != nil {
				return err
			}
			if _, err := tp.Send(ctx, &client.Message{Topic: "t", Partition: 0, Value: []byte("in a transaction")}); err != nil {
				return err
			}
			_, err = tp.Commit(ctx)
			return err
		}},
		{"CancelScheduled", []*heraldpb.AclRule{allow(u, heraldpb.AclResourceType_ACL_RESOURCE_VHOST, "/", heraldpb.AclOperation_ACL_OP_ALTER)}, func(ctx context.Context, c *client.Client) error {
			err := c.CancelScheduled(ctx, "999999")
			if client.IsCode(err, heraldpb.ErrorCode_SCHEDULE_NOT_FOUND) {
				return nil // past the ACL: no such delayed message
			}
			return err
		}},
		{"ListUsers (admin)", []*heraldpb.AclRule{allow(u, clusterT, "", heraldpb.AclOperation_ACL_OP_ADMIN)}, func(ctx context.Context, c *client.Client) error {
			_, err := c.ListUsers(ctx)
			return err
		}},
		{"DeleteTopic", []*heraldpb.AclRule{allow(u, topicT, "made", heraldpb.AclOperation_ACL_OP_DELETE)}, func(ctx context.Context, c *client.Client) error {
			return c.DeleteTopic(ctx, "made")
		}},
	}
	carol := dial(t, p, client.WithSCRAM("carol", "carol-secret"))
	for _, tc := range cases {
		err := tc.do(ctx, carol)
		if !errors.Is(err, client.ErrNotAuthorized) || !strings.Contains(err.Error(), "may not") {
			t.Fatalf("%s without its ACL: %v, want NOT_AUTHORIZED", tc.name, err)
		}
		if err := admin.AlterAcls(ctx, tc.rules, nil); err != nil {
			t.Fatal(err)
		}
		if err := tc.do(ctx, carol); err != nil {
			t.Fatalf("%s with its ACL: %v", tc.name, err)
		}
	}
	// Listings show only what carol may describe; internal topics are
	// out of her reach whatever the rules say.
	topics, err := carol.ListTopics(ctx)
	if err != nil || len(topics) != 4 || topics[0].Name != "offs" || topics[1].Name != "rpc" || topics[2].Name != "sched" || topics[3].Name != "t" {
		t.Fatalf("carol's topics: %v %v", topics, err)
	}
	if err := admin.AlterAcls(ctx, []*heraldpb.AclRule{allow(u, topicT, "*", heraldpb.AclOperation_ACL_OP_ALL)}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := carol.Fetch(ctx, "__groups", 0, 0, 1<<20, 0); !errors.Is(err, client.ErrNotAuthorized) || !strings.Contains(err.Error(), "internal") {
		t.Fatalf("carol reads __groups: %v", err)
	}
	// A deny wins over the allows.
	deny := allow(u, topicT, "t", heraldpb.AclOperation_ACL_OP_PRODUCE)
	deny.Deny = true
	if err := admin.AlterAcls(ctx, []*heraldpb.AclRule{deny}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := carol.NewProducer().Send(ctx, &client.Message{Topic: "t", Value: []byte("z")}); !errors.Is(err, client.ErrNotAuthorized) {
		t.Fatalf("produce under a deny rule: %v", err)
	}
	// The rules survive a restart, and the CLI lists them.
	p.Stop(t)
	p.Start(t)
	out, errOut, code := herald(t, "", "acl", "list", "--principal", "user:carol", "--addr", p.Addr(), "--user", "admin", "--password-file", writeSecret(t, t.TempDir(), "pw", "admin-secret"))
	if code != 0 || !regexpLine(out, `^user:carol\s+deny\s+produce\s+topic\s+t\s+literal$`) || !regexpLine(out, `^user:carol\s+allow\s+admin\s+cluster\s+-\s+literal$`) {
		t.Fatalf("acl list: %d %q %q", code, out, errOut)
	}
}
