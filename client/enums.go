package client

import heraldpb "github.com/heraldmq/herald/proto"

// Go names for the wire enums that SDK calls take: client.AcksLeader rather
// than heraldpb.Acks_ACKS_LEADER. Each is the heraldpb value itself, typed
// as its heraldpb enum, so code written with either name keeps compiling
// and the two compare equal.
//
// Subscription modes and start positions have Go names of their own
// (Clustering, Broadcast, Shared, KeyShared; Earliest, Latest, AtOffset,
// AtTime), which Subscribe, NewConsumer and ResetGroup take.

// Acknowledgement levels of a producer (WithAcks).
const (
	// AcksAll, the default, acknowledges a batch once the partition's
	// replica quorum has committed it (fsynced as the broker's flush
	// policy says).
	AcksAll heraldpb.Acks = heraldpb.Acks_ACKS_ALL
	// AcksLeader acknowledges a batch once the partition's leader has
	// written it (and fsynced it, with the broker's flush=always), before
	// the replica quorum has committed it.
	AcksLeader heraldpb.Acks = heraldpb.Acks_ACKS_LEADER
	// AcksNone acknowledges a batch when the broker accepts it, before it
	// is written; results carry Offset -1.
	AcksNone heraldpb.Acks = heraldpb.Acks_ACKS_NONE
)

// Offset lookups of ListOffsets.
const (
	// OffsetEarliest is the log start: the oldest offset still stored.
	OffsetEarliest heraldpb.OffsetSpec = heraldpb.OffsetSpec_OFFSET_SPEC_EARLIEST
	// OffsetLatest is the high watermark: the offset the next committed
	// record will get.
	OffsetLatest heraldpb.OffsetSpec = heraldpb.OffsetSpec_OFFSET_SPEC_LATEST
	// OffsetTimestamp is the first record with a timestamp at or after the
	// time given to ListOffsets (the high watermark when there is none).
	OffsetTimestamp heraldpb.OffsetSpec = heraldpb.OffsetSpec_OFFSET_SPEC_TIMESTAMP
)

// HalfAction is the outcome of a half (transactional) message: what
// EndHalf does with it, and what a TransactionChecker answers.
type HalfAction = heraldpb.HalfAction

// Outcomes of a half message (HalfAction).
const (
	// HalfUnknown is a TransactionChecker's "not known yet": the broker
	// asks again later. EndHalf refuses it.
	HalfUnknown HalfAction = heraldpb.HalfAction_HALF_UNKNOWN
	// HalfCommit makes the half message visible: the broker appends it to
	// its topic (at its delivery time, if it has one).
	HalfCommit HalfAction = heraldpb.HalfAction_HALF_COMMIT
	// HalfRollback discards the half message.
	HalfRollback HalfAction = heraldpb.HalfAction_HALF_ROLLBACK
)
