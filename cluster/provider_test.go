package cluster

import (
	"errors"
	"syscall"
	"testing"

	"github.com/asynkron/protoactor-go/cluster/clusterproviders/automanaged"
)

// A peer stays a member through fewer than `tolerate` consecutive timed
// out polls, leaves at the last one, and a refused connection (its
// process gone) drops it at once; an answer resets the count.
func TestPeerStateTolerance(t *testing.T) {
	n := &automanaged.NodeModel{ID: "m1"}
	slow := errors.New("context deadline exceeded")
	refused := &wrapErr{syscall.ECONNREFUSED}
	st := &peerState{}
	if st.member(3) != nil {
		t.Fatal("a peer never heard from is a member")
	}
	st.observe(n, nil, 3)
	for i := 1; i <= 2; i++ {
		st.observe(nil, slow, 3)
		if st.member(3) != n {
			t.Fatalf("dropped after %d timeouts, tolerating 3", i)
		}
	}
	st.observe(nil, slow, 3)
	if st.member(3) != nil {
		t.Fatal("still a member after 3 timeouts")
	}
	st.observe(&automanaged.NodeModel{ID: "m2"}, nil, 3)
	if m := st.member(3); m == nil || m.ID != "m2" {
		t.Fatalf("after an answer (a new member id): %+v", m)
	}
	st.observe(nil, refused, 3)
	if st.member(3) != nil {
		t.Fatal("a refused connection did not drop the peer")
	}
}

type wrapErr struct{ err error }

func (w *wrapErr) Error() string { return "dial: " + w.err.Error() }
func (w *wrapErr) Unwrap() error { return w.err }
