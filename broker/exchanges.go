package broker

// Exchanges: RabbitMQ-style routing on top of topics (docs/routing.md).
// The exchanges and their bindings live where topics do: in the
// controller's replicated metadata in a cluster, in DATA/exchanges on a
// single node. Every node compiles them into an exchange.Table and routes
// publishes itself. A publish that reaches one partition is a produce to
// it; one that reaches several is handed to the transaction coordinator,
// which stores it as one decision in __txn and then appends each batch
// (actors/txn/routed.go): all of them get it, or the publisher gets an
// error and none does.

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/topic"
	"github.com/heraldmq/herald/exchange"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"google.golang.org/protobuf/proto"
)

// exchangesFile is a single node's exchanges, a heraldpb.RoutingState.
const exchangesFile = "exchanges"

// publishTimeout is a publish's default timeout (its timeout_ms wins).
const publishTimeout = 30 * time.Second

var mMatchSeconds = promauto.NewHistogram(prometheus.HistogramOpts{
	Name:    "herald_exchange_match_seconds",
	Help:    "Time to route one publish through its exchange (every record, for headers exchanges).",
	Buckets: prometheus.ExponentialBuckets(250e-9, 4, 10),
})

type exchanges struct {
	b         *Broker
	clustered bool
	mu        sync.Mutex        // a single node's file: one change at a time
	md        exchange.Metadata // a single node's (the controller keeps a cluster's)
	table     atomic.Pointer[exchange.Table]
	stats     sync.Map // broker name -> *exchangeStats

	produce topic.Handler // the topic router's produce
	txn     topic.Handler // the transaction coordinator's route
}

// exchangeStats are one exchange's counts on this node since it started,
// in records.
type exchangeStats struct {
	published, routed, unroutable, returned atomic.Uint64
}

func (x *exchanges) statsOf(name string) *exchangeStats {
	if s, ok := x.stats.Load(name); ok {
		return s.(*exchangeStats)
	}
	s, _ := x.stats.LoadOrStore(name, &exchangeStats{})
	return s.(*exchangeStats)
}

// startExchanges loads a single node's exchanges (a cluster's come with
// the controller's metadata, onMetadata).
func (b *Broker) startExchanges(clustered bool) error {
	x := &exchanges{b: b, clustered: clustered, md: exchange.Metadata{}}
	if !clustered {
		st, err := loadRouting(b.fs, b.cfg.DataDir)
		if err != nil {
			return err
		}
		x.md = exchange.FromList(st.Exchanges)
	}
	x.table.Store(exchange.Build(x.md))
	b.exchanges = x
	prometheus.DefaultRegisterer.Unregister(exchangeCollector{}) // a node started again in one process
	_ = prometheus.DefaultRegisterer.Register(exchangeCollector{x})
	return nil
}

