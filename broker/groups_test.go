package broker

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// wire is a raw protocol client: these tests check the broker's consumer
// groups frame by frame, independent of the SDK.
type wire struct {
	t      testing.TB
	c      net.Conn
	mu     sync.Mutex
	nextID uint64
	resp   map[uint64]chan *heraldpb.Frame
	pushes chan *heraldpb.Frame
	raw    chan []byte // if set, pushes arrive here undecoded
}

func dialWire(t testing.TB, addr string) *wire { return dialWireRaw(t, addr, false) }

func dialWireRaw(t testing.TB, addr string, raw bool) *wire {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	w := &wire{t: t, c: c, resp: map[uint64]chan *heraldpb.Frame{}, pushes: make(chan *heraldpb.Frame, 100000)}
	if raw {
		w.raw = make(chan []byte, 100000)
	}
	go w.read()
	t.Cleanup(func() { c.Close() })
	return w
}

func (w *wire) read() {
	br := bufio.NewReader(w.c)
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			close(w.pushes)
			return
		}
		n := int(hdr[0])<<24 | int(hdr[1])<<16 | int(hdr[2])<<8 | int(hdr[3])
		buf := make([]byte, n)
		if _, err := io.ReadFull(br, buf); err != nil {
			close(w.pushes)
			return
		}
		if w.raw != nil && len(buf) > 0 && buf[0] != 0x08 { // no id field: a push
			w.raw <- buf
			continue
		}
		f, err := heraldpb.DecodeFrame(buf)
		if err != nil {
			panic(err)
		}
		w.mu.Lock()
		ch := w.resp[f.Id]
		delete(w.resp, f.Id)
		w.mu.Unlock()
		if ch != nil && f.Id != 0 {
			ch <- f
		} else {
			w.pushes <- f
		}
	}
}

func (w *wire) send(f *heraldpb.Frame) chan *heraldpb.Frame {
	w.mu.Lock()
	w.nextID++
	f.Id = w.nextID
	ch := make(chan *heraldpb.Frame, 1)
	w.resp[f.Id] = ch
	w.mu.Unlock()
	b, err := heraldpb.AppendFrame(nil, f)
	if err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.c.Write(b); err != nil {
		w.t.Fatal(err)
	}
	return ch
}

// call sends f and returns the response, failing on an error frame unless
// the caller expects one (wantErr).
func (w *wire) call(f *heraldpb.Frame) *heraldpb.Frame {
	w.t.Helper()
	select {
	case r := <-w.send(f):
		return r
	case <-time.After(10 * time.Second):
		w.t.Fatalf("no answer to %T", f.Body)
		return nil
	}
}

func (w *wire) ok(f *heraldpb.Frame) *heraldpb.Frame {
	w.t.Helper()
	r := w.call(f)
	if e := r.GetError(); e != nil {
		w.t.Fatalf("%T: %v", f.Body, e)
	}
	return r
}

// deliveries reads pushes until n messages arrived or the wait ends.
func (w *wire) deliveries(n int, wait time.Duration) []*heraldpb.DeliveredMessage {
	var out []*heraldpb.DeliveredMessage
	deadline := time.After(wait)
	for len(out) < n {
		select {
		case f, ok := <-w.pushes:
			if !ok {
				return out
			}
			if d := f.GetDelivery(); d != nil {
				out = append(out, d.Messages...)
			}
		case <-deadline:
			return out
		}
	}
	return out
}

func startTestBroker(t *testing.T, dir string) *Broker {
	t.Helper()
	cfg := Default()
	cfg.DataDir, cfg.Listen, cfg.Admin = dir, "127.0.0.1:0", ""
	b, err := Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func produce(t *testing.T, w *wire, topicName string, part uint32, n int) {
	t.Helper()
	batch := &heraldpb.RecordBatch{}
	for i := 0; i < n; i++ {
		batch.Records = append(batch.Records, &heraldpb.Record{Key: []byte(fmt.Sprintf("k%d", i%3)), Value: []byte(fmt.Sprintf("p%d-%d", part, i)),
			Tags: []string{[]string{"red", "blue"}[i%2]}, Headers: []*heraldpb.Header{{Key: "n", Value: []byte(fmt.Sprint(i))}}})
	}
	recs, _ := proto.Marshal(batch)
	// Retriable errors (a partition still electing itself after a restart)
	// are retried.
	checkFor(t, func() error {
		r := w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: topicName, Partition: proto.Uint32(part), Records: recs}}})
		if e := r.GetError(); e != nil {
			if !e.Retriable {
				t.Fatalf("produce: %v", e)
			}
			return e
		}
		return nil
	})
}

