package adminapi

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Bounds of one refresh: what a cluster with very many topics or groups
// costs the node answering.
const (
	maxGroupsDescribed = 200                     // groups described per refresh (the rest listed)
	maxOffsetLookups   = 256                     // partitions without a local replica looked up per refresh
	scheduledListed    = 1000                    // delayed batches listed for the buckets
	historySamples     = 120                     // samples kept per partition and group (one a refresh)
	lagGrowingSamples  = 10                      // a lag that rose at each of these many refreshes is "growing"
	callTimeout        = 1500 * time.Millisecond // one call to the cluster
	refreshBudget      = 3 * time.Second         // a whole refresh: a hung node costs at most this
)

var pj = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// history is what a view remembers between refreshes: the last offsets of
// each partition (for the rates) and the recent samples.
type history struct {
	parts  map[string]*partHistory // "topic/p"
	groups map[string]*groupHistory
}

type partHistory struct {
	at               time.Time
	hw, size, out    int64
	rates            []float64
	seen             time.Time
	rate, brat, orat float64
}

type groupHistory struct {
	lags []LagSample
	dlq  []int64
	seen time.Time
}

func newHistory() *history {
	return &history{parts: map[string]*partHistory{}, groups: map[string]*groupHistory{}}
}

// build reads everything the views show through c, with ms the
// membership (states already resolved), into a snapshot.
func (s *Server) build(ctx context.Context, c *client.Client, h *history, ms Membership, states map[uint64]stateSince) *Snapshot {
	now := time.Now()
	snap := &Snapshot{At: now, ReadOnly: s.cfg.ReadOnly, Topics: []Topic{}, Groups: []Group{}, Alerts: []Alert{}}
	snap.Cluster = clusterOf(ms, states, now)
	live := map[uint32]bool{}
	for _, m := range snap.Cluster.Members {
		if m.State == StateAlive || m.State == StateSuspect {
			live[uint32(m.NodeID)] = true
		}
	}
	fail := func(what string, err error) {
		if ctx.Err() != nil {
			err = fmt.Errorf("no answer within the refresh's %v (a node is slow or paused)", refreshBudget)
		}
		snap.Errors = append(snap.Errors, fmt.Sprintf("%s: %v", what, err))
	}

	// Topics.
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	topics, err := c.ListTopics(cctx)
	cancel()
	if err != nil {
		fail("topics", err)
	}
	lookups := 0
	for _, ti := range topics {
		t := Topic{TopicSummary: TopicSummary{Name: ti.GetName(), Partitions: len(ti.GetPartitions()), Internal: strings.HasPrefix(ti.GetName(), "__")}, ViewOf: ms.Self}
		if b, err := pj.Marshal(orEmpty(ti.GetConfig())); err == nil {
			t.Config = b
		}
		for _, pi := range ti.GetPartitions() {
			p := Partition{ID: pi.GetId(), Leader: pi.GetLeader(), Replicas: nonNil(pi.GetReplicas()), TargetReplicas: pi.GetTargetReplicas(),
				LogStart: pi.GetLogStartOffset(), HighWatermark: pi.GetHighWatermark(), SizeBytes: pi.GetSizeBytes(), LiveReplicas: []uint32{}}
			t.Replication = max(t.Replication, len(p.Replicas))
			out := int64(pi.GetBytesOut())
			if isr := pi.GetInSyncReplicas(); len(isr) > 0 {
				p.InSyncReplicas, p.InSyncFrom = isr, "leader" // the local replica leads
			}
			if ms.Clustered && p.InSyncReplicas == nil && p.Leader != 0 && live[p.Leader] && lookups < maxOffsetLookups && ctx.Err() == nil {
				// Led elsewhere: its leader tells the replicas in sync and,
				// without a local replica, the offsets.
				lookups++
				cctx, cancel := context.WithTimeout(ctx, callTimeout)
				if o, err := c.ListOffsets(cctx, ti.GetName(), int32(pi.GetId()), client.OffsetLatest, time.Time{}); err == nil {
					if !slices.Contains(p.Replicas, uint32(ms.Self)) {
						p.LogStart, p.HighWatermark = o.LogStart, o.HighWatermark
					}
					if len(o.InSyncReplicas) > 0 {
						p.InSyncReplicas, p.InSyncFrom = o.InSyncReplicas, "leader"
					}
					out = int64(o.BytesOut) // the leader serves the reads
				}
				cancel()
			}
			for _, r := range p.Replicas {
				if !ms.Clustered || live[r] {
					p.LiveReplicas = append(p.LiveReplicas, r)
				}
			}
			if p.InSyncReplicas == nil {
				p.InSyncReplicas, p.InSyncFrom = slices.Clone(p.LiveReplicas), "liveness"
			} else if ms.Clustered {
				// An idle (quiesced) group's leader keeps the set it had when
				// it went quiet: a replica whose node is down since is not in
				// sync, whatever the leader last saw.
				p.InSyncReplicas = slices.DeleteFunc(slices.Clone(p.InSyncReplicas), func(r uint32) bool { return !live[r] })
			}
			p.UnderReplicated = len(p.InSyncReplicas) < len(p.Replicas)
			p.Offline = p.Leader == 0 || (ms.Clustered && !live[p.Leader])
			key := fmt.Sprintf("%s/%d", t.Name, p.ID)
			ph := h.parts[key]
			if ph == nil {
				ph = &partHistory{at: now, hw: p.HighWatermark, size: p.SizeBytes, out: out}
				h.parts[key] = ph
			} else if dt := now.Sub(ph.at).Seconds(); dt > 0.2 {
				ph.rate = max(float64(p.HighWatermark-ph.hw), 0) / dt
				ph.brat = max(float64(p.SizeBytes-ph.size), 0) / dt
				ph.orat = max(float64(out-ph.out), 0) / dt // a new leader's count starts elsewhere: never negative
				ph.at, ph.hw, ph.size, ph.out = now, p.HighWatermark, p.SizeBytes, out
				ph.rates = appendCapped(ph.rates, ph.rate, historySamples)
			}
			ph.seen = now
			p.MsgsInPerSec, p.BytesInPerSec, p.BytesOutPerSec, p.History = ph.rate, ph.brat, ph.orat, slices.Clone(ph.rates)
			if p.History == nil {
				p.History = []float64{}
			}
			t.Messages += p.HighWatermark - p.LogStart
			t.SizeBytes += p.SizeBytes
			t.MsgsInPerSec += p.MsgsInPerSec
			t.BytesInPerSec += p.BytesInPerSec
			t.BytesOutPerSec += p.BytesOutPerSec
			if p.UnderReplicated {
				t.UnderReplicated++
			}
			if p.Offline {
				t.Offline++
			}
			t.PartitionList = append(t.PartitionList, p)
		}
		snap.Topics = append(snap.Topics, t)
	}
	sort.Slice(snap.Topics, func(i, j int) bool { return snap.Topics[i].Name < snap.Topics[j].Name })
	byName := map[string]*Topic{}
	for i := range snap.Topics {
		byName[snap.Topics[i].Name] = &snap.Topics[i]
	}
	// Leads and follows per member.
	for i := range snap.Cluster.Members {
		m := &snap.Cluster.Members[i]
		for _, t := range snap.Topics {
			for _, p := range t.PartitionList {
				switch {
				case p.Leader == uint32(m.NodeID):
					m.Leads++
				case slices.Contains(p.Replicas, uint32(m.NodeID)):
					m.Follows++
				}
			}
		}
	}

	// Groups.
	cctx, cancel = context.WithTimeout(ctx, callTimeout)
	groups, err := c.ListGroups(cctx)
	cancel()
	if err != nil && !client.IsCode(err, heraldpb.ErrorCode_NOT_AUTHORIZED) {
		fail("groups", err)
	}
	for i, gs := range groups {
		g := Group{GroupSummary: GroupSummary{Name: gs.GetGroup(), Topic: gs.GetTopic(), Mode: modeName(gs.GetMode()), Members: int(gs.GetMembers()), Lag: gs.GetLag(), Breaker: "closed"},
			ViewOf: ms.Self, LagHistory: []LagSample{}}
		sample := LagSample{At: now, Lag: g.Lag, ByPartition: map[uint32]int64{}}
		if i < maxGroupsDescribed && ctx.Err() == nil {
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			gi, err := c.DescribeGroup(cctx, gs.GetGroup())
			cancel()
			if err != nil {
				fail("group "+gs.GetGroup(), err)
			} else {
				if b, err := pj.Marshal(gi); err == nil {
					g.Info = b
				}
				g.DLQ = gi.GetDeadLetterTopic()
				for _, m := range gi.GetMembers() {
					switch m.GetBreaker() {
					case heraldpb.BreakerState_BREAKER_OPEN:
						g.Breaker = "open"
					case heraldpb.BreakerState_BREAKER_HALF_OPEN:
						if g.Breaker != "open" {
							g.Breaker = "half_open"
						}
					}
				}
				var lag int64
				for _, pl := range gi.GetPartitions() {
					sample.ByPartition[pl.GetPartition()] += pl.GetLag()
					lag += pl.GetLag()
				}
				sample.Lag, g.Lag = lag, lag
			}
		}
		if t := byName[g.DLQ]; t != nil {
			g.DLQDepth = t.Messages
		}
		gh := h.groups[g.Name]
		if gh == nil {
			gh = &groupHistory{}
			h.groups[g.Name] = gh
		}
		gh.seen = now
		gh.lags = appendCapped(gh.lags, sample, historySamples)
		gh.dlq = appendCapped(gh.dlq, g.DLQDepth, historySamples)
		g.LagGrowing = growing(gh.lags)
		g.LagHistory = slices.Clone(gh.lags)
		snap.Groups = append(snap.Groups, g)
	}
	sort.Slice(snap.Groups, func(i, j int) bool { return snap.Groups[i].Name < snap.Groups[j].Name })

	// Scheduler and transactions: shown when the node has them.
	sc := &Scheduler{Buckets: map[string]int{"overdue": 0, "1m": 0, "1h": 0, "1d": 0, "later": 0}, At: now}
	cctx, cancel = context.WithTimeout(ctx, callTimeout)
	sr, err := c.DescribeScheduler(cctx, "", scheduledListed)
	cancel()
	if err == nil {
		sc.Pending, sc.Listed = sr.GetPending(), len(sr.GetScheduled())
		for _, si := range sr.GetScheduled() {
			sc.Buckets[bucket(time.UnixMilli(si.GetDeliverAtMs()).Sub(now))]++
		}
		cctx, cancel = context.WithTimeout(ctx, callTimeout)
		if _, n, err := c.ListTxn(cctx, "", 1); err == nil {
			sc.HalvesPending = n
		}
		if n, err := c.TransactionCount(cctx); err == nil {
			sc.Transactions = n
		}
		cancel()
		s.lateness(sc, now, sr.GetFireLateness())
		snap.Scheduler = sc
	} else if !client.IsCode(err, heraldpb.ErrorCode_NOT_AUTHORIZED) {
		fail("scheduler", err)
	}

	snap.Alerts = s.alerts(snap, h, now)
	// Forget what is gone.
	for k, ph := range h.parts {
		if ph.seen.Before(now) {
			delete(h.parts, k)
		}
	}
	for k, gh := range h.groups {
		if gh.seen.Before(now) {
			delete(h.groups, k)
		}
	}
	return snap
}

