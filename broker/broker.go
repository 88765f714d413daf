// Package broker wires one Herald node together: the topic manager and its
// actors, the client-protocol server and the admin HTTP listener.
package broker

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/consumer"
	"github.com/heraldmq/herald/actors/partition"
	"github.com/heraldmq/herald/actors/scheduler"
	"github.com/heraldmq/herald/actors/topic"
	"github.com/heraldmq/herald/adminapi"
	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/cluster"
	"github.com/heraldmq/herald/internal/faults"
	"github.com/heraldmq/herald/internal/slogfloor"
	"github.com/heraldmq/herald/netio"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Version is the build's version, set with -ldflags "-X github.com/heraldmq/herald/broker.Version=...".
var Version = "dev"

// Broker is a running Herald node.
type Broker struct {
	cfg       *Config
	log       *slog.Logger
	sys       *actor.ActorSystem
	manager   *actor.PID
	groups    *actor.PID
	sched     *actor.PID
	txn       *actor.PID
	readers   *partition.ReaderPool
	server    *netio.Server
	tls       *tlsState // the TLS listener (tls.go); nil without one
	admin     *http.Server
	adminLn   net.Listener
	api       *adminapi.Server // the admin port's /api/v1 and dashboard
	lock      *os.File
	closing   atomic.Bool
	reclaim   *reclaimer
	reg       *registry.Registry
	readiness readiness
	readyStop chan struct{}
	readyOnce sync.Once
	member    *cluster.Node                      // nil on a single node
	ctrl      *cluster.Controller                // nil on a single node or without --peers
	ctrlReady atomic.Pointer[cluster.Controller] // ctrl, once started: for goroutines that may run before
	auth      *auth.Service
	audit     *auditLog // nil: none (--audit-log off)
	// nodeTLSClient dials the peers with the node certificate (nil
	// without mutual TLS between nodes): verifyNode's.
	nodeTLSClient *tls.Config
	users         *userStore
	exchanges     *exchanges
	tenancy       *tenancy
	nodeID        uint64

	// Consumer groups in a cluster (groups.go).
	groupsProps  *actor.Props
	groupsMu     sync.Mutex // guards groups and sched while coordination moves
	groupsHere   atomic.Bool
	groupsLeader atomic.Uint64
	coordStop    chan struct{}
	coordDone    sync.WaitGroup
	// The scheduler in a cluster: on the leader of __schedule.
	schedProps    *actor.Props
	schedHere     atomic.Bool
	schedLeader   atomic.Uint64
	schedForwards chan struct{} // forwarded requests in flight (maxSchedForwards)
	// The transaction coordinator in a cluster: on the leader of __txn.
	txnProps  *actor.Props
	txnHere   atomic.Bool
	txnLeader atomic.Uint64

	// The node's clock and data-dir filesystem: the system's, except in
	// a chaos build (internal/faults), where /debug/faults moves and
	// breaks them. stopFaults ends the scheduler's clock-jump pokes.
	clock      faults.Clock
	fs         persistence.FS
	stopFaults func()
}

