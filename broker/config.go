package broker

import (
	"errors"
	"fmt"
	"github.com/heraldmq/herald/auth"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/heraldmq/herald/actors/consumer"
	"github.com/heraldmq/herald/actors/partition"
	"github.com/heraldmq/herald/cluster"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/retry"
)

// Config is the one configuration of a Herald node. `herald serve` fills it
// from flags, HERALD_* environment variables and an optional JSON config
// file (flag over environment over file over default); each field is one
// setting, named in Validate's messages by its flag name, and documented in
// README.md's configuration table. Default returns the embedded defaults.
// Config is the one configuration of `herald serve`. Flags, HERALD_*
// environment variables and an optional JSON config file fill it, in that
// order of precedence (flag over environment over file over default). Every
// field is one setting; its flag name, environment variable, default and
// meaning are in settings below and in README.md's configuration table.
type Config struct {
	DataDir   string
	Listen    string
	Admin     string
	Advertise string
	// TLS client listener (netio/tls.go): its address ("" = none), the
	// server certificate and key, and a CA bundle that makes it require
	// client certificates. The files reload on SIGHUP and when they change.
	AdminPprof   bool // serve /debug/pprof on the admin listener
	ListenTLS    string
	AdvertiseTLS string // the TLS address given to clients in metadata; "" = the bound one
	TLSCert      string
	TLSKey       string
	TLSClientCA  string
	// Client logins (auth package): --auth required|optional|off ("" =
	// off when every client listener is on loopback, else required), the
	// superusers (comma-separated names), and a user created at start
	// when absent, with the password in BootstrapPasswordFile.
	Auth       string
	Superusers string
	// AuditLog is the audit log's path ("" = DATA/audit.log when logins
	// are on, else none; "off" = none). AdminTLS serves the admin port
	// with --tls-cert; AdminOpen lists the admin paths served without a
	// login when logins are on.
	AuditLog  string
	AdminTLS  bool
	AdminOpen string
	// AdminReadOnly refuses the admin API's actions (delete a topic,
	// reset a group, ...); its reads and the dashboard stay.
	AdminReadOnly         bool
	BootstrapUser         string
	BootstrapPasswordFile string
	NodeID                uint64
	Flush                 string
	// LogSyncPace: while a partition's syncs carry two or more entries on
	// average, its log writer starts the next no sooner than this after
	// the last began (partition.Config.SyncPace); 0 = off. Only with
	// Flush "always".
	LogSyncPace    time.Duration
	SegmentBytes   int
	MaxFrameBytes  int
	MaxConnections int
	IdleTimeout    time.Duration
	MaxInFlight    int
	// Flow control of client connections (netio.Config has the details).
	MaxPendingOutput         int
	MaxPendingOutputHard     int // 0 = the larger of 64 MiB and MaxPendingOutput + 2*MaxFrameBytes
	WriteStallTimeout        time.Duration
	MaxQueuedRequestBytes    int64
	FrameTimeout             time.Duration
	MaxFrameBytesBeforeHello int
	MaxInFlightProduceBytes  int64         // admission (netio.Config.MaxInFlightProduceBytes); 0 = off
	MaxProduceDefer          time.Duration // netio.Config.MaxProduceDefer; 0 = THROTTLED at once
	ProduceLatencyTarget     time.Duration // netio.Config.ProduceLatencyTarget; 0 = off
	EventLoops               int
	DefaultParts             uint
	MaxMessageBytes          uint
	PartitionMailbox         int
	WindowBytes              int
	RetentionCheck           time.Duration
	AckTimeout               time.Duration
	BreakerFailures          int
	BreakerCoolDown          time.Duration
	// GroupIdleStop is how long a consumer group's coordinator lives on
	// with no members before it stops (started again on the group's next
	// request); 0 never stops one.
	GroupIdleStop time.Duration
	// RetryPolicy is the retry policy of subscriptions that name none
	// (retry.ParsePolicy syntax); empty means the default.
	RetryPolicy string
	// MaxDelay bounds a delayed message's delay; MaxScheduled the delayed
	// batches pending (more get THROTTLED).
	MaxDelay     time.Duration
	MaxScheduled uint64
	// ScheduleAhead is how long before their time delayed messages are
	// appended, held unreadable by their partition until then (0: at
	// their time).
	ScheduleAhead time.Duration
	// ScheduleFence: the scheduler fences a deposed one's appends
	// (scheduler/fence.go). Off only while a cluster is upgraded from a
	// version whose partitions do not know the scheduler's fencer.
	ScheduleFence bool
	// TxnCheckInterval and TxnMaxChecks are the half messages' default
	// check-back interval and number of checks; MaxHalfPending bounds the
	// half messages pending (more get THROTTLED).
	TxnCheckInterval time.Duration
	TxnMaxChecks     int
	MaxHalfPending   int
	// TxnTimeout is the default timeout of a transaction (across
	// partitions); MaxTxnTimeout the largest a producer may ask for.
	TxnTimeout      time.Duration
	MaxTxnTimeout   time.Duration
	ShutdownTimeout time.Duration
	LogLevel        string
	// Cluster is the node's cluster address (host:port; empty: a single
	// node); ClusterHealth its membership health endpoint (empty: the
	// cluster port + 1); Peers the cluster's nodes as ID@HOST:PORT,...;
	// ClusterProvider automanaged or etcd, with Etcd's endpoints.
	Cluster       string
	ClusterHealth string
	// Mutual TLS between nodes: a node certificate (serving and dialling)
	// and the cluster CA that must sign every node's.
	ClusterTLSCert string
	ClusterTLSKey  string
	ClusterTLSCA   string
	// ClusterSecretFile holds the cluster secret every call between nodes
	// carries (at least 16 bytes, surrounding white space ignored).
	ClusterSecretFile string
	Peers             string
	ClusterProvider   string
	Etcd              string
	// Rack is the node's rack (or zone): replicas of a partition go to
	// distinct racks where there are enough.
	Rack string
	// ReplicaGrace is how long a node may be down before the controller
	// re-creates its replicas on other nodes.
	ReplicaGrace time.Duration
	// ControllerCheckpointRecords and ControllerCheckpointBytes: the
	// controller group's leader checkpoints the metadata, and the replicas
	// truncate the controller log before it, once the log holds this many
	// records (or records of this many bytes) after the last checkpoint.
	ControllerCheckpointRecords int
	ControllerCheckpointBytes   int

	peers    map[uint64]string // parsed by Validate
	authMode auth.Mode         // parsed by Validate

	flush persistence.FlushPolicy // parsed by Validate
	retry retry.Policy            // parsed by Validate

	// Test hooks (not settings): compaction of __groups; 0 = defaults.
	groupsCompactBytes int64
	groupsCompactCheck time.Duration
}

