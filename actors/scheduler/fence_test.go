package scheduler

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
)

// TestLateFireOfADeposedSchedulerIsFenced: scheduler A (epoch 1) announces
// a fire and sends its append, which is held on its way (a paused node, a
// slow link). A is deposed; B loads in epoch 2 and looks for the fire on
// its partition. A's append arrives right after B's look (before B's own
// append): it must be refused (PRODUCER_FENCED), not stored, as B then
// appends the batch. Before the fence, the batch was delivered twice
// (chaos clock-jump-delayed, where __schedule's leadership moves by
// pausing its node).
func TestLateFireOfADeposedSchedulerIsFenced(t *testing.T) {
	var epoch atomic.Uint64
	epoch.Store(1)
	release := make(chan struct{})
	var heldA, released atomic.Bool
	var mu sync.Mutex
	var lateAnswers []*heraldpb.Frame
	isA := func(msg any) bool {
		f, ok := msg.(*heraldpb.Frame)
		return ok && f.GetProduce() != nil && len(f.GetProduce().Records) > 0 && f.GetProduce().TxnEpoch == 1
	}
	p := &proxy{
		intercept: func(msg any) any {
			if isA(msg) {
				heldA.Store(true)
				<-release
			}
			return nil
		},
		override: func(msg, res any) any {
			if isA(msg) {
				mu.Lock()
				lateAnswers = append(lateAnswers, res.(*heraldpb.Frame))
				mu.Unlock()
			}
			if f, ok := msg.(*heraldpb.Frame); ok && f.GetFetch().GetIncludeHeld() && epoch.Load() == 2 && released.CompareAndSwap(false, true) {
				// B's look is done: A's append lands now, before B's answer.
				close(release)
				deadline := time.Now().Add(10 * time.Second)
				for answered := false; !answered && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
					mu.Lock()
					answered = len(lateAnswers) > 0
					mu.Unlock()
				}
			}
			return res
		},
	}
	r := newProxyRig(t, t.TempDir(), Options{Lead: 50 * time.Millisecond, epochOf: epoch.Load}, "t", 0, p)
	defer r.stop()
	defer func() {
		if released.CompareAndSwap(false, true) {
			close(release)
		}
	}()
	r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: "t", Partition: proto.Uint32(0), DelayMs: 300, Records: batchOf("once")}}}, r.sched)
	waitFor(t, "A's append held", heldA.Load)

	// A is deposed; B loads in the next epoch and fires the batch again.
	if _, err := r.sys.Root.StopFuture(r.sched).Result(); err != nil {
		t.Fatal(err)
	}
	epoch.Store(2)
	r.sched = r.sys.Root.Spawn(Props(r.o))
	waitFor(t, "B's fire", func() bool { v, _ := r.read(0); return len(v) >= 1 })
	waitFor(t, "A's late append answered", func() bool { mu.Lock(); defer mu.Unlock(); return len(lateAnswers) > 0 })
	mu.Lock()
	for _, res := range lateAnswers {
		if res.GetError().GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
			t.Errorf("the deposed scheduler's late append was answered %v, want PRODUCER_FENCED", res)
		}
	}
	mu.Unlock()
	if v, _ := r.read(0); !slices.Equal(v, []string{"once"}) {
		t.Fatalf("partition holds %q, want the batch once", v)
	}
}

// TestSchedulerResetsTheEpochOfALostSchedule: the partition holds the
// epoch of scheduler A (5), whose __schedule's state was then lost, so
// the next scheduler's epoch starts lower (B, 2, as a new __schedule's
// term would). B is refused as fenced; a write to __schedule in its own
// epoch commits, which proves no newer scheduler runs, so it resets the
// partition's epoch over exactly 5, and its fire goes through instead of
// being refused for good.
func TestSchedulerResetsTheEpochOfALostSchedule(t *testing.T) {
	var epoch atomic.Uint64
	epoch.Store(5)
	r := newRig(t, t.TempDir(), Options{Lead: 20 * time.Millisecond, epochOf: epoch.Load})
	defer r.stop()
	r.schedule(0, 50*time.Millisecond, "a")
	waitFor(t, "A's fire", func() bool { v, _ := r.read(0); return len(v) == 1 })

	if _, err := r.sys.Root.StopFuture(r.sched).Result(); err != nil {
		t.Fatal(err)
	}
	resets := testutil.ToFloat64(mEpochResets)
	epoch.Store(2)
	r.sched = r.sys.Root.Spawn(Props(r.o))
	r.schedule(0, 50*time.Millisecond, "b")
	waitFor(t, "B's fire", func() bool { v, _ := r.read(0); return len(v) == 2 })
	if v, _ := r.read(0); !slices.Equal(v, []string{"a", "b"}) {
		t.Fatalf("partition holds %q", v)
	}
	if n := testutil.ToFloat64(mEpochResets) - resets; n != 1 {
		t.Fatalf("herald_scheduler_epoch_resets_total rose by %v, want 1", n)
	}
}

// TestNoFenceAppendsWithoutEpoch: with NoFence (--schedule-fence=false,
// for an upgrade from partitions that refuse the scheduler's epoch) the
// fires carry no epoch, as before the fence.
func TestNoFenceAppendsWithoutEpoch(t *testing.T) {
	var stamped, fires atomic.Int32
	p := &proxy{intercept: func(msg any) any {
		if f, ok := msg.(*heraldpb.Frame); ok && f.GetProduce() != nil {
			fires.Add(1)
			if f.GetProduce().TxnEpoch != 0 || f.GetProduce().Fencer != 0 {
				stamped.Add(1)
			}
		}
		return nil
	}}
	r := newProxyRig(t, t.TempDir(), Options{Lead: 20 * time.Millisecond, NoFence: true}, "t", 0, p)
	defer r.stop()
	r.schedule(0, 50*time.Millisecond, "a")
	waitFor(t, "the fire", func() bool { v, _ := r.read(0); return len(v) == 1 })
	if fires.Load() == 0 || stamped.Load() != 0 {
		t.Fatalf("%d fires, %d of them stamped with an epoch", fires.Load(), stamped.Load())
	}
}
