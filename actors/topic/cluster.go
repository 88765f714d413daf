package topic

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	heraldpb "github.com/heraldmq/herald/proto"
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

// Catalog is the cluster's topic catalog: the controller.
type Catalog interface {
	CreateTopic(ctx context.Context, name string, cfg *heraldpb.TopicConfig) (*heraldpb.TopicRecord, error)
	DeleteTopic(ctx context.Context, name string) error
}

// Transport carries the raft messages of the node's replicas.
type Transport interface {
	partition.Transport
	Register(group string, pid *actor.PID)
	Unregister(group string)
	// Up reports whether a node is in the membership (quiescence).
	Up(node uint64) bool
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
}

// clusterState is the manager's cluster mode.
type clusterState struct {
	catalog   Catalog
	transport Transport
	brokers   []*heraldpb.BrokerInfo
	remote    *actor.PID // answers for partitions with no local replica
	last      *Assign    // the latest metadata, reapplied after a change
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
	remote, err := ctx.SpawnNamed(actor.PropsFromFunc(remoteReplica), "remote")
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

// remoteReplica answers the requests for a partition this node holds no
// replica of: NOT_LEADER with no leader known, so the client refreshes its
// metadata and goes to one of the partition's replicas.
func remoteReplica(ctx actor.Context) {
	f, ok := ctx.Message().(*heraldpb.Frame)
	if !ok || ctx.Sender() == nil {
		return
	}
	var topic string
	var part uint32
	switch b := f.Body.(type) {
	case *heraldpb.Frame_Produce:
		topic, part = b.Produce.Topic, b.Produce.GetPartition()
	case *heraldpb.Frame_Fetch:
		topic, part = b.Fetch.Topic, b.Fetch.Partition
	case *heraldpb.Frame_ListOffsets:
		topic, part = b.ListOffsets.Topic, b.ListOffsets.Partition
	}
	ctx.Respond(heraldpb.ErrorFrame(f.Id, partition.NotLeader(topic, part, 0)))
}

// onAssign reconciles the local replicas with the controller's placement.
func (m *Manager) onAssign(ctx actor.Context, a *Assign) {
	if m.cluster == nil {
		m.pendingAssign = a
		return
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
			continue // running (moving replicas between nodes is not built yet)
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
}

func sortedKeys[V any](mp map[string]V) []string {
	out := make([]string, 0, len(mp))
	for k := range mp {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// replicaDir is the log folder of this node's replica of a cluster
// topic's partition; the record's id keeps a re-created topic of the same
// name from reopening an old log.
func (m *Manager) replicaDir(rec *heraldpb.TopicRecord, p uint32) string {
	return filepath.Join(m.cfg.DataDir, "replicas", fmt.Sprintf("%s-%d-%s", rec.Name, p, rec.RequestId))
}

// spawnReplicated starts this node's replicas of a cluster topic and
// registers the topic.
func (m *Manager) spawnReplicated(ctx actor.Context, rec *heraldpb.TopicRecord) error {
	cfg := rec.Config
	n := len(rec.Partitions)
	pids := make([]*actor.PID, n)
	stats := make([]*partition.Stats, n)
	var started []int
	stop := func() {
		for _, p := range started {
			m.cluster.transport.Unregister(partition.Name(rec.Name, uint32(p)))
			ctx.Stop(pids[p])
		}
	}
	for i, pa := range rec.Partitions {
		p := pa.Id
		if int(p) != i {
			stop()
			return fmt.Errorf("topic %q: partition %d is listed at position %d", rec.Name, p, i)
		}
		stats[i] = &partition.Stats{}
		if !slices.Contains(pa.Replicas, m.cfg.NodeID) {
			pids[i] = m.cluster.remote
			continue
		}
		pcfg := m.partitionConfig(rec.Name, p, cfg, m.replicaDir(rec, p))
		pcfg.Peers = map[uint64]*actor.PID{}
		for _, r := range pa.Replicas {
			pcfg.Peers[r] = nil
		}
		pcfg.Transport = m.cluster.transport
		pcfg.Liveness = m.cluster.transport.Up
		pcfg.Campaign = pa.Replicas[0] == m.cfg.NodeID
		pcfg.MinInSync = int(cfg.MinInsyncReplicas)
		props, err := partition.Props(m.sys, pcfg, stats[i])
		if err != nil {
			stop()
			return err
		}
		pid, err := ctx.SpawnNamed(props, partition.Name(rec.Name, p))
		if err != nil {
			stop()
			return err
		}
		pids[i] = pid
		started = append(started, i)
		m.cluster.transport.Register(partition.Name(rec.Name, p), pid)
	}
	tpid, err := ctx.SpawnNamed(topicProps(rec.Name, pids, stats), "t/"+rec.Name)
	if err != nil {
		stop()
		return err
	}
	m.reg.update(func(reg map[string]*Entry) {
		reg[rec.Name] = &Entry{Name: rec.Name, Config: cfg, Topic: tpid, Partitions: pids, Stats: stats, Record: rec}
	})
	return nil
}

// removeReplicated stops a cluster topic's local replicas and deletes
// their logs, then runs done (if set) and reconciles again with the
// latest metadata (a topic re-created under the same name starts then).
func (m *Manager) removeReplicated(ctx actor.Context, e *Entry, done func(error)) {
	m.reg.update(func(reg map[string]*Entry) { delete(reg, e.Name) })
	m.deleting[e.Name] = true
	pids := []*actor.PID{e.Topic}
	for p, pid := range e.Partitions {
		if pid != m.cluster.remote {
			m.cluster.transport.Unregister(partition.Name(e.Name, uint32(p)))
			pids = append(pids, pid)
		}
	}
	m.stopAll(ctx, pids, func() {
		delete(m.deleting, e.Name)
		var err error
		for p, pid := range e.Partitions {
			partition.DeleteMetrics(e.Name, uint32(p))
			if pid == m.cluster.remote {
				continue
			}
			if rerr := m.cfg.FS.RemoveAll(m.replicaDir(e.Record, uint32(p))); rerr != nil && err == nil {
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

// ready reports whether a new topic can take writes: every partition of
// a local topic is writable, by idempotent producers (the SDK's default)
// too unless the topic is internal; every local replica of a cluster
// topic knows its leader.
func (e *Entry) ready(remote *actor.PID, internal bool) bool {
	for i, st := range e.Stats {
		switch {
		case e.Record == nil && (!st.Writable.Load() || (!internal && !st.Idempotent.Load())):
			return false
		case e.Record != nil && e.Partitions[i] != remote && st.Leader.Load() == 0:
			return false
		}
	}
	return true
}
