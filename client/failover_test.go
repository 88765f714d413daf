package client

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/client/fakebroker"
	heraldpb "github.com/heraldmq/herald/proto"
)

// twoNodes starts fakes of nodes 1 and 2, each with topic "t" of one
// partition holding the one record value1 (node 1) or value2 (node 2),
// whose metadata name leader1 (node 1's) and leader2 (node 2's) as the
// partition's leader; and a client that bootstraps from node 1, so that it
// believes node 1 first.
func twoNodes(t *testing.T, leader1, leader2 uint32, opts ...Option) (n1, n2 *fakebroker.Broker, c *Client) {
	t.Helper()
	n1 = newBroker(t, fakebroker.Node(1), fakebroker.Topic("t", 1))
	n2 = newBroker(t, fakebroker.Node(2), fakebroker.Topic("t", 1))
	for _, x := range []struct {
		b *fakebroker.Broker
		v string
	}{{n1, "value1"}, {n2, "value2"}} {
		one := dial(t, x.b)
		if _, err := one.NewProducer(WithManualPartitions()).Send(testCtx(t), &Message{Topic: "t", Partition: 0, Value: []byte(x.v)}); err != nil {
			t.Fatal(err)
		}
		one.Close()
	}
	brokers := []*heraldpb.BrokerInfo{{NodeId: 1, Addr: n1.Addr()}, {NodeId: 2, Addr: n2.Addr()}}
	n1.SetCluster(brokers, leader1)
	n2.SetCluster(brokers, leader2)
	c, err := Dial(testCtx(t), n1.Addr()+","+n2.Addr(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return n1, n2, c
}

// count counts the requests a hook sees that match.
func count(n *atomic.Int64, act fakebroker.Action, match func(*heraldpb.Frame) bool) fakebroker.Hook {
	return func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if match(f) {
			n.Add(1)
			return act
		}
		return fakebroker.Action{}
	}
}

func isFetch(f *heraldpb.Frame) bool    { return f.GetFetch() != nil }
func isMetadata(f *heraldpb.Frame) bool { return f.GetMetadata() != nil }

// A fetch its leader never answers (a frozen node) goes to the leader
// another broker names once its long poll plus 500 ms has passed, within
// the same Fetch call and long before the 30 s request timeout; later
// fetches go there directly.
func TestFetchLeavesSilentLeader(t *testing.T) {
	n1, _, c := twoNodes(t, 1, 2)
	var fetches1 atomic.Int64
	n1.SetHook(count(&fetches1, fakebroker.Action{Drop: true}, isFetch))
	const maxWait = 100 * time.Millisecond
	start := time.Now()
	res, err := c.Fetch(testCtx(t), "t", 0, 0, 1<<20, maxWait)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	if len(res.Messages) != 1 || string(res.Messages[0].Value) != "value2" {
		t.Fatalf("fetched %v, want value2 from node 2", res.Messages)
	}
	if took < maxWait+leaderCheck || took > 2*time.Second {
		t.Fatalf("fetch took %v; want from %v (the long poll and a margin) to 2s", took, maxWait+leaderCheck)
	}
	if n := fetches1.Load(); n != 1 {
		t.Fatalf("node 1 got %d fetches, want 1", n)
	}
	if _, err := c.Fetch(testCtx(t), "t", 0, 1, 1<<20, maxWait); err != nil {
		t.Fatalf("next fetch: %v", err)
	}
	if n := fetches1.Load(); n != 1 {
		t.Fatalf("node 1 got %d fetches after the failover, want 1: the next fetch went back to it", n)
	}
	t.Logf("the fetch left the silent leader after %v", took.Round(time.Millisecond))
}

// ListOffsets follows a new leader the same way (with no long poll: after
// 500 ms).
func TestListOffsetsLeavesSilentLeader(t *testing.T) {
	n1, _, c := twoNodes(t, 1, 2)
	n1.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		return fakebroker.Action{Drop: f.GetListOffsets() != nil}
	})
	start := time.Now()
	o, err := c.ListOffsets(testCtx(t), "t", 0, heraldpb.OffsetSpec_OFFSET_SPEC_LATEST, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second || o.HighWatermark != 1 {
		t.Fatalf("ListOffsets took %v, answered %+v", took, o)
	}
}

