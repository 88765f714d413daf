package broker

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// wire is a raw protocol client: these tests check the broker's consumer
// groups frame by frame, independent of the SDK.
type wire struct {
	t      *testing.T
	c      net.Conn
	mu     sync.Mutex
	nextID uint64
	resp   map[uint64]chan *heraldpb.Frame
	pushes chan *heraldpb.Frame
}

func dialWire(t *testing.T, addr string) *wire {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	w := &wire{t: t, c: c, resp: map[uint64]chan *heraldpb.Frame{}, pushes: make(chan *heraldpb.Frame, 100000)}
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
	w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: topicName, Partition: proto.Uint32(part), Records: recs}}})
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
	r = w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{
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
