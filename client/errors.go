package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Sentinel errors returned by the client. Check them with errors.Is.
var (
	// ErrClosed is returned by every call on a Client or Producer after
	// Close, and by requests that were outstanding when Close ran.
	ErrClosed = errors.New("herald: client closed")
	// ErrConnectionLost is wrapped by errors of requests that were
	// outstanding on a connection that broke. The request may or may not
	// have been executed by the broker. Retryable.
	ErrConnectionLost = errors.New("herald: connection lost")
	// ErrRequestTimeout means the broker did not answer within the client's
	// request timeout (WithRequestTimeout). Retryable.
	ErrRequestTimeout = errors.New("herald: request timed out")
	// ErrBufferFull is returned by SendAsync of a producer built with
	// WithNonBlocking when its buffer (WithBufferBytes) is full.
	ErrBufferFull = errors.New("herald: producer buffer full")
	// ErrNoBrokers means no address in the bootstrap list could be dialled.
	// Retryable: brokers restart.
	ErrNoBrokers = errors.New("herald: no broker reachable")
	// ErrRecordTooLarge means a single record does not fit the producer's
	// batch size or the connection's negotiated frame size.
	ErrRecordTooLarge = errors.New("herald: record too large")
	// ErrInvalidPartition fails a message whose Partition is negative,
	// sent by a producer with WithManualPartitions (without it Partition is
	// ignored). Nothing is sent. Not retryable.
	ErrInvalidPartition = errors.New("herald: invalid partition")
	// ErrProtocol means the broker sent something this client cannot
	// understand (an unexpected response body, an undecodable batch).
	ErrProtocol = errors.New("herald: protocol violation")

	// ErrTLS: the TLS handshake with a broker failed (WithTLS): an
	// unknown certificate authority, an expired or missing certificate,
	// or a port that does not speak TLS. Retrying does not help.
	ErrTLS = errors.New("herald: TLS")
	// ErrAcksLost is returned by Subscription.Flush and Close when acks or
	// nacks could not be confirmed: their session ended first (the
	// connection died) or the broker refused them. The broker redelivers
	// those messages. Not retryable: acking again cannot help.
	ErrAcksLost = errors.New("herald: acks lost")
	// ErrNotRequest is returned by Reply for a message that is not a
	// request (it has no reply inbox).
	ErrNotRequest = errors.New("herald: message is not a request")
	// ErrOutcomeUnknown is wrapped by the final error of a produce whose
	// records may have been written although it failed: an attempt was
	// sent and then timed out, lost its connection, or was answered with
	// an Error marked OutcomeUnknown. See IsOutcomeUnknown.
	ErrOutcomeUnknown = errors.New("herald: outcome unknown")
	// ErrRollback, wrapped by the error of SendInTransaction's local
	// function, rolls the half message back; any other error leaves it to
	// the check-back.
	ErrRollback = errors.New("herald: roll back")
	// ErrProducerFenced matches (errors.Is) the broker's PRODUCER_FENCED
	// error: a newer session of the transactional id exists (another
	// NewTransactionalProducer with the same id started). It is final: the
	// TransactionalProducer returns it from every call from then on, and
	// the process must stop producing under that id.
	ErrProducerFenced = errors.New("herald: producer fenced")
	// ErrTxnTimedOut matches (errors.Is) the broker's TXN_TIMED_OUT error:
	// the coordinator aborted the transaction because it stayed open past
	// its timeout (WithTransactionTimeout). Abort it (a no-op then) and
	// begin again: the producer starts a new session first.
	ErrTxnTimedOut = errors.New("herald: transaction timed out")
	// ErrTxnFailed is wrapped, with the first failure, by the errors of
	// Send, Flush and Commit once a record of the open transaction failed
	// to be staged: the transaction cannot commit, only Abort.
	ErrTxnFailed = errors.New("herald: transaction failed, abort it")
	// ErrTxnAborted is the error of records sent in a transaction that
	// Abort dropped before they were staged.
	ErrTxnAborted = errors.New("herald: transaction aborted")
)

// Error is a failure reported by the broker: one wire heraldpb.Error. Callers
// switch on Code:
//
//	var he *client.Error
//	if errors.As(err, &he) && he.Code == heraldpb.ErrorCode_TOPIC_NOT_FOUND { ... }
type Error struct {
	Code       heraldpb.ErrorCode
	Retriable  bool          // as the broker said; see IsRetryable
	Message    string        // the broker's one-line reason
	RetryAfter time.Duration // wait at least this long before retrying; 0 = no hint
	// Leader, with NOT_LEADER, is the node the broker knows to lead the
	// partition; with NOT_COORDINATOR, the node coordinating consumer
	// groups or transactions (0: unknown). The client goes there on its
	// retry.
	Leader uint32
	// LostFrom and LostTo, with PARTITION_DAMAGED, are the offsets
	// [LostFrom, LostTo) the partition's damaged log lost.
	LostFrom, LostTo int64
	// OutcomeUnknown: the request may have taken effect although it
	// failed (a produce proposed to the partition's log when its storage
	// failed or its leader changed). See IsOutcomeUnknown.
	OutcomeUnknown bool
}