func loadRouting(fsys persistence.FS, dir string) (*heraldpb.RoutingState, error) {
	var st heraldpb.RoutingState
	if err := readStateFile(fsys, filepath.Join(dir, exchangesFile), &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// setMetadata makes md the node's exchanges (a cluster's, from the
// controller).
func (x *exchanges) setMetadata(md exchange.Metadata) {
	x.table.Store(exchange.Build(md))
	x.forgetStats(md)
}

// forgetStats drops the counts of exchanges no longer declared.
func (x *exchanges) forgetStats(md exchange.Metadata) {
	x.stats.Range(func(k, _ any) bool {
		if md[k.(string)] == nil {
			x.stats.Delete(k)
		}
		return true
	})
}

// changeLocal applies fn to a copy of a single node's exchanges and, if
// it changed them, stores the copy (atomically, synced) and routes with
// it.
func (x *exchanges) changeLocal(fn func(md exchange.Metadata) (changed bool, err error)) (bool, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	next := x.md.Clone()
	changed, err := fn(next)
	if err != nil || !changed {
		return false, err
	}
	data, merr := proto.Marshal(&heraldpb.RoutingState{Exchanges: next.List()})
	if merr != nil {
		return false, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "encoding exchanges: %v", merr)
	}
	if werr := persistence.WriteFileAtomic(x.b.fs, filepath.Join(x.b.cfg.DataDir, exchangesFile), data, 0o600); werr != nil {
		return false, heraldpb.NewError(heraldpb.ErrorCode_STORAGE_ERROR, "saving exchanges: %v; nothing changed", werr)
	}
	x.md = next
	x.setMetadata(next)
	return true, nil
}

// routes are the exchange requests' handlers.
func (x *exchanges) routes() map[reflect.Type]topic.Handler {
	return map[reflect.Type]topic.Handler{
		reflect.TypeOf(&heraldpb.Frame_DeclareExchange{}): x.declare,
		reflect.TypeOf(&heraldpb.Frame_DeleteExchange{}):  x.delete,
		reflect.TypeOf(&heraldpb.Frame_Bind{}):            x.bind,
		reflect.TypeOf(&heraldpb.Frame_ListExchanges{}):   x.list,
		reflect.TypeOf(&heraldpb.Frame_Publish{}):         x.publish,
	}
}

func (x *exchanges) reply(to *actor.PID, f *heraldpb.Frame) { x.b.sys.Root.Send(to, f) }

func (x *exchanges) fail(f *heraldpb.Frame, to *actor.PID, e *heraldpb.Error) {
	x.reply(to, heraldpb.ErrorFrame(f.Id, e))
}

func (x *exchanges) declare(f *heraldpb.Frame, to *actor.PID) {
	cfg := f.GetDeclareExchange().GetExchange()
	if e := exchange.CheckConfig(cfg); e != nil {
		x.fail(f, to, e)
		return
	}
	created := false
	x.b.users.inBackground(f, to, func(ctx context.Context) (err error) {
		if x.clustered {
			ctrl, cerr := x.b.users.controller()
			if cerr != nil {
				return cerr
			}
			created, err = ctrl.DeclareExchange(ctx, cfg)
			return err
		}
		created, err = x.changeLocal(func(md exchange.Metadata) (bool, error) {
			return asChange(md.Declare(&heraldpb.ExchangeRecord{Config: cfg, CreatedMs: time.Now().UnixMilli()}))
		})
		return err
	}, func() *heraldpb.Frame {
		if created {
			x.b.log.Info("exchange declared", "exchange", cfg.Name, "type", exchange.TypeName(cfg.Type), "alternate", cfg.Alternate)
		}
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_DeclareExchangeResponse{DeclareExchangeResponse: &heraldpb.DeclareExchangeResponse{Created: created}}}
	})
}

// asChange turns a typed error into an error interface that stays nil
// when there is none.
func asChange(changed bool, e *heraldpb.Error) (bool, error) {
	if e != nil {
		return false, e
	}
	return changed, nil
}

func (x *exchanges) delete(f *heraldpb.Frame, to *actor.PID) {
	req := f.GetDeleteExchange()
	x.b.users.inBackground(f, to, func(ctx context.Context) error {
		if x.clustered {
			ctrl, err := x.b.users.controller()
			if err != nil {
				return err
			}
			return ctrl.DeleteExchange(ctx, req)
		}
		_, err := x.changeLocal(func(md exchange.Metadata) (bool, error) {
			if e := md.Delete(req.Name, req.IfUnused); e != nil {
				return false, e
			}
			return true, nil
		})
		return err
	}, func() *heraldpb.Frame {
		x.b.log.Info("exchange deleted", "exchange", req.Name)
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_DeleteExchangeResponse{DeleteExchangeResponse: &heraldpb.DeleteExchangeResponse{}}}
	})
}

func (x *exchanges) bind(f *heraldpb.Frame, to *actor.PID) {
	req := f.GetBind()
	if e := exchange.CheckBinding(req.GetBinding()); e != nil {
		x.fail(f, to, e)
		return
	}
	changed := false
	x.b.users.inBackground(f, to, func(ctx context.Context) (err error) {
		if x.clustered {
			ctrl, cerr := x.b.users.controller()
			if cerr != nil {
				return cerr
			}
			changed, err = ctrl.Bind(ctx, req)
			return err
		}
		if t := req.Binding.Topic; t != "" && !req.Unbind && x.b.reg.Get(t) == nil {
			return heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q does not exist", t)
		}
		changed, err = x.changeLocal(func(md exchange.Metadata) (bool, error) { return asChange(md.Bind(req.Binding, req.Unbind)) })
		return err
	}, func() *heraldpb.Frame {
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_BindResponse{BindResponse: &heraldpb.BindResponse{Changed: changed}}}
	})
}

