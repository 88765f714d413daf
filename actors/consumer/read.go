package consumer

// Reading the log for a group: fetches of its partitions, filtering, TTL, and offering records to the subscription.

import (
	"math"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/filter"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// pump starts a read of every partition, for every view with a live
// member, that has room and no read outstanding.
func (c *coordinator) pump(ctx actor.Context) {
	l := c.live
	if l == nil {
		return
	}
	for _, v := range l.sub.Views() {
		if v != "" && l.members[v] == nil {
			continue // a broadcast member that left: its view waits
		}
		for p := range l.entry.Partitions {
			k := fetchKey{view: v, part: uint32(p)}
			if l.spill[k] != nil {
				// Offered as room frees (dispatch); meanwhile higher
				// priorities further on may jump the queue.
				c.pumpAhead(ctx, v, uint32(p))
				continue
			}
			if l.fetching[k] {
				continue
			}
			off, room := l.sub.ReadFrom(v, uint32(p))
			if room == 0 {
				c.pumpAhead(ctx, v, uint32(p))
				continue
			}
			var wait uint32
			if off >= c.partitionStats(l.entry, p).HighWatermark.Load() {
				wait = uint32(c.o.FetchWait / time.Millisecond)
			}
			id := c.id()
			c.fetchByID[id] = k
			l.fetching[k] = true
			ctx.Request(c.partitionPID(l.entry, p), &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
				Topic: l.topic, Partition: uint32(p), Offset: off, MaxBytes: uint32(c.o.FetchMaxBytes), MaxWaitMs: wait,
			}}})
		}
	}
}

func (c *coordinator) onFetched(ctx actor.Context, id uint64, resp *heraldpb.FetchResponse, ferr *heraldpb.Error) {
	k, ok := c.fetchByID[id]
	delete(c.fetchByID, id)
	l := c.live
	if !ok || l == nil {
		return
	}
	delete(l.fetching, k)
	if k.level > 0 {
		c.onAheadFetched(ctx, k, resp, ferr)
		return
	}
	if ferr != nil {
		switch ferr.Code {
		case heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE:
			// Retention removed records below the position (they can never
			// be delivered): skip to the log start. A position above the
			// end of the replica read is never moved back: that replica
			// lags, or is reopening or rebuilding after a storage failure
			// or damage (its high watermark drops for a while), and moving
			// the position back made the group deliver again everything it
			// had acked (the chaos suite's disk-full and disk-faults runs:
			// acked progress 738 went to 0, 3244 to 489). A topic made
			// again under the name ends the subscription instead.
			st := c.partitionStats(l.entry, int(k.part))
			start := st.StartOffset.Load()
			off, _ := l.sub.ReadFrom(k.view, k.part)
			to := off
			if off < start {
				c.log.Warn("records removed by retention before the group consumed them", "partition", k.part, "from", off, "to", start)
				to = start
			}
			if to != off {
				l.sub.Seek(k.view, k.part, to)
				l.held(k.view, k.part).trim(to)
				delete(l.spill, k)
				c.markDirty(k.view)
				c.checkRevocations(ctx)
			}
			c.armPump(10 * time.Millisecond)
		default:
			c.armPump(time.Duration(max(ferr.RetryAfterMs, 100)) * time.Millisecond)
		}
		return
	}
	off, _ := l.sub.ReadFrom(k.view, k.part)
	msgs, recs, filtered := c.messages(k, resp, off)
	c.offer(k, msgs, recs)
	if filtered > 0 {
		mFiltered.WithLabelValues(c.group).Add(float64(filtered))
		c.markDirty(k.view)
	}
	c.dispatch(ctx)
	c.pump(ctx)
}

// messages turns the records a fetch read for view k.view's partition
// k.part, from offset off on, into the subscription's messages (filtered
// ones marked Skip, counted in filtered) and the records to hold for
// delivery.
func (c *coordinator) messages(k fetchKey, resp *heraldpb.FetchResponse, off int64) (msgs []Message, recs []held, filtered int) {
	l := c.live
	prog := l.sub.Progress(k.view, k.part)
	total := 0
	for _, b := range resp.Batches {
		total += int(b.Count)
	}
	msgs = make([]Message, 0, total)
	recs = make([]held, 0, total)
	topicTTL := l.entry.Config.GetMessageTtlMs()
	for _, b := range resp.Batches {
		err := heraldpb.ForEachRawRecord(b.Records, func(i int, rec []byte) bool {
			o := b.BaseOffset + int64(i)
			if o < off {
				return true
			}
			m := Message{Partition: k.part, Offset: o, Expires: expiresAt(b.AppendTimeMs, heraldpb.RecordTTL(rec), topicTTL),
				Priority: heraldpb.RecordPriority(rec)}
			if l.mode == KeyShared {
				m.Key = string(heraldpb.RecordKey(rec))
			}
			if l.filt != nil && !prog.Done(o) {
				var r heraldpb.Record
				if proto.Unmarshal(rec, &r) == nil && !l.filt.Match(filter.FromProto(&r)) {
					m.Skip = true
					filtered++
				}
			}
			msgs = append(msgs, m)
			recs = append(recs, held{rec: rec, appendMs: b.AppendTimeMs})
			return true
		})
		if err != nil {
			c.log.Error("unreadable batch in log", "partition", k.part, "offset", b.BaseOffset, "err", err)
			break
		}
	}
	return msgs, recs, filtered
}

