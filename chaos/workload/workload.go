// Package workload runs a chaos scenario's clients against a cluster and
// records every operation they invoke, and how it ended, in the run's
// history: producers of unique numbered records, a pull reader, push
// consumer groups acking (and failing a share into the dead-letter topic),
// delayed messages with their due times, request-reply calls, half
// (transactional) messages with their check-backs, and the groups'
// progress as the broker reports it.
package workload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/heraldmq/herald/chaos/history"
	"github.com/heraldmq/herald/chaos/scenario"
	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Config is what a workload runs against and records to.
type Config struct {
	Addrs    []string // client addresses of the cluster's nodes
	Topic    string
	Parts    int
	Spec     scenario.Workload
	Recorder *history.Recorder
	// Now is the run's clock (time since its start), the one the Recorder
	// stamps with; due times of delayed messages are on it.
	Now  func() time.Duration
	Seed uint64
	Log  *slog.Logger
	// OpTimeout bounds one produce, request or fetch (default 10s).
	OpTimeout time.Duration
	// ClientLog, if set, is the clients' own log (client.WithLogger),
	// each client's lines tagged with its id.
	ClientLog *slog.Logger
}

// Workload is a running workload.
type Workload struct {
	cfg     Config
	ctx     context.Context
	stopGen context.CancelFunc // stops the generators (producers, requesters)
	stopAll context.CancelFunc // stops the consumers too
	gen     sync.WaitGroup
	cons    sync.WaitGroup
	mu      sync.Mutex
	clients []*client.Client
	subs    []*client.Subscription
	stops   []func() // the half-message checker's
	errs    []error
	dlqRead map[string]dlqProgress // group -> its dead-letter reader's last fetch
}

// dlqProgress is a dead-letter reader's last completed fetch: when it was
// sent, and whether it reached the topic's high watermark (or found no
// topic, so no dead letter yet).
type dlqProgress struct {
	sent     time.Time
	caughtUp bool
}

