package partition

import (
	"sync/atomic"
	"testing"
	"time"
)

// Replicas with the same period share one ticker: each subscriber is
// called every period until it cancels; the last cancel stops the
// ticker's goroutine, and a later subscriber starts a new one.
func TestSharedTicker(t *testing.T) {
	const every = 3 * time.Millisecond
	var a, b atomic.Int64
	cancelA := subscribeTick(every, func() { a.Add(1) })
	cancelB := subscribeTick(every, func() { b.Add(1) })
	checkFor(t, 5*time.Second, "both ticked", func() bool { return a.Load() >= 3 && b.Load() >= 3 })
	cancelA()
	cancelA() // twice is harmless
	stopped := a.Load()
	from := b.Load()
	checkFor(t, 5*time.Second, "b ticks on", func() bool { return b.Load() >= from+5 })
	if got := a.Load(); got > stopped+1 { // one call may have been under way
		t.Fatalf("a cancelled subscriber was called %d more times", got-stopped)
	}
	cancelB()
	tickers.mu.Lock()
	_, running := tickers.byPeriod[every]
	tickers.mu.Unlock()
	if running {
		t.Fatal("the ticker of a period with no subscriber still runs")
	}
	var c atomic.Int64
	cancelC := subscribeTick(every, func() { c.Add(1) })
	defer cancelC()
	checkFor(t, 5*time.Second, "a new subscriber ticks", func() bool { return c.Load() >= 2 })
}
