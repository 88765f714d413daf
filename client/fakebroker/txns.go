package fakebroker

// Transactions across partitions for the fake broker, as the broker's
// coordinator has them (actors/txn/txns.go): InitProducerId starts a
// session of a transactional id (aborting what the last one left open and
// fencing it), a transactional produce is staged (a retry with the same
// base sequence is answered duplicate), EndTxn appends every staged batch
// (commit) or drops them (abort) and moves to the next epoch, ListTxn
// with transactions lists the ids, and EndTxn with manual aborts what is
// open. A commit appends at once, under the broker's lock, so no fetch
// sees part of it; the records do not get the broker's herald-txn-*
// headers. Transactional produces show in Produced as staged (a retry
// with Duplicate); the appends of a commit do not. The fake has no timeout timer: TimeOutTxn aborts a transaction
// as the broker's timeout does.

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

type fakeTxnID struct {
	id      string
	pid     uint64
	session uint32 // the session's first epoch: older ones are fenced
	epoch   uint32
	timeout time.Duration
	staged  []fakeStaged
	nextSeq int64
	started time.Time // first staged batch; zero: no transaction open
	bytes   uint64

	hasLast    bool
	lastEpoch  uint32
	lastCommit bool
	lastBy     string
}

type fakeStaged struct {
	topic   string
	part    uint32
	seq     int64
	count   int
	records []byte
}

// TxnInfo describes a transactional id the fake knows.
type TxnInfo struct {
	ProducerID uint64
	Epoch      uint32
	Open       bool // a transaction has staged records
	Records    int  // staged
}

// Txn returns what the fake knows of transactional id, and whether it
// knows it.
func (b *Broker) Txn(id string) (TxnInfo, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.txn.ids[id]
	if m == nil {
		return TxnInfo{}, false
	}
	return TxnInfo{ProducerID: m.pid, Epoch: m.epoch, Open: !m.started.IsZero(), Records: m.records()}, true
}

// TimeOutTxn aborts the open transaction of id as the broker does when it
// stays open past its timeout: its producer's next request of that epoch
// fails with TXN_TIMED_OUT. It reports whether one was open.
func (b *Broker) TimeOutTxn(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.txn.ids[id]
	if m == nil || m.started.IsZero() {
		return false
	}
	m.end(false, "timeout")
	return true
}

func (m *fakeTxnID) records() int {
	n := 0
	for _, s := range m.staged {
		n += s.count
	}
	return n
}

func (m *fakeTxnID) partitions() []string {
	var out []string
	for _, s := range m.staged {
		tp := fmt.Sprintf("%s/%d", s.topic, s.part)
		if !slices.Contains(out, tp) {
			out = append(out, tp)
		}
	}
	slices.Sort(out)
	return out
}

// end closes the current transaction and moves to the next epoch.
func (m *fakeTxnID) end(commit bool, by string) {
	m.hasLast, m.lastEpoch, m.lastCommit, m.lastBy = true, m.epoch, commit, by
	m.epoch++
	m.staged, m.nextSeq, m.started, m.bytes = nil, 0, time.Time{}, 0
}

// checkEpoch is the broker's txnMeta.checkEpoch.
func (m *fakeTxnID) checkEpoch(id uint64, pid uint64, epoch uint32) (f *heraldpb.Frame, ended bool) {
	switch {
	case pid != m.pid || epoch < m.session:
		return errFrame(id, heraldpb.ErrorCode_PRODUCER_FENCED, "transactional id %q: producer %d epoch %d is fenced by a newer session (producer %d, epoch %d)", m.id, pid, epoch, m.pid, m.session), false
	case epoch > m.epoch:
		return errFrame(id, heraldpb.ErrorCode_INVALID_TXN_STATE, "transactional id %q: epoch %d is ahead of the coordinator's %d", m.id, epoch, m.epoch), false
	case epoch < m.epoch:
		if m.hasLast && m.lastEpoch == epoch {
			if m.lastBy == "timeout" {
				return errFrame(id, heraldpb.ErrorCode_TXN_TIMED_OUT, "transactional id %q: the transaction of epoch %d was aborted after its timeout of %v", m.id, epoch, m.timeout), true
			}
			return nil, true
		}
		return errFrame(id, heraldpb.ErrorCode_INVALID_TXN_STATE, "transactional id %q: the transaction of epoch %d ended; the current epoch is %d", m.id, epoch, m.epoch), false
	}
	return nil, false
}

