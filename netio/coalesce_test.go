package netio

import (
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	heraldpb "github.com/heraldmq/herald/proto"
)

// framesPerWrite reads herald_frames_per_write: writes and frames so far.
func framesPerWrite(t *testing.T) (writes uint64, frames float64) {
	t.Helper()
	var m dto.Metric
	if err := mFramesPerWrite.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// TestFramesWrittenTogether: frames handed to one connection from several
// goroutines at once all arrive whole, each goroutine's in the order it
// wrote them; those that reached the connection before its event loop got
// to them went out together (fewer writes than frames), and once the
// client has read everything no output is left counted.
func TestFramesWrittenTogether(t *testing.T) {
	h := newHarness(t, nil)
	cl := h.dial()
	cl.hello(1, 0)
	c := h.onlyConn()

	const writers, each = 4, 2000
	w0, f0 := framesPerWrite(t)
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				b, err := heraldpb.AppendFrame(nil, &heraldpb.Frame{Id: uint64(g)<<32 | uint64(i),
					Body: &heraldpb.Frame_Error{Error: heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "frame %d of writer %d", i, g)}})
				if err != nil {
					t.Error(err)
					return
				}
				if !c.write(b, false, 0) {
					t.Errorf("writer %d: frame %d not queued", g, i)
					return
				}
			}
		}()
	}
	next := make([]uint64, writers)
	for range writers * each {
		f := cl.mustRead()
		g, i := f.Id>>32, f.Id&(1<<32-1)
		if g >= writers || i != next[g] {
			t.Fatalf("frame %d of writer %d arrived, want frame %d of it", i, g, next[min(g, writers-1)])
		}
		if e := f.GetError(); e == nil || e.GetCode() != heraldpb.ErrorCode_THROTTLED {
			t.Fatalf("frame %d of writer %d: body %v", i, g, f.Body)
		}
		next[g]++
	}
	wg.Wait()
	w1, f1 := framesPerWrite(t)
	if frames := f1 - f0; frames != writers*each {
		t.Errorf("herald_frames_per_write counted %v frames, want %d", frames, writers*each)
	}
	if writes := w1 - w0; float64(writes) >= f1-f0 {
		t.Errorf("%d writes for %v frames: none were written together", writes, f1-f0)
	} else {
		t.Logf("%d frames in %d writes", writers*each, writes)
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.out.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes of output still counted after the client read everything", c.out.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
