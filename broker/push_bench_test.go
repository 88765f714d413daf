package broker

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// countDelivery counts the messages of a Delivery push, first deliveries
// and redeliveries apart, and appends their (partition, offset) without
// decoding records.
func countDelivery(f []byte, parts []uint32, offs []int64) (_ []uint32, _ []int64, first, again int) {
	for len(f) > 0 {
		num, typ, l := protowire.ConsumeTag(f)
		f = f[l:]
		if num != 60 || typ != protowire.BytesType {
			l = protowire.ConsumeFieldValue(num, typ, f)
			f = f[l:]
			continue
		}
		body, l := protowire.ConsumeBytes(f)
		f = f[l:]
		for len(body) > 0 {
			num, typ, l := protowire.ConsumeTag(body)
			body = body[l:]
			if num != 2 {
				l = protowire.ConsumeFieldValue(num, typ, body)
				body = body[l:]
				continue
			}
			m, l := protowire.ConsumeBytes(body)
			body = body[l:]
			var p uint32
			var o int64
			count := uint64(1)
			for len(m) > 0 {
				num, typ, l := protowire.ConsumeTag(m)
				m = m[l:]
				switch {
				case num == 1 && typ == protowire.VarintType:
					v, l := protowire.ConsumeVarint(m)
					p, m = uint32(v), m[l:]
				case num == 2 && typ == protowire.VarintType:
					v, l := protowire.ConsumeVarint(m)
					o, m = int64(v), m[l:]
				case num == 3 && typ == protowire.VarintType:
					v, l := protowire.ConsumeVarint(m)
					count, m = v, m[l:]
				default:
					l = protowire.ConsumeFieldValue(num, typ, m)
					m = m[l:]
				}
			}
			parts, offs = append(parts, p), append(offs, o)
			if count > 1 {
				again++
			} else {
				first++
			}
		}
	}
	return parts, offs, first, again
}

// pushAckIdle is how long the benchmark's subscriber holds a partial batch
// of acks (fewer than window/4) when no delivery is waiting; then it sends
// them. Without it a partial batch waits for more deliveries. With an ack
// timeout shorter than that wait, the held messages time out, five in a row
// open the member's breaker, and delivery pauses for the cool-down (30 s);
// the half-open probe (one message) then joins the held batch, times out
// unacked and re-opens the breaker: one message per cool-down, a run that
// never ends and uses no CPU.
const pushAckIdle = 2 * time.Millisecond

// pushStall fails a push benchmark run that receives nothing for this long
// (normal gaps are well under a millisecond: the records are all written
// before the subscription starts).
const pushStall = 10 * time.Second

// BenchmarkPush measures push delivery from a pre-filled partition to one
// raw-protocol subscriber that acks (or, autoack, only grants credits) in
// batches: b.N messages of 100 bytes. A run ends when every message arrived
// once; redeliveries (ack timeouts) are counted apart and reported as
// "redelivered". A run that receives nothing for pushStall fails with the
// group's state instead of waiting for ever.
func BenchmarkPush(b *testing.B) {
	for _, autoAck := range []bool{true, false} {
		b.Run(fmt.Sprintf("autoack=%v", autoAck), func(b *testing.B) { benchPush(b, autoAck) })
	}
}