func (x *exchanges) list(f *heraldpb.Frame, to *actor.PID) {
	name := f.GetListExchanges().GetName()
	t := x.table.Load()
	resp := &heraldpb.ListExchangesResponse{}
	for _, rec := range t.Records() {
		if name != "" && rec.Config.Name != name {
			continue
		}
		s := x.statsOf(rec.Config.Name)
		resp.Exchanges = append(resp.Exchanges, &heraldpb.ExchangeInfo{
			Config: rec.Config, Bindings: rec.Bindings, CreatedMs: rec.CreatedMs,
			Published: s.published.Load(), Routed: s.routed.Load(), Unroutable: s.unroutable.Load(), Returned: s.returned.Load(),
		})
	}
	if name != "" && len(resp.Exchanges) == 0 {
		x.fail(f, to, heraldpb.NewError(heraldpb.ErrorCode_EXCHANGE_NOT_FOUND, "exchange %q does not exist", name))
		return
	}
	x.reply(to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListExchangesResponse{ListExchangesResponse: resp}})
}

// routable reports whether a publish may reach topic: it exists and is
// not internal.
func (x *exchanges) routable(topic string) bool {
	return !strings.HasPrefix(topic, "__") && x.b.reg.Get(topic) != nil
}

// destination is the records a publish sends to one topic.
type destination struct {
	topic   string
	records []byte
	count   int
}

// publish routes a publish and stores it: at one partition as a produce,
// at several as one decision of the transaction coordinator.
func (x *exchanges) publish(f *heraldpb.Frame, to *actor.PID) {
	req := f.GetPublish()
	if len(req.Routed) > 0 {
		x.fail(f, to, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "publish: routed is internal"))
		return
	}
	if e := exchange.CheckRoutingKey(req.RoutingKey); e != nil {
		x.fail(f, to, e)
		return
	}
	info, err := heraldpb.ScanBatch(req.Records)
	if err != nil || info.Count == 0 {
		x.fail(f, to, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "publish: the records are not a batch of at least one record (%v)", err))
		return
	}
	t := x.table.Load()
	if !t.Exists(req.Exchange) {
		x.fail(f, to, heraldpb.NewError(heraldpb.ErrorCode_EXCHANGE_NOT_FOUND, "exchange %q does not exist", req.Exchange))
		return
	}
	var s *exchangeStats
	if req.Exchange != "" {
		s = x.statsOf(req.Exchange)
		s.published.Add(uint64(info.Count))
	}
	start := time.Now()
	dests, unroutable, alternate, e := x.route(t, req, info.Count)
	mMatchSeconds.Observe(time.Since(start).Seconds())
	if e != nil {
		x.fail(f, to, e)
		return
	}
	copies := 0
	for _, d := range dests {
		copies += d.count
	}
	if unroutable > 0 && req.Mandatory {
		if s != nil {
			s.returned.Add(uint64(info.Count))
		}
		name := req.Exchange
		if name == "" {
			name = "(default)"
		}
		x.fail(f, to, heraldpb.NewError(heraldpb.ErrorCode_UNROUTABLE, "exchange %s routes %d of the %d records with routing key %q nowhere (mandatory); nothing was published", name, unroutable, info.Count, req.RoutingKey))
		return
	}
	if s != nil {
		s.routed.Add(uint64(copies))
		s.unroutable.Add(uint64(unroutable))
	}
	resp := &heraldpb.PublishResponse{Unroutable: uint32(unroutable), Alternate: uint32(alternate)}
	if len(dests) == 0 {
		x.reply(to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_PublishResponse{PublishResponse: resp}})
		return
	}
	timeout := publishTimeout
	if req.TimeoutMs > 0 {
		timeout = time.Duration(req.TimeoutMs) * time.Millisecond
	}
	if len(dests) == 1 && req.ProducerId == 0 {
		// An idempotent publish goes to the coordinator even to one
		// partition: it remembers the publisher's sequences.
		d := dests[0]
		inner := &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
			Topic: d.topic, Records: d.records, Acks: heraldpb.Acks_ACKS_ALL, TimeoutMs: uint32(timeout.Milliseconds()),
		}}}
		x.await(x.produce, inner, to, timeout, func(ans *heraldpb.Frame) *heraldpb.Frame {
			pr := ans.GetProduceResponse()
			if pr == nil {
				return ans
			}
			resp.Destinations = []*heraldpb.PublishedTo{{Topic: d.topic, Partition: pr.Partition, BaseOffset: pr.BaseOffset, Count: pr.Count}}
			return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_PublishResponse{PublishResponse: resp}}
		})
		return
	}
	routed := &heraldpb.PublishRequest{Exchange: req.Exchange, RoutingKey: req.RoutingKey, TimeoutMs: uint32(timeout.Milliseconds()),
		ProducerId: req.ProducerId, Sequence: req.Sequence}
	for _, d := range dests {
		ent := x.b.reg.Get(d.topic)
		if ent == nil {
			x.fail(f, to, heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q was deleted while routing; nothing was published", d.topic))
			return
		}
		part, _, e := ent.Route(&heraldpb.ProduceRequest{Topic: d.topic, Records: d.records})
		if e != nil {
			x.fail(f, to, e)
			return
		}
		routed.Routed = append(routed.Routed, &heraldpb.RoutedBatch{Topic: d.topic, Partition: part, Records: d.records, Count: uint32(d.count)})
	}
	inner := &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_Publish{Publish: routed}}
	x.await(x.txn, inner, to, timeout, func(ans *heraldpb.Frame) *heraldpb.Frame {
		pr := ans.GetPublishResponse()
		if pr == nil {
			return ans
		}
		pr.Unroutable, pr.Alternate = resp.Unroutable, resp.Alternate
		return ans
	})
}

