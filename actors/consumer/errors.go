package consumer

import "errors"

// Sentinel errors of the consumer state machines, checked with errors.Is.
// The coordinator maps them to wire errors (INVALID_REQUEST for the caller's
// mistakes); none of them means the state was changed.
var (
	// ErrUnknownMember: the member never joined, or has left or died.
	ErrUnknownMember = errors.New("herald: unknown consumer member")
	// ErrMemberExists: Join named a member that is already in the group.
	ErrMemberExists = errors.New("herald: consumer member already joined")
	// ErrNotDelivered: an ack or nack named an offset that was never
	// delivered in this subscription (and is not acknowledged already).
	ErrNotDelivered = errors.New("herald: message not delivered")
	// ErrNotInFlight: a nack named a message that is not in flight to the
	// member (it was acked, timed out, or belongs to another member).
	ErrNotInFlight = errors.New("herald: message not in flight to member")
	// ErrBeyondSpan: an ack named an offset at or beyond the progress limit
	// (floor + max span). The dispatcher never delivers such offsets.
	ErrBeyondSpan = errors.New("herald: offset beyond the progress span")
	// ErrNotRevoking: a revoke confirmation named a partition the member was
	// not asked to give up.
	ErrNotRevoking = errors.New("herald: partition not being revoked from member")
	// ErrNotOwner: a commit named a partition the member does not own.
	ErrNotOwner = errors.New("herald: partition not owned by member")
	// ErrBadProgress: an encoded progress is not canonical or exceeds the
	// span. The record is corrupt or was written with a larger span.
	ErrBadProgress = errors.New("herald: malformed consumer progress")
	// ErrBadConfig: a Config failed Validate.
	ErrBadConfig = errors.New("herald: invalid subscription config")
	// ErrUnknownPartition: a partition the subscription does not have.
	ErrUnknownPartition = errors.New("herald: no such partition")
	// ErrBroadcast: a group position asked of a broadcast group, where
	// each member has its own.
	ErrBroadcast = errors.New("herald: a broadcast group has no group position")
)
