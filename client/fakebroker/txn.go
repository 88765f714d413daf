package fakebroker

// Half (transactional) messages for the fake broker: it stores half
// produces, ends them (EndHalf), registers producers (RegisterProducer),
// lists pending halves (ListTxn), and pushes a HalfCheck when a test asks
// (SendHalfCheck): it has no check timer and never resolves a half by
// itself. It answers every transaction request, as a single broker does;
// a test makes a node answer NOT_COORDINATOR with a hook. A committed half
// is appended at once, like a produce (it shows in Produced), also when it
// has a delivery time: the answer then carries deliver_at_ms and
// base_offset -1, as the broker's does, but the fake has no scheduler.

import (
	"errors"
	"fmt"
	"slices"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// HalfLog describes one half message the fake stored.
type HalfLog struct {
	ID      string
	Conn    int
	Request *heraldpb.ProduceRequest // as received
	// Partition is the one the half goes to.
	Partition uint32
	// State is "pending", "committed" or "rolled back".
	State  string
	Checks uint32 // HalfChecks sent (SendHalfCheck)
}

// EndLog records one EndHalfRequest the fake received.
type EndLog struct {
	Conn    int
	Request *heraldpb.EndHalfRequest
}

// RegisterLog records one RegisterProducerRequest the fake received.
type RegisterLog struct {
	Conn    int
	Request *heraldpb.RegisterProducerRequest
}

type txnState struct {
	heartbeat time.Duration // answered in RegisterProducerResponse; 0: none
	next      int
	halves    []*fakeHalf          // in creation order, ended ones too
	byID      map[string]*fakeHalf // every half stored
	producers map[string][]int     // producer group -> registered connections, in registration order
	ends      []EndLog
	regs      []RegisterLog
	ids       map[string]*fakeTxnID // transactional ids (txns.go)
}

type fakeHalf struct {
	HalfLog
	created time.Time
	count   int
	action  heraldpb.HalfAction // HALF_UNKNOWN while pending
}

// TxnHeartbeat sets the heartbeat_ms the fake answers RegisterProducer
// with (default 0: the client's default).
func TxnHeartbeat(d time.Duration) Opt { return func(b *Broker) { b.txn.heartbeat = d } }

// ErrNoProducer is returned by SendHalfCheck when no connection has
// registered the half's producer group.
var ErrNoProducer = errors.New("fakebroker: no producer registered for the group")

// Halves returns every half message stored, in order.
func (b *Broker) Halves() []HalfLog {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]HalfLog, len(b.txn.halves))
	for i, h := range b.txn.halves {
		out[i] = h.HalfLog
	}
	return out
}

// Ends returns every EndHalfRequest received, in order.
func (b *Broker) Ends() []EndLog {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.txn.ends)
}

// Registrations returns every RegisterProducerRequest received, in order.
func (b *Broker) Registrations() []RegisterLog {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.txn.regs)
}

// Producers returns the connections registered as producers of group.
func (b *Broker) Producers(group string) []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.txn.producers[group])
}

// SendHalfCheck pushes a HalfCheck of the pending half id to the
// connection that registered its producer group first, and returns that
// connection.
func (b *Broker) SendHalfCheck(id string) (int, error) {
	b.mu.Lock()
	h := b.txn.byID[id]
	if h == nil || h.State != "pending" {
		b.mu.Unlock()
		return 0, fmt.Errorf("fakebroker: no pending half %q", id)
	}
	group := h.Request.GetHalf().GetProducerGroup()
	conns := b.txn.producers[group]
	if len(conns) == 0 {
		b.mu.Unlock()
		return 0, fmt.Errorf("%w %q", ErrNoProducer, group)
	}
	s := b.sessions[conns[0]]
	h.Checks++
	hc := &heraldpb.HalfCheck{Id: id, ProducerGroup: group, Topic: h.Request.GetTopic(), Partition: h.Partition,
		Records: h.Request.GetRecords(), Check: h.Checks, MaxChecks: maxChecks(h.Request.GetHalf()), CreatedMs: h.created.UnixMilli()}
	b.mu.Unlock()
	if s == nil {
		return 0, fmt.Errorf("fakebroker: connection %d is gone", conns[0])
	}
	s.write(&heraldpb.Frame{Body: &heraldpb.Frame_HalfCheck{HalfCheck: hc}})
	return conns[0], nil
}

