package topic

// Cluster mode: the manager as this node's replica manager, and the stand-in actor for partitions held elsewhere.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"google.golang.org/protobuf/proto"
)

// Cluster mode. The controller group holds the topics and their replica
// placement; the manager is this node's replica manager: on every
// metadata change (Assign) it reconciles its local replicas with the
// placement, spawning a partition actor for each replica this node holds
// (under the deterministic name partition.Name, its raft messages routed
// by the cluster transport) and stopping those it no longer holds.
// Partitions without a local replica get a stand-in that answers
// NOT_LEADER, so that every registry entry has a PID and a Stats for each
// partition. CreateTopic and DeleteTopic go through the controller.
// Internal topics stay local to each node.
//
// Moves (cluster/reassign.go): a node in a partition's target that holds
// no replica starts a joining one (it never bootstraps; the leader adds
// it as a learner); every local replica is told the target (SetTarget),
// and the leader's report that the group reached it (OnTargetReached) is
// recorded through the controller; a node no longer among a partition's
// replicas or target stops its replica and deletes its log.

// Catalog is the cluster's topic catalog: the controller.
type Catalog interface {
	CreateTopic(ctx context.Context, name string, cfg *heraldpb.TopicConfig) (*heraldpb.TopicRecord, error)
	DeleteTopic(ctx context.Context, name string) error
	// CompleteReassignment records the end of a partition's move once its
	// group has the target's membership.
	CompleteReassignment(ctx context.Context, topic, topicID string, part uint32, reassignmentID string) error
	// Admin plans and records replica moves (herald cluster ...).
	Admin(ctx context.Context, req *heraldpb.ClusterAdminRequest) (*heraldpb.ClusterAdminResponse, error)
}

// Transport carries the raft messages of the node's replicas.
type Transport interface {
	partition.Transport
	Register(group string, pid *actor.PID)
	Unregister(group string)
	// Up reports whether a node is in the membership (quiescence).
	Up(node uint64) bool
	// Request sends a client frame to the replica of group on node and
	// waits for its answer.
	Request(node uint64, group string, f *heraldpb.Frame) (*heraldpb.Frame, error)
}

// Clustered switches the manager to cluster mode. The broker sends it
// once the controller runs; Spawn's Config.Clustered makes the manager
// refuse topic changes until then.
type Clustered struct {
	Catalog   Catalog
	Transport Transport
}

// Assign is the controller's metadata as applied on this node: every
// topic with its placement, and the nodes' client addresses.
type Assign struct {
	Topics  map[string]*heraldpb.TopicRecord
	Brokers []*heraldpb.BrokerInfo
	// Applied is the controller log offset the metadata is at; an Assign
	// older than the last one applied is ignored.
	Applied int64
}

// reconcileAgain reapplies the latest metadata (after a replica stopped).
type reconcileAgain struct{}

// clusterState is the manager's cluster mode.
type clusterState struct {
	catalog   Catalog
	transport Transport
	brokers   []*heraldpb.BrokerInfo
	remote    *actor.PID // answers for partitions with no local replica
	last      *Assign    // the latest metadata, reapplied after a change
	swept     bool       // the replica logs no replica uses were deleted
}

// clusterOpDone reports a create or delete made through the controller.
type clusterOpDone struct {
	frameID uint64
	replyTo *actor.PID
	name    string
	rec     *heraldpb.TopicRecord // create
	err     error
	delete  bool
}

func (m *Manager) onClustered(ctx actor.Context, c *Clustered) {
	proxy := &remoteProxy{reg: m.reg, transport: c.Transport, sys: m.sys, self: m.cfg.NodeID, slots: make(chan struct{}, maxProxied)}
	remote, err := ctx.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return proxy }), "remote")
	if err != nil {
		m.cfg.Logger.Error("spawning the stand-in for remote partitions", "err", err)
		return
	}
	m.cluster = &clusterState{catalog: c.Catalog, transport: c.Transport, remote: remote}
	if m.pendingAssign != nil {
		m.onAssign(ctx, m.pendingAssign)
		m.pendingAssign = nil
	}
}

// maxProxied bounds the requests the stand-in has forwarded and not had
// answered; past it they are answered THROTTLED.
const maxProxied = 1024

// maxProxiedWaitMs caps the long poll of a forwarded fetch.
const maxProxiedWaitMs = 500

