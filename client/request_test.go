package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/heraldmq/herald/client/fakebroker"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// pendingCalls counts the Requests registered on c's connections.
func pendingCalls(c *Client) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, cn := range c.conns {
		cn.mu.Lock()
		n += len(cn.calls)
		cn.mu.Unlock()
	}
	return n
}

func respond(t *testing.T, c *Client, topic, group string, fn RespondFunc, opts ...func(*SubscribeOptions)) *Subscription {
	t.Helper()
	s, err := c.Respond(testCtx(t), topic, group, fn, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

func TestRequestReply(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("rpc", 1))
	server := dial(t, b, WithClientID("server"))
	caller := dial(t, b, WithClientID("caller"))
	s := respond(t, server, "rpc", "upper", func(_ context.Context, req *Delivered) (*Message, error) {
		if !req.IsRequest() || req.Partition != -1 || req.Offset != -1 || req.CorrelationID == 0 {
			return nil, fmt.Errorf("not a request: %+v", req)
		}
		switch string(req.Value) {
		case "fail":
			return &Message{Value: []byte("partial")}, errors.New("cannot do that")
		case "empty":
			return nil, nil
		}
		return &Message{Key: req.Key, Value: bytes.ToUpper(req.Value), Headers: req.Headers, Tags: []string{"reply"}}, nil
	}, func(o *SubscribeOptions) { o.Concurrency = 4; o.Mode = Clustering; o.AutoAck = false })

	if req := b.SubscribeRequests()[0]; !req.GetResponder() || !req.GetAutoAck() || req.GetMode() != heraldpb.SubscriptionMode_MODE_SHARED {
		t.Fatalf("responder subscribe %v", req)
	}
	ctx := testCtx(t)
	rep, err := caller.Request(ctx, "rpc", &Message{Key: []byte("k"), Value: []byte("hello"),
		Headers: []Header{{Key: "trace", Value: []byte("abc")}}})
	if err != nil {
		t.Fatal(err)
	}
	if string(rep.Value) != "HELLO" || string(rep.Key) != "k" || len(rep.Headers) != 1 || rep.Headers[0].Key != "trace" ||
		rep.Topic != "rpc" || len(rep.Tags) != 1 {
		t.Fatalf("reply %+v", rep)
	}
	rep, err = caller.Request(ctx, "rpc", &Message{Value: []byte("fail")})
	var re *ResponderError
	if !errors.As(err, &re) || re.Message != "cannot do that" || rep == nil || string(rep.Value) != "partial" || IsRetryable(err) {
		t.Fatalf("error reply: %+v %v", rep, err)
	}
	if rep, err = caller.Request(ctx, "rpc", &Message{Value: []byte("empty")}); err != nil || len(rep.Value) != 0 {
		t.Fatalf("empty reply: %+v %v", rep, err)
	}
	if rep, err = caller.Request(ctx, "rpc", nil); err != nil || len(rep.Value) != 0 {
		t.Fatalf("nil request: %+v %v", rep, err)
	}

	// Concurrent requests each get their own reply.
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := fmt.Sprintf("req-%d", i)
			rep, err := caller.Request(ctx, "rpc", &Message{Value: []byte(v)})
			if err != nil || string(rep.Value) != strings.ToUpper(v) {
				t.Errorf("request %s: %v %v", v, rep, err)
			}
		}()
	}
	wg.Wait()
	if n := pendingCalls(caller); n != 0 {
		t.Fatalf("%d calls still registered", n)
	}
	// Calls use credits and give them back; they are never acked. (The
	// caller can have its reply before the handler has returned.)
	waitFor(t, 5*time.Second, "the handlers", func() bool { return s.Stats().InFlight == 0 })
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, a := range b.Acks() {
		if len(a.Offsets) > 0 || a.Nack {
			t.Fatalf("a request was acked: %+v", a)
		}
	}
	if st := s.Stats(); st.Delivered != 54 || st.InFlight != 0 {
		t.Fatalf("responder stats %+v", st)
	}
}

