package partition

import (
	"sync"
	"sync/atomic"
	"time"
)

// Replicas' clocks. Every replica needs a tick message each TickInterval
// (raft's clock, retention, idle release), or once a second while
// quiesced. One goroutine and one timer per period serve every replica of
// the process with that period: a node with thousands of idle replicas
// wakes ten times a second, not ten thousand (a ticker goroutine per
// replica cost 12-19 % of a core at 1,000 RF=3 partitions on 3 nodes).

// sharedTicker calls its subscribers' functions every period.
type sharedTicker struct {
	every time.Duration
	mu    sync.Mutex
	subs  map[uint64]func()
	next  uint64
	snap  atomic.Pointer[[]func()] // subs as a slice, rebuilt on change
	stop  chan struct{}
}

var tickers = struct {
	mu       sync.Mutex
	byPeriod map[time.Duration]*sharedTicker
}{byPeriod: map[time.Duration]*sharedTicker{}}

// subscribeTick calls fn every period (from the ticker's goroutine: keep
// it short and non-blocking) until cancel is called.
func subscribeTick(every time.Duration, fn func()) (cancel func()) {
	tickers.mu.Lock()
	defer tickers.mu.Unlock()
	t := tickers.byPeriod[every]
	if t == nil {
		t = &sharedTicker{every: every, subs: map[uint64]func(){}, stop: make(chan struct{})}
		tickers.byPeriod[every] = t
		go t.run()
	}
	t.mu.Lock()
	t.next++
	id := t.next
	t.subs[id] = fn
	t.publish()
	t.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { t.unsubscribe(id) }) }
}

// unsubscribe removes a subscriber; the last one stops the goroutine.
func (t *sharedTicker) unsubscribe(id uint64) {
	tickers.mu.Lock()
	defer tickers.mu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.subs, id)
	t.publish()
	if len(t.subs) == 0 {
		close(t.stop)
		delete(tickers.byPeriod, t.every)
	}
}

// publish rebuilds the snapshot the goroutine iterates (t.mu held).
func (t *sharedTicker) publish() {
	fns := make([]func(), 0, len(t.subs))
	for _, fn := range t.subs {
		fns = append(fns, fn)
	}
	t.snap.Store(&fns)
}

func (t *sharedTicker) run() {
	tk := time.NewTicker(t.every)
	defer tk.Stop()
	for {
		select {
		case <-tk.C:
			for _, fn := range *t.snap.Load() {
				fn()
			}
		case <-t.stop:
			return
		}
	}
}
