package topic

// The topic room's actors: the node's topic manager (Receive, its onX handlers, the catalog file) and the topic actors it spawns.

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
)

// ManagerName is the manager's actor name.
const ManagerName = "topics"

// Manager is the node's topic manager actor. Create it with Spawn.
type Manager struct {
	cfg      Config
	sys      *actor.ActorSystem
	reg      *registry.Registry
	deleting map[string]bool

	cluster       *clusterState   // nil on a single node
	pendingAssign *Assign         // metadata that came before Clustered
	moving        map[string]bool // topic/partition whose old replica is stopping
	completing    map[string]bool // moves whose end is being recorded
}

// Spawn starts the manager (which reopens every topic in the catalog) and
// returns its PID and the registry it maintains.
func Spawn(sys *actor.ActorSystem, cfg Config) (*actor.PID, *registry.Registry, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	if cfg.Readers == nil {
		cfg.Readers = partition.NewReaderPool(sys, 4, 1024)
	}
	if err := cfg.FS.MkdirAll(filepath.Join(cfg.DataDir, "topics"), 0o755); err != nil {
		return nil, nil, fmt.Errorf("topic: creating data dir: %w", err)
	}
	topics, err := loadCatalog(cfg.FS, cfg.DataDir)
	if err != nil {
		return nil, nil, err
	}
	reg := &registry.Registry{}
	sup := actor.NewOneForOneStrategy(10, 10*time.Second, actor.DefaultDecider)
	props := actor.PropsFromProducer(func() actor.Actor {
		return &Manager{cfg: cfg, sys: sys, reg: reg, deleting: map[string]bool{}, moving: map[string]bool{}, completing: map[string]bool{}}
	}, actor.WithSupervisor(sup))
	pid, err := sys.Root.SpawnNamed(props, ManagerName)
	if err != nil {
		return nil, nil, err
	}
	// Reopen the catalog's topics before serving: the spawn requests queue
	// ahead of any client request.
	for _, t := range topics {
		if cfg.Clustered && registry.IsInternal(t.Name) {
			// A node that ran alone before: in a cluster the internal
			// topics are the controller's, replicated. The old log stays
			// on disk, not served.
			cfg.Logger.Warn("a node-local internal topic from before this node joined a cluster is not served; its log stays on disk",
				"topic", t.Name, "dir", filepath.Join(cfg.DataDir, "topics"))
			continue
		}
		sys.Root.Send(pid, &reopenTopic{info: t})
	}
	res, err := sys.Root.RequestFuture(pid, &syncBarrier{}, 30*time.Second).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("topic: starting manager: %w", err)
	}
	if e, ok := res.(error); ok && e != nil {
		return nil, nil, e
	}
	if !cfg.Clustered {
		reg.SetSynced() // the catalog is the node's own
	}
	return pid, reg, nil
}

type reopenTopic struct{ info *heraldpb.TopicInfo }
type syncBarrier struct{}

// Receive is the manager's entry point.
func (m *Manager) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *reopenTopic:
		if err := m.spawnTopic(ctx, msg.info.Name, msg.info.Config); err != nil {
			m.cfg.Logger.Error("reopening topic", "topic", msg.info.Name, "err", err)
		}
	case *syncBarrier:
		ctx.Respond(nil)
	case *EnsureInternal:
		m.onEnsureInternal(ctx, msg)
	case *awaitCreated:
		m.awaitWritable(ctx, msg)
	case *Clustered:
		m.onClustered(ctx, msg)
	case *Assign:
		m.onAssign(ctx, msg)
	case *clusterOpDone:
		m.onClusterOpDone(ctx, msg)
	case *reconcileAgain:
		if m.cluster != nil && m.cluster.last != nil {
			m.onAssign(ctx, m.cluster.last)
		}
	case *targetReached:
		m.onTargetReached(ctx, msg)
	case *completeDone:
		delete(m.completing, msg.key)
	case *heraldpb.Frame:
		m.onFrame(ctx, msg)
	}
}

