package client

import (
	"context"
	"testing"
	"time"

	"github.com/heraldmq/herald/client/fakebroker"
	heraldpb "github.com/heraldmq/herald/proto"
)

func TestGroupAdmin(t *testing.T) {
	b := newBroker(t, fakebroker.Topic("t", 2))
	c := dial(t, b)
	ctx := testCtx(t)
	if gs, err := c.ListGroups(ctx); err != nil || len(gs) != 0 {
		t.Fatalf("no groups: %v %v", gs, err)
	}
	if _, err := c.DescribeGroup(ctx, "g"); !IsCode(err, heraldpb.ErrorCode_GROUP_NOT_FOUND) {
		t.Fatalf("describe unknown: %v", err)
	}
	produceN(t, c, "t", 10, 3)
	var col collector
	s := subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", Mode: Shared, From: Earliest(), Name: "w1", Tags: "*"},
		func(_ context.Context, m *Delivered) { col.add(m) })
	waitFor(t, 5*time.Second, "10 messages", func() bool { return col.len() == 10 })
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	gs, err := c.ListGroups(ctx)
	if err != nil || len(gs) != 1 || gs[0].GetGroup() != "g" || gs[0].GetTopic() != "t" || gs[0].GetMembers() != 1 ||
		gs[0].GetMode() != heraldpb.SubscriptionMode_MODE_SHARED || gs[0].GetLag() != 0 {
		t.Fatalf("list: %v %v", gs, err)
	}
	gi, err := c.DescribeGroup(ctx, "g")
	if err != nil || len(gi.GetMembers()) != 1 || gi.GetMembers()[0].GetName() != "w1" || len(gi.GetPartitions()) != 2 ||
		gi.GetFilterType() != heraldpb.FilterType_FILTER_TAG || gi.GetFilter() != "*" {
		t.Fatalf("describe: %v %v", gi, err)
	}
	if _, err := c.ResetGroup(ctx, "g", Earliest(), false); !IsCode(err, heraldpb.ErrorCode_GROUP_HAS_MEMBERS) {
		t.Fatalf("reset with members: %v", err)
	}
	if _, err := c.ResetGroup(ctx, "g", StartPosition{}, true); err == nil {
		t.Fatal("reset without a position")
	}
	if _, err := c.ResetGroup(ctx, "g", Earliest(), true, -1); err == nil {
		t.Fatal("reset of partition -1")
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	gi, err = c.ResetGroup(ctx, "g", AtOffset(1), false, 0)
	if err != nil {
		t.Fatal(err)
	}
	var lag int64
	for _, p := range gi.GetPartitions() {
		lag += p.GetLag()
		if p.GetPartition() == 0 && p.GetAckFloor() != 1 {
			t.Fatalf("partition 0 floor %d after reset to 1", p.GetAckFloor())
		}
	}
	hw0, _ := b.HighWatermark("t", 0)
	if lag != hw0-1 {
		t.Fatalf("lag %d after resetting partition 0 to 1 (high watermark %d)", lag, hw0)
	}
	// Subscribing again replays from the reset position.
	var col2 collector
	subscribe(t, c, SubscribeOptions{Group: "g", Topic: "t", Mode: Shared, Tags: "*"}, func(_ context.Context, m *Delivered) { col2.add(m) })
	waitFor(t, 5*time.Second, "the replay", func() bool { return int64(col2.len()) == hw0-1 })
}