// clusterOf renders the membership.
func clusterOf(ms Membership, states map[uint64]stateSince, now time.Time) Cluster {
	cl := Cluster{ViewOf: ms.Self, Mode: "single-node", ControllerLeader: ms.ControllerLeader, Members: []Member{}, At: now}
	if ms.Clustered {
		cl.Mode = "cluster"
	}
	for _, n := range ms.Nodes {
		m := Member{NodeID: n.ID, Address: n.ClientAddress, ClusterAddress: n.ClusterAddress, Rack: n.Rack, Version: n.Version, Roles: []string{}, Self: n.ID == ms.Self}
		if st, ok := states[n.ID]; ok {
			m.State, m.Since, m.Note = st.state, st.since, st.note
		} else {
			m.State, m.Since = StateAlive, now
		}
		if n.StartedMs > 0 {
			t := time.UnixMilli(n.StartedMs)
			m.StartedAt = &t
		}
		switch {
		case ms.ControllerLeader == n.ID:
			m.Roles = append(m.Roles, "controller-leader")
		case slices.Contains(ms.Voters, n.ID):
			m.Roles = append(m.Roles, "controller-voter")
		case slices.Contains(ms.Learners, n.ID):
			m.Roles = append(m.Roles, "controller-learner")
		}
		cl.Members = append(cl.Members, m)
	}
	sort.Slice(cl.Members, func(i, j int) bool { return cl.Members[i].NodeID < cl.Members[j].NodeID })
	if !ms.Clustered {
		cl.ControllerReachable = true
		return cl
	}
	for _, m := range cl.Members {
		if m.NodeID == ms.ControllerLeader && (m.State == StateAlive || m.Self) {
			cl.ControllerReachable = true
		}
	}
	if !cl.ControllerReachable {
		cl.Stale = fmt.Sprintf("node %d cannot reach the controller (leader %s): topics, leaders and members may be out of date", ms.Self, nodeOrNone(ms.ControllerLeader))
	}
	return cl
}