// Start opens the data dir, reopens every topic and starts serving. The
// config is validated first.
func Start(cfg Config, logger *slog.Logger) (*Broker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	nodeID, err := resolveNodeID(cfg.DataDir, cfg.NodeID)
	if err != nil {
		lock.Close()
		return nil, err
	}
	b := &Broker{cfg: &cfg, log: logger, lock: lock, reclaim: startReclaimer(time.Minute), nodeID: nodeID,
		schedForwards: make(chan struct{}, maxSchedForwards), readyStop: make(chan struct{}),
		clock: faults.NodeClock(), fs: faults.NodeFS()}
	if faults.Enabled {
		logger.Warn("chaos build: faults can be injected at the admin listener's " + faults.Path + "; never run it in production")
	}
	b.readiness.started = time.Now()
	actorLog := logger.With("component", "actor")
	b.sys = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slogfloor.New(actorLog.Handler(), slog.LevelWarn)
	}))
	logFailures(b.sys, logger)
	// After a jump of the clock the scheduler looks at its time again
	// (scheduler.ClockJumped). Its time ignores steps of the wall clock,
	// which is all the chaos build's offset moves, so the look finds
	// nothing new; it costs one look per jump. The groups' timers follow
	// the clock by themselves.
	sys := b.sys
	b.stopFaults = faults.OnClockChange(func() {
		sys.Root.Send(actor.NewPID(sys.Address(), scheduler.ActorName), &scheduler.ClockJumped{})
	})
	b.readers = partition.NewReaderPool(b.sys, 4, 1024)
	advertise := cfg.Advertise
	if advertise == "" {
		advertise = cfg.Listen
	}
	var reg *registry.Registry
	b.manager, reg, err = topic.Spawn(b.sys, topic.Config{
		DataDir: cfg.DataDir, NodeID: nodeID, Advertise: advertise, FS: b.fs, Clock: b.clock,
		Flush: cfg.flush, SegmentBytes: cfg.SegmentBytes,
		DefaultPartitions: uint32(cfg.DefaultParts), MaxMessageBytes: uint32(cfg.MaxMessageBytes),
		RetentionCheck: cfg.RetentionCheck, MailboxLimit: cfg.PartitionMailbox, WindowBytes: cfg.WindowBytes,
		SyncPace: cfg.syncPace(), Readers: b.readers, Logger: logger, OnIdleRelease: b.reclaim.request,
		Clustered: cfg.Cluster != "" && len(cfg.peers) > 0,
	})
	if err != nil {
		b.stopFaults()
		lock.Close()
		return nil, err
	}
	b.reg = reg
	// On a single node the groups manager runs from the start over a local
	// __groups; in a cluster __groups is a replicated topic and the manager
	// runs on its leader (coordinateGroups).
	clustered := cfg.Cluster != "" && len(cfg.peers) > 0
	if !clustered {
		if res, ferr := b.sys.Root.RequestFuture(b.manager, &topic.EnsureInternal{Name: consumer.GroupsTopic, Partitions: 1}, 30*time.Second).Result(); ferr != nil || res.(*topic.EnsureInternalResult).Err != nil {
			if ferr == nil {
				ferr = res.(*topic.EnsureInternalResult).Err
			}
			b.stopActors()
			return nil, fmt.Errorf("internal topic %s: %w", consumer.GroupsTopic, ferr)
		}
	}
	dir := consumer.NewDirectory()
	var srv atomic.Pointer[netio.Server] // set once the server exists, before it serves
	push := func(id string, frame []byte) bool {
		if s := srv.Load(); s != nil {
			return s.Push(id, frame)
		}
		return false
	}
	pushRoom := func(id string) int {
		if s := srv.Load(); s != nil {
			return s.PushRoom(id)
		}
		return math.MaxInt32
	}
	b.groupsProps = consumer.Props(consumer.Options{
		Topics: reg, Dir: dir, Logger: logger, DefaultAckTimeout: cfg.AckTimeout, Push: push, PushRoom: pushRoom, Writer: sessionWriter{&srv},
		CompactBytes: cfg.groupsCompactBytes, CompactCheck: cfg.groupsCompactCheck,
		Breaker:     consumer.BreakerConfig{ConsecutiveFailures: cfg.BreakerFailures, CoolDown: cfg.BreakerCoolDown},
		RetryPolicy: cfg.retry, TopicManager: b.manager, IdleStop: idleStop(cfg.GroupIdleStop), Clock: b.clock,
	})
	if !clustered {
		if b.groups, err = b.sys.Root.SpawnNamed(b.groupsProps, consumer.ManagerName); err != nil {
			b.stopActors()
			return nil, fmt.Errorf("groups manager: %w", err)
		}
	}
	if err := b.startScheduler(reg, clustered); err != nil {
		b.stopActors()
		return nil, err
	}
	if err := b.startTxn(clustered, sessionWriter{&srv}); err != nil {
		b.stopActors()
		return nil, err
	}
	if cfg.Cluster != "" {
		nodeTLS, err := b.clusterTLS()
		if err != nil {
			b.stopActors()
			return nil, err
		}
		secret, err := readClusterSecret(cfg.ClusterSecretFile)
		if err != nil {
			b.stopActors()
			return nil, err
		}
		b.member, err = cluster.Start(cluster.Config{
			NodeID: nodeID, Bind: cfg.Cluster, HealthBind: cfg.ClusterHealth, Peers: cfg.peers,
			Provider: cfg.ClusterProvider, EtcdEndpoints: splitList(cfg.Etcd),
			MaxMessageBytes: max(64<<20, 2*int(cfg.MaxMessageBytes)), Local: b.sys, Logger: logger, TLS: nodeTLS, Secret: secret,
			Now: b.clock.Now,
		})
		if err != nil {
			b.stopActors()
			return nil, fmt.Errorf("cluster: %w", err)
		}
	}
	if err := b.startAuth(clustered); err != nil {
		b.stopActors()
		return nil, err
	}
	if err := b.startExchanges(clustered); err != nil {
		b.stopActors()
		return nil, fmt.Errorf("exchanges: %w", err)
	}
	groupRouter := consumer.NewRouter(b.sys, dir, actor.NewPID(b.sys.Address(), consumer.ManagerName))
	if clustered {
		groupRouter.SetGate(func() (uint64, bool) { return b.groupsLeader.Load(), b.groupsHere.Load() })
	}
	b.server, err = netio.NewServer(netio.Config{
		Listen: cfg.Listen, Multicore: true, EventLoops: cfg.EventLoops,
		MaxFrameBytes: cfg.MaxFrameBytes, MaxConnections: cfg.MaxConnections,
		IdleTimeout: cfg.IdleTimeout, MaxInFlight: cfg.MaxInFlight,
		MaxPendingOutput: cfg.MaxPendingOutput, MaxPendingOutputHard: cfg.MaxPendingOutputHard,
		WriteStallTimeout: neverIfZero(cfg.WriteStallTimeout), MaxQueuedRequestBytes: cfg.MaxQueuedRequestBytes,
		FrameTimeout: neverIfZero(cfg.FrameTimeout), MaxFrameBytesBeforeHello: cfg.MaxFrameBytesBeforeHello,
		MaxInFlightProduceBytes: offIfZero(cfg.MaxInFlightProduceBytes), MaxProduceDefer: neverIfZero(cfg.MaxProduceDefer), ProduceLatencyTarget: neverIfZero(cfg.ProduceLatencyTarget), NodeID: uint32(nodeID), ServerVersion: Version, Logger: logger,
		Auth: b.auth, Tenancy: b.tenancy, Audit: b.auditHook(),
	}, b.sys, newRouter(b.sys, groupRouter, topic.NewRouter(b.sys, reg, b.manager), b.routeScheduled, b.routeTxn, b.users.route, b.exchanges))
	if err != nil {
		b.stopActors()
		return nil, err
	}
	srv.Store(b.server)
	groupRouter.SetConnections(b.server)
	if err := b.server.Start(); err != nil {
		b.stopActors()
		return nil, fmt.Errorf("client listener %s: %w", cfg.Listen, err)
	}
	if err := b.startTLS(); err != nil {
		b.server.Shutdown(context.Background())
		b.stopActors()
		return nil, err
	}
	// The controller registers this node's client address: the bound
	// one, unless an advertised one is set.
	clientAddr := cfg.Advertise
	if clientAddr == "" {
		clientAddr = b.server.Addr().String()
	}
	if b.member != nil && len(cfg.peers) > 0 {
		ids := make([]uint64, 0, len(cfg.peers)+1)
		for id := range cfg.peers {
			ids = append(ids, id)
		}
		b.ctrl, err = cluster.StartController(cluster.ControllerConfig{
			Node: b.member, Local: b.sys, DataDir: cfg.DataDir, Voters: cluster.Voters(ids), Logger: logger,
			Self: &heraldpb.NodeRecord{NodeId: nodeID, ClusterAddress: cfg.Cluster, ClientAddress: clientAddr, ClientTlsAddress: b.advertisedTLS(), Rack: cfg.Rack, HealthAddress: b.member.HealthAddr(),
				Version: Version, StartedMs: b.readiness.started.UnixMilli()},
			OnApply: b.onMetadata, ReplicaGrace: cfg.ReplicaGrace, VerifyNode: b.nodeVerifier(),
			CheckpointRecords: cfg.ControllerCheckpointRecords, CheckpointBytes: cfg.ControllerCheckpointBytes,
			FS: b.fs, Clock: b.clock,
		})
		if err != nil {
			b.server.Shutdown(context.Background())
			b.stopTLS()
			b.stopActors()
			return nil, fmt.Errorf("controller: %w", err)
		}
		b.ctrlReady.Store(b.ctrl)
		b.sys.Root.Send(b.manager, &topic.Clustered{Catalog: b.ctrl, Transport: b.member})
		b.coordStop = make(chan struct{})
		b.coordDone.Add(1)
		go b.coordinateInternal(reg)
	}
	if cfg.Admin != "" {
		if err := b.startAdmin(); err != nil {
			b.server.Shutdown(context.Background())
			b.stopTLS()
			b.stopActors()
			return nil, fmt.Errorf("admin listener %s: %w", cfg.Admin, err)
		}
	}
	b.users.bootstrapCluster(b.readyStop)
	b.warnExposed()
	logger.Info("herald serving", "version", Version, "node", nodeID, "clients", b.server.Addr().String(),
		"admin", b.AdminAddr(), "data", cfg.DataDir, "flush", cfg.flush.String(), "clients_tls", tlsAddrString(b.TLSAddr()))
	go b.watchReady(b.readyStop)
	return b, nil
}

