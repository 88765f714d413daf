package client

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/heraldmq/herald/client/fakebroker"
	heraldpb "github.com/heraldmq/herald/proto"
)

// delayedFrames records the delayed produce requests a fake broker sees,
// and lets act choose what it does with each (by its place, from 0).
type delayedFrames struct {
	mu   sync.Mutex
	reqs []*heraldpb.ProduceRequest
}

func (d *delayedFrames) hook(act func(i int, r *heraldpb.ProduceRequest) fakebroker.Action) fakebroker.Hook {
	return func(_ int, f *heraldpb.Frame) fakebroker.Action {
		r := f.GetProduce()
		if r == nil || r.DelayMs == 0 {
			return fakebroker.Action{}
		}
		d.mu.Lock()
		i := len(d.reqs)
		d.reqs = append(d.reqs, r)
		d.mu.Unlock()
		return act(i, r)
	}
}

func (d *delayedFrames) all() []*heraldpb.ProduceRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*heraldpb.ProduceRequest(nil), d.reqs...)
}

// An idempotent producer's delayed batches carry a producer id of their
// own and a sequence each, and a retry (its answer lost) carries the same.
func TestDelayedBatchesAreNumbered(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 2))
	var d delayedFrames
	b.SetHook(d.hook(func(i int, _ *heraldpb.ProduceRequest) fakebroker.Action {
		return fakebroker.Action{LoseReply: i == 1}
	}))
	p := dial(t, b).NewProducer(WithRetryBackoff(time.Millisecond, 10*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 3 {
		if _, err := p.Send(ctx, &Message{Topic: "t", Value: []byte("v"), Delay: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	reqs := d.all()
	if len(reqs) != 4 {
		t.Fatalf("%d delayed requests, want 4 (one retried)", len(reqs))
	}
	pid := reqs[0].ProducerId
	want := []int64{0, 1, 1, 2}
	for i, r := range reqs {
		if pid == 0 || r.ProducerId != pid || r.BaseSequence != want[i] {
			t.Errorf("request %d: producer id %d sequence %d, want %d and %d", i, r.ProducerId, r.BaseSequence, pid, want[i])
		}
	}
}

// A broker from before delayed batches were idempotent refuses a producer
// id on them: the producer sends that batch and the later ones without.
func TestDelayedBatchesToAnOlderBroker(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 2))
	var d delayedFrames
	b.SetHook(d.hook(func(_ int, r *heraldpb.ProduceRequest) fakebroker.Action {
		if r.ProducerId != 0 {
			return fakebroker.Action{Error: heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "a delayed batch cannot be idempotent: send it with producer_id 0")}
		}
		return fakebroker.Action{}
	}))
	p := dial(t, b).NewProducer()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 2 {
		if _, err := p.Send(ctx, &Message{Topic: "t", Value: []byte("v"), Delay: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	reqs := d.all()
	if len(reqs) != 3 || reqs[0].ProducerId == 0 || reqs[1].ProducerId != 0 || reqs[2].ProducerId != 0 {
		t.Fatalf("requests %v, want one refused with a producer id and two without", reqs)
	}
}

// An idempotent delayed batch is not retried when the attempt could end
// after the scheduler's dedup window: here every attempt could, with a
// request timeout longer than it.
func TestDelayedBatchNotRetriedPastTheWindow(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 2))
	var d delayedFrames
	b.SetHook(d.hook(func(int, *heraldpb.ProduceRequest) fakebroker.Action {
		e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "busy")
		e.RetryAfterMs = 1
		return fakebroker.Action{Error: e}
	}))
	p := dial(t, b, WithRequestTimeout(delayedRetrySpan)).NewProducer()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := p.Send(ctx, &Message{Topic: "t", Value: []byte("v"), Delay: time.Minute})
	if !IsCode(err, heraldpb.ErrorCode_THROTTLED) || len(d.all()) != 1 {
		t.Fatalf("Send: %v after %d attempts, want THROTTLED after one", err, len(d.all()))
	}
	// With a request timeout well within the window it is retried.
	d.mu.Lock()
	d.reqs = nil
	d.mu.Unlock()
	short, cancelShort := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancelShort()
	_, err = dial(t, b, WithRequestTimeout(time.Second)).NewProducer().Send(short, &Message{Topic: "t", Value: []byte("v"), Delay: time.Minute})
	if err == nil || len(d.all()) < 2 {
		t.Fatalf("Send with a short request timeout: %v after %d attempts, want retries", err, len(d.all()))
	}
}
