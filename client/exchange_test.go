package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/client/fakebroker"
	heraldpb "github.com/heraldmq/herald/proto"
)

// The hand-written publish frame is byte for byte what proto.Marshal
// gives for the same PublishRequest.
func TestPublishFrameEncoding(t *testing.T) {
	records, _ := encodeRecord(nil, &Message{Key: []byte("k"), Value: bytes.Repeat([]byte("v"), 300)})
	records, _ = encodeRecord(records, &Message{Value: []byte("w"), Headers: []Header{{Key: "h", Value: []byte("1")}}})
	for i, req := range []*heraldpb.PublishRequest{
		{},
		{Exchange: "orders", RoutingKey: "eu.order.created"},
		{RoutingKey: "topic", Mandatory: true, TimeoutMs: 30000},
		{Exchange: "x", RoutingKey: "k", Mandatory: true, TimeoutMs: 1, ProducerId: 1<<63 - 1, Sequence: 1 << 40},
		{Exchange: "x", ProducerId: 5, Sequence: 0},
	} {
		for _, id := range []uint64{0, 1, 1 << 50} {
			for _, recs := range [][]byte{nil, records} {
				got := appendPublishFrame([]byte("pre"), id, req, recs)
				want := &heraldpb.PublishRequest{Exchange: req.Exchange, RoutingKey: req.RoutingKey, Records: recs, Mandatory: req.Mandatory,
					TimeoutMs: req.TimeoutMs, ProducerId: req.ProducerId, Sequence: req.Sequence}
				ref, err := heraldpb.AppendFrame([]byte("pre"), &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_Publish{Publish: want}})
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, ref) {
					t.Errorf("%s: got %x\nwant %x", fmt.Sprint(i, id, len(recs)), got, ref)
				}
			}
		}
	}
}

// Publish sends a publish refused with NOT_LEADER (nothing written) again
// until it is stored, as a producer would.
func TestPublishRetriesNotLeader(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	var refused atomic.Int32
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetPublish() != nil && refused.Add(1) <= 2 {
			return fakebroker.Action{Error: &heraldpb.Error{Code: heraldpb.ErrorCode_NOT_LEADER, Retriable: true, Message: "electing"}}
		}
		return fakebroker.Action{}
	})
	c := dial(t, b)
	r, err := c.Publish(context.Background(), "", "t", PublishOptions{}, &Message{Value: []byte("v")})
	if err != nil || len(r.Destinations) != 1 || r.Destinations[0].BaseOffset != 0 {
		t.Fatalf("publish: %+v %v", r, err)
	}
	if n := refused.Load(); n != 3 {
		t.Fatalf("%d sends, want 3", n)
	}
	if got := b.Records("t", 0); len(got) != 1 {
		t.Fatalf("stored %d records, want 1", len(got))
	}
}

// An idempotent publish is sent again with its publisher id and sequence
// after a lost answer; once its outcome stays unknown, the next publish
// carries a new publisher id (it must not pass for a retry of the lost
// one); a success moves the sequence on.
func TestIdempotentPublishIDs(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 1))
	type sent struct {
		id  uint64
		seq int64
	}
	var mu sync.Mutex
	var seen []sent
	lose := atomic.Int32{}
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		p := f.GetPublish()
		if p == nil {
			return fakebroker.Action{}
		}
		mu.Lock()
		seen = append(seen, sent{p.ProducerId, p.Sequence})
		mu.Unlock()
		if lose.Add(-1) >= 0 {
			return fakebroker.Action{LoseReply: true}
		}
		return fakebroker.Action{}
	})
	c := dial(t, b, WithRequestTimeout(2*time.Second))
	ctx := context.Background()
	pub := func() error {
		_, err := c.Publish(ctx, "", "t", PublishOptions{Idempotent: true}, &Message{Value: []byte("v")})
		return err
	}
	if err := pub(); err != nil {
		t.Fatal(err)
	}
	lose.Store(1) // the next one's first answer is lost: sent again, same id and sequence
	if err := pub(); err != nil {
		t.Fatal(err)
	}
	lose.Store(3) // every attempt's answer lost: outcome unknown
	if err := pub(); !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("every answer lost: %v", err)
	}
	if err := pub(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 7 {
		t.Fatalf("sends: %v", seen)
	}
	id := seen[0].id
	want := []sent{{id, 0}, {id, 1}, {id, 1}, {id, 2}, {id, 2}, {id, 2}}
	for i, w := range want {
		if seen[i] != w {
			t.Fatalf("send %d: %v, want %v (all: %v)", i, seen[i], w, seen)
		}
	}
	if last := seen[6]; last.id == id || last.id == 0 || last.seq != 0 {
		t.Fatalf("after an unknown outcome: %v, want a new id at sequence 0", last)
	}
}