// remoteProxy stands in for the partitions this node holds no replica
// of: it forwards each produce, fetch or list-offsets request to a node
// that holds one (the leader it last saw for the partition, else the
// replicas in turn, following NOT_LEADER's leader hint) and relays the
// answer, so that everything on this node that reads or writes through
// the registry (clients whose metadata is stale, delayed messages, group
// delivery, dead letters) reaches partitions led elsewhere. A fetch is
// served by any replica (committed records only); a produce only by the
// leader, and an idempotent producer's is answered NOT_LEADER (its
// client goes to the leader itself).
type remoteProxy struct {
	reg       *registry.Registry
	transport Transport
	sys       *actor.ActorSystem
	self      uint64
	slots     chan struct{}
	hints     sync.Map // "topic/partition" -> node that answered last
}

func (r *remoteProxy) Receive(ctx actor.Context) {
	f, ok := ctx.Message().(*heraldpb.Frame)
	if !ok || ctx.Sender() == nil {
		return
	}
	var topic string
	var part uint32
	idempotent := false
	switch b := f.Body.(type) {
	case *heraldpb.Frame_Produce:
		// (A transaction's marker is the coordinator's, one request each,
		// retried until taken: forwarded like any produce.)
		topic, part = b.Produce.Topic, b.Produce.GetPartition()
		idempotent = b.Produce.ProducerId != 0 && !b.Produce.SingleInFlight && b.Produce.TxnMarker == heraldpb.TxnMarker_TXN_MARKER_NONE
	case *heraldpb.Frame_Fetch:
		topic, part = b.Fetch.Topic, b.Fetch.Partition
	case *heraldpb.Frame_ListOffsets:
		topic, part = b.ListOffsets.Topic, b.ListOffsets.Partition
	case *heraldpb.Frame_ListOpenTxns: // (the transaction coordinator's sweep)
		topic, part = b.ListOpenTxns.Topic, b.ListOpenTxns.Partition
	default:
		ctx.Respond(heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "partition requests only")))
		return
	}
	e := r.reg.Get(topic)
	// An idempotent producer's pipelined batches must reach the leader in
	// order, which forwarding each on its own would not keep: it is sent
	// to the leader instead, unless the sender keeps one in flight (the
	// transaction coordinator's appends).
	if e == nil || e.Record == nil || int(part) >= len(e.Record.Partitions) || idempotent {
		var hint uint64
		if h, ok := r.hints.Load(partKey(topic, part)); ok {
			hint = h.(uint64)
		}
		ctx.Respond(heraldpb.ErrorFrame(f.Id, partition.NotLeader(topic, part, hint)))
		return
	}
	select {
	case r.slots <- struct{}{}:
	default:
		mProxied.WithLabelValues("throttled").Inc()
		e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "node %d has %d requests for remote partitions in flight", r.self, maxProxied)
		e.RetryAfterMs = 50
		ctx.Respond(heraldpb.ErrorFrame(f.Id, e))
		return
	}
	key := partKey(topic, part)
	var hint uint64
	if h, ok := r.hints.Load(key); ok {
		hint = h.(uint64) // the leader, as the last produce found it
	}
	nodes := proxyNodes(hint, e.Stats[part].Leader.Load(), r.self, e.Record.Partitions[part])
	sender, st, group := ctx.Sender(), e.Stats[part], groupOf(e.Record, part)
	if int(part) < len(e.Dirs) && e.Dirs[part] != "" {
		st = nil // a local follower's: its actor publishes them
	}
	// A long poll holds a slot here and on the other node for its whole
	// wait: shorter ones keep slots free for produces (the reader polls
	// again).
	if fe := f.GetFetch(); fe != nil && fe.MaxWaitMs > maxProxiedWaitMs {
		f = proto.Clone(f).(*heraldpb.Frame)
		f.GetFetch().MaxWaitMs = maxProxiedWaitMs
	}
	mProxiedInFlight.Inc()
	leaderNow := e.Stats[part].Leader.Load
	go func() {
		// A request given up on (its node no longer leads) still holds
		// the slot until it ends: at most ForwardTimeout.
		var pending sync.WaitGroup
		defer func() { pending.Wait(); <-r.slots; mProxiedInFlight.Dec() }()
		resp, from := r.forward(f, topic, group, part, key, nodes, leaderNow, &pending)
		noteRemote(st, f, resp, from)
		if resp.GetError().GetCode() == heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE && from != 0 {
			// The reader moves its position within the log's bounds:
			// learn them first.
			lo := &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListOffsets{ListOffsets: &heraldpb.ListOffsetsRequest{Topic: topic, Partition: part}}}
			if lr, err := r.transport.Request(from, group, lo); err == nil {
				noteRemote(st, lo, lr, from)
			}
		}
		r.sys.Root.Send(sender, resp)
	}()
}

