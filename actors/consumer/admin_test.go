package consumer

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"google.golang.org/protobuf/proto"
)

// manualClock moves only when the test advances it; timers due by then
// fire in Advance.
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []manualTimer
}

type manualTimer struct {
	at time.Time
	f  func()
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) AfterFunc(d time.Duration, f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timers = append(c.timers, manualTimer{at: c.now.Add(d), f: f})
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []func()
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
		} else {
			due = append(due, t.f)
		}
	}
	c.timers = kept
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
}

// fakeLog is the one partition of the test's topic: it answers a fetch
// with its records from the fetch's offset to its end, and a fetch at the
// end not at all (the coordinator's long poll, never answered).
type fakeLog struct{ n int }

func (l *fakeLog) Receive(ctx actor.Context) {
	f, ok := ctx.Message().(*heraldpb.Frame)
	if !ok || f.GetFetch() == nil || f.GetFetch().Offset >= int64(l.n) {
		return
	}
	from := f.GetFetch().Offset
	batch := &heraldpb.RecordBatch{}
	for o := from; o < int64(l.n); o++ {
		batch.Records = append(batch.Records, &heraldpb.Record{Value: fmt.Appendf(nil, "m%d", o)})
	}
	recs, _ := proto.Marshal(batch)
	ctx.Respond(&heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_FetchResponse{FetchResponse: &heraldpb.FetchResponse{
		HighWatermark: int64(l.n), Batches: []*heraldpb.StoredBatch{{BaseOffset: from, Count: uint32(l.n) - uint32(from), Records: recs}},
	}}})
}

// groupsWrite is a progress write the coordinator sent to __groups; the
// test answers it (or never does).
type groupsWrite struct {
	to   *actor.PID
	id   uint64
	recs []*heraldpb.GroupProgress
}

// fakeGroupsLog is __groups: it hands every write to the test.
type fakeGroupsLog struct{ writes chan<- groupsWrite }

func (g *fakeGroupsLog) Receive(ctx actor.Context) {
	f, ok := ctx.Message().(*heraldpb.Frame)
	if !ok || f.GetProduce() == nil {
		return
	}
	var batch heraldpb.RecordBatch
	if err := proto.Unmarshal(f.GetProduce().Records, &batch); err != nil {
		panic(err)
	}
	w := groupsWrite{to: ctx.Sender(), id: f.Id}
	for _, r := range batch.Records {
		var gp heraldpb.GroupProgress
		if err := proto.Unmarshal(r.Value, &gp); err != nil {
			panic(err)
		}
		w.recs = append(w.recs, &gp)
	}
	g.writes <- w
}

// fakeConn is the member's connection: the writer stands in for it.
type fakeConn struct{}

func (fakeConn) Receive(actor.Context) {}

// fakeWriter is the network server: the hello is written at once, and
// pushes are decoded into frames.
type fakeWriter struct {
	sys    *actor.ActorSystem
	hellos chan *heraldpb.Frame
	pushes chan *heraldpb.Frame
}

func (w *fakeWriter) SendRaw(_ *actor.PID, frame []byte) {
	f, err := heraldpb.DecodeFrame(frame[heraldpb.HeaderLen:])
	if err != nil {
		panic(err)
	}
	w.pushes <- f
}

func (w *fakeWriter) WriteThen(_ *actor.PID, f *heraldpb.Frame, notify *actor.PID, done any) {
	w.hellos <- f
	w.sys.Root.Send(notify, done)
}

// coordRig runs group coordinators for group "g" on topic "t" (one
// partition of n records) against a __groups whose writes the test
// answers.
type coordRig struct {
	t      *testing.T
	sys    *actor.ActorSystem
	o      *Options
	clock  *manualClock
	writes chan groupsWrite
	w      *fakeWriter
	conn   *actor.PID
	nextID uint64
}

