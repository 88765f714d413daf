package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/heraldmq/herald/persistence"
)

// ServeConfig is the one configuration of `herald serve`. Flags, HERALD_*
// environment variables and an optional JSON config file fill it, in that
// order of precedence (flag over environment over file over default). Every
// field is one setting; its flag name, environment variable, default and
// meaning are in settings below and in README.md's configuration table.
type ServeConfig struct {
	DataDir          string
	Listen           string
	Admin            string
	Advertise        string
	NodeID           uint64
	Flush            string
	SegmentBytes     int
	MaxFrameBytes    int
	MaxConnections   int
	IdleTimeout      time.Duration
	MaxInFlight      int
	EventLoops       int
	DefaultParts     uint
	MaxMessageBytes  uint
	PartitionMailbox int
	WindowBytes      int
	RetentionCheck   time.Duration
	ShutdownTimeout  time.Duration
	LogLevel         string

	flush persistence.FlushPolicy
}

// setting describes one configuration key: flag --name, env HERALD_NAME
// (upper case, - as _), JSON key name.
type setting struct {
	name, help string
	bind       func(fs *flag.FlagSet, c *ServeConfig)
}

func settings() []setting {
	return []setting{
		{"data", "data directory", func(fs *flag.FlagSet, c *ServeConfig) { fs.StringVar(&c.DataDir, "data", "./data", "") }},
		{"listen", "client listener HOST:PORT", func(fs *flag.FlagSet, c *ServeConfig) { fs.StringVar(&c.Listen, "listen", "127.0.0.1:7420", "") }},
		{"admin", "admin HTTP listener for /metrics, /healthz and /debug/pprof; empty disables", func(fs *flag.FlagSet, c *ServeConfig) {
			fs.StringVar(&c.Admin, "admin", "127.0.0.1:7480", "")
		}},
		{"advertise", "client address given to clients in metadata; empty = the listen address", func(fs *flag.FlagSet, c *ServeConfig) { fs.StringVar(&c.Advertise, "advertise", "", "") }},
		{"node-id", "this node's stable id (kept in the data dir; 0 = the stored one, or 1)", func(fs *flag.FlagSet, c *ServeConfig) { fs.Uint64Var(&c.NodeID, "node-id", 0, "") }},
		{"flush", "fsync policy: always (fsync before ack) or interval:<duration>", func(fs *flag.FlagSet, c *ServeConfig) { fs.StringVar(&c.Flush, "flush", "always", "") }},
		{"segment-bytes", "log segment size in bytes (the tail segment is held in memory)", func(fs *flag.FlagSet, c *ServeConfig) { fs.IntVar(&c.SegmentBytes, "segment-bytes", 8<<20, "") }},
		{"max-frame-bytes", "largest client frame in bytes", func(fs *flag.FlagSet, c *ServeConfig) { fs.IntVar(&c.MaxFrameBytes, "max-frame-bytes", 16<<20, "") }},
		{"max-connections", "client connections at most; more are refused", func(fs *flag.FlagSet, c *ServeConfig) { fs.IntVar(&c.MaxConnections, "max-connections", 10000, "") }},
		{"idle-timeout", "close client connections idle this long (0 = never)", func(fs *flag.FlagSet, c *ServeConfig) { fs.DurationVar(&c.IdleTimeout, "idle-timeout", 5*time.Minute, "") }},
		{"max-in-flight", "requests a connection may have outstanding", func(fs *flag.FlagSet, c *ServeConfig) { fs.IntVar(&c.MaxInFlight, "max-in-flight", 1024, "") }},
		{"event-loops", "network event loops (0 = one per core)", func(fs *flag.FlagSet, c *ServeConfig) { fs.IntVar(&c.EventLoops, "event-loops", 0, "") }},
		{"default-partitions", "partitions of a topic created without a count", func(fs *flag.FlagSet, c *ServeConfig) { fs.UintVar(&c.DefaultParts, "default-partitions", 1, "") }},
		{"max-message-bytes", "largest record batch a producer may send, bytes", func(fs *flag.FlagSet, c *ServeConfig) { fs.UintVar(&c.MaxMessageBytes, "max-message-bytes", 1<<20, "") }},
		{"partition-mailbox", "client requests queued per partition before THROTTLED", func(fs *flag.FlagSet, c *ServeConfig) { fs.IntVar(&c.PartitionMailbox, "partition-mailbox", 512, "") }},
		{"window-bytes", "recent committed bytes per partition kept in memory for tail readers", func(fs *flag.FlagSet, c *ServeConfig) { fs.IntVar(&c.WindowBytes, "window-bytes", 4<<20, "") }},
		{"retention-check", "how often partitions apply their retention policy", func(fs *flag.FlagSet, c *ServeConfig) { fs.DurationVar(&c.RetentionCheck, "retention-check", 30*time.Second, "") }},
		{"shutdown-timeout", "how long SIGTERM waits for in-flight requests", func(fs *flag.FlagSet, c *ServeConfig) { fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "") }},
		{"log-level", "debug, info, warn or error", func(fs *flag.FlagSet, c *ServeConfig) { fs.StringVar(&c.LogLevel, "log-level", "info", "") }},
	}
}