// initProducerID starts a new session of a transactional id.
func (b *Broker) initProducerID(id uint64, req *heraldpb.InitProducerIdRequest) *heraldpb.Frame {
	tid := req.GetTransactionalId()
	if tid == "" || len(tid) > 255 {
		return errFrame(id, heraldpb.ErrorCode_INVALID_REQUEST, "transactional_id must be 1 to 255 bytes, not %d", len(tid))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.txn.ids == nil {
		b.txn.ids = map[string]*fakeTxnID{}
	}
	m := b.txn.ids[tid]
	if m == nil {
		b.txn.next++
		m = &fakeTxnID{id: tid, pid: uint64(1000 + b.txn.next)}
		b.txn.ids[tid] = m
	} else {
		if !m.started.IsZero() {
			m.end(false, "fenced")
		}
		m.epoch++
	}
	m.session = m.epoch
	m.timeout = time.Duration(req.GetTransactionTimeoutMs()) * time.Millisecond
	if m.timeout == 0 {
		m.timeout = time.Minute
	}
	return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_InitProducerIdResponse{InitProducerIdResponse: &heraldpb.InitProducerIdResponse{
		ProducerId: m.pid, ProducerEpoch: m.epoch,
	}}}
}

// produceTxn stages a transactional produce.
func (b *Broker) produceTxn(conn int, id uint64, req *heraldpb.ProduceRequest) *heraldpb.Frame {
	info, err := heraldpb.ScanBatch(req.GetRecords())
	if err != nil || info.Count == 0 {
		return errFrame(id, heraldpb.ErrorCode_INVALID_REQUEST, "bad batch: %v (count %d)", err, info.Count)
	}
	if req.GetAcks() != heraldpb.Acks_ACKS_ALL || req.GetDelayMs() != 0 || req.GetDeliverAtMs() != 0 || req.GetBaseSequence() < 0 {
		return errFrame(id, heraldpb.ErrorCode_INVALID_REQUEST, "a transactional produce needs acks=all, no delay and a base_sequence")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.txn.ids[req.GetTransactionalId()]
	if m == nil {
		return errFrame(id, heraldpb.ErrorCode_INVALID_TXN_STATE, "transactional id %q has no session: call InitProducerId first", req.GetTransactionalId())
	}
	if f, ended := m.checkEpoch(id, req.GetProducerId(), req.GetProducerEpoch()); f != nil || ended {
		if f == nil && req.GetCommitTxn() && m.lastCommit {
			return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{
				BaseOffset: -1, Count: uint32(info.Count), Duplicate: true,
				TxnEnd: &heraldpb.EndTxnResponse{NextEpoch: m.epoch, AlreadyEnded: true},
			}}}
		}
		if f == nil {
			f = errFrame(id, heraldpb.ErrorCode_INVALID_TXN_STATE, "transactional id %q: the transaction of epoch %d has ended", m.id, req.GetProducerEpoch())
		}
		return f
	}
	f := b.stageLocked(conn, id, m, req, info)
	if pr := f.GetProduceResponse(); pr != nil && req.GetCommitTxn() {
		// Staged (or staged before): the commit, as EndTxn.
		recs, parts := m.records(), m.partitions()
		b.endLocked(m, true)
		pr.TxnEnd = &heraldpb.EndTxnResponse{NextEpoch: m.epoch, Records: uint32(recs), Partitions: parts}
	}
	return f
}

// stageLocked stages a transactional batch of m.
func (b *Broker) stageLocked(conn int, id uint64, m *fakeTxnID, req *heraldpb.ProduceRequest, info heraldpb.BatchInfo) *heraldpb.Frame {
	t := b.topics[req.GetTopic()]
	if t == nil {
		return errFrame(id, heraldpb.ErrorCode_TOPIC_NOT_FOUND, "no topic %q", req.GetTopic())
	}
	part, ok := t.pick(req, info)
	if !ok {
		return errFrame(id, heraldpb.ErrorCode_PARTITION_NOT_FOUND, "no partition %d", req.GetPartition())
	}
	seq := req.GetBaseSequence()
	b.produced = append(b.produced, ProduceLog{Conn: conn, Topic: req.GetTopic(), Partition: part, Explicit: req.Partition != nil, Count: info.Count,
		Records: append([]byte(nil), req.GetRecords()...), ProducerID: req.GetProducerId(), BaseSequence: seq})
	switch {
	case seq < m.nextSeq:
		for _, s := range m.staged {
			if s.seq == seq && s.count == info.Count {
				b.produced[len(b.produced)-1].Duplicate = true
				return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{
					Partition: s.part, BaseOffset: -1, Count: uint32(s.count), Duplicate: true,
				}}}
			}
		}
		return errFrame(id, heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE, "transactional id %q: sequence %d overlaps the staged records (next %d)", m.id, seq, m.nextSeq)
	case seq > m.nextSeq:
		return errFrame(id, heraldpb.ErrorCode_OUT_OF_ORDER_SEQUENCE, "transactional id %q: sequence %d, expected %d", m.id, seq, m.nextSeq)
	}
	if m.started.IsZero() {
		m.started = time.Now()
	}
	m.staged = append(m.staged, fakeStaged{topic: req.GetTopic(), part: part, seq: seq, count: info.Count, records: append([]byte(nil), req.GetRecords()...)})
	m.nextSeq = seq + int64(info.Count)
	m.bytes += uint64(len(req.GetRecords()))
	return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{
		Partition: part, BaseOffset: -1, Count: uint32(info.Count), AppendTimeMs: time.Now().UnixMilli(),
	}}}
}