// A long poll is not cut off: no other broker is asked while the leader
// may still be holding the fetch (its max wait plus 500 ms), and past that
// the fetch goes on waiting for its answer while the other broker names
// the same leader.
func TestFetchLongPollIsNotCutOff(t *testing.T) {
	n1, n2, c := twoNodes(t, 1, 1)
	var meta2 atomic.Int64
	n2.SetHook(count(&meta2, fakebroker.Action{}, isMetadata))
	// A long poll at the end of the log, answered after its max wait.
	const maxWait = 800 * time.Millisecond
	start := time.Now()
	res, err := c.Fetch(testCtx(t), "t", 0, 1, 1<<20, maxWait)
	if err != nil || len(res.Messages) != 0 || time.Since(start) < maxWait {
		t.Fatalf("long poll: %v after %v, err %v", res, time.Since(start), err)
	}
	if n := meta2.Load(); n != 0 {
		t.Fatalf("node 2 was asked for metadata %d times during a long poll of %v", n, maxWait)
	}
	// An answer late by 1.2 s past the long poll: node 2 is asked, names
	// node 1, and the fetch waits for node 1's answer.
	var fetches1 atomic.Int64
	n1.SetHook(count(&fetches1, fakebroker.Action{Delay: 1300 * time.Millisecond}, isFetch))
	res, err = c.Fetch(testCtx(t), "t", 0, 0, 1<<20, 100*time.Millisecond)
	if err != nil {
		t.Fatalf("slow fetch: %v", err)
	}
	if len(res.Messages) != 1 || string(res.Messages[0].Value) != "value1" {
		t.Fatalf("fetched %v, want value1 from node 1", res.Messages)
	}
	if meta2.Load() == 0 || fetches1.Load() != 1 {
		t.Fatalf("node 2 asked %d times, node 1 fetched from %d times; want >0 and 1", meta2.Load(), fetches1.Load())
	}
}

// A fetch whose connection dies asks another broker for the leader, and
// when that names another node, fetches there in the same call.
func TestFetchAfterLostConnectionGoesToNewLeader(t *testing.T) {
	n1, _, c := twoNodes(t, 1, 2)
	n1.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		return fakebroker.Action{Close: isFetch(f)}
	})
	res, err := c.Fetch(testCtx(t), "t", 0, 0, 1<<20, 100*time.Millisecond)
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	if len(res.Messages) != 1 || string(res.Messages[0].Value) != "value2" {
		t.Fatalf("fetched %v, want value2 from node 2", res.Messages)
	}
}

// With no other leader named, a lost connection is returned as it came,
// retryable, and the fetch is not sent again within the call.
func TestFetchLostConnectionSameLeader(t *testing.T) {
	n1, _, c := twoNodes(t, 1, 1)
	var fetches1 atomic.Int64
	n1.SetHook(count(&fetches1, fakebroker.Action{Close: true}, isFetch))
	_, err := c.Fetch(testCtx(t), "t", 0, 0, 1<<20, 100*time.Millisecond)
	if !IsRetryable(err) {
		t.Fatalf("fetch: %v, want a retryable error", err)
	}
	if n := fetches1.Load(); n != 1 {
		t.Fatalf("node 1 got %d fetches, want 1", n)
	}
}

// notLeaderUnknown answers produces and fetches as a node cut off from
// the others does once it stepped down: NOT_LEADER naming no leader.
func notLeaderUnknown(n *atomic.Int64) fakebroker.Hook {
	return count(n, fakebroker.Action{Error: &heraldpb.Error{Code: heraldpb.ErrorCode_NOT_LEADER, Message: "not the leader (leader unknown)"}},
		func(f *heraldpb.Frame) bool { return f.GetProduce() != nil || f.GetFetch() != nil })
}

