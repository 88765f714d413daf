package broker

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/heraldmq/herald/actors/consumer"
	heraldpb "github.com/heraldmq/herald/proto"
)

// groupLag is the group's lag as `group list` shows it.
func groupLag(w *wire, group string) (int64, error) {
	lg := w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_ListGroups{ListGroups: &heraldpb.ListGroupsRequest{}}}).GetListGroupsResponse()
	for _, g := range lg.Groups {
		if g.Group == group {
			return g.Lag, nil
		}
	}
	return 0, fmt.Errorf("group %s not listed: %v", group, lg.Groups)
}

// Issue 15's defects: the lag of a group with no members went stale in
// `group list` and in herald_consumer_lag (they showed 0 while `group
// describe` showed 30), and its coordinator was never stopped. Now the lag
// stays current, the coordinator stops after --group-idle-stop, the lag
// still follows new records while it is stopped, and the group's next
// request starts it again with its progress.
func TestGroupWithoutMembers(t *testing.T) {
	cfg := Default()
	cfg.DataDir, cfg.Listen, cfg.Admin = t.TempDir(), "127.0.0.1:0", ""
	cfg.GroupIdleStop = 1500 * time.Millisecond
	b, err := Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	w := dialWire(t, b.ClientAddr())
	newTopic(t, w, "idle", 1)
	produce(t, w, "idle", 0, 10)
	sub := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "gi", Topic: "idle", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: 100})
	ackAll(t, w, sub, w.deliveries(10, 5*time.Second), 0)
	w.ok(&heraldpb.Frame{Body: &heraldpb.Frame_Unsubscribe{Unsubscribe: &heraldpb.UnsubscribeRequest{SubscriptionId: sub}}})

	lagIs := func(want int64) func() error {
		return func() error {
			if d := describe(t, w, "gi"); len(d.Partitions) != 1 || d.Partitions[0].Lag != want {
				return fmt.Errorf("describe: %v", d.Partitions)
			}
			if lag, err := groupLag(w, "gi"); err != nil || lag != want {
				return fmt.Errorf("group list lag %d (%v), want %d", lag, err, want)
			}
			if g := metric(t, "herald_consumer_lag", map[string]string{"group": "gi"}); g != float64(want) {
				return fmt.Errorf("herald_consumer_lag %v, want %d", g, want)
			}
			return nil
		}
	}
	checkFor(t, lagIs(0)) // the last progress write is done
	produce(t, w, "idle", 0, 30)
	checkFor(t, lagIs(30))

	coordinators := func() int {
		res, err := b.sys.Root.RequestFuture(b.groups, &consumer.Coordinators{}, 5*time.Second).Result()
		if err != nil {
			t.Fatal(err)
		}
		return len(res.(*consumer.CoordinatorsList).PIDs)
	}
	checkFor(t, func() error {
		if n := coordinators(); n != 0 {
			return fmt.Errorf("%d coordinators running", n)
		}
		return nil
	})
	// Stopped: the manager keeps the lag current (no describe here: that
	// would start the coordinator).
	produce(t, w, "idle", 0, 5)
	checkFor(t, func() error {
		if lag, err := groupLag(w, "gi"); err != nil || lag != 35 {
			return fmt.Errorf("group list lag %d (%v), want 35", lag, err)
		}
		if g := metric(t, "herald_consumer_lag", map[string]string{"group": "gi"}); g != 35 {
			return fmt.Errorf("herald_consumer_lag %v, want 35", g)
		}
		return nil
	})
	// The next request starts it again, with the group's progress.
	if d := describe(t, w, "gi"); d.Partitions[0].AckFloor != 10 || d.Partitions[0].Lag != 35 {
		t.Fatalf("describe after the idle stop: %v", d.Partitions)
	}
	subscribe(t, w, &heraldpb.SubscribeRequest{Group: "gi", Topic: "idle", Mode: heraldpb.SubscriptionMode_MODE_SHARED, Credits: 100})
	ds := w.deliveries(35, 5*time.Second)
	if len(ds) != 35 || ds[0].Offset != 10 {
		t.Fatalf("after the restart got %d messages from offset %v", len(ds), ds)
	}
	if n := coordinators(); n != 1 {
		t.Fatalf("%d coordinators after the group's subscription, want 1", n)
	}
}