// endTxn commits or aborts a transaction (or, manual, aborts whatever is
// open).
func (b *Broker) endTxn(id uint64, req *heraldpb.EndTxnRequest) *heraldpb.Frame {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.txn.ids[req.GetTransactionalId()]
	if m == nil {
		return errFrame(id, heraldpb.ErrorCode_TXN_NOT_FOUND, "transactional id %q is not known", req.GetTransactionalId())
	}
	answer := func(already bool, recs int, parts []string) *heraldpb.Frame {
		return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_EndTxnResponse{EndTxnResponse: &heraldpb.EndTxnResponse{
			NextEpoch: m.epoch, Records: uint32(recs), Partitions: parts, AlreadyEnded: already,
		}}}
	}
	recs, parts := m.records(), m.partitions()
	if req.GetManual() {
		if m.started.IsZero() {
			return errFrame(id, heraldpb.ErrorCode_TXN_NOT_FOUND, "transactional id %q has no transaction open", m.id)
		}
		m.end(false, "manual")
		return answer(false, recs, parts)
	}
	f, ended := m.checkEpoch(id, req.GetProducerId(), req.GetProducerEpoch())
	switch {
	case f != nil:
		return f
	case ended && m.lastCommit != req.GetCommit():
		return errFrame(id, heraldpb.ErrorCode_INVALID_TXN_STATE, "transactional id %q: the transaction of epoch %d was already %s", m.id, req.GetProducerEpoch(),
			map[bool]string{true: "committed", false: "aborted"}[m.lastCommit])
	case ended:
		return answer(true, 0, nil)
	}
	b.endLocked(m, req.GetCommit())
	return answer(false, recs, parts)
}

// endLocked commits (appending every staged batch) or aborts m's
// transaction.
func (b *Broker) endLocked(m *fakeTxnID, commit bool) {
	if commit {
		for _, s := range m.staged {
			if t := b.topics[s.topic]; t != nil && int(s.part) < len(t.parts) {
				b.appendLocked(t.parts[s.part], s.records, s.count)
			}
		}
	}
	m.end(commit, "producer")
}

// listTxns lists the transactional ids (one, with req.id), open ones
// first.
func (b *Broker) listTxns(id uint64, req *heraldpb.ListTxnRequest) *heraldpb.Frame {
	b.mu.Lock()
	defer b.mu.Unlock()
	var all []*fakeTxnID
	for _, m := range b.txn.ids {
		if req.GetId() == "" || m.id == req.GetId() {
			all = append(all, m)
		}
	}
	if req.GetId() != "" && len(all) == 0 {
		return errFrame(id, heraldpb.ErrorCode_TXN_NOT_FOUND, "transactional id %q is not known", req.GetId())
	}
	open := func(m *fakeTxnID) int {
		if m.started.IsZero() {
			return 0
		}
		return 1
	}
	slices.SortFunc(all, func(x, y *fakeTxnID) int {
		return cmp.Or(cmp.Compare(open(y), open(x)), x.started.Compare(y.started), cmp.Compare(x.id, y.id))
	})
	limit := int(req.GetLimit())
	if limit == 0 {
		limit = 100
	}
	resp := &heraldpb.ListTxnResponse{Total: uint32(len(all))}
	for _, m := range all[:min(limit, len(all))] {
		ti := &heraldpb.TxnInfo{TransactionalId: m.id, ProducerId: m.pid, ProducerEpoch: m.epoch, State: "empty",
			Partitions: m.partitions(), Records: uint32(m.records()), Bytes: m.bytes, TimeoutMs: uint32(m.timeout / time.Millisecond)}
		if !m.started.IsZero() {
			ti.State, ti.StartedMs = "open", m.started.UnixMilli()
		}
		resp.Transactions = append(resp.Transactions, ti)
	}
	return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_ListTxnResponse{ListTxnResponse: resp}}
}
