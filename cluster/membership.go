// Package cluster is Herald's cluster layer. This file is membership: which
// Herald nodes are up, from protoactor-go's cluster (the automanaged provider
// by default, etcd on request), under Herald's own stable node ids.
//
// Each node runs a cluster actor system of its own, separate from the
// node's local actor system where topics and partitions live: protoactor
// blocks a member id for good once the others saw it leave, so a node that
// was cut off and blocked rejoins under a new member id by replacing only
// the cluster system, without a restart of the node and without touching
// its partitions. The cluster system carries Herald's traffic between nodes
// (remote), bound to the configured address only.
package cluster

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/automanaged"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/etcd"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/heraldmq/herald/internal/raftwire"
	"github.com/heraldmq/herald/internal/slogfloor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/labstack/echo"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"
)

// Providers of membership.
const (
	ProviderAutomanaged = "automanaged"
	ProviderEtcd        = "etcd"
)

// kindPrefix names the cluster kind each node registers, so that every
// provider's member list carries the Herald node id.
const kindPrefix = "herald-node-"

// Config configures one node's membership.
type Config struct {
	// NodeID is the node's stable id (kept in its data dir); not 0.
	NodeID uint64
	// Bind is the host:port the node's cluster traffic (protoactor remote,
	// gRPC) listens on and is reached at. Port 0 picks a free one (tests).
	Bind string
	// HealthBind is the host:port of the node's health endpoint (polled
	// by the automanaged provider; asked whether a member id is blocked,
	// with either provider). Empty: Bind's host and port+1.
	HealthBind string
	// Peers maps node ids to their Bind addresses, this node's included
	// or not. The automanaged provider polls each one's health endpoint
	// (its port+1, unless PeerHealth names it).
	Peers map[uint64]string
	// PeerHealth overrides a peer's health address (tests with port 0).
	PeerHealth map[uint64]string
	// Provider is ProviderAutomanaged (default) or ProviderEtcd.
	Provider string
	// EtcdEndpoints are the etcd servers of ProviderEtcd.
	EtcdEndpoints []string
	// Name is the cluster's name; nodes with another name are ignored.
	// Default "herald".
	Name string
	// MaxMessageBytes is the largest message between nodes (the gRPC
	// receive limit applies to a whole batch of remote messages). Default
	// 64 MiB.
	MaxMessageBytes int
	// Refresh is how often the automanaged provider polls the peers and
	// the node checks whether a peer blocked it. Default 1 s.
	Refresh time.Duration
	// QueueSize bounds the messages waiting to be sent to one peer (the
	// remote endpoint writer's queue; past it they are dropped, and raft
	// retransmits). Default 65536.
	QueueSize int
	// OnChange, if set, is called (on a goroutine of its own, one call at
	// a time) with each new view of the members.
	OnChange func(View)
	// Local is the node's local actor system, where the replicas that
	// Register for raft messages from other nodes live.
	Local  *actor.ActorSystem
	Logger *slog.Logger
	// TLS, if set, is mutual TLS between nodes (tls.go).
	TLS *TLS
	// Secret, if set, is the cluster secret every call between nodes
	// carries (secret.go); at least MinSecretBytes.
	Secret []byte
	// Now is the node's wall clock, which its health endpoint tells its
	// peers (/herald/time, ClusterNow). Default time.Now.
	Now func() time.Time
}