// proxyLeaderCheck is how often a forwarded request waiting for its answer
// checks whether the node it went to still leads the partition.
const proxyLeaderCheck = 100 * time.Millisecond

// request sends f to node and waits for its answer, or until the
// partition's leader as this node knows it (leaderNow) is another node,
// or the node leaves the membership: then it gives the request up and
// returns the new leader (0 if none is known yet) with errMoved. A node
// killed mid-request answers nothing until the transport gives up (about
// ForwardTimeout); a new leader is elected within about a second.
// pending counts the request until it ends.
func (r *remoteProxy) request(node uint64, group string, f *heraldpb.Frame, leaderNow func() uint64, pending *sync.WaitGroup) (*heraldpb.Frame, uint64, error) {
	type answer struct {
		f   *heraldpb.Frame
		err error
	}
	before := leaderNow()
	done := make(chan answer, 1)
	pending.Add(1)
	go func() {
		defer pending.Done()
		resp, err := r.transport.Request(node, group, f)
		done <- answer{resp, err}
	}()
	tick := time.NewTicker(proxyLeaderCheck)
	defer tick.Stop()
	for {
		select {
		case a := <-done:
			return a.f, 0, a.err
		case <-tick.C:
			if l := leaderNow(); l != before && l != 0 && l != node {
				return nil, l, errMoved
			}
			if !r.transport.Up(node) {
				return nil, 0, errMoved
			}
		}
	}
}

// errMoved: a forwarded request was given up on, its node no longer
// leading the partition or gone.
var errMoved = errors.New("the node no longer leads the partition")

// forward tries nodes in turn (a leader named by NOT_LEADER next), at
// most 5 of them, and returns the answer and the node that gave it.
func (r *remoteProxy) forward(f *heraldpb.Frame, topic, group string, part uint32, key string, nodes []uint64, leaderNow func() uint64, pending *sync.WaitGroup) (*heraldpb.Frame, uint64) {
	var last *heraldpb.Frame
	var tried []uint64
	var outOfRange uint64 // the last node that answered OFFSET_OUT_OF_RANGE
	for len(nodes) > 0 && len(tried) < 5 {
		n := nodes[0]
		nodes = nodes[1:]
		if slices.Contains(tried, n) {
			continue
		}
		tried = append(tried, n)
		resp, moved, err := r.request(n, group, f, leaderNow, pending)
		if errors.Is(err, errMoved) {
			r.hints.CompareAndDelete(key, n)
			e := partition.NotLeader(topic, part, moved)
			e.OutcomeUnknown = f.GetProduce() != nil // it may have reached n
			last = heraldpb.ErrorFrame(f.Id, e)
			if moved != 0 && moved != r.self && !slices.Contains(tried, moved) {
				nodes = append([]uint64{moved}, nodes...)
			}
			continue
		}
		if err != nil {
			r.hints.CompareAndDelete(key, n)
			e := heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "partition %s-%d: %v", topic, part, err)
			// A forwarded produce may have reached the leader.
			e.OutcomeUnknown = f.GetProduce() != nil
			last = heraldpb.ErrorFrame(f.Id, e)
			continue
		}
		if e := resp.GetError(); e != nil && e.Code == heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE {
			// A follower that lags (or whose log starts later) may not
			// have the offset the leader has: ask the others too.
			last, outOfRange = resp, n
			if len(nodes) > 0 && len(tried) < 5 {
				continue
			}
			mProxied.WithLabelValues("answered").Inc()
			return resp, n
		}
		if e := resp.GetError(); e != nil && e.Code == heraldpb.ErrorCode_NOT_LEADER {
			if l := uint64(e.Leader); l != 0 && l != r.self && !slices.Contains(tried, l) {
				nodes = append([]uint64{l}, nodes...)
			}
			last = resp
			continue
		}
		if f.GetProduce() != nil {
			r.hints.Store(key, n)
		}
		mProxied.WithLabelValues("answered").Inc()
		return resp, n
	}
	if last == nil || last.GetError().GetCode() == heraldpb.ErrorCode_NOT_LEADER {
		// Let the client look the leader up itself.
		mProxied.WithLabelValues("not_leader").Inc()
		e := partition.NotLeader(topic, part, 0)
		e.OutcomeUnknown = last.GetError().GetOutcomeUnknown()
		return heraldpb.ErrorFrame(f.Id, e), 0
	}
	if last.GetError().GetCode() == heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE {
		mProxied.WithLabelValues("answered").Inc()
		return last, outOfRange
	}
	mProxied.WithLabelValues("failed").Inc()
	return last, 0
}