func TestGroupSharedCreditsAcksRestart(t *testing.T) {
	dir := t.TempDir()
	b := startTestBroker(t, dir)
	w := dialWire(t, b.ClientAddr())
	w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "t", Config: &heraldpb.TopicConfig{Partitions: 2}}}})
	produce(t, w, "t", 0, 10)
	produce(t, w, "t", 1, 10)

	r := w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{
		Group: "g", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: 4,
		Start: &heraldpb.StartPosition{At: &heraldpb.StartPosition_Earliest{Earliest: true}},
	}}})
	subID := r.GetSubscribeResponse().SubscriptionId
	seen := map[string]bool{}
	for round := 0; len(seen) < 20; round++ {
		if round > 10 {
			t.Fatalf("only %d of 20 delivered", len(seen))
		}
		ds := w.deliveries(4, 5*time.Second)
		// Never more than the credits granted: nothing more may arrive.
		if extra := w.deliveries(1, 50*time.Millisecond); len(extra) > 0 {
			t.Fatalf("delivered beyond the 4 credits: %v", extra)
		}
		ack := &heraldpb.AckRequest{SubscriptionId: subID, Credits: uint32(len(ds))}
		for _, d := range ds {
			key := fmt.Sprintf("%d/%d", d.Partition, d.Offset)
			if seen[key] {
				t.Fatalf("%s delivered twice", key)
			}
			seen[key] = true
			ack.Partitions = append(ack.Partitions, d.Partition)
			ack.Offsets = append(ack.Offsets, d.Offset)
		}
		w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Ack{Ack: ack}})
	}
	desc := w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_DescribeGroup{DescribeGroup: &heraldpb.DescribeGroupRequest{Group: "g"}}}).GetDescribeGroupResponse().Group
	if len(desc.Members) != 1 || len(desc.Partitions) != 2 || desc.Partitions[0].AckFloor != 10 || desc.Partitions[1].Lag != 0 {
		t.Fatalf("describe: %v", desc)
	}
	if err := b.Shutdown(); err != nil {
		t.Fatal(err)
	}

	b = startTestBroker(t, dir)
	defer b.Shutdown()
	w = dialWire(t, b.ClientAddr())
	desc = w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_DescribeGroup{DescribeGroup: &heraldpb.DescribeGroupRequest{Group: "g"}}}).GetDescribeGroupResponse().Group
	if len(desc.Members) != 0 || len(desc.Partitions) != 2 || desc.Partitions[0].AckFloor != 10 || desc.Partitions[1].AckFloor != 10 {
		t.Fatalf("describe after restart: %v", desc)
	}
	produce(t, w, "t", 1, 3)
	w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{
		Group: "g", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: 100,
		Start: &heraldpb.StartPosition{At: &heraldpb.StartPosition_Earliest{Earliest: true}},
	}}})
	ds := w.deliveries(3, 5*time.Second)
	if len(ds) != 3 || ds[0].Partition != 1 || ds[0].Offset != 10 || ds[0].DeliveryCount != 1 {
		t.Fatalf("after restart got %v", ds)
	}
	if extra := w.deliveries(1, 100*time.Millisecond); len(extra) > 0 {
		t.Fatalf("acked messages redelivered after restart: %v", extra)
	}
}

func subscribe(t *testing.T, w *wire, req *heraldpb.SubscribeRequest) uint64 {
	t.Helper()
	if req.Start == nil {
		req.Start = &heraldpb.StartPosition{At: &heraldpb.StartPosition_Earliest{Earliest: true}}
	}
	return w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: req}}).GetSubscribeResponse().SubscriptionId
}

func ackAll(t *testing.T, w *wire, subID uint64, ds []*heraldpb.DeliveredMessage, credits uint32) {
	t.Helper()
	ack := &heraldpb.AckRequest{SubscriptionId: subID, Credits: credits}
	for _, d := range ds {
		ack.Partitions = append(ack.Partitions, d.Partition)
		ack.Offsets = append(ack.Offsets, d.Offset)
	}
	w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Ack{Ack: ack}})
}

func ids(ds []*heraldpb.DeliveredMessage) map[string]uint32 {
	m := map[string]uint32{}
	for _, d := range ds {
		m[fmt.Sprintf("%d/%d", d.Partition, d.Offset)] = d.DeliveryCount
	}
	return m
}

func describe(t *testing.T, w *wire, group string) *heraldpb.GroupInfo {
	t.Helper()
	return w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_DescribeGroup{DescribeGroup: &heraldpb.DescribeGroupRequest{Group: group}}}).GetDescribeGroupResponse().Group
}

func newTopic(t *testing.T, w *wire, name string, parts uint32) {
	t.Helper()
	w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: name, Config: &heraldpb.TopicConfig{Partitions: parts}}}})
}

// A shared member that disconnects with messages unacked: they go to the
// other member, with delivery count 2.
func TestGroupDisconnectRedelivers(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	a, c := dialWire(t, b.ClientAddr()), dialWire(t, b.ClientAddr())
	newTopic(t, a, "t", 1)
	produce(t, a, "t", 0, 6)
	subA := subscribe(t, a, &heraldpb.SubscribeRequest{Group: "g", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: 4})
	got := a.deliveries(4, 5*time.Second)
	if len(got) != 4 {
		t.Fatalf("a got %d", len(got))
	}
	ackAll(t, a, subA, got[:1], 0) // one acked, three held
	subscribe(t, c, &heraldpb.SubscribeRequest{Group: "g", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: 10})
	first := c.deliveries(2, 5*time.Second) // the two A had no credit for
	a.c.Close()
	rest := c.deliveries(3, 5*time.Second)
	all := ids(append(first, rest...))
	if len(all) != 5 {
		t.Fatalf("c got %v, want the 5 not acked by a", all)
	}
	if _, dup := all[fmt.Sprintf("0/%d", got[0].Offset)]; dup {
		t.Fatalf("acked message redelivered: %v", all)
	}
	for _, d := range got[1:] {
		if n := all[fmt.Sprintf("%d/%d", d.Partition, d.Offset)]; n != 2 {
			t.Fatalf("message %d/%d redelivered with count %d, want 2 (%v)", d.Partition, d.Offset, n, all)
		}
	}
}