func newCoordRig(t *testing.T, n int) *coordRig {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
	t.Cleanup(sys.Shutdown)
	r := &coordRig{t: t, sys: sys, clock: &manualClock{now: time.Unix(1_700_000_000, 0)}, writes: make(chan groupsWrite, 16)}
	r.w = &fakeWriter{sys: sys, hellos: make(chan *heraldpb.Frame, 4), pushes: make(chan *heraldpb.Frame, 64)}
	r.conn = sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return fakeConn{} }))
	logPID := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &fakeLog{n: n} }))
	groupsPID := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &fakeGroupsLog{writes: r.writes} }))
	st := &partition.Stats{}
	st.HighWatermark.Store(int64(n))
	reg := &registry.Registry{}
	reg.Update(func(m map[string]*registry.Entry) {
		m["t"] = &registry.Entry{Name: "t", Config: &heraldpb.TopicConfig{Partitions: 1}, Topic: logPID,
			Partitions: []*actor.PID{logPID}, Stats: []*partition.Stats{st}}
		m[GroupsTopic] = &registry.Entry{Name: GroupsTopic, Config: &heraldpb.TopicConfig{Partitions: 1}, Topic: groupsPID,
			Partitions: []*actor.PID{groupsPID}, Stats: []*partition.Stats{{}}}
	})
	r.o = &Options{Topics: reg, Dir: NewDirectory(), Logger: quiet,
		Writer: r.w, IdleStop: -1, Clock: r.clock}
	r.o.ensureDefaults()
	return r
}

// start spawns a coordinator of "g" with stored as its durable records
// (what the groups manager loads from __groups on a takeover).
func (r *coordRig) start(stored ...*heraldpb.GroupProgress) *actor.PID {
	st := &groupStore{stored: map[storeKey]*heraldpb.GroupProgress{}}
	for _, g := range stored {
		st.stored[keyOf(g)] = g
		st.lastTop = g.Topic
	}
	return r.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return newCoordinator(r.o, "g", st) }))
}

func (r *coordRig) frame(body any) *heraldpb.Frame {
	r.nextID++
	f := &heraldpb.Frame{Id: r.nextID}
	switch b := body.(type) {
	case *heraldpb.SubscribeRequest:
		f.Body = &heraldpb.Frame_Subscribe{Subscribe: b}
	case *heraldpb.AckRequest:
		f.Body = &heraldpb.Frame_Ack{Ack: b}
	case *heraldpb.UnsubscribeRequest:
		f.Body = &heraldpb.Frame_Unsubscribe{Unsubscribe: b}
	case *heraldpb.DescribeGroupRequest:
		f.Body = &heraldpb.Frame_DescribeGroup{DescribeGroup: b}
	default:
		r.t.Fatalf("no frame for %T", body)
	}
	return f
}

// subscribe joins a member (mode, with name) reading from the earliest
// offset and returns its subscription id once it has n deliveries.
func (r *coordRig) subscribe(coord *actor.PID, mode heraldpb.SubscriptionMode, name string, n int) uint64 {
	r.t.Helper()
	r.sys.Root.Send(coord, &subscribeMsg{replyTo: r.conn, maxFrame: 1 << 20, f: r.frame(&heraldpb.SubscribeRequest{
		Group: "g", Topic: "t", Mode: mode, MemberName: name, Credits: 100,
		Start: &heraldpb.StartPosition{At: &heraldpb.StartPosition_Earliest{Earliest: true}},
	})})
	var subID uint64
	select {
	case f := <-r.w.hellos:
		if f.GetSubscribeResponse() == nil {
			r.t.Fatalf("subscribe: %v", f)
		}
		subID = f.GetSubscribeResponse().SubscriptionId
	case <-time.After(10 * time.Second):
		r.t.Fatal("no subscribe response")
	}
	got := 0
	for got < n {
		select {
		case f := <-r.w.pushes:
			got += len(f.GetDelivery().GetMessages())
		case <-time.After(10 * time.Second):
			r.t.Fatalf("%d of %d delivered", got, n)
		}
	}
	return subID
}

// ack acknowledges offsets [from, to) of partition 0; the answer comes
// once the progress write is durable.
func (r *coordRig) ack(coord *actor.PID, subID uint64, from, to int64) *actor.Future {
	req := &heraldpb.AckRequest{SubscriptionId: subID}
	for o := from; o < to; o++ {
		req.Partitions, req.Offsets = append(req.Partitions, 0), append(req.Offsets, o)
	}
	return r.sys.Root.RequestFuture(coord, r.frame(req), 10*time.Second)
}