func TestRequestNoResponders(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("rpc", 1))
	c := dial(t, b)
	_, err := c.Request(testCtx(t), "rpc", &Message{Value: []byte("x")})
	if !IsCode(err, heraldpb.ErrorCode_NO_RESPONDERS) || IsRetryable(err) {
		t.Fatalf("request without responders: %v", err)
	}
	if n := pendingCalls(c); n != 0 {
		t.Fatalf("%d calls still registered", n)
	}
	if _, err := c.Request(testCtx(t), "", nil); err == nil {
		t.Fatal("request without topic")
	}
}

// silentResponder subscribes a responder on a broker that delivers nothing,
// so Requests get their CallResponse and never a reply.
func silentResponder(t *testing.T) (*fakebroker.Broker, *Client) {
	b := newBroker(t, fakebroker.Topic("rpc", 1), fakebroker.AutoDeliver(false))
	c := dial(t, b)
	respond(t, c, "rpc", "g", func(context.Context, *Delivered) (*Message, error) { return nil, nil })
	return b, c
}

func TestRequestTimeoutAndCancel(t *testing.T) {
	b, c := silentResponder(t)
	calls := 0
	b.SetHook(func(_ int, f *heraldpb.Frame) fakebroker.Action {
		if f.GetCall() != nil {
			calls++
		}
		return fakebroker.Action{}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := c.Request(ctx, "rpc", &Message{Value: []byte("x")}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("timeout: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("returned after %s", d)
	}
	if n := pendingCalls(c); n != 0 {
		t.Fatalf("%d calls still registered after a timeout", n)
	}

	ctx2, cancel2 := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Request(ctx2, "rpc", &Message{Value: []byte("y")})
		done <- err
	}()
	waitFor(t, 5*time.Second, "the call registered", func() bool { return pendingCalls(c) == 1 })
	cancel2()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancel: %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("cancelled request did not return")
	}
	if n := pendingCalls(c); n != 0 {
		t.Fatalf("%d calls still registered after cancel", n)
	}

	// Late replies for the abandoned calls are dropped.
	for corr := uint64(1); corr <= 2; corr++ {
		if err := b.Push(1, &heraldpb.Frame{Body: &heraldpb.Frame_ReplyDelivery{ReplyDelivery: &heraldpb.ReplyDelivery{
			CorrelationId: corr, Record: &heraldpb.Record{Value: []byte("late")}}}}); err != nil {
			t.Fatal(err)
		}
	}
	// A hand-delivered reply completes the next request.
	done2 := make(chan *Message, 1)
	go func() {
		m, err := c.Request(testCtx(t), "rpc", &Message{Value: []byte("z")})
		if err != nil {
			t.Error(err)
		}
		done2 <- m
	}()
	waitFor(t, 5*time.Second, "the third call", func() bool { return pendingCalls(c) == 1 })
	if err := b.Push(1, &heraldpb.Frame{Body: &heraldpb.Frame_ReplyDelivery{ReplyDelivery: &heraldpb.ReplyDelivery{
		CorrelationId: 3, Record: &heraldpb.Record{Value: []byte("pushed")}}}}); err != nil {
		t.Fatal(err)
	}
	if m := <-done2; m == nil || string(m.Value) != "pushed" {
		t.Fatalf("reply %+v", m)
	}
	if b.Connections() != 1 {
		t.Fatalf("%d connections: a timed-out request closed the connection", b.Connections())
	}
}

// The client's request timeout bounds the wait for the reply too, without
// closing the connection (the broker answered the call).
func TestRequestClientTimeout(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("rpc", 1), fakebroker.AutoDeliver(false))
	c := dial(t, b, WithRequestTimeout(50*time.Millisecond))
	respond(t, c, "rpc", "g", func(context.Context, *Delivered) (*Message, error) { return nil, nil })
	_, err := c.Request(context.Background(), "rpc", &Message{Value: []byte("x")})
	if !errors.Is(err, ErrRequestTimeout) || !IsRetryable(err) {
		t.Fatalf("request: %v", err)
	}
	if n := pendingCalls(c); n != 0 || b.Connections() != 1 {
		t.Fatalf("calls %d connections %d", n, b.Connections())
	}
}