// alerts derives the alerts from snap and the history.
func (s *Server) alerts(snap *Snapshot, h *history, now time.Time) []Alert {
	out := []Alert{}
	add := func(kind, sev, subject string, since time.Time, format string, args ...any) {
		out = append(out, Alert{Kind: kind, Severity: sev, Subject: subject, Message: fmt.Sprintf(format, args...), Since: since})
	}
	cl := snap.Cluster
	if cl.Mode == "cluster" && !cl.ControllerReachable {
		add("controller_unreachable", "critical", fmt.Sprintf("node %d", cl.ViewOf), now, "%s", cl.Stale)
	}
	for _, m := range cl.Members {
		switch m.State {
		case StateDown:
			add("node_down", "critical", fmt.Sprintf("node %d", m.NodeID), m.Since, "node %d (%s) is down", m.NodeID, m.Address)
		case StateSuspect:
			add("node_suspect", "warning", fmt.Sprintf("node %d", m.NodeID), m.Since, "node %d (%s) is not answering in time", m.NodeID, m.Address)
		}
	}
	// One alert per topic and kind, naming its partitions.
	for _, t := range snap.Topics {
		var offline, under []string
		for _, p := range t.PartitionList {
			switch {
			case p.Offline:
				offline = append(offline, fmt.Sprintf("%d (replicas %s)", p.ID, joinIDs(p.Replicas)))
			case p.UnderReplicated:
				under = append(under, fmt.Sprintf("%d (%d of %d in sync)", p.ID, len(p.InSyncReplicas), len(p.Replicas)))
			}
		}
		if len(offline) > 0 {
			add("partition_offline", "critical", t.Name, now, "topic %s: %s without a live leader: %s", t.Name, plural(len(offline), "partition"), strings.Join(offline, ", "))
		}
		if len(under) > 0 {
			add("under_replicated", "warning", t.Name, now, "topic %s: %s under-replicated: %s", t.Name, plural(len(under), "partition"), strings.Join(under, ", "))
		}
	}
	for _, g := range snap.Groups {
		gh := h.groups[g.Name]
		if g.LagGrowing {
			add("lag_growing", "warning", g.Name, now, "group %s: lag %d and rising for %d s", g.Name, g.Lag, lagGrowingSamples)
		}
		if g.Breaker != "closed" {
			add("breaker_open", "warning", g.Name, now, "group %s: a member's circuit breaker is %s", g.Name, strings.ReplaceAll(g.Breaker, "_", "-"))
		}
		if gh != nil && len(gh.dlq) >= 2 && gh.dlq[len(gh.dlq)-1] > gh.dlq[max(len(gh.dlq)-30, 0)] {
			add("dlq_growing", "warning", g.Name, now, "group %s: %s holds %d messages, more than 30 s ago", g.Name, g.DLQ, g.DLQDepth)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Severity == "critical" && out[j].Severity != "critical" })
	return out
}