func (c *Config) ensureDefaults() {
	if c.Provider == "" {
		c.Provider = ProviderAutomanaged
	}
	if c.Name == "" {
		c.Name = "herald"
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = 64 << 20
	}
	if c.Refresh == 0 {
		c.Refresh = time.Second
	}
	if c.QueueSize == 0 {
		c.QueueSize = 65536
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// ErrBadConfig marks an invalid Config.
var ErrBadConfig = errors.New("herald: bad cluster config")

// Validate reports every problem with the config at once.
func (c *Config) Validate() error {
	var errs []error
	if c.NodeID == 0 {
		errs = append(errs, errors.New("node id must not be 0"))
	}
	if c.NodeID > heraldpb.MaxNodeID {
		errs = append(errs, fmt.Errorf("node id %d is above %d (raft ids keep the node id in 32 bits)", c.NodeID, heraldpb.MaxNodeID))
	}
	if _, _, err := splitHostPort(c.Bind); err != nil {
		errs = append(errs, fmt.Errorf("cluster address: %w", err))
	}
	if len(c.Secret) > 0 && len(c.Secret) < MinSecretBytes {
		errs = append(errs, fmt.Errorf("cluster secret: %d bytes, at least %d needed", len(c.Secret), MinSecretBytes))
	}
	if c.HealthBind != "" {
		if _, _, err := splitHostPort(c.HealthBind); err != nil {
			errs = append(errs, fmt.Errorf("cluster health address: %w", err))
		}
	}
	for id, a := range c.Peers {
		if id == 0 || id > heraldpb.MaxNodeID {
			errs = append(errs, fmt.Errorf("peer node id %d is outside 1-%d", id, heraldpb.MaxNodeID))
		}
		if _, _, err := splitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("peer %d: %w", id, err))
		}
	}
	errs = append(errs, c.validatePeerAddresses()...)
	switch c.Provider {
	case "", ProviderAutomanaged:
	case ProviderEtcd:
		if len(c.EtcdEndpoints) == 0 {
			errs = append(errs, errors.New("the etcd provider needs etcd endpoints"))
		}
	default:
		errs = append(errs, fmt.Errorf("unknown provider %q (want %s or %s)", c.Provider, ProviderAutomanaged, ProviderEtcd))
	}
	if c.MaxMessageBytes < 0 || c.QueueSize < 0 || c.Refresh < 0 {
		errs = append(errs, errors.New("limits must not be negative"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrBadConfig, errors.Join(errs...))
	}
	return nil
}

// validatePeerAddresses reports peer lists that cannot work: this node
// named at an address other than Bind (the node id may come from the data
// dir, so the broker cannot check it alone), two listeners at one address
// (cluster addresses and, with the automanaged provider, the health
// endpoints the peers poll), and a health endpoint at a port other than
// the one the peers poll (Bind's port + 1).
func (c *Config) validatePeerAddresses() []error {
	var errs []error
	if a, ok := c.Peers[c.NodeID]; ok && c.NodeID != 0 && a != c.Bind {
		errs = append(errs, fmt.Errorf("peers name node %d at %s, but its cluster address is %s", c.NodeID, a, c.Bind))
	}
	automanaged := c.Provider == "" || c.Provider == ProviderAutomanaged
	owner := map[string]string{}
	claim := func(addr, what string) {
		if prev, dup := owner[addr]; dup {
			errs = append(errs, fmt.Errorf("%s and %s are both %s", prev, what, addr))
			return
		}
		owner[addr] = what
	}
	for _, id := range slices.Sorted(maps.Keys(c.Peers)) {
		claim(c.Peers[id], fmt.Sprintf("node %d's cluster address", id))
	}
	if automanaged {
		for _, id := range slices.Sorted(maps.Keys(c.Peers)) {
			h, ok := c.PeerHealth[id]
			if !ok {
				h = healthAddr(c.Peers[id])
			}
			claim(h, fmt.Sprintf("node %d's health endpoint", id))
		}
		_, bindPort, err := splitHostPort(c.Bind)
		_, healthPort, herr := splitHostPort(c.HealthBind)
		_, overridden := c.PeerHealth[c.NodeID]
		if len(c.Peers) > 0 && c.HealthBind != "" && !overridden && err == nil && herr == nil && bindPort != 0 && healthPort != bindPort+1 {
			errs = append(errs, fmt.Errorf("the health endpoint %s is not at the cluster port + 1 (%d), where the peers poll it", c.HealthBind, bindPort+1))
		}
	}
	return errs
}

// ParsePeers parses "1@host:port,2@host:port".
func ParsePeers(s string) (map[uint64]string, error) {
	peers := map[uint64]string{}
	if strings.TrimSpace(s) == "" {
		return peers, nil
	}
	for _, p := range strings.Split(s, ",") {
		idText, addr, ok := strings.Cut(strings.TrimSpace(p), "@")
		if !ok {
			return nil, fmt.Errorf("%w: peer %q is not ID@HOST:PORT", ErrBadConfig, p)
		}
		id, err := strconv.ParseUint(idText, 10, 64)
		if err != nil || id == 0 || id > heraldpb.MaxNodeID {
			return nil, fmt.Errorf("%w: peer %q: node id must be an integer from 1 to %d", ErrBadConfig, p, heraldpb.MaxNodeID)
		}
		if _, _, err := splitHostPort(addr); err != nil {
			return nil, fmt.Errorf("%w: peer %q: %v", ErrBadConfig, p, err)
		}
		if prev, dup := peers[id]; dup && prev != addr {
			return nil, fmt.Errorf("%w: node %d given twice (%s, %s)", ErrBadConfig, id, prev, addr)
		}
		peers[id] = addr
	}
	return peers, nil
}

func splitHostPort(a string) (string, int, error) {
	h, p, err := net.SplitHostPort(a)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", a)
	}
	if h == "" {
		return "", 0, fmt.Errorf("no host in %q (bind an explicit address; 0.0.0.0 only if meant)", a)
	}
	return h, port, nil
}

