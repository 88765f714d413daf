package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Half (transactional) messages, as RocketMQ has them: SendHalf stores a
// message the broker keeps from every consumer until EndHalf commits it
// (it is then appended to its topic) or rolls it back. A half nobody ends
// is resolved by asking a live producer of its producer group (a
// TransactionChecker, txncheck.go). In a cluster every transaction request
// is answered by the transaction coordinator only (the leader of __txn),
// which the client remembers apart from the groups coordinator (c.txn).

// HalfOptions say how the broker resolves a half message that nobody
// commits or rolls back. Zero fields take the broker's defaults.
type HalfOptions struct {
	// ProducerGroup (required) names the producers that can answer for
	// the half: the broker asks one of those with a TransactionChecker
	// registered for the group.
	ProducerGroup string
	// CheckInterval is how long after the half was stored the broker first
	// asks for its outcome; later checks back off (doubling, at most 8x).
	// Rounded up to a millisecond. 0: the broker default (6 s).
	CheckInterval time.Duration
	// MaxChecks is how many times the broker asks before it gives up on
	// the half. 0: the broker default (15).
	MaxChecks int
	// KeepWhenExhausted keeps a half whose checks ran out pending, without
	// further checks, until an operator ends it (`herald txn commit|rollback
	// ID`). By default the broker rolls it back.
	KeepWhenExhausted bool
}

// Validate reports every problem of o at once.
func (o HalfOptions) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.ProducerGroup == "" {
		bad("herald: half: ProducerGroup is required")
	}
	if o.CheckInterval < 0 || o.CheckInterval/time.Millisecond >= math.MaxUint32 {
		bad("herald: half: CheckInterval %s out of range", o.CheckInterval)
	}
	if o.MaxChecks < 0 || int64(o.MaxChecks) > math.MaxUint32 {
		bad("herald: half: MaxChecks %d out of range", o.MaxChecks)
	}
	return errors.Join(errs...)
}

func (o HalfOptions) wire() *heraldpb.HalfOptions {
	w := &heraldpb.HalfOptions{
		ProducerGroup:   o.ProducerGroup,
		CheckIntervalMs: uint32((o.CheckInterval + time.Millisecond - 1) / time.Millisecond),
		MaxChecks:       uint32(o.MaxChecks),
	}
	if o.KeepWhenExhausted {
		w.OnExhausted = heraldpb.HalfExhaustedPolicy_HALF_EXHAUSTED_KEEP
	}
	return w
}

// Half is a half message the broker stored: pending until it is committed
// or rolled back, by Commit, Rollback, EndHalf with its ID, a check-back,
// or when its checks run out.
type Half struct {
	ID            string
	ProducerGroup string
	Topic         string
	// Partition is the one the half goes to when committed.
	Partition int32

	c *Client
}

// Commit makes the half visible: see EndHalf.
func (h *Half) Commit(ctx context.Context) (HalfEnd, error) {
	return h.c.endHalf(ctx, &heraldpb.EndHalfRequest{Id: h.ID, Action: HalfCommit, ProducerGroup: h.ProducerGroup})
}

// Rollback discards the half: see EndHalf.
func (h *Half) Rollback(ctx context.Context) error {
	_, err := h.c.endHalf(ctx, &heraldpb.EndHalfRequest{Id: h.ID, Action: HalfRollback, ProducerGroup: h.ProducerGroup})
	return err
}

// HalfEnd is the broker's answer to ending a half message.
type HalfEnd struct {
	Topic     string
	Partition int32
	// Offset of the half's first record once committed and appended; -1
	// when rolled back or waiting for its delivery time.
	Offset int64
	// DeliverAt: committed with a delivery time (Message.Delay or
	// DeliverAt), when it will be appended. Zero otherwise.
	DeliverAt time.Time
	// AlreadyEnded: the half had been ended the same way before (a retry,
	// a check-back, an operator); nothing changed.
	AlreadyEnded bool
}