// growing reports whether the lag rose at each of the last
// lagGrowingSamples samples.
func growing(lags []LagSample) bool {
	if len(lags) <= lagGrowingSamples {
		return false
	}
	tail := lags[len(lags)-lagGrowingSamples-1:]
	for i := 1; i < len(tail); i++ {
		if tail[i].Lag <= tail[i-1].Lag {
			return false
		}
	}
	return true
}

func bucket(d time.Duration) string {
	switch {
	case d < 0:
		return "overdue"
	case d <= time.Minute:
		return "1m"
	case d <= time.Hour:
		return "1h"
	case d <= 24*time.Hour:
		return "1d"
	}
	return "later"
}

func modeName(m heraldpb.SubscriptionMode) string {
	return strings.ToLower(strings.TrimPrefix(m.String(), "MODE_"))
}

func appendCapped[T any](s []T, v T, n int) []T {
	s = append(s, v)
	if len(s) > n {
		s = slices.Delete(s, 0, len(s)-n)
	}
	return s
}

func orEmpty(c *heraldpb.TopicConfig) proto.Message {
	if c == nil {
		return &heraldpb.TopicConfig{}
	}
	return c
}

func nonNil(s []uint32) []uint32 {
	if s == nil {
		return []uint32{}
	}
	return s
}