func maxChecks(o *heraldpb.HalfOptions) uint32 {
	if n := o.GetMaxChecks(); n > 0 {
		return n
	}
	return 15
}

// produceHalf stores a half message.
func (b *Broker) produceHalf(conn int, id uint64, req *heraldpb.ProduceRequest) *heraldpb.Frame {
	info, err := heraldpb.ScanBatch(req.GetRecords())
	if err != nil || info.Count == 0 {
		return errFrame(id, heraldpb.ErrorCode_INVALID_REQUEST, "bad batch: %v (count %d)", err, info.Count)
	}
	if req.GetHalf().GetProducerGroup() == "" {
		return errFrame(id, heraldpb.ErrorCode_INVALID_REQUEST, "a half message needs a producer_group")
	}
	if req.GetProducerId() != 0 {
		return errFrame(id, heraldpb.ErrorCode_INVALID_REQUEST, "a half message is not idempotent")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.topics[req.GetTopic()]
	if t == nil {
		return errFrame(id, heraldpb.ErrorCode_TOPIC_NOT_FOUND, "no topic %q", req.GetTopic())
	}
	part, ok := t.pick(req, info)
	if !ok {
		return errFrame(id, heraldpb.ErrorCode_PARTITION_NOT_FOUND, "no partition %d", req.GetPartition())
	}
	b.txn.next++
	h := &fakeHalf{
		HalfLog: HalfLog{ID: fmt.Sprintf("h%d-%d", b.node, b.txn.next), Conn: conn, Request: proto.Clone(req).(*heraldpb.ProduceRequest),
			Partition: part, State: "pending"},
		created: time.Now(),
		count:   info.Count,
	}
	if b.txn.byID == nil {
		b.txn.byID = map[string]*fakeHalf{}
	}
	b.txn.byID[h.ID] = h
	b.txn.halves = append(b.txn.halves, h)
	return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{
		Partition: part, BaseOffset: -1, Count: uint32(info.Count), HalfId: h.ID,
	}}}
}

// handleTxn handles EndHalf, RegisterProducer and ListTxn; false for
// other bodies.
func (s *session) handleTxn(f *heraldpb.Frame) bool {
	b := s.b
	id := f.GetId()
	switch body := f.GetBody().(type) {
	case *heraldpb.Frame_EndHalf:
		s.reply(b.endHalf(s.id, id, body.EndHalf))
	case *heraldpb.Frame_RegisterProducer:
		req := body.RegisterProducer
		b.mu.Lock()
		b.txn.regs = append(b.txn.regs, RegisterLog{Conn: s.id, Request: proto.Clone(req).(*heraldpb.RegisterProducerRequest)})
		if b.txn.producers == nil {
			b.txn.producers = map[string][]int{}
		}
		conns := slices.DeleteFunc(b.txn.producers[req.GetProducerGroup()], func(c int) bool { return c == s.id })
		if !req.GetUnregister() {
			conns = append(conns, s.id)
		}
		b.txn.producers[req.GetProducerGroup()] = conns
		pending := 0
		for _, h := range b.txn.halves {
			if h.State == "pending" && h.Request.GetHalf().GetProducerGroup() == req.GetProducerGroup() {
				pending++
			}
		}
		hb := uint32(b.txn.heartbeat / time.Millisecond)
		b.mu.Unlock()
		s.reply(&heraldpb.Frame{Id: id, Body: &heraldpb.Frame_RegisterProducerResponse{RegisterProducerResponse: &heraldpb.RegisterProducerResponse{
			HeartbeatMs: hb, Pending: uint32(pending),
		}}})
	case *heraldpb.Frame_ListTxn:
		if body.ListTxn.GetTransactions() {
			s.reply(b.listTxns(id, body.ListTxn))
			break
		}
		s.reply(b.listTxn(id, body.ListTxn))
	default:
		return false
	}
	return true
}