// SendHalf stores m as a half message of opt.ProducerGroup: no consumer
// sees it until it is committed (Half.Commit, EndHalf), and a rolled back
// half is discarded. m.Delay or DeliverAt delay a committed half further,
// as they do a plain message. A keyed message goes to
// PartitionForKey(Key, partitions), one without a key to the partition
// the broker picks; Message.Partition is ignored.
//
// SendHalf retries only refusals that surely stored nothing
// (NOT_COORDINATOR, which it follows to the transaction coordinator,
// THROTTLED, NOT_READY, TOO_MANY_IN_FLIGHT), for as long as ctx lasts. A
// half sent again is a second half, so after a failure that may have
// stored it (a request timeout, a lost connection, ctx ending while
// waiting for the answer) SendHalf returns the error marked
// ErrOutcomeUnknown (IsOutcomeUnknown): a half stored anyway is resolved
// by the check-back, so the group's TransactionChecker must be able to
// answer for a half whose ID it never saw, from its messages.
func (c *Client) SendHalf(ctx context.Context, m *Message, opt HalfOptions) (*Half, error) {
	if m == nil || m.Topic == "" {
		return nil, errors.New("herald: message without topic")
	}
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	at, delay, err := deliveryTime(m)
	if err != nil {
		return nil, err
	}
	records, err := encodeRecord(nil, m)
	if err != nil {
		return nil, err
	}
	req := &heraldpb.ProduceRequest{Topic: m.Topic, Records: records, DeliverAtMs: at, DelayMs: uint64(delay), Half: opt.wire()}
	if len(m.Key) > 0 {
		n, err := c.Partitions(ctx, m.Topic)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, &Error{Code: heraldpb.ErrorCode_PARTITION_NOT_FOUND, Message: fmt.Sprintf("topic %q has no partitions", m.Topic)}
		}
		part := PartitionForKey(m.Key, uint32(n))
		req.Partition = &part
	}
	if t := c.cfg.requestTimeout; t > 0 {
		req.TimeoutMs = uint32(t / time.Millisecond)
	}
	f, err := c.callTxn(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: req}}, false)
	if err != nil {
		return nil, err
	}
	r := f.GetProduceResponse()
	if r == nil {
		return nil, unexpected(f, "ProduceResponse")
	}
	if r.GetHalfId() == "" {
		// A broker that does not know half messages ignores the field and
		// appends the message like any other.
		return nil, fmt.Errorf("%w: a half message was answered without a half id (partition %d, offset %d): the broker does not support half messages",
			ErrProtocol, r.GetPartition(), r.GetBaseOffset())
	}
	return &Half{ID: r.GetHalfId(), ProducerGroup: opt.ProducerGroup, Topic: m.Topic, Partition: int32(r.GetPartition()), c: c}, nil
}

// EndHalf commits (HalfCommit) or rolls back (HalfRollback) the pending
// half message id. Ending a half again the same way succeeds with
// AlreadyEnded; a half that is not pending (unknown id, ended the other
// way, or forgotten) fails with a TXN_NOT_FOUND *Error
// (IsCode(err, heraldpb.ErrorCode_TXN_NOT_FOUND)). Being idempotent,
// EndHalf is sent again after a lost connection or a request timeout
// (twice at most), and after the refusals SendHalf retries.
func (c *Client) EndHalf(ctx context.Context, id string, action HalfAction) (HalfEnd, error) {
	return c.endHalf(ctx, &heraldpb.EndHalfRequest{Id: id, Action: action})
}

// EndHalfManually is EndHalf by an operator (`herald txn commit|rollback
// ID`): the broker records that the half was ended by hand. It also ends
// a half kept after its checks ran out (HalfOptions.KeepWhenExhausted).
func (c *Client) EndHalfManually(ctx context.Context, id string, action HalfAction) (HalfEnd, error) {
	return c.endHalf(ctx, &heraldpb.EndHalfRequest{Id: id, Action: action, Manual: true})
}

