package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/heraldmq/herald/adminapi"
	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// browserEnv, when set, makes a missing Chromium a failure rather than a
// skip (CI sets it: .ci/run installs Debian's chromium).
const browserEnv = "HERALD_REQUIRE_BROWSER"

// chromium finds a headless-capable Chromium, or skips (fails under
// HERALD_REQUIRE_BROWSER=1).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv(browserEnv) != "" {
		t.Fatalf("no chromium found, and %s is set: install Debian's chromium", browserEnv)
	}
	t.Skip("no chromium found: install Debian's chromium (apt-get install chromium) to run the dashboard's browser tests")
	return ""
}

// browser is a headless Chromium tab that records console errors and
// uncaught exceptions.
type browser struct {
	ctx    context.Context
	mu     sync.Mutex
	errors []string
}

func newBrowser(t *testing.T, width, height int) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium(t)), chromedp.NoSandbox,
		chromedp.WindowSize(width, height), chromedp.Flag("disable-gpu", true))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	b := &browser{ctx: ctx}
	// The first Run starts the browser, with no timeout (a timeout would
	// stop the browser with it).
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[int](`1`)); err != nil {
		cancel()
		cancelA()
		t.Fatalf("starting chromium: %v", err)
	}
	messages := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				b.mu.Lock()
				b.errors = append(b.errors, fmt.Sprintf("%s: %s (%s:%d)", m.Type, m.Text, m.URL, m.Line))
				b.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		cancelA()
		<-done
	})
	// (Cleanups run last first: this one while the browser still runs.)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		dir := os.Getenv("HERALD_ARTIFACTS")
		if dir == "" {
			dir = os.TempDir()
		}
		path := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-failure.png")
		if png, err := b.screenshot(); err != nil {
			t.Logf("no screenshot of the failure: %v", err)
		} else if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Logf("no screenshot of the failure: %v", err)
		} else {
			t.Logf("the page when the test failed: %s", path)
		}
	})
	return b
}

// screenshot is a PNG of the whole page.
func (b *browser) screenshot() ([]byte, error) {
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.FullScreenshot(100))
}

func (b *browser) do(t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](b *browser, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expr))
}

// consoleErrors are the errors the page logged, but for those naming one
// of expected (the failed answer of an action the test made fail).
func (b *browser) consoleErrors(expected ...string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, e := range b.errors {
		if !slices.ContainsFunc(expected, func(x string) bool { return strings.Contains(e, x) }) {
			out = append(out, e)
		}
	}
	return out
}

