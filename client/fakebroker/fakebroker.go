// Package fakebroker is an in-process stand-in for a single Herald broker,
// for unit tests of the client and the CLI. It speaks the real frame
// protocol over TCP on loopback, keeps topics in memory, and lets a test
// intercept any request (reply with an error, delay, drop, or cut the
// connection) in the style of franz-go's kfake.
//
// It also runs consumer groups (push with credits, acks, nacks, group
// admin) and request-reply in a simplified form: see groups.go; and half
// (transactional) messages, with check-backs sent when a test asks: see
// txn.go; and transactions across partitions, staged until committed: see
// txns.go. It deduplicates idempotent produces as the broker does (each producer's last
// 5 batches per partition, OUT_OF_ORDER_SEQUENCE on a gap), without a limit
// on producers.
//
// It is not the broker: it has no durability, replication or real flow
// control. End-to-end tests must use the real broker.
package fakebroker

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// Action is what a Hook wants done with one request. The zero Action means
// "handle normally".
type Action struct {
	Error *heraldpb.Error // answer with this error instead of handling
	Delay time.Duration   // wait this long before handling (or erroring)
	Close bool            // close the connection instead of answering
	Drop  bool            // never answer
	// LoseReply (produce requests, half and transactional ones too,
	// publishes, and EndTxn): handle the request, then close the connection instead of
	// sending its answer, as when a response is lost after the broker
	// wrote the batch.
	LoseReply bool
}

// Hook sees every request frame (Hello included) before it is handled. conn
// numbers connections from 1 in accept order. It is called concurrently.
type Hook func(conn int, req *heraldpb.Frame) Action

// ProduceLog records one produce request the broker accepted.
type ProduceLog struct {
	Conn      int
	Topic     string
	Partition uint32
	Explicit  bool // the request named the partition
	Count     int
	Records   []byte
	// Idempotent produce: the request's producer id and base sequence, and
	// whether it was a retry answered with the original offsets (nothing
	// stored).
	ProducerID   uint64
	BaseSequence int64
	Duplicate    bool
}

// Broker is a running fake broker.
type Broker struct {
	ln       net.Listener
	window   uint32
	maxFrame uint32
	node     uint32 // node id in Hello and metadata

	// brokers and leader, set by SetCluster: the nodes metadata lists
	// and the node it names as every partition's leader (nil: this one
	// alone).
	brokers []*heraldpb.BrokerInfo
	leader  uint32

	mu       sync.Mutex
	topics   map[string]*topic
	changed  chan struct{} // closed and replaced on every append
	hook     Hook
	conns    map[int]net.Conn
	nconn    int
	produced []ProduceLog
	closed   bool

	sessions map[int]*session // live connections, for pushes and inboxes
	manual   bool             // AutoDeliver(false)
	groups   map[string]*group
	subs     map[uint64]*fakeSub
	nextSub  uint64
	subReqs  []*heraldpb.SubscribeRequest
	ackLog   []AckLog

	txn txnState // half messages (txn.go)

	// frozen: Hello is not answered (SetFrozen), as by a stopped process
	// whose kernel still accepts connections.
	frozen atomic.Bool

	maxSeen    atomic.Int64 // most requests seen outstanding on one connection
	violations atomic.Int64 // requests past the window
	wg         sync.WaitGroup
}

type topic struct {
	cfg   *heraldpb.TopicConfig
	parts []*partition
	rr    uint32
}

type partition struct {
	batches   []*heraldpb.StoredBatch
	hw        int64
	recs      []*heraldpb.Record // decoded, by offset (for push delivery)
	appendMs  []int64            // by offset
	producers map[uint64][]seqBatch
}

// seqBatch is a batch of an idempotent producer. The fake keeps each
// producer's last 5, as the broker does, and no limit on producers.
type seqBatch struct {
	seq    int64
	count  int
	offset int64
}

// Opt configures a Broker.
type Opt func(*Broker)

// Window sets the in-flight window the broker negotiates (default 64).
func Window(n uint32) Opt { return func(b *Broker) { b.window = n } }

// MaxFrameBytes sets the frame limit the broker negotiates.
func MaxFrameBytes(n uint32) Opt { return func(b *Broker) { b.maxFrame = n } }

