package persistence

import (
	"testing"
	"time"
)

func timeNow() time.Time { return time.Now() }

// waitFor polls cond until it holds or 10s pass; it synchronises on an
// observable effect, never on a fixed sleep.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}