func (m *Manager) onFrame(ctx actor.Context, f *heraldpb.Frame) {
	switch b := f.Body.(type) {
	case *heraldpb.Frame_CreateTopic:
		m.onCreate(ctx, f.Id, b.CreateTopic)
	case *heraldpb.Frame_DeleteTopic:
		m.onDelete(ctx, f.Id, b.DeleteTopic)
	case *heraldpb.Frame_ClusterAdmin:
		m.onClusterAdmin(ctx, f.Id, b.ClusterAdmin)
	case *heraldpb.Frame_ListTopics, *heraldpb.Frame_DescribeTopic, *heraldpb.Frame_Metadata:
		if !m.reg.Synced() {
			// Not caught up with the controller: a topic missing here may
			// exist (issue 14: TOPIC_NOT_FOUND for a topic that exists).
			ctx.Respond(heraldpb.ErrorFrame(f.Id, registry.NotReady(requestedTopic(f))))
			return
		}
		m.onRead(ctx, f)
	default:
		ctx.Respond(heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "the topic manager does not handle %T", f.Body)))
	}
}

// onRead answers ListTopics, DescribeTopic and Metadata from the registry.
func (m *Manager) onRead(ctx actor.Context, f *heraldpb.Frame) {
	switch b := f.Body.(type) {
	case *heraldpb.Frame_ListTopics:
		resp := listTopics(m.reg.All(), uint32(m.cfg.NodeID))
		ctx.Respond(&heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListTopicsResponse{ListTopicsResponse: resp}})
	case *heraldpb.Frame_DescribeTopic:
		e := m.reg.Get(b.DescribeTopic.Name)
		if e == nil {
			ctx.Respond(heraldpb.ErrorFrame(f.Id, topicNotFound(b.DescribeTopic.Name)))
			return
		}
		ctx.Respond(&heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_DescribeTopicResponse{DescribeTopicResponse: &heraldpb.DescribeTopicResponse{Topic: e.Info(uint32(m.cfg.NodeID))}}})
	case *heraldpb.Frame_Metadata:
		brokers := []*heraldpb.BrokerInfo{{NodeId: uint32(m.cfg.NodeID), Addr: m.cfg.Advertise}}
		if m.cluster != nil && len(m.cluster.brokers) > 0 {
			brokers = m.cluster.brokers
		}
		resp, e := metadata(m.reg.All(), b.Metadata.Topics, brokers, uint32(m.cfg.NodeID))
		if e != nil {
			ctx.Respond(heraldpb.ErrorFrame(f.Id, e))
			return
		}
		ctx.Respond(&heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_MetadataResponse{MetadataResponse: resp}})
	}
}

func (m *Manager) onCreate(ctx actor.Context, id uint64, req *heraldpb.CreateTopicRequest) {
	cfg, e := normalize(&m.cfg, req.Name, req.Config)
	if e != nil {
		ctx.Respond(heraldpb.ErrorFrame(id, e))
		return
	}
	cfg.Owner = req.Owner
	if m.reg.Get(req.Name) != nil || m.deleting[req.Name] {
		ctx.Respond(heraldpb.ErrorFrame(id, heraldpb.NewError(heraldpb.ErrorCode_TOPIC_ALREADY_EXISTS, "topic %q already exists", req.Name)))
		return
	}
	if m.cfg.Clustered {
		if m.cluster == nil {
			ctx.Respond(heraldpb.ErrorFrame(id, clusterStarting()))
			return
		}
		m.clusterCreate(ctx, id, req.Name, cfg)
		return
	}
	if err := m.spawnTopic(ctx, req.Name, cfg); err != nil {
		ctx.Respond(heraldpb.ErrorFrame(id, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "creating topic %q: %v", req.Name, err)))
		return
	}
	if err := m.saveCatalog(); err != nil {
		// The catalog on disk does not name the topic, so a restart would
		// forget it: undo the creation instead of keeping a topic that
		// lives only until then (a retry would have been told it exists).
		e := m.reg.Get(req.Name)
		m.reg.Update(func(reg map[string]*registry.Entry) { delete(reg, req.Name) })
		m.deleting[req.Name] = true
		replyTo := ctx.Sender()
		m.stopAll(ctx, append([]*actor.PID{e.Topic}, e.Partitions...), func() {
			delete(m.deleting, req.Name)
			for p := range e.Partitions {
				partition.DeleteMetrics(req.Name, uint32(p))
				if rerr := m.cfg.FS.RemoveAll(m.partitionDir(req.Name, uint32(p))); rerr != nil {
					m.cfg.Logger.Warn("removing the partition of a topic whose creation failed", "topic", req.Name, "partition", p, "err", rerr)
				}
			}
			ctx.Send(replyTo, heraldpb.ErrorFrame(id, heraldpb.NewError(heraldpb.ErrorCode_STORAGE_ERROR, "saving catalog: %v; topic %q was not created", err, req.Name)))
		})
		return
	}
	m.awaitWritable(ctx, &awaitCreated{name: req.Name, frameID: id, replyTo: ctx.Sender(), deadline: time.Now().Add(createWait)})
}

