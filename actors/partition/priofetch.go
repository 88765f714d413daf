package partition

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/encoding/protowire"
)

// MaxPriorityFetch bounds the records one priority fetch returns.
const MaxPriorityFetch = 256

// openPrio loads the saved priority index for the log just opened and
// starts the catch-up read of the records it lacks.
func (a *Actor) openPrio() {
	a.stopCatchUp()
	start := a.store.StartOffset()
	if err := a.prio.load(a.cfg.IndexPath, start, a.hw); err != nil {
		a.log.Warn("priority index file unusable; rebuilding the index from the log", "path", a.cfg.IndexPath, "err", err)
	}
	a.prioThrough = a.prio.gapLo
	a.publishPrio()
	if a.prio.complete() {
		return
	}
	stop, ack := make(chan struct{}), make(chan struct{}, 1)
	a.prioStop, a.prioAck = stop, ack
	a.prioRun++
	store, from, to, gen, run, sys, self := a.store, a.prio.gapLo, a.prio.gapHi, a.gen, a.prioRun, a.sys, a.self
	a.log.Info("indexing priorities of the log", "from", from, "to", to)
	go catchUp(store, from, to, func(c prioChunk) bool {
		c.gen, c.run = gen, run
		sys.Root.Send(self, c)
		select {
		case <-ack:
			return c.err == nil
		case <-stop:
			return false
		}
	})
}

func (a *Actor) stopCatchUp() {
	if a.prioStop != nil {
		close(a.prioStop)
		a.prioStop, a.prioAck = nil, nil
	}
}

// onPrioChunk indexes one step of the catch-up read.
func (a *Actor) onPrioChunk(c prioChunk) {
	if c.gen != a.gen || c.run != a.prioRun || a.prioAck == nil || a.store == nil {
		// From before a reopen, or a snapshot install (same log, new
		// catch-up): its offsets may lie past the new gap's start.
		return
	}
	ack := a.prioAck
	defer func() { ack <- struct{}{} }()
	if c.err != nil {
		// The gap stays open (groups keep offset order); the next open
		// tries again.
		a.log.Error("indexing priorities of the log failed", "at", a.prio.gapLo, "err", c.err)
		return
	}
	start := a.store.StartOffset()
	for i, o := range c.offs {
		if o >= start && o >= a.prio.gapLo && o < a.prio.gapHi {
			a.prio.put(c.levels[i], o)
		}
	}
	a.prio.gapLo = max(a.prio.gapLo, min(c.upTo, a.prio.gapHi))
	if a.prio.complete() {
		a.log.Info("priorities of the log indexed", "through", a.prio.gapHi)
		a.prio.dirty = true
		a.stopCatchUp()
		a.publishPrio()
	}
}

// publishPrio copies the sub-queue ends into Stats.
func (a *Actor) publishPrio() {
	// Held records (hold.go) are not readable yet: a sub-queue ends, for
	// readers, at the readable end at most.
	end := a.readable()
	for l := 1; l < Levels; l++ {
		a.stats.PriorityEnd[l].Store(min(a.prio.end(l), end))
	}
}

// savePrio saves the index when it changed or the log grew since the last
// save: at once (the actor is stopping) or on a goroutine of its own.
func (a *Actor) savePrio(now bool) {
	a.prio.lastSave = a.ticks
	if a.cfg.IndexPath == "" || a.prio.saving || !a.prio.complete() || (!a.prio.dirty && a.prioThrough == a.hw) {
		return
	}
	through := a.hw
	data, err := a.prio.encode(through)
	if err != nil {
		a.log.Error("encoding the priority index", "err", err)
		return
	}
	a.prio.dirty, a.prioThrough = false, through
	if now {
		if err := replaceFile(a.cfg.IndexPath, data); err != nil {
			a.log.Warn("saving the priority index", "err", err)
		}
		return
	}
	a.prio.saving = true
	path, gen, sys, self := a.cfg.IndexPath, a.gen, a.sys, a.self
	go func() { sys.Root.Send(self, prioSaved{gen: gen, err: replaceFile(path, data)}) }()
}

func (a *Actor) onPrioSaved(m prioSaved) {
	a.prio.saving = false
	if m.err != nil {
		a.log.Warn("saving the priority index", "err", m.err)
		a.prio.dirty = true
	}
}

