package nemesis

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/heraldmq/herald/chaos/cluster"
	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// fakeHooks is a fake admin endpoint of one node of a -tags chaos build:
// it records the bodies posted to /debug/faults.
type fakeHooks struct {
	mu     sync.Mutex
	bodies []string
	srv    *httptest.Server
}

func newFakeHooks(t *testing.T, status int) *fakeHooks {
	f := &fakeHooks{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/debug/faults" {
			http.NotFound(w, r)
			return
		}
		raw, _ := io.ReadAll(r.Body)
		var b map[string]any
		if err := json.Unmarshal(raw, &b); err != nil {
			http.Error(w, "bad json", http.StatusBadRequest)
			return
		}
		canon, _ := json.Marshal(b)
		f.mu.Lock()
		f.bodies = append(f.bodies, string(canon))
		f.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeHooks) admin() string { return strings.TrimPrefix(f.srv.URL, "http://") }

// take returns the bodies received since the last take.
func (f *fakeHooks) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.bodies
	f.bodies = nil
	return out
}

// TestFaultHookNemeses checks the requests of the disk and clock faults
// against fake fault endpoints (the -tags chaos build of herald is not
// part of this package): the body posted at Start to each target node,
// the one at Stop, and a partial failure, healed on the nodes it hit.
func TestFaultHookNemeses(t *testing.T) {
	h1, h2, h3 := newFakeHooks(t, http.StatusOK), newFakeHooks(t, http.StatusNoContent), newFakeHooks(t, http.StatusNotFound)
	c := cluster.Attach([]cluster.Node{{ID: 1, Admin: h1.admin()}, {ID: 2, Admin: h2.admin()}, {ID: 3, Admin: h3.admin()}})
	ev := &events{}
	env := NewEnv(c, 7, ev.report)
	cases := []struct {
		n       Nemesis
		on, off string
	}{
		{SlowDisk(env, Nodes(1, 2), 50*time.Millisecond), `{"disk_delay":"50ms"}`, `{"disk_delay":"0s"}`},
		{FsyncError(env, Nodes(1, 2), 0), `{"fsync_count":0,"fsync_error":"eio"}`, `{"clear":true}`},
		{FsyncError(env, Nodes(1, 2), 3), `{"fsync_count":3,"fsync_error":"eio"}`, `{"clear":true}`},
		{WriteError(env, Nodes(1, 2)), `{"write_error":"eio"}`, `{"clear":true}`},
		{ClockJump(env, Nodes(1, 2), 30*time.Second), `{"clock_offset":"30s"}`, `{"clock_offset":"0s"}`},
		{ClockJump(env, Nodes(1, 2), -90*time.Second), `{"clock_offset":"-1m30s"}`, `{"clock_offset":"0s"}`},
	}
	for _, tc := range cases {
		if err := tc.n.Start(ctxT(t, 5*time.Second)); err != nil {
			t.Fatalf("%s: %v", tc.n.Name(), err)
		}
		if e := ev.last(t); e.Op != OpStart || !slices.Equal(e.Nodes, []uint64{1, 2}) || !strings.Contains(e.Detail, tc.on) {
			t.Fatalf("%s: start event %+v", tc.n.Name(), e)
		}
		for i, h := range []*fakeHooks{h1, h2} {
			if got := h.take(); !slices.Equal(got, []string{tc.on}) {
				t.Fatalf("%s: node %d got %v at start, want %s", tc.n.Name(), i+1, got, tc.on)
			}
		}
		if err := tc.n.Stop(ctxT(t, 5*time.Second)); err != nil {
			t.Fatalf("%s: stop: %v", tc.n.Name(), err)
		}
		for i, h := range []*fakeHooks{h1, h2} {
			if got := h.take(); !slices.Equal(got, []string{tc.off}) {
				t.Fatalf("%s: node %d got %v at stop, want %s", tc.n.Name(), i+1, got, tc.off)
			}
		}
	}
	// Node 3 has no hooks: Start fails there, and Stop heals node 1,
	// which it reached before.
	n := SlowDisk(env, Nodes(1, 3), time.Second)
	if err := n.Start(ctxT(t, 5*time.Second)); !errors.Is(err, cluster.ErrNoFaultHooks) {
		t.Fatalf("start on a node without hooks: %v", err)
	}
	if e := ev.last(t); !slices.Equal(e.Nodes, []uint64{1}) || e.Err == nil {
		t.Fatalf("partial start event %+v", e)
	}
	h1.take()
	if err := n.Stop(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := h1.take(); !slices.Equal(got, []string{`{"disk_delay":"0s"}`}) {
		t.Fatalf("node 1 got %v at stop", got)
	}
	if got := h3.take(); len(got) != 1 {
		t.Fatalf("node 3 got %v, want the one refused start", got)
	}
}

// TestDiskFull fills the tmpfs holding a real node's data dir: produces
// fail with STORAGE_ERROR; after Stop deletes the filler they succeed
// again.
func TestDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a full disk needs root, to mount a tmpfs per data dir")
	}
	w := newWorld(t, cluster.Config{Nodes: 1, DiskBytes: 48 << 20, Args: []string{"--segment-bytes=1048576"}})
	w.createTopic("d", 1, 1)
	w.produce("d", 10, 100)
	full := DiskFull(w.env, AnyNode())
	ev := w.start(full)
	if !strings.Contains(ev.Detail, "filled with") {
		t.Fatalf("start event %+v", ev)
	}
	n, _ := w.c.Node(1)
	if st, err := os.Stat(filepath.Join(n.DiskDir, fillerName)); err != nil || st.Size() < 10<<20 {
		t.Fatalf("filler: %v %v", st, err)
	}
	p := w.dial(client.WithRequestTimeout(10 * time.Second)).NewProducer(client.WithMaxRetries(0))
	val := strings.Repeat("f", 16<<10)
	var refused error
	for i := 0; i < 500 && refused == nil; i++ {
		_, err := p.Send(ctxT(t, 20*time.Second), &client.Message{Topic: "d", Partition: 0, Value: []byte(val)})
		if client.IsCode(err, heraldpb.ErrorCode_STORAGE_ERROR) {
			refused = err
		} else if err != nil {
			t.Fatalf("produce to a full disk: %v (want STORAGE_ERROR)", err)
		}
	}
	if refused == nil {
		t.Fatal("500 produces of 16 KiB to a full disk, none refused")
	}
	t.Logf("refused: %v", refused)
	w.stop(full)
	if _, err := os.Stat(filepath.Join(n.DiskDir, fillerName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("filler left after stop: %v", err)
	}
	checkFor(t, 60*time.Second, "a produce to succeed once the disk has room", func() error {
		_, err := p.Send(ctxT(t, 20*time.Second), &client.Message{Topic: "d", Partition: 0, Value: []byte("after")})
		return err
	})
}