// createWait bounds how long CreateTopic waits for the new partitions to
// elect leaders; after it the topic is returned as it is and producers
// retry (THROTTLED or NOT_LEADER) until the partitions are writable.
const createWait = 10 * time.Second

// awaitCreated is a CreateTopic answer waiting for its partitions to
// become writable, so a producer that creates a topic can use it at once.
type awaitCreated struct {
	name     string
	frameID  uint64
	replyTo  *actor.PID
	deadline time.Time
	internal bool // answer with EnsureInternalResult
}

// awaitWritable answers a create once every partition accepts writes, or
// at the deadline; meanwhile it re-checks every few milliseconds without
// blocking the mailbox.
func (m *Manager) awaitWritable(ctx actor.Context, w *awaitCreated) {
	e := m.reg.Get(w.name)
	if e == nil {
		if w.internal {
			ctx.Send(w.replyTo, &EnsureInternalResult{Err: fmt.Errorf("topic: internal topic %q vanished", w.name)})
			return
		}
		ctx.Send(w.replyTo, heraldpb.ErrorFrame(w.frameID, topicNotFound(w.name)))
		return
	}
	var remote *actor.PID
	if m.cluster != nil {
		remote = m.cluster.remote
	}
	ready := ready(e, remote, w.internal)
	if !ready && time.Now().Before(w.deadline) {
		self, sys := ctx.Self(), m.sys
		time.AfterFunc(2*time.Millisecond, func() { sys.Root.Send(self, w) })
		return
	}
	if w.internal {
		var err error
		if !ready {
			err = fmt.Errorf("topic: internal topic %q is not writable after %v", w.name, createWait)
		}
		ctx.Send(w.replyTo, &EnsureInternalResult{Err: err})
		return
	}
	ctx.Send(w.replyTo, &heraldpb.Frame{Id: w.frameID, Body: &heraldpb.Frame_CreateTopicResponse{CreateTopicResponse: &heraldpb.CreateTopicResponse{Topic: e.Info(uint32(m.cfg.NodeID))}}})
}

// internalSegmentCache is how many older log segments an internal
// partition keeps in memory (4 MiB each by default; others keep one).
const internalSegmentCache = 4

func (m *Manager) partitionDir(name string, p uint32) string {
	return filepath.Join(m.cfg.DataDir, "topics", fmt.Sprintf("%s-%d", name, p))
}

// partitionConfig is the config of a local replica of name's partition p
// whose log is in dir.
func (m *Manager) partitionConfig(name string, p uint32, cfg *heraldpb.TopicConfig, dir string) partition.Config {
	group := fmt.Sprintf("%s-%d", name, p)
	// The internal partitions are few and read at several places at once
	// (the scheduler reads due batches from __schedule a second ahead
	// while it appends fire records and looks up cancels): with one cached
	// segment, those reads took turns reloading whole segments.
	segCache := 0
	if registry.IsInternal(name) {
		segCache = internalSegmentCache
	}
	return partition.Config{
		Topic: name, Partition: p, ReplicaID: m.cfg.NodeID,
		Open: func() (partition.Storage, error) {
			return persistence.Open(persistence.Options{
				Dir: dir, FS: m.cfg.FS, Flush: m.cfg.Flush, SegmentBytes: m.cfg.SegmentBytes,
				Logger: m.cfg.Logger, Group: group, SegmentCacheSize: segCache,
			})
		},
		IndexPath:         filepath.Join(dir, "priority.idx"),
		ProducerStatePath: filepath.Join(dir, "producers.state"),
		MaxMessageBytes:   int(cfg.MaxMessageBytes),
		RetentionAge:      time.Duration(cfg.RetentionMs) * time.Millisecond,
		RetentionBytes:    cfg.RetentionBytes,
		RetentionCheck:    m.cfg.RetentionCheck,
		TickInterval:      m.cfg.TickInterval,
		MailboxLimit:      m.cfg.MailboxLimit,
		WindowBytes:       m.cfg.WindowBytes,
		SyncPace:          m.cfg.SyncPace,
		Readers:           m.cfg.Readers,
		OnRelease:         m.cfg.OnIdleRelease,
		Clock:             m.cfg.Clock,
		ClockID:           m.cfg.ClockID,
		Logger:            m.cfg.Logger,
	}
}