// nodeVerifier is the controller's VerifyNode: with mutual TLS between
// nodes, a registering node's certificate must name its id.
func (b *Broker) nodeVerifier() func(*heraldpb.NodeRecord) error {
	if b.nodeTLSClient == nil {
		return nil
	}
	return b.verifyNode
}

func (b *Broker) startAdmin() error {
	ln, err := net.Listen("tcp", b.cfg.Admin)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.Handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if b.closing.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if ok, why := b.Ready(); !ok {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("/cluster", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		ready, why := b.Ready()
		if b.member == nil {
			_ = json.NewEncoder(w).Encode(map[string]any{"mode": "single-node", "node_id": b.nodeID, "ready": ready, "not_ready": why})
			return
		}
		out := struct {
			cluster.View
			Controller *cluster.ControllerView `json:"controller,omitempty"`
			Ready      bool                    `json:"ready"`               // this node (see /readyz)
			NotReady   string                  `json:"not_ready,omitempty"` // what it waits for
		}{View: b.member.View(), Ready: ready, NotReady: why}
		if b.ctrl != nil {
			cv := b.ctrl.View()
			out.Controller = &cv
		}
		_ = json.NewEncoder(w).Encode(out)
	})
	if b.cfg.AdminPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	} else {
		// Profiles and traces expose the process's memory layout and
		// cost CPU: off unless asked for.
		mux.HandleFunc("/debug/pprof/", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "pprof is off: start the broker with --admin-pprof", http.StatusForbidden)
		})
	}
	faults.Register(mux) // /debug/faults, in a chaos build only
	b.api = b.startAdminAPI()
	b.api.Register(mux)
	b.adminLn = ln
	b.admin = &http.Server{Handler: b.guardAdmin(mux), ReadHeaderTimeout: 10 * time.Second}
	if b.tls != nil && b.tls.admin != nil {
		ln = tls.NewListener(ln, b.tls.admin.Config())
		b.adminLn = ln
	}
	go b.admin.Serve(ln)
	return nil
}