// Default returns the embedded defaults of `herald serve`.
func Default() Config {
	return Config{
		DataDir: "./data", Listen: "127.0.0.1:7420", Admin: "127.0.0.1:7480", Flush: "always", LogSyncPace: 2 * time.Millisecond,
		SegmentBytes: 4 << 20, MaxFrameBytes: 16 << 20, MaxConnections: 10000, IdleTimeout: 5 * time.Minute,
		MaxInFlight: 1024, MaxPendingOutput: 8 << 20, WriteStallTimeout: 30 * time.Second,
		MaxQueuedRequestBytes: 64 << 20, FrameTimeout: 30 * time.Second, MaxFrameBytesBeforeHello: 64 << 10,
		MaxInFlightProduceBytes: 16 << 20, MaxProduceDefer: time.Second, ProduceLatencyTarget: 10 * time.Millisecond, DefaultParts: 1, MaxMessageBytes: 1 << 20, PartitionMailbox: 512,
		WindowBytes: 4 << 20, RetentionCheck: 30 * time.Second,
		AckTimeout: 30 * time.Second, BreakerFailures: 5, BreakerCoolDown: 30 * time.Second, GroupIdleStop: consumer.DefaultIdleStop,
		RetryPolicy: retry.DefaultPolicy().String(), MaxDelay: 366 * 24 * time.Hour, MaxScheduled: 100_000_000, ScheduleAhead: 50 * time.Millisecond, ScheduleFence: true,
		TxnCheckInterval: 6 * time.Second, TxnMaxChecks: 15, MaxHalfPending: 100_000, TxnTimeout: time.Minute, MaxTxnTimeout: 15 * time.Minute,
		ShutdownTimeout: 10 * time.Second, LogLevel: "info", ClusterProvider: cluster.ProviderAutomanaged,
		ReplicaGrace: 5 * time.Minute, ControllerCheckpointRecords: cluster.DefaultCheckpointRecords,
		ControllerCheckpointBytes: cluster.DefaultCheckpointBytes, AdminOpen: "/metrics,/healthz,/readyz",
	}
}

// syncPace is the partitions' sync pace: LogSyncPace, or 0 when the flush
// policy syncs in the background anyway (an interval).
func (c *Config) syncPace() time.Duration {
	if c.flush.Interval > 0 {
		return 0
	}
	return c.LogSyncPace
}

