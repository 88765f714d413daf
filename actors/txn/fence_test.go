package txn

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLateAppendOfADeposedCoordinatorIsFenced reproduces the duplicate
// that two coordinators could write (docs/limits.md listed it as a known
// issue): coordinator A (epoch 1) commits a half and sends its append,
// which is held on the way (here: by the test); A is deposed, and B
// (epoch 2) loads, scans the partition, does not find the half, and
// appends it. A's append arrives between B's scan and B's append. Before
// the fence both were written; now the partition refuses A's with
// PRODUCER_FENCED, since B fenced it before its scan.
func TestLateAppendOfADeposedCoordinatorIsFenced(t *testing.T) {
	var epoch atomic.Uint64
	epoch.Store(1)
	type held struct {
		to *actor.PID
		f  *heraldpb.Frame
	}
	var mu sync.Mutex
	var late []held
	var lateAnswers []*heraldpb.Frame
	var sys *actor.ActorSystem
	intercept := func(to *actor.PID, f *heraldpb.Frame) bool {
		mu.Lock()
		defer mu.Unlock()
		if epoch.Load() == 1 {
			late = append(late, held{to, f})
			return true
		}
		// B's first append: A's arrive just before it.
		for _, h := range late {
			res, err := sys.Root.RequestFuture(h.to, h.f, 10*time.Second).Result()
			if err != nil {
				res = heraldpb.ErrorFrame(0, heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "%v", err))
			}
			lateAnswers = append(lateAnswers, res.(*heraldpb.Frame))
		}
		late = nil
		return false
	}
	r := newRig(t, t.TempDir(), Options{epochOf: epoch.Load, interceptAppend: intercept})
	sys = r.sys
	id := r.half("a")
	// A's commit is decided; its append is held, so the answer never comes.
	_, _ = r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{
		Id: id, Action: heraldpb.HalfAction_HALF_COMMIT}}}, 500*time.Millisecond).Result()
	waitFor(t, "A's append held", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(late) == 0 {
			return fmt.Errorf("no append sent")
		}
		return nil
	})

	// A is deposed; B loads in the next epoch and finishes the commit.
	if _, err := r.sys.Root.StopFuture(r.txn).Result(); err != nil {
		t.Fatal(err)
	}
	epoch.Store(2)
	r.txn = r.sys.Root.Spawn(Props(Options{Topics: r.reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Push: noPush{},
		epochOf: epoch.Load, interceptAppend: intercept}))
	waitFor(t, "B finished the commit", func() error {
		if n := r.pending(); n != 0 {
			return fmt.Errorf("%d pending", n)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(lateAnswers) == 0 {
		t.Fatal("A's append was never delivered")
	}
	for _, res := range lateAnswers {
		if res.GetError().GetCode() != heraldpb.ErrorCode_PRODUCER_FENCED {
			t.Errorf("the deposed coordinator's late append was answered %v, want PRODUCER_FENCED", res)
		}
	}
	if got := r.values(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("topic holds %v, want a once", got)
	}
}

// TestCoordinatorResetsTheEpochOfALostTxn: partitions hold the epoch of a
// coordinator of a __txn whose state was lost (here: coordinator A, epoch
// 5), and the next coordinator's epoch starts lower (B, epoch 2, as a
// new __txn's term would). B is refused as fenced; a write to __txn in
// its own epoch commits, which proves no newer coordinator runs, so it
// resets the partition's epoch over exactly 5, and its append goes
// through. Before, B's appends were refused for good.
func TestCoordinatorResetsTheEpochOfALostTxn(t *testing.T) {
	var epoch atomic.Uint64
	epoch.Store(5)
	r := newRig(t, t.TempDir(), Options{epochOf: epoch.Load})
	a := r.half("a")
	if e := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{Id: a, Action: heraldpb.HalfAction_HALF_COMMIT}}}, r.txn).GetEndHalfResponse(); e.GetBaseOffset() != 0 {
		t.Fatalf("commit of a: %v", e)
	}
	if _, err := r.sys.Root.StopFuture(r.txn).Result(); err != nil {
		t.Fatal(err)
	}
	epoch.Store(2)
	resets := testutil.ToFloat64(mTxnEpochResets)
	r.txn = r.sys.Root.Spawn(Props(Options{Topics: r.reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Push: noPush{}, epochOf: epoch.Load}))
	b := r.half("b")
	if e := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{Id: b, Action: heraldpb.HalfAction_HALF_COMMIT}}}, r.txn).GetEndHalfResponse(); e.GetBaseOffset() != 1 {
		t.Fatalf("commit of b: %v", e)
	}
	if got := r.values(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("topic holds %v, want a, b", got)
	}
	if n := testutil.ToFloat64(mTxnEpochResets) - resets; n != 1 {
		t.Fatalf("herald_txn_epoch_resets_total rose by %v, want 1", n)
	}
}