// route is where a publish's records go, by topic (in the order found),
// how many records no binding took, and how many went through an
// alternate exchange.
func (x *exchanges) route(t *exchange.Table, req *heraldpb.PublishRequest, count int) (dests []destination, unroutable, alternate int, e *heraldpb.Error) {
	if !t.DependsOnHeaders(req.Exchange) {
		res, e := t.Route(req.Exchange, req.RoutingKey, nil, x.routable)
		if e != nil {
			return nil, 0, 0, e
		}
		for _, topic := range res.Topics {
			dests = append(dests, destination{topic: topic, records: req.Records, count: count})
		}
		switch {
		case len(res.Topics) == 0:
			unroutable = count
		case res.Alternate:
			alternate = count
		}
		return dests, unroutable, alternate, nil
	}
	// Record by record: a headers exchange reads each record's headers.
	index := map[string]int{}
	_ = heraldpb.ForEachRawRecord(req.Records, func(_ int, rec []byte) bool {
		var res exchange.Result
		res, e = t.Route(req.Exchange, req.RoutingKey, func(name string) ([]byte, bool) { return heraldpb.RecordHeader(rec, name) }, x.routable)
		if e != nil {
			return false
		}
		switch {
		case len(res.Topics) == 0:
			unroutable++
		case res.Alternate:
			alternate++
		}
		for _, topic := range res.Topics {
			i, ok := index[topic]
			if !ok {
				i = len(dests)
				index[topic] = i
				dests = append(dests, destination{topic: topic})
			}
			dests[i].records = heraldpb.AppendRecordField(dests[i].records, rec)
			dests[i].count++
		}
		return true
	})
	return dests, unroutable, alternate, e
}

