package topic

import (
	"github.com/heraldmq/herald/registry"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

func batch(keys ...string) []byte {
	b := &heraldpb.RecordBatch{}
	for _, k := range keys {
		b.Records = append(b.Records, &heraldpb.Record{Key: []byte(k), Value: []byte("v")})
	}
	raw, _ := proto.Marshal(b)
	return raw
}

// TestRoute covers the three ways a produce picks its partition.
func TestRoute(t *testing.T) {
	ta := &topicActor{name: "t", partitions: make([]*actor.PID, 4)}
	p := func(n uint32) *uint32 { return &n }

	// Explicit partition wins, and is checked.
	if got, err := ta.route(&heraldpb.ProduceRequest{Partition: p(3), Records: batch("k")}); err != nil || got != 3 {
		t.Fatalf("explicit: %d %v", got, err)
	}
	if _, err := ta.route(&heraldpb.ProduceRequest{Partition: p(4), Records: batch()}); err.GetCode() != heraldpb.ErrorCode_PARTITION_NOT_FOUND {
		t.Fatalf("explicit out of range: %v", err)
	}
	// A key always maps to the same partition, the SDK's PartitionForKey.
	for _, k := range []string{"a", "customer-7", "zzz"} {
		want := heraldpb.PartitionForKey([]byte(k), 4)
		for i := 0; i < 3; i++ {
			if got, err := ta.route(&heraldpb.ProduceRequest{Records: batch(k, "other")}); err != nil || got != want {
				t.Fatalf("key %q: %d %v, want %d", k, got, err, want)
			}
		}
	}
	// No key: round-robin over every partition.
	seen := map[uint32]int{}
	for i := 0; i < 8; i++ {
		got, err := ta.route(&heraldpb.ProduceRequest{Records: batch("")})
		if err != nil {
			t.Fatal(err)
		}
		seen[got]++
	}
	for part := uint32(0); part < 4; part++ {
		if seen[part] != 2 {
			t.Fatalf("round-robin uneven: %v", seen)
		}
	}
	// A batch that is not a RecordBatch is refused.
	if _, err := ta.route(&heraldpb.ProduceRequest{Records: []byte{0xff}}); err.GetCode() != heraldpb.ErrorCode_INVALID_REQUEST {
		t.Fatalf("bad batch: %v", err)
	}
}

// TestPartitionForKeyIsFNV1a pins the partitioner: changing it would move
// every keyed record of an existing topic.
func TestPartitionForKeyIsFNV1a(t *testing.T) {
	cases := map[string]uint32{"": 2166136261 % 7, "a": 0xe40c292c % 7, "foobar": 0xbf9cf968 % 7}
	for k, want := range cases {
		if got := heraldpb.PartitionForKey([]byte(k), 7); got != want {
			t.Fatalf("PartitionForKey(%q, 7) = %d, want %d", k, got, want)
		}
	}
}

// TestRouteRefusesInternalFields: not_before_ms and include_held are the
// scheduler's; a client that sets them gets INVALID_REQUEST.
func TestRouteRefusesInternalFields(t *testing.T) {
	sys := actor.NewActorSystem()
	got := make(chan *heraldpb.Frame, 2)
	inbox := sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		if f, ok := ctx.Message().(*heraldpb.Frame); ok {
			got <- f
		}
	}))
	r := NewRouter(sys, &registry.Registry{}, nil)
	r.Route(&heraldpb.Frame{Id: 1, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Records: batch("k"), NotBeforeMs: 1}}}, inbox)
	r.Route(&heraldpb.Frame{Id: 2, Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{Topic: "t", IncludeHeld: true}}}, inbox)
	for i := 0; i < 2; i++ {
		select {
		case f := <-got:
			if f.GetError().GetCode() != heraldpb.ErrorCode_INVALID_REQUEST {
				t.Fatalf("frame %d: %v, want INVALID_REQUEST", f.Id, f)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no answer")
		}
	}
}
