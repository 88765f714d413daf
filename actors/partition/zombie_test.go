package partition

import (
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
)

// A replaced session's epochs are refused, the new session's taken, a
// floor only rises, and past maxSessionFences producers the oldest floor
// is forgotten. (End to end: e2e/TestTxnSDKFencing/written-once.)
func TestSessionFences(t *testing.T) {
	a := &Actor{cfg: Config{Topic: "t"}, m: newPartMetrics("zombie-test", 0)}
	defer DeleteMetrics("zombie-test", 0)
	if e := a.checkSession(7, 3); e != nil {
		t.Fatalf("a producer never fenced: %v", e)
	}
	a.fenceSession(7, 10)
	if e := a.checkSession(7, 9); e.GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
		t.Fatalf("epoch 9 below the floor 10: %v", e)
	}
	for _, ep := range []uint32{10, 11} {
		if e := a.checkSession(7, ep); e != nil {
			t.Fatalf("the new session's epoch %d: %v", ep, e)
		}
	}
	a.fenceSession(7, 5) // (a late sweep of an older session)
	if e := a.checkSession(7, 9); e == nil {
		t.Fatal("the floor went down")
	}
	for pid := uint64(100); pid < 100+maxSessionFences; pid++ {
		a.fenceSession(pid, 1)
	}
	if len(a.sessions.floor) != maxSessionFences || len(a.sessions.order) != maxSessionFences {
		t.Fatalf("%d floors (%d in order), want %d", len(a.sessions.floor), len(a.sessions.order), maxSessionFences)
	}
	if e := a.checkSession(7, 9); e != nil {
		t.Fatalf("the oldest floor is still kept past the bound: %v", e)
	}
	if e := a.checkSession(100+maxSessionFences-1, 0); e == nil {
		t.Fatal("the newest floor was forgotten")
	}
}
