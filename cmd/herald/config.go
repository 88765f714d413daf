package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/heraldmq/herald/broker"
)

// setting describes one broker.Config field as a configuration key: flag --name, env HERALD_NAME
// (upper case, - as _), JSON key name.
type setting struct {
	name, help string
	bind       func(fs *flag.FlagSet, c *broker.Config, d broker.Config)
}

func settings() []setting {
	return []setting{
		{"data", "data directory", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.DataDir, "data", d.DataDir, "")
		}},
		{"listen", "client listener HOST:PORT", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.Listen, "listen", d.Listen, "")
		}},
		{"listen-tls", "TLS client listener HOST:PORT (TLS 1.3); empty = none", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.ListenTLS, "listen-tls", d.ListenTLS, "")
		}},
		{"advertise-tls", "TLS client address given to clients in metadata; empty = the TLS listener's address", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.AdvertiseTLS, "advertise-tls", d.AdvertiseTLS, "")
		}},
		{"tls-cert", "PEM certificate chain of the TLS listener (reloaded on SIGHUP and when the file changes)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.TLSCert, "tls-cert", d.TLSCert, "")
		}},
		{"tls-key", "PEM private key of --tls-cert", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.TLSKey, "tls-key", d.TLSKey, "")
		}},
		{"tls-client-ca", "PEM CA bundle: the TLS listener requires client certificates it signs; empty = none required", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.TLSClientCA, "tls-client-ca", d.TLSClientCA, "")
		}},
		{"auth", "client logins: required (SCRAM-SHA-256 or a verified TLS client certificate before any request), optional, or off (anonymous); empty = off when the client listeners are on loopback, else required", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.Auth, "auth", d.Auth, "")
		}},
		{"superusers", "comma-separated users who may do everything, user administration included", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.Superusers, "superusers", d.Superusers, "")
		}},
		{"bootstrap-user", "a user created at start when absent (a superuser), with the password in --bootstrap-password-file", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.BootstrapUser, "bootstrap-user", d.BootstrapUser, "")
		}},
		{"bootstrap-password-file", "file holding --bootstrap-user's password (its first line)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.BootstrapPasswordFile, "bootstrap-password-file", d.BootstrapPasswordFile, "")
		}},
		{"audit-log", "audit log file (JSON lines: admin actions, user, ACL and vhost changes, refusals, failed logins); empty = DATA/audit.log when logins are on, off = none", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.AuditLog, "audit-log", d.AuditLog, "")
		}},
		{"admin-tls", "serve the admin port over TLS with --tls-cert and --tls-key", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.BoolVar(&c.AdminTLS, "admin-tls", d.AdminTLS, "")
		}},
		{"admin-open", "comma-separated admin paths served without a login when logins are on", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.AdminOpen, "admin-open", d.AdminOpen, "")
		}},
		{"admin", "admin HTTP listener for the dashboard (/), the admin API (/api/v1), /metrics, /healthz, /readyz and /cluster; empty disables", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.Admin, "admin", d.Admin, "")
		}},
		{"admin-read-only", "refuse the admin API's and the dashboard's actions (delete a topic, reset a group); reads stay", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.BoolVar(&c.AdminReadOnly, "admin-read-only", d.AdminReadOnly, "")
		}},
		{"admin-pprof", "serve Go's profiler at /debug/pprof on the admin listener (off: 403)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.BoolVar(&c.AdminPprof, "admin-pprof", d.AdminPprof, "")
		}},
		{"advertise", "client address given to clients in metadata; empty = the listen address", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.Advertise, "advertise", d.Advertise, "")
		}},
		{"node-id", "this node's stable id (kept in the data dir; 0 = the stored one, or 1; at most 4294967295)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.Uint64Var(&c.NodeID, "node-id", d.NodeID, "")
		}},
		{"flush", "fsync policy: always (fsync before ack) or interval:<duration>", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.Flush, "flush", d.Flush, "")
		}},
		{"log-sync-pace", "while a partition's syncs carry two or more entries on average, its next sync begins no sooner than this after the last began, so more appends share it (0 = off; at most 20ms; with flush always)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.LogSyncPace, "log-sync-pace", d.LogSyncPace, "")
		}},
		{"segment-bytes", "log segment size in bytes (the tail segment is held in memory)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.IntVar(&c.SegmentBytes, "segment-bytes", d.SegmentBytes, "")
		}},
		{"max-frame-bytes", "largest client frame in bytes", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.IntVar(&c.MaxFrameBytes, "max-frame-bytes", d.MaxFrameBytes, "")
		}},
		{"max-connections", "client connections at most; more are refused", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.IntVar(&c.MaxConnections, "max-connections", d.MaxConnections, "")
		}},
		{"idle-timeout", "close client connections idle this long (0 = never)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.IdleTimeout, "idle-timeout", d.IdleTimeout, "")
		}},
		{"max-in-flight", "requests a connection may have outstanding", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.IntVar(&c.MaxInFlight, "max-in-flight", d.MaxInFlight, "")
		}},
		{"max-pending-output", "bytes of responses and pushes a connection may have waiting to be written before the broker stops reading it and holds its pushes", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.IntVar(&c.MaxPendingOutput, "max-pending-output", d.MaxPendingOutput, "")
		}},
		{"max-pending-output-hard", "pending output in bytes past which a connection is closed (0 = the larger of 64 MiB and max-pending-output + 2 * max-frame-bytes)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.IntVar(&c.MaxPendingOutputHard, "max-pending-output-hard", d.MaxPendingOutputHard, "")
		}},
		{"write-stall-timeout", "close a connection whose pending output has not moved for this long (0 = never)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.WriteStallTimeout, "write-stall-timeout", d.WriteStallTimeout, "")
		}},
		{"max-queued-request-bytes", "broker-wide bytes of incomplete and queued requests; at it the broker stops reading connections", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.Int64Var(&c.MaxQueuedRequestBytes, "max-queued-request-bytes", d.MaxQueuedRequestBytes, "")
		}},
		{"max-inflight-produce-bytes", "admission limit: broker-wide bytes of produce requests admitted and not yet answered; over half of it a connection over its fair share waits for its turn, then gets THROTTLED with a retry-after (0 = off)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.Int64Var(&c.MaxInFlightProduceBytes, "max-inflight-produce-bytes", d.MaxInFlightProduceBytes, "")
		}},
		{"max-produce-defer", "how long a produce over its connection's fair share waits unread for its turn before it is answered THROTTLED (0 = THROTTLED at once)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.MaxProduceDefer, "max-produce-defer", d.MaxProduceDefer, "")
		}},
		{"produce-latency-target", "latency control: while a light producer's produce takes longer than this in the broker, the admission limit in force is halved (down to 1/64 of max-inflight-produce-bytes, at least 256 KiB), then paced (down to 4 MiB/s), so heavy producers wait their turn (0 = off)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.ProduceLatencyTarget, "produce-latency-target", d.ProduceLatencyTarget, "")
		}},
		{"frame-timeout", "close a connection that does not complete a started frame within this (0 = never)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.FrameTimeout, "frame-timeout", d.FrameTimeout, "")
		}},
		{"max-frame-bytes-before-hello", "largest frame in bytes a client may send before Hello", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.IntVar(&c.MaxFrameBytesBeforeHello, "max-frame-bytes-before-hello", d.MaxFrameBytesBeforeHello, "")
		}},
		{"ack-timeout", "redeliver a pushed message not acked within this, when the subscription sets none", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.AckTimeout, "ack-timeout", d.AckTimeout, "")
		}},
		{"breaker-failures", "failed deliveries in a row (nacks, ack timeouts) that open a subscriber's circuit breaker", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.IntVar(&c.BreakerFailures, "breaker-failures", d.BreakerFailures, "")
		}},
		{"breaker-cooldown", "how long an open breaker pauses delivery before half-open probes", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.BreakerCoolDown, "breaker-cooldown", d.BreakerCoolDown, "")
		}},
		{"group-idle-stop", "stop a consumer group's coordinator after this long with no members (0 = never); its progress is kept and it starts again on the group's next request", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.GroupIdleStop, "group-idle-stop", d.GroupIdleStop, "")
		}},
		{"retry-policy", "retry policy of subscriptions that set none: DELAYS[,...] or exponential [initial=D] [factor=F] [cap=D] [jitter=J], then [max-deliveries=N]", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.RetryPolicy, "retry-policy", d.RetryPolicy, "")
		}},
		{"max-delay", "longest delay of a delayed message (--delay, --at); at least 2160h (90 days)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.MaxDelay, "max-delay", d.MaxDelay, "")
		}},
		{"max-scheduled", "delayed messages pending at most; more are refused with THROTTLED", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.Uint64Var(&c.MaxScheduled, "max-scheduled", d.MaxScheduled, "")
		}},
		{"schedule-ahead", "how long before their time delayed messages are appended to their topic, held unreadable until their time so that the commit is not late (0 = at their time; at most 1s)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.ScheduleAhead, "schedule-ahead", d.ScheduleAhead, "")
		}},
		{"schedule-fence", "the scheduler fences the appends of the one it took over from, so that none lands twice; false only while upgrading a cluster from a version without it", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.BoolVar(&c.ScheduleFence, "schedule-fence", d.ScheduleFence, "")
		}},
		{"txn-check-interval", "default wait before a half message nobody ended is checked back with a producer of its group (then doubling, at most 8x)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.TxnCheckInterval, "txn-check-interval", d.TxnCheckInterval, "")
		}},
		{"txn-max-checks", "default number of check-backs before a half message's policy applies (roll back, or keep)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.IntVar(&c.TxnMaxChecks, "txn-max-checks", d.TxnMaxChecks, "")
		}},
		{"max-half-pending", "half (transactional) messages pending at most; more are refused with THROTTLED", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.IntVar(&c.MaxHalfPending, "max-half-pending", d.MaxHalfPending, "")
		}},
		{"txn-timeout", "default timeout of a transaction across partitions: one open longer is aborted by the coordinator", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.TxnTimeout, "txn-timeout", d.TxnTimeout, "")
		}},
		{"max-txn-timeout", "the longest transaction timeout a producer may ask for", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.MaxTxnTimeout, "max-txn-timeout", d.MaxTxnTimeout, "")
		}},
		{"cluster", "this node's cluster address HOST:PORT (node-to-node traffic; empty = a single node)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.Cluster, "cluster", d.Cluster, "")
		}},
		{"cluster-health", "membership health endpoint HOST:PORT (empty = the cluster port + 1)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.ClusterHealth, "cluster-health", d.ClusterHealth, "")
		}},
		{"cluster-tls-cert", "PEM node certificate for mutual TLS between nodes (cluster port and health endpoint); with --cluster-tls-key and --cluster-tls-ca", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.ClusterTLSCert, "cluster-tls-cert", d.ClusterTLSCert, "")
		}},
		{"cluster-tls-key", "PEM private key of --cluster-tls-cert", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.ClusterTLSKey, "cluster-tls-key", d.ClusterTLSKey, "")
		}},
		{"cluster-tls-ca", "PEM cluster CA: every node's certificate must be signed by it; nodes without one are refused", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.ClusterTLSCA, "cluster-tls-ca", d.ClusterTLSCA, "")
		}},
		{"cluster-secret-file", "file holding the cluster secret (16 bytes or more) every call between nodes must carry; nodes without it are refused", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.ClusterSecretFile, "cluster-secret-file", d.ClusterSecretFile, "")
		}},
		{"peers", "the cluster's nodes: ID@HOST:PORT,... (their --cluster addresses)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.Peers, "peers", d.Peers, "")
		}},
		{"cluster-provider", "membership provider: automanaged or etcd", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.ClusterProvider, "cluster-provider", d.ClusterProvider, "")
		}},
		{"etcd", "etcd endpoints HOST:PORT,... for --cluster-provider etcd", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.Etcd, "etcd", d.Etcd, "")
		}},
		{"rack", "this node's rack or zone: a partition's replicas go to distinct racks where there are enough", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.Rack, "rack", d.Rack, "")
		}},
		{"replica-grace", "how long a node may be down before its replicas are re-created on other nodes", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.ReplicaGrace, "replica-grace", d.ReplicaGrace, "")
		}},
		{"controller-checkpoint-records", "the controller log is checkpointed and truncated once it holds this many records after the last checkpoint", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.IntVar(&c.ControllerCheckpointRecords, "controller-checkpoint-records", d.ControllerCheckpointRecords, "")
		}},
		{"controller-checkpoint-bytes", "the controller log is checkpointed and truncated once its records after the last checkpoint take this many bytes", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.IntVar(&c.ControllerCheckpointBytes, "controller-checkpoint-bytes", d.ControllerCheckpointBytes, "")
		}},
		{"event-loops", "network event loops (0 = one per core)", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.IntVar(&c.EventLoops, "event-loops", d.EventLoops, "")
		}},
		{"default-partitions", "partitions of a topic created without a count", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.UintVar(&c.DefaultParts, "default-partitions", d.DefaultParts, "")
		}},
		{"max-message-bytes", "largest record batch a producer may send, bytes", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.UintVar(&c.MaxMessageBytes, "max-message-bytes", d.MaxMessageBytes, "")
		}},
		{"partition-mailbox", "client requests queued per partition before THROTTLED", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.IntVar(&c.PartitionMailbox, "partition-mailbox", d.PartitionMailbox, "")
		}},
		{"window-bytes", "recent committed bytes per partition kept in memory for tail readers", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.IntVar(&c.WindowBytes, "window-bytes", d.WindowBytes, "")
		}},
		{"retention-check", "how often partitions apply their retention policy", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.RetentionCheck, "retention-check", d.RetentionCheck, "")
		}},
		{"shutdown-timeout", "how long SIGTERM waits for in-flight requests", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", d.ShutdownTimeout, "")
		}},
		{"log-level", "debug, info, warn or error", func(fs *flag.FlagSet, c *broker.Config, d broker.Config) {
			fs.StringVar(&c.LogLevel, "log-level", d.LogLevel, "")
		}},
	}
}