// TestWalDir finds a partition's WAL among look-alike folders.
func TestWalDir(t *testing.T) {
	dir := t.TempDir()
	id := strings.Repeat("ab", 12)
	for _, d := range []string{
		"replicas/a-1-" + id + "/wal",            // topic a, partition 1
		"replicas/a-1-0-" + id + "/wal",          // topic a-1, partition 0
		"replicas/a-10-" + id + "/wal",           // topic a, partition 10
		"replicas/b-0-" + id + "-" + id + "/wal", // topic b, partition 0, added by a move
		"replicas/c-0-" + id,                     // no wal folder
		"topics/s-0/wal",                         // a single node's topic s
	} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		topic string
		part  int32
		want  string
	}{
		{"a", 1, "replicas/a-1-" + id + "/wal"},
		{"a-1", 0, "replicas/a-1-0-" + id + "/wal"},
		{"a", 10, "replicas/a-10-" + id + "/wal"},
		{"b", 0, "replicas/b-0-" + id + "-" + id + "/wal"},
		{"s", 0, "topics/s-0/wal"},
		{"c", 0, ""},
		{"a", 2, ""},
	} {
		got, err := walDir(dir, tc.topic, tc.part)
		if tc.want == "" {
			if !errors.Is(err, ErrNoTarget) {
				t.Errorf("%s-%d: got %q %v, want ErrNoTarget", tc.topic, tc.part, got, err)
			}
			continue
		}
		if err != nil || got != filepath.Join(dir, tc.want) {
			t.Errorf("%s-%d: got %q %v, want %s", tc.topic, tc.part, got, err, tc.want)
		}
	}
}