// A leader cut off from the other nodes (the clients still reach it)
// steps down and answers NOT_LEADER naming no leader, and its own
// metadata names itself or nobody; the others elected a new leader. The
// producer asks another broker at once and writes there, instead of
// asking the cut-off node again until the cut heals (the chaos scenario
// minority-partition stopped every write for the whole 8 s cut).
func TestProduceLeavesCutOffLeader(t *testing.T) {
	for _, stale := range []uint32{0, 1} { // node 1's metadata: no leader, or itself
		t.Run(fmt.Sprintf("node1-names-%d", stale), func(t *testing.T) {
			n1, n2, c := twoNodes(t, stale, 2)
			var refused atomic.Int64
			n1.SetHook(notLeaderUnknown(&refused))
			start := time.Now()
			for _, p := range []*Producer{c.NewProducer(WithManualPartitions()), c.NewProducer(WithManualPartitions(), WithIdempotence(false))} {
				if _, err := p.Send(testCtx(t), &Message{Topic: "t", Partition: 0, Value: []byte("moved")}); err != nil {
					t.Fatalf("produce: %v", err)
				}
			}
			took := time.Since(start)
			if recs := n2.Records("t", 0); len(recs) != 3 || string(recs[1].Value) != "moved" {
				t.Fatalf("node 2 holds %d records, want value2 and the two produced", len(recs))
			}
			if n := refused.Load(); n > 1 {
				t.Fatalf("node 1 refused %d produces, want at most 1: the retries went back to it", n)
			}
			if took > 2*time.Second {
				t.Fatalf("the produces took %v", took)
			}
		})
	}
}

// A fetch answered NOT_LEADER naming no leader goes to the leader another
// broker names, within the same call.
func TestFetchLeavesCutOffLeader(t *testing.T) {
	n1, _, c := twoNodes(t, 0, 2)
	var refused atomic.Int64
	n1.SetHook(notLeaderUnknown(&refused))
	res, err := c.Fetch(testCtx(t), "t", 0, 0, 1<<20, 0)
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	if len(res.Messages) != 1 || string(res.Messages[0].Value) != "value2" {
		t.Fatalf("fetched %v, want value2 from node 2", res.Messages)
	}
}

// NOT_ENOUGH_REPLICAS (a leader just elected, a follower rejoining after a
// cut) is waited out within the failover timeout, however many attempts
// that takes, as NOT_READY and THROTTLED are: the chaos test
// TestNetworkNemeses failed a produce after the 10 retries a reconnected
// node's partition needed more than.
func TestProduceWaitsOutNotEnoughReplicas(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	var refused atomic.Int64
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetProduce() != nil && refused.Add(1) <= 15 {
			return fakebroker.Action{Error: &heraldpb.Error{Code: heraldpb.ErrorCode_NOT_ENOUGH_REPLICAS, Message: "1 in-sync replica", RetryAfterMs: 20}}
		}
		return fakebroker.Action{}
	})
	c := dial(t, b)
	p := c.NewProducer(WithRetryBackoff(time.Millisecond, 20*time.Millisecond))
	if _, err := p.Send(testCtx(t), &Message{Topic: "t", Value: []byte("v")}); err != nil {
		t.Fatalf("produce after 15 NOT_ENOUGH_REPLICAS: %v", err)
	}
	if n := refused.Load(); n != 16 {
		t.Fatalf("%d attempts, want 16", n)
	}
}

func TestRequestName(t *testing.T) {
	for f, want := range map[*heraldpb.Frame]string{
		{Body: &heraldpb.Frame_DescribeGroup{DescribeGroup: &heraldpb.DescribeGroupRequest{}}}: "DescribeGroup",
		{Body: &heraldpb.Frame_Unsubscribe{Unsubscribe: &heraldpb.UnsubscribeRequest{}}}:       "Unsubscribe",
		{}: "request",
	} {
		if got := requestName(f); got != want {
			t.Errorf("requestName(%v) = %q, want %q", f, got, want)
		}
	}
}

