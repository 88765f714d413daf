package topic

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/internal/raftwire"
	heraldpb "github.com/heraldmq/herald/proto"
)

// stuckTransport models a cluster in which node 1, the partition's
// leader, was killed: a request to it is answered only after the
// transport gives up (release), while node 2 answers at once.
type stuckTransport struct {
	release chan struct{}
	asked   sync.Map // node -> *atomic.Int32
}

func (s *stuckTransport) Send(uint64, *raftwire.Message) {}
func (s *stuckTransport) Register(string, *actor.PID)    {}
func (s *stuckTransport) Unregister(string)              {}
func (s *stuckTransport) Up(uint64) bool                 { return true }
func (s *stuckTransport) count(node uint64) *atomic.Int32 {
	n, _ := s.asked.LoadOrStore(node, new(atomic.Int32))
	return n.(*atomic.Int32)
}

func (s *stuckTransport) Request(node uint64, _ string, f *heraldpb.Frame) (*heraldpb.Frame, error) {
	s.count(node).Add(1)
	if node == 1 {
		<-s.release
		return heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "dead letter")), nil
	}
	return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{BaseOffset: 7}}}, nil
}

// A produce forwarded to a leader that was killed is given up on once
// this node learns of a new leader, and goes to it within the same
// request, instead of waiting for the transport to give up on the dead
// node (10 s: the plain producers of leader-kill-plain stalled that long).
// The abandoned request still counts until it ends.
func TestProxyFollowsANewLeader(t *testing.T) {
	tr := &stuckTransport{release: make(chan struct{})}
	r := &remoteProxy{transport: tr, self: 3}
	var leader atomic.Uint64
	leader.Store(1)
	f := &heraldpb.Frame{Id: 9, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t"}}}
	var pending sync.WaitGroup
	type result struct {
		f    *heraldpb.Frame
		from uint64
	}
	done := make(chan result, 1)
	go func() {
		resp, from := r.forward(f, "t", "t-0", 0, "t/0", []uint64{1, 2}, leader.Load, &pending)
		done <- result{resp, from}
	}()
	// While node 1 still leads as far as this node knows, the request
	// waits for it.
	select {
	case res := <-done:
		t.Fatalf("answered %v while the leader was unchanged", res.f)
	case <-time.After(5 * proxyLeaderCheck):
	}
	leader.Store(2) // node 2 elected
	select {
	case res := <-done:
		if res.from != 2 || res.f.GetProduceResponse().GetBaseOffset() != 7 {
			t.Fatalf("answer %v from node %d, want node 2's", res.f, res.from)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the request still waits for the dead node after a new leader was elected")
	}
	if n := tr.count(2).Load(); n != 1 {
		t.Fatalf("node 2 asked %d times", n)
	}
	ended := make(chan struct{})
	go func() { pending.Wait(); close(ended) }()
	select {
	case <-ended:
		t.Fatal("the request given up on no longer counts while it is in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(tr.release)
	<-ended
}

// A leader change to the node asked, or to none, is no reason to give up.
func TestProxyWaitsForASlowLeader(t *testing.T) {
	tr := &stuckTransport{release: make(chan struct{})}
	r := &remoteProxy{transport: tr, self: 3}
	var leader atomic.Uint64
	leader.Store(2) // stale: the request goes to node 1, which leads
	f := &heraldpb.Frame{Id: 9, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t"}}}
	var pending sync.WaitGroup
	done := make(chan *heraldpb.Frame, 1)
	go func() {
		resp, _ := r.forward(f, "t", "t-0", 0, "t/0", []uint64{1}, leader.Load, &pending)
		done <- resp
	}()
	for deadline := time.Now().Add(5 * time.Second); tr.count(1).Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("node 1 was never asked")
		}
		time.Sleep(time.Millisecond)
	}
	// Each state is held for a few checks, in which the request must not
	// be given up.
	for _, l := range []uint64{0, 1} {
		leader.Store(l)
		select {
		case resp := <-done:
			t.Fatalf("gave up on node 1 with the leader known as %d: %v", l, resp)
		case <-time.After(3 * proxyLeaderCheck):
		}
	}
	close(tr.release)
	if resp := <-done; resp.GetError().GetCode() != heraldpb.ErrorCode_TIMEOUT {
		t.Fatalf("answer %v, want node 1's", resp)
	}
	pending.Wait()
}
