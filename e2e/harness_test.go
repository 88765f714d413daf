package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/heraldmq/herald/broker"
	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/internal/testbin"
)

// heraldBin is the binary built once by TestMain for subprocess tests.
var heraldBin string

func TestMain(m *testing.M) { testbin.Main(m, &heraldBin) }

// checkFor polls cond until it holds or total passes.
func checkFor(t testing.TB, total time.Duration, what string, cond func() error) {
	t.Helper()
	testbin.Poll(t, total, 10*time.Millisecond, what, cond)
}

// node is one running broker under test.
type node interface {
	Addr() string
	AdminAddr() string
	DataDir() string
	// Stop shuts the broker down gracefully (SIGTERM for a process).
	Stop(t testing.TB)
	// Start starts it again on the same data dir.
	Start(t testing.TB)
}

// mode is how a suite test runs its broker.
type mode struct {
	name  string
	start func(t testing.TB, dataDir string, extra ...string) node
}

var modes = []mode{
	{"inproc", func(t testing.TB, dir string, extra ...string) node { return startInProc(t, dir, extra...) }},
	{"process", func(t testing.TB, dir string, extra ...string) node { return startProc(t, dir, extra...) }},
}

// forEachMode runs fn as a subtest against an in-process broker and
// against a broker subprocess. extra are serve flags (--name=value).
func forEachMode(t *testing.T, extra []string, fn func(t *testing.T, n node)) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			fn(t, m.start(t, t.TempDir(), extra...))
		})
	}
}

// ---- in-process ----------------------------------------------------------

type inProc struct {
	dir   string
	extra []string
	b     *broker.Broker
}

func startInProc(t testing.TB, dir string, extra ...string) *inProc {
	n := &inProc{dir: dir, extra: extra}
	n.Start(t)
	t.Cleanup(func() {
		if n.b != nil {
			n.b.Shutdown()
		}
	})
	return n
}

func (n *inProc) config(t testing.TB) broker.Config {
	cfg := broker.Default()
	cfg.DataDir, cfg.Listen, cfg.Admin = n.dir, "127.0.0.1:0", "127.0.0.1:0"
	cfg.LogLevel = "warn"
	for _, kv := range n.extra {
		name, val, _ := strings.Cut(strings.TrimLeft(kv, "-"), "=")
		var err error
		switch name {
		case "retention-check":
			cfg.RetentionCheck, err = time.ParseDuration(val)
		case "partition-mailbox":
			_, err = fmt.Sscan(val, &cfg.PartitionMailbox)
		case "segment-bytes":
			_, err = fmt.Sscan(val, &cfg.SegmentBytes)
		case "window-bytes":
			_, err = fmt.Sscan(val, &cfg.WindowBytes)
		case "flush":
			cfg.Flush = val
		case "max-in-flight":
			_, err = fmt.Sscan(val, &cfg.MaxInFlight)
		case "idle-timeout":
			cfg.IdleTimeout, err = time.ParseDuration(val)
		default:
			t.Fatalf("inproc harness does not know flag %q", kv)
		}
		if err != nil {
			t.Fatalf("flag %q: %v", kv, err)
		}
	}
	return cfg
}

func (n *inProc) Start(t testing.TB) {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	b, err := broker.Start(n.config(t), logger)
	if err != nil {
		t.Fatalf("starting broker: %v", err)
	}
	n.b = b
}

func (n *inProc) Stop(t testing.TB) {
	t.Helper()
	if err := n.b.Shutdown(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	n.b = nil
}

func (n *inProc) Addr() string      { return n.b.ClientAddr() }
func (n *inProc) AdminAddr() string { return n.b.AdminAddr() }
func (n *inProc) DataDir() string   { return n.dir }

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// ---- subprocess ----------------------------------------------------------

type proc struct {
	dir   string
	extra []string
	cmd   *exec.Cmd
	addr  string
	admin string
	done  chan error
	mu    sync.Mutex
	log   strings.Builder
}

var servingLine = regexp.MustCompile(`msg="herald serving".* clients=(\S+) admin=(\S+)`)

func startProc(t testing.TB, dir string, extra ...string) *proc {
	p := &proc{dir: dir, extra: extra}
	p.Start(t)
	t.Cleanup(func() {
		if p.cmd != nil {
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			p.mu.Lock()
			t.Logf("broker log:\n%s", p.log.String())
			p.mu.Unlock()
		}
	})
	return p
}

func (p *proc) Start(t testing.TB) {
	t.Helper()
	// A restart listens where the first start did, as a real node does:
	// clients keep the addresses they bootstrapped from.
	listen, admin := "127.0.0.1:0", "127.0.0.1:0"
	if p.addr != "" {
		listen, admin = p.addr, p.admin
	}
	args := append([]string{"serve", "--data", p.dir, "--listen", listen, "--admin", admin}, p.extra...)
	cmd := exec.Command(heraldBin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting herald: %v", err)
	}
	p.cmd, p.done = cmd, make(chan error, 1)
	ready := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.log.WriteString(line + "\n")
			p.mu.Unlock()
			if m := servingLine.FindStringSubmatch(line); m != nil {
				ready <- [2]string{m[1], m[2]}
			}
		}
		io.Copy(io.Discard, stderr)
		p.done <- cmd.Wait()
	}()
	select {
	case a := <-ready:
		p.addr, p.admin = a[0], a[1]
	case err := <-p.done:
		p.cmd = nil
		t.Fatalf("herald exited before serving: %v\n%s", err, p.logs())
	case <-time.After(30 * time.Second):
		t.Fatalf("herald did not start within 30s\n%s", p.logs())
	}
}

func (p *proc) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// Stop sends SIGTERM and requires a clean exit (status 0).
func (p *proc) Stop(t testing.TB) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.cmd = nil
		if err != nil {
			t.Fatalf("herald exited with %v after SIGTERM\n%s", err, p.logs())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("herald did not exit within 30s of SIGTERM")
	}
}

// Kill sends SIGKILL: no shutdown path runs.
func (p *proc) Kill(t testing.TB) {
	t.Helper()
	p.cmd.Process.Kill()
	<-p.done
	p.cmd = nil
}

func (p *proc) Addr() string      { return p.addr }
func (p *proc) AdminAddr() string { return p.admin }
func (p *proc) DataDir() string   { return p.dir }

// ---- clients ---------------------------------------------------------------

func dial(t testing.TB, n node, opts ...client.Option) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, n.Addr(), opts...)
	if err != nil {
		t.Fatalf("dial %s: %v", n.Addr(), err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
