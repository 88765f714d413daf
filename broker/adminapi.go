package broker

import (
	"context"
	"time"

	"github.com/heraldmq/herald/adminapi"
	"github.com/heraldmq/herald/client"
	"github.com/prometheus/client_golang/prometheus"
)

// adminNode is the broker as the admin API sees it (adminapi.Node).
type adminNode struct{ b *Broker }

// Membership reports the registered nodes (the controller's metadata),
// the nodes in this node's membership view, and the controller group.
func (n adminNode) Membership() adminapi.Membership {
	b := n.b
	ms := adminapi.Membership{Self: b.nodeID, Members: map[uint64]bool{b.nodeID: true}}
	if b.member == nil || b.ctrl == nil {
		addr := b.cfg.Advertise
		if addr == "" && b.server != nil {
			addr = b.server.Addr().String()
		}
		ms.Nodes = []adminapi.NodeInfo{{ID: b.nodeID, ClientAddress: addr, Rack: b.cfg.Rack, Version: Version, StartedMs: b.readiness.started.UnixMilli()}}
		return ms
	}
	ms.Clustered = true
	for _, m := range b.member.View().Members {
		ms.Members[m.NodeID] = true
	}
	cv := b.ctrl.View()
	ms.ControllerLeader, ms.Voters, ms.Learners = cv.Leader, cv.Voters, cv.Learners
	for _, r := range cv.Nodes {
		ni := adminapi.NodeInfo{ID: r.GetNodeId(), ClientAddress: r.GetClientAddress(), ClusterAddress: r.GetClusterAddress(), HealthAddress: r.GetHealthAddress(),
			Rack: r.GetRack(), Version: r.GetVersion(), StartedMs: r.GetStartedMs(), Decommissioned: r.GetDecommissioned()}
		if ni.ID == b.nodeID && ni.Version == "" {
			ni.Version, ni.StartedMs = Version, b.readiness.started.UnixMilli()
		}
		ms.Nodes = append(ms.Nodes, ni)
	}
	if len(ms.Nodes) == 0 { // not registered yet
		ms.Nodes = []adminapi.NodeInfo{{ID: b.nodeID, ClientAddress: b.server.Addr().String(), Rack: b.cfg.Rack, Version: Version, StartedMs: b.readiness.started.UnixMilli()}}
	}
	return ms
}

// startAdminAPI builds the admin API over a client of this node's own
// client listener, logged in as the admin port's user when logins are on.
func (b *Broker) startAdminAPI() *adminapi.Server {
	addr := b.server.Addr().String()
	return adminapi.New(adminapi.Config{
		Node: adminNode{b}, ReadOnly: b.cfg.AdminReadOnly, Logger: b.log.With("component", "admin-api"),
		Dial: func(ctx context.Context, user, password string) (*client.Client, error) {
			opts := []client.Option{client.WithRequestTimeout(5 * time.Second), client.WithClientID("herald-admin-api")}
			if user != "" {
				opts = append(opts, client.WithSCRAM(user, password))
			}
			return client.Dial(ctx, addr, opts...)
		},
	})
}

// SchedulerLateness reads the scheduler's fire-lateness histogram from
// this process's metrics, when the scheduler runs here.
func (n adminNode) SchedulerLateness() (adminapi.Histogram, bool) {
	b := n.b
	if b.member != nil && b.ctrl != nil && !b.schedHere.Load() {
		return adminapi.Histogram{}, false
	}
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return adminapi.Histogram{}, false
	}
	for _, mf := range mfs {
		if mf.GetName() != "herald_scheduler_fire_lateness_seconds" || len(mf.GetMetric()) == 0 {
			continue
		}
		ph := mf.GetMetric()[0].GetHistogram()
		h := adminapi.Histogram{Count: ph.GetSampleCount()}
		for _, bk := range ph.GetBucket() {
			h.Bounds = append(h.Bounds, bk.GetUpperBound())
			h.Counts = append(h.Counts, bk.GetCumulativeCount())
		}
		return h, true
	}
	return adminapi.Histogram{}, false
}
