package partition

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
)

var (
	// ErrNotLeader: this replica does not lead the partition.
	ErrNotLeader = errors.New("herald: not the partition leader")
	// ErrStorageFailed: the replica's log failed and is being reopened.
	ErrStorageFailed = errors.New("herald: partition storage failed")
)

// storageError turns a log error into the wire error a client sees.
func storageError(err error) *heraldpb.Error {
	switch {
	case errors.Is(err, persistence.ErrOffsetOutOfRange):
		return heraldpb.NewError(heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE, "%v", err)
	case errors.Is(err, syscall.ENOSPC):
		e := heraldpb.NewError(heraldpb.ErrorCode_STORAGE_ERROR, "disk full: %v", err)
		e.RetryAfterMs = 1000
		return e
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EROFS):
		e := heraldpb.NewError(heraldpb.ErrorCode_STORAGE_ERROR, "permission denied: %v", err)
		e.RetryAfterMs = 1000
		return e
	default:
		e := heraldpb.NewError(heraldpb.ErrorCode_STORAGE_ERROR, "%v", err)
		e.RetryAfterMs = 1000
		return e
	}
}

// notLeader is NotLeader naming the leader by its raft id.
func notLeader(topic string, part uint32, leader uint64) *heraldpb.Error {
	return NotLeader(topic, part, heraldpb.ReplicaNode(leader))
}

// NotLeader is the NOT_LEADER error of a partition, naming its leader's
// node (0: unknown) for the client to go to.
func NotLeader(topic string, part uint32, leader uint64) *heraldpb.Error {
	msg := fmt.Sprintf("partition %s-%d: not the leader (leader is node %d)", topic, part, leader)
	if leader == 0 {
		msg = fmt.Sprintf("partition %s-%d: not the leader (leader unknown)", topic, part)
	}
	e := heraldpb.NewError(heraldpb.ErrorCode_NOT_LEADER, "%s", msg)
	e.Leader = uint32(leader)
	return e
}
