package partition

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3/raftpb"
)

// Held batches: a batch appended with ProduceRequest.not_before_ms is
// committed (durable, on a majority) at once but readable only from that
// time on, and so is everything appended after it: the readable end of
// the log (the high watermark readers see) stops at the first held
// batch. The scheduler appends due messages a little ahead of their time
// this way, so that the commit's latency is spent before the time rather
// than after it, and a message still never becomes readable early.
//
// Every replica holds the same batches (the time is in the entry). The
// leader caps the time at MaxHold after it takes the batch, and stamps
// the batch's append time with it (the batch counts as appended when it
// becomes readable), so a wrong clock or a bad request never holds a
// partition for longer.

// MaxHold bounds how long a batch is held after its append (the default
// of Config.MaxHold).
const MaxHold = time.Second

// maxHolds bounds the held batches tracked one by one; past it, a batch
// joins the last hold (held until the later of the two times), whose
// producers are answered when it ends, up to maxHeldAnswers of them (the
// others at once).
const (
	maxHolds       = 4096
	maxHeldAnswers = 4096
)

// hold is a run of batches from base on that become readable at until
// (Unix ms), with the producers waiting for that.
type hold struct {
	base      int64
	until     int64
	committed int64 // when it was applied (Unix µs)
	answers   []heldAnswer
}

// heldAnswer is a committed proposal's answer, sent when its batch
// becomes readable.
type heldAnswer struct {
	p    proposal
	base int64
}

// heldDue wakes the actor when the first hold may end.
type heldDue struct{ gen uint64 }

// readable is the end of what readers may read: the high watermark, or
// the first held batch whose time has not come. A hold whose time has
// come is readable at once, before the timer that ends it (and wakes the
// long polls waiting for it) gets through on a busy node.
func (a *Actor) readable() int64 {
	if len(a.holds) == 0 {
		return a.hw
	}
	now := a.cfg.Clock.Now().UnixMilli()
	for _, h := range a.holds {
		if h.until > now {
			return h.base
		}
	}
	return a.hw
}

// holdUntil is when an applied entry with header h becomes readable
// (0: now): its time, but at most MaxHold from now on this replica's
// clock (the leader capped it on its own; a replica whose clock is
// behind the leader's must not hold it for longer).
func (a *Actor) holdUntil(h heraldpb.LogEntryHeader, nowMs int64) int64 {
	if h.NotBeforeMs == 0 {
		return 0
	}
	until := min(h.NotBeforeMs, nowMs+a.cfg.MaxHold.Milliseconds())
	if until <= nowMs {
		return 0 // (behind a hold, it becomes readable with that one)
	}
	return until
}

// addHold holds the batch at base until until; p, when set, is answered
// then.
func (a *Actor) addHold(ctx actor.Context, base, until int64, p *proposal) {
	if n := len(a.holds); n >= maxHolds {
		last := &a.holds[n-1]
		last.until = max(last.until, until)
		if p != nil && len(last.answers) < maxHeldAnswers {
			last.answers = append(last.answers, heldAnswer{p: *p, base: base})
		} else if p != nil {
			// Committed, and held like the others; its producer hears it now.
			a.answerHolds(ctx, []hold{{base: base, until: 0, committed: a.cfg.Clock.Now().UnixMicro(), answers: []heldAnswer{{p: *p, base: base}}}})
		}
	} else {
		h := hold{base: base, until: until, committed: a.cfg.Clock.Now().UnixMicro()}
		if p != nil {
			h.answers = []heldAnswer{{p: *p, base: base}}
		}
		a.holds = append(a.holds, h)
	}
	a.m.held.Set(float64(len(a.holds)))
	a.armHold()
}

// releaseHolds makes readable the batches whose time has come, answers
// their producers, and serves the long polls they satisfy.
func (a *Actor) releaseHolds(ctx actor.Context) {
	if len(a.holds) == 0 {
		return
	}
	now := a.cfg.Clock.Now()
	nowMs := now.UnixMilli()
	n := 0
	for n < len(a.holds) && a.holds[n].until <= nowMs {
		n++
	}
	if n == 0 {
		a.armHold()
		return
	}
	nowUs := now.UnixMicro()
	for _, h := range a.holds[:n] {
		holdReleaseLateness.Observe(float64(max(nowUs-h.until*1000, 0)) / 1e6)
	}
	a.answerHolds(ctx, a.holds[:n])
	clear(a.holds[:n])
	a.holds = a.holds[n:]
	if len(a.holds) == 0 {
		a.holds = nil
	}
	a.m.held.Set(float64(len(a.holds)))
	a.serveParked(ctx)
	a.stats.HighWatermark.Store(a.readable())
	a.publishPrio()
	a.armHold()
}