// Node sets the node id the broker gives in Hello and metadata (default 1).
func Node(id uint32) Opt { return func(b *Broker) { b.node = id } }

// Topic pre-creates a topic with n partitions.
func Topic(name string, n uint32) Opt {
	return func(b *Broker) { b.createTopic(name, &heraldpb.TopicConfig{Partitions: n, ReplicationFactor: 1}) }
}

// New starts a broker on 127.0.0.1 with a random port.
func New(opts ...Opt) (*Broker, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &Broker{
		ln:       ln,
		window:   64,
		node:     1,
		maxFrame: heraldpb.DefaultMaxFrameBytes,
		topics:   map[string]*topic{},
		changed:  make(chan struct{}),
		conns:    map[int]net.Conn{},
		sessions: map[int]*session{},
		groups:   map[string]*group{},
		subs:     map[uint64]*fakeSub{},
	}
	for _, o := range opts {
		o(b)
	}
	b.wg.Add(1)
	go b.accept()
	return b, nil
}

// Addr is the broker's host:port.
func (b *Broker) Addr() string { return b.ln.Addr().String() }

// SetCluster has the broker's metadata list brokers (itself among them)
// and name leader as the leader of every partition, replicated on every
// broker listed, as a member of a cluster would. Nothing else changes:
// each fake keeps its own topics and answers every request itself, leader
// or not.
func (b *Broker) SetCluster(brokers []*heraldpb.BrokerInfo, leader uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.brokers, b.leader = brokers, leader
}

// SetHook installs (or with nil removes) the request hook.
func (b *Broker) SetHook(h Hook) {
	b.mu.Lock()
	b.hook = h
	b.mu.Unlock()
}

// Close stops the broker and closes every connection.
func (b *Broker) Close() {
	b.mu.Lock()
	b.closed = true
	for _, c := range b.conns {
		c.Close()
	}
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
	b.ln.Close()
	b.wg.Wait()
}

// DropConnections closes every open client connection.
func (b *Broker) DropConnections() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		c.Close()
	}
}

// SetFrozen makes the broker leave new connections' Hello unanswered (on)
// or answer them again (off), as a stopped process does: its kernel
// accepts connections that nothing reads.
func (b *Broker) SetFrozen(on bool) { b.frozen.Store(on) }

// Connections returns how many connections were accepted so far.
func (b *Broker) Connections() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.nconn
}

// MaxInFlightSeen is the most requests ever outstanding on one connection.
func (b *Broker) MaxInFlightSeen() int { return int(b.maxSeen.Load()) }

// WindowViolations counts requests that arrived past the window.
func (b *Broker) WindowViolations() int { return int(b.violations.Load()) }

// Produced returns every accepted produce request, in acceptance order.
func (b *Broker) Produced() []ProduceLog {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]ProduceLog(nil), b.produced...)
}

// Records decodes every record stored in a partition, in offset order.
func (b *Broker) Records(topicName string, part uint32) []*heraldpb.Record {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.topics[topicName]
	if t == nil || int(part) >= len(t.parts) {
		return nil
	}
	var out []*heraldpb.Record
	for _, sb := range t.parts[part].batches {
		var rb heraldpb.RecordBatch
		if err := proto.Unmarshal(sb.GetRecords(), &rb); err == nil {
			out = append(out, rb.GetRecords()...)
		}
	}
	return out
}

func (b *Broker) accept() {
	defer b.wg.Done()
	for {
		nc, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			nc.Close()
			return
		}
		b.nconn++
		id := b.nconn
		b.conns[id] = nc
		b.mu.Unlock()
		b.wg.Add(1)
		go b.serve(id, nc)
	}
}

type session struct {
	b        *Broker
	id       int
	nc       net.Conn
	wmu      sync.Mutex
	inFlight atomic.Int64
	ctx      context.Context
}