// Start connects the clients and starts every worker of the spec.
func Start(ctx context.Context, cfg Config) (*Workload, error) {
	if cfg.OpTimeout == 0 {
		cfg.OpTimeout = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	all, stopAll := context.WithCancel(context.Background())
	genCtx, stopGen := context.WithCancel(all)
	w := &Workload{cfg: cfg, ctx: all, stopAll: stopAll, stopGen: stopGen, dlqRead: map[string]dlqProgress{}}
	s := cfg.Spec
	fail := func(err error) (*Workload, error) {
		w.Stop(context.Background())
		return nil, err
	}
	for i := range s.Producers + s.PlainProducers {
		c, err := w.dial(ctx, fmt.Sprintf("producer-%d", i))
		if err != nil {
			return fail(err)
		}
		idem := s.Idempotent && i < s.Producers
		opts := []client.ProducerOpt{client.WithIdempotence(idem), client.WithAcks(acks(s.Acks)), client.WithLinger(time.Millisecond)}
		w.gen.Add(1)
		go w.produce(genCtx, c.NewProducer(opts...), i, idem)
	}
	if d := s.Delayed; d != nil {
		c, err := w.dial(ctx, "delayed-0")
		if err != nil {
			return fail(err)
		}
		w.gen.Add(1)
		go w.produceDelayed(genCtx, c.NewProducer(client.WithIdempotence(s.Idempotent), client.WithAcks(acks(s.Acks))), *d)
	}
	if s.Pull {
		c, err := w.dial(ctx, "reader-0")
		if err != nil {
			return fail(err)
		}
		for p := range cfg.Parts {
			w.cons.Add(1)
			go w.pull(all, c, int32(p))
		}
	}
	for _, g := range s.Groups {
		for m := range g.Members {
			if err := w.subscribe(ctx, g, m); err != nil {
				return fail(err)
			}
		}
		if g.MaxDeliveries > 0 {
			c, err := w.dial(ctx, "dlq-"+g.Name)
			if err != nil {
				return fail(err)
			}
			w.cons.Add(1)
			go w.readDLQ(all, c, g)
		}
		c, err := w.dial(ctx, "progress-"+g.Name)
		if err != nil {
			return fail(err)
		}
		w.cons.Add(1)
		go w.watchProgress(all, c, g)
	}
	if r := s.Requests; r != nil {
		if err := w.startRequests(ctx, genCtx, *r); err != nil {
			return fail(err)
		}
	}
	if h := s.Halves; h != nil {
		if err := w.startHalves(ctx, genCtx, *h); err != nil {
			return fail(err)
		}
	}
	if tx := s.Txns; tx != nil {
		if err := w.startTxns(ctx, genCtx, *tx); err != nil {
			return fail(err)
		}
	}
	return w, nil
}

// StopGenerators stops sending new records and requests (and waits for
// the ones in flight); consumers go on.
func (w *Workload) StopGenerators() {
	w.stopGen()
	w.gen.Wait()
}

// Stop stops everything: generators, then the consumers, whose last acks
// are flushed within ctx. It returns the errors the workers met that are
// not operations' outcomes (those are in the history).
func (w *Workload) Stop(ctx context.Context) []error {
	w.StopGenerators()
	w.mu.Lock()
	subs := append([]*client.Subscription(nil), w.subs...)
	stops := w.stops
	w.stops = nil
	w.mu.Unlock()
	for _, s := range subs {
		_ = s.Close(ctx)
	}
	for _, stop := range stops {
		stop()
	}
	w.stopAll()
	w.cons.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.clients {
		_ = c.Close()
	}
	w.clients = nil
	return w.errs
}

func (w *Workload) dial(ctx context.Context, id string) (*client.Client, error) {
	opts := []client.Option{client.WithClientID("chaos-" + id), client.WithRequestTimeout(w.cfg.OpTimeout)}
	if w.cfg.ClientLog != nil {
		opts = append(opts, client.WithLogger(w.cfg.ClientLog.With("client", id)))
	}
	c, err := client.Dial(ctx, strings.Join(w.cfg.Addrs, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("workload: %s: %w", id, err)
	}
	w.mu.Lock()
	w.clients = append(w.clients, c)
	w.mu.Unlock()
	return c, nil
}

func (w *Workload) record(op history.Op) {
	if _, err := w.cfg.Recorder.Record(op); err != nil {
		w.noteErr(fmt.Errorf("recording %s %s of %s: %w", op.Type, op.F, op.Process, err))
	}
}

func (w *Workload) noteErr(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.errs) < 100 {
		w.errs = append(w.errs, err)
	}
}

func acks(s string) heraldpb.Acks {
	if s == "leader" {
		return client.AcksLeader
	}
	return client.AcksAll
}

// outcome is the history type of a failed operation: info when it may have
// happened (the client says so, or the caller gave up waiting), fail when
// it certainly did not.
func outcome(err error) history.Type {
	if client.IsOutcomeUnknown(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return history.Info
	}
	return history.Fail
}

// ticker paces a generator at rate per second; rate <= 0 means 1.
func ticker(rate int) *time.Ticker {
	return time.NewTicker(time.Second / time.Duration(max(rate, 1)))
}

func (w *Workload) produce(ctx context.Context, p *client.Producer, i int, idempotent bool) {
	defer w.gen.Done()
	defer p.Close(context.Background())
	proc := fmt.Sprintf("producer-%d", i)
	t := ticker(w.cfg.Spec.Rate)
	defer t.Stop()
	for seq := int64(0); ; seq++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		op := history.Op{Process: proc, F: history.Produce, Topic: w.cfg.Topic, Value: fmt.Sprintf("p%d-%d", i, seq), Seq: seq, Idempotent: idempotent}
		if k := w.cfg.Spec.Keys; k > 0 {
			op.Key = fmt.Sprintf("k%d", seq%int64(k))
		}
		w.send(p, op, 0)
	}
}

