package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// groupFloors is group's position (ack floor) per partition of its topic.
func groupFloors(ctx context.Context, c *client.Client, group string) (map[int32]int64, error) {
	gi, err := c.DescribeGroup(ctx, group)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for _, p := range gi.GetPartitions() {
		out[int32(p.GetPartition())] = p.GetAckFloor()
	}
	return out, nil
}

// waitFloors polls until group's floors include want.
func waitFloors(t *testing.T, c *client.Client, group string, want map[int32]int64) {
	t.Helper()
	checkFor(t, 30*time.Second, fmt.Sprintf("group %s at %v", group, want), func() error {
		got, err := groupFloors(ctxT(t, 5*time.Second), c, group)
		if err != nil {
			return err
		}
		for p, off := range want {
			if got[p] != off {
				return fmt.Errorf("floors %v", got)
			}
		}
		return nil
	})
}

// TestTxnSendOffsets: consumer group progress committed with a
// transaction (SendOffsets) moves the group's position once the commit
// is applied, with a member live or none; an aborted transaction's
// offsets, a fenced session's and a position behind the group's do not
// move it; and a broker SIGKILLed right after a commit was answered
// applies its offsets after the restart.
func TestTxnSendOffsets(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "in", 2)
	createTopic(t, c, "out", 1)
	produceN(t, c, "in", "in", 40, 8)
	ctx := ctxT(t, 60*time.Second)
	commit := func(p *client.TransactionalProducer, out string, offs map[int32]int64) error {
		t.Helper()
		if err := p.Begin(); err != nil {
			t.Fatal(err)
		}
		if out != "" {
			sendAll(t, ctx, p, "out", out)
		}
		if err := p.SendOffsets("g", "in", offs); err != nil {
			t.Fatal(err)
		}
		_, err := p.Commit(ctx)
		return err
	}

	// No member: the stored progress moves.
	p := newTxnProducer(t, c, "eo-1")
	if err := commit(p, "o1", map[int32]int64{0: 3, 1: 5}); err != nil {
		t.Fatal(err)
	}
	waitFloors(t, c, "g", map[int32]int64{0: 3, 1: 5})
	if got := valuesOf(t, n, "out", 1); got["o1"] != 1 {
		t.Fatalf("out holds %v", got)
	}

	// Aborted: nothing moves. Behind the group's position: no move back.
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	sendAll(t, ctx, p, "out", "o2")
	if err := p.SendOffsets("g", "in", map[int32]int64{0: 9}); err != nil {
		t.Fatal(err)
	}
	if err := p.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if err := commit(p, "o3", map[int32]int64{0: 1, 1: 6}); err != nil {
		t.Fatal(err)
	}
	waitFloors(t, c, "g", map[int32]int64{0: 3, 1: 6})

	// Fenced: a second session of the id; the first one's offsets are
	// refused with its commit (its records with their send).
	p2 := newTxnProducer(t, c, "eo-1")
	if err := commit(p, "", map[int32]int64{0: 30}); !errors.Is(err, client.ErrProducerFenced) {
		t.Fatalf("the fenced session's commit: %v", err)
	}
	if err := commit(p2, "o4", map[int32]int64{1: 7}); err != nil {
		t.Fatal(err)
	}
	waitFloors(t, c, "g", map[int32]int64{0: 3, 1: 7})

	// A member live (assigned the partitions, as GroupTransform's is):
	// the live group's position moves, and the member keeps its place.
	sub, err := c.Subscribe(ctx, client.SubscribeOptions{Group: "g", Topic: "in", Mode: client.Clustering, AssignOnly: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, 10*time.Second, "the member assigned both partitions", func() error {
		if a := sub.Assigned(); len(a) != 2 {
			return fmt.Errorf("assigned %v", a)
		}
		return nil
	})
	if err := commit(p2, "o5", map[int32]int64{0: 12, 1: 15}); err != nil {
		t.Fatal(err)
	}
	waitFloors(t, c, "g", map[int32]int64{0: 12, 1: 15})
	if a := sub.Assigned(); len(a) != 2 {
		t.Fatalf("the member lost its partitions: %v", a)
	}
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// Bad offsets: a typed error, before anything is decided.
	if err := p2.Begin(); err != nil {
		t.Fatal(err)
	}
	if err := p2.SendOffsets("g", "in", map[int32]int64{5: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := p2.Commit(ctx); !client.IsCode(err, heraldpb.ErrorCode_PARTITION_NOT_FOUND) {
		t.Fatalf("offsets of partition 5 of a 2-partition topic: %v", err)
	}
	if err := p2.Abort(ctx); err != nil {
		t.Fatal(err)
	}

	// A client cannot send the coordinators' internal request.
	tc := dialTxn(t, n)
	f := tc.call(&heraldpb.Frame{Body: &heraldpb.Frame_CommitTxnOffsets{CommitTxnOffsets: &heraldpb.CommitTxnOffsetsRequest{
		TransactionalId: "eo-1", Offsets: &heraldpb.TxnGroupOffsets{Group: "g", Topic: "in", Partitions: []uint32{0}, Offsets: []int64{99}}}}})
	if f.GetError().GetCode() != heraldpb.ErrorCode_UNKNOWN_REQUEST {
		t.Fatalf("a client's CommitTxnOffsets: %v", f)
	}

	// SIGKILL right after a commit was answered: its offsets are applied
	// after the restart (the decision holds them), with its record.
	want := map[int32]int64{0: 20, 1: 21}
	if err := commit(p2, "o6", want); err != nil {
		t.Fatal(err)
	}
	n.Kill(t)
	n.Start(t)
	c2 := dial(t, n)
	waitFloors(t, c2, "g", want)
	if got := valuesOf(t, n, "out", 1); got["o6"] != 1 || got["o2"] != 0 || len(got) != 5 {
		t.Fatalf("out holds %v", got)
	}
	final, err := groupFloors(ctxT(t, 5*time.Second), c2, "g")
	if err != nil || !maps.Equal(final, want) {
		t.Fatalf("floors %v %v", final, err)
	}
}

// TestTxnSendOffsetsInCluster: in a 3-node cluster (RF=3) a commit's
// offsets reach the groups coordinator wherever it runs (the leader of
// __groups, through the cluster transport when the transaction
// coordinator runs elsewhere), and keep doing so after that node is
// SIGKILLed and __groups elects another leader.
func TestTxnSendOffsetsInCluster(t *testing.T) {
	tc, c := clusterWithTopic(t, "out", 1)
	if _, err := c.CreateTopic(ctxT(t, 15*time.Second), "in", &heraldpb.TopicConfig{Partitions: 2, ReplicationFactor: 3}); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 90*time.Second)
	p := newTxnProducer(t, c, "eo-c")
	commit := func(offs map[int32]int64) {
		t.Helper()
		checkFor(t, 30*time.Second, fmt.Sprintf("a commit with offsets %v", offs), func() error {
			if err := p.Begin(); err != nil {
				return err
			}
			if err := p.SendOffsets("g", "in", offs); err != nil {
				return err
			}
			if _, err := p.Commit(ctx); err != nil {
				_ = p.Abort(ctx)
				return err
			}
			return nil
		})
	}
	groups, txns := awaitInternalLeader(t, c, "__groups"), awaitInternalLeader(t, c, "__txn")
	t.Logf("__groups led by node %d, __txn by node %d", groups, txns)
	commit(map[int32]int64{0: 4, 1: 2})
	waitFloors(t, c, "g", map[int32]int64{0: 4, 1: 2})

	tc.nodes[uint64(groups)].Kill(t)
	delete(tc.nodes, uint64(groups))
	checkFor(t, 30*time.Second, "a new leader of __groups", func() error {
		if l := internalLeader(t, c, "__groups"); l == 0 || l == groups {
			return fmt.Errorf("__groups led by %d", l)
		}
		return nil
	})
	groups2, txns2 := awaitInternalLeader(t, c, "__groups"), awaitInternalLeader(t, c, "__txn")
	t.Logf("after the kill: __groups led by node %d, __txn by node %d", groups2, txns2)
	commit(map[int32]int64{0: 9, 1: 7})
	waitFloors(t, c, "g", map[int32]int64{0: 9, 1: 7})
}