// onPriorityFetch answers a fetch of one priority sub-queue: the records of
// that level from the request's offset, each as a batch of one, and where
// the next read of the level starts.
func (a *Actor) onPriorityFetch(ctx actor.Context, id uint64, req *heraldpb.FetchRequest, replyTo *actor.PID, start int64, maxBytes int) {
	if req.Priority > heraldpb.MaxPriority {
		a.reply(ctx, replyTo, heraldpb.ErrorFrame(id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST,
			"priority %d is above %d", req.Priority, heraldpb.MaxPriority)))
		return
	}
	end := req.EndOffset
	if readable := a.readable(); end <= 0 || end > readable {
		end = readable
	}
	offs, next := a.prio.query(int(req.Priority), max(req.Offset, start), end, MaxPriorityFetch)
	resp := &heraldpb.FetchResponse{Partition: a.cfg.Partition, HighWatermark: a.readable(), LogStartOffset: start, NextOffset: next}
	if len(offs) == 0 || a.win.covers(offs[0]) {
		// The window holds every offset from its start to the end.
		resp.Batches, resp.NextOffset = pickRecords(offs, next, maxBytes, func(o int64) []*heraldpb.StoredBatch { return a.win.read(o, 1) })
		a.answerPriority(ctx, replyTo, id, resp)
		return
	}
	err := a.cfg.Readers.Submit(readJob{
		store: a.store, replyTo: replyTo, frameID: id, part: a.cfg.Partition,
		maxBytes: maxBytes, hw: a.readable(), start: start, offsets: offs, next: next, done: a.countFetched(),
	})
	if err != nil {
		e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "log readers are busy")
		e.RetryAfterMs = uint32(a.cfg.ThrottleRetryAfter / time.Millisecond)
		a.m.throttled.Inc()
		a.reply(ctx, replyTo, heraldpb.ErrorFrame(id, e))
	}
}

func (a *Actor) answerPriority(ctx actor.Context, replyTo *actor.PID, id uint64, resp *heraldpb.FetchResponse) {
	bytes := 0
	for _, b := range resp.Batches {
		bytes += len(b.Records)
	}
	countFetch(a.m, a.stats, len(resp.Batches), bytes)
	a.reply(ctx, replyTo, &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_FetchResponse{FetchResponse: resp}})
}

// pickRecords returns the records at offs as batches of one, read through
// read (the batches from the one holding an offset on), up to maxBytes (at
// least one record), and where the next read starts: next when all fit,
// else the first offset left out. An offset read cannot find (removed
// meanwhile) is skipped.
func pickRecords(offs []int64, next int64, maxBytes int, read func(off int64) []*heraldpb.StoredBatch) ([]*heraldpb.StoredBatch, int64) {
	var (
		out  []*heraldpb.StoredBatch
		have []*heraldpb.StoredBatch // the batches of the last read
		size int
	)
	for i, o := range offs {
		b := batchHolding(have, o)
		if b == nil {
			have = read(o)
			if b = batchHolding(have, o); b == nil {
				continue
			}
		}
		rec := recordAt(b, o)
		if rec == nil {
			continue
		}
		if len(out) > 0 && size+len(rec) > maxBytes {
			return out, offs[i]
		}
		size += len(rec)
		one := protowire.AppendTag(nil, 1, protowire.BytesType)
		one = protowire.AppendBytes(one, rec)
		out = append(out, &heraldpb.StoredBatch{BaseOffset: o, Count: 1, AppendTimeMs: b.AppendTimeMs, Records: one})
	}
	return out, next
}

func batchHolding(bs []*heraldpb.StoredBatch, o int64) *heraldpb.StoredBatch {
	for _, b := range bs {
		if o >= b.BaseOffset && o < b.BaseOffset+int64(b.Count) {
			return b
		}
	}
	return nil
}

// recordAt is the encoded record at offset o of batch b, or nil.
func recordAt(b *heraldpb.StoredBatch, o int64) []byte {
	var rec []byte
	want := int(o - b.BaseOffset)
	_ = heraldpb.ForEachRawRecord(b.Records, func(i int, r []byte) bool {
		if i == want {
			rec = r
			return false
		}
		return true
	})
	return rec
}