func (c *Client) endHalf(ctx context.Context, req *heraldpb.EndHalfRequest) (HalfEnd, error) {
	if req.Id == "" {
		return HalfEnd{}, errors.New("herald: EndHalf: empty id")
	}
	if req.Action != HalfCommit && req.Action != HalfRollback {
		return HalfEnd{}, fmt.Errorf("herald: EndHalf: action must be HalfCommit or HalfRollback, not %v", req.Action)
	}
	f, err := c.callTxn(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: req}}, true)
	if err != nil {
		return HalfEnd{}, err
	}
	r := f.GetEndHalfResponse()
	if r == nil {
		return HalfEnd{}, unexpected(f, "EndHalfResponse")
	}
	end := HalfEnd{Topic: r.GetTopic(), Partition: int32(r.GetPartition()), Offset: r.GetBaseOffset(), AlreadyEnded: r.GetAlreadyEnded()}
	if ms := r.GetDeliverAtMs(); ms != 0 {
		end.DeliverAt = time.UnixMilli(ms)
	}
	return end, nil
}

// SendInTransaction runs local, a local transaction, between a half
// message and its end (the transactional outbox): it sends m as a half
// (SendHalf; local does not run when that fails), runs local with the
// half, and then
//   - local returns nil: commits the half;
//   - local returns an error wrapping ErrRollback: rolls the half back
//     and returns local's error;
//   - local returns another error, or panics: leaves the half pending,
//     for the check-back to decide, and returns the error (a panic is
//     recovered and returned as an error naming it).
//
// It returns the half whenever it was stored, with an error too when
// ending it failed (the check-back then decides). local must make its
// outcome findable by the group's TransactionChecker: for example store
// h.ID, or a key the message carries, in the same local transaction.
func (c *Client) SendInTransaction(ctx context.Context, m *Message, opt HalfOptions, local func(ctx context.Context, h *Half) error) (*Half, error) {
	if local == nil {
		return nil, errors.New("herald: SendInTransaction: nil local transaction")
	}
	h, err := c.SendHalf(ctx, m, opt)
	if err != nil {
		return nil, err
	}
	if err := runLocal(ctx, h, local); err != nil {
		if !errors.Is(err, ErrRollback) {
			return h, err
		}
		if rerr := h.Rollback(ctx); rerr != nil {
			return h, fmt.Errorf("%w; rolling back half %s (the check-back decides): %w", err, h.ID, rerr)
		}
		return h, err
	}
	if _, err := h.Commit(ctx); err != nil {
		return h, fmt.Errorf("herald: committing half %s (the check-back decides): %w", h.ID, err)
	}
	return h, nil
}

// runLocal runs local, turning a panic into an error.
func runLocal(ctx context.Context, h *Half, local func(context.Context, *Half) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("herald: local transaction of half %s panicked: %v", h.ID, p)
		}
	}()
	return local(ctx, h)
}

// ListTxn returns up to limit (0: the broker's default) pending half
// messages of producer group (empty: every group), oldest first, and how
// many are pending in all.
func (c *Client) ListTxn(ctx context.Context, group string, limit int) ([]*heraldpb.HalfInfo, int, error) {
	r, err := c.listTxn(ctx, &heraldpb.ListTxnRequest{ProducerGroup: group, Limit: uint32(min(int64(max(limit, 0)), math.MaxUint32))})
	if err != nil {
		return nil, 0, err
	}
	return r.GetHalves(), int(r.GetTotal()), nil
}

// DescribeTxn returns the pending half message id; one that is not
// pending fails with a TXN_NOT_FOUND *Error.
func (c *Client) DescribeTxn(ctx context.Context, id string) (*heraldpb.HalfInfo, error) {
	if id == "" {
		return nil, errors.New("herald: DescribeTxn: empty id")
	}
	r, err := c.listTxn(ctx, &heraldpb.ListTxnRequest{Id: id})
	if err != nil {
		return nil, err
	}
	for _, h := range r.GetHalves() {
		if h.GetId() == id {
			return h, nil
		}
	}
	return nil, &Error{Code: heraldpb.ErrorCode_TXN_NOT_FOUND, Message: fmt.Sprintf("half message %s is not pending", id)}
}