// pumpAhead starts, for view v's partition p whose ordered read is stalled,
// a read of the highest priority sub-queue with records past the read
// position, if the view has room for messages offered ahead and no such
// read is outstanding.
func (c *coordinator) pumpAhead(ctx actor.Context, v MemberID, p uint32) {
	l := c.live
	if l.orderly {
		return
	}
	busy := fetchKey{view: v, part: p, level: Priorities}
	if l.fetching[busy] {
		return
	}
	st := c.partitionStats(l.entry, int(p))
	for lv := Priorities - 1; lv >= 1; lv-- {
		end := st.PriorityEnd[lv].Load()
		if end == 0 {
			continue
		}
		from, to, room := l.sub.ReadAhead(v, p, lv)
		if room == 0 || from >= end {
			continue
		}
		id := c.id()
		c.fetchByID[id] = fetchKey{view: v, part: p, level: uint8(lv)}
		l.fetching[busy] = true
		ctx.Request(c.partitionPID(l.entry, int(p)), &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
			Topic: l.topic, Partition: p, Offset: from, MaxBytes: uint32(c.o.FetchMaxBytes),
			Priority: uint32(lv), EndOffset: min(to, end),
		}}})
		return
	}
}

// onAheadFetched offers what a sub-queue read found.
func (c *coordinator) onAheadFetched(ctx actor.Context, k fetchKey, resp *heraldpb.FetchResponse, ferr *heraldpb.Error) {
	l := c.live
	delete(l.fetching, fetchKey{view: k.view, part: k.part, level: Priorities})
	if ferr != nil {
		// The ordered read deals with retention; this read tries again.
		c.armPump(time.Duration(max(ferr.RetryAfterMs, 100)) * time.Millisecond)
		return
	}
	from, _, _ := l.sub.ReadAhead(k.view, k.part, int(k.level))
	msgs, recs, _ := c.messages(k, resp, from)
	took := l.sub.AppendAhead(k.view, k.part, int(k.level), msgs, resp.NextOffset)
	hl := l.held(k.view, k.part)
	for _, i := range took {
		hl.put(msgs[i].Offset, recs[i])
	}
	if len(took) > 0 {
		mAhead.WithLabelValues(c.group).Add(float64(len(took)))
	}
	c.dispatch(ctx)
	c.pump(ctx)
}

// expiresAt is when a record appended at appendMs expires (Unix ms; 0 =
// never): its own ttl_ms wins over its topic's message_ttl_ms.
func expiresAt(appendMs, recordTTL, topicTTL int64) int64 {
	ttl := recordTTL
	if ttl <= 0 {
		ttl = topicTTL
	}
	if ttl <= 0 {
		return 0
	}
	if appendMs > math.MaxInt64-ttl {
		return 0 // beyond any clock: never
	}
	return max(appendMs+ttl, 1)
}

// offer appends read records to the subscription as far as it has room,
// holding the records of messages to deliver, and spills the rest.
func (c *coordinator) offer(k fetchKey, msgs []Message, recs []held) {
	l := c.live
	prog := l.sub.Progress(k.view, k.part)
	n := l.sub.Append(k.view, msgs...)
	hl := l.held(k.view, k.part)
	for i, m := range msgs[:n] {
		if !m.Skip && !prog.Done(m.Offset) {
			hl.put(m.Offset, recs[i])
		}
	}
	if n < len(msgs) {
		l.spill[k] = &spilled{msgs: msgs[n:], recs: recs[n:]}
	} else {
		delete(l.spill, k)
	}
}

func (c *coordinator) armPump(d time.Duration) {
	if !c.pumpArmed {
		c.pumpArmed = true
		c.after(d, &pumpMsg{})
	}
}
