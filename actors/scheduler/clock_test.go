package scheduler

import (
	"testing"
	"time"

	"github.com/heraldmq/herald/actors/partition"
	"github.com/heraldmq/herald/internal/faults"
	"github.com/heraldmq/herald/persistence/vfs"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// loadSlack is how late past its bound a delayed batch may become readable
// on a loaded machine (CI runs this package next to the chaos and e2e
// suites, whose fsyncs made it 2 s late once). The defects these tests
// catch are a minute off either way, so a wide slack keeps them exact.
const loadSlack = 10 * time.Second

// TestDelayNotShortenedByAStepOfTheSchedulersClock: the scheduler and its
// node's partitions on the chaos build's clock, whose wall reading an
// offset steps (as an NTP step or `date -s` does) and whose monotonic
// reading it leaves alone; the broker pokes the scheduler after each
// change (ClockJumped). A batch delayed 2 s, then a step of 60 s right
// after the scheduler took it: forward, it is not readable before 2 s of
// real time have passed (it was at once, 2 s early, when the scheduler
// read its time off the wall clock); back, it is not early either, and
// late by at most the partition's MaxHold (its node's wall clock is
// behind the scheduler's time) plus a margin for a loaded machine (loadSlack).
func TestDelayNotShortenedByAStepOfTheSchedulersClock(t *testing.T) {
	const delay = 2 * time.Second
	for _, tc := range []struct {
		name string
		step time.Duration
		late time.Duration // how late it may be, in real time
	}{
		{"forward", time.Minute, loadSlack},
		{"back", -time.Minute, partition.MaxHold + loadSlack},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := faults.New(vfs.Default)
			// The same clock for both rooms, as the broker wires them.
			r := newRigClock(t, t.TempDir(), Options{Now: clk.Now}, clk, 0)
			defer r.stop()
			defer clk.OnClockChange(func() { r.sys.Root.Send(r.sched, &ClockJumped{}) })()

			// The request reaches the scheduler after sent: its time is
			// 2 s after that, less the millisecond its time is rounded
			// down to.
			sent := time.Now()
			r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
				Topic: "t", Partition: proto.Uint32(0), DelayMs: uint64(delay / time.Millisecond), Records: batchOf("d"),
			}}}, r.sched)
			if err := clk.SetOffset(tc.step); err != nil {
				t.Fatal(err)
			}
			notBefore := delay - time.Millisecond
			checks := 0
			for {
				vals, _ := r.read(0)
				elapsed := time.Since(sent) // monotonic: the step does not move it
				if len(vals) > 0 {
					if elapsed < notBefore {
						t.Fatalf("readable %v after it was sent, %v early (step %v)", elapsed, notBefore-elapsed, tc.step)
					}
					t.Logf("readable %v after it was sent (step %v, %d checks before)", elapsed, tc.step, checks)
					break
				}
				if elapsed > delay+tc.late {
					t.Fatalf("not readable %v after it was sent, %v delayed (step %v)", elapsed, delay, tc.step)
				}
				checks++
				time.Sleep(5 * time.Millisecond) // a check every 5 ms, not synchronisation
			}
			if checks == 0 {
				t.Fatal("nothing was checked before it became readable")
			}
		})
	}
}

// TestStepBeforeTheStartDoesNotMoveDelayedMessages: the scheduler takes a
// batch delayed 3 s and stops (its leadership moves, its node restarts);
// the node's clock is stepped a minute ahead; the scheduler starts again
// there. Anchored to the cluster's time (Anchor: here the right clock,
// as the median of the nodes' clocks is when one node is stepped), the
// batch is not readable before its 3 s; on the node's own clock alone it
// was readable at once, early by the rest of its delay (the limit
// docs/limits.md listed).
func TestStepBeforeTheStartDoesNotMoveDelayedMessages(t *testing.T) {
	const delay = 3 * time.Second
	clk := faults.New(vfs.Default)
	o := Options{Now: clk.Now, Anchor: time.Now}
	r := newRigClock(t, t.TempDir(), o, clk, 0)
	defer r.stop()
	sent := time.Now()
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "t", Partition: proto.Uint32(0), DelayMs: uint64(delay / time.Millisecond), Records: batchOf("d"),
	}}}, r.sched)
	if _, err := r.sys.Root.StopFuture(r.sched).Result(); err != nil {
		t.Fatal(err)
	}
	if err := clk.SetOffset(time.Minute); err != nil {
		t.Fatal(err)
	}
	r.sched = r.sys.Root.Spawn(Props(r.o))
	notBefore := delay - time.Millisecond
	checks := 0
	for {
		vals, _ := r.read(0)
		elapsed := time.Since(sent)
		if len(vals) > 0 {
			if elapsed < notBefore {
				t.Fatalf("readable %v after it was sent, %v early", elapsed, notBefore-elapsed)
			}
			break
		}
		if elapsed > delay+partition.MaxHold+loadSlack {
			t.Fatalf("not readable %v after it was sent, %v delayed", elapsed, delay)
		}
		checks++
		time.Sleep(5 * time.Millisecond) // a check every 5 ms, not synchronisation
	}
	if checks == 0 {
		t.Fatal("nothing was checked before it became readable")
	}
}