func (c *Client) listTxn(ctx context.Context, req *heraldpb.ListTxnRequest) (*heraldpb.ListTxnResponse, error) {
	f, err := c.callTxn(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_ListTxn{ListTxn: req}}, true)
	if err != nil {
		return nil, err
	}
	r := f.GetListTxnResponse()
	if r == nil {
		return nil, unexpected(f, "ListTxnResponse")
	}
	return r, nil
}

// txnResends bounds how many times callTxn sends an idempotent request
// again after its connection died or it timed out.
const txnResends = 2

// callTxn sends req to the transaction coordinator and waits for the
// answer, within the request timeout per attempt. It follows
// NOT_COORDINATOR (see follow), and sends req again, after the broker's
// retry-after or a pause growing to a second, when refused with THROTTLED,
// NOT_READY or TOO_MANY_IN_FLIGHT (nothing done), for as long as ctx
// lasts. With resend (req is idempotent), a lost connection or a request
// timeout is followed by txnResends more attempts at most. The final error
// of an attempt that was sent and got no answer (lost, timed out, cut
// short by ctx), so may have taken effect, is marked ErrOutcomeUnknown.
func (c *Client) callTxn(ctx context.Context, req *heraldpb.Frame, resend bool) (*heraldpb.Frame, error) {
	return c.callTxnTurn(ctx, req, resend, nil, nil)
}

// callTxnTurn is callTxn whose first attempt waits for turn to close
// (nil: it does not wait) before it is queued on its connection, and
// closes queued (if not nil) once it is, or once it failed before that:
// requests made in turn reach the coordinator in order (its retries need
// not).
func (c *Client) callTxnTurn(ctx context.Context, req *heraldpb.Frame, resend bool, turn <-chan struct{}, queued chan struct{}) (*heraldpb.Frame, error) {
	var once sync.Once
	mark := func() {
		if queued != nil {
			once.Do(func() { close(queued) })
		}
	}
	defer mark()
	if turn != nil {
		select {
		case <-turn:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return c.callTxnEnc(ctx, func(dst []byte, id uint64) ([]byte, error) {
		req.Id = id
		defer mark() // (enc runs as the request is queued)
		return heraldpb.AppendFrame(dst, req)
	}, resend)
}

// callTxnEnc is callTxn with the request appended by enc (each attempt
// encodes it again, with its own frame id).
func (c *Client) callTxnEnc(ctx context.Context, enc func(dst []byte, id uint64) ([]byte, error), resend bool) (*heraldpb.Frame, error) {
	pause, resends := 10*time.Millisecond, 0
	for hop := 0; ; hop++ {
		cn, err := c.coordConn(ctx, &c.txn)
		if err != nil {
			return nil, err
		}
		f, sent, err := c.callOnce(ctx, cn, enc)
		var he *Error
		answered := errors.As(err, &he) // refused: the broker says what it did
		lost := errors.Is(err, ErrConnectionLost) || errors.Is(err, ErrRequestTimeout)
		switch {
		case err == nil:
			return f, nil
		case c.follow(ctx, &c.txn, err, hop):
			continue
		case waitOut(err) || IsCode(err, heraldpb.ErrorCode_TOO_MANY_IN_FLIGHT):
			if sleepCtx(ctx, max(pause, retryAfter(err))) != nil {
				return nil, err
			}
			pause = min(2*pause, time.Second)
			continue
		case lost && (resend || !sent) && resends < txnResends && ctx.Err() == nil:
			resends++
			continue
		case sent && !answered:
			return nil, fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
		}
		return nil, err
	}
}

// callOnce sends req on cn and waits for the answer within the request
// timeout. sent reports whether req was queued on the connection, so may
// have reached the broker.
func (c *Client) callOnce(ctx context.Context, cn *conn, enc func(dst []byte, id uint64) ([]byte, error)) (_ *heraldpb.Frame, sent bool, _ error) {
	ch, err := cn.send(ctx, enc, nil)
	if err != nil {
		return nil, false, err
	}
	f, err := cn.await(ctx, ch, c.cfg.requestTimeout)
	return f, true, err
}
