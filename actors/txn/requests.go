package txn

// The coordinator's requests: store a half, end one, register a
// producer, list the pending halves.

import (
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"slices"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
)

func (c *Coordinator) onRequest(ctx actor.Context, f *heraldpb.Frame, to *actor.PID) {
	switch b := f.Body.(type) {
	case *heraldpb.Frame_Produce:
		if b.Produce.TransactionalId != "" {
			c.onTxnProduce(ctx, f, b.Produce, to)
			return
		}
		c.onHalf(ctx, f, b.Produce, to)
	case *heraldpb.Frame_EndHalf:
		c.onEnd(ctx, f, b.EndHalf, to)
	case *heraldpb.Frame_RegisterProducer:
		c.onRegister(ctx, f, b.RegisterProducer, to)
	case *heraldpb.Frame_ListTxn:
		if b.ListTxn.Transactions {
			c.onListTxns(ctx, f, b.ListTxn, to)
			return
		}
		c.onList(ctx, f, b.ListTxn, to)
	case *heraldpb.Frame_InitProducerId:
		c.onInit(ctx, f, b.InitProducerId, to)
	case *heraldpb.Frame_EndTxn:
		c.onEndTxn(ctx, f, b.EndTxn, to)
	case *heraldpb.Frame_Publish:
		c.onPublish(ctx, f, b.Publish, to)
	default:
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "the transaction coordinator does not handle %T", f.Body)))
	}
}

// onHalf stores a half message and answers with its id once durable.
func (c *Coordinator) onHalf(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.ProduceRequest, to *actor.PID) {
	now := c.o.Now()
	if len(c.halves) >= c.o.MaxPending {
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, throttledErr("too many half messages pending (the broker's --max-half-pending)")))
		return
	}
	if c.queued >= c.o.MaxQueued {
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, throttledErr("too many requests waiting for __txn")))
		return
	}
	at, part, n, e := c.checkHalf(req, c.o.Topics.Get(req.Topic), now, c.o.MaxDelay)
	if e != nil {
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, e))
		return
	}
	h := req.Half
	hs := &heraldpb.HalfStored{
		ProducerGroup: h.ProducerGroup, Topic: req.Topic, Partition: part, CreatedMs: now.UnixMilli(),
		DeliverAtMs: at, Count: uint32(n), Records: req.Records,
		CheckIntervalMs: h.CheckIntervalMs, MaxChecks: h.MaxChecks, OnExhausted: h.OnExhausted,
	}
	ev := &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Half{Half: hs}}
	c.write(writeOp{events: [][]byte{event(ev)}, client: true, done: func(base int64, e *heraldpb.Error) {
		if e != nil {
			respond(ctx, to, heraldpb.ErrorFrame(f.Id, e))
			return
		}
		ref := uint64(base)
		c.apply(ref, ev, c.defaults)
		hf := c.halves[ref]
		hf.nextCheck = hf.created + hf.interval.Milliseconds()
		c.checkQ.add(hf.nextCheck, ref)
		c.armChecks()
		mHalfStored.Inc()
		mHalfPending.Set(float64(len(c.halves)))
		respond(ctx, to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{
			Partition: part, BaseOffset: -1, Count: uint32(n), AppendTimeMs: hs.CreatedMs, DeliverAtMs: at, HalfId: FormatID(ref),
		}}})
	}})
	c.flushWrites(ctx)
}

// endBy names who ended a half, for the event and the metrics.
func endBy(req *heraldpb.EndHalfRequest) string {
	switch {
	case req.Manual:
		return "manual"
	case req.FromCheck:
		return "check"
	}
	return "producer"
}

// onEnd commits or rolls back a half (or notes a check's "unknown").
func (c *Coordinator) onEnd(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.EndHalfRequest, to *actor.PID) {
	if req.FromCheck {
		mCheckAnswers.WithLabelValues(actionName(req.Action)).Inc()
	}
	h, e, already := c.endTarget(req)
	if h != nil && req.FromCheck {
		h.release()
	}
	switch {
	case e != nil:
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, e))
		return
	case h == nil || already:
		resp := &heraldpb.EndHalfResponse{BaseOffset: -1, AlreadyEnded: true}
		if h != nil {
			resp.Topic, resp.Partition, resp.DeliverAtMs = h.topic, h.part, h.deliverAt
		}
		respond(ctx, to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_EndHalfResponse{EndHalfResponse: resp}})
		return
	case req.Action == heraldpb.HalfAction_HALF_UNKNOWN:
		respond(ctx, to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_EndHalfResponse{EndHalfResponse: &heraldpb.EndHalfResponse{
			Topic: h.topic, Partition: h.part, BaseOffset: -1, DeliverAtMs: h.deliverAt,
		}}})
		return
	}
	if c.queued >= c.o.MaxQueued {
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, throttledErr("too many requests waiting for __txn")))
		return
	}
	answer := func(base int64, e *heraldpb.Error) {
		if e != nil {
			respond(ctx, to, heraldpb.ErrorFrame(f.Id, e))
			return
		}
		respond(ctx, to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_EndHalfResponse{EndHalfResponse: &heraldpb.EndHalfResponse{
			Topic: h.topic, Partition: h.part, BaseOffset: base, DeliverAtMs: h.deliverAt,
		}}})
	}
	if req.Action == heraldpb.HalfAction_HALF_ROLLBACK {
		c.rollback(ctx, []*half{h}, endBy(req), answer)
		return
	}
	c.commit(ctx, h, endBy(req), answer)
}