func envName(flagName string) string {
	return "HERALD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// newServeFlags binds every setting to c, with defaults, plus --config.
func newServeFlags(c *ServeConfig, configFile *string) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for _, s := range settings() {
		s.bind(fs, c)
		f := fs.Lookup(s.name)
		f.Usage = fmt.Sprintf("%s (env %s)", s.help, envName(s.name))
	}
	fs.StringVar(configFile, "config", "", "JSON config file whose keys are the flag names (env HERALD_CONFIG)")
	return fs
}

// loadServeConfig fills a ServeConfig from defaults, the config file, the
// environment and args, then validates it. Usage problems (unknown flags,
// unparsable values) are usageErrors naming the setting.
func loadServeConfig(args []string, getenv func(string) string) (*ServeConfig, error) {
	c := &ServeConfig{}
	var configFile string
	fs := newServeFlags(c, &configFile)
	// First pass: only to find --config; values are re-applied below.
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printServeHelp(fs)
			return nil, errHelp
		}
		return nil, usagef("%v", err)
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected argument %q", fs.Arg(0))
	}
	if configFile == "" {
		configFile = getenv("HERALD_CONFIG")
	}
	c = &ServeConfig{}
	fs = newServeFlags(c, new(string))
	if configFile != "" {
		raw, err := os.ReadFile(configFile)
		if err != nil {
			return nil, fmt.Errorf("config file: %w", err)
		}
		var kv map[string]any
		if err := json.Unmarshal(raw, &kv); err != nil {
			return nil, fmt.Errorf("config file %s: %w", configFile, err)
		}
		keys := make([]string, 0, len(kv))
		for k := range kv {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if fs.Lookup(k) == nil || k == "config" {
				return nil, fmt.Errorf("config file %s: unknown setting %q", configFile, k)
			}
			if err := fs.Set(k, fmt.Sprint(kv[k])); err != nil {
				return nil, fmt.Errorf("config file %s: setting %q: %v", configFile, k, err)
			}
		}
	}
	for _, s := range settings() {
		if v := getenv(envName(s.name)); v != "" {
			if err := fs.Set(s.name, v); err != nil {
				return nil, fmt.Errorf("environment %s: %v", envName(s.name), err)
			}
		}
	}
	if err := fs.Parse(args); err != nil {
		return nil, usagef("%v", err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
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

// Validate checks every setting and reports all problems at once, each
// naming its setting.
func (c *ServeConfig) Validate() error {
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
	if c.EventLoops < 0 {
		bad("event-loops", "must not be negative")
	}
	if c.DefaultParts < 1 {
		bad("default-partitions", "must be at least 1")
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
	if c.RetentionCheck <= 0 {
		bad("retention-check", "must be positive")
	}
	if c.ShutdownTimeout <= 0 {
		bad("shutdown-timeout", "must be positive")
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		bad("log-level", "%v", err)
	}
	return errors.Join(errs...)
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}