func (b *Broker) serve(id int, nc net.Conn) {
	defer b.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	var handlers sync.WaitGroup
	defer func() {
		cancel()
		nc.Close()
		handlers.Wait()
		b.mu.Lock()
		delete(b.conns, id)
		delete(b.sessions, id)
		b.dropConnLocked(id)
		b.dropProducerLocked(id)
		b.mu.Unlock()
	}()
	s := &session{b: b, id: id, nc: nc, ctx: ctx}
	b.mu.Lock()
	b.sessions[id] = s
	b.mu.Unlock()
	br := bufio.NewReader(nc)
	helloDone := false
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > b.maxFrame {
			s.write(heraldpb.ErrorFrame(0, heraldpb.NewError(heraldpb.ErrorCode_FRAME_TOO_LARGE, "frame of %d bytes", n)))
			return
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(br, payload); err != nil {
			return
		}
		f, err := heraldpb.DecodeFrame(payload)
		if err != nil {
			s.write(heraldpb.ErrorFrame(f.GetId(), heraldpb.NewError(heraldpb.ErrorCode_MALFORMED_FRAME, "%v", err)))
			return
		}
		if !helloDone {
			if b.frozen.Load() {
				continue // never answered
			}
			if f.GetHello() == nil {
				s.write(heraldpb.ErrorFrame(f.GetId(), heraldpb.NewError(heraldpb.ErrorCode_HELLO_REQUIRED, "hello first")))
				continue
			}
			if !s.handleHello(f) {
				return
			}
			helloDone = true
			continue
		}
		cur := s.inFlight.Add(1)
		for {
			m := b.maxSeen.Load()
			if cur <= m || b.maxSeen.CompareAndSwap(m, cur) {
				break
			}
		}
		if cur > int64(b.window) {
			b.violations.Add(1)
			s.inFlight.Add(-1)
			s.write(heraldpb.ErrorFrame(f.GetId(), heraldpb.NewError(heraldpb.ErrorCode_TOO_MANY_IN_FLIGHT, "window %d", b.window)))
			continue
		}
		handlers.Add(1)
		go func() {
			defer handlers.Done()
			s.handle(f)
		}()
	}
}

