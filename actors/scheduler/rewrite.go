package scheduler

// Compaction of __schedule: long-pending batches moved up the log so that its start can be cut.

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"github.com/heraldmq/herald/timewheel"
	"google.golang.org/protobuf/proto"
)

// Compaction removes the records of __schedule below the oldest pending
// batch. A batch pending for long (a timer days ahead) would hold back
// everything written after it; when the log is over RewriteBytes and the
// older half of it holds few pending batches, those that are not due soon
// are moved: each is written again at the log's end, with its original id,
// together with a cancel of its old record, in one append (so a crash
// leaves one copy or the other, never both), and the cut moves past them.

// rewriteMax bounds the batches moved in one pass; rewriteNotBefore keeps
// batches due soon in place (they fire before long anyway).
const (
	rewriteMax       = 65536
	rewriteNotBefore = 10 * time.Minute
)

// maybeRewrite starts moving the pending batches that pin __schedule's
// start at cut, when that is worth it.
func (s *Scheduler) maybeRewrite(ctx actor.Context, e *registry.Entry, cut int64) {
	if s.rewriteOn || s.pending.IsEmpty() || e.Stats[0].SizeBytes.Load() < s.o.RewriteBytes {
		return
	}
	refs, mid := s.toMove(cut, e.Stats[0].HighWatermark.Load())
	if len(refs) == 0 {
		return
	}
	s.rewriteOn = true
	for _, r := range refs {
		s.rewriting[r] = true
	}
	s.log.Info("moving long-pending delayed batches up __schedule so that it can be truncated", "batches", len(refs), "from", cut, "below", mid)
	s.rewriteRead(ctx, refs, map[uint64]*heraldpb.ScheduledBatch{})
}

// rewriteRead reads the batches to move, one fetch from the smallest not
// yet read at a time, then writes them.
func (s *Scheduler) rewriteRead(ctx actor.Context, refs []uint64, got map[uint64]*heraldpb.ScheduledBatch) {
	var next uint64
	found := false
	for _, r := range refs {
		if _, ok := got[r]; !ok {
			next, found = r, true
			break // refs ascend
		}
	}
	if !found {
		s.rewriteWrite(ctx, refs, got)
		return
	}
	s.call(ctx, s.sched, &heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
		Topic: ScheduleTopic, Offset: int64(next), MaxBytes: 1 << 20,
	}}}, func(f *heraldpb.Frame) {
		fr := f.GetFetchResponse()
		if fr == nil {
			s.log.Warn("reading batches to move; giving up this pass", "err", f.GetError().GetMessage())
			s.endRewrite(refs)
			return
		}
		want := map[uint64]bool{}
		for _, r := range refs {
			if _, ok := got[r]; !ok {
				want[r] = true
			}
		}
		for _, b := range fr.Batches {
			_ = heraldpb.ForEachRawRecord(b.Records, func(i int, rec []byte) bool {
				ref := uint64(b.BaseOffset + int64(i))
				if want[ref] {
					ev, _ := decodeEvent(rec)
					got[ref] = ev.GetSchedule() // nil: unreadable, left in place
				}
				return true
			})
		}
		if _, ok := got[next]; !ok {
			got[next] = nil // not reachable: left in place
		}
		s.rewriteRead(ctx, refs, got)
	})
}

// rewriteWrite writes each batch's copy and the cancel of its old record
// in one append each, and moves it in memory once that is durable.
func (s *Scheduler) rewriteWrite(ctx actor.Context, refs []uint64, got map[uint64]*heraldpb.ScheduledBatch) {
	waiting := 0
	soon := s.now().Add(rewriteNotBefore).UnixMilli()
	for _, old := range refs {
		sb := got[old]
		if sb == nil || sb.DeliverAtMs <= soon || !s.pending.Contains(old) {
			delete(s.rewriting, old)
			continue
		}
		cp := proto.Clone(sb).(*heraldpb.ScheduledBatch)
		if cp.Id == nil {
			cp.Id = proto.Uint64(old)
		}
		ev1, _ := proto.Marshal(&heraldpb.ScheduleEvent{Event: &heraldpb.ScheduleEvent_Schedule{Schedule: cp}})
		ev2, _ := proto.Marshal(&heraldpb.ScheduleEvent{Event: &heraldpb.ScheduleEvent_Cancel{Cancel: &heraldpb.ScheduleCancel{Ref: old}}})
		waiting++
		old, at, id := old, cp.DeliverAtMs, cp.GetId()
		s.write(ctx, writeOp{events: [][]byte{ev1, ev2}, done: func(base int64, e *heraldpb.Error) {
			delete(s.rewriting, old)
			if e == nil {
				ref := uint64(base)
				s.pending.Remove(old)
				s.forgetMoved(old)
				s.pending.Add(ref)
				s.wheel.Add(timewheel.Entry{At: at, Ref: ref})
				s.noteMoved(id, ref)
				mMoved.Inc()
			}
			waiting--
			if waiting == 0 {
				s.rewriteOn = false
			}
		}})
	}
	if waiting == 0 {
		s.rewriteOn = false
	}
	s.flushWrites(ctx)
	s.armTimer()
}

func (s *Scheduler) endRewrite(refs []uint64) {
	for _, r := range refs {
		delete(s.rewriting, r)
	}
	s.rewriteOn = false
}