// Member is one node as membership sees it.
type Member struct {
	NodeID   uint64 `json:"node_id"`
	MemberID string `json:"member_id"` // protoactor's, new at every (re)join
	Address  string `json:"address"`   // its cluster (remote) address
	Self     bool   `json:"self,omitempty"`
}

// View is the members the node sees, ordered by node id.
type View struct {
	Self    Member    `json:"self"`
	Members []Member  `json:"members"`
	Rejoins int       `json:"rejoins"` // times this node rejoined under a new member id
	At      time.Time `json:"at"`
}

// Up reports whether node id is in the view.
func (v View) Up(id uint64) bool {
	return slices.ContainsFunc(v.Members, func(m Member) bool { return m.NodeID == id })
}

// Node is a running member.
type Node struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	inc     *incarnation
	joining *incarnation // being started by a rejoin
	view    View
	rejoins int
	closed  bool

	learned map[uint64]learnedPeer // nodes not in cfg.Peers that the metadata names
	seen    map[uint64]string      // the cluster address of every node seen a member, by node id

	groups       groups
	forwardSlots chan struct{} // forwarded requests being served (MaxForwardedInFlight)
	changes      chan View
	stop         chan struct{}
	done         sync.WaitGroup
	client       *http.Client
}

// learnedPeer is a node's addresses as its registration gave them.
type learnedPeer struct{ cluster, health string }

// Learn makes a node that --peers does not list (one added to the cluster
// later) reachable: the membership polls its health endpoint and the
// transport finds its cluster address. The controller calls it for every
// registered node.
func (n *Node) Learn(id uint64, cluster, health string) {
	if id == 0 || cluster == "" {
		return
	}
	if health == "" {
		health = healthAddr(cluster)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, listed := n.cfg.Peers[id]; listed || id == n.cfg.NodeID {
		return
	}
	if n.learned == nil {
		n.learned = map[uint64]learnedPeer{}
	}
	if n.learned[id] != (learnedPeer{cluster, health}) {
		n.log.Info("learned a node from the cluster metadata", "node", id, "cluster", cluster, "health", health)
	}
	n.learned[id] = learnedPeer{cluster, health}
}

// pollHosts is the health endpoints to poll: base (from the config) and
// those of learned nodes.
func (n *Node) pollHosts(base []string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.learned) == 0 {
		return base
	}
	out := slices.Clone(base)
	for _, p := range n.learned {
		if !slices.Contains(out, p.health) {
			out = append(out, p.health)
		}
	}
	slices.Sort(out)
	return out
}

// HealthAddr is this node's health endpoint as its peers poll it.
func (n *Node) HealthAddr() string {
	if n.cfg.HealthBind != "" {
		return n.cfg.HealthBind
	}
	return healthAddr(n.cfg.Bind)
}

// incarnation is one membership under one member id: a cluster actor
// system with its remote, its protoactor cluster and its health endpoint.
type incarnation struct {
	once sync.Once
	down atomic.Bool // shut down
	sys  *actor.ActorSystem
	cl   *pcluster.Cluster
	sub  *eventSubscription
	ln   net.Listener // the health endpoint's
	// health is the health endpoint's server when Herald runs it itself
	// (etcd provider; the automanaged provider runs it).
	health *echo.Echo
}

type eventSubscription struct {
	unsubscribe func()
}

// Start joins the cluster.
func Start(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.ensureDefaults()
	n := &Node{cfg: cfg, log: cfg.Logger.With("component", "cluster", "node", cfg.NodeID),
		changes: make(chan View, 64), stop: make(chan struct{}), groups: groups{local: cfg.Local, pids: map[string]*actor.PID{}}, forwardSlots: make(chan struct{}, MaxForwardedInFlight),
		client: httpClient(cfg.TLS, cfg.Secret)}
	inc, err := n.join()
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.inc = inc
	n.mu.Unlock()
	n.done.Add(2)
	go n.notify()
	go n.watchBlocked()
	return n, nil
}

