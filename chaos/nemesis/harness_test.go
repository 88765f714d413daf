package nemesis

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/heraldmq/herald/chaos/cluster"
	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/internal/testbin"
	heraldpb "github.com/heraldmq/herald/proto"
)

// heraldBin is the binary built once by TestMain.
var heraldBin string

func TestMain(m *testing.M) { testbin.Main(m, &heraldBin) }

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// checkFor polls cond every 50 ms until it holds or total passes.
func checkFor(t testing.TB, total time.Duration, what string, cond func() error) {
	t.Helper()
	testbin.Poll(t, total, 50*time.Millisecond, what, cond)
}

// events records what the nemeses report.
type events struct {
	mu  sync.Mutex
	all []Event
}

func (ev *events) report(e Event) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	ev.all = append(ev.all, e)
}

// last is the last event, failing the test if there is none.
func (ev *events) last(t *testing.T) Event {
	t.Helper()
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if len(ev.all) == 0 {
		t.Fatal("no event reported")
	}
	return ev.all[len(ev.all)-1]
}

func (ev *events) count(name string, op Op) int {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	n := 0
	for _, e := range ev.all {
		if e.Nemesis == name && e.Op == op {
			n++
		}
	}
	return n
}

// world is a cluster under test, its env and what the nemeses reported.
type world struct {
	t   *testing.T
	c   *cluster.Cluster
	env *Env
	ev  *events
}

// newWorld starts a cluster for the test and stops it at cleanup. The
// test's events are logged.
func newWorld(t *testing.T, cfg cluster.Config) *world {
	t.Helper()
	cfg.Binary = heraldBin
	cfg.Dir = t.TempDir()
	c, err := cluster.Start(ctxT(t, 3*time.Minute), cfg)
	if err != nil {
		t.Fatalf("starting the cluster: %v", err)
	}
	w := &world{t: t, c: c, ev: &events{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.LogTails())
			if out := os.Getenv("HERALD_CHAOS_OUT"); out != "" {
				// The nodes' data and logs, which the test's temp dir loses.
				keep := filepath.Join(out, fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano()))
				t.Logf("kept the nodes' files in %s (%v)", keep, os.CopyFS(keep, os.DirFS(cfg.Dir)))
			}
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	})
	w.env = NewEnv(c, 1, func(e Event) {
		t.Log(e)
		w.ev.report(e)
	})
	return w
}

// start starts n and checks the start event names the nemesis.
func (w *world) start(n Nemesis) Event {
	w.t.Helper()
	if err := n.Start(ctxT(w.t, 2*time.Minute)); err != nil {
		w.t.Fatalf("start %s: %v", n.Name(), err)
	}
	ev := w.ev.last(w.t)
	if ev.Nemesis != n.Name() || ev.Op != OpStart || ev.Err != nil || ev.End.Before(ev.Begin) {
		w.t.Fatalf("start event %+v", ev)
	}
	return ev
}

func (w *world) stop(n Nemesis) Event {
	w.t.Helper()
	if err := n.Stop(ctxT(w.t, 2*time.Minute)); err != nil {
		w.t.Fatalf("stop %s: %v", n.Name(), err)
	}
	ev := w.ev.last(w.t)
	if ev.Nemesis != n.Name() || ev.Op != OpStop || ev.Err != nil {
		w.t.Fatalf("stop event %+v", ev)
	}
	return ev
}

func (w *world) settle() {
	w.t.Helper()
	if err := w.c.Settle(ctxT(w.t, 90*time.Second)); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) dial(opts ...client.Option) *client.Client {
	w.t.Helper()
	cl, err := w.c.Dial(ctxT(w.t, 10*time.Second), opts...)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { cl.Close() })
	return cl
}

func (w *world) createTopic(name string, parts, rf uint32) {
	w.t.Helper()
	cl := w.dial()
	if _, err := cl.CreateTopic(ctxT(w.t, 20*time.Second), name, &heraldpb.TopicConfig{Partitions: parts, ReplicationFactor: rf}); err != nil {
		w.t.Fatal(err)
	}
}

// produce sends n records with acks=all to partition 0 of topic and
// fails the test unless each is acknowledged.
func (w *world) produce(topic string, n int, size int) {
	w.t.Helper()
	p := w.dial().NewProducer(client.WithAcks(heraldpb.Acks_ACKS_ALL))
	for i := 0; i < n; i++ {
		v := fmt.Sprintf("%06d-%s", i, strings.Repeat("x", size))
		if _, err := p.Send(ctxT(w.t, 60*time.Second), &client.Message{Topic: topic, Partition: 0, Value: []byte(v)}); err != nil {
			w.t.Fatalf("produce %d: %v", i, err)
		}
	}
}

// leader polls until the partition has a leader.
func (w *world) leader(topic string, part int32) uint64 {
	w.t.Helper()
	l, err := w.c.Leader(ctxT(w.t, 60*time.Second), topic, part)
	if err != nil {
		w.t.Fatal(err)
	}
	return l
}

// newLeader polls until the partition's leader is not old.
func (w *world) newLeader(topic string, part int32, old uint64) uint64 {
	w.t.Helper()
	var l uint64
	checkFor(w.t, 60*time.Second, fmt.Sprintf("a leader of %s-%d other than %d", topic, part, old), func() error {
		var err error
		l, err = w.c.Leader(ctxT(w.t, 5*time.Second), topic, part)
		if err == nil && l == old {
			err = fmt.Errorf("node %d still leads", l)
		}
		return err
	})
	return l
}