// A node that restarted and is still starting answers NOT_READY, while
// the metadata the client cached before names it the partition's leader
// (here node 1's own metadata still does); the others elected another.
// The producer asks another broker at once and writes to the leader it
// names, instead of waiting NOT_READY out against the starting node until
// it is ready (a rolling restart in the chaos suite stopped writes for
// 4.5 s so).
func TestProduceLeavesANodeThatIsNotReady(t *testing.T) {
	n1, n2, _ := twoNodes(t, 1, 2)
	var refused atomic.Int64
	n1.SetHook(count(&refused, fakebroker.Action{Error: &heraldpb.Error{Code: heraldpb.ErrorCode_NOT_READY, Message: "loading the cluster's metadata", RetryAfterMs: 200}},
		func(f *heraldpb.Frame) bool { return f.GetProduce() != nil }))
	produceThroughNode1(t, n1, n2, "moved") // its metadata first: node 1 leads
	if n := refused.Load(); n != 1 {
		t.Fatalf("node 1 answered NOT_READY to %d produces, want 1: the retries went back to it", n)
	}
}

// A NOT_LEADER naming a node the client has no address for (its
// metadata, and so its brokers, came from a node that listed the leader's
// node as down at the time) has the producer fetch the metadata again,
// which lists it now, and write there. Before, it kept the stale brokers,
// asked the node it could reach, which named the unreachable leader again,
// and so on until its failover timeout (a chaos run stopped writes for
// 10 s so).
func TestProduceLearnsTheAddressOfANewLeader(t *testing.T) {
	n1, n2, _ := twoNodes(t, 2, 2)
	n1.SetCluster([]*heraldpb.BrokerInfo{{NodeId: 1, Addr: n1.Addr()}}, 2) // node 2 down when asked
	var refused atomic.Int64
	n1.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetProduce() == nil {
			return fakebroker.Action{}
		}
		if refused.Add(1) == 1 {
			// Node 2 is back: the next metadata lists it.
			n1.SetCluster([]*heraldpb.BrokerInfo{{NodeId: 1, Addr: n1.Addr()}, {NodeId: 2, Addr: n2.Addr()}}, 2)
		}
		return fakebroker.Action{Error: &heraldpb.Error{Code: heraldpb.ErrorCode_NOT_LEADER, Leader: 2, Message: "not the leader (leader is node 2)"}}
	})
	produceThroughNode1(t, n1, n2, "found")
	if n := refused.Load(); n != 1 {
		t.Fatalf("node 1 was sent %d produces, want 1", n)
	}
}

// produceThroughNode1 dials node 1 alone, takes its metadata, and sends v
// to partition 0 of t, which must end on node 2 after the value2 there.
func produceThroughNode1(t *testing.T, n1, n2 *fakebroker.Broker, v string) {
	t.Helper()
	c, err := Dial(testCtx(t), n1.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Metadata(testCtx(t), "t"); err != nil {
		t.Fatal(err)
	}
	p := c.NewProducer(WithManualPartitions(), WithFailoverTimeout(time.Minute))
	if _, err := p.Send(testCtx(t), &Message{Topic: "t", Partition: 0, Value: []byte(v)}); err != nil {
		t.Fatalf("produce: %v", err)
	}
	if recs := n2.Records("t", 0); len(recs) != 2 || string(recs[1].Value) != v {
		t.Fatalf("node 2 holds %d records, want value2 and %q", len(recs), v)
	}
}

// Metadata a broker never answers (a frozen node keeps its connections
// open) is asked of another broker once leaderCheck has passed, within
// the same call, not after the request timeout; the silent broker is then
// tried last, so the next call goes to the other one directly. A request
// that is not a read (CreateTopic) is not sent twice.
func TestMetadataLeavesSilentBroker(t *testing.T) {
	n1, n2, c := twoNodes(t, 2, 2, WithRequestTimeout(20*time.Second))
	var meta1, meta2, creates1 atomic.Int64
	n1.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		switch {
		case isMetadata(f):
			meta1.Add(1)
			return fakebroker.Action{Drop: true}
		case f.GetCreateTopic() != nil:
			creates1.Add(1)
			return fakebroker.Action{Drop: true}
		}
		return fakebroker.Action{}
	})
	n2.SetHook(count(&meta2, fakebroker.Action{}, isMetadata))
	start := time.Now()
	r, err := c.Metadata(testCtx(t), "t")
	took := time.Since(start)
	if err != nil || len(r.GetTopics()) != 1 {
		t.Fatalf("metadata: %v %v", r, err)
	}
	if meta1.Load() != 1 || meta2.Load() != 1 {
		t.Fatalf("metadata requests: node 1 %d, node 2 %d; want 1 each (node 2 asked once node 1 was silent)", meta1.Load(), meta2.Load())
	}
	if took >= 20*time.Second {
		t.Fatalf("the call waited for the request timeout (%v)", took)
	}
	if _, err := c.Metadata(testCtx(t), "t"); err != nil || meta1.Load() != 1 || meta2.Load() != 2 {
		t.Fatalf("the next call: %v; node 1 got %d, node 2 %d", err, meta1.Load(), meta2.Load())
	}
	t.Logf("metadata left the silent broker after %v", took.Round(time.Millisecond))

	// Not a read: sent once, to the broker it went to.
	c2, err := Dial(testCtx(t), n1.Addr()+","+n2.Addr(), WithRequestTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.CreateTopic(testCtx(t), "u", &heraldpb.TopicConfig{Partitions: 1}); !errors.Is(err, ErrRequestTimeout) || creates1.Load() != 1 {
		t.Fatalf("CreateTopic to a silent broker: %v, node 1 got %d", err, creates1.Load())
	}
}