// Clustering: members' deliveries are disjoint and cover everything; a
// joining member takes partitions over; a leaving one's go back.
func TestGroupClusteringRebalance(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	a, c := dialWire(t, b.ClientAddr()), dialWire(t, b.ClientAddr())
	newTopic(t, a, "t", 4)
	for p := uint32(0); p < 4; p++ {
		produce(t, a, "t", p, 5)
	}
	req := func() *heraldpb.SubscribeRequest {
		return &heraldpb.SubscribeRequest{Group: "g", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_CLUSTERING, Credits: 1000}
	}
	subA := subscribe(t, a, req())
	gotA := a.deliveries(20, 5*time.Second)
	if len(gotA) != 20 {
		t.Fatalf("a got %d of 20", len(gotA))
	}
	ackAll(t, a, subA, gotA, 0)
	subC := subscribe(t, c, req())
	d := describe(t, a, "g")
	checkFor(t, func() error {
		d = describe(t, a, "g")
		if len(d.Members) != 2 || len(d.Members[0].Partitions) != 2 || len(d.Members[1].Partitions) != 2 {
			return fmt.Errorf("assignment %v", d.Members)
		}
		return nil
	})
	for p := uint32(0); p < 4; p++ {
		produce(t, a, "t", p, 5)
	}
	newA, newC := a.deliveries(10, 5*time.Second), c.deliveries(10, 5*time.Second)
	ia, ic := ids(newA), ids(newC)
	if len(ia) != 10 || len(ic) != 10 {
		t.Fatalf("a got %d, c got %d, want 10 each", len(ia), len(ic))
	}
	for k := range ia {
		if _, ok := ic[k]; ok {
			t.Fatalf("%s delivered to both members", k)
		}
	}
	ackAll(t, a, subA, newA, 0)
	// c leaves with its 10 unacked: a gets them.
	_ = subC
	c.c.Close()
	again := ids(a.deliveries(10, 5*time.Second))
	for k := range ic {
		if again[k] != 2 {
			t.Fatalf("c's %s not redelivered to a (%v)", k, again)
		}
	}
}

func checkFor(t testing.TB, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestGroupNackTimeoutFilterErrors(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "t", 1)
	produce(t, w, "t", 0, 6) // tags alternate red, blue; header n = index

	// A bad filter is refused with the position.
	r := w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{
		Group: "bad", Topic: "t", FilterType: heraldpb.FilterType_FILTER_SQL, Filter: "n > AND 3"}}})
	if e := r.GetError(); e == nil || e.Code != heraldpb.ErrorCode_INVALID_FILTER || !containsAll(e.Message, "at 4", "^") {
		t.Fatalf("bad filter: %v", r)
	}
	r = w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{Group: "g2", Topic: "nope"}}})
	if e := r.GetError(); e == nil || e.Code != heraldpb.ErrorCode_TOPIC_NOT_FOUND {
		t.Fatalf("missing topic: %v", r)
	}
	r = w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Ack{Ack: &heraldpb.AckRequest{SubscriptionId: 999}}})
	if e := r.GetError(); e == nil || e.Code != heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND {
		t.Fatalf("unknown subscription: %v", r)
	}

	// SQL filter: n >= 2 AND tag red -> offsets 2, 4 only; the rest still
	// advance progress.
	sub := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "f", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: 10,
		FilterType: heraldpb.FilterType_FILTER_SQL, Filter: "n >= 2 AND n IN (2, 4, 5) AND n <> 5", AckTimeoutMs: 300})
	ds := w.deliveries(2, 5*time.Second)
	if got := ids(ds); len(got) != 2 || got["0/2"] != 1 || got["0/4"] != 1 {
		t.Fatalf("filtered deliveries %v", got)
	}
	// Nack 2 with a delay; let 4 time out (300 ms): both come back, count 2.
	w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Nack{Nack: &heraldpb.NackRequest{SubscriptionId: sub, Partitions: []uint32{0}, Offsets: []int64{2}, DelayMs: proto.Uint32(200)}}})
	again := ids(w.deliveries(2, 5*time.Second))
	if again["0/2"] != 2 || again["0/4"] != 2 {
		t.Fatalf("redeliveries %v", again)
	}
	ackAll(t, w, sub, []*heraldpb.DeliveredMessage{{Partition: 0, Offset: 2}, {Partition: 0, Offset: 4}}, 0)
	checkFor(t, func() error {
		if d := describe(t, w, "f"); d.Partitions[0].AckFloor != 6 || d.Redelivered != 2 {
			return fmt.Errorf("describe %v", d)
		}
		return nil
	})
	// Tag filter in another group.
	subscribe(t, w, &heraldpb.SubscribeRequest{Group: "tags", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: 10,
		FilterType: heraldpb.FilterType_FILTER_TAG, Filter: "blue || green"})
	if got := ids(w.deliveries(3, 5*time.Second)); len(got) != 3 || got["0/1"] == 0 || got["0/3"] == 0 || got["0/5"] == 0 {
		t.Fatalf("tag deliveries %v", got)
	}
	// Conflicting settings while members are live.
	r = w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{Group: "tags", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_CLUSTERING}}})
	if e := r.GetError(); e == nil || e.Code != heraldpb.ErrorCode_GROUP_CONFLICT {
		t.Fatalf("conflict: %v", r)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

func TestGroupResetAndReplay(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "t", 1)
	produce(t, w, "t", 0, 5)
	// Append times are in milliseconds: the second five go in a later
	// one than the first, so that `before` lies between them.
	before := time.Now().Truncate(time.Millisecond).Add(time.Millisecond)
	time.Sleep(time.Until(before)) // waits for the clock itself, not for an event
	produce(t, w, "t", 0, 5)
	sub := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "g", Topic: "t", Credits: 100})
	ackAll(t, w, sub, w.deliveries(10, 5*time.Second), 0)
	reset := func(to *heraldpb.StartPosition, force bool) *heraldpb.Frame {
		return w.call(&heraldpb.Frame{Body: &heraldpb.Frame_ResetGroup{ResetGroup: &heraldpb.ResetGroupRequest{Group: "g", To: to, Force: force}}})
	}
	if e := reset(&heraldpb.StartPosition{At: &heraldpb.StartPosition_Offset{Offset: 3}}, false).GetError(); e == nil || e.Code != heraldpb.ErrorCode_GROUP_HAS_MEMBERS {
		t.Fatalf("reset with members: %v", e)
	}
	if r := reset(&heraldpb.StartPosition{At: &heraldpb.StartPosition_Offset{Offset: 3}}, true); r.GetError() != nil || r.GetResetGroupResponse().GetGroup().GetPartitions()[0].GetAckFloor() != 3 {
		t.Fatalf("forced reset: %v", r)
	}
	checkFor(t, func() error {
		for {
			select {
			case f := <-w.pushes:
				if e := f.GetSubscriptionEnded(); e != nil && e.SubscriptionId == sub {
					return nil
				}
			default:
				return fmt.Errorf("no SubscriptionEnded push for %d", sub)
			}
		}
	})
	if d := describe(t, w, "g"); len(d.Members) != 0 || d.Partitions[0].AckFloor != 3 {
		t.Fatalf("after reset: %v", d)
	}
	r := w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Ack{Ack: &heraldpb.AckRequest{SubscriptionId: sub}}})
	if e := r.GetError(); e == nil || e.Code != heraldpb.ErrorCode_SUBSCRIPTION_NOT_FOUND {
		t.Fatalf("ack on a subscription ended by reset: %v", r)
	}
	sub = subscribe(t, w, &heraldpb.SubscribeRequest{Group: "g", Topic: "t", Credits: 100})
	ds := w.deliveries(7, 5*time.Second)
	if len(ds) != 7 || ds[0].Offset != 3 {
		t.Fatalf("replay from offset 3: %v", ids(ds))
	}
	w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Unsubscribe{Unsubscribe: &heraldpb.UnsubscribeRequest{SubscriptionId: sub}}})
	// By time: the first record at or after `before` is offset 5.
	if e := reset(&heraldpb.StartPosition{At: &heraldpb.StartPosition_TimestampMs{TimestampMs: before.UnixMilli()}}, false).GetError(); e != nil {
		t.Fatal(e)
	}
	if d := describe(t, w, "g"); d.Partitions[0].AckFloor != 5 {
		t.Fatalf("reset by time: floor %d", d.Partitions[0].AckFloor)
	}
	r = w.call(&heraldpb.Frame{Body: &heraldpb.Frame_ResetGroup{ResetGroup: &heraldpb.ResetGroupRequest{Group: "nobody", To: &heraldpb.StartPosition{At: &heraldpb.StartPosition_Earliest{Earliest: true}}}}})
	if e := r.GetError(); e == nil || e.Code != heraldpb.ErrorCode_GROUP_NOT_FOUND {
		t.Fatalf("reset unknown group: %v", r)
	}
	lg := w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_ListGroups{ListGroups: &heraldpb.ListGroupsRequest{}}}).GetListGroupsResponse()
	if len(lg.Groups) != 1 || lg.Groups[0].Group != "g" || lg.Groups[0].Lag != 5 {
		t.Fatalf("list groups: %v", lg)
	}
}

