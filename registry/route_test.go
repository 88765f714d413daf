package registry

import (
	"fmt"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
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
	pids := make([]*actor.PID, 4)
	for i := range pids {
		pids[i] = actor.NewPID("local", fmt.Sprintf("p/t-%d", i))
	}
	e := &Entry{Name: "t", Partitions: pids, Stats: make([]*partition.Stats, 4)}
	route := func(req *heraldpb.ProduceRequest) (uint32, *heraldpb.Error) {
		part, to, err := e.Route(req)
		if err == nil && to != pids[part] {
			t.Fatalf("partition %d routed to %v", part, to)
		}
		return part, err
	}
	p := func(n uint32) *uint32 { return &n }

	// Explicit partition wins, and is checked.
	if got, err := route(&heraldpb.ProduceRequest{Partition: p(3), Records: batch("k")}); err != nil || got != 3 {
		t.Fatalf("explicit: %d %v", got, err)
	}
	if _, err := route(&heraldpb.ProduceRequest{Partition: p(4), Records: batch()}); err.GetCode() != heraldpb.ErrorCode_PARTITION_NOT_FOUND {
		t.Fatalf("explicit out of range: %v", err)
	}
	// A key always maps to the same partition, the SDK's PartitionForKey.
	for _, k := range []string{"a", "customer-7", "zzz"} {
		want := heraldpb.PartitionForKey([]byte(k), 4)
		for i := 0; i < 3; i++ {
			if got, err := route(&heraldpb.ProduceRequest{Records: batch(k, "other")}); err != nil || got != want {
				t.Fatalf("key %q: %d %v, want %d", k, got, err, want)
			}
		}
	}
	// No key: round-robin over every partition.
	seen := map[uint32]int{}
	for i := 0; i < 8; i++ {
		got, err := route(&heraldpb.ProduceRequest{Records: batch("")})
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
	if _, err := route(&heraldpb.ProduceRequest{Records: []byte{0xff}}); err.GetCode() != heraldpb.ErrorCode_INVALID_REQUEST {
		t.Fatalf("bad batch: %v", err)
	}
}
