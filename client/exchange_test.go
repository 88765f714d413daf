package client

import (
	"bytes"
	"fmt"
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
)

// The hand-written publish frame is byte for byte what proto.Marshal
// gives for the same PublishRequest.
func TestPublishFrameEncoding(t *testing.T) {
	records, _ := encodeRecord(nil, &Message{Key: []byte("k"), Value: bytes.Repeat([]byte("v"), 300)})
	records, _ = encodeRecord(records, &Message{Value: []byte("w"), Headers: []Header{{Key: "h", Value: []byte("1")}}})
	for i, req := range []*heraldpb.PublishRequest{
		{},
		{Exchange: "orders", RoutingKey: "eu.order.created"},
		{RoutingKey: "topic", Mandatory: true, TimeoutMs: 30000},
		{Exchange: "x", RoutingKey: "k", Mandatory: true, TimeoutMs: 1, ProducerId: 1<<63 - 1, Sequence: 1 << 40},
		{Exchange: "x", ProducerId: 5, Sequence: 0},
	} {
		for _, id := range []uint64{0, 1, 1 << 50} {
			for _, recs := range [][]byte{nil, records} {
				got := appendPublishFrame([]byte("pre"), id, req, recs)
				want := &heraldpb.PublishRequest{Exchange: req.Exchange, RoutingKey: req.RoutingKey, Records: recs, Mandatory: req.Mandatory,
					TimeoutMs: req.TimeoutMs, ProducerId: req.ProducerId, Sequence: req.Sequence}
				ref, err := heraldpb.AppendFrame([]byte("pre"), &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_Publish{Publish: want}})
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, ref) {
					t.Errorf("%s: got %x\nwant %x", fmt.Sprint(i, id, len(recs)), got, ref)
				}
			}
		}
	}
}
