package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/internal/testbin"
	heraldpb "github.com/heraldmq/herald/proto"
	"golang.org/x/sys/unix"
)

// heraldBin is the binary built once by TestMain.
var heraldBin string

func TestMain(m *testing.M) { testbin.Main(m, &heraldBin) }

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// needRoot skips a test that needs root (namespaces, mounts).
func needRoot(t *testing.T, what string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("%s needs root", what)
	}
}

// startCluster starts a cluster for the test and stops it at cleanup,
// logging the nodes' logs if the test failed.
func startCluster(t *testing.T, cfg Config) *Cluster {
	t.Helper()
	cfg.Binary = heraldBin
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	c, err := Start(ctxT(t, 3*time.Minute), cfg)
	if err != nil {
		t.Fatalf("starting the cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.LogTails())
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	})
	return c
}

func createTopic(t *testing.T, c *Cluster, name string, parts, rf uint32) {
	t.Helper()
	cl, err := c.Dial(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.CreateTopic(ctxT(t, 20*time.Second), name, &heraldpb.TopicConfig{Partitions: parts, ReplicationFactor: rf}); err != nil {
		t.Fatal(err)
	}
}

func TestConfigValidateListsEveryProblem(t *testing.T) {
	cfg := Config{Nodes: 0, Args: []string{"--peers=x", "--segment-bytes=1", "--data", "d"}, Env: []string{"NOEQUALS"}, DiskBytes: 5, StartTimeout: -1}
	err := cfg.Validate()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("got %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"Binary", "Nodes: 0", "Dir: required", "--peers is set", "--data is set", `"NOEQUALS"`, "DiskBytes: 5", "StartTimeout"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "segment-bytes") {
		t.Errorf("an allowed flag was refused: %v", err)
	}
	good := Config{Binary: heraldBin, Nodes: 3, Dir: t.TempDir()}
	good.EnsureDefaults()
	if err := good.Validate(); err != nil {
		t.Fatalf("a good config: %v", err)
	}
	if good.StartTimeout != 60*time.Second {
		t.Fatalf("default StartTimeout %v", good.StartTimeout)
	}
	if _, err := Start(ctxT(t, time.Second), Config{Nodes: 1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Start with a bad config: %v", err)
	}
}

// TestLoopbackCluster drives three real nodes on loopback: leaders,
// SIGKILL and restart, SIGSTOP and SIGCONT, a graceful stop, the fault
// endpoint of a build without hooks, and the files left behind.
func TestLoopbackCluster(t *testing.T) {
	c := startCluster(t, Config{Nodes: 3})
	if got := c.IDs(); len(got) != 3 || got[0] != 1 || got[2] != 3 {
		t.Fatalf("ids %v", got)
	}
	if addrs := c.Addrs(); len(addrs) != 3 || !strings.HasPrefix(addrs[0], "127.0.0.1:") {
		t.Fatalf("addrs %v", addrs)
	}
	if _, err := c.Net(); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Net without NetNS: %v", err)
	}
	createTopic(t, c, "t", 1, 3)
	leader, err := c.Leader(ctxT(t, 20*time.Second), "t", 0)
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := c.ControllerLeader(ctxT(t, 20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	voters, err := c.ControllerVoters(ctxT(t, 10*time.Second))
	if err != nil || len(voters) != 3 {
		t.Fatalf("voters %v %v", voters, err)
	}
	t.Logf("partition leader %d, controller leader %d", leader, ctl)

	// SIGKILL the leader: another is elected; the killed one restarts.
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	if c.Running(leader) {
		t.Fatal("killed node still running")
	}
	if err := c.Kill(leader); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("second kill: %v", err)
	}
	next, err := c.Leader(ctxT(t, 30*time.Second), "t", 0)
	if err != nil {
		t.Fatal(err)
	}
	if next == leader {
		t.Fatalf("leader %d is the killed node", next)
	}
	if err := c.StartNode(ctxT(t, 30*time.Second), leader); err != nil {
		t.Fatal(err)
	}
	if err := c.StartNode(ctxT(t, 30*time.Second), leader); !errors.Is(err, ErrRunning) {
		t.Fatalf("start of a running node: %v", err)
	}
	if err := c.Settle(ctxT(t, 60*time.Second)); err != nil {
		t.Fatal(err)
	}

	// SIGSTOP a node: it is paused and cannot be asked; SIGCONT.
	if err := c.Pause(2); err != nil {
		t.Fatal(err)
	}
	if !c.Paused(2) || !c.Running(2) {
		t.Fatal("node 2 not paused")
	}
	if err := c.Faults(ctxT(t, 5*time.Second), 2, map[string]any{"clear": true}); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("faults on a paused node: %v", err)
	}
	if err := c.Resume(2); err != nil {
		t.Fatal(err)
	}
	if c.Paused(2) {
		t.Fatal("node 2 still paused")
	}
	// This build has no fault hooks.
	if err := c.Faults(ctxT(t, 5*time.Second), 2, map[string]any{"clear": true}); !errors.Is(err, ErrNoFaultHooks) {
		t.Fatalf("faults without -tags chaos: %v", err)
	}
	if err := c.Faults(ctxT(t, 5*time.Second), 9, nil); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("faults on node 9: %v", err)
	}

	// A graceful stop of a paused node still exits cleanly.
	if err := c.Pause(3); err != nil {
		t.Fatal(err)
	}
	if err := c.Shutdown(ctxT(t, 30*time.Second), 3); err != nil {
		t.Fatal(err)
	}
	n3, _ := c.Node(3)
	log, err := os.ReadFile(n3.LogPath)
	if err != nil || !strings.Contains(string(log), "--- chaos") || !strings.Contains(string(log), "herald stopped") {
		t.Fatalf("node 3's log %s: %v\n%s", n3.LogPath, err, log)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, id := range c.IDs() {
		if c.Running(id) {
			t.Fatalf("node %d runs after Stop", id)
		}
	}
	if err := c.StartNode(ctxT(t, time.Second), 3); !errors.Is(err, ErrStopped) {
		t.Fatalf("start after Stop: %v", err)
	}
	if _, err := os.Stat(filepath.Join(n3.DataDir)); err != nil {
		t.Fatalf("data dir gone after Stop: %v", err)
	}
}

// TestAddNode starts a fourth node that the three others' --peers do not
// name: it registers with the controller, and every node sees it.
func TestAddNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four brokers")
	}
	c := startCluster(t, Config{Nodes: 3})
	n, err := c.AddNode(ctxT(t, 90*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if n.ID != 4 || len(c.Addrs()) != 4 {
		t.Fatalf("added %+v; addrs %v", n, c.Addrs())
	}
	cl, err := client.Dial(ctxT(t, 10*time.Second), n.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.ListTopics(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("the new node does not answer: %v", err)
	}
}

// TestFaultsRequests checks the HTTP calls of Faults against fake admin
// endpoints (the -tags chaos build is not part of this package).
func TestFaultsRequests(t *testing.T) {
	type got struct {
		path, ctype string
		body        map[string]any
	}
	reqs := make(chan got, 10)
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b map[string]any
		raw, _ := io.ReadAll(r.Body)
		json.Unmarshal(raw, &b)
		reqs <- got{r.Method + " " + r.URL.Path, r.Header.Get("Content-Type"), b}
		if b["fsync_error"] == "bogus" {
			http.Error(w, "unknown fsync_error bogus", http.StatusBadRequest)
		}
	}))
	defer ok.Close()
	missing := httptest.NewServer(http.NotFoundHandler())
	defer missing.Close()
	c := Attach([]Node{{ID: 1, Admin: strings.TrimPrefix(ok.URL, "http://")}, {ID: 2, Admin: strings.TrimPrefix(missing.URL, "http://")}})
	ctx := ctxT(t, 10*time.Second)
	if err := c.Faults(ctx, 1, map[string]any{"disk_delay": "50ms"}); err != nil {
		t.Fatal(err)
	}
	r := <-reqs
	if r.path != "POST /debug/faults" || r.ctype != "application/json" || r.body["disk_delay"] != "50ms" || len(r.body) != 1 {
		t.Fatalf("request %+v", r)
	}
	if err := c.Faults(ctx, 1, map[string]any{"fsync_error": "bogus"}); !errors.Is(err, ErrFaultRejected) || !strings.Contains(err.Error(), "unknown fsync_error bogus") {
		t.Fatalf("rejected: %v", err)
	}
	<-reqs
	if err := c.Faults(ctx, 2, map[string]any{"clear": true}); !errors.Is(err, ErrNoFaultHooks) {
		t.Fatalf("404: %v", err)
	}
	if err := c.Kill(1); !errors.Is(err, ErrNotManaged) {
		t.Fatalf("kill on an attached cluster: %v", err)
	}
	if !c.Running(1) || c.Paused(1) {
		t.Fatal("an attached node counts as running, unpaused")
	}
}