func TestRequestConnectionLost(t *testing.T) {
	b, c := silentResponder(t)
	done := make(chan error, 1)
	go func() {
		_, err := c.Request(testCtx(t), "rpc", &Message{Value: []byte("x")})
		done <- err
	}()
	waitFor(t, 5*time.Second, "the call registered", func() bool { return pendingCalls(c) == 1 })
	b.DropConnections()
	select {
	case err := <-done:
		if !errors.Is(err, ErrConnectionLost) || !IsRetryable(err) {
			t.Fatalf("request on a dropped connection: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("request did not fail")
	}
}

func TestReplyErrors(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("rpc", 1))
	c := dial(t, b)
	ctx := testCtx(t)
	if err := c.Reply(ctx, &Delivered{}, nil); !errors.Is(err, ErrNotRequest) {
		t.Fatalf("reply to a non-request: %v", err)
	}
	if err := c.Reply(ctx, nil, nil); !errors.Is(err, ErrNotRequest) {
		t.Fatalf("reply to nil: %v", err)
	}
	err := c.Reply(ctx, &Delivered{ReplyInbox: "fake-inbox-99", CorrelationID: 1}, &Message{Value: []byte("x")})
	if !IsCode(err, heraldpb.ErrorCode_INBOX_NOT_FOUND) {
		t.Fatalf("reply to a gone inbox: %v", err)
	}
	if _, err := c.Respond(ctx, "rpc", "g", nil); err == nil {
		t.Fatal("respond with nil function")
	}
}

func requestFrameCases() []struct {
	id, corr uint64
	str      string
	m        *Message
} {
	ts := time.UnixMilli(1_700_000_000_123)
	return []struct {
		id, corr uint64
		str      string
		m        *Message
	}{
		{1, 1, "rpc", &Message{Value: []byte("v")}},
		{0, 0, "", &Message{}},
		{1 << 40, 1<<64 - 1, "a-topic-with-a-longer-name", &Message{Key: []byte("k"), Value: bytes.Repeat([]byte("x"), 300),
			Headers:   []Header{{Key: "h1", Value: []byte("1")}, {Key: "", Value: nil}, {Key: "h1", Value: []byte("2")}},
			Timestamp: ts, Tags: []string{"a", "b"}}},
		{7, 9, strings.Repeat("t", 200), &Message{Value: bytes.Repeat([]byte("y"), 70000)}},
	}
}

func recordOf(m *Message) *heraldpb.Record {
	r := &heraldpb.Record{Key: m.Key, Value: m.Value, Tags: m.Tags}
	if !m.Timestamp.IsZero() {
		r.TimestampMs = m.Timestamp.UnixMilli()
	}
	for _, h := range m.Headers {
		r.Headers = append(r.Headers, &heraldpb.Header{Key: h.Key, Value: h.Value})
	}
	return r
}

// The hand-written CallRequest and ReplyRequest frames are byte for byte
// what proto.Marshal gives.
func TestRequestFrameEncoding(t *testing.T) {
	for i, tc := range requestFrameCases() {
		checkRequestFrames(t, fmt.Sprint(i), tc.id, tc.corr, tc.str, tc.m)
	}
	prefix := []byte("existing")
	got, err := appendCallFrame(prefix, 1, "t", 2, &Message{Value: []byte("v")})
	if err != nil || !bytes.HasPrefix(got, []byte("existing")) {
		t.Fatalf("append to a non-empty buffer: %q %v", got, err)
	}
	if got, err := appendCallFrame(prefix, 1, "bad\xff", 2, &Message{}); err == nil || string(got) != "existing" {
		t.Fatalf("invalid UTF-8 topic: %q %v", got, err)
	}
	if got, err := appendReplyFrame(prefix, 1, "inbox", 2, &Message{Tags: []string{"\xff"}}); err == nil || string(got) != "existing" {
		t.Fatalf("invalid UTF-8 tag: %q %v", got, err)
	}
	if raceEnabled {
		return // the race detector's instrumentation allocates
	}
	buf := make([]byte, 0, 4096)
	m := &Message{Key: []byte("k"), Value: []byte("value"), Headers: []Header{{Key: "h", Value: []byte("v")}}}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := appendCallFrame(buf[:0], 12345, "rpc", 678, m); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("appendCallFrame allocates %.1f times", n)
	}
}