// A broker whose kernel accepts the connection and that never answers its
// Hello (a stopped process) is passed over after leaderCheck for the next
// one, not after the 10 s dial timeout; it is then tried last.
func TestDialPassesOverAFrozenBroker(t *testing.T) {
	n1 := newBroker(t, fakebroker.Node(1), fakebroker.Topic("t", 1))
	n2 := newBroker(t, fakebroker.Node(2), fakebroker.Topic("t", 1))
	n1.SetFrozen(true)
	start := time.Now()
	c, err := Dial(testCtx(t), n1.Addr()+","+n2.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := c.Metadata(testCtx(t), "t")
	took := time.Since(start)
	if err != nil || len(r.GetTopics()) != 1 {
		t.Fatalf("metadata: %v %v", r, err)
	}
	if took >= DefaultDialTimeout {
		t.Fatalf("took %v: the frozen broker's dial was waited out", took)
	}
	if n2.Connections() != 1 {
		t.Fatalf("node 2 has %d connections, want 1", n2.Connections())
	}
	t.Logf("connected past the frozen broker after %v", took.Round(time.Millisecond))
}

// A NOT_LEADER naming a node the client had marked suspect (it answered
// NOT_READY while it restarted, and another node led then) sends the
// produce there next: the replica's word is newer than the suspicion.
// Before, the suspect leader was tried after the replicas, which named it
// again, until the mark expired 10 s later (a chaos run stopped writes
// for 3.6 s so).
func TestProduceGoesToANamedLeaderItSuspected(t *testing.T) {
	n1, n2, c := twoNodes(t, 1, 1)
	var refused atomic.Int64
	n1.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetProduce() == nil {
			return fakebroker.Action{}
		}
		refused.Add(1)
		return fakebroker.Action{Error: &heraldpb.Error{Code: heraldpb.ErrorCode_NOT_LEADER, Leader: 2, Message: "not the leader (leader is node 2)"}}
	})
	if _, err := c.Metadata(testCtx(t), "t"); err != nil {
		t.Fatal(err)
	}
	c.markSuspect(n2.Addr(), suspectFor)
	p := c.NewProducer(WithManualPartitions(), WithFailoverTimeout(time.Minute))
	if _, err := p.Send(testCtx(t), &Message{Topic: "t", Partition: 0, Value: []byte("v")}); err != nil {
		t.Fatalf("produce: %v", err)
	}
	if recs := n2.Records("t", 0); len(recs) != 2 || string(recs[1].Value) != "v" {
		t.Fatalf("node 2 holds %d records", len(recs))
	}
	if n := refused.Load(); n != 1 {
		t.Fatalf("node 1 was sent %d produces, want 1 (then the named leader)", n)
	}
}