func joinIDs(ids []uint32) string {
	if len(ids) == 0 {
		return "none"
	}
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprint(id)
	}
	return strings.Join(parts, ",")
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func nodeOrNone(id uint64) string {
	if id == 0 {
		return "unknown"
	}
	return fmt.Sprintf("node %d", id)
}

// latenessWindow is how far back the scheduler view's lateness looks.
const latenessWindow = time.Minute

type latenessSample struct {
	at time.Time
	h  Histogram
}

// lateness fills sc's fire lateness over the last latenessWindow, from
// the samples the server keeps of the scheduler's histogram: this node's
// when the scheduler runs here, else the one the scheduler's answer
// carried (remote).
func (s *Server) lateness(sc *Scheduler, now time.Time, remote *heraldpb.LatencyHistogram) {
	h, ok := s.cfg.Node.SchedulerLateness()
	if !ok && remote != nil && len(remote.Bounds) == len(remote.CumulativeCounts) {
		h, ok = Histogram{Bounds: remote.Bounds, Counts: remote.CumulativeCounts, Count: remote.Count}, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ok {
		s.late = nil
		sc.LatenessNote = "the scheduler's node did not report its fire lateness (herald_scheduler_fire_lateness_seconds in its metrics)"
		return
	}
	s.late = append(s.late, latenessSample{now, h})
	for len(s.late) > 1 && now.Sub(s.late[1].at) >= latenessWindow {
		s.late = s.late[1:]
	}
	old := s.late[0]
	l := &Lateness{WindowSeconds: now.Sub(old.at).Seconds()}
	if len(old.h.Counts) != len(h.Counts) {
		old.h = Histogram{Counts: make([]uint64, len(h.Counts))}
	}
	l.Fired = h.Count - old.h.Count
	quantile := func(q float64) float64 {
		want := uint64(q*float64(l.Fired) + 0.999999)
		for i, b := range h.Bounds {
			if h.Counts[i]-old.h.Counts[i] >= want {
				return b
			}
		}
		return -1 // above the last bound
	}
	if l.Fired > 0 {
		l.P50Seconds, l.P99Seconds = quantile(0.5), quantile(0.99)
	}
	sc.Lateness = l
}
