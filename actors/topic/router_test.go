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

// TestRouteRefusesInternalFields: not_before_ms, hold_us, clock_id and
// include_held are the scheduler's; a client that sets them gets
// INVALID_REQUEST.
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
	r.Route(&heraldpb.Frame{Id: 3, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Records: batch("k"), HoldUs: 50_000}}}, inbox)
	r.Route(&heraldpb.Frame{Id: 4, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Records: batch("k"), ClockId: 7}}}, inbox)
	// A client must not fence the transaction coordinator's appends.
	r.Route(&heraldpb.Frame{Id: 5, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", TxnEpoch: 1 << 40}}}, inbox)
	// Nor the scheduler's.
	r.Route(&heraldpb.Frame{Id: 8, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Records: batch("k"), Fencer: heraldpb.Fencer_FENCER_SCHEDULER}}}, inbox)
	// Nor write a transaction's batch without its transactional id, or
	// its markers (the coordinator's).
	r.Route(&heraldpb.Frame{Id: 6, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Records: batch("k"), TxnBatch: true, ProducerId: 3}}}, inbox)
	r.Route(&heraldpb.Frame{Id: 7, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", TxnMarker: heraldpb.TxnMarker_TXN_MARKER_COMMIT, ProducerId: 3, TxnRecords: 1}}}, inbox)
	for i := 0; i < 8; i++ {
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