// Validate checks every setting and reports all problems at once, each
// naming its setting.
func (c *Config) Validate() error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("setting %q: %s", name, fmt.Sprintf(format, args...)))
	}
	if c.DataDir == "" {
		bad("data", "must not be empty")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen", "%v", err)
	}
	if c.Admin != "" {
		if _, _, err := net.SplitHostPort(c.Admin); err != nil {
			bad("admin", "%v", err)
		}
	}
	if c.ListenTLS != "" {
		if _, _, err := net.SplitHostPort(c.ListenTLS); err != nil {
			bad("listen-tls", "%v", err)
		}
		if c.TLSCert == "" || c.TLSKey == "" {
			bad("listen-tls", "needs --tls-cert and --tls-key")
		}
	} else if c.TLSClientCA != "" || c.AdvertiseTLS != "" || (c.TLSCert != "" || c.TLSKey != "") && !c.AdminTLS {
		bad("listen-tls", "--tls-cert, --tls-key, --tls-client-ca and --advertise-tls need a TLS listener (--listen-tls, or --admin-tls for the certificate)")
	}
	if c.AdminTLS && (c.TLSCert == "" || c.TLSKey == "" || c.Admin == "") {
		bad("admin-tls", "needs --tls-cert, --tls-key and an admin listener")
	}
	c.validateAuth(bad)
	if p, err := persistence.ParseFlushPolicy(c.Flush); err != nil {
		bad("flush", "%v", err)
	} else {
		c.flush = p
	}
	if c.SegmentBytes < 64<<10 || c.SegmentBytes > 1<<30 {
		bad("segment-bytes", "%d is outside 64 KiB..1 GiB", c.SegmentBytes)
	}
	if c.MaxFrameBytes < 1<<10 || c.MaxFrameBytes > 256<<20 {
		bad("max-frame-bytes", "%d is outside 1 KiB..256 MiB", c.MaxFrameBytes)
	}
	if c.MaxConnections < 1 {
		bad("max-connections", "must be at least 1")
	}
	if c.IdleTimeout < 0 {
		bad("idle-timeout", "must not be negative")
	}
	if c.MaxInFlight < 1 {
		bad("max-in-flight", "must be at least 1")
	}
	if c.MaxPendingOutput < 64<<10 {
		bad("max-pending-output", "%d is below 64 KiB", c.MaxPendingOutput)
	}
	if c.MaxPendingOutputHard != 0 && c.MaxPendingOutputHard < c.MaxPendingOutput+c.MaxFrameBytes {
		bad("max-pending-output-hard", "%d is below max-pending-output + max-frame-bytes (%d); 0 = automatic", c.MaxPendingOutputHard, c.MaxPendingOutput+c.MaxFrameBytes)
	}
	if c.WriteStallTimeout < 0 {
		bad("write-stall-timeout", "must not be negative")
	}
	if c.MaxQueuedRequestBytes < int64(c.MaxFrameBytes) {
		bad("max-queued-request-bytes", "%d is below max-frame-bytes (%d)", c.MaxQueuedRequestBytes, c.MaxFrameBytes)
	}
	if c.FrameTimeout < 0 {
		bad("frame-timeout", "must not be negative")
	}
	if c.MaxFrameBytesBeforeHello < 1<<10 || c.MaxFrameBytesBeforeHello > c.MaxFrameBytes {
		bad("max-frame-bytes-before-hello", "%d is outside 1 KiB..max-frame-bytes", c.MaxFrameBytesBeforeHello)
	}
	if c.MaxProduceDefer < 0 {
		bad("max-produce-defer", "must not be negative (0 = THROTTLED at once)")
	}
	if c.ProduceLatencyTarget < 0 {
		bad("produce-latency-target", "must not be negative (0 = off)")
	}
	if c.MaxInFlightProduceBytes < 0 {
		bad("max-inflight-produce-bytes", "must not be negative (0 = off)")
	}
	if c.EventLoops < 0 {
		bad("event-loops", "must not be negative")
	}
	if c.DefaultParts < 1 {
		bad("default-partitions", "must be at least 1")
	}
	if c.ReplicaGrace < time.Second {
		bad("replica-grace", "%v is under 1s", c.ReplicaGrace)
	}
	if c.ControllerCheckpointRecords < 1 {
		bad("controller-checkpoint-records", "must be at least 1")
	}
	if c.ControllerCheckpointBytes < 1<<10 {
		bad("controller-checkpoint-bytes", "%d is under 1 KiB", c.ControllerCheckpointBytes)
	}
	if c.MaxMessageBytes < 1 || int(c.MaxMessageBytes) > c.MaxFrameBytes-1024 {
		bad("max-message-bytes", "%d must be between 1 and max-frame-bytes minus 1 KiB", c.MaxMessageBytes)
	}
	if c.PartitionMailbox < 1 {
		bad("partition-mailbox", "must be at least 1")
	}
	if c.WindowBytes < 0 {
		bad("window-bytes", "must not be negative")
	}
	if c.LogSyncPace < 0 || c.LogSyncPace > partition.MaxSyncPace {
		bad("log-sync-pace", "%v must be between 0 (off) and %v", c.LogSyncPace, partition.MaxSyncPace)
	}
	if c.RetentionCheck <= 0 {
		bad("retention-check", "must be positive")
	}
	if c.MaxDelay < 90*24*time.Hour {
		bad("max-delay", "%v is below 90 days (2160h)", c.MaxDelay)
	}
	if c.MaxScheduled < 1 {
		bad("max-scheduled", "must be at least 1")
	}
	if c.ScheduleAhead < 0 || c.ScheduleAhead > partition.MaxHold {
		bad("schedule-ahead", "%v is outside [0, %v]", c.ScheduleAhead, partition.MaxHold)
	}
	if c.TxnCheckInterval < 100*time.Millisecond {
		bad("txn-check-interval", "%v is below 100ms", c.TxnCheckInterval)
	}
	if c.TxnMaxChecks < 1 || c.TxnMaxChecks > 1000 {
		bad("txn-max-checks", "%d is outside [1, 1000]", c.TxnMaxChecks)
	}
	if c.MaxHalfPending < 1 {
		bad("max-half-pending", "must be at least 1")
	}
	if c.TxnTimeout < 100*time.Millisecond {
		bad("txn-timeout", "%v is below 100ms", c.TxnTimeout)
	}
	if c.MaxTxnTimeout < c.TxnTimeout {
		bad("max-txn-timeout", "%v is below --txn-timeout %v", c.MaxTxnTimeout, c.TxnTimeout)
	}
	if c.AckTimeout < time.Millisecond {
		bad("ack-timeout", "must be at least 1ms")
	}
	if c.BreakerFailures < 1 {
		bad("breaker-failures", "must be at least 1")
	}
	if c.BreakerCoolDown < time.Millisecond {
		bad("breaker-cooldown", "must be at least 1ms")
	}
	if c.GroupIdleStop < 0 {
		bad("group-idle-stop", "must not be negative (0 never stops an idle coordinator)")
	}
	c.retry = retry.DefaultPolicy()
	if c.RetryPolicy != "" {
		if p, err := retry.ParsePolicy(c.RetryPolicy); err != nil {
			bad("retry-policy", "%v", err)
		} else {
			c.retry = p
		}
	}
	if c.ShutdownTimeout <= 0 {
		bad("shutdown-timeout", "must be positive")
	}
	if _, err := ParseLevel(c.LogLevel); err != nil {
		bad("log-level", "%v", err)
	}
	if c.NodeID > heraldpb.MaxNodeID {
		bad("node-id", "%d is above %d (raft ids keep the node id in 32 bits)", c.NodeID, heraldpb.MaxNodeID)
	}
	c.validateCluster(bad)
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return errors.New(strings.Join(msgs, "; "))
}

