package nemesis

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/heraldmq/herald/chaos/cluster"
)

// TestProcessNemeses runs the process faults against three real nodes:
// the partition leader SIGKILLed (another is elected, the node comes
// back at Stop), the controller leader paused, a majority killed, a
// minority paused, a rolling restart; after each heal the cluster
// settles and takes writes.
func TestProcessNemeses(t *testing.T) {
	w := newWorld(t, cluster.Config{Nodes: 3})
	w.createTopic("t", 1, 3)
	w.produce("t", 20, 10)

	// The partition leader, SIGKILLed.
	old := w.leader("t", 0)
	kill := Kill(w.env, PartitionLeader("t", 0))
	ev := w.start(kill)
	if !slices.Equal(ev.Nodes, []uint64{old}) || w.c.Running(old) {
		t.Fatalf("killed %v (running: %v), the leader was %d", ev.Nodes, w.c.Running(old), old)
	}
	if err := kill.Start(ctxT(t, time.Second)); !errors.Is(err, ErrActive) {
		t.Fatalf("second start: %v", err)
	}
	w.newLeader("t", 0, old)
	w.produce("t", 5, 10)
	if ev := w.stop(kill); !slices.Equal(ev.Nodes, []uint64{old}) || !w.c.Running(old) {
		t.Fatalf("stop %+v; node %d running: %v", ev, old, w.c.Running(old))
	}
	if err := kill.Stop(ctxT(t, time.Second)); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	w.settle()

	// The controller leader, paused: the others elect another.
	ctl, err := w.c.ControllerLeader(ctxT(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	pause := Pause(w.env, ControllerLeader())
	if ev := w.start(pause); !slices.Equal(ev.Nodes, []uint64{ctl}) || !w.c.Paused(ctl) {
		t.Fatalf("paused %v, controller leader %d", ev.Nodes, ctl)
	}
	checkFor(t, 60*time.Second, "another controller leader", func() error {
		l, err := w.c.ControllerLeader(ctxT(t, 5*time.Second))
		if err == nil && l == ctl {
			err = errors.New("the paused node still leads")
		}
		return err
	})
	w.stop(pause)
	if w.c.Paused(ctl) {
		t.Fatal("still paused after stop")
	}
	w.settle()

	// A majority killed: two of three down; both back at Stop.
	maj := Kill(w.env, Majority())
	if ev := w.start(maj); len(ev.Nodes) != 2 {
		t.Fatalf("majority %v", ev.Nodes)
	}
	if run := w.env.running(); len(run) != 1 {
		t.Fatalf("running after killing a majority: %v", run)
	}
	// A minority of one, chosen among the running.
	min := Pause(w.env, Minority())
	if ev := w.start(min); len(ev.Nodes) != 1 || !w.c.Paused(ev.Nodes[0]) {
		t.Fatalf("minority %v", ev.Nodes)
	}
	w.stop(min)
	w.stop(maj)
	w.settle()
	w.produce("t", 5, 10)

	// A rolling restart: each node in turn, a step each.
	roll := RollingRestart(w.env, false)
	if ev := w.start(roll); len(ev.Nodes) != 3 {
		t.Fatalf("rolling restart restarted %v", ev.Nodes)
	}
	if n := w.ev.count(roll.Name(), OpStep); n != 3 {
		t.Fatalf("%d steps reported, want 3", n)
	}
	w.stop(roll)
	w.settle()
	w.produce("t", 5, 10)

	// Nothing to pick, and faults this cluster cannot do.
	if err := Kill(w.env, Nodes(7)).Start(ctxT(t, 5*time.Second)); !errors.Is(err, ErrNoTarget) {
		t.Fatalf("kill of node 7: %v", err)
	}
	if err := IsolateLeader(w.env, "t", 0).Start(ctxT(t, 5*time.Second)); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("a network fault without NetNS: %v", err)
	}
	if err := SlowDisk(w.env, AnyNode(), 10*time.Millisecond).Start(ctxT(t, 5*time.Second)); !errors.Is(err, cluster.ErrNoFaultHooks) {
		t.Fatalf("slow disk on a build without hooks: %v", err)
	}
	if err := DiskFull(w.env, AnyNode()).Start(ctxT(t, 5*time.Second)); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("disk full without tmpfs data dirs: %v", err)
	}
}
