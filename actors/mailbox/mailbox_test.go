package mailbox

import (
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

type work struct{ n int }
type control struct{}

// TestShedsPastLimit blocks an actor, floods it, and checks that work past the
// limit is shed while control messages are still queued.
func TestShedsPastLimit(t *testing.T) {
	sys := actor.NewActorSystem()
	release := make(chan struct{})
	var mu sync.Mutex
	var got, controls int
	shed := New(10, func(msg interface{}) bool {
		_, ok := msg.(*work)
		return ok
	})
	first := true
	props := actor.PropsFromFunc(func(ctx actor.Context) {
		switch ctx.Message().(type) {
		case *work:
			if first {
				first = false
				<-release
			}
			mu.Lock()
			got++
			mu.Unlock()
		case *control:
			mu.Lock()
			controls++
			mu.Unlock()
		}
	}, actor.WithMailbox(shed.Producer()))
	pid := sys.Root.Spawn(props)
	sys.Root.Send(pid, &work{})
	// Wait until the first message is being processed (mailbox empty again).
	deadline := time.Now().Add(5 * time.Second)
	for shed.Depth() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("actor never picked up the first message")
		}
		time.Sleep(time.Millisecond)
	}
	for i := 0; i < 100; i++ {
		sys.Root.Send(pid, &work{n: i})
	}
	for i := 0; i < 5; i++ {
		sys.Root.Send(pid, &control{})
	}
	if d := shed.Depth(); d != 15 {
		t.Fatalf("depth %d, want 10 work + 5 control", d)
	}
	if s := shed.Shed(); s != 90 {
		t.Fatalf("shed %d, want 90", s)
	}
	close(release)
	for {
		mu.Lock()
		g, c := got, controls
		mu.Unlock()
		if g == 11 && c == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processed %d work, %d control; want 11, 5", g, c)
		}
		time.Sleep(time.Millisecond)
	}
}