// onAssign reconciles the local replicas with the controller's placement.
func (m *Manager) onAssign(ctx actor.Context, a *Assign) {
	if m.cluster == nil {
		if m.pendingAssign == nil || a.Applied >= m.pendingAssign.Applied {
			m.pendingAssign = a
		}
		return
	}
	if last := m.cluster.last; last != nil && a.Applied < last.Applied {
		return // older than what is applied already
	}
	m.cluster.brokers, m.cluster.last = a.Brokers, a
	for _, name := range sortedKeys(a.Topics) {
		rec := a.Topics[name]
		e := m.reg.Get(name)
		switch {
		case m.deleting[name]:
			continue // reapplied once the deletion finishes
		case e != nil && e.Record == nil:
			m.cfg.Logger.Error("a local topic has the name of a cluster topic; the cluster topic is not served here", "topic", name)
			continue
		case e != nil && e.Record.RequestId == rec.RequestId:
			m.reconcile(ctx, e, rec)
			continue
		case e != nil:
			m.removeReplicated(ctx, e, nil) // an older topic of the same name
			continue
		}
		if err := m.spawnReplicated(ctx, rec); err != nil {
			m.cfg.Logger.Error("starting the replicas of a topic", "topic", name, "err", err)
		}
	}
	for _, e := range m.reg.All() {
		if e.Record != nil && a.Topics[e.Name] == nil && !m.deleting[e.Name] {
			m.removeReplicated(ctx, e, nil)
		}
	}
	if !m.cluster.swept {
		m.cluster.swept = true
		m.sweepReplicas(a)
	}
	m.reg.SetSynced()
}

// sweepReplicas deletes, once at the first metadata (which is caught up
// with the group: see the controller), the replica logs on disk that no
// replica of this node uses any more: of partitions moved away or topics
// deleted while this node was down (their replicas are never started).
func (m *Manager) sweepReplicas(a *Assign) {
	root := filepath.Join(m.cfg.DataDir, "replicas")
	ents, err := m.cfg.FS.ReadDir(root)
	if err != nil {
		return // none yet
	}
	keep := map[string]bool{}
	for _, rec := range a.Topics {
		for _, pa := range rec.Partitions {
			if dir := replicaDir(m.cfg.DataDir, m.cfg.NodeID, rec, pa); dir != "" {
				keep[dir] = true
			}
		}
	}
	for _, ent := range ents {
		dir := filepath.Join(root, ent.Name())
		if !ent.IsDir() || keep[dir] {
			continue
		}
		m.cfg.Logger.Info("deleting the log of a replica this node no longer holds", "dir", dir)
		if err := m.cfg.FS.RemoveAll(dir); err != nil {
			m.cfg.Logger.Error("deleting the log of a replica this node no longer holds", "dir", dir, "err", err)
		}
	}
}

// reassignLater reconciles again, with the latest metadata when the
// message is handled (not the latest now: newer may be queued already).
func (m *Manager) reassignLater(ctx actor.Context) {
	ctx.Send(ctx.Self(), &reconcileAgain{})
}