func (r *coordRig) describe(coord *actor.PID) *heraldpb.GroupInfo {
	r.t.Helper()
	res, err := r.sys.Root.RequestFuture(coord, r.frame(&heraldpb.DescribeGroupRequest{Group: "g"}), 10*time.Second).Result()
	if err != nil {
		r.t.Fatalf("describe: %v", err)
	}
	return res.(*heraldpb.Frame).GetDescribeGroupResponse().GetGroup()
}

func (r *coordRig) nextWrite() groupsWrite {
	r.t.Helper()
	select {
	case w := <-r.writes:
		return w
	case <-time.After(10 * time.Second):
		r.t.Fatal("no progress write")
		return groupsWrite{}
	}
}

func (r *coordRig) answer(w groupsWrite, e *heraldpb.Error) {
	if e != nil {
		r.sys.Root.Send(w.to, heraldpb.ErrorFrame(w.id, e))
		return
	}
	r.sys.Root.Send(w.to, &heraldpb.Frame{Id: w.id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{}}})
}

func acked(t *testing.T, f *actor.Future) {
	t.Helper()
	res, err := f.Result()
	if err != nil {
		t.Fatalf("ack: %v", err)
	}
	if res.(*heraldpb.Frame).GetAckResponse() == nil {
		t.Fatalf("ack answered %v", res)
	}
}

// DescribeGroup's ack floor is the durable one: it never shows acks whose
// progress record is not written to __groups yet (they count as acked
// above the floor), it moves up once the write succeeds (after a failed
// one is retried), and a coordinator that takes over from what was
// written, or the same one after its subscription ended with a write in
// flight, shows no lower floor than any shown before (the leader-kill
// chaos scenario saw 2432, then 2430). For the group's view and for a
// broadcast member's.
func TestDescribeShowsDurableFloor(t *testing.T) {
	for _, tc := range []struct {
		mode heraldpb.SubscriptionMode
		name string // the broadcast member: its view's subscriber
	}{{heraldpb.SubscriptionMode_MODE_SHARED, ""}, {heraldpb.SubscriptionMode_MODE_BROADCAST, "b1"}} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			r := newCoordRig(t, 10)
			coord := r.start()
			subID := r.subscribe(coord, tc.mode, tc.name, 10)
			var shown []int64 // every floor described, in order
			check := func(c *actor.PID, what string, floor, above, lag int64, members int) {
				t.Helper()
				gi := r.describe(c)
				if len(gi.Partitions) != 1 || len(gi.Members) != members {
					t.Fatalf("%s: describe %v", what, gi)
				}
				pl := gi.Partitions[0]
				if pl.Subscriber != tc.name || pl.AckFloor != floor || int64(pl.AckedAbove) != above || pl.Lag != lag || pl.HighWatermark != 10 {
					t.Fatalf("%s: floor %d acked above %d lag %d (subscriber %q), want floor %d acked above %d lag %d",
						what, pl.AckFloor, pl.AckedAbove, pl.Lag, pl.Subscriber, floor, above, lag)
				}
				shown = append(shown, pl.AckFloor)
			}
			check(coord, "subscribed", 0, 0, 10, 1)

			a1 := r.ack(coord, subID, 0, 5)
			w1 := r.nextWrite()
			if len(w1.recs) != 1 || w1.recs[0].Partitions[0].AckFloor != 5 {
				t.Fatalf("first write: %v", w1.recs)
			}
			check(coord, "acks 0-4 being written", 0, 5, 5, 1)
			r.answer(w1, heraldpb.NewError(heraldpb.ErrorCode_NOT_LEADER, "no leader"))
			check(coord, "their write failed", 0, 5, 5, 1)
			r.clock.Advance(time.Second) // the retry
			w1 = r.nextWrite()
			if n := len(w1.recs); n == 0 || w1.recs[n-1].Partitions[0].AckFloor != 5 {
				t.Fatalf("retried write: %v", w1.recs)
			}
			r.answer(w1, nil)
			acked(t, a1)
			durable := w1.recs[len(w1.recs)-1]
			check(coord, "written", 5, 0, 5, 1)

			r.ack(coord, subID, 5, 10) // never answered: the coordinator dies first
			w2 := r.nextWrite()
			if w2.recs[len(w2.recs)-1].Partitions[0].AckFloor != 10 {
				t.Fatalf("second write: %v", w2.recs)
			}
			check(coord, "acks 5-9 being written", 5, 5, 0, 1)
			// The member leaves while the write is in flight: the group
			// has no subscription, and its record of floor 10 waits.
			res, err := r.sys.Root.RequestFuture(coord, r.frame(&heraldpb.UnsubscribeRequest{SubscriptionId: subID}), 10*time.Second).Result()
			if err != nil || res.(*heraldpb.Frame).GetUnsubscribeResponse() == nil {
				t.Fatalf("unsubscribe: %v %v", res, err)
			}
			check(coord, "left, still being written", 5, 0, 5, 0)

			// Failover: the coordinator dies before the write lands, and
			// a new one loads what __groups holds.
			if err := r.sys.Root.StopFuture(coord).Wait(); err != nil {
				t.Fatal(err)
			}
			check(r.start(durable), "taken over", 5, 0, 5, 0)
			for i := 1; i < len(shown); i++ {
				if shown[i] < shown[i-1] {
					t.Fatalf("the floor went back: %v", shown)
				}
			}
		})
	}
}