func TestRequestReplyWire(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	caller, resp := dialWire(t, b.ClientAddr()), dialWire(t, b.ClientAddr())
	newTopic(t, caller, "svc", 1)
	call := func(corr uint64) *heraldpb.Frame {
		return caller.call(&heraldpb.Frame{Body: &heraldpb.Frame_Call{Call: &heraldpb.CallRequest{Topic: "svc", CorrelationId: corr, Record: &heraldpb.Record{Value: []byte("ping")}}}})
	}
	if e := call(1).GetError(); e == nil || e.Code != heraldpb.ErrorCode_NO_RESPONDERS {
		t.Fatalf("call without responders: %v", e)
	}
	sub := subscribe(t, resp, &heraldpb.SubscribeRequest{Group: "svc-workers", Topic: "svc", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Responder: true, AutoAck: true, Credits: 1})
	cr := call(7)
	if e := cr.GetError(); e != nil || cr.GetCallResponse().Responders != 1 {
		t.Fatalf("call: %v", cr)
	}
	ds := resp.deliveries(1, 5*time.Second)
	if len(ds) != 1 || ds[0].Offset != -1 || ds[0].CorrelationId != 7 || string(ds[0].Record.Value) != "ping" || ds[0].ReplyInbox != cr.GetCallResponse().Inbox {
		t.Fatalf("responder got %v", ds)
	}
	resp.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Reply{Reply: &heraldpb.ReplyRequest{Inbox: ds[0].ReplyInbox, CorrelationId: 7, Record: &heraldpb.Record{Value: []byte("pong")}}}})
	select {
	case f := <-caller.pushes:
		if rd := f.GetReplyDelivery(); rd == nil || rd.CorrelationId != 7 || string(rd.Record.Value) != "pong" {
			t.Fatalf("caller got %v", f)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no reply pushed")
	}
	// A reply to a guessed inbox (the caller's session id without its
	// random token, or a wrong token) reaches nobody.
	for _, guess := range []string{strings.Split(ds[0].ReplyInbox, "~")[0], ds[0].ReplyInbox + "0"} {
		r := resp.call(&heraldpb.Frame{Body: &heraldpb.Frame_Reply{Reply: &heraldpb.ReplyRequest{Inbox: guess, CorrelationId: 7}}})
		if e := r.GetError(); e == nil || e.Code != heraldpb.ErrorCode_INBOX_NOT_FOUND {
			t.Fatalf("reply to guessed inbox %q: %v", guess, r)
		}
	}
	// The responder used its one credit: the next call waits for a grant.
	call(8)
	if got := resp.deliveries(1, 100*time.Millisecond); len(got) != 0 {
		t.Fatalf("call delivered without credit: %v", got)
	}
	resp.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Ack{Ack: &heraldpb.AckRequest{SubscriptionId: sub, Credits: 1}}})
	if got := resp.deliveries(1, 5*time.Second); len(got) != 1 || got[0].CorrelationId != 8 {
		t.Fatalf("after credit: %v", got)
	}
	// A reply to a caller that left.
	inbox := ds[0].ReplyInbox
	caller.c.Close()
	checkFor(t, func() error {
		r := resp.call(&heraldpb.Frame{Body: &heraldpb.Frame_Reply{Reply: &heraldpb.ReplyRequest{Inbox: inbox, CorrelationId: 8}}})
		if e := r.GetError(); e == nil || e.Code != heraldpb.ErrorCode_INBOX_NOT_FOUND {
			return fmt.Errorf("reply to a gone caller: %v", r)
		}
		return nil
	})
}