// spawnReplica starts this node's replica of a partition, in dir. Its
// raft id comes from the metadata (the one the move that added it
// assigned, else the node id), like its log folder: the same at every
// restart for as long as the node holds this incarnation of the replica.
func (m *Manager) spawnReplica(ctx actor.Context, rec *heraldpb.TopicRecord, pa *heraldpb.PartitionAssignment, dir string) (*actor.PID, *partition.Stats, error) {
	p := pa.Id
	pcfg := m.partitionConfig(rec.Name, p, rec.Config, dir)
	pcfg.ReplicaID = pa.RaftID(m.cfg.NodeID)
	pcfg.Peers = map[uint64]*actor.PID{pcfg.ReplicaID: nil}
	// A replica a move added joins the group (the leader adds it as a
	// learner); one placed at creation bootstraps it with its peers.
	pcfg.Join = pa.Joined[m.cfg.NodeID] != ""
	if pcfg.Join {
		pcfg.JoinAs = pa.Joined[m.cfg.NodeID]
		for _, r := range append(slices.Clone(pa.Replicas), pa.Target...) {
			if r != m.cfg.NodeID && !slices.Contains(pcfg.Announce, r) {
				pcfg.Announce = append(pcfg.Announce, r)
			}
		}
	} else {
		for _, r := range pa.Replicas {
			pcfg.Peers[pa.RaftID(r)] = nil
		}
		pcfg.Campaign = pa.Replicas[0] == m.cfg.NodeID
	}
	pcfg.Transport = m.cluster.transport
	pcfg.Group = groupOf(rec, p)
	pcfg.Liveness = m.cluster.transport.Up
	pcfg.MinInSync = int(rec.Config.MinInsyncReplicas)
	self, sys, topic := ctx.Self(), m.sys, rec.Name
	pcfg.OnTargetReached = func(target []uint64) {
		sys.Root.Send(self, &targetReached{topic: topic, part: p, target: target})
	}
	st := &partition.Stats{}
	props, err := partition.Props(m.sys, pcfg, st)
	if err != nil {
		return nil, nil, err
	}
	pid, err := ctx.SpawnNamed(props, partition.Name(rec.Name, p))
	if err != nil {
		return nil, nil, err
	}
	m.cluster.transport.Register(groupOf(rec, p), pid)
	if len(pa.Target) > 0 {
		ctx.Send(pid, setTarget(pa))
	}
	return pid, st, nil
}

// spawnReplicated starts this node's replicas of a cluster topic and
// registers the topic.
func (m *Manager) spawnReplicated(ctx actor.Context, rec *heraldpb.TopicRecord) error {
	n := len(rec.Partitions)
	pids := make([]*actor.PID, n)
	stats := make([]*partition.Stats, n)
	dirs := make([]string, n)
	stop := func() {
		for p, dir := range dirs {
			if dir != "" {
				m.cluster.transport.Unregister(groupOf(rec, uint32(p)))
				ctx.Stop(pids[p])
			}
		}
	}
	for i, pa := range rec.Partitions {
		if int(pa.Id) != i {
			stop()
			return fmt.Errorf("topic %q: partition %d is listed at position %d", rec.Name, pa.Id, i)
		}
		pids[i], stats[i] = m.cluster.remote, &partition.Stats{}
		dir := replicaDir(m.cfg.DataDir, m.cfg.NodeID, rec, pa)
		if dir == "" || m.moving[partKey(rec.Name, pa.Id)] {
			continue
		}
		pid, st, err := m.spawnReplica(ctx, rec, pa, dir)
		if err != nil {
			stop()
			return err
		}
		pids[i], stats[i], dirs[i] = pid, st, dir
	}
	tpid, err := ctx.SpawnNamed(topicProps(rec.Name, m.reg), "t/"+rec.Name)
	if err != nil {
		stop()
		return err
	}
	m.reg.Update(func(reg map[string]*registry.Entry) {
		reg[rec.Name] = &registry.Entry{Name: rec.Name, Config: rec.Config, Topic: tpid, Partitions: pids, Stats: stats, Record: rec, Dirs: dirs, Remote: m.cluster.remote}
	})
	return nil
}