func (s *session) write(f *heraldpb.Frame) {
	buf, err := heraldpb.AppendFrame(nil, f)
	if err != nil {
		return
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_, _ = s.nc.Write(buf)
}

// reply ends a request: it leaves the window before the response is
// written, as the client may send its next request as soon as it reads it.
func (s *session) reply(f *heraldpb.Frame) {
	s.inFlight.Add(-1)
	s.write(f)
}

func (s *session) hookAction(f *heraldpb.Frame) Action {
	s.b.mu.Lock()
	h := s.b.hook
	s.b.mu.Unlock()
	if h == nil {
		return Action{}
	}
	return h(s.id, f)
}

// apply runs a hook action; it reports whether the request was consumed.
func (s *session) apply(a Action, f *heraldpb.Frame, inWindow bool) bool {
	if a.Delay > 0 {
		t := time.NewTimer(a.Delay)
		select {
		case <-t.C:
		case <-s.ctx.Done():
			t.Stop()
			return true
		}
	}
	switch {
	case a.Close:
		s.nc.Close()
		return true
	case a.Drop:
		return true
	case a.Error != nil:
		if inWindow {
			s.reply(heraldpb.ErrorFrame(f.GetId(), a.Error))
		} else {
			s.write(heraldpb.ErrorFrame(f.GetId(), a.Error))
		}
		return true
	}
	return false
}

func (s *session) handleHello(f *heraldpb.Frame) bool {
	if s.apply(s.hookAction(f), f, false) {
		return false
	}
	h := f.GetHello()
	if h.GetProtocolVersion() != heraldpb.ProtocolVersion {
		s.write(heraldpb.ErrorFrame(f.GetId(), heraldpb.NewError(heraldpb.ErrorCode_UNSUPPORTED_VERSION, "version %d", h.GetProtocolVersion())))
		return false
	}
	win, mf := s.b.window, s.b.maxFrame
	if v := h.GetMaxInFlight(); v > 0 && v < win {
		win = v
	}
	if v := h.GetMaxFrameBytes(); v > 0 && v < mf {
		mf = v
	}
	s.write(&heraldpb.Frame{Id: f.GetId(), Body: &heraldpb.Frame_HelloResponse{HelloResponse: &heraldpb.HelloResponse{
		ProtocolVersion: heraldpb.ProtocolVersion, MaxFrameBytes: mf, MaxInFlight: win, NodeId: s.b.node, ServerVersion: "fake",
	}}})
	return true
}

func errFrame(id uint64, code heraldpb.ErrorCode, format string, args ...any) *heraldpb.Frame {
	return heraldpb.ErrorFrame(id, heraldpb.NewError(code, format, args...))
}

func (s *session) handle(f *heraldpb.Frame) {
	act := s.hookAction(f)
	if s.apply(act, f, true) {
		if s.ctx.Err() == nil {
			// Dropped or closed requests still leave the window.
			s.inFlight.Add(-1)
		}
		return
	}
	b := s.b
	id := f.GetId()
	switch body := f.GetBody().(type) {
	case *heraldpb.Frame_Metadata:
		b.mu.Lock()
		resp := &heraldpb.MetadataResponse{Brokers: []*heraldpb.BrokerInfo{{NodeId: b.node, Addr: b.Addr()}}}
		if b.brokers != nil {
			resp.Brokers = nil
			for _, bi := range b.brokers {
				resp.Brokers = append(resp.Brokers, proto.Clone(bi).(*heraldpb.BrokerInfo))
			}
		}
		names := body.Metadata.GetTopics()
		if len(names) == 0 {
			for n := range b.topics {
				names = append(names, n)
			}
		}
		for _, n := range names {
			if t := b.topics[n]; t != nil {
				resp.Topics = append(resp.Topics, b.infoLocked(n, t))
			}
		}
		b.mu.Unlock()
		s.reply(&heraldpb.Frame{Id: id, Body: &heraldpb.Frame_MetadataResponse{MetadataResponse: resp}})
	case *heraldpb.Frame_CreateTopic:
		req := body.CreateTopic
		b.mu.Lock()
		if b.topics[req.GetName()] != nil {
			b.mu.Unlock()
			s.reply(errFrame(id, heraldpb.ErrorCode_TOPIC_ALREADY_EXISTS, "topic %q exists", req.GetName()))
			return
		}
		if req.GetName() == "" || req.GetConfig().GetPartitions() == 0 {
			b.mu.Unlock()
			s.reply(errFrame(id, heraldpb.ErrorCode_INVALID_REQUEST, "name and partitions are required"))
			return
		}
		t := b.createTopic(req.GetName(), proto.Clone(req.GetConfig()).(*heraldpb.TopicConfig))
		info := b.infoLocked(req.GetName(), t)
		b.mu.Unlock()
		s.reply(&heraldpb.Frame{Id: id, Body: &heraldpb.Frame_CreateTopicResponse{CreateTopicResponse: &heraldpb.CreateTopicResponse{Topic: info}}})
	case *heraldpb.Frame_DeleteTopic:
		b.mu.Lock()
		_, ok := b.topics[body.DeleteTopic.GetName()]
		delete(b.topics, body.DeleteTopic.GetName())
		b.mu.Unlock()
		if !ok {
			s.reply(errFrame(id, heraldpb.ErrorCode_TOPIC_NOT_FOUND, "no topic %q", body.DeleteTopic.GetName()))
			return
		}
		s.reply(&heraldpb.Frame{Id: id, Body: &heraldpb.Frame_DeleteTopicResponse{DeleteTopicResponse: &heraldpb.DeleteTopicResponse{}}})
	case *heraldpb.Frame_ListTopics:
		b.mu.Lock()
		resp := &heraldpb.ListTopicsResponse{}
		for n, t := range b.topics {
			resp.Topics = append(resp.Topics, b.infoLocked(n, t))
		}
		b.mu.Unlock()
		s.reply(&heraldpb.Frame{Id: id, Body: &heraldpb.Frame_ListTopicsResponse{ListTopicsResponse: resp}})
	case *heraldpb.Frame_DescribeTopic:
		b.mu.Lock()
		t := b.topics[body.DescribeTopic.GetName()]
		var info *heraldpb.TopicInfo
		if t != nil {
			info = b.infoLocked(body.DescribeTopic.GetName(), t)
		}
		b.mu.Unlock()
		if info == nil {
			s.reply(errFrame(id, heraldpb.ErrorCode_TOPIC_NOT_FOUND, "no topic %q", body.DescribeTopic.GetName()))
			return
		}
		s.reply(&heraldpb.Frame{Id: id, Body: &heraldpb.Frame_DescribeTopicResponse{DescribeTopicResponse: &heraldpb.DescribeTopicResponse{Topic: info}}})
	case *heraldpb.Frame_Produce:
		var resp *heraldpb.Frame
		switch {
		case body.Produce.GetHalf() != nil:
			resp = b.produceHalf(s.id, id, body.Produce)
		case body.Produce.GetTransactionalId() != "":
			resp = b.produceTxn(s.id, id, body.Produce)
		default:
			resp = b.produce(s.id, id, body.Produce)
		}
		if act.LoseReply {
			s.inFlight.Add(-1)
			s.nc.Close()
			return
		}
		s.reply(resp)
	case *heraldpb.Frame_Publish:
		// The default exchange only: a produce to the topic the routing
		// key names, answered as a publish.
		pub := body.Publish
		if pub.GetExchange() != "" {
			s.reply(errFrame(id, heraldpb.ErrorCode_EXCHANGE_NOT_FOUND, "the fake broker has no exchange %q", pub.GetExchange()))
			return
		}
		resp := b.produce(s.id, id, &heraldpb.ProduceRequest{Topic: pub.GetRoutingKey(), Partition: proto.Uint32(0), Records: pub.GetRecords()})
		if pr := resp.GetProduceResponse(); pr != nil {
			resp = &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_PublishResponse{PublishResponse: &heraldpb.PublishResponse{
				Destinations: []*heraldpb.PublishedTo{{Topic: pub.GetRoutingKey(), Partition: pr.Partition, BaseOffset: pr.BaseOffset, Count: pr.Count}}}}}
		}
		if act.LoseReply {
			s.inFlight.Add(-1)
			s.nc.Close()
			return
		}
		s.reply(resp)
	case *heraldpb.Frame_InitProducerId:
		s.reply(b.initProducerID(id, body.InitProducerId))
	case *heraldpb.Frame_EndTxn:
		resp := b.endTxn(id, body.EndTxn)
		if act.LoseReply {
			s.inFlight.Add(-1)
			s.nc.Close()
			return
		}
		s.reply(resp)
	case *heraldpb.Frame_Fetch:
		s.reply(b.fetch(s.ctx, id, body.Fetch))
	case *heraldpb.Frame_ListOffsets:
		s.reply(b.listOffsets(id, body.ListOffsets))
	default:
		if !s.handleTxn(f) && !s.handleGroups(f) {
			s.reply(errFrame(id, heraldpb.ErrorCode_UNKNOWN_REQUEST, "unexpected %T", body))
		}
	}
}

