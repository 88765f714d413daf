// Package history holds the recorded history of a chaos run: the operations
// the clients and the nemesis invoked and how each ended, one JSON object a
// line (history.jsonl), in the style of Jepsen. The Recorder writes it while
// the run goes on; Read parses it back for the checker. The package does no
// I/O of its own beyond the io.Writer and io.Reader it is given.
package history

import (
	"errors"
	"fmt"
	"strings"
)

// Type says where an operation stands, as in Jepsen.
type Type string

// The types of an operation.
const (
	// Invoke: the process started the operation.
	Invoke Type = "invoke"
	// OK: the operation happened (a produce acknowledged, a delivery
	// received, an ack acknowledged, a fault ended).
	OK Type = "ok"
	// Fail: the operation certainly did not happen (a produce rejected
	// with an error that says nothing was written).
	Fail Type = "fail"
	// Info: the outcome is unknown (a timeout, a lost connection); the
	// operation may or may not have happened.
	Info Type = "info"
)

// F names the function of an operation.
type F string

// The functions of an operation. Which fields each uses is documented in
// docs/chaos.md ("History and checker").
const (
	// Produce sends one record; Value is its unique id. The ok op carries
	// the Partition and Offset the broker assigned.
	Produce F = "produce"
	// Consume is a delivery to a consumer (Type ok), or a fetch a pull
	// consumer started (invoke).
	Consume F = "consume"
	// Ack acknowledges a delivery; ok means the broker acknowledged it.
	Ack F = "ack"
	// Nack rejects a delivery, asking for a redelivery.
	Nack F = "nack"
	// Commit is group progress committed or observed: Offset is the next
	// offset the group will read.
	Commit F = "commit"
	// Request sends a request (invoke) and receives its reply (ok).
	Request F = "request"
	// Reply is a reply sent by a responder (invoke) or delivered to a
	// requester (ok).
	Reply F = "reply"
	// Nemesis is a fault: invoke when it starts, ok when it ends.
	Nemesis F = "nemesis"
	// FinalRead is the final read of a partition's whole log from one
	// replica (Node), in Records.
	FinalRead F = "read"
	// HalfSend sends one half (transactional) message; Value is its unique
	// id, Outcome the end the workload intends for it (commit or rollback,
	// by its producer or by the answer to its check-back). The ok op
	// carries the half's id in RequestID and its Partition.
	HalfSend F = "half"
	// HalfEnd is a producer's commit or rollback (Outcome) of Value's half.
	HalfEnd F = "end-half"
	// HalfCheck is a check-back of Value's half answered (ok) with Outcome.
	HalfCheck F = "check-half"
	// TxnSend stages one record (Value, unique) in the transaction named
	// by RequestID (unique per transaction, e.g. "txn-0-17").
	TxnSend F = "txn-send"
	// TxnEnd ends the transaction RequestID: Outcome commit or rollback
	// (an abort).
	TxnEnd F = "txn-end"
)

// Half-message outcomes, as in Op.Outcome.
const (
	OutcomeCommit   = "commit"
	OutcomeRollback = "rollback"
)

// Consumer modes, as in Op.Mode.
const (
	ModeClustering = "clustering"
	ModeShared     = "shared"
	ModeKeyShared  = "key-shared"
	ModeBroadcast  = "broadcast"
)

// Op is one line of a history. Index and Time are set by the Recorder;
// every other field is the caller's. Fields that an op does not use are
// left zero and omitted from its line.
type Op struct {
	Index   int64  `json:"i"`    // position in the history, from 0, increasing
	Time    int64  `json:"t"`    // nanoseconds since the run started
	Process string `json:"p"`    // "producer-3", "consumer-1", "requester-0", "nemesis"
	Type    Type   `json:"type"` // invoke, ok, fail or info
	F       F      `json:"f"`    // produce, consume, ack, ...

	Topic      string `json:"topic,omitempty"`
	Partition  int32  `json:"partition,omitempty"`
	Key        string `json:"key,omitempty"`
	Value      string `json:"value,omitempty"` // the record's unique id, e.g. "p3-17"
	Offset     int64  `json:"offset,omitempty"`
	ProducerID uint64 `json:"producer_id,omitempty"` // the broker's idempotence id, informational
	Seq        int64  `json:"seq,omitempty"`         // the producer's send order, increasing per Process
	Idempotent bool   `json:"idempotent,omitempty"`

	Group         string `json:"group,omitempty"`
	Mode          string `json:"mode,omitempty"` // clustering, shared, key-shared or broadcast
	Consumer      string `json:"consumer,omitempty"`
	Due           int64  `json:"due,omitempty"` // delayed message: due time, ns since the run started
	MaxDeliveries int    `json:"max_deliveries,omitempty"`
	DLQ           bool   `json:"dlq,omitempty"` // a consume of a dead-letter topic
	Attempt       int    `json:"attempt,omitempty"`

	RequestID string `json:"request_id,omitempty"`
	Outcome   string `json:"outcome,omitempty"` // half messages: commit or rollback
	ReplyTo   string `json:"reply_to,omitempty"`

	Fault string `json:"fault,omitempty"` // the nemesis' fault name
	Node  int    `json:"node,omitempty"`
	Error string `json:"error,omitempty"`

	Records []Record `json:"records,omitempty"` // f=read: the replica's log
}

// Record is one record of a final read.
type Record struct {
	Offset int64  `json:"offset"`
	Key    string `json:"key,omitempty"`
	Value  string `json:"value"`
}

// ErrBadOp marks an op that is not a valid history line; check it with
// errors.Is.
var ErrBadOp = errors.New("herald: bad history op")

// Validate reports what makes op unfit for a history: an unknown Type or
// F, an empty Process, or a negative Index or Time. The error matches
// ErrBadOp.
func (op Op) Validate() error {
	var bad []string
	switch op.Type {
	case Invoke, OK, Fail, Info:
	default:
		bad = append(bad, fmt.Sprintf("unknown type %q", op.Type))
	}
	switch op.F {
	case Produce, Consume, Ack, Nack, Commit, Request, Reply, Nemesis, FinalRead, HalfSend, HalfEnd, HalfCheck, TxnSend, TxnEnd:
	default:
		bad = append(bad, fmt.Sprintf("unknown f %q", op.F))
	}
	if op.Process == "" {
		bad = append(bad, "no process")
	}
	if op.Index < 0 {
		bad = append(bad, fmt.Sprintf("negative index %d", op.Index))
	}
	if op.Time < 0 {
		bad = append(bad, fmt.Sprintf("negative time %d", op.Time))
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrBadOp, strings.Join(bad, "; "))
}