// spawnTopic starts the partition actors and the topic actor of a topic and
// registers them.
func (m *Manager) spawnTopic(ctx actor.Context, name string, cfg *heraldpb.TopicConfig) error {
	n := int(cfg.Partitions)
	pids := make([]*actor.PID, 0, n)
	stats := make([]*partition.Stats, 0, n)
	stop := func() {
		for _, p := range pids {
			ctx.Stop(p)
		}
	}
	for p := uint32(0); p < cfg.Partitions; p++ {
		pcfg := m.partitionConfig(name, p, cfg, m.partitionDir(name, p))
		// Single node: the only voter is this node, addressed by the
		// deterministic name; the cluster replaces this with the replica set.
		self := actor.NewPID(m.sys.Address(), ctx.Self().Id+"/"+partition.Name(name, p))
		pcfg.Peers = map[uint64]*actor.PID{m.cfg.NodeID: self}
		st := &partition.Stats{}
		props, err := partition.Props(m.sys, pcfg, st)
		if err != nil {
			stop()
			return err
		}
		pid, err := ctx.SpawnNamed(props, partition.Name(name, p))
		if err != nil {
			stop()
			return err
		}
		pids = append(pids, pid)
		stats = append(stats, st)
	}
	tpid, err := ctx.SpawnNamed(topicProps(name, m.reg), "t/"+name)
	if err != nil {
		stop()
		return err
	}
	m.reg.Update(func(reg map[string]*registry.Entry) {
		reg[name] = &registry.Entry{Name: name, Config: cfg, Topic: tpid, Partitions: pids, Stats: stats}
	})
	return nil
}

// EnsureInternal asks the manager for an internal topic (a name starting
// with "__", which clients cannot create, delete or produce to), created
// with Partitions partitions and no retention if it does not exist. The
// answer is an EnsureInternalResult, once every partition is writable.
type EnsureInternal struct {
	Name       string
	Partitions uint32
	// MaxMessageBytes is the largest batch it accepts; 0 = the broker's
	// max message size. (Internal writers may need headroom above what
	// clients may send: a delayed batch plus its envelope.)
	MaxMessageBytes uint32
}

// EnsureInternalResult answers EnsureInternal.
type EnsureInternalResult struct{ Err error }

func (m *Manager) onEnsureInternal(ctx actor.Context, req *EnsureInternal) {
	if !registry.IsInternal(req.Name) || req.Partitions == 0 {
		ctx.Respond(&EnsureInternalResult{Err: fmt.Errorf("topic: %q is not an internal topic name, or has no partitions", req.Name)})
		return
	}
	if m.reg.Get(req.Name) == nil {
		cfg := &heraldpb.TopicConfig{Partitions: req.Partitions, ReplicationFactor: 1, MaxMessageBytes: cmp.Or(req.MaxMessageBytes, m.cfg.MaxMessageBytes)}
		if err := m.spawnTopic(ctx, req.Name, cfg); err != nil {
			ctx.Respond(&EnsureInternalResult{Err: err})
			return
		}
		if err := m.saveCatalog(); err != nil {
			ctx.Respond(&EnsureInternalResult{Err: err})
			return
		}
	}
	m.awaitWritable(ctx, &awaitCreated{name: req.Name, replyTo: ctx.Sender(), deadline: time.Now().Add(createWait), internal: true})
}