// A member that keeps nacking trips its breaker: delivery to it pauses for
// the cool-down, then one probe goes out; acking it closes the breaker.
func TestGroupBreakerOpensAndCloses(t *testing.T) {
	b := startBreakerBroker(t, 3, 1500*time.Millisecond)
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "t", 1)
	produce(t, w, "t", 0, 10)
	sub := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "g", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: 3})
	ds := w.deliveries(3, 5*time.Second)
	// One request is one failure, however many messages it names.
	for i, d := range ds {
		credits := uint32(0)
		if i == len(ds)-1 {
			credits = 5
		}
		if i == len(ds)-1 {
			if d := describe(t, w, "g"); d.Members[0].Breaker != heraldpb.BreakerState_BREAKER_CLOSED {
				t.Fatalf("breaker after %d nack requests: %v", i, d.Members[0])
			}
		}
		w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Nack{Nack: &heraldpb.NackRequest{SubscriptionId: sub, Credits: credits,
			Partitions: []uint32{d.Partition}, Offsets: []int64{d.Offset}}}})
	}
	opened := time.Now()
	if d := describe(t, w, "g"); d.Members[0].Breaker != heraldpb.BreakerState_BREAKER_OPEN {
		t.Fatalf("breaker after 3 nack requests: %v", d.Members[0])
	}
	// Open: nothing is delivered despite 5 credits, until the cool-down.
	probe := w.deliveries(1, 5*time.Second)
	if len(probe) != 1 {
		t.Fatal("no half-open probe after the cool-down")
	}
	if since := time.Since(opened); since < 1400*time.Millisecond {
		t.Fatalf("delivery resumed after %v, inside the 1.5s cool-down", since)
	}
	if d := describe(t, w, "g"); d.Members[0].Breaker != heraldpb.BreakerState_BREAKER_HALF_OPEN {
		t.Fatalf("breaker during the probe: %v", d.Members[0])
	}
	if more := w.deliveries(1, 200*time.Millisecond); len(more) != 0 {
		t.Fatalf("half-open breaker let more than one probe through: %v", more)
	}
	ackAll(t, w, sub, probe, 0)
	if d := describe(t, w, "g"); d.Members[0].Breaker != heraldpb.BreakerState_BREAKER_CLOSED {
		t.Fatalf("breaker after the probe's ack: %v", d.Members[0])
	}
	if rest := w.deliveries(4, 5*time.Second); len(rest) != 4 {
		t.Fatalf("closed breaker: %d deliveries, want 4 (the remaining credits)", len(rest))
	}
}

// Key-shared with more members than partitions: one key is with one member
// at a time, and every message is delivered once.
func TestGroupKeySharedAndBroadcast(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	ws := []*wire{dialWire(t, b.ClientAddr()), dialWire(t, b.ClientAddr()), dialWire(t, b.ClientAddr())}
	newTopic(t, ws[0], "t", 1)
	produce(t, ws[0], "t", 0, 30) // keys k0, k1, k2
	var subs []uint64
	for _, w := range ws {
		subs = append(subs, subscribe(t, w, &heraldpb.SubscribeRequest{Group: "ks", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_KEY_SHARED, Credits: 100}))
	}
	owner := map[string]int{}
	total := 0
	checkFor(t, func() error {
		for i, w := range ws {
			ds := w.deliveries(1000, 20*time.Millisecond)
			for _, d := range ds {
				k := string(d.Record.Key)
				if o, ok := owner[k]; ok && o != i {
					return fmt.Errorf("key %s went to members %d and %d", k, o, i)
				}
				owner[k] = i
			}
			total += len(ds)
			ackAll(t, w, subs[i], ds, uint32(len(ds)))
		}
		if total != 30 {
			return fmt.Errorf("%d of 30 delivered", total)
		}
		return nil
	})
	// Broadcast: every member gets everything, with its own progress.
	for i, w := range ws[:2] {
		subscribe(t, w, &heraldpb.SubscribeRequest{Group: "bc", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_BROADCAST, Credits: 100, AutoAck: true,
			MemberName: fmt.Sprintf("node-%d", i)})
	}
	for i, w := range ws[:2] {
		if got := ids(w.deliveries(30, 5*time.Second)); len(got) != 30 {
			t.Fatalf("broadcast member %d got %d of 30", i, len(got))
		}
	}
	checkFor(t, func() error {
		d := describe(t, ws[0], "bc")
		if len(d.Partitions) != 2 || d.Partitions[0].AckFloor != 30 || d.Partitions[1].AckFloor != 30 {
			return fmt.Errorf("broadcast progress %v", d.Partitions)
		}
		return nil
	})
}

// Orderly: at most one message per partition in flight.
func TestGroupOrderly(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "t", 2)
	produce(t, w, "t", 0, 3)
	produce(t, w, "t", 1, 3)
	sub := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "o", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_CLUSTERING, Orderly: true, Credits: 100})
	next := map[uint32]int64{}
	for got := 0; got < 6; {
		ds := w.deliveries(2, 5*time.Second)
		if len(ds) == 0 {
			t.Fatalf("stalled after %d", got)
		}
		perPart := map[uint32]int{}
		for _, d := range ds {
			perPart[d.Partition]++
			if perPart[d.Partition] > 1 || d.Offset != next[d.Partition] {
				t.Fatalf("orderly delivered %v", ids(ds))
			}
			next[d.Partition]++
		}
		if extra := w.deliveries(1, 30*time.Millisecond); len(extra) > 0 {
			t.Fatalf("second message in flight on a partition: %v", ids(extra))
		}
		got += len(ds)
		ackAll(t, w, sub, ds, 0)
	}
}