// The dashboard in a real browser against a real 3-node cluster: it
// loads without console errors and shows three alive members; a topic
// created by the CLI appears; a group's lag appears and falls as it
// consumes; SIGKILL of a node turns its card down and moves its leaders
// off it without a reload, and its restart turns it alive again.
func TestDashboardInABrowser(t *testing.T) {
	chromium(t) // skips early without one
	tc := startCluster(t, 3)
	// After the nodes: its cleanups, a screenshot of a failure among
	// them, run before theirs.
	br := newBrowser(t, 1280, 800)
	n1 := tc.nodes[1]
	c, err := client.Dial(ctxT(t, 10*time.Second), tc.addrs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	url := "http://" + n1.AdminAddr() + "/"
	br.do(t, "open the dashboard", chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(`#nodes`)))

	waitPage := func(what string, total time.Duration, expr string, ok func(string) error) time.Duration {
		t.Helper()
		start := time.Now()
		checkFor(t, total, what, func() error {
			got, err := eval[string](br, expr)
			if err != nil {
				return err
			}
			return ok(got)
		})
		return time.Since(start)
	}
	equals := func(want string) func(string) error {
		return func(got string) error {
			if got != want {
				return fmt.Errorf("page shows %q, want %q", got, want)
			}
			return nil
		}
	}
	waitPage("three alive members", 30*time.Second,
		`[...document.querySelectorAll('.card')].map(c => c.dataset.node + ':' + c.dataset.state).join(',')`, equals("1:alive,2:alive,3:alive"))
	waitPage("live updates", 10*time.Second, `document.querySelector('#conn').dataset.state`, equals("live"))

	// A topic created by the CLI appears.
	if out, errOut, code := herald(t, "", "topic", "create", "orders", "--partitions", "3", "--replication", "3", "--addr", tc.addrs()); code != 0 {
		t.Fatalf("topic create: %s %s", out, errOut)
	}
	waitPage("orders in the topics view with its three leaders", 20*time.Second,
		`[...document.querySelectorAll('[data-partition^="orders/"]')].filter(p => p.dataset.leader !== '0').length + ''`, equals("3"))

	// A replica moved from the page: an RF=2 partition's replica goes to
	// the node that has none.
	if out, errOut, code := herald(t, "", "topic", "create", "moving", "--partitions", "1", "--replication", "2", "--addr", tc.addrs()); code != 0 {
		t.Fatalf("topic create: %s %s", out, errOut)
	}
	ti, err := c.DescribeTopic(ctxT(t, 10*time.Second), "moving")
	if err != nil {
		t.Fatal(err)
	}
	reps := ti.GetPartitions()[0].GetReplicas()
	spare := uint32(6) - reps[0] - reps[1] // nodes 1, 2, 3
	partBox := chromedp.CSS(`button[data-partition="moving/0"]`)
	br.do(t, "move a replica of moving/0", chromedp.WaitVisible(partBox), chromedp.Click(partBox), chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
		chromedp.SetValue(chromedp.CSS(`#confirm-from`), fmt.Sprint(reps[0])), chromedp.SetValue(chromedp.CSS(`#confirm-to-node`), fmt.Sprint(spare)),
		chromedp.Click(chromedp.CSS(`#confirm-ok`)), chromedp.WaitNotVisible(chromedp.CSS(`#confirm`)))
	want := fmt.Sprintf("%d %d", spare, reps[1])
	waitPage("moving/0 on its new replicas", 60*time.Second, `document.querySelector('[data-partition="moving/0"] .muted').textContent`, equals(want))

	// A group's lag appears, then falls as it consumes.
	ctx := ctxT(t, 120*time.Second)
	p := c.NewProducer()
	for i := range 3000 {
		p.SendAsync(ctx, &client.Message{Topic: "orders", Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")}, nil)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	defer open()
	sub, err := c.Subscribe(ctx, client.SubscribeOptions{Group: "billing", Topic: "orders", Mode: client.Clustering, From: client.Earliest(), Window: 16},
		func(ctx context.Context, _ *client.Delivered) {
			select {
			case <-release:
			case <-ctx.Done():
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	lagOf := `(document.querySelector('.group[data-group="billing"]') || {dataset: {lag: 'none'}}).dataset.lag`
	waitPage("billing's lag shown while it is held", 30*time.Second, lagOf, func(got string) error {
		if n, err := strconv.Atoi(got); err != nil || n < 2900 {
			return fmt.Errorf("lag %q, want 2900 or more", got)
		}
		return nil
	})
	// A reset from the page is refused while the group has a member: the
	// dialog says why.
	resetBtn := chromedp.CSS(`.group[data-group="billing"] button[data-action="reset-group"]`)
	br.do(t, "ask for a reset", chromedp.Click(resetBtn), chromedp.WaitVisible(chromedp.CSS(`#confirm`)), chromedp.Click(chromedp.CSS(`#confirm-ok`)))
	waitPage("the dialog saying the group has members", 20*time.Second, `document.querySelector('#confirm-error').textContent`, func(got string) error {
		if !strings.Contains(got, "GROUP_HAS_MEMBERS") {
			return fmt.Errorf("dialog error %q", got)
		}
		return nil
	})
	br.do(t, "cancel", chromedp.Click(chromedp.CSS(`#confirm button[value="cancel"]`)), chromedp.WaitNotVisible(chromedp.CSS(`#confirm`)))
	open()
	waitPage("billing's lag falling to 0", 60*time.Second, lagOf, equals("0"))
	if chartLines, err := eval[int](br, `document.querySelectorAll('.group[data-group="billing"] svg.chart polyline').length`); err != nil || chartLines != 3 {
		t.Fatalf("the lag chart draws %d lines (%v), want one per partition", chartLines, err)
	}

	// With its member gone, the reset from the page replays the topic.
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitPage("billing without members", 20*time.Second, `document.querySelector('.group[data-group="billing"] .empty') ? 'none' : 'some'`, equals("none"))
	br.do(t, "reset billing to earliest", chromedp.Click(resetBtn), chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
		chromedp.SetValue(chromedp.CSS(`#confirm-to`), "earliest"), chromedp.Click(chromedp.CSS(`#confirm-ok`)), chromedp.WaitNotVisible(chromedp.CSS(`#confirm`)))
	waitPage("billing's lag back to 3000 after the reset", 20*time.Second, lagOf, equals("3000"))

	// No text overflows its box at 1280×800.
	overflowing, err := eval[[]string](br, `[...document.querySelectorAll('.card, .card dd, .alert, .group h3, .group .cols > div, #topic-list, td')].filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.className + ':' + e.textContent.slice(0, 40))`)
	if err != nil {
		t.Fatal(err)
	}
	if len(overflowing) > 0 {
		t.Errorf("text overflows its box at 1280x800: %q", overflowing)
	}

	// SIGKILL of node 3: its card turns down, and its leaders move.
	tc.nodes[3].Kill(t)
	took := waitPage("node 3's card down", 15*time.Second, `document.querySelector('.card[data-node="3"]').dataset.state`, equals("down"))
	t.Logf("node 3 shown down %v after its SIGKILL", took.Round(100*time.Millisecond))
	took2 := waitPage("no partition of orders led by node 3", 15*time.Second,
		`[...document.querySelectorAll('[data-partition^="orders/"]')].map(p => p.dataset.leader).join(',')`, func(got string) error {
			for _, l := range strings.Split(got, ",") {
				if l == "3" || l == "0" {
					return fmt.Errorf("leaders %s", got)
				}
			}
			return nil
		})
	t.Logf("orders' leaders off node 3 %v after its SIGKILL", (took + took2).Round(100*time.Millisecond))
	waitPage("an alert for node 3 at the top", 10*time.Second, `[...document.querySelectorAll('#alerts .alert')].map(a => a.dataset.kind + ':' + a.dataset.subject).join(',')`, func(got string) error {
		if !strings.Contains(got, "node_down:node 3") {
			return fmt.Errorf("alerts %q", got)
		}
		return nil
	})

	// The CLI reads the same view.
	if out, errOut, code := herald(t, "", "cluster", "status", "--admin", n1.AdminAddr()); code != 0 || !regexp.MustCompile(`(?m)^3\s+\S+\s+down\s`).MatchString(out) {
		t.Fatalf("herald cluster status with node 3 killed: exit %d\n%s%s", code, out, errOut)
	}

	// Restarted, it is alive again.
	tc.nodes[3].Start(t)
	waitPage("node 3's card alive again", 40*time.Second, `document.querySelector('.card[data-node="3"]').dataset.state`, equals("alive"))

	// A paused node does not hang the page: its card says it does not
	// answer, and the page goes on updating.
	if err := tc.nodes[2].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cont := func() { _ = tc.nodes[2].cmd.Process.Signal(syscall.SIGCONT) }
	defer cont()
	took = waitPage("node 2's card saying it does not answer", 20*time.Second,
		`(c => c.dataset.state + ': ' + (c.querySelector('.note') || {textContent: ''}).textContent)(document.querySelector('.card[data-node="2"]'))`, func(got string) error {
			if !strings.Contains(got, "no answer from node 2") {
				return fmt.Errorf("card %q", got)
			}
			return nil
		})
	t.Logf("node 2 shown not answering %v after its SIGSTOP", took.Round(100*time.Millisecond))
	before, err := eval[string](br, `document.querySelector('#updated').dataset.at`)
	if err != nil {
		t.Fatal(err)
	}
	waitPage("the page still updating with node 2 paused", 20*time.Second, `document.querySelector('#updated').dataset.at`, func(got string) error {
		if got == before {
			return fmt.Errorf("last update %s", got)
		}
		return nil
	})
	cont()
	waitPage("node 2's card alive after SIGCONT", 30*time.Second, `document.querySelector('.card[data-node="2"]').dataset.state`, equals("alive"))

	// (The refused reset's answer, 409, is logged by the browser.)
	if errs := br.consoleErrors("409 (Conflict) (http://" + n1.AdminAddr() + "/api/v1/groups/billing/reset"); len(errs) > 0 {
		t.Fatalf("the page logged errors: %q", errs)
	}

	// The API the page reads agrees.
	var cl adminapi.Cluster
	apiCall(t, "GET", n1.AdminAddr(), "/api/v1/cluster", "", &cl)
	if cl.Mode != "cluster" || len(cl.Members) != 3 || !cl.ControllerReachable {
		t.Fatalf("cluster: %+v", cl)
	}
}

// In read-only mode the page shows it, disables its actions, and the API
// refuses an action sent from the page.
func TestDashboardReadOnly(t *testing.T) {
	chromium(t)
	n := startProc(t, t.TempDir(), "--admin-read-only")
	br := newBrowser(t, 1920, 1080)
	c := dial(t, n)
	createTopic(t, c, "orders", 2)
	br.do(t, "open the dashboard", chromedp.Navigate("http://"+n.AdminAddr()+"/"), chromedp.WaitVisible(chromedp.CSS(`#readonly`)))
	checkFor(t, 20*time.Second, "orders shown with its delete disabled", func() error {
		got, err := eval[string](br, `(b => b ? String(b.disabled) : 'none')(document.querySelector('tr[data-topic="orders"] button[data-action="delete-topic"]'))`)
		if err != nil {
			return err
		}
		if got != "true" {
			return fmt.Errorf("delete button: %s", got)
		}
		return nil
	})
	code, err := chromedp.Run(br.ctx, chromedp.Evaluate[string](`fetch('/api/v1/topics/orders?confirm=orders', {method: 'DELETE', headers: {'X-Herald-Action': '1'}}).then(r => r.json()).then(j => j.error.code)`, chromedp.EvalAwaitPromise))
	if err != nil || code != "NOT_AUTHORIZED" {
		t.Fatalf("delete from the read-only page: %q %v", code, err)
	}
	if _, err := c.DescribeTopic(ctxT(t, 10*time.Second), "orders"); err != nil {
		t.Fatalf("orders after a refused delete: %v", err)
	}
	overflowing, err := eval[[]string](br, `[...document.querySelectorAll('.card, .card dd, .alert, #topic-list, td')].filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.className + ':' + e.textContent.slice(0, 40))`)
	if err != nil || len(overflowing) > 0 {
		t.Fatalf("text overflows its box at 1920x1080: %q %v", overflowing, err)
	}
	if errs := br.consoleErrors("403 (Forbidden) (http://" + n.AdminAddr() + "/api/v1/topics/orders"); len(errs) > 0 {
		t.Fatalf("the page logged errors: %q", errs)
	}
}

var updateShots = flag.Bool("update-screenshots", false, "TestDashboardScreenshots: write docs/images/dashboard-*.png")

// TestDashboardScreenshots makes the screenshots docs/dashboard.md shows,
// from a real 3-node cluster with a topic, a group with lag and a node
// down: `go test ./e2e -run TestDashboardScreenshots -update-screenshots`.
// Without the flag it checks that the page renders those states.
func TestDashboardScreenshots(t *testing.T) {
	chromium(t)
	tc := startCluster(t, 3)
	br := newBrowser(t, 1280, 800)
	c, err := client.Dial(ctxT(t, 10*time.Second), tc.addrs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := ctxT(t, 120*time.Second)
	for _, tp := range []struct {
		name  string
		parts uint32
	}{{"orders", 3}, {"payments", 2}} {
		if _, err := c.CreateTopic(ctx, tp.name, &heraldpb.TopicConfig{Partitions: tp.parts, ReplicationFactor: 3}); err != nil {
			t.Fatal(err)
		}
	}
	p := c.NewProducer()
	for i := range 2000 {
		p.SendAsync(ctx, &client.Message{Topic: []string{"orders", "payments"}[i%2], Key: fmt.Appendf(nil, "k%d", i), Value: make([]byte, 200)}, nil)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// A slow consumer: its lag falls over about 15 s.
	sub, err := c.Subscribe(ctx, client.SubscribeOptions{Group: "billing", Topic: "orders", Mode: client.Clustering, From: client.Earliest(), Window: 2},
		func(ctx context.Context, _ *client.Delivered) { time.Sleep(15 * time.Millisecond) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	br.do(t, "open the dashboard", chromedp.Navigate("http://"+tc.nodes[1].AdminAddr()+"/"), chromedp.WaitVisible(chromedp.CSS(`#nodes`)))
	wait := func(what, expr, want string) {
		t.Helper()
		checkFor(t, 30*time.Second, what, func() error {
			got, err := eval[string](br, expr)
			if err != nil {
				return err
			}
			if got != want {
				return fmt.Errorf("%q, want %q", got, want)
			}
			return nil
		})
	}
	wait("billing's lag falling, charted", `(g => g && g.dataset.lag > 100 && g.dataset.lag < 700 && g.querySelectorAll('svg.chart polyline').length === 3 ? 'yes' : 'no')(document.querySelector('.group[data-group="billing"]'))`, "yes")
	shots := map[string][]byte{}
	shot := func(name string) {
		t.Helper()
		png, err := br.screenshot()
		if err != nil {
			t.Fatal(err)
		}
		shots[name] = png
	}
	shot("dashboard-healthy.png")
	tc.nodes[3].Kill(t)
	wait("node 3 down, with its alert", `document.querySelector('.card[data-node="3"]').dataset.state + ',' + !!document.querySelector('#alerts .alert[data-kind="node_down"]')`, "down,true")
	shot("dashboard-node-down.png")
	if !*updateShots {
		return
	}
	for name, png := range shots {
		if err := os.WriteFile(filepath.Join("..", "docs", "images", name), png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote docs/images/%s", name)
	}
}