// send produces op's record (with delay, if any) and records the invoke
// and its outcome. It waits for the outcome however the run goes (a
// producer's Close would otherwise fail what is in flight), bounded by
// OpTimeout.
func (w *Workload) send(p *client.Producer, op history.Op, delay time.Duration) {
	op.Type = history.Invoke
	m := &client.Message{Topic: op.Topic, Value: []byte(op.Value), Delay: delay}
	if op.Key != "" {
		m.Key = []byte(op.Key)
	}
	w.record(op)
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.OpTimeout)
	r, err := p.Send(ctx, m)
	cancel()
	if err != nil {
		op.Type, op.Error = outcome(err), err.Error()
		w.record(op)
		return
	}
	op.Type, op.Partition, op.Offset = history.OK, r.Partition, r.Offset
	w.record(op)
}

func (w *Workload) produceDelayed(ctx context.Context, p *client.Producer, d scenario.Delayed) {
	defer w.gen.Done()
	defer p.Close(context.Background())
	t := ticker(d.Rate)
	defer t.Stop()
	for seq := int64(0); ; seq++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// The due time is taken before the send: the broker's own clock
		// starts the delay when it receives the message, later still, so
		// a delivery before Due is early by any account.
		due := w.cfg.Now() + d.Delay.D()
		op := history.Op{Process: "delayed-0", F: history.Produce, Topic: w.cfg.Topic, Value: fmt.Sprintf("d-%d", seq), Seq: seq,
			Idempotent: w.cfg.Spec.Idempotent, Due: int64(due)}
		w.send(p, op, d.Delay.D())
	}
}

// pull reads partition p from its start for as long as the run goes,
// recording each record read.
func (w *Workload) pull(ctx context.Context, c *client.Client, p int32) {
	defer w.cons.Done()
	next := int64(0)
	for ctx.Err() == nil {
		fctx, cancel := context.WithTimeout(ctx, w.cfg.OpTimeout)
		res, err := c.Fetch(fctx, w.cfg.Topic, p, next, 1<<20, 500*time.Millisecond)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				pause(ctx, 100*time.Millisecond)
			}
			continue
		}
		for _, m := range res.Messages {
			w.record(history.Op{Process: "reader-0", Type: history.OK, F: history.Consume, Topic: w.cfg.Topic, Partition: p,
				Offset: m.Offset, Key: string(m.Key), Value: string(m.Value)})
			next = m.Offset + 1
		}
	}
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

var modes = map[string]client.SubscriptionMode{
	"clustering": client.Clustering, "shared": client.Shared, "key-shared": client.KeyShared, "broadcast": client.Broadcast,
}

