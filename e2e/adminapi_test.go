package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/adminapi"
	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// apiCall sends method path (with body) to the admin port at addr and decodes the JSON answer into out
// (when out is not nil); it returns the status.
func apiCall(t testing.TB, method, addr, path string, body string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if method != "GET" {
		req.Header.Set(adminapi.ActionHeader, "1")
	}
	return doAPI(t, req, out)
}

// doAPI sends req and decodes its JSON answer into out (when not nil).
func doAPI(t testing.TB, req *http.Request, out any) int {
	t.Helper()
	method, path := req.Method, req.URL.Path
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("%s %s: Content-Type %q, want JSON: %s", method, path, ct, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return resp.StatusCode
}

func apiErrorCode(t testing.TB, method, addr, path, body string) (int, string) {
	t.Helper()
	var e adminapi.ErrorBody
	st := apiCall(t, method, addr, path, body, &e)
	return st, e.Error.Code
}

// The admin API on a single node: every read, the typed JSON errors, the
// two actions with their guards, and the event stream.
func TestAdminAPI(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "orders", 3)
	ctx := ctxT(t, 60*time.Second)
	p := c.NewProducer()
	for i := range 100 {
		p.SendAsync(ctx, &client.Message{Topic: "orders", Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")}, nil)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	admin := n.AdminAddr()

	var cl adminapi.Cluster
	if st := apiCall(t, "GET", admin, "/api/v1/cluster", "", &cl); st != 200 {
		t.Fatalf("cluster: status %d", st)
	}
	if cl.Mode != "single-node" || cl.ViewOf != 1 || len(cl.Members) != 1 || cl.Members[0].State != adminapi.StateAlive || !cl.Members[0].Self ||
		cl.Members[0].Leads != 3 || cl.Members[0].Address != n.Addr() || cl.Members[0].Version == "" || cl.Members[0].StartedAt == nil || !cl.ControllerReachable {
		t.Fatalf("cluster: %+v", cl)
	}

	if out, errOut, code := herald(t, "", "cluster", "status", "--admin", admin); code != 0 || !strings.Contains(out, "single-node, as node 1 sees it") ||
		!regexp.MustCompile(`(?m)^1\s+`+regexp.QuoteMeta(n.Addr())+`\s+alive\s+\S+\s+3\s+0\s+-\s+`).MatchString(out) {
		t.Fatalf("herald cluster status: exit %d\n%s%s", code, out, errOut)
	}
	checkFor(t, 20*time.Second, "orders with its 100 messages", func() error {
		var ts struct {
			ViewOf uint64                  `json:"view_of"`
			Topics []adminapi.TopicSummary `json:"topics"`
		}
		apiCall(t, "GET", admin, "/api/v1/topics", "", &ts)
		for _, tp := range ts.Topics {
			if tp.Name == "orders" && tp.Messages == 100 && tp.Partitions == 3 && tp.Replication == 1 {
				return nil
			}
		}
		return fmt.Errorf("topics: %+v", ts.Topics)
	})
	var tp adminapi.Topic
	if st := apiCall(t, "GET", admin, "/api/v1/topics/orders", "", &tp); st != 200 || len(tp.PartitionList) != 3 || !strings.Contains(string(tp.Config), `"partitions": 3`) && !strings.Contains(string(tp.Config), `"partitions":3`) {
		t.Fatalf("topics/orders: status %d, %+v, config %s", st, tp, tp.Config)
	}
	for _, pt := range tp.PartitionList {
		if pt.Leader != 1 || pt.UnderReplicated || pt.Offline || len(pt.LiveReplicas) != 1 {
			t.Fatalf("partition %+v", pt)
		}
	}
	if st, code := apiErrorCode(t, "GET", admin, "/api/v1/topics/nope", ""); st != 404 || code != "TOPIC_NOT_FOUND" {
		t.Fatalf("unknown topic: %d %s", st, code)
	}
	if st, code := apiErrorCode(t, "GET", admin, "/api/v1/groups/nope", ""); st != 404 || code != "GROUP_NOT_FOUND" {
		t.Fatalf("unknown group: %d %s", st, code)
	}
	if st, code := apiErrorCode(t, "GET", admin, "/api/v1/nothing", ""); st != 404 || code != "INVALID_REQUEST" {
		t.Fatalf("unknown call: %d %s", st, code)
	}
	// The dashboard at /, with its files, served from the binary.
	for path, want := range map[string]string{"/": "<title>Herald</title>", "/ui/app.js": "new EventSource(\"/api/v1/events\")", "/ui/style.css": ".card"} {
		resp, err := http.Get("http://" + admin + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Fatalf("GET %s: %d, %d bytes without %q", path, resp.StatusCode, len(b), want)
		}
	}
	if resp, err := http.Get("http://" + admin + "/no/such/page"); err != nil || resp.StatusCode != 404 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("unknown page: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// Actions are refused without the action header, or from another
	// site's page.
	for _, hdr := range []map[string]string{{}, {adminapi.ActionHeader: "1", "Origin": "http://evil.example"}} {
		req, _ := http.NewRequest("DELETE", "http://"+admin+"/api/v1/topics/orders?confirm=orders", nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		var e adminapi.ErrorBody
		if st := doAPI(t, req, &e); st < 400 || (e.Error.Code != "INVALID_REQUEST" && e.Error.Code != "NOT_AUTHORIZED") {
			t.Fatalf("delete with headers %v: %d %+v", hdr, st, e)
		}
	}

	// A group with a member: listed, described, and not reset under it.
	got := make(chan struct{}, 200)
	sub, err := c.Subscribe(ctx, client.SubscribeOptions{Group: "billing", Topic: "orders", Mode: client.Clustering, From: client.Earliest()},
		func(context.Context, *client.Delivered) { got <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, 30*time.Second, "billing listed with its member and no lag", func() error {
		var g adminapi.Group
		if st := apiCall(t, "GET", admin, "/api/v1/groups/billing", "", &g); st != 200 {
			return fmt.Errorf("status %d", st)
		}
		if g.Members != 1 || g.Topic != "orders" || g.Mode != "clustering" || g.Lag != 0 || g.Breaker != "closed" || len(g.LagHistory) == 0 || !strings.Contains(string(g.Info), `"members"`) {
			return fmt.Errorf("group %+v", g.GroupSummary)
		}
		return nil
	})
	if st, code := apiErrorCode(t, "POST", admin, "/api/v1/groups/billing/reset", `{"to":"earliest"}`); st != 409 || code != "GROUP_HAS_MEMBERS" {
		t.Fatalf("reset with a member: %d %s", st, code)
	}
	if st, code := apiErrorCode(t, "POST", admin, "/api/v1/groups/billing/reset", `{"to":"sideways"}`); st != 400 || code != "INVALID_REQUEST" {
		t.Fatalf("reset to nowhere: %d %s", st, code)
	}
	_ = sub.Close(ctx)
	var reset map[string]json.RawMessage
	if st := apiCall(t, "POST", admin, "/api/v1/groups/billing/reset", `{"to":"earliest"}`, &reset); st != 200 || reset["group"] == nil {
		t.Fatalf("reset without members: %d %v", st, reset)
	}
	checkFor(t, 20*time.Second, "billing's lag back to 100 after the reset", func() error {
		var g adminapi.Group
		apiCall(t, "GET", admin, "/api/v1/groups/billing", "", &g)
		if g.Lag != 100 {
			return fmt.Errorf("lag %d", g.Lag)
		}
		return nil
	})

	var al adminapi.Alerts
	if st := apiCall(t, "GET", admin, "/api/v1/alerts", "", &al); st != 200 || len(al.Alerts) != 0 {
		t.Fatalf("alerts of a healthy node: %d %+v", st, al)
	}
	var sc adminapi.Scheduler
	if st := apiCall(t, "GET", admin, "/api/v1/scheduler", "", &sc); st != 200 || sc.Buckets == nil || sc.Lateness == nil {
		t.Fatalf("scheduler: %d %+v", st, sc)
	}
	// A delayed message: pending in the 1m bucket, then fired, with its
	// lateness.
	if _, err := p.Send(ctx, &client.Message{Topic: "orders", Value: []byte("later"), Delay: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	var pendingSeen bool
	checkFor(t, 20*time.Second, "the delayed message pending, then fired with its lateness", func() error {
		var sc adminapi.Scheduler
		apiCall(t, "GET", admin, "/api/v1/scheduler", "", &sc)
		if sc.Pending == 1 && sc.Buckets["1m"] == 1 {
			pendingSeen = true
		}
		if !pendingSeen || sc.Lateness == nil || sc.Lateness.Fired != 1 || sc.Lateness.P99Seconds == 0 {
			return fmt.Errorf("pending seen %v; %+v, lateness %+v", pendingSeen, sc, sc.Lateness)
		}
		return nil
	})

	// The event stream sends the snapshot.
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+admin+"/api/v1/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("events: Content-Type %q", ct)
	}
	sc2 := bufio.NewScanner(resp.Body)
	sc2.Buffer(make([]byte, 1<<20), 8<<20)
	var event string
	for sc2.Scan() {
		line := sc2.Text()
		if v, ok := strings.CutPrefix(line, "event: "); ok {
			event = v
		}
		if v, ok := strings.CutPrefix(line, "data: "); ok {
			var sn adminapi.Snapshot
			if event != "snapshot" || json.Unmarshal([]byte(v), &sn) != nil || len(sn.Cluster.Members) != 1 || len(sn.Topics) == 0 {
				t.Fatalf("first event %q: %.300s", event, v)
			}
			break
		}
	}
	resp.Body.Close()

	// Moving a replica: the body is checked, and a single node has no
	// replicas to move.
	for _, c := range []struct{ path, body, code string }{
		{"/api/v1/topics/orders/partitions/x/move", `{"from":1,"to":2}`, "INVALID_REQUEST"},
		{"/api/v1/topics/orders/partitions/0/move", `{"from":1}`, "INVALID_REQUEST"},
		{"/api/v1/topics/orders/partitions/0/move", `{"from":1,"to":2,"extra":1}`, "INVALID_REQUEST"},
	} {
		if st, code := apiErrorCode(t, "POST", admin, c.path, c.body); st != 400 || code != c.code {
			t.Fatalf("POST %s %s: %d %s", c.path, c.body, st, code)
		}
	}
	if st, code := apiErrorCode(t, "POST", admin, "/api/v1/topics/orders/partitions/0/move", `{"from":1,"to":2}`); st < 400 || code == "" {
		t.Fatalf("a move on a single node: %d %s", st, code)
	}

	// Delete needs the name again.
	if st, code := apiErrorCode(t, "DELETE", admin, "/api/v1/topics/orders", ""); st != 400 || code != "INVALID_REQUEST" {
		t.Fatalf("delete without confirm: %d %s", st, code)
	}
	if st, code := apiErrorCode(t, "DELETE", admin, "/api/v1/topics/orders?confirm=order", ""); st != 400 || code != "INVALID_REQUEST" {
		t.Fatalf("delete with a wrong confirm: %d %s", st, code)
	}
	if st := apiCall(t, "DELETE", admin, "/api/v1/topics/orders?confirm=orders", "", nil); st != 200 {
		t.Fatalf("delete: %d", st)
	}
	checkFor(t, 20*time.Second, "orders gone", func() error {
		if st, code := apiErrorCode(t, "GET", admin, "/api/v1/topics/orders", ""); st != 404 || code != "TOPIC_NOT_FOUND" {
			return fmt.Errorf("%d %s", st, code)
		}
		return nil
	})
	if _, err := c.DescribeTopic(ctx, "orders"); !client.IsCode(err, heraldpb.ErrorCode_TOPIC_NOT_FOUND) {
		t.Fatalf("orders after its delete: %v", err)
	}
}

// --admin-read-only refuses the actions and keeps the reads.
func TestAdminAPIReadOnly(t *testing.T) {
	n := startProc(t, t.TempDir(), "--admin-read-only")
	c := dial(t, n)
	createTopic(t, c, "orders", 1)
	if st, code := apiErrorCode(t, "DELETE", n.AdminAddr(), "/api/v1/topics/orders?confirm=orders", ""); st != 403 || code != "NOT_AUTHORIZED" {
		t.Fatalf("delete in read-only mode: %d %s", st, code)
	}
	if st, code := apiErrorCode(t, "POST", n.AdminAddr(), "/api/v1/groups/g/reset", `{"to":"earliest"}`); st != 403 || code != "NOT_AUTHORIZED" {
		t.Fatalf("reset in read-only mode: %d %s", st, code)
	}
	checkFor(t, 10*time.Second, "orders still there, read-only shown", func() error {
		var tp adminapi.Topic
		if st := apiCall(t, "GET", n.AdminAddr(), "/api/v1/topics/orders", "", &tp); st != 200 {
			return fmt.Errorf("status %d", st)
		}
		return nil
	})
	if _, err := c.DescribeTopic(context.Background(), "orders"); err != nil {
		t.Fatal(err)
	}
}

// With logins on, the admin API signs in with Herald's users (HTTP basic):
// each user sees what its ACLs let it describe and does what they let it
// do; refusals are JSON; the audit log records the actions.
func TestAdminAPIWithLogins(t *testing.T) {
	p, _ := startAuthBroker(t)
	ctx := ctxT(t, 60*time.Second)
	admin := dial(t, p, client.WithSCRAM("admin", "admin-secret"))
	for _, name := range []string{"orders", "secret"} {
		if _, err := admin.CreateTopic(ctx, name, &heraldpb.TopicConfig{Partitions: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.AddUser(ctx, "viewer", "viewer-secret", 0); err != nil {
		t.Fatal(err)
	}
	if err := admin.AlterAcls(ctx, []*heraldpb.AclRule{
		{Principal: "user:viewer", ResourceType: heraldpb.AclResourceType_ACL_RESOURCE_CLUSTER, Operation: heraldpb.AclOperation_ACL_OP_DESCRIBE},
		{Principal: "user:viewer", ResourceType: heraldpb.AclResourceType_ACL_RESOURCE_TOPIC, Resource: "orders", Operation: heraldpb.AclOperation_ACL_OP_DESCRIBE},
	}, nil); err != nil {
		t.Fatal(err)
	}
	call := func(method, path, user, pw string, out any) int {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+p.AdminAddr()+path, nil)
		if user != "" {
			req.SetBasicAuth(user, pw)
		}
		if method != "GET" {
			req.Header.Set(adminapi.ActionHeader, "1")
		}
		return doAPI(t, req, out)
	}
	var e adminapi.ErrorBody
	if st := call("GET", "/api/v1/topics", "", "", &e); st != 401 || e.Error.Code != "NOT_AUTHENTICATED" {
		t.Fatalf("anonymous: %d %+v", st, e)
	}
	if st := call("GET", "/api/v1/topics", "viewer", "wrong", &e); st != 401 || e.Error.Code != "NOT_AUTHENTICATED" {
		t.Fatalf("a wrong password: %d %+v", st, e)
	}
	names := func(user, pw string) []string {
		var ts struct {
			Topics []adminapi.TopicSummary `json:"topics"`
		}
		if st := call("GET", "/api/v1/topics", user, pw, &ts); st != 200 {
			t.Fatalf("topics as %s: %d", user, st)
		}
		var out []string
		for _, tp := range ts.Topics {
			if !tp.Internal {
				out = append(out, tp.Name)
			}
		}
		return out
	}
	if got := names("viewer", "viewer-secret"); strings.Join(got, ",") != "orders" {
		t.Fatalf("the viewer sees topics %v, want only orders", got)
	}
	if got := names("admin", "admin-secret"); strings.Join(got, ",") != "orders,secret" {
		t.Fatalf("the admin sees topics %v", got)
	}
	if st := call("DELETE", "/api/v1/topics/orders?confirm=orders", "viewer", "viewer-secret", &e); st != 403 || e.Error.Code != "NOT_AUTHORIZED" {
		t.Fatalf("the viewer's delete: %d %+v", st, e)
	}
	if st := call("DELETE", "/api/v1/topics/orders?confirm=orders", "admin", "admin-secret", nil); st != 200 {
		t.Fatalf("the admin's delete: %d", st)
	}
	checkFor(t, 10*time.Second, "the audit log's entries for the API's actions", func() error {
		b, err := os.ReadFile(filepath.Join(p.DataDir(), "audit.log"))
		if err != nil {
			return err
		}
		for _, want := range []string{`"principal":"viewer"`, `"action":"delete_topic"`, `"http DELETE /api/v1/topics/orders"`} {
			if !strings.Contains(string(b), want) {
				return fmt.Errorf("no %s in the audit log:\n%s", want, b)
			}
		}
		return nil
	})
}

// docs/admin-api.md's example of each read has the fields the API
// answers with, no more and no fewer: the API's JSON contract. The setup
// is the docs': a topic orders of two partitions with 50 messages, and a
// group billing with a member.
func TestAdminAPIDocExamples(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "admin-api.md"))
	if err != nil {
		t.Fatal(err)
	}
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "orders", 2)
	ctx := ctxT(t, 60*time.Second)
	p := c.NewProducer()
	for range 50 {
		p.SendAsync(ctx, &client.Message{Topic: "orders", Value: []byte("v")}, nil)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, client.SubscribeOptions{Group: "billing", Topic: "orders", Mode: client.Clustering, From: client.Earliest()},
		func(context.Context, *client.Delivered) {})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(ctx)
	checkFor(t, 20*time.Second, "billing done with the 50", func() error {
		var g adminapi.Group
		if st := apiCall(t, "GET", n.AdminAddr(), "/api/v1/groups/billing", "", &g); st != 200 || g.Lag != 0 || len(g.LagHistory) < 2 {
			return fmt.Errorf("status %d, %+v", st, g.GroupSummary)
		}
		return nil
	})

	lines := strings.Split(string(doc), "\n")
	checked := 0
	for i := 0; i < len(lines); i++ {
		path, ok := strings.CutPrefix(lines[i], "### GET ")
		if !ok || path == "/api/v1/events" {
			continue
		}
		// The first JSON block after the heading.
		for i < len(lines) && lines[i] != "```json" {
			i++
		}
		var block []string
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			block = append(block, lines[i])
		}
		var want any
		if err := json.Unmarshal([]byte(strings.Join(block, "\n")), &want); err != nil {
			t.Fatalf("docs/admin-api.md, the example of %s: %v", path, err)
		}
		real := strings.NewReplacer("{name}", map[bool]string{true: "orders", false: "billing"}[strings.Contains(path, "topics")]).Replace(path)
		var got any
		if st := apiCall(t, "GET", n.AdminAddr(), real, "", &got); st != 200 {
			t.Fatalf("GET %s: %d", real, st)
		}
		if d := sameShape(path, want, got); d != "" {
			t.Errorf("docs/admin-api.md's example of GET %s differs from the API's answer: %s", path, d)
		}
		checked++
	}
	if checked != 7 {
		t.Fatalf("checked %d examples in docs/admin-api.md, want the 7 reads", checked)
	}
	// The documented error.
	if st, code := apiErrorCode(t, "GET", n.AdminAddr(), "/api/v1/topics/nope", ""); st != 404 || code != "TOPIC_NOT_FOUND" || !strings.Contains(string(doc), `"code": "TOPIC_NOT_FOUND"`) {
		t.Fatalf("the documented error: %d %s", st, code)
	}
}

// sameShape compares the fields of two decoded JSON values (objects by
// their keys, arrays by their first elements when both have one); it
// returns the first difference, or "".
func sameShape(at string, want, got any) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s: an object in the docs, %T in the answer", at, got)
		}
		for k := range w {
			if _, ok := g[k]; !ok {
				return fmt.Sprintf("%s.%s: in the docs, not in the answer", at, k)
			}
		}
		for k := range g {
			if _, ok := w[k]; !ok {
				return fmt.Sprintf("%s.%s: in the answer, not in the docs", at, k)
			}
		}
		for k := range w {
			if d := sameShape(at+"."+k, w[k], g[k]); d != "" {
				return d
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok {
			return fmt.Sprintf("%s: an array in the docs, %T in the answer", at, got)
		}
		if len(w) > 0 && len(g) > 0 {
			return sameShape(at+"[0]", w[0], g[0])
		}
	default:
		if want != nil && got != nil && fmt.Sprintf("%T", want) != fmt.Sprintf("%T", got) {
			return fmt.Sprintf("%s: %T in the docs, %T in the answer", at, want, got)
		}
	}
	return ""
}

// In a cluster every node answers for the whole cluster and says whose
// view it is; a node left without the controller says its view may be
// stale, and alerts on it, rather than serving it as fresh.
func TestAdminAPIClusterView(t *testing.T) {
	tc, c := clusterWithTopic(t, "orders", 3)
	_ = c
	for id, p := range tc.nodes {
		checkFor(t, 20*time.Second, fmt.Sprintf("node %d's view: three alive members, orders replicated", id), func() error {
			var cl adminapi.Cluster
			if st := apiCall(t, "GET", p.AdminAddr(), "/api/v1/cluster", "", &cl); st != 200 {
				return fmt.Errorf("status %d", st)
			}
			if cl.ViewOf != id || cl.Mode != "cluster" || len(cl.Members) != 3 || !cl.ControllerReachable || cl.Stale != "" {
				return fmt.Errorf("%+v", cl)
			}
			leads := 0
			for _, m := range cl.Members {
				if m.State != adminapi.StateAlive || m.ClusterAddress == "" {
					return fmt.Errorf("member %+v", m)
				}
				leads += m.Leads
			}
			var tp adminapi.Topic
			if st := apiCall(t, "GET", p.AdminAddr(), "/api/v1/topics/orders", "", &tp); st != 200 || tp.Replication != 3 || tp.UnderReplicated != 0 {
				return fmt.Errorf("orders: %d %+v", st, tp.TopicSummary)
			}
			if leads < 3 {
				return fmt.Errorf("members lead %d partitions, want at least orders' 3", leads)
			}
			return nil
		})
	}
	// Kill the controller's leader and one more node: the last one cannot
	// reach a controller.
	cv, _, err := getController(tc.nodes[1])
	if err != nil {
		t.Fatal(err)
	}
	leader := cv.Leader
	var survivor uint64
	for id := range tc.nodes {
		if id != leader && survivor == 0 {
			survivor = id
		}
	}
	for id, p := range tc.nodes {
		if id != survivor {
			p.Kill(t)
		}
	}
	admin := tc.nodes[survivor].AdminAddr()
	checkFor(t, 30*time.Second, "the survivor saying its view may be stale", func() error {
		var cl adminapi.Cluster
		apiCall(t, "GET", admin, "/api/v1/cluster", "", &cl)
		if cl.ControllerReachable || !strings.Contains(cl.Stale, "cannot reach the controller") {
			return fmt.Errorf("%+v", cl)
		}
		var al adminapi.Alerts
		apiCall(t, "GET", admin, "/api/v1/alerts", "", &al)
		kinds := map[string]int{}
		for _, a := range al.Alerts {
			kinds[a.Kind]++
		}
		if kinds["controller_unreachable"] != 1 || kinds["node_down"] != 2 {
			return fmt.Errorf("alerts %+v", al.Alerts)
		}
		return nil
	})
}

// TestAdminAPIInSyncReplicas: every node reports each partition's
// in-sync replicas as the partition's leader tells them (all three), and
// the bytes its leader serves to a reader, and the scheduler's fire
// lateness wherever it runs;
// after a follower is SIGKILLed the leaders leave it out, and the
// partitions are under-replicated.
func TestAdminAPIInSyncReplicas(t *testing.T) {
	tc, c := clusterWithTopic(t, "orders", 3)
	isr := func(p *proc) ([]adminapi.Partition, error) {
		var tp adminapi.Topic
		if st := apiCall(t, "GET", p.AdminAddr(), "/api/v1/topics/orders", "", &tp); st != 200 {
			return nil, fmt.Errorf("status %d", st)
		}
		return tp.PartitionList, nil
	}
	for id, p := range tc.nodes {
		checkFor(t, 20*time.Second, fmt.Sprintf("node %d: every partition with three replicas in sync, from its leader", id), func() error {
			parts, err := isr(p)
			if err != nil {
				return err
			}
			for _, pt := range parts {
				if !slices.Equal(pt.InSyncReplicas, []uint32{1, 2, 3}) || pt.InSyncFrom != "leader" || pt.UnderReplicated {
					return fmt.Errorf("partition %d: in sync %v from %q", pt.ID, pt.InSyncReplicas, pt.InSyncFrom)
				}
			}
			// The scheduler's fire lateness, whichever node runs it.
			var sc adminapi.Scheduler
			if st := apiCall(t, "GET", p.AdminAddr(), "/api/v1/scheduler", "", &sc); st != 200 || sc.Lateness == nil {
				return fmt.Errorf("scheduler: %d, lateness %+v, note %q", st, sc.Lateness, sc.LatenessNote)
			}
			return nil
		})
	}
	// Reads show as bytes out, on every node: the leader counts them, the
	// others ask it.
	p := c.NewProducer()
	for range 200 {
		p.SendAsync(ctxT(t, 10*time.Second), &client.Message{Topic: "orders", Partition: 0, Value: make([]byte, 1000)}, nil)
	}
	if err := p.Flush(ctxT(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for part := range int32(3) {
				_, _ = c.Fetch(ctxT(t, 5*time.Second), "orders", part, 0, 1<<20, 0)
			}
		}
	}()
	for id, n := range tc.nodes {
		checkFor(t, 20*time.Second, fmt.Sprintf("node %d: bytes out while a reader fetches", id), func() error {
			var tp adminapi.Topic
			if st := apiCall(t, "GET", n.AdminAddr(), "/api/v1/topics/orders", "", &tp); st != 200 {
				return fmt.Errorf("status %d", st)
			}
			if tp.BytesOutPerSec <= 0 {
				return fmt.Errorf("bytes out %v/s", tp.BytesOutPerSec)
			}
			return nil
		})
	}
	close(stop)
	<-done
	// A follower of partition 0 dies.
	leader := leaderOf(t, c, "orders", 0)
	var victim uint64
	for id := range tc.nodes {
		if uint32(id) != leader {
			victim = id
			break
		}
	}
	tc.nodes[victim].Kill(t)
	checkFor(t, 30*time.Second, "partition 0 under-replicated, the dead follower out of its leader's in-sync set", func() error {
		parts, err := isr(tc.nodes[uint64(leader)])
		if err != nil {
			return err
		}
		p0 := parts[0]
		if slices.Contains(p0.InSyncReplicas, uint32(victim)) || len(p0.InSyncReplicas) != 2 || p0.InSyncFrom != "leader" || !p0.UnderReplicated {
			return fmt.Errorf("partition 0: in sync %v from %q, under-replicated %v", p0.InSyncReplicas, p0.InSyncFrom, p0.UnderReplicated)
		}
		return nil
	})
}