func actionName(a heraldpb.HalfAction) string {
	switch a {
	case heraldpb.HalfAction_HALF_COMMIT:
		return "commit"
	case heraldpb.HalfAction_HALF_ROLLBACK:
		return "rollback"
	}
	return "unknown"
}

// rollback discards halves: once the rollback is durable they are gone.
// done (may be nil) gets -1 or the write's error.
func (c *Coordinator) rollback(ctx actor.Context, hs []*half, by string, done func(int64, *heraldpb.Error)) {
	refs := make([]uint64, 0, len(hs))
	for _, h := range hs {
		if h.ending || h.state == stateCommitted {
			continue // being ended, or committed: not rolled back
		}
		h.ending = true
		refs = append(refs, h.ref)
	}
	if len(refs) == 0 {
		if done != nil {
			done(-1, heraldpb.NewError(heraldpb.ErrorCode_TXN_NOT_FOUND, "the half message is being committed"))
		}
		return
	}
	ev := &heraldpb.TxnEvent{Event: &heraldpb.TxnEvent_Rollback{Rollback: &heraldpb.HalfRollback{Refs: refs, By: by}}}
	c.write(writeOp{events: [][]byte{event(ev)}, client: done != nil, done: func(_ int64, e *heraldpb.Error) {
		for _, h := range hs {
			h.ending = false
		}
		if e == nil {
			n := len(c.halves)
			c.apply(0, ev, c.defaults)
			mHalfEnded.WithLabelValues("rollback", by).Add(float64(n - len(c.halves)))
			mHalfPending.Set(float64(len(c.halves)))
		}
		if done != nil {
			done(-1, e)
		}
	}})
	c.flushWrites(ctx)
}

// onRegister records the sender's connection as a producer of a group.
func (c *Coordinator) onRegister(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.RegisterProducerRequest, to *actor.PID) {
	switch {
	case req.ProducerGroup == "":
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "register needs a producer_group")))
		return
	case len(req.ProducerGroup) > 255:
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "producer_group is %d bytes; at most 255", len(req.ProducerGroup))))
		return
	case to == nil:
		respond(ctx, to, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "register needs a connection")))
		return
	}
	if req.Unregister {
		c.producers.remove(to, req.ProducerGroup)
	} else {
		added, ok := c.producers.add(to, req.ProducerGroup, c.o.Now(), c.o.MaxProducers)
		if !ok {
			respond(ctx, to, heraldpb.ErrorFrame(f.Id, throttledErr("too many producer registrations")))
			return
		}
		if added {
			ctx.Watch(to)
		}
	}
	mProducers.Set(float64(c.producers.n))
	pending := 0
	for _, h := range c.halves {
		if h.group == req.ProducerGroup && h.state != stateCommitted {
			pending++
		}
	}
	respond(ctx, to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_RegisterProducerResponse{RegisterProducerResponse: &heraldpb.RegisterProducerResponse{
		HeartbeatMs: uint32(c.o.Heartbeat.Milliseconds()), Pending: uint32(pending),
	}}})
}

// onList lists the pending halves, oldest first.
func (c *Coordinator) onList(ctx actor.Context, f *heraldpb.Frame, req *heraldpb.ListTxnRequest, to *actor.PID) {
	if req.Id != "" {
		ref, ok := ParseID(req.Id)
		h := c.halves[ref]
		if req.ProducerGroup != "" && h != nil && h.group != req.ProducerGroup {
			// Another group's: as if unknown (the broker's ACLs checked
			// the group the request names).
			respond(ctx, to, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_TXN_NOT_FOUND, "half message %s is not pending in producer group %q", req.Id, req.ProducerGroup)))
			return
		}
		if !ok || h == nil {
			why := heraldpb.NewError(heraldpb.ErrorCode_TXN_NOT_FOUND, "half message %s is not pending", req.Id)
			if req.ProducerGroup != "" {
				respond(ctx, to, heraldpb.ErrorFrame(f.Id, why)) // how it ended is its group's to know
				return
			}
			if committed, ok := c.ended.outcome[ref]; ok && committed {
				why.Message += " (it was committed)"
			} else if ok {
				why.Message += " (it was rolled back)"
			}
			respond(ctx, to, heraldpb.ErrorFrame(f.Id, why))
			return
		}
		respond(ctx, to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListTxnResponse{ListTxnResponse: &heraldpb.ListTxnResponse{
			Halves: []*heraldpb.HalfInfo{h.info()}, Total: 1,
		}}})
		return
	}
	limit := int(req.Limit)
	if limit == 0 {
		limit = 100
	}
	limit = min(limit, 10000)
	var all []*half
	for _, h := range c.halves {
		if req.ProducerGroup == "" || h.group == req.ProducerGroup {
			all = append(all, h)
		}
	}
	slices.SortFunc(all, func(a, b *half) int { return cmp.Compare(a.ref, b.ref) })
	resp := &heraldpb.ListTxnResponse{Total: uint32(len(all))}
	for _, h := range all[:min(limit, len(all))] {
		resp.Halves = append(resp.Halves, h.info())
	}
	respond(ctx, to, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListTxnResponse{ListTxnResponse: resp}})
}

func randomToken() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 1
}