// Shutdown is the graceful stop: refuse new work, finish in-flight
// requests, stop the actors (each partition fsyncs and closes its log).
func (b *Broker) Shutdown() error {
	b.closing.Store(true)
	b.readyOnce.Do(func() { close(b.readyStop) })
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.ShutdownTimeout)
	defer cancel()
	err := b.server.Shutdown(ctx)
	if err != nil {
		b.log.Warn("in-flight requests did not finish before the shutdown timeout", "err", err)
	}
	b.stopTLS()
	b.flushGroups(ctx)
	b.stopActors()
	if b.api != nil {
		b.api.Close() // ends the event streams, which Shutdown would wait for
	}
	if b.admin != nil {
		b.admin.Shutdown(ctx)
	}
	if b.audit != nil {
		b.audit.close() // after the last request that could write to it
	}
	b.lock.Close()
	b.log.Info("herald stopped")
	return nil
}

// flushGroups writes every group's unwritten progress (auto-acked and
// filtered messages, whose progress is written lazily) before the logs
// close, so a graceful restart does not redeliver them.
func (b *Broker) flushGroups(ctx context.Context) {
	b.groupsMu.Lock()
	groups := b.groups
	b.groupsMu.Unlock()
	if groups == nil {
		return
	}
	res, err := b.sys.Root.RequestFuture(groups, &consumer.Coordinators{}, b.cfg.ShutdownTimeout).Result()
	if err != nil {
		b.log.Warn("listing consumer groups for the final flush", "err", err)
		return
	}
	var futures []*actor.Future
	for _, pid := range res.(*consumer.CoordinatorsList).PIDs {
		futures = append(futures, b.sys.Root.RequestFuture(pid, &consumer.FlushGroup{}, b.cfg.ShutdownTimeout))
	}
	for _, f := range futures {
		if _, err := f.Result(); err != nil {
			b.log.Warn("flushing consumer group progress", "err", err)
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// onMetadata hands the controller's metadata to the replica manager.
func (b *Broker) onMetadata(md *cluster.Metadata) {
	brokers := make([]*heraldpb.BrokerInfo, 0, len(md.Nodes))
	for _, id := range slices.Sorted(maps.Keys(md.Nodes)) {
		if n := md.Nodes[id]; n.ClientAddress != "" {
			brokers = append(brokers, &heraldpb.BrokerInfo{NodeId: uint32(id), Addr: n.ClientAddress, TlsAddr: n.ClientTlsAddress})
		}
	}
	b.sys.Root.Send(b.manager, &topic.Assign{Topics: md.Topics, Brokers: brokers, Applied: md.Applied})
	if b.users != nil {
		b.users.users.Set(md.Users)
		b.users.acls.Set(md.Acls)
		b.tenancy.setVhosts(slices.Collect(maps.Values(md.Vhosts)))
	}
	if b.exchanges != nil {
		b.exchanges.setMetadata(md.Exchanges)
	}
}

func (b *Broker) stopActors() {
	b.stopFaults()
	if b.coordStop != nil {
		close(b.coordStop)
		b.coordDone.Wait()
	}
	if b.ctrl != nil {
		b.ctrl.Stop()
	}
	// The partitions stop before the membership: their last raft
	// messages still have a transport.
	defer func() {
		if b.member != nil {
			b.member.Stop()
		}
	}()
	b.groupsMu.Lock()
	defer b.groupsMu.Unlock()
	if b.sched != nil {
		if _, err := b.sys.Root.StopFuture(b.sched).Result(); err != nil {
			b.log.Error("stopping the scheduler", "err", err)
		}
	}
	if b.txn != nil {
		if _, err := b.sys.Root.StopFuture(b.txn).Result(); err != nil {
			b.log.Error("stopping the transaction coordinator", "err", err)
		}
	}
	if b.groups != nil {
		if _, err := b.sys.Root.StopFuture(b.groups).Result(); err != nil {
			b.log.Error("stopping group actors", "err", err)
		}
	}
	if _, err := b.sys.Root.StopFuture(b.manager).Result(); err != nil {
		b.log.Error("stopping topic actors", "err", err)
	}
	b.readers.Close()
	b.sys.Shutdown()
	b.reclaim.stop()
}

// router is the node's one routing table: a handler per request body
// type, merged from the rooms' (topic.Router.Routes, consumer.Router.Routes)
// and the scheduler's and transaction coordinator's, consulted on the
// network loop for every request. Half messages and transaction requests
// go to the transaction coordinator; delayed produces and schedule
// requests to the scheduler.
type router struct {
	sys   *actor.ActorSystem
	table map[reflect.Type]topic.Handler
}

// newRouter builds the table. A request type claimed twice is a wiring
// bug, and panics at start.
func newRouter(sys *actor.ActorSystem, groups *consumer.Router, topics *topic.Router, sched, txns, users topic.Handler, x *exchanges) router {
	table := map[reflect.Type]topic.Handler{}
	add := func(routes map[reflect.Type]topic.Handler) {
		for t, h := range routes {
			if _, dup := table[t]; dup {
				panic(fmt.Sprintf("broker: two handlers for %v", t))
			}
			table[t] = h
		}
	}
	add(topics.Routes())
	add(groups.Routes())
	produce := table[reflect.TypeOf(&heraldpb.Frame_Produce{})]
	if x != nil {
		x.produce, x.txn = produce, txns
		add(x.routes())
		del := reflect.TypeOf(&heraldpb.Frame_DeleteTopic{})
		table[del] = x.wrapDeleteTopic(table[del])
	}
	table[reflect.TypeOf(&heraldpb.Frame_Produce{})] = func(f *heraldpb.Frame, replyTo *actor.PID) {
		if toTxn(f) {
			txns(f, replyTo)
			return
		}
		if toScheduler(f) {
			sched(f, replyTo)
			return
		}
		produce(f, replyTo)
	}
	add(map[reflect.Type]topic.Handler{
		reflect.TypeOf(&heraldpb.Frame_CancelScheduled{}):  sched,
		reflect.TypeOf(&heraldpb.Frame_ListScheduled{}):    sched,
		reflect.TypeOf(&heraldpb.Frame_EndHalf{}):          txns,
		reflect.TypeOf(&heraldpb.Frame_RegisterProducer{}): txns,
		reflect.TypeOf(&heraldpb.Frame_ListTxn{}):          txns,
		reflect.TypeOf(&heraldpb.Frame_InitProducerId{}):   txns,
		reflect.TypeOf(&heraldpb.Frame_EndTxn{}):           txns,
		reflect.TypeOf(&heraldpb.Frame_AlterUser{}):        users,
		reflect.TypeOf(&heraldpb.Frame_ListUsers{}):        users,
		reflect.TypeOf(&heraldpb.Frame_AlterAcls{}):        users,
		reflect.TypeOf(&heraldpb.Frame_ListAcls{}):         users,
		reflect.TypeOf(&heraldpb.Frame_AlterVhost{}):       users,
		reflect.TypeOf(&heraldpb.Frame_ListVhosts{}):       users,
		// Coordinator to coordinator only (broker.groupOffsets): a
		// client may not move a group's position this way.
		reflect.TypeOf(&heraldpb.Frame_CommitTxnOffsets{}): func(f *heraldpb.Frame, replyTo *actor.PID) {
			sys.Root.Send(replyTo, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_UNKNOWN_REQUEST,
				"CommitTxnOffsets is internal: commit group offsets with a transaction (EndTxn group_offsets)")))
		},
		// The transaction coordinator's, to partition leaders only.
		reflect.TypeOf(&heraldpb.Frame_ListOpenTxns{}): func(f *heraldpb.Frame, replyTo *actor.PID) {
			sys.Root.Send(replyTo, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_UNKNOWN_REQUEST,
				"ListOpenTxns is internal to the transaction coordinator: list transactions with ListTxn")))
		},
	})
	return router{sys: sys, table: table}
}