// lagLog is a replica that lags behind the group's position (or reopens
// after a storage failure, or rebuilds after damage): its first fetch past
// its end is answered OFFSET_OUT_OF_RANGE (and told on oor), later ones
// as a whole log of n records.
type lagLog struct {
	n, end int
	st     *partition.Stats
	oor    chan struct{}
	done   bool
}

func (l *lagLog) Receive(ctx actor.Context) {
	f, ok := ctx.Message().(*heraldpb.Frame)
	if !ok || f.GetFetch() == nil {
		return
	}
	if !l.done && f.GetFetch().Offset > int64(l.end) {
		l.done = true
		ctx.Respond(heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE, "offset %d past the end %d", f.GetFetch().Offset, l.end)))
		l.oor <- struct{}{}
		return
	}
	l.st.HighWatermark.Store(int64(l.n)) // caught up
	(&fakeLog{n: l.n}).Receive(ctx)
}

// A fetch past the end of a replica that lags (its high watermark below
// the group's durable position) never moves the position back: the chaos
// suite's disk-full and disk-faults runs saw acked progress 738 go to 0
// and 3244 to 489, and every acked message delivered again, when the
// coordinator's node reopened its replica.
func TestLaggingReplicaDoesNotMoveThePositionBack(t *testing.T) {
	r := newCoordRig(t, 10)
	coord := r.start()
	subID := r.subscribe(coord, heraldpb.SubscriptionMode_MODE_SHARED, "", 10)
	a := r.ack(coord, subID, 0, 5)
	w := r.nextWrite()
	r.answer(w, nil)
	acked(t, a)
	durable := w.recs[len(w.recs)-1]
	if err := r.sys.Root.StopFuture(coord).Wait(); err != nil {
		t.Fatal(err)
	}
	// The next coordinator reads a replica that holds offsets 0-2 only.
	st := &partition.Stats{}
	st.HighWatermark.Store(3)
	lag := &lagLog{n: 10, end: 3, st: st, oor: make(chan struct{}, 1)}
	pid := r.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return lag }))
	r.o.Topics.Update(func(m map[string]*registry.Entry) {
		m["t"] = &registry.Entry{Name: "t", Config: &heraldpb.TopicConfig{Partitions: 1}, Topic: pid,
			Partitions: []*actor.PID{pid}, Stats: []*partition.Stats{st}}
	})
	coord = r.start(durable)
	r.subscribe(coord, heraldpb.SubscriptionMode_MODE_SHARED, "", 0)
	select {
	case <-lag.oor:
	case <-time.After(10 * time.Second):
		t.Fatal("no fetch past the lagging replica's end")
	}
	// Caught up: the deliveries start at the durable position, 5. (The
	// coordinator reads again on its clock, the test's: advanced until it
	// does.)
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.clock.Advance(100 * time.Millisecond)
		select {
		case f := <-r.w.pushes:
			msgs := f.GetDelivery().GetMessages()
			if len(msgs) == 0 || msgs[0].Offset != 5 {
				t.Fatalf("first delivery after the lag: %v, want offset 5 first", msgs)
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no delivery after the replica caught up")
		}
	}
}