func (e *Error) Error() string {
	if e.RetryAfter > 0 {
		return fmt.Sprintf("herald %s: %s (retry after %s)", e.Code, e.Message, e.RetryAfter)
	}
	return fmt.Sprintf("herald %s: %s", e.Code, e.Message)
}

// Is makes errors.Is(err, ErrProducerFenced), ErrTxnTimedOut,
// ErrNotAuthenticated and ErrNotAuthorized hold for the broker's errors of
// those codes, as IsCode does.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrProducerFenced:
		return e.Code == heraldpb.ErrorCode_PRODUCER_FENCED
	case ErrTxnTimedOut:
		return e.Code == heraldpb.ErrorCode_TXN_TIMED_OUT
	case ErrNotAuthenticated:
		return e.Code == heraldpb.ErrorCode_NOT_AUTHENTICATED
	case ErrNotAuthorized:
		return e.Code == heraldpb.ErrorCode_NOT_AUTHORIZED
	}
	return false
}

// fromWire converts a wire error. A broker that omits the retriable flag on a
// code the registry lists as retriable is still treated as retriable.
func fromWire(e *heraldpb.Error) *Error {
	return &Error{
		Code:           e.GetCode(),
		Retriable:      e.GetRetriable() || heraldpb.IsRetriableCode(e.GetCode()),
		Message:        e.GetMessage(),
		RetryAfter:     time.Duration(e.GetRetryAfterMs()) * time.Millisecond,
		Leader:         e.GetLeader(),
		LostFrom:       e.GetLostFrom(),
		LostTo:         e.GetLostTo(),
		OutcomeUnknown: e.GetOutcomeUnknown(),
	}
}

// IsOutcomeUnknown reports whether a failed produce may nevertheless have
// been written, as Kafka says of a timed-out produce: err is (or wraps) a
// broker Error marked OutcomeUnknown, or ErrOutcomeUnknown, which a
// Producer wraps around the final error of a batch any attempt of which
// timed out, lost its connection after it was sent, or was answered
// OutcomeUnknown. A failed produce for which it is false was not written.
// (An idempotent producer's retries never write a batch twice; this is
// about a batch whose retries ran out.)
func IsOutcomeUnknown(err error) bool {
	var he *Error
	return errors.Is(err, ErrOutcomeUnknown) || errors.As(err, &he) && he.OutcomeUnknown
}

// IsCode reports whether err is (or wraps) a broker Error with code.
func IsCode(err error, code heraldpb.ErrorCode) bool {
	if err == nil {
		return false // (before he: a nil error, every success, allocates nothing)
	}
	var he *Error
	return errors.As(err, &he) && he.Code == code
}

// IsRetryable reports whether an operation that failed with err may succeed
// if retried unchanged. It is true for broker errors marked retriable
// (THROTTLED, NOT_LEADER, TIMEOUT, ...), for ErrConnectionLost, for
// ErrRequestTimeout and for network timeouts. It is false for nil, for
// ErrClosed, and for context.Canceled and context.DeadlineExceeded: those
// mean the caller gave up, and retrying with the same context cannot help.
//
// A produce retried after ErrConnectionLost or ErrRequestTimeout may write
// the batch twice, since the first attempt may have been executed, unless
// the producer is idempotent (WithIdempotence, the default): then the
// partition recognises the retry and writes the batch once.
func IsRetryable(err error) bool {
	switch {
	case err == nil, errors.Is(err, ErrClosed):
		return false
	case errors.Is(err, ErrConnectionLost), errors.Is(err, ErrRequestTimeout), errors.Is(err, ErrNoBrokers):
		// No broker reachable is transient too: a broker restarting, a
		// leader moving.
		return true
	}
	var he *Error
	if errors.As(err, &he) {
		return he.Retriable
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// leaderMoving reports whether err says a partition's leader is moving or
// its node is gone or frozen: NOT_LEADER, a lost connection, no broker
// reachable, a request timeout.
func leaderMoving(err error) bool {
	return IsCode(err, heraldpb.ErrorCode_NOT_LEADER) || errors.Is(err, ErrConnectionLost) || errors.Is(err, ErrNoBrokers) || errors.Is(err, ErrRequestTimeout)
}

// waitOut reports whether err asks the client to wait and try again: a
// node not ready yet (replaying its log, loading metadata) or saturated,
// or a partition whose followers are not in sync for the moment (a
// leader just elected, a follower rejoining after a cut). Such errors are
// retried until the producer's failover timeout has passed since the
// first of them, however many attempts that takes, each wait at least the
// broker's retry-after hint.
func waitOut(err error) bool {
	return IsCode(err, heraldpb.ErrorCode_NOT_READY) || IsCode(err, heraldpb.ErrorCode_THROTTLED) ||
		IsCode(err, heraldpb.ErrorCode_NOT_ENOUGH_REPLICAS)
}

// retryAfter returns the broker's retry hint carried by err, or 0.
func retryAfter(err error) time.Duration {
	var he *Error
	if errors.As(err, &he) {
		return he.RetryAfter
	}
	return 0
}