// subscribe starts member m of group g: its handler records each delivery
// and acks it (or, for a Fail share, fails it), and a flusher records the
// acks as done once the broker confirmed them durable.
func (w *Workload) subscribe(ctx context.Context, g scenario.Group, m int) error {
	proc := fmt.Sprintf("consumer-%s-%d", g.Name, m)
	c, err := w.dial(ctx, proc)
	if err != nil {
		return err
	}
	r := rand.New(rand.NewPCG(w.cfg.Seed, uint64(m)+uint64(len(g.Name))<<32)) //nolint:gosec // reproducible fail choices
	var rmu sync.Mutex
	var pending []history.Op // acks and nacks sent, not yet confirmed
	var pmu sync.Mutex
	opts := client.SubscribeOptions{Group: g.Name, Topic: w.cfg.Topic, Mode: modes[g.Mode], From: client.Earliest(), Name: proc}
	if g.MaxDeliveries > 0 {
		opts.RetryPolicy = fmt.Sprintf("exponential initial=100ms factor=2 cap=1s max-deliveries=%d", g.MaxDeliveries)
	}
	sub, err := c.Subscribe(ctx, opts, func(_ context.Context, d *client.Delivered) {
		op := history.Op{Process: proc, Type: history.OK, F: history.Consume, Topic: d.Topic, Partition: d.Partition, Offset: d.Offset,
			Key: string(d.Key), Value: string(d.Value), Group: g.Name, Mode: g.Mode, Consumer: proc, Attempt: d.DeliveryCount,
			MaxDeliveries: g.MaxDeliveries}
		w.record(op)
		rmu.Lock()
		failIt := g.Fail > 0 && r.Float64() < g.Fail
		rmu.Unlock()
		settle := history.Op{Process: proc, Type: history.Invoke, F: history.Ack, Topic: d.Topic, Partition: d.Partition, Offset: d.Offset,
			Value: string(d.Value), Group: g.Name, Mode: g.Mode, Consumer: proc, MaxDeliveries: g.MaxDeliveries}
		if failIt {
			settle.F = history.Nack
		}
		w.record(settle)
		// Queue the ack before the flusher can see the op: a Flush covers
		// only the acks queued before its call.
		if failIt {
			d.Fail("chaos: failing share")
		} else {
			d.Ack()
		}
		pmu.Lock()
		pending = append(pending, settle)
		pmu.Unlock()
	})
	if err != nil {
		return fmt.Errorf("workload: %s: %w", proc, err)
	}
	w.mu.Lock()
	w.subs = append(w.subs, sub)
	w.mu.Unlock()
	w.cons.Add(1)
	go func() {
		defer w.cons.Done()
		for {
			stopped := w.ctx.Err() != nil
			pmu.Lock()
			batch := pending
			pending = nil
			pmu.Unlock()
			if len(batch) > 0 {
				fctx, cancel := context.WithTimeout(context.Background(), w.cfg.OpTimeout)
				err := sub.Flush(fctx)
				cancel()
				for _, op := range batch {
					op.Type = history.OK
					if err != nil {
						op.Type, op.Error = history.Info, err.Error()
					}
					w.record(op)
				}
			}
			if stopped {
				return
			}
			pause(w.ctx, 200*time.Millisecond)
		}
	}()
	return nil
}

// readDLQ reads group g's dead-letter topic from its start, recording
// each dead letter for the group, and notes how far each fetch got
// (DLQCaughtUp).
func (w *Workload) readDLQ(ctx context.Context, c *client.Client, g scenario.Group) {
	defer w.cons.Done()
	topic := g.Name + ".dlq"
	next := int64(0)
	for ctx.Err() == nil {
		sent := time.Now()
		fctx, cancel := context.WithTimeout(ctx, w.cfg.OpTimeout)
		res, err := c.Fetch(fctx, topic, 0, next, 1<<20, 500*time.Millisecond)
		cancel()
		if err != nil { // not created before the first dead letter
			w.noteDLQ(g.Name, sent, client.IsCode(err, heraldpb.ErrorCode_TOPIC_NOT_FOUND))
			pause(ctx, 200*time.Millisecond)
			continue
		}
		for _, m := range res.Messages {
			w.record(history.Op{Process: "dlq-" + g.Name, Type: history.OK, F: history.Consume, Topic: topic, Offset: m.Offset,
				Key: string(m.Key), Value: string(m.Value), Group: g.Name, DLQ: true})
			next = m.Offset + 1
		}
		w.noteDLQ(g.Name, sent, next >= res.HighWatermark)
	}
}

func (w *Workload) noteDLQ(group string, sent time.Time, caughtUp bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.dlqRead[group] = dlqProgress{sent: sent, caughtUp: caughtUp}
}

// DLQCaughtUp reports whether every dead-letter reader has read its topic
// to the end as it stood at since: its last fetch was sent after since
// and reached the high watermark it reported. A run settles only then, so
// that a dead letter appended just before the groups were done is in the
// history.
func (w *Workload) DLQCaughtUp(since time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, g := range w.cfg.Spec.Groups {
		if g.MaxDeliveries == 0 {
			continue
		}
		p, ok := w.dlqRead[g.Name]
		if !ok || !p.caughtUp || p.sent.Before(since) {
			return false
		}
	}
	return true
}