// healthAddr is the health endpoint of the node whose cluster address is
// addr: its port+1.
func healthAddr(addr string) string {
	h, p, err := splitHostPort(addr)
	if err != nil {
		return addr
	}
	return net.JoinHostPort(h, strconv.Itoa(p+1))
}

// gRPC settings of the node-to-node transport, which mostly carries raft
// appends of up to 1 MiB (partition's MaxSizePerMsg). A fixed flow-control
// window of 4 MiB per stream and per connection (instead of gRPC's 64 KiB
// start grown by BDP probes) lets a few appends be in flight without
// window updates in between; 256 KiB read and write buffers (default 32 KiB)
// take an append in a few syscalls. Receive buffers come from a pool, so a
// received batch does not cost a new zeroed buffer; the serving side's
// codec (transportCodec) copies each message out of it once, and the raft
// entries are decoded in place from that copy. Per connection this is at
// most 4 MiB of unread data and 512 KiB of buffers.
const (
	transportWindow = 4 << 20
	transportBuffer = 256 << 10
)

// join starts an incarnation: a new cluster actor system (so a new member
// id) on the configured addresses.
func (n *Node) join() (*incarnation, error) {
	host, port, _ := splitHostPort(n.cfg.Bind)
	healthBind := n.cfg.HealthBind
	if healthBind == "" {
		healthBind = healthAddr(n.cfg.Bind)
	}
	if port == 0 && n.cfg.HealthBind == "" {
		return nil, fmt.Errorf("%w: a cluster address with port 0 needs an explicit health address", ErrBadConfig)
	}
	actorLog := n.log.With("component", "protoactor")
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slogfloor.New(actorLog.Handler(), slog.LevelError)
	}))
	max := n.cfg.MaxMessageBytes
	creds := insecure.NewCredentials()
	serverOpts := []grpc.ServerOption{}
	if t := n.cfg.TLS; t != nil {
		creds = credentials.NewTLS(t.Client)
		serverOpts = append(serverOpts, grpc.Creds(loggedCreds{TransportCredentials: credentials.NewTLS(t.Server), n: n}))
	}
	var secret *secretCheck
	var dialSecret []grpc.DialOption
	if len(n.cfg.Secret) > 0 {
		secret = newSecretCheck(n.cfg.Secret, n)
		serverOpts = append(serverOpts, secret.serverOptions()...)
		dialSecret = append(dialSecret, grpc.WithPerRPCCredentials(secretCreds{hexSecret: hex.EncodeToString(n.cfg.Secret)}))
	}
	rc := remote.Configure(host, port,
		remote.WithServerOptions(append(serverOpts,
			grpc.MaxRecvMsgSize(max),
			grpc.KeepaliveParams(keepalive.ServerParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
			experimental.RecvBufferPool(grpc.NewSharedBufferPool()),
			grpc.ForceServerCodec(transportCodec{serializer: raftwire.SerializerID()}),
			grpc.InitialWindowSize(transportWindow),
			grpc.InitialConnWindowSize(transportWindow),
			grpc.ReadBufferSize(transportBuffer),
			grpc.WriteBufferSize(transportBuffer),
		)...),
		// WithDialOptions replaces protoactor's defaults: credentials and
		// keepalive have to be given here.
		remote.WithDialOptions(append(dialSecret,
			grpc.WithTransportCredentials(creds),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(max), grpc.MaxCallSendMsgSize(max)),
			experimental.WithRecvBufferPool(grpc.NewSharedBufferPool()),
			grpc.WithInitialWindowSize(transportWindow),
			grpc.WithInitialConnWindowSize(transportWindow),
			grpc.WithReadBufferSize(transportBuffer),
			grpc.WithWriteBufferSize(transportBuffer),
		)...),
		remote.WithEndpointWriterQueueSize(n.cfg.QueueSize),
		// At most 32 messages per gRPC batch: raft appends and forwarded
		// frames are up to about 1 MiB each, so a batch stays at half the
		// 64 MiB receive limit (protoactor's default of 1000 could exceed
		// it under a backlog, and the whole batch would be lost).
		remote.WithEndpointWriterBatchSize(32),
		remote.WithEndpointManagerQueueSize(n.cfg.QueueSize),
	)
	inc := &incarnation{sys: sys}
	var provider pcluster.ClusterProvider
	// The health endpoint: the automanaged provider's peers poll it, and
	// with either provider a node cut off asks its peers' whether they
	// blocked it (/herald/blocked). protoactor's own health server binds
	// 0.0.0.0 on a fixed port; Herald serves it on the configured address.
	ln, err := net.Listen("tcp", healthBind)
	if err != nil {
		sys.Shutdown()
		return nil, fmt.Errorf("cluster health listener %s: %w", healthBind, err)
	}
	inc.ln = ln
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Listener = ln
	if t := n.cfg.TLS; t != nil {
		e.Listener = tlsListener{Listener: ln, cfg: t.Server, n: n}
	}
	if secret != nil {
		e.Use(secret.middleware)
	}
	_, hport, _ := splitHostPort(ln.Addr().String())
	kinds := []string{kindPrefix + strconv.FormatUint(n.cfg.NodeID, 10)}
	e.GET("/_health", func(c echo.Context) error {
		h, p, err := sys.GetHostPort()
		if err != nil {
			return c.NoContent(http.StatusServiceUnavailable)
		}
		return c.JSON(http.StatusOK, automanaged.NewNode(n.cfg.Name, sys.ID, h, p, hport, kinds))
	})
	e.GET("/herald/blocked", func(c echo.Context) error {
		// The etcd provider names members "<cluster name>@<member id>".
		m := c.QueryParam("member")
		blocked := inc.cl != nil && inc.cl.Remote != nil &&
			(inc.cl.Remote.BlockList().IsBlocked(m) || inc.cl.Remote.BlockList().IsBlocked(n.cfg.Name+"@"+m))
		return c.JSON(http.StatusOK, map[string]bool{"blocked": blocked})
	})
	e.GET("/herald/time", func(c echo.Context) error {
		return c.JSON(http.StatusOK, map[string]int64{"unix_nano": n.cfg.Now().UnixNano()})
	})
	switch n.cfg.Provider {
	case ProviderEtcd:
		p, err := etcd.NewWithConfig("/herald", clientv3.Config{Endpoints: n.cfg.EtcdEndpoints, DialTimeout: 5 * time.Second})
		if err != nil {
			_ = ln.Close()
			sys.Shutdown()
			return nil, fmt.Errorf("etcd provider: %w", err)
		}
		provider = p
		inc.health = e // started below, once inc.cl is set
	default:
		var hosts []string
		for id, a := range n.cfg.Peers {
			if h, ok := n.cfg.PeerHealth[id]; ok {
				hosts = append(hosts, h)
			} else {
				hosts = append(hosts, healthAddr(a))
			}
		}
		if _, ok := n.cfg.Peers[n.cfg.NodeID]; !ok {
			hosts = append(hosts, ln.Addr().String())
		}
		slices.Sort(hosts)
		provider = newPeersProvider(func() []string { return n.pollHosts(hosts) }, n.cfg.Refresh, peerFailuresTolerated, e, n.log)
		provider.(*peersProvider).client, provider.(*peersProvider).scheme = httpClient(n.cfg.TLS, n.cfg.Secret), n.scheme()
	}
	kind := pcluster.NewKind(kindPrefix+strconv.FormatUint(n.cfg.NodeID, 10), actor.PropsFromFunc(func(actor.Context) {}))
	cc := pcluster.Configure(n.cfg.Name, provider, disthash.New(), rc, pcluster.WithKinds(kind))
	inc.cl = pcluster.New(sys, cc)
	if inc.health != nil {
		go func() {
			if err := inc.health.Start(""); err != nil && !errors.Is(err, http.ErrServerClosed) {
				n.log.Warn("cluster health endpoint stopped", "err", err)
			}
		}()
	}
	if err := n.spawnRelay(sys); err != nil {
		inc.shutdown()
		return nil, fmt.Errorf("raft relay: %w", err)
	}
	sub := sys.EventStream.Subscribe(func(ev interface{}) {
		if t, ok := ev.(*pcluster.ClusterTopology); ok {
			n.onTopology(inc, t)
		}
	})
	inc.sub = &eventSubscription{unsubscribe: func() { sys.EventStream.Unsubscribe(sub) }}
	n.mu.Lock()
	n.joining = inc
	n.mu.Unlock()
	if err := startMember(inc.cl); err != nil {
		// A member that failed half-way cannot be shut down as a cluster
		// (its gossip never started): stop what runs.
		inc.cl = nil
		inc.shutdown()
		return nil, err
	}
	h, p, _ := sys.GetHostPort()
	n.log.Info("joined the cluster", "member", sys.ID, "address", net.JoinHostPort(h, strconv.Itoa(p)), "provider", n.cfg.Provider)
	return inc, nil
}