func (r router) Route(f *heraldpb.Frame, replyTo *actor.PID) {
	if e := checkRequest(f); e != nil {
		r.sys.Root.Send(replyTo, heraldpb.ErrorFrame(f.Id, e))
		return
	}
	if h := r.table[reflect.TypeOf(f.Body)]; h != nil {
		h(f, replyTo)
		return
	}
	r.sys.Root.Send(replyTo, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_UNKNOWN_REQUEST, "no handler for %T", f.Body)))
}

// reclaimer hands memory freed by idle partitions back to the OS. An idle
// broker allocates nothing, so no GC would run to notice the released
// caches; at most once per period after a release it forces one
// (debug.FreeOSMemory), so RSS follows the live set down.
type reclaimer struct {
	pending atomic.Bool
	done    chan struct{}
	once    sync.Once
}

func startReclaimer(period time.Duration) *reclaimer {
	r := &reclaimer{done: make(chan struct{})}
	go func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				if r.pending.Swap(false) {
					debug.FreeOSMemory()
				}
			case <-r.done:
				return
			}
		}
	}()
	return r
}

// request asks for a reclaim at the next period; cheap and non-blocking.
func (r *reclaimer) request() { r.pending.Store(true) }

func (r *reclaimer) stop() { r.once.Do(func() { close(r.done) }) }