// logSays polls node id's log until it holds what.
func (w *world) logSays(id uint64, what string) {
	w.t.Helper()
	n, _ := w.c.Node(id)
	checkFor(w.t, 30*time.Second, fmt.Sprintf("node %d's log to say %q", id, what), func() error {
		raw, err := os.ReadFile(n.LogPath)
		if err != nil {
			return err
		}
		// Only what this run of the process wrote: after the last header.
		runs := strings.Split(string(raw), "--- chaos ")
		if !strings.Contains(runs[len(runs)-1], what) {
			return errors.New("not yet")
		}
		return nil
	})
}

// TestDamageWAL damages a real follower's WAL of an RF=3 partition
// between a SIGKILL and a restart, in each of the three ways; the node
// finds the damage as it reopens the log, and the partition keeps taking
// writes. A node that was down is damaged and left down.
func TestDamageWAL(t *testing.T) {
	w := newWorld(t, cluster.Config{Nodes: 3, Args: []string{"--segment-bytes=65536"}})
	w.createTopic("w", 1, 3)
	w.produce("w", 300, 500) // about 150 KB: several segments

	torn := DamageWAL(w.env, PartitionFollower("w", 0), "w", 0, TornTail)
	ev := w.start(torn)
	if len(ev.Nodes) != 1 || !strings.Contains(ev.Detail, "torn entry") || !w.c.Running(ev.Nodes[0]) {
		t.Fatalf("torn tail: %+v", ev)
	}
	w.logSays(ev.Nodes[0], "cutting torn tail")
	w.stop(torn)
	w.settle()
	w.produce("w", 10, 10)

	flip := DamageWAL(w.env, PartitionFollower("w", 0), "w", 0, BitFlip)
	ev = w.start(flip)
	if len(ev.Nodes) != 1 || !strings.Contains(ev.Detail, "flipped bit") {
		t.Fatalf("bit flip: %+v", ev)
	}
	w.logSays(ev.Nodes[0], "the log is damaged")
	w.stop(flip)
	w.produce("w", 10, 10)

	trunc := DamageWAL(w.env, PartitionFollower("w", 0), "w", 0, TruncatedSegment)
	ev = w.start(trunc)
	if len(ev.Nodes) != 1 || !strings.Contains(ev.Detail, "bytes") || !w.c.Running(ev.Nodes[0]) {
		t.Fatalf("truncated segment: %+v", ev)
	}
	w.stop(trunc)
	w.produce("w", 10, 10)

	// A node that is down stays down.
	victim := w.leader("w", 0)
	var down uint64
	for _, id := range w.c.IDs() {
		if id != victim {
			down = id
			break
		}
	}
	kill := Kill(w.env, Nodes(down))
	w.start(kill)
	w.start(DamageWAL(w.env, Nodes(down), "w", 0, TornTail))
	if w.c.Running(down) {
		t.Fatalf("node %d was down and was started by DamageWAL", down)
	}
	w.stop(kill)

	if err := DamageWAL(w.env, AnyNode(), "w", 0, Damage(9)).Start(ctxT(t, 5*time.Second)); err == nil {
		t.Fatal("an unknown damage was accepted")
	}
	if err := DamageWAL(w.env, Nodes(1), "nosuch", 0, BitFlip).Start(ctxT(t, 30*time.Second)); !errors.Is(err, ErrNoTarget) {
		t.Fatalf("damage of a partition the node does not hold: %v", err)
	}
	if !w.c.Running(1) {
		t.Fatal("a damage that found no WAL took its node down")
	}
}