// peerFailuresTolerated is how many consecutive health polls a peer may
// miss (by timing out; a refused connection drops it at once) and stay a
// member: about 9 s of silence at the default 1 s refresh and 2 s timeout.
const peerFailuresTolerated = 3

// startMember starts the protoactor cluster member, turning its panics
// (a provider that cannot start) into an error.
func startMember(cl *pcluster.Cluster) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("starting cluster member: %v", r)
		}
	}()
	cl.StartMember()
	return nil
}

func (inc *incarnation) shutdown() {
	inc.once.Do(func() {
		inc.down.Store(true)
		if inc.sub != nil {
			inc.sub.unsubscribe()
		}
		if inc.cl != nil && inc.cl.Remote != nil {
			inc.cl.Shutdown(false)
			_ = inc.cl.Config.ClusterProvider.Shutdown(false)
		} else {
			inc.sys.Shutdown()
		}
		if inc.health != nil {
			_ = inc.health.Close()
		}
		if inc.ln != nil {
			_ = inc.ln.Close() // closed already if the health server ran
		}
	})
}

// onTopology turns protoactor's topology into a view with node ids.
func (n *Node) onTopology(inc *incarnation, t *pcluster.ClusterTopology) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.inc != nil && n.inc != inc && n.joining != inc {
		return // an earlier incarnation's last events
	}
	v := View{Rejoins: n.rejoins, At: time.Now()}
	for _, m := range t.Members {
		id := nodeIDOf(m.Kinds)
		if id == 0 {
			continue // not a Herald node
		}
		// The etcd provider names members "<cluster name>@<member id>";
		// views give the member id alone, with either provider.
		mid := strings.TrimPrefix(m.Id, n.cfg.Name+"@")
		mem := Member{NodeID: id, MemberID: mid, Address: net.JoinHostPort(m.Host, strconv.Itoa(int(m.Port))), Self: mid == inc.sys.ID}
		v.Members = append(v.Members, mem)
		if n.seen == nil {
			n.seen = map[uint64]string{}
		}
		n.seen[id] = mem.Address
	}
	slices.SortFunc(v.Members, func(a, b Member) int {
		if a.NodeID != b.NodeID {
			return cmpU64(a.NodeID, b.NodeID)
		}
		return strings.Compare(a.MemberID, b.MemberID)
	})
	v.Self = n.selfLocked(inc)
	n.view = v
	mMembers.Set(float64(len(v.Members)))
	select {
	case n.changes <- v:
	default:
		// The listener is behind: it gets the latest view with the next
		// change (views replace each other).
	}
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func nodeIDOf(kinds []string) uint64 {
	for _, k := range kinds {
		if s, ok := strings.CutPrefix(k, kindPrefix); ok {
			if id, err := strconv.ParseUint(s, 10, 64); err == nil {
				return id
			}
		}
	}
	return 0
}