func benchPush(b *testing.B, autoAck bool) {
	cfg := Default()
	cfg.DataDir, cfg.Listen, cfg.Admin = b.TempDir(), "127.0.0.1:0", ""
	br, err := Start(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer br.Shutdown()
	w := dialWireRaw(b, br.ClientAddr(), true)
	w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "t", Config: &heraldpb.TopicConfig{Partitions: 1}}}})
	val := make([]byte, 100)
	for left := b.N; left > 0; {
		n := min(left, 2000)
		batch := &heraldpb.RecordBatch{}
		for i := 0; i < n; i++ {
			batch.Records = append(batch.Records, &heraldpb.Record{Value: val})
		}
		recs, _ := proto.Marshal(batch)
		w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Partition: proto.Uint32(0), Records: recs}}})
		left -= n
	}
	window := 8192
	if v, err := strconv.Atoi(os.Getenv("PUSH_WINDOW")); err == nil {
		window = v
	}
	if os.Getenv("DEBUGSEG") != "" {
		filepath.Walk(cfg.DataDir, func(p string, fi os.FileInfo, err error) error { fmt.Println(p, fi.Size()); return nil })
	}
	b.ResetTimer()
	start := time.Now()
	sub := w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{
		Group: "g", Topic: "t", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: uint32(window), AutoAck: autoAck,
		Start: &heraldpb.StartPosition{At: &heraldpb.StartPosition_Earliest{Earliest: true}},
	}}}).GetSubscribeResponse().SubscriptionId
	got, again := 0, 0
	var parts []uint32
	var offs []int64
	ack := func() {
		req := &heraldpb.AckRequest{SubscriptionId: sub, Credits: uint32(len(parts))}
		if !autoAck {
			req.Partitions, req.Offsets = parts, offs
		}
		w.send(&heraldpb.Frame{Body: &heraldpb.Frame_Ack{Ack: req}})
		parts, offs = nil, nil
	}
	timer := time.NewTimer(pushStall)
	// next returns the next push, or nil when none came within d.
	next := func(d time.Duration) []byte {
		timer.Reset(d)
		defer timer.Stop()
		select {
		case raw := <-w.raw:
			return raw
		case f, ok := <-w.pushes:
			if !ok {
				b.Fatalf("connection closed after %d of %d messages", got, b.N)
			}
			b.Fatalf("unexpected frame after %d of %d messages: %v", got, b.N, f)
		case <-timer.C:
		}
		return nil
	}
	for got < b.N {
		var raw []byte
		select {
		case raw = <-w.raw:
		default:
			if len(parts) > 0 {
				if raw = next(pushAckIdle); raw == nil {
					ack()
				}
			}
			if raw == nil {
				if raw = next(pushStall); raw == nil {
					b.StopTimer()
					g := w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_DescribeGroup{DescribeGroup: &heraldpb.DescribeGroupRequest{Group: "g"}}}).GetDescribeGroupResponse().GetGroup()
					b.Fatalf("nothing pushed for %v after %d of %d messages (%d redelivered); group: %v", pushStall, got, b.N, again, g)
				}
			}
		}
		var first, n int
		parts, offs, first, n = countDelivery(raw, parts, offs)
		got, again = got+first, again+n
		if len(parts) >= window/4 {
			ack()
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	b.ReportMetric(float64(again), "redelivered")
}

// BenchmarkCallReply measures request-reply round trips through the broker
// with raw-protocol clients (no SDK) in this process: a caller sends
// CallRequest and waits for the ReplyDelivery push; a responder answers each
// call as it arrives. loops is the broker's network event loops.
func BenchmarkCallReply(b *testing.B) {
	for _, loops := range []int{1, 2} {
		b.Run(fmt.Sprintf("loops=%d", loops), func(b *testing.B) { benchCallReply(b, loops) })
	}
}

func benchCallReply(b *testing.B, loops int) {
	cfg := Default()
	cfg.DataDir, cfg.Listen, cfg.Admin, cfg.EventLoops = b.TempDir(), "127.0.0.1:0", "", loops
	br, err := Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	defer br.Shutdown()
	caller, resp := dialWire(b, br.ClientAddr()), dialWire(b, br.ClientAddr())
	caller.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "svc", Config: &heraldpb.TopicConfig{Partitions: 1}}}})
	sub := resp.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{
		Group: "svc", Topic: "svc", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Responder: true, AutoAck: true, Credits: 1 << 16,
	}}}).GetSubscribeResponse().SubscriptionId
	go func() {
		n := 0
		for f := range resp.pushes {
			for _, m := range f.GetDelivery().GetMessages() {
				resp.send(&heraldpb.Frame{Body: &heraldpb.Frame_Reply{Reply: &heraldpb.ReplyRequest{Inbox: m.ReplyInbox, CorrelationId: m.CorrelationId, Record: m.Record}}})
				if n++; n%1000 == 0 {
					resp.send(&heraldpb.Frame{Body: &heraldpb.Frame_Ack{Ack: &heraldpb.AckRequest{SubscriptionId: sub, Credits: 1000}}})
				}
			}
		}
	}()
	rec := &heraldpb.Record{Value: make([]byte, 100)}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		caller.send(&heraldpb.Frame{Body: &heraldpb.Frame_Call{Call: &heraldpb.CallRequest{Topic: "svc", CorrelationId: uint64(i + 1), Record: rec}}})
		for {
			f := <-caller.pushes
			if rd := f.GetReplyDelivery(); rd != nil && rd.CorrelationId == uint64(i+1) {
				break
			}
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
