package netio

import (
	"sync"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// wakeRecorder is a gnet.Conn that records its Wake calls (the only
// method admitQueue uses), under mu when one is given (wakes from a
// timer's goroutine).
type wakeRecorder struct {
	gnet.Conn
	id    int
	mu    *sync.Mutex
	woken *[]int
}

func (w wakeRecorder) Wake(gnet.AsyncCallback) error {
	if w.mu != nil {
		w.mu.Lock()
		defer w.mu.Unlock()
	}
	*w.woken = append(*w.woken, w.id)
	return nil
}

// TestAdmitQueueOrder: connections are woken in the order they first
// waited, once each; one woken whose frame still does not fit keeps its
// turn; closed connections and ones already woken by their own answers
// leave the line without taking a turn.
func TestAdmitQueueOrder(t *testing.T) {
	var woken []int
	var q admitQueue
	conns := make([]*conn, 5)
	for i := range conns {
		conns[i] = &conn{gc: wakeRecorder{id: i, woken: &woken}}
	}
	wait := func(i int, front bool) {
		conns[i].deferred.Store(true)
		q.wait(conns[i], front)
	}
	wait(0, false)
	wait(1, false)
	wait(2, false)
	wait(1, false) // already in line: keeps its place
	q.wakeNext()
	if len(woken) != 1 || woken[0] != 0 || !conns[0].wokenFromLine.Load() {
		t.Fatalf("woken %v, want [0] marked woken from the line", woken)
	}
	// 0 still does not fit: back to the front.
	wait(0, true)
	q.wakeNext()
	if woken[1] != 0 {
		t.Fatalf("woken %v: 0 lost its turn", woken)
	}
	// 1 was woken by its own answer meanwhile, 2 closed: both are passed
	// over; 3 and 4 joined later.
	conns[1].deferred.Store(false)
	conns[2].closed.Store(true)
	wait(3, false)
	wait(4, false)
	q.wakeNext()
	q.wakeNext()
	if want := []int{0, 0, 3, 4}; len(woken) != 4 || woken[2] != 3 || woken[3] != 4 {
		t.Fatalf("woken %v, want %v", woken, want)
	}
	if !q.empty() {
		t.Fatal("line not empty")
	}
	q.wakeNext() // an empty line wakes nobody
	if len(woken) != 4 {
		t.Fatalf("woken %v from an empty line", woken)
	}
	// A connection can wait again once it left the line.
	wait(1, false)
	q.wakeNext()
	if woken[4] != 1 {
		t.Fatalf("woken %v, want 1 last", woken)
	}
}

// TestAdmitQueueWakeAfter: when produces are paced, room comes back with
// time: wakeAfter wakes the next in line once, however often it is asked
// before it fires.
func TestAdmitQueueWakeAfter(t *testing.T) {
	var mu sync.Mutex
	var woken []int
	var q admitQueue
	conns := make([]*conn, 2)
	for i := range conns {
		conns[i] = &conn{gc: wakeRecorder{id: i, mu: &mu, woken: &woken}}
		conns[i].deferred.Store(true)
		q.wait(conns[i], false)
	}
	q.wakeAfter(5 * time.Millisecond)
	q.wakeAfter(time.Millisecond) // already pending: no second wake
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(woken)
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("wakeAfter woke nobody")
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(woken) != 1 || woken[0] != 0 {
		t.Fatalf("woken %v, want [0]", woken)
	}
	if q.empty() {
		t.Fatal("the second connection left the line unwoken")
	}
}