// reconcile brings a running cluster topic's local replicas in line with
// its record: it starts the replicas of partitions moved (or being moved)
// to this node, stops those moved away and deletes their logs, and tells
// every local replica its partition's target.
func (m *Manager) reconcile(ctx actor.Context, e *registry.Entry, rec *heraldpb.TopicRecord) {
	pids, stats, dirs := slices.Clone(e.Partitions), slices.Clone(e.Stats), slices.Clone(e.Dirs)
	for i, pa := range rec.Partitions {
		p := uint32(i)
		key := partKey(rec.Name, p)
		want := replicaDir(m.cfg.DataDir, m.cfg.NodeID, rec, pa)
		switch {
		case m.moving[key]:
			// the old replica is stopping; reconciled again once it stopped
		case dirs[i] == want:
			if want != "" {
				ctx.Send(pids[i], setTarget(pa))
			}
		case dirs[i] != "":
			// This node left the partition (or joins it again under a new
			// move): stop the replica, delete its log, then start again.
			old, oldDir := pids[i], dirs[i]
			m.moving[key] = true
			m.cluster.transport.Unregister(groupOf(rec, p))
			pids[i], stats[i], dirs[i] = m.cluster.remote, &partition.Stats{}, ""
			m.cfg.Logger.Info("stopping a replica moved away from this node", "topic", rec.Name, "partition", p, "replicas", pa.Replicas)
			m.stopAll(ctx, []*actor.PID{old}, func() {
				delete(m.moving, key)
				partition.DeleteMetrics(rec.Name, p)
				if err := m.cfg.FS.RemoveAll(oldDir); err != nil {
					m.cfg.Logger.Error("deleting the log of a replica moved away", "dir", oldDir, "err", err)
				}
				m.reassignLater(ctx)
			})
		default:
			pid, st, err := m.spawnReplica(ctx, rec, pa, want)
			if err != nil {
				m.cfg.Logger.Error("starting a replica moved to this node", "topic", rec.Name, "partition", p, "err", err)
				continue
			}
			m.cfg.Logger.Info("started a replica moved to this node", "topic", rec.Name, "partition", p, "target", pa.Target)
			pids[i], stats[i], dirs[i] = pid, st, want
		}
	}
	if rec == e.Record && slices.Equal(pids, e.Partitions) && slices.Equal(dirs, e.Dirs) {
		return // nothing changed for this topic
	}
	m.reg.Update(func(reg map[string]*registry.Entry) {
		reg[rec.Name] = &registry.Entry{Name: rec.Name, Config: rec.Config, Topic: e.Topic, Partitions: pids, Stats: stats, Record: rec, Dirs: dirs, Remote: m.cluster.remote}
	})
}

// targetReached is a local leader's report that its group has the
// membership of its partition's target (raft ids).
type targetReached struct {
	topic  string
	part   uint32
	target []uint64
}

// completeDone ends the recording of a move's end.
type completeDone struct{ key string }

// onTargetReached has the controller record the end of the move, once
// at a time per move, off the mailbox.
func (m *Manager) onTargetReached(ctx actor.Context, r *targetReached) {
	e := m.reg.Get(r.topic)
	if m.cluster == nil || e == nil || e.Record == nil || int(r.part) >= len(e.Record.Partitions) {
		return
	}
	pa := e.Record.Partitions[r.part]
	if len(pa.Target) == 0 || !slices.Equal(pa.RaftIDs(pa.Target), r.target) {
		return // an old report
	}
	key := partKey(r.topic, r.part) + "/" + pa.ReassignmentId
	if m.completing[key] {
		return
	}
	m.completing[key] = true
	catalog, self, sys, topicID, moveID, target := m.cluster.catalog, ctx.Self(), m.sys, e.Record.RequestId, pa.ReassignmentId, pa.Target
	log := m.cfg.Logger
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), createWait)
		defer cancel()
		if err := catalog.CompleteReassignment(cctx, r.topic, topicID, r.part, moveID); err != nil {
			log.Warn("recording the end of a partition move", "topic", r.topic, "partition", r.part, "err", err)
		} else {
			log.Info("partition move done", "topic", r.topic, "partition", r.part, "replicas", target)
		}
		sys.Root.Send(self, &completeDone{key: key})
	}()
}

// removeReplicated stops a cluster topic's local replicas and deletes
// their logs, then runs done (if set) and reconciles again with the
// latest metadata (a topic re-created under the same name starts then).
func (m *Manager) removeReplicated(ctx actor.Context, e *registry.Entry, done func(error)) {
	m.reg.Update(func(reg map[string]*registry.Entry) { delete(reg, e.Name) })
	m.deleting[e.Name] = true
	pids := []*actor.PID{e.Topic}
	for p, dir := range e.Dirs {
		if dir != "" {
			m.cluster.transport.Unregister(groupOf(e.Record, uint32(p)))
			pids = append(pids, e.Partitions[p])
		}
	}
	m.stopAll(ctx, pids, func() {
		delete(m.deleting, e.Name)
		var err error
		for p, dir := range e.Dirs {
			partition.DeleteMetrics(e.Name, uint32(p))
			if dir == "" {
				continue
			}
			if rerr := m.cfg.FS.RemoveAll(dir); rerr != nil && err == nil {
				err = rerr
			}
		}
		if err != nil {
			m.cfg.Logger.Error("deleting the logs of a removed topic", "topic", e.Name, "err", err)
		}
		if done != nil {
			done(err)
		}
		if m.cluster.last != nil {
			m.onAssign(ctx, m.cluster.last)
		}
	})
}