// dropHolds makes every held batch readable now (the log was replaced,
// or the replica stops: they are committed either way).
func (a *Actor) dropHolds(ctx actor.Context) {
	if len(a.holds) == 0 {
		return
	}
	a.answerHolds(ctx, a.holds)
	a.holds = nil
	a.m.held.Set(0)
}

// answerHolds answers the producers of holds that ended, each with the
// time its batch became readable: its time, or its commit if that came
// later (a hold that ends early, dropped, answers with now).
func (a *Actor) answerHolds(ctx actor.Context, hs []hold) {
	nowUs := a.cfg.Clock.Now().UnixMicro()
	for _, h := range hs {
		readableUs := min(max(h.committed, h.until*1000), nowUs)
		for _, w := range h.answers {
			a.answer(ctx, w.p, func(id uint64, dup bool) *heraldpb.Frame {
				q := w.p
				q.duplicate = dup
				f := produced(id, a.cfg.Partition, w.base, q)
				f.GetProduceResponse().CommitTimeUs = readableUs
				return f
			})
		}
	}
}

// armHold arms a timer for the first hold's end, unless one is armed
// for that time already.
func (a *Actor) armHold() {
	if len(a.holds) == 0 || a.holdTimerAt == a.holds[0].until {
		return
	}
	a.holdTimerAt = a.holds[0].until
	a.holdGen++
	gen, sys, self := a.holdGen, a.sys, a.self
	d := time.UnixMilli(a.holdTimerAt).Sub(a.cfg.Clock.Now())
	time.AfterFunc(max(d, 0), func() { sys.Root.Send(self, heldDue{gen: gen}) })
}

func (a *Actor) onHeldDue(ctx actor.Context, m heldDue) {
	if m.gen != a.holdGen {
		return // a later timer replaced it
	}
	a.holdTimerAt = 0
	a.releaseHolds(ctx)
}

// restoreHolds holds again, after the log was opened, the last applied
// entries whose time has not come. Entries are held at most MaxHold, so
// only the recent tail can be: it reads back from the last applied entry
// until one older than MaxHold, or restoreScanLimit entries.
func (a *Actor) restoreHolds() error {
	nowMs := a.cfg.Clock.Now().UnixMilli()
	first, err := a.store.FirstIndex()
	if err != nil {
		return err
	}
	last, err := a.store.LastIndex()
	if err != nil {
		return err
	}
	var found []hold
	scanned := 0
	for hi := min(a.applied, last); hi >= first && hi > 0 && scanned < restoreScanLimit; {
		lo := first
		if hi > first+63 {
			lo = hi - 63
		}
		// Entries stops at a size limit: read the range in as many calls
		// as it takes.
		var ents []raftpb.Entry
		for next := lo; next <= hi; {
			got, err := a.store.Entries(next, hi+1, 16<<20)
			if err != nil {
				return fmt.Errorf("reading entries [%d, %d] for held batches (first %d, last %d, applied %d): %w", next, hi, first, last, a.applied, err)
			}
			if len(got) == 0 {
				return fmt.Errorf("reading entries [%d, %d] for held batches: none returned", next, hi)
			}
			ents = append(ents, got...)
			next += uint64(len(got))
		}
		old := false
		for i := len(ents) - 1; i >= 0; i-- {
			e := ents[i]
			scanned++
			h, _, err := heraldpb.ScanLogEntry(e.Data)
			if e.Type != raftpb.EntryNormal || len(e.Data) == 0 || err != nil || h.AppendTimeMs == 0 {
				continue // a conf change or an empty entry
			}
			if h.AppendTimeMs+a.cfg.MaxHold.Milliseconds() < nowMs {
				old = true
				break
			}
			if until := a.holdUntil(h, nowMs); until > 0 {
				found = append(found, hold{base: h.BaseOffset, until: until})
			}
		}
		if old || lo == first {
			break
		}
		hi = lo - 1
	}
	for i := len(found) - 1; i >= 0; i-- {
		a.addHold(nil, found[i].base, found[i].until, nil) // (no producers: nil ctx is not used)
	}
	a.m.held.Set(float64(len(a.holds)))
	a.holdTimerAt = 0
	a.armHold()
	return nil
}

// restoreScanLimit bounds the entries restoreHolds reads back.
const restoreScanLimit = 65536

// readWindow reads the window from offset (below end) and leaves out the
// batches from end on (holds start at a batch).
func (a *Actor) readWindow(offset int64, maxBytes int, end int64) []*heraldpb.StoredBatch {
	bs := a.win.read(offset, maxBytes)
	for i, b := range bs {
		if b.BaseOffset >= end {
			return bs[:i]
		}
	}
	return bs
}