func (m *Manager) onDelete(ctx actor.Context, id uint64, req *heraldpb.DeleteTopicRequest) {
	if registry.IsInternal(req.Name) {
		ctx.Respond(heraldpb.ErrorFrame(id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "topic %q is internal and cannot be deleted", req.Name)))
		return
	}
	e := m.reg.Get(req.Name)
	if m.cfg.Clustered && (e == nil || e.Record != nil) {
		if m.cluster == nil {
			ctx.Respond(heraldpb.ErrorFrame(id, clusterStarting()))
			return
		}
		m.clusterDelete(ctx, id, req.Name)
		return
	}
	if e == nil {
		ctx.Respond(heraldpb.ErrorFrame(id, topicNotFound(req.Name)))
		return
	}
	// Unregister first: new requests get TOPIC_NOT_FOUND while the actors stop.
	m.reg.Update(func(reg map[string]*registry.Entry) { delete(reg, req.Name) })
	m.deleting[req.Name] = true
	replyTo := ctx.Sender()
	pids := append([]*actor.PID{e.Topic}, e.Partitions...)
	m.stopAll(ctx, pids, func() {
		delete(m.deleting, req.Name)
		var err error
		for p := range e.Partitions {
			partition.DeleteMetrics(req.Name, uint32(p))
			if rerr := m.cfg.FS.RemoveAll(m.partitionDir(req.Name, uint32(p))); rerr != nil && err == nil {
				err = rerr
			}
		}
		if serr := m.saveCatalog(); serr != nil && err == nil {
			err = serr
		}
		if err != nil {
			ctx.Send(replyTo, heraldpb.ErrorFrame(id, heraldpb.NewError(heraldpb.ErrorCode_STORAGE_ERROR, "deleting topic %q: %v", req.Name, err)))
			return
		}
		ctx.Send(replyTo, &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_DeleteTopicResponse{DeleteTopicResponse: &heraldpb.DeleteTopicResponse{}}})
	})
}

// stopAll stops pids one after another without blocking the mailbox, then
// runs done on the manager.
func (m *Manager) stopAll(ctx actor.Context, pids []*actor.PID, done func()) {
	if len(pids) == 0 {
		done()
		return
	}
	ctx.ReenterAfter(ctx.StopFuture(pids[0]), func(interface{}, error) {
		m.stopAll(ctx, pids[1:], done)
	})
}

// catalog is the file that lists topics and their configs. It is replaced
// atomically (temp file, fsync, rename, fsync dir). The controller's raft
// group takes its place when Herald becomes a cluster.
const catalogFile = "catalog.json"

func loadCatalog(fs persistence.FS, dir string) ([]*heraldpb.TopicInfo, error) {
	f, err := fs.OpenFile(filepath.Join(dir, catalogFile), os.O_RDONLY, 0)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("topic: opening catalog: %w", err)
	}
	defer f.Close()
	return decodeCatalog(f, filepath.Join(dir, catalogFile))
}

func (m *Manager) saveCatalog() error {
	data, err := encodeCatalog(m.reg.All())
	if err != nil {
		return err
	}
	return persistence.WriteFileAtomic(m.cfg.FS, filepath.Join(m.cfg.DataDir, catalogFile), data, 0o644)
}

// topicActor routes the produce requests sent to a topic's PID (the
// consumer room's dead letters) through the registry's routing
// (registry.Entry.Route), as the network loops route clients' produces
// themselves. Its PID is also the topic's identity (registry.Same).
type topicActor struct {
	name string
	reg  *registry.Registry
}

func topicProps(name string, reg *registry.Registry) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &topicActor{name: name, reg: reg}
	})
}

func (t *topicActor) Receive(ctx actor.Context) {
	f, ok := ctx.Message().(*heraldpb.Frame)
	if !ok {
		return
	}
	req := f.GetProduce()
	if req == nil {
		ctx.Send(ctx.Sender(), heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "topic actors route produce requests only")))
		return
	}
	e := t.reg.Get(t.name)
	if e == nil || e.Topic == nil || !e.Topic.Equal(ctx.Self()) {
		ctx.Send(ctx.Sender(), heraldpb.ErrorFrame(f.Id, topicNotFound(t.name))) // deleted meanwhile
		return
	}
	part, to, perr := e.Route(req)
	if perr != nil {
		ctx.Send(ctx.Sender(), heraldpb.ErrorFrame(f.Id, perr))
		return
	}
	req.Partition = &part
	ctx.RequestWithCustomSender(to, f, ctx.Sender())
}
