package broker

import (
	"sync/atomic"

	heraldpb "github.com/heraldmq/herald/proto"
)

// MaxFetchWait is the longest long poll a Fetch may ask for: a larger
// max_wait_ms is lowered to it (a fetch parked for 2^32-1 ms would hold
// its connection slot for 49 days). Atomic so a test can shorten it while
// a broker's event loop reads it.
var MaxFetchWait atomic.Uint32 // ms

func init() { MaxFetchWait.Store(30_000) }

// checkRequest refuses, before routing, the client requests whose fields
// no handler accepts, and clamps those it bounds (a fetch's wait). It
// returns nil when f may be routed.
func checkRequest(f *heraldpb.Frame) *heraldpb.Error {
	switch b := f.Body.(type) {
	case *heraldpb.Frame_Produce:
		if _, ok := heraldpb.Acks_name[int32(b.Produce.Acks)]; !ok {
			return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "acks %d is not one of 0 (all), 1 (leader), 2 (none)", int32(b.Produce.Acks))
		}
		if b.Produce.ProducerEpoch != 0 && b.Produce.TransactionalId == "" {
			return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "producer_epoch %d without a transactional_id: epochs belong to transactional producers", b.Produce.ProducerEpoch)
		}
	case *heraldpb.Frame_Fetch:
		b.Fetch.MaxWaitMs = min(b.Fetch.MaxWaitMs, MaxFetchWait.Load())
	}
	return nil
}