// onClusterAdmin runs a cluster administration request through the
// controller, off the mailbox.
func (m *Manager) onClusterAdmin(ctx actor.Context, id uint64, req *heraldpb.ClusterAdminRequest) {
	if !m.cfg.Clustered {
		ctx.Respond(heraldpb.ErrorFrame(id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "this node runs alone: cluster administration needs herald serve --cluster")))
		return
	}
	if m.cluster == nil {
		ctx.Respond(heraldpb.ErrorFrame(id, clusterStarting()))
		return
	}
	replyTo, sys, catalog := ctx.Sender(), m.sys, m.cluster.catalog
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), createWait)
		defer cancel()
		resp, err := catalog.Admin(cctx, req)
		if err != nil {
			e, ok := err.(*heraldpb.Error)
			if !ok {
				e = heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "%v", err)
			}
			sys.Root.Send(replyTo, heraldpb.ErrorFrame(id, e))
			return
		}
		sys.Root.Send(replyTo, &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_ClusterAdminResponse{ClusterAdminResponse: resp}})
	}()
}

// clusterCreate creates a topic through the controller, off the mailbox.
func (m *Manager) clusterCreate(ctx actor.Context, id uint64, name string, cfg *heraldpb.TopicConfig) {
	replyTo, self, sys, catalog := ctx.Sender(), ctx.Self(), m.sys, m.cluster.catalog
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), createWait)
		defer cancel()
		rec, err := catalog.CreateTopic(cctx, name, cfg)
		sys.Root.Send(self, &clusterOpDone{frameID: id, replyTo: replyTo, name: name, rec: rec, err: err})
	}()
}

// clusterDelete deletes a topic through the controller, off the mailbox.
func (m *Manager) clusterDelete(ctx actor.Context, id uint64, name string) {
	replyTo, self, sys, catalog := ctx.Sender(), ctx.Self(), m.sys, m.cluster.catalog
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), createWait)
		defer cancel()
		err := catalog.DeleteTopic(cctx, name)
		sys.Root.Send(self, &clusterOpDone{frameID: id, replyTo: replyTo, name: name, err: err, delete: true})
	}()
}

func (m *Manager) onClusterOpDone(ctx actor.Context, d *clusterOpDone) {
	if d.err != nil {
		e, ok := d.err.(*heraldpb.Error)
		if !ok {
			e = heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "%v", d.err)
		}
		ctx.Send(d.replyTo, heraldpb.ErrorFrame(d.frameID, e))
		return
	}
	if d.delete {
		e := m.reg.Get(d.name)
		if e == nil || e.Record == nil {
			ctx.Send(d.replyTo, &heraldpb.Frame{Id: d.frameID, Body: &heraldpb.Frame_DeleteTopicResponse{DeleteTopicResponse: &heraldpb.DeleteTopicResponse{}}})
			return
		}
		m.removeReplicated(ctx, e, func(err error) {
			if err != nil {
				ctx.Send(d.replyTo, heraldpb.ErrorFrame(d.frameID, heraldpb.NewError(heraldpb.ErrorCode_STORAGE_ERROR, "deleting topic %q: %v", d.name, err)))
				return
			}
			ctx.Send(d.replyTo, &heraldpb.Frame{Id: d.frameID, Body: &heraldpb.Frame_DeleteTopicResponse{DeleteTopicResponse: &heraldpb.DeleteTopicResponse{}}})
		})
		return
	}
	// The metadata update may not have reached the manager yet: start the
	// replicas now (Assign skips a topic that is running).
	if e := m.reg.Get(d.name); e == nil && !m.deleting[d.name] {
		if err := m.spawnReplicated(ctx, d.rec); err != nil {
			ctx.Send(d.replyTo, heraldpb.ErrorFrame(d.frameID, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "starting topic %q: %v", d.name, err)))
			return
		}
	}
	m.awaitWritable(ctx, &awaitCreated{name: d.name, frameID: d.frameID, replyTo: d.replyTo, deadline: time.Now().Add(createWait)})
}