var errMainThread = errors.New("on the main thread")

// checkForT polls cond until it holds or total passes.
func checkForT(t *testing.T, total time.Duration, what string, cond func() error) {
	t.Helper()
	testbin.Poll(t, total, pollEvery, what, cond)
}

// TestNodeOutlivesStarterThread: a node started from a goroutine that
// exits locked to its OS thread (which ends the thread) keeps running.
// Pdeathsig follows the forking thread, so brokers must not be forked
// from threads that can end.
func TestNodeOutlivesStarterThread(t *testing.T) {
	c := startCluster(t, Config{Nodes: 1})
	if err := c.Kill(1); err != nil {
		t.Fatal(err)
	}
	// The goroutine must run on a thread other than the main one, which
	// the runtime never ends.
	var tid int
	release := make(chan struct{})
	defer close(release)
	for tries := 0; ; tries++ {
		errc := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			if tid = unix.Gettid(); tid == os.Getpid() {
				// Landed on the main thread: keep it, locked and parked
				// until the test ends, so that the next try runs on
				// another (on a busy machine the runtime gave the main
				// thread to 100 tries in a row).
				errc <- errMainThread
				<-release
				runtime.UnlockOSThread()
				return
			}
			errc <- c.StartNode(ctxT(t, 60*time.Second), 1)
		}()
		err := <-errc
		if err == nil {
			break
		}
		if err != errMainThread || tries == 100 {
			t.Fatal(err)
		}
	}
	checkForT(t, 10*time.Second, "the starter thread to end", func() error {
		if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid)); err == nil {
			return errors.New("still there")
		}
		return nil
	})
	if err := c.WaitReady(ctxT(t, 30*time.Second), 1); err != nil {
		t.Fatal(err)
	}
	if !c.Running(1) {
		t.Fatal("the node died with the thread that started it")
	}
}