// endHalf commits or rolls back a half, as EndHalfRequest says.
func (b *Broker) endHalf(conn int, id uint64, req *heraldpb.EndHalfRequest) *heraldpb.Frame {
	b.mu.Lock()
	b.txn.ends = append(b.txn.ends, EndLog{Conn: conn, Request: proto.Clone(req).(*heraldpb.EndHalfRequest)})
	h := b.txn.byID[req.GetId()]
	switch {
	case req.GetAction() == heraldpb.HalfAction_HALF_UNKNOWN && !req.GetFromCheck():
		b.mu.Unlock()
		return errFrame(id, heraldpb.ErrorCode_INVALID_REQUEST, "unknown is only an answer to a check")
	case h == nil:
		b.mu.Unlock()
		return errFrame(id, heraldpb.ErrorCode_TXN_NOT_FOUND, "no half message %q", req.GetId())
	case h.State != "pending" && h.action == req.GetAction():
		b.mu.Unlock()
		return endResponse(id, h, -1, 0, true)
	case h.State != "pending":
		b.mu.Unlock()
		return errFrame(id, heraldpb.ErrorCode_TXN_NOT_FOUND, "half message %s was %s", h.ID, h.State)
	case req.GetAction() == heraldpb.HalfAction_HALF_UNKNOWN:
		b.mu.Unlock()
		return endResponse(id, h, -1, 0, false)
	case req.GetAction() == heraldpb.HalfAction_HALF_ROLLBACK:
		h.State, h.action = "rolled back", req.GetAction()
		b.mu.Unlock()
		return endResponse(id, h, -1, 0, false)
	}
	h.State, h.action = "committed", req.GetAction()
	hr := h.Request
	b.mu.Unlock()
	part := h.Partition
	f := b.produce(conn, id, &heraldpb.ProduceRequest{Topic: hr.GetTopic(), Partition: &part, Records: hr.GetRecords()})
	if f.GetError() != nil {
		return f
	}
	at := hr.GetDeliverAtMs()
	if d := hr.GetDelayMs(); d > 0 {
		at = time.Now().UnixMilli() + int64(d)
	}
	if at != 0 {
		return endResponse(id, h, -1, at, false)
	}
	return endResponse(id, h, f.GetProduceResponse().GetBaseOffset(), 0, false)
}

func endResponse(id uint64, h *fakeHalf, base, at int64, already bool) *heraldpb.Frame {
	return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_EndHalfResponse{EndHalfResponse: &heraldpb.EndHalfResponse{
		Topic: h.Request.GetTopic(), Partition: h.Partition, BaseOffset: base, DeliverAtMs: at, AlreadyEnded: already,
	}}}
}

// listTxn lists the pending halves of a group (or every group), or the
// one named.
func (b *Broker) listTxn(id uint64, req *heraldpb.ListTxnRequest) *heraldpb.Frame {
	b.mu.Lock()
	defer b.mu.Unlock()
	limit := int(req.GetLimit())
	if limit == 0 {
		limit = 100
	}
	resp := &heraldpb.ListTxnResponse{}
	for _, h := range b.txn.halves {
		o := h.Request.GetHalf()
		if h.State != "pending" || req.GetProducerGroup() != "" && o.GetProducerGroup() != req.GetProducerGroup() ||
			req.GetId() != "" && h.ID != req.GetId() {
			continue
		}
		resp.Total++
		if len(resp.Halves) == limit {
			continue
		}
		every := time.Duration(o.GetCheckIntervalMs()) * time.Millisecond
		if every == 0 {
			every = 6 * time.Second
		}
		resp.Halves = append(resp.Halves, &heraldpb.HalfInfo{
			Id: h.ID, ProducerGroup: o.GetProducerGroup(), Topic: h.Request.GetTopic(), Partition: h.Partition,
			CreatedMs: h.created.UnixMilli(), State: h.State, Checks: h.Checks, MaxChecks: maxChecks(o),
			NextCheckMs: h.created.Add(every << min(h.Checks, 3)).UnixMilli(), DeliverAtMs: h.Request.GetDeliverAtMs(),
			Count: uint32(h.count), Bytes: uint32(len(h.Request.GetRecords())),
		})
	}
	return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_ListTxnResponse{ListTxnResponse: resp}}
}

// dropProducerLocked forgets the registrations of a closed connection.
func (b *Broker) dropProducerLocked(conn int) {
	for g, conns := range b.txn.producers {
		b.txn.producers[g] = slices.DeleteFunc(conns, func(c int) bool { return c == conn })
	}
}