func (n *Node) selfLocked(inc *incarnation) Member {
	h, p, _ := inc.sys.GetHostPort()
	return Member{NodeID: n.cfg.NodeID, MemberID: inc.sys.ID, Address: net.JoinHostPort(h, strconv.Itoa(p)), Self: true}
}

// View returns the latest view of the members.
func (n *Node) View() View {
	n.mu.Lock()
	defer n.mu.Unlock()
	v := n.view
	v.Members = slices.Clone(v.Members)
	if n.inc != nil {
		v.Self = n.selfLocked(n.inc)
	}
	v.Rejoins = n.rejoins
	return v
}

// System is the current cluster actor system (it changes when the node
// rejoins).
func (n *Node) System() *actor.ActorSystem {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.inc.sys
}

func (n *Node) notify() {
	defer n.done.Done()
	for {
		select {
		case v := <-n.changes:
			if n.cfg.OnChange != nil {
				n.cfg.OnChange(v)
			}
		case <-n.stop:
			return
		}
	}
}

// watchBlocked asks the peers, every Refresh, whether they blocked this
// node's member id; if one did, the node rejoins under a new one. After a
// rejoin that failed (the node has no live incarnation), it tries again
// every Refresh whatever the peers say: a peer that restarted has
// forgotten the block.
func (n *Node) watchBlocked() {
	defer n.done.Done()
	t := time.NewTicker(n.cfg.Refresh)
	defer t.Stop()
	missing := 0 // checks in a row that found this node absent from its own view
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		n.mu.Lock()
		me, down := n.inc.sys.ID, n.inc.down.Load()
		if len(n.view.Members) > 0 && !slices.ContainsFunc(n.view.Members, func(m Member) bool { return m.Self }) {
			missing++
		} else {
			missing = 0
		}
		n.mu.Unlock()
		if down {
			n.log.Warn("retrying the failed rejoin")
		} else if by, ok := n.blockedBy(me); ok {
			n.log.Warn("a peer blocked this node's member id (it was cut off); rejoining under a new one", "member", me, "blocked_by", by)
		} else if missing >= selfMissingChecks {
			// The provider lost this member's registration (an etcd lease
			// that lapsed while the process was frozen is not renewed).
			n.log.Warn("this node is missing from its own view of the cluster; rejoining under a new member id", "member", me)
		} else {
			continue
		}
		missing = 0
		if err := n.rejoin(); err != nil {
			n.log.Error("rejoining the cluster failed; will retry", "err", err)
		}
	}
}