func (b *Broker) createTopic(name string, cfg *heraldpb.TopicConfig) *topic {
	t := &topic{cfg: cfg}
	for i := uint32(0); i < cfg.GetPartitions(); i++ {
		t.parts = append(t.parts, &partition{})
	}
	b.topics[name] = t
	return t
}

func (b *Broker) infoLocked(name string, t *topic) *heraldpb.TopicInfo {
	info := &heraldpb.TopicInfo{Name: name, Config: proto.Clone(t.cfg).(*heraldpb.TopicConfig)}
	leader, replicas := b.node, []uint32{b.node}
	if b.brokers != nil {
		leader, replicas = b.leader, nil
		for _, bi := range b.brokers {
			replicas = append(replicas, bi.GetNodeId())
		}
	}
	for i, p := range t.parts {
		info.Partitions = append(info.Partitions, &heraldpb.PartitionInfo{Id: uint32(i), Leader: leader, Replicas: slices.Clone(replicas), HighWatermark: p.hw})
	}
	return info
}

// fnv32a mirrors client.PartitionForKey without importing the client.
func fnv32a(key []byte, n uint32) uint32 {
	h := uint32(2166136261)
	for _, c := range key {
		h ^= uint32(c)
		h *= 16777619
	}
	return h % n
}

// pick returns the partition a produce goes to: the one it names (false
// if the topic has no such partition), its first key's, or the next in
// round robin. b.mu is held.
func (t *topic) pick(req *heraldpb.ProduceRequest, info heraldpb.BatchInfo) (uint32, bool) {
	n := uint32(len(t.parts))
	switch {
	case req.Partition != nil:
		return req.GetPartition(), req.GetPartition() < n
	case len(info.FirstKey) > 0:
		return fnv32a(info.FirstKey, n), true
	}
	t.rr++
	return (t.rr - 1) % n, true
}