func checkRequestFrames(t *testing.T, name string, id, corr uint64, str string, m *Message) {
	t.Helper()
	want, werr := heraldpb.AppendFrame(nil, &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_Call{Call: &heraldpb.CallRequest{
		Topic: str, Record: recordOf(m), CorrelationId: corr}}})
	got, gerr := appendCallFrame(nil, id, str, corr, m)
	if (werr == nil) != (gerr == nil) || werr == nil && !bytes.Equal(got, want) {
		t.Fatalf("%s: call frame\n got %x %v\nwant %x %v", name, got, gerr, want, werr)
	}
	want, werr = heraldpb.AppendFrame(nil, &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_Reply{Reply: &heraldpb.ReplyRequest{
		Inbox: str, CorrelationId: corr, Record: recordOf(m)}}})
	got, gerr = appendReplyFrame(nil, id, str, corr, m)
	if (werr == nil) != (gerr == nil) || werr == nil && !bytes.Equal(got, want) {
		t.Fatalf("%s: reply frame\n got %x %v\nwant %x %v", name, got, gerr, want, werr)
	}
	if gerr == nil {
		f, err := heraldpb.DecodeFrame(got[heraldpb.HeaderLen:])
		if err != nil || !proto.Equal(f.GetReply().GetRecord(), recordOf(m)) {
			t.Fatalf("%s: decoded %v %v", name, f, err)
		}
	}
}

// FuzzRequestFrames checks that appendCallFrame and appendReplyFrame give
// exactly proto.Marshal's bytes (and fail exactly when it fails, on
// invalid UTF-8) for any id, correlation id, topic and record.
func FuzzRequestFrames(f *testing.F) {
	for _, tc := range requestFrameCases() {
		var hk string
		var hv []byte
		if len(tc.m.Headers) > 0 {
			hk, hv = tc.m.Headers[0].Key, tc.m.Headers[0].Value
		}
		f.Add(tc.id, tc.corr, tc.str, tc.m.Key, tc.m.Value, hk, hv, "tag", int64(0))
	}
	f.Fuzz(func(t *testing.T, id, corr uint64, str string, key, value []byte, hk string, hv []byte, tag string, ts int64) {
		m := &Message{Key: key, Value: value}
		if hk != "" || hv != nil {
			m.Headers = []Header{{Key: hk, Value: hv}}
		}
		if tag != "" {
			m.Tags = []string{tag}
		}
		if ts > 0 {
			m.Timestamp = time.UnixMilli(ts)
		}
		if len(key) == 0 {
			m.Key = nil
		}
		if len(value) == 0 {
			m.Value = nil
		}
		checkRequestFrames(t, "fuzz", id, corr, str, m)
	})
}

// BenchmarkRequestReply measures one request-reply round trip through the
// in-process fake broker (caller and responder on separate connections).
// The fake is not the broker: compare runs, not absolute figures.
func BenchmarkRequestReply(b *testing.B) {
	fb, err := fakebroker.New(fakebroker.Topic("rpc", 1))
	if err != nil {
		b.Fatal(err)
	}
	defer fb.Close()
	ctx := context.Background()
	server, err := Dial(ctx, fb.Addr())
	if err != nil {
		b.Fatal(err)
	}
	defer server.Close()
	caller, err := Dial(ctx, fb.Addr())
	if err != nil {
		b.Fatal(err)
	}
	defer caller.Close()
	s, err := server.Respond(ctx, "rpc", "bench", func(_ context.Context, req *Delivered) (*Message, error) {
		return &Message{Value: req.Value}, nil
	})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(ctx)
	req := &Message{Value: bytes.Repeat([]byte("x"), 100)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := caller.Request(ctx, "rpc", req); err != nil {
			b.Fatal(err)
		}
	}
}