// Auto-ack progress is written lazily; a graceful shutdown writes it, so a
// restart does not redeliver what was delivered (at-most-once holds).
func TestGroupAutoAckSurvivesGracefulRestart(t *testing.T) {
	dir := t.TempDir()
	b := startTestBroker(t, dir)
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "t", 1)
	produce(t, w, "t", 0, 8)
	subscribe(t, w, &heraldpb.SubscribeRequest{Group: "g", Topic: "t", AutoAck: true, Credits: 8})
	if got := w.deliveries(8, 5*time.Second); len(got) != 8 {
		t.Fatalf("got %d of 8", len(got))
	}
	if err := b.Shutdown(); err != nil {
		t.Fatal(err)
	}
	b = startTestBroker(t, dir)
	defer b.Shutdown()
	w = dialWire(t, b.ClientAddr())
	if d := describe(t, w, "g"); d.Partitions[0].AckFloor != 8 {
		t.Fatalf("auto-acked progress after a graceful restart: floor %d, want 8", d.Partitions[0].AckFloor)
	}
}

// The ack floor DescribeGroup shows is durable, so a crash (the
// coordinator dies with progress unwritten) and restart never shows a
// lower one. Auto-ack progress is written lazily (within 100 ms): right
// after its deliveries the floor in the coordinator's memory is ahead of
// __groups, which is what describe showed before and a restart went back
// from (the leader-kill chaos scenario).
func TestGroupFloorNeverBacksUpOverCrash(t *testing.T) {
	dir := t.TempDir()
	b := startTestBroker(t, dir)
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "t", 1)
	produce(t, w, "t", 0, 5)
	sub := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "g", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: 100})
	got := w.deliveries(5, 5*time.Second)
	if len(got) != 5 {
		t.Fatalf("got %d of 5", len(got))
	}
	ackAll(t, w, sub, got, 0) // answered once written: floor 5 is durable
	w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Unsubscribe{Unsubscribe: &heraldpb.UnsubscribeRequest{SubscriptionId: sub}}})
	subscribe(t, w, &heraldpb.SubscribeRequest{Group: "g", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_SHARED, AutoAck: true, Credits: 100})
	produce(t, w, "t", 0, 5)
	if got := w.deliveries(5, 5*time.Second); len(got) != 5 {
		t.Fatalf("got %d of the next 5", len(got))
	}
	before := describe(t, w, "g").Partitions[0]
	crash(t, b)
	b = startTestBroker(t, dir)
	defer b.Shutdown()
	w = dialWire(t, b.ClientAddr())
	after := describe(t, w, "g").Partitions[0]
	if after.AckFloor < before.AckFloor {
		t.Fatalf("the ack floor went back over a crash: %d, then %d", before.AckFloor, after.AckFloor)
	}
	if before.AckFloor+int64(before.AckedAbove) != 10 || before.Lag != 0 {
		t.Fatalf("before the crash: floor %d acked above %d lag %d, want 10 done", before.AckFloor, before.AckedAbove, before.Lag)
	}
}

// __groups is compacted: after many progress writes the log shrinks to
// about one record per view, and the progress survives a restart.
func TestGroupsCompaction(t *testing.T) {
	dir := t.TempDir()
	start := func() *Broker {
		cfg := Default()
		cfg.DataDir, cfg.Listen, cfg.Admin = dir, "127.0.0.1:0", ""
		cfg.groupsCompactBytes, cfg.groupsCompactCheck = 4<<10, 50*time.Millisecond
		b, err := Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	b := start()
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "t", 2)
	produce(t, w, "t", 0, 300)
	produce(t, w, "t", 1, 300)
	sub := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "g", Topic: "t", Credits: 1})
	for i := 0; i < 600; i++ { // one ack per write: 600 progress records
		ds := w.deliveries(1, 5*time.Second)
		if len(ds) != 1 {
			t.Fatalf("delivery %d missing", i)
		}
		ackAll(t, w, sub, ds, 1)
	}
	st := func() (int64, int64) {
		e := w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_DescribeTopic{DescribeTopic: &heraldpb.DescribeTopicRequest{Name: "__groups"}}}).GetDescribeTopicResponse().Topic
		return e.Partitions[0].LogStartOffset, e.Partitions[0].HighWatermark
	}
	checkFor(t, func() error {
		if lo, hi := st(); hi < 600 || lo < 300 || hi-lo > 200 {
			return fmt.Errorf("__groups holds offsets [%d, %d): not compacted", lo, hi)
		}
		return nil
	})
	if err := b.Shutdown(); err != nil {
		t.Fatal(err)
	}
	b = start()
	defer b.Shutdown()
	w = dialWire(t, b.ClientAddr())
	if d := describe(t, w, "g"); d.Partitions[0].AckFloor != 300 || d.Partitions[1].AckFloor != 300 {
		t.Fatalf("progress after compaction and restart: %v", d.Partitions)
	}
}