// ParseLevel parses a log level name.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

// validateCluster checks the cluster settings.
func (c *Config) validateCluster(bad func(name, format string, args ...any)) {
	peers, err := cluster.ParsePeers(c.Peers)
	if err != nil {
		bad("peers", "%v", err)
	}
	c.peers = peers
	if c.Cluster == "" {
		if len(peers) > 0 {
			bad("peers", "needs --cluster, this node's cluster address")
		}
		return
	}
	// Without --node-id the id comes from the data dir at start (where
	// cluster.Start validates again with it): check the rest under an id
	// that no peer has.
	id := c.NodeID
	for id == 0 || (c.NodeID == 0 && peers[id] != "") {
		id++
	}
	if n := btoi(c.ClusterTLSCert != "") + btoi(c.ClusterTLSKey != "") + btoi(c.ClusterTLSCA != ""); n != 0 && n != 3 {
		bad("cluster-tls-cert", "--cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca go together")
	}
	cc := cluster.Config{NodeID: id, Bind: c.Cluster, HealthBind: c.ClusterHealth, Peers: peers,
		Provider: c.ClusterProvider, EtcdEndpoints: splitList(c.Etcd)}
	if err := cc.Validate(); err != nil {
		bad("cluster", "%v", err)
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// neverIfZero maps a broker timeout where 0 means never to netio's
// convention (0 = default, negative = never).
// offIfZero maps the broker's 0 (off) to netio's negative (off).
func offIfZero(n int64) int64 {
	if n == 0 {
		return -1
	}
	return n
}

func neverIfZero(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
