package client

import (
	"context"
	"errors"
	"fmt"
	"google.golang.org/protobuf/proto"
	"strings"
	"sync"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// HalfCheck is a check-back: the broker asks a producer of a half
// message's group whether to commit it.
type HalfCheck struct {
	ID            string
	ProducerGroup string
	Topic         string
	Partition     int32
	// Messages are the half's messages as they were sent (Offset -1; one
	// sent without a Timestamp carries Created).
	Messages []*Message
	// Check is this check's number, from 1, of at most MaxChecks.
	Check, MaxChecks int
	// Created is when the broker stored the half.
	Created time.Time
}

// TransactionChecker answers a check-back: HalfCommit or HalfRollback once
// the local transaction's outcome is known, HalfUnknown to be asked again
// later. ctx ends when the checker is stopped or the client closed.
type TransactionChecker func(ctx context.Context, hc *HalfCheck) HalfAction

const (
	// maxChecksRunning bounds the checks a checker runs at once; the
	// checks pushed meanwhile wait in a queue.
	maxChecksRunning = 16
	// maxChecksQueued bounds the checks running and waiting; a check
	// pushed beyond that is not answered (the broker asks again later).
	maxChecksQueued = 4096
	// defaultTxnHeartbeat is how often a producer registers again when
	// the broker does not say.
	defaultTxnHeartbeat = 2 * time.Second
)

// txnChecker is one producer group's registration and its check-backs.
// run registers on the transaction coordinator's connection every
// heartbeat, at once when that connection dies, and on the node a
// NOT_COORDINATOR names; conn.push hands it the group's HalfChecks pushed
// on any connection it registered on (check).
type txnChecker struct {
	c     *Client
	group string
	fn    TransactionChecker

	ctx    context.Context // ended by stop and by the client's Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // check goroutines
	done   chan struct{}  // closed when run returns
	once   sync.Once

	mu      sync.Mutex
	stopped bool
	cn      *conn                 // where the last registration succeeded
	running map[string]bool       // ids of the checks running or queued
	queue   []*heraldpb.HalfCheck // checks waiting for a worker
	workers int                   // goroutines answering checks
}

// RegisterTransactionChecker registers this client as a live producer of
// group: the broker sends it check-backs of the group's half messages
// that nobody ended, and fn answers them. It returns once the transaction
// coordinator took the registration (retryable failures are retried with
// backoff until ctx ends; ctx bounds this first registration only).
//
// The registration is repeated every heartbeat the broker asks for (2 s
// by default), at once on a new connection after the old one died, and on
// the new coordinator after it moved. fn runs on its own goroutine for
// each check, at most 16 at once; the checks pushed meanwhile queue (4,096
// at most: a check beyond that is not answered, and the broker asks again
// later); a panic in fn answers HalfUnknown. Its
// answer is sent with EndHalfRequest{from_check: true}.
//
// stop unregisters (best effort), ends the heartbeats, cancels the
// context of the checks running and waits for them to return; their
// answers are then dropped. A client registers one checker per group.
func (c *Client) RegisterTransactionChecker(ctx context.Context, group string, fn TransactionChecker) (stop func(), err error) {
	if group == "" {
		return nil, errors.New("herald: transaction checker: empty producer group")
	}
	if fn == nil {
		return nil, errors.New("herald: transaction checker: nil function")
	}
	k := &txnChecker{c: c, group: group, fn: fn, done: make(chan struct{}), running: map[string]bool{}}
	k.ctx, k.cancel = context.WithCancel(c.ctx)
	c.mu.Lock()
	switch {
	case c.closed:
		err = ErrClosed
	case c.checkers[group] != nil:
		err = fmt.Errorf("herald: a transaction checker of producer group %q is registered already", group)
	default:
		if c.checkers == nil {
			c.checkers = make(map[string]*txnChecker)
		}
		c.checkers[group] = k
	}
	c.mu.Unlock()
	if err != nil {
		k.cancel()
		return nil, err
	}
	for backoff := 10 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		every, err := k.register(ctx)
		if err == nil {
			go k.run(every)
			return k.stop, nil
		}
		if !IsRetryable(err) || ctx.Err() != nil || sleepCtx(ctx, max(backoff, retryAfter(err))) != nil {
			close(k.done)
			k.stop()
			return nil, err
		}
	}
}