func (b *Broker) produce(conn int, id uint64, req *heraldpb.ProduceRequest) *heraldpb.Frame {
	info, err := heraldpb.ScanBatch(req.GetRecords())
	if err != nil || info.Count == 0 {
		return errFrame(id, heraldpb.ErrorCode_INVALID_REQUEST, "bad batch: %v (count %d)", err, info.Count)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.topics[req.GetTopic()]
	if t == nil {
		return errFrame(id, heraldpb.ErrorCode_TOPIC_NOT_FOUND, "no topic %q", req.GetTopic())
	}
	if req.GetDelayMs() != 0 || req.GetDeliverAtMs() != 0 {
		// The fake has no scheduler (it stores delayed batches at once),
		// nor its dedup window: a delayed batch's producer id is ignored.
		req = proto.Clone(req).(*heraldpb.ProduceRequest)
		req.ProducerId, req.BaseSequence = 0, 0
	}
	if req.GetProducerId() != 0 && req.Partition == nil {
		return errFrame(id, heraldpb.ErrorCode_INVALID_REQUEST, "an idempotent produce must name its partition")
	}
	part, ok := t.pick(req, info)
	if !ok {
		return errFrame(id, heraldpb.ErrorCode_PARTITION_NOT_FOUND, "no partition %d", req.GetPartition())
	}
	p := t.parts[part]
	if pid, seq := req.GetProducerId(), req.GetBaseSequence(); pid != 0 {
		bs := p.producers[pid]
		for _, sb := range bs {
			if sb.seq == seq && sb.count == info.Count {
				b.produced = append(b.produced, ProduceLog{Conn: conn, Topic: req.GetTopic(), Partition: part, Explicit: true, Count: info.Count,
					Records: append([]byte(nil), req.GetRecords()...), ProducerID: pid, BaseSequence: seq, Duplicate: true})
				return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{
					Partition: part, BaseOffset: sb.offset, Count: uint32(info.Count), Duplicate: true,
				}}}
			}
		}
		if n := len(bs); n > 0 && seq != bs[n-1].seq+int64(bs[n-1].count) {
			return errFrame(id, heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE, "producer %d sent sequence %d; the next expected is %d", pid, seq, bs[n-1].seq+int64(bs[n-1].count))
		}
		if p.producers == nil {
			p.producers = map[uint64][]seqBatch{}
		}
		bs = append(bs, seqBatch{seq: seq, count: info.Count, offset: p.hw})
		p.producers[pid] = bs[max(0, len(bs)-5):]
	}
	sb := b.appendLocked(p, req.GetRecords(), info.Count)
	b.produced = append(b.produced, ProduceLog{Conn: conn, Topic: req.GetTopic(), Partition: part, Explicit: req.Partition != nil, Count: info.Count, Records: sb.Records,
		ProducerID: req.GetProducerId(), BaseSequence: req.GetBaseSequence()})
	now := sb.AppendTimeMs
	base := sb.BaseOffset
	if req.GetAcks() == heraldpb.Acks_ACKS_NONE {
		base = -1
	}
	return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{
		Partition: part, BaseOffset: base, Count: uint32(info.Count), AppendTimeMs: now,
	}}}
}

// appendLocked appends a copy of records (count records) to p, wakes
// fetches and pushes, and returns the stored batch. b.mu is held.
func (b *Broker) appendLocked(p *partition, records []byte, count int) *heraldpb.StoredBatch {
	now := time.Now().UnixMilli()
	sb := &heraldpb.StoredBatch{BaseOffset: p.hw, Count: uint32(count), AppendTimeMs: now, Records: append([]byte(nil), records...)}
	p.batches = append(p.batches, sb)
	p.hw += int64(count)
	var rb heraldpb.RecordBatch
	_ = proto.Unmarshal(sb.Records, &rb)
	for _, r := range rb.GetRecords() {
		p.recs = append(p.recs, r)
		p.appendMs = append(p.appendMs, now)
	}
	close(b.changed)
	b.changed = make(chan struct{})
	b.pumpLocked()
	return sb
}