func envName(flagName string) string {
	return "HERALD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// newServeFlags binds every setting to c, with defaults, plus --config.
func newServeFlags(c *broker.Config, configFile *string) *flag.FlagSet {
	fs := flag.NewFlagSet("herald serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	d := broker.Default()
	for _, s := range settings() {
		s.bind(fs, c, d)
		f := fs.Lookup(s.name)
		f.Usage = fmt.Sprintf("%s (env %s)", s.help, envName(s.name))
	}
	fs.StringVar(configFile, "config", "", "JSON config file whose keys are the flag names (env HERALD_CONFIG)")
	return fs
}

// loadServeConfig fills a broker.Config from defaults, the config file, the
// environment and args, then validates it. Usage problems (unknown flags,
// unparsable values) are usageErrors naming the setting; an unknown flag or
// file key names the nearest known one when it is close.
func loadServeConfig(args []string, getenv func(string) string) (*broker.Config, error) {
	c := &broker.Config{}
	var configFile string
	fs := newServeFlags(c, &configFile)
	// First pass: only to find --config; values are re-applied below.
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printServeHelp(fs)
			return nil, errHelp
		}
		return nil, flagParseError(fs, err)
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected argument %q", fs.Arg(0))
	}
	if configFile == "" {
		configFile = getenv("HERALD_CONFIG")
	}
	c = &broker.Config{}
	fs = newServeFlags(c, new(string))
	if configFile != "" {
		raw, err := os.ReadFile(configFile)
		if err != nil {
			return nil, fmt.Errorf("config file: %w", err)
		}
		var kv map[string]any
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber() // 16777216 stays 16777216, not 1.6777216e+07
		if err := dec.Decode(&kv); err != nil {
			return nil, fmt.Errorf("config file %s: %w", configFile, err)
		}
		keys := make([]string, 0, len(kv))
		for k := range kv {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if fs.Lookup(k) == nil || k == "config" {
				var names []string
				for _, s := range settings() {
					names = append(names, s.name)
				}
				near := suggest(k, names)
				for i := range near {
					near[i] = strconv.Quote(near[i])
				}
				return nil, usagef("config file %s: unknown setting %q%s", configFile, k, didYouMean("", near))
			}
			if err := fs.Set(k, fmt.Sprint(kv[k])); err != nil {
				return nil, usagef("config file %s: setting %q: value %v: %v", configFile, k, kv[k], err)
			}
		}
	}
	for _, s := range settings() {
		if v := getenv(envName(s.name)); v != "" {
			if err := fs.Set(s.name, v); err != nil {
				return nil, usagef("environment %s=%q: %v", envName(s.name), v, err)
			}
		}
	}
	if err := fs.Parse(args); err != nil {
		return nil, flagParseError(fs, err)
	}
	if err := c.Validate(); err != nil {
		return nil, usagef("%v", err)
	}
	return c, nil
}

var errHelp = errors.New("help")

func printServeHelp(fs *flag.FlagSet) {
	fmt.Fprintln(os.Stderr, "usage: herald serve [flags]")
	fs.SetOutput(os.Stderr)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}