// register sends RegisterProducer to the transaction coordinator,
// following NOT_COORDINATOR, and returns the heartbeat it asks for. The
// connection takes the group's check-backs before the request leaves: the
// coordinator may push pending ones right after its answer.
func (k *txnChecker) register(ctx context.Context) (time.Duration, error) {
	req := &heraldpb.Frame{Body: &heraldpb.Frame_RegisterProducer{RegisterProducer: &heraldpb.RegisterProducerRequest{ProducerGroup: k.group}}}
	for hop := 0; ; hop++ {
		cn, err := k.c.coordConn(ctx, &k.c.txn)
		if err != nil {
			return 0, err
		}
		if !cn.addChecker(k) {
			err = cn.deadErr()
		} else if f, cerr := k.c.call(ctx, cn, req, 0); cerr != nil {
			err = cerr
		} else if f.GetRegisterProducerResponse() == nil {
			err = unexpected(f, "RegisterProducerResponse")
		} else {
			k.use(cn)
			if ms := f.GetRegisterProducerResponse().GetHeartbeatMs(); ms > 0 {
				return time.Duration(ms) * time.Millisecond, nil
			}
			return defaultTxnHeartbeat, nil
		}
		k.mu.Lock()
		current := k.cn == cn
		k.mu.Unlock()
		if !current {
			cn.removeChecker(k)
		}
		if !k.c.follow(ctx, &k.c.txn, err, hop) {
			return 0, err
		}
	}
}

// use makes cn the connection registered on, leaving the previous one.
func (k *txnChecker) use(cn *conn) {
	k.mu.Lock()
	old := k.cn
	k.cn = cn
	k.mu.Unlock()
	if old != nil && old != cn {
		old.removeChecker(k)
	}
}

// run registers again every heartbeat, at once when the connection
// registered on dies, and with backoff after a failure, until stop.
func (k *txnChecker) run(every time.Duration) {
	defer close(k.done)
	wait, backoff, ok := every, 10*time.Millisecond, true
	for {
		var dead <-chan struct{}
		k.mu.Lock()
		if ok && k.cn != nil {
			dead = k.cn.dead
		}
		k.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-dead:
		case <-k.ctx.Done():
		}
		t.Stop()
		if k.ctx.Err() != nil {
			return
		}
		every, err := k.register(k.ctx)
		if err != nil {
			if k.ctx.Err() != nil {
				return
			}
			k.c.cfg.logger.Warn("herald: registering the transaction checker", "group", k.group, "err", err)
			wait, backoff, ok = max(backoff, retryAfter(err)), min(2*backoff, time.Second), false
			continue
		}
		wait, backoff, ok = every, 10*time.Millisecond, true
	}
}

// stop ends the checker: see RegisterTransactionChecker.
func (k *txnChecker) stop() {
	k.once.Do(func() {
		k.mu.Lock()
		k.stopped = true
		k.mu.Unlock()
		k.cancel()
		<-k.done
		k.wg.Wait()
		k.mu.Lock()
		cn := k.cn
		k.mu.Unlock()
		if cn != nil && cn.alive() {
			cn.removeChecker(k)
			_, _ = k.c.call(k.c.ctx, cn, &heraldpb.Frame{Body: &heraldpb.Frame_RegisterProducer{RegisterProducer: &heraldpb.RegisterProducerRequest{
				ProducerGroup: k.group, Unregister: true,
			}}}, 0)
		}
		k.c.mu.Lock()
		if k.c.checkers[k.group] == k {
			delete(k.c.checkers, k.group)
		}
		k.c.mu.Unlock()
	})
}