// Clustering mode's Kafka-style commit: everything below the committed
// offset is done, acked or not, and durable when the commit is answered.
func TestGroupCommit(t *testing.T) {
	dir := t.TempDir()
	b := startTestBroker(t, dir)
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "t", 2)
	produce(t, w, "t", 0, 10)
	sub := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "g", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_CLUSTERING, Credits: 100})
	if got := w.deliveries(10, 5*time.Second); len(got) != 10 {
		t.Fatalf("got %d of 10", len(got))
	}
	w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Commit{Commit: &heraldpb.CommitRequest{SubscriptionId: sub, Partition: 0, Offset: 6}}})
	if r := w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Commit{Commit: &heraldpb.CommitRequest{SubscriptionId: sub, Partition: 7, Offset: 1}}}); r.GetError() == nil {
		t.Fatal("commit of a partition the member does not own was accepted")
	}
	if d := describe(t, w, "g"); d.Partitions[0].AckFloor != 6 || d.Members[0].InFlight != 4 {
		t.Fatalf("after commit 6: floor %d, in flight %d", d.Partitions[0].AckFloor, d.Members[0].InFlight)
	}
	b.Shutdown()
	b = startTestBroker(t, dir)
	defer b.Shutdown()
	w = dialWire(t, b.ClientAddr())
	subscribe(t, w, &heraldpb.SubscribeRequest{Group: "g", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_CLUSTERING, Credits: 100})
	if got := w.deliveries(4, 5*time.Second); len(got) != 4 || got[0].Offset != 6 {
		t.Fatalf("after restart: %v", ids(got))
	}
}

// A client sending consumer-group and request-reply requests with random
// fields (unknown subscriptions, partitions and offsets out of range, huge
// credits and delays, bad filters, replies to nowhere) gets answers, never
// crashes or wedges the broker, and a well-behaved group works afterwards.
func TestGroupRequestsWithGarbageFields(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "t", 3)
	produce(t, w, "t", 0, 50)
	r := rand.New(rand.NewPCG(11, 12))
	var subs []uint64
	pick := func() uint64 {
		if len(subs) > 0 && r.IntN(3) > 0 {
			return subs[r.IntN(len(subs))]
		}
		return r.Uint64()
	}
	parts := func() ([]uint32, []int64) {
		n := r.IntN(40)
		ps, os := make([]uint32, n), make([]int64, n)
		for i := range ps {
			ps[i] = uint32(r.IntN(5))
			os[i] = r.Int64N(200) - 20
		}
		if r.IntN(5) == 0 && n > 0 {
			os = os[1:] // mismatched lengths
		}
		return ps, os
	}
	modes := []heraldpb.SubscriptionMode{0, 1, 2, 3, 9}
	filters := []string{"", "a || b", "n > ", "x IN (1,2", "'", "*"}
	var pending []chan *heraldpb.Frame
	for i := 0; i < 3000; i++ {
		var f *heraldpb.Frame
		switch r.IntN(9) {
		case 0:
			f = &heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{
				Group: []string{"g1", "g2", "", "bad name!"}[r.IntN(4)], Topic: []string{"t", "nope", "__groups"}[r.IntN(3)],
				Mode: modes[r.IntN(len(modes))], FilterType: heraldpb.FilterType(r.IntN(4)), Filter: filters[r.IntN(len(filters))],
				Credits: r.Uint32(), AckTimeoutMs: uint32(r.IntN(100)), AutoAck: r.IntN(2) == 0, Orderly: r.IntN(2) == 0,
				Start: &heraldpb.StartPosition{At: &heraldpb.StartPosition_Offset{Offset: r.Int64N(1000) - 500}}, Responder: r.IntN(3) == 0,
			}}}
		case 1:
			ps, os := parts()
			f = &heraldpb.Frame{Body: &heraldpb.Frame_Ack{Ack: &heraldpb.AckRequest{SubscriptionId: pick(), Partitions: ps, Offsets: os, Credits: r.Uint32()}}}
		case 2:
			ps, os := parts()
			f = &heraldpb.Frame{Body: &heraldpb.Frame_Nack{Nack: &heraldpb.NackRequest{SubscriptionId: pick(), Partitions: ps, Offsets: os, DelayMs: proto.Uint32(r.Uint32()), Credits: r.Uint32()}}}
		case 3:
			f = &heraldpb.Frame{Body: &heraldpb.Frame_Commit{Commit: &heraldpb.CommitRequest{SubscriptionId: pick(), Partition: uint32(r.IntN(5)), Offset: r.Int64N(1 << 62)}}}
		case 4:
			f = &heraldpb.Frame{Body: &heraldpb.Frame_Unsubscribe{Unsubscribe: &heraldpb.UnsubscribeRequest{SubscriptionId: pick()}}}
		case 5:
			f = &heraldpb.Frame{Body: &heraldpb.Frame_ResetGroup{ResetGroup: &heraldpb.ResetGroupRequest{Group: "g1", Force: r.IntN(2) == 0,
				Partitions: []uint32{uint32(r.IntN(5))}, To: &heraldpb.StartPosition{At: &heraldpb.StartPosition_TimestampMs{TimestampMs: r.Int64N(1 << 45)}}}}}
		case 6:
			f = &heraldpb.Frame{Body: &heraldpb.Frame_DescribeGroup{DescribeGroup: &heraldpb.DescribeGroupRequest{Group: []string{"g1", "g2", "x"}[r.IntN(3)]}}}
		case 7:
			f = &heraldpb.Frame{Body: &heraldpb.Frame_Call{Call: &heraldpb.CallRequest{Topic: "t", CorrelationId: r.Uint64(), Record: &heraldpb.Record{Value: []byte("x")}}}}
		default:
			f = &heraldpb.Frame{Body: &heraldpb.Frame_Reply{Reply: &heraldpb.ReplyRequest{Inbox: fmt.Sprintf("netio/session$%d~%d", r.IntN(5), r.IntN(3)), CorrelationId: r.Uint64()}}}
		}
		pending = append(pending, w.send(f))
		if len(pending) >= 64 { // stay inside the connection's in-flight window
			for _, ch := range pending {
				select {
				case resp := <-ch:
					if s := resp.GetSubscribeResponse(); s != nil {
						subs = append(subs, s.SubscriptionId)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("request %d: no answer", i)
				}
			}
			pending = pending[:0]
		}
	}
	for _, ch := range pending {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("no answer")
		}
	}
	// A fresh, well-behaved group still works.
	w2 := dialWire(t, b.ClientAddr())
	sub := subscribe(t, w2, &heraldpb.SubscribeRequest{Group: "after", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: 100})
	if got := w2.deliveries(50, 10*time.Second); len(got) != 50 {
		t.Fatalf("after the garbage: %d of 50 delivered", len(got))
	} else {
		ackAll(t, w2, sub, got, 0)
	}
}

