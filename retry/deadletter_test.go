package retry

import (
	"errors"
	"testing"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

func TestDeadLetterRoundTrip(t *testing.T) {
	rec := &heraldpb.Record{Key: []byte("k"), Value: []byte("v"), Tags: []string{"t"}, TimestampMs: 42,
		Headers: []*heraldpb.Header{{Key: "app", Value: []byte("x")}, {Key: HeaderDLQReason, Value: []byte("old")}}}
	o := Origin{Topic: "orders", Partition: 3, Offset: 1 << 40, Deliveries: 16, Reason: "ack timeout",
		Time: time.Date(2026, 11, 29, 14, 0, 0, 123e6, time.UTC)}
	dl := DeadLetter(rec, o)
	got, err := OriginOf(dl)
	if err != nil || got != o {
		t.Fatalf("OriginOf = %+v, %v; want %+v", got, err, o)
	}
	if len(rec.Headers) != 2 || string(rec.Headers[1].Value) != "old" {
		t.Fatal("DeadLetter modified its input")
	}
	back := Redriven(dl)
	want := &heraldpb.Record{Key: []byte("k"), Value: []byte("v"), Tags: []string{"t"}, TimestampMs: 42,
		Headers: []*heraldpb.Header{{Key: "app", Value: []byte("x")}}}
	if !proto.Equal(back, want) {
		t.Fatalf("Redriven = %v, want %v", back, want)
	}
	if _, err := OriginOf(back); !errors.Is(err, ErrNotDeadLetter) {
		t.Fatalf("OriginOf a redriven record: %v", err)
	}
	if DeadLetterTopic("billing", "") != "billing.dlq" || DeadLetterTopic("billing", "x") != "x" {
		t.Fatal("DeadLetterTopic")
	}
}

func TestOriginOfRejects(t *testing.T) {
	good := DeadLetter(&heraldpb.Record{}, Origin{Topic: "t", Deliveries: 1, Time: time.Unix(0, 0)})
	for _, tc := range []struct{ key, val string }{
		{HeaderDLQTopic, ""}, {HeaderDLQPartition, "-1"}, {HeaderDLQPartition, "4294967296"},
		{HeaderDLQOffset, "x"}, {HeaderDLQOffset, "-5"}, {HeaderDLQDeliveries, "-1"}, {HeaderDLQTime, "yesterday"},
	} {
		r := proto.Clone(good).(*heraldpb.Record)
		for _, h := range r.Headers {
			if h.Key == tc.key {
				h.Value = []byte(tc.val)
			}
		}
		if _, err := OriginOf(r); !errors.Is(err, ErrNotDeadLetter) {
			t.Errorf("%s=%q accepted: %v", tc.key, tc.val, err)
		}
	}
}

// FuzzOriginOf: header values from the wire never panic OriginOf, and an
// origin it accepts survives another DeadLetter/OriginOf round trip.
func FuzzOriginOf(f *testing.F) {
	f.Add("orders", "3", "17", "16", "nack", "2026-11-29T14:00:00.123Z")
	f.Add("", "", "", "", "", "")
	f.Add("t", "4294967295", "9223372036854775807", "1", "", "2026-11-29T14:00:00+02:00")
	f.Fuzz(func(t *testing.T, topic, part, off, dels, reason, ts string) {
		r := &heraldpb.Record{}
		for _, kv := range [][2]string{{HeaderDLQTopic, topic}, {HeaderDLQPartition, part}, {HeaderDLQOffset, off},
			{HeaderDLQDeliveries, dels}, {HeaderDLQReason, reason}, {HeaderDLQTime, ts}} {
			r.Headers = append(r.Headers, &heraldpb.Header{Key: kv[0], Value: []byte(kv[1])})
		}
		o, err := OriginOf(r)
		if err != nil {
			return
		}
		o2, err := OriginOf(DeadLetter(r, o))
		if err != nil || o2.Topic != o.Topic || o2.Partition != o.Partition || o2.Offset != o.Offset ||
			o2.Deliveries != o.Deliveries || o2.Reason != o.Reason || !o2.Time.Equal(o.Time.Truncate(time.Millisecond)) {
			t.Fatalf("round trip %+v -> %+v, %v", o, o2, err)
		}
	})
}