// check hands hc to a worker goroutine (at most maxChecksRunning run; the
// rest queue), unless the checker is stopped, hc's half is being checked
// or queued already, or maxChecksQueued are. It runs on a connection's
// reader goroutine: it never blocks.
func (k *txnChecker) check(hc *heraldpb.HalfCheck) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped || k.running[hc.GetId()] {
		return
	}
	if len(k.running) >= maxChecksQueued {
		k.c.cfg.logger.Debug("herald: half check not answered: checks queued at the limit", "group", k.group, "id", hc.GetId(), "limit", maxChecksQueued)
		return
	}
	k.running[hc.GetId()] = true
	if k.workers < maxChecksRunning {
		k.workers++
		k.wg.Add(1)
		go k.work(hc)
		return
	}
	k.queue = append(k.queue, hc)
}

// work answers hc, then the queued checks, until none is left.
func (k *txnChecker) work(hc *heraldpb.HalfCheck) {
	defer k.wg.Done()
	for hc != nil {
		k.answer(hc)
		k.mu.Lock()
		delete(k.running, hc.GetId())
		hc = nil
		if len(k.queue) > 0 && !k.stopped {
			hc = k.queue[0]
			k.queue[0] = nil
			k.queue = k.queue[1:]
		} else {
			k.workers--
		}
		k.mu.Unlock()
	}
}

// answer runs the checker on hc and sends its answer to the coordinator.
func (k *txnChecker) answer(hc *heraldpb.HalfCheck) {
	action := HalfUnknown
	if m, err := halfCheckFromWire(hc); err != nil {
		k.c.cfg.logger.Warn("herald: half check with undecodable records; answering unknown", "group", k.group, "id", hc.GetId(), "err", err)
	} else {
		action = k.decide(m)
	}
	if k.ctx.Err() != nil {
		return
	}
	req := &heraldpb.Frame{Body: &heraldpb.Frame_EndHalf{EndHalf: &heraldpb.EndHalfRequest{Id: hc.GetId(), Action: action, FromCheck: true, ProducerGroup: k.group}}}
	if _, err := k.c.callTxn(k.ctx, req, true); err != nil && k.ctx.Err() == nil && !IsCode(err, heraldpb.ErrorCode_TXN_NOT_FOUND) {
		k.c.cfg.logger.Warn("herald: answering a half check", "group", k.group, "id", hc.GetId(), "action", action, "err", err)
	}
}

// decide runs the checker; a panic or an action it does not know is
// HalfUnknown.
func (k *txnChecker) decide(m *HalfCheck) (action HalfAction) {
	defer func() {
		if p := recover(); p != nil {
			k.c.cfg.logger.Warn("herald: transaction checker panicked; answering unknown", "group", k.group, "id", m.ID, "panic", p)
			action = HalfUnknown
		}
	}()
	switch a := k.fn(k.ctx, m); a {
	case HalfCommit, HalfRollback:
		return a
	}
	return HalfUnknown
}

// halfCheckFromWire decodes a HalfCheck push.
func halfCheckFromWire(hc *heraldpb.HalfCheck) (*HalfCheck, error) {
	// A push names the broker's topic and group, which in a vhost carry
	// its prefix (vhost~name): the checker sees its vhost's names.
	hc = proto.Clone(hc).(*heraldpb.HalfCheck)
	for _, p := range []*string{&hc.Topic, &hc.ProducerGroup} {
		if _, local, ok := strings.Cut(*p, "~"); ok {
			*p = local
		}
	}
	part := int32(hc.GetPartition())
	msgs, err := decodeBatch(hc.GetTopic(), part, &heraldpb.StoredBatch{Records: hc.GetRecords(), AppendTimeMs: hc.GetCreatedMs()}, 0, nil)
	if err != nil {
		return nil, err
	}
	for _, m := range msgs {
		m.Offset = -1
	}
	return &HalfCheck{
		ID: hc.GetId(), ProducerGroup: hc.GetProducerGroup(), Topic: hc.GetTopic(), Partition: part, Messages: msgs,
		Check: int(hc.GetCheck()), MaxChecks: int(hc.GetMaxChecks()), Created: time.UnixMilli(hc.GetCreatedMs()),
	}, nil
}