// selfMissingChecks is how many checks in a row must find a node absent
// from its own view before it rejoins.
const selfMissingChecks = 3

// blockedBy returns a peer that blocked member, if any. It asks every
// node it knows of: the peers of the config, those the metadata named, and
// every node it has seen a member of (the etcd provider's nodes need no
// --peers).
func (n *Node) blockedBy(member string) (uint64, bool) {
	peers := n.peerHealth()
	for _, id := range sortedKeys(peers) {
		h := peers[id]
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.scheme()+h+"/herald/blocked?member="+member, nil)
		resp, err := n.client.Do(req)
		if err != nil {
			cancel()
			continue // down or cut off: nothing to learn
		}
		var ans struct{ Blocked bool }
		err = json.NewDecoder(resp.Body).Decode(&ans)
		resp.Body.Close()
		cancel()
		if err == nil && ans.Blocked {
			return id, true
		}
	}
	return 0, false
}

// peerHealth is the health endpoint of every other node this one knows.
func (n *Node) peerHealth() map[uint64]string {
	out := map[uint64]string{}
	n.mu.Lock()
	for id, a := range n.seen {
		out[id] = healthAddr(a)
	}
	for id, p := range n.learned {
		out[id] = p.health
	}
	n.mu.Unlock()
	for id, a := range n.cfg.Peers {
		out[id] = healthAddr(a)
	}
	for id, h := range n.cfg.PeerHealth {
		if _, ok := out[id]; ok {
			out[id] = h
		}
	}
	delete(out, n.cfg.NodeID)
	return out
}

func sortedKeys(m map[uint64]string) []uint64 {
	out := make([]uint64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// rejoin replaces the incarnation with a new one, under a new member id.
// If every try fails, the node is left with its old incarnation shut down
// (watchBlocked tries again); Stop ends the tries.
func (n *Node) rejoin() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	old := n.inc
	// The old view is void: the others blocked this member.
	n.view = View{}
	mMembers.Set(0)
	n.mu.Unlock()
	old.shutdown()
	var inc *incarnation
	var err error
	// The old listeners close asynchronously: retry binding for a while.
	for i := 0; i < 20; i++ {
		if inc, err = n.join(); err == nil {
			break
		}
		select {
		case <-n.stop:
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.inc = inc // Stop, if it is waiting for this, shuts it down
	n.joining = nil
	n.rejoins++
	mRejoins.Inc()
	return nil
}

// Stop leaves the cluster.
func (n *Node) Stop() {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	n.mu.Unlock()
	close(n.stop)
	n.done.Wait() // a rejoin in progress ends first
	n.mu.Lock()
	inc := n.inc
	n.mu.Unlock()
	inc.shutdown()
}

// Up reports whether node id is in this node's membership view (itself
// included): partition.Config.Liveness.
func (n *Node) Up(id uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.view.Up(id)
}