// lockDataDir takes an exclusive lock so two brokers never share a data dir.
func lockDataDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("data dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("data dir %s is in use by another herald (lock: %v)", dir, err)
	}
	return f, nil
}

// resolveNodeID returns the node id kept in the data dir, storing the
// configured one (or 1) the first time. A configured id that differs from
// the stored one is an error: a data dir belongs to one node.
func resolveNodeID(dir string, configured uint64) (uint64, error) {
	path := filepath.Join(dir, "node-id")
	raw, err := os.ReadFile(path)
	if err == nil {
		stored, perr := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
		if perr != nil || stored == 0 {
			return 0, fmt.Errorf("node id file %s is damaged: %q", path, raw)
		}
		if configured != 0 && configured != stored {
			return 0, fmt.Errorf("setting \"node-id\": %d, but data dir %s belongs to node %d", configured, dir, stored)
		}
		return stored, nil
	}
	if !os.IsNotExist(err) {
		return 0, fmt.Errorf("node id: %w", err)
	}
	id := configured
	if id == 0 {
		id = 1
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatUint(id, 10)+"\n"), 0o644); err != nil {
		return 0, fmt.Errorf("node id: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, fmt.Errorf("node id: %w", err)
	}
	return id, nil
}

// ClientAddr is the bound client listener address.
func (b *Broker) ClientAddr() string { return b.server.Addr().String() }

// AdminAddr is the bound admin HTTP address, or "" when disabled.
func (b *Broker) AdminAddr() string {
	if b.adminLn == nil {
		return ""
	}
	return b.adminLn.Addr().String()
}

// idleStop maps the config's "0 = never" to consumer.Options' "negative =
// never".
func idleStop(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// sessionWriter is the consumer room's consumer.SessionWriter: the network
// server once it exists (no connection, so no member, exists before).
type sessionWriter struct{ srv *atomic.Pointer[netio.Server] }

func (w sessionWriter) SendRaw(conn *actor.PID, frame []byte) {
	if s := w.srv.Load(); s != nil {
		s.SendRaw(conn, frame)
	}
}

func (w sessionWriter) WriteThen(conn *actor.PID, f *heraldpb.Frame, notify *actor.PID, done any) {
	if s := w.srv.Load(); s != nil {
		s.WriteThen(conn, f, notify, done)
	}
}