func (b *Broker) fetch(ctx context.Context, id uint64, req *heraldpb.FetchRequest) *heraldpb.Frame {
	deadline := time.Now().Add(time.Duration(req.GetMaxWaitMs()) * time.Millisecond)
	for {
		b.mu.Lock()
		t := b.topics[req.GetTopic()]
		if t == nil {
			b.mu.Unlock()
			return errFrame(id, heraldpb.ErrorCode_TOPIC_NOT_FOUND, "no topic %q", req.GetTopic())
		}
		if int(req.GetPartition()) >= len(t.parts) {
			b.mu.Unlock()
			return errFrame(id, heraldpb.ErrorCode_PARTITION_NOT_FOUND, "no partition %d", req.GetPartition())
		}
		p := t.parts[req.GetPartition()]
		if req.GetOffset() < 0 || req.GetOffset() > p.hw {
			b.mu.Unlock()
			return errFrame(id, heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE, "offset %d outside [0, %d]", req.GetOffset(), p.hw)
		}
		resp := &heraldpb.FetchResponse{Partition: req.GetPartition(), HighWatermark: p.hw}
		size := 0
		for _, sb := range p.batches {
			if sb.BaseOffset+int64(sb.Count) <= req.GetOffset() {
				continue
			}
			if len(resp.Batches) > 0 && size+len(sb.Records) > int(req.GetMaxBytes()) && req.GetMaxBytes() > 0 {
				break
			}
			resp.Batches = append(resp.Batches, sb)
			size += len(sb.Records)
		}
		changed := b.changed
		closed := b.closed
		b.mu.Unlock()
		wait := time.Until(deadline)
		if len(resp.Batches) > 0 || wait <= 0 || closed {
			return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_FetchResponse{FetchResponse: resp}}
		}
		tm := time.NewTimer(wait)
		select {
		case <-changed:
		case <-tm.C:
		case <-ctx.Done():
		}
		tm.Stop()
	}
}

func (b *Broker) listOffsets(id uint64, req *heraldpb.ListOffsetsRequest) *heraldpb.Frame {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.topics[req.GetTopic()]
	if t == nil {
		return errFrame(id, heraldpb.ErrorCode_TOPIC_NOT_FOUND, "no topic %q", req.GetTopic())
	}
	if int(req.GetPartition()) >= len(t.parts) {
		return errFrame(id, heraldpb.ErrorCode_PARTITION_NOT_FOUND, "no partition %d", req.GetPartition())
	}
	p := t.parts[req.GetPartition()]
	resp := &heraldpb.ListOffsetsResponse{Partition: req.GetPartition(), HighWatermark: p.hw}
	switch req.GetSpec() {
	case heraldpb.OffsetSpec_OFFSET_SPEC_EARLIEST:
		resp.Offset = 0
	case heraldpb.OffsetSpec_OFFSET_SPEC_LATEST:
		resp.Offset = p.hw
	case heraldpb.OffsetSpec_OFFSET_SPEC_TIMESTAMP:
		resp.Offset = p.hw
		for _, sb := range p.batches {
			if sb.AppendTimeMs >= req.GetTimestampMs() {
				resp.Offset = sb.BaseOffset
				break
			}
		}
	default:
		return errFrame(id, heraldpb.ErrorCode_INVALID_REQUEST, "spec %v", req.GetSpec())
	}
	return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_ListOffsetsResponse{ListOffsetsResponse: resp}}
}

// ErrNoTopic is returned by helpers when a topic does not exist.
var ErrNoTopic = errors.New("fakebroker: no such topic")

// HighWatermark returns a partition's high watermark.
func (b *Broker) HighWatermark(topicName string, part uint32) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.topics[topicName]
	if t == nil || int(part) >= len(t.parts) {
		return 0, fmt.Errorf("%w: %s/%d", ErrNoTopic, topicName, part)
	}
	return t.parts[part].hw, nil
}