// watchProgress records group g's progress per partition (its ack floor,
// the next offset it reads) as the broker reports it, each time it moves.
func (w *Workload) watchProgress(ctx context.Context, c *client.Client, g scenario.Group) {
	defer w.cons.Done()
	last := map[string]int64{}
	for ctx.Err() == nil {
		dctx, cancel := context.WithTimeout(ctx, w.cfg.OpTimeout)
		info, err := c.DescribeGroup(dctx, g.Name)
		cancel()
		if err == nil {
			for _, p := range info.GetPartitions() {
				k := fmt.Sprintf("%d/%s", p.GetPartition(), p.GetSubscriber())
				if v, ok := last[k]; ok && v == p.GetAckFloor() {
					continue
				}
				last[k] = p.GetAckFloor()
				w.record(history.Op{Process: "progress-" + g.Name, Type: history.OK, F: history.Commit, Group: g.Name + subscriberSuffix(p.GetSubscriber()),
					Topic: w.cfg.Topic, Partition: int32(p.GetPartition()), Offset: p.GetAckFloor()})
			}
		}
		pause(ctx, 500*time.Millisecond)
	}
}

// subscriberSuffix keys a broadcast member's own progress apart.
func subscriberSuffix(s string) string {
	if s == "" {
		return ""
	}
	return "/" + s
}

// startRequests starts one responder group of two members and a
// requester calling at r.Rate per second.
func (w *Workload) startRequests(ctx, genCtx context.Context, r scenario.Requests) error {
	topic := w.cfg.Topic + "-rpc"
	c0, err := w.dial(ctx, "rpc-admin")
	if err != nil {
		return err
	}
	if _, err := c0.CreateTopic(ctx, topic, &heraldpb.TopicConfig{Partitions: 1}); err != nil && !client.IsCode(err, heraldpb.ErrorCode_TOPIC_ALREADY_EXISTS) {
		return fmt.Errorf("workload: creating %s: %w", topic, err)
	}
	for m := range 2 {
		proc := fmt.Sprintf("responder-%d", m)
		c, err := w.dial(ctx, proc)
		if err != nil {
			return err
		}
		sub, err := c.Respond(ctx, topic, "chaos-responders", func(_ context.Context, req *client.Delivered) (*client.Message, error) {
			id := string(req.Value)
			w.record(history.Op{Process: proc, Type: history.Invoke, F: history.Reply, RequestID: id})
			return &client.Message{Value: []byte("re:" + id)}, nil
		})
		if err != nil {
			return fmt.Errorf("workload: %s: %w", proc, err)
		}
		w.mu.Lock()
		w.subs = append(w.subs, sub)
		w.mu.Unlock()
	}
	c, err := w.dial(ctx, "requester-0")
	if err != nil {
		return err
	}
	w.gen.Add(1)
	go func() {
		defer w.gen.Done()
		t := ticker(r.Rate)
		defer t.Stop()
		for seq := 0; ; seq++ {
			select {
			case <-genCtx.Done():
				return
			case <-t.C:
			}
			id := fmt.Sprintf("r-%d", seq)
			w.record(history.Op{Process: "requester-0", Type: history.Invoke, F: history.Request, RequestID: id, ReplyTo: "requester-0"})
			rctx, cancel := context.WithTimeout(context.Background(), w.cfg.OpTimeout)
			rep, err := c.Request(rctx, topic, &client.Message{Value: []byte(id)})
			cancel()
			if err != nil {
				w.record(history.Op{Process: "requester-0", Type: outcome(err), F: history.Request, RequestID: id, Error: err.Error()})
				continue
			}
			got := strings.TrimPrefix(string(rep.Value), "re:")
			w.record(history.Op{Process: "requester-0", Type: history.OK, F: history.Reply, RequestID: got})
			w.record(history.Op{Process: "requester-0", Type: history.OK, F: history.Request, RequestID: id})
		}
	}()
	return nil
}
