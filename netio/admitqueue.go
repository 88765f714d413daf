package netio

import (
	"sync"
	"sync/atomic"
	"time"
)

// admitQueue is the line of connections whose produce waits for room
// (deferProduce), in the order they first waited. When any connection's
// produce is answered, the bytes it frees go to the connection at the head
// of the line: conn.answer wakes it (wakeNext) so that its loop decides the
// waiting frame again at once. Without the line, a connection with nothing
// in flight waited for its own retry-after timer however much room had
// been freed, and the broker sat below its limit with producers waiting.
//
// A woken connection whose frame still does not fit goes back to the head
// (it keeps its turn); one that is admitted leaves the line. Each
// connection is in the line at most once, so its length is bounded by the
// connections (--max-connections); herald_produce_waiting_connections
// shows it.
type admitQueue struct {
	mu    sync.Mutex
	line  []*conn // line[head:] wait, first in front
	head  int
	n     atomic.Int64 // len(line) - head, for wakeNext's lock-free look
	timer *time.Timer  // wakeAfter's; nil or fired: none pending
	armed bool
}

// wakeAfter wakes the next in line after d unless a wake is already
// pending: when produces are paced (latency.go) room comes back with time,
// not only with answers, and nothing may be in flight to answer.
func (q *admitQueue) wakeAfter(d time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.armed {
		return
	}
	q.armed = true
	if q.timer == nil {
		q.timer = time.AfterFunc(d, q.fire)
		return
	}
	q.timer.Reset(d)
}

func (q *admitQueue) fire() {
	q.mu.Lock()
	q.armed = false
	q.mu.Unlock()
	q.wakeNext()
}

// wait puts c in the line: at the back, or at the front when it was just
// woken from it and its frame still does not fit. A connection already in
// the line keeps its place.
func (q *admitQueue) wait(c *conn, front bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.inLine {
		return
	}
	c.inLine = true
	q.n.Add(1)
	mProduceWaiting.Inc()
	if front && q.head > 0 {
		q.head--
		q.line[q.head] = c
		return
	}
	if front {
		q.line = append([]*conn{c}, q.line...)
		return
	}
	if q.head > 0 && q.head == len(q.line) {
		q.line, q.head = q.line[:0], 0
	}
	q.line = append(q.line, c)
}

// empty reports whether no connection waits in line.
func (q *admitQueue) empty() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.head == len(q.line)
}

// wakeNext takes connections from the front of the line until one is
// woken: a connection that closed, whose loop was already woken (by its
// own answer or its timer), or that has produces of its own in flight
// (whose answers wake it) leaves the line without counting.
func (q *admitQueue) wakeNext() {
	for q.n.Load() > 0 { // every answered produce calls it: most find no line
		q.mu.Lock()
		if q.head == len(q.line) {
			q.mu.Unlock()
			return
		}
		c := q.line[q.head]
		q.line[q.head] = nil
		q.head++
		if q.head*2 >= len(q.line) { // keep the line's slice to about twice who waits
			n := copy(q.line, q.line[q.head:])
			clear(q.line[n:])
			q.line, q.head = q.line[:n], 0
		}
		c.inLine = false
		q.n.Add(-1)
		mProduceWaiting.Dec()
		q.mu.Unlock()
		if c.adm.own.Load() > 0 {
			continue // its own answers wake it: the room goes to the next
		}
		c.wokenFromLine.Store(true) // before its loop can see it woken
		if c.closed.Load() || !c.deferred.CompareAndSwap(true, false) {
			c.wokenFromLine.Store(false)
			continue
		}
		_ = c.gc.Wake(nil)
		return
	}
}