// Requests the review found could wedge or spin a group are refused.
func TestGroupRefusesUnsafeRequests(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "t", 1)
	produce(t, w, "t", 0, 3)
	code := func(f *heraldpb.Frame) heraldpb.ErrorCode { return w.call(f).GetError().GetCode() }
	// A broadcast member without a name would get a new position per connection.
	if c := code(&heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{Group: "b", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_BROADCAST}}}); c != heraldpb.ErrorCode_INVALID_REQUEST {
		t.Fatalf("nameless broadcast member: %v", c)
	}
	// A name too long to store.
	if c := code(&heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{Group: "b", Topic: "t", MemberName: strings.Repeat("n", 300)}}}); c != heraldpb.ErrorCode_INVALID_REQUEST {
		t.Fatalf("long member name: %v", c)
	}
	// A commit past the end of the log.
	sub := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "c", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_CLUSTERING, Credits: 10})
	w.deliveries(3, 5*time.Second)
	if c := code(&heraldpb.Frame{Body: &heraldpb.Frame_Commit{Commit: &heraldpb.CommitRequest{SubscriptionId: sub, Partition: 0, Offset: 1000}}}); c != heraldpb.ErrorCode_INVALID_REQUEST {
		t.Fatalf("commit beyond the high watermark: %v", c)
	}
	// A subscription to a missing topic leaves no group behind.
	if c := code(&heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{Group: "ghost", Topic: "missing"}}}); c != heraldpb.ErrorCode_TOPIC_NOT_FOUND {
		t.Fatalf("missing topic: %v", c)
	}
	if c := code(&heraldpb.Frame{Body: &heraldpb.Frame_DescribeGroup{DescribeGroup: &heraldpb.DescribeGroupRequest{Group: "ghost"}}}); c != heraldpb.ErrorCode_GROUP_NOT_FOUND {
		t.Fatalf("describe of the ghost group: %v", c)
	}
}

// Deleting a group's topic ends its live subscriptions (their partition
// actors are gone), with a SubscriptionEnded push saying why.
func TestGroupTopicDeleted(t *testing.T) {
	b := startTestBroker(t, t.TempDir())
	defer b.Shutdown()
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "t", 1)
	sub := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "g", Topic: "t", Credits: 10})
	w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_DeleteTopic{DeleteTopic: &heraldpb.DeleteTopicRequest{Name: "t"}}})
	deadline := time.After(10 * time.Second)
	for {
		select {
		case f := <-w.pushes:
			if e := f.GetSubscriptionEnded(); e != nil {
				if e.SubscriptionId != sub || e.Reason.GetCode() != heraldpb.ErrorCode_TOPIC_NOT_FOUND {
					t.Fatalf("ended: %v", e)
				}
				if d := describe(t, w, "g"); len(d.Members) != 0 {
					t.Fatalf("members after the topic was deleted: %v", d.Members)
				}
				return
			}
		case <-deadline:
			t.Fatal("no SubscriptionEnded after the topic was deleted")
		}
	}
}

// A NackRequest naming many messages is one failure for the breaker, as an
// AckRequest is one success: the SDK batches settlements, so a member that
// fails one message in five sends its nacks together, and counting them one
// by one opened its breaker.
func TestGroupBreakerCountsRequests(t *testing.T) {
	b := startBreakerBroker(t, 3, time.Minute)
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "t", 1)
	produce(t, w, "t", 0, 10)
	sub := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "g", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: 10})
	ds := w.deliveries(10, 5*time.Second)
	// Five nacks in one request, then five acks, then the retries.
	nack := &heraldpb.NackRequest{SubscriptionId: sub}
	for _, d := range ds[:5] {
		nack.Partitions = append(nack.Partitions, d.Partition)
		nack.Offsets = append(nack.Offsets, d.Offset)
	}
	w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Nack{Nack: nack}})
	if d := describe(t, w, "g"); d.Members[0].Breaker != heraldpb.BreakerState_BREAKER_CLOSED {
		t.Fatalf("breaker after one request of five nacks: %v", d.Members[0])
	}
	ackAll(t, w, sub, ds[5:], 10)
	retries := w.deliveries(5, 10*time.Second)
	if len(retries) != 5 {
		t.Fatalf("%d retries, want 5", len(retries))
	}
	ackAll(t, w, sub, retries, 0)
	if d := describe(t, w, "g"); d.Members[0].Breaker != heraldpb.BreakerState_BREAKER_CLOSED {
		t.Fatalf("breaker at the end: %v", d.Members[0])
	}
}

// startBreakerBroker starts a broker whose consumer breakers open after
// failures in a row, for coolDown; it shuts down when the test ends.
func startBreakerBroker(t *testing.T, failures int, coolDown time.Duration) *Broker {
	t.Helper()
	cfg := Default()
	cfg.DataDir, cfg.Listen, cfg.Admin = t.TempDir(), "127.0.0.1:0", ""
	cfg.BreakerFailures, cfg.BreakerCoolDown = failures, coolDown
	b, err := Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Shutdown() })
	return b
}
