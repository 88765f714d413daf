package nemesis

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/chaos/cluster"
)

// holds is how many replicas of topic node id holds, once no partition
// is being moved.
func (w *world) holds(topic string, id uint64) int {
	w.t.Helper()
	cl := w.dial()
	if _, err := cl.WaitForMoves(ctxT(w.t, 90*time.Second), 200*time.Millisecond); err != nil {
		w.t.Fatalf("moves did not finish: %v", err)
	}
	info, err := cl.DescribeTopic(ctxT(w.t, 10*time.Second), topic)
	if err != nil {
		w.t.Fatal(err)
	}
	n := 0
	for _, p := range info.GetPartitions() {
		if slices.Contains(p.GetReplicas(), uint32(id)) {
			n++
		}
	}
	return n
}

// TestMembershipNemeses: a spare node joins and takes replicas, gives
// them back at Stop; the same node, removed, gives them up and takes
// them back at Stop; a rebalance; the controller refuses to remove one
// of its voters.
func TestMembershipNemeses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four brokers and moves replicas")
	}
	w := newWorld(t, cluster.Config{Nodes: 3})
	w.createTopic("m", 4, 3)
	w.produce("m", 20, 100)

	add := AddNode(w.env)
	ev := w.start(add)
	if !slices.Equal(ev.Nodes, []uint64{4}) || !strings.Contains(ev.Detail, "moves") {
		t.Fatalf("add node: %+v", ev)
	}
	if n := w.holds("m", 4); n == 0 {
		t.Fatal("node 4 holds no replica after add-node")
	}
	w.stop(add)
	if n := w.holds("m", 4); n != 0 {
		t.Fatalf("node 4 holds %d replicas after its add-node was undone", n)
	}
	// Again: the same spare node, not a fifth.
	w.start(add)
	if ids := w.c.IDs(); len(ids) != 4 {
		t.Fatalf("nodes %v after a second add", ids)
	}
	w.holds("m", 4)
	w.stop(add)

	w.start(AddNode(w.env)) // a second spare, node 5, which takes replicas
	if n := w.holds("m", 5); n == 0 {
		t.Fatal("node 5 holds no replica")
	}
	rm := RemoveNode(w.env, Nodes(5))
	w.start(rm)
	if n := w.holds("m", 5); n != 0 {
		t.Fatalf("removed node 5 holds %d replicas", n)
	}
	w.stop(rm)
	if n := w.holds("m", 5); n == 0 {
		t.Fatal("node 5 holds no replica after its removal was undone")
	}

	reb := Rebalance(w.env)
	w.start(reb)
	w.holds("m", 1)
	w.stop(reb)

	err := RemoveNode(w.env, ControllerLeader()).Start(ctxT(t, 30*time.Second))
	if err == nil || !strings.Contains(err.Error(), "controller voter") {
		t.Fatalf("removal of a controller voter: %v", err)
	}
	if ev := w.ev.last(t); ev.Err == nil {
		t.Fatalf("the refused removal reported no error: %+v", ev)
	}
	w.settle()
	w.produce("m", 20, 100)
}