// await hands inner to h with a relay for the answer, and sends to the
// answer as translate makes it (an error frame as it came). The relay is
// a bare process, not a future: it forwards on the answering actor's
// goroutine, with no goroutine of its own to wake.
func (x *exchanges) await(h topic.Handler, inner *heraldpb.Frame, to *actor.PID, timeout time.Duration, translate func(*heraldpb.Frame) *heraldpb.Frame) {
	r := &relay{sys: x.b.sys, to: to, id: inner.Id, translate: translate}
	r.pid, _ = x.b.sys.ProcessRegistry.Add(r, "publish"+x.b.sys.ProcessRegistry.NextId())
	r.timer = time.AfterFunc(timeout+5*time.Second, func() {
		e := heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "publish: no answer in %v; the outcome is unknown", timeout)
		e.Retriable, e.OutcomeUnknown = true, true
		r.deliver(heraldpb.ErrorFrame(inner.Id, e))
	})
	h(inner, r.pid)
}

// relay is the one-answer process await hands a request's handler.
type relay struct {
	sys       *actor.ActorSystem
	pid, to   *actor.PID
	id        uint64
	translate func(*heraldpb.Frame) *heraldpb.Frame
	timer     *time.Timer
	done      atomic.Bool
}

func (r *relay) SendUserMessage(_ *actor.PID, m any) {
	ans, ok := actor.UnwrapEnvelopeMessage(m).(*heraldpb.Frame)
	if !ok {
		ans = heraldpb.ErrorFrame(r.id, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "publish: an answer of type %T", m))
	} else if ans.GetError() == nil {
		ans = r.translate(ans)
	}
	r.deliver(ans)
}

// deliver sends the first answer on and forgets the relay.
func (r *relay) deliver(f *heraldpb.Frame) {
	if r.done.Swap(true) {
		return
	}
	r.timer.Stop()
	r.sys.ProcessRegistry.Remove(r.pid)
	r.sys.Root.Send(r.to, f)
}

func (r *relay) SendSystemMessage(*actor.PID, any) {}

func (r *relay) Stop(*actor.PID) {}

// wrapDeleteTopic removes a single node's bindings to a topic once it is
// deleted (a cluster's controller removes them with the topic).
func (x *exchanges) wrapDeleteTopic(h topic.Handler) topic.Handler {
	return func(f *heraldpb.Frame, to *actor.PID) {
		if x.clustered {
			h(f, to)
			return
		}
		name := f.GetDeleteTopic().GetName()
		x.await(h, f, to, userRequestTimeout, func(ans *heraldpb.Frame) *heraldpb.Frame {
			if _, err := x.changeLocal(func(md exchange.Metadata) (bool, error) {
				n := md.Bindings()
				md.DeleteTopic(name)
				return md.Bindings() != n, nil
			}); err != nil {
				x.b.log.Warn("removing the bindings of a deleted topic", "topic", name, "err", err)
			}
			return ans
		})
	}
}

// exchangeCollector exports each exchange's counts (bounded by
// exchange.MaxExchanges: the counts of a deleted exchange go with it).
type exchangeCollector struct{ x *exchanges }

var exchangeDescs = map[string]*prometheus.Desc{
	"published":  prometheus.NewDesc("herald_exchange_published_records_total", "Records published to the exchange on this node.", []string{"exchange"}, nil),
	"routed":     prometheus.NewDesc("herald_exchange_routed_records_total", "Copies of records the exchange routed to topics (a record reaching 3 topics counts 3).", []string{"exchange"}, nil),
	"unroutable": prometheus.NewDesc("herald_exchange_unroutable_records_total", "Records the exchange routed nowhere and dropped (not mandatory).", []string{"exchange"}, nil),
	"returned":   prometheus.NewDesc("herald_exchange_returned_records_total", "Records of mandatory publishes refused with UNROUTABLE.", []string{"exchange"}, nil),
}

func (c exchangeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range exchangeDescs {
		ch <- d
	}
}

func (c exchangeCollector) Collect(ch chan<- prometheus.Metric) {
	if c.x == nil {
		return
	}
	c.x.stats.Range(func(k, v any) bool {
		name, s := k.(string), v.(*exchangeStats)
		for key, val := range map[string]uint64{"published": s.published.Load(), "routed": s.routed.Load(), "unroutable": s.unroutable.Load(), "returned": s.returned.Load()} {
			ch <- prometheus.MustNewConstMetric(exchangeDescs[key], prometheus.CounterValue, float64(val), name)
		}
		return true
	})
}
