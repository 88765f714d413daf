// Package topic holds the topic actors and the node's topic manager.
//
// The manager is the supervisor of every topic and partition actor on the
// node. It owns the topic catalog (create, delete, list, describe, metadata)
// and publishes a read-mostly Registry that the client-protocol Router uses
// to hand each request to the right actor without a hop through the manager.
// A topic actor holds its config and routes produce requests to partitions:
// the explicit partition, else the key hash of the batch's first record
// (heraldpb.PartitionForKey), else round-robin.
package topic

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/heraldmq/herald/actors/partition"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Config configures the node's topic manager.
type Config struct {
	// DataDir holds the catalog and one folder per partition.
	DataDir string
	// NodeID is this node's id; it is the raft id of its replicas. Not 0.
	NodeID uint64
	// Advertise is the client address returned in Metadata.
	Advertise string
	// FS is how the manager reaches the filesystem; nil = persistence.OSFS.
	// Every partition's log uses it too.
	FS persistence.FS
	// Clock is every partition's clock (partition.Config.Clock): append
	// times, holds, retention by age; nil = partition.SystemClock.
	Clock partition.Clock
	// ClockID names Clock (partition.Config.ClockID); 0: none.
	ClockID uint64

	// Log options for every partition.
	Flush        persistence.FlushPolicy
	SegmentBytes int

	// DefaultPartitions applies when CreateTopic gives 0. Default 1.
	DefaultPartitions uint32
	// MaxPartitions bounds a topic's partition count. Default 1024.
	MaxPartitions uint32
	// MaxMessageBytes is the default and the ceiling of a topic's max
	// message size. Default 1 MiB.
	MaxMessageBytes uint32

	// Partition actor tuning, passed through (zero = partition defaults).
	TickInterval   time.Duration
	RetentionCheck time.Duration
	MailboxLimit   int
	WindowBytes    int
	SyncPace       time.Duration

	// OnIdleRelease is passed to every partition (partition.Config.OnRelease).
	OnIdleRelease func()

	// Readers serve catch-up fetches for every partition of the node.
	Readers *partition.ReaderPool

	// Clustered: the node is part of a cluster. Client topics are created
	// through the controller once the manager gets Clustered, and refused
	// (THROTTLED) before.
	Clustered bool

	Logger *slog.Logger
}

// EnsureDefaults fills zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.FS == nil {
		c.FS = persistence.OSFS
	}
	if c.DefaultPartitions == 0 {
		c.DefaultPartitions = 1
	}
	if c.MaxPartitions == 0 {
		c.MaxPartitions = 1024
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = 1 << 20
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports every problem at once.
func (c *Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("topic: DataDir is empty"))
	}
	if c.NodeID == 0 {
		errs = append(errs, errors.New("topic: NodeID must not be 0"))
	}
	if c.DefaultPartitions > c.MaxPartitions {
		errs = append(errs, fmt.Errorf("topic: DefaultPartitions %d exceeds MaxPartitions %d", c.DefaultPartitions, c.MaxPartitions))
	}
	return errors.Join(errs...)
}

// ttlProblem checks a create request's message_ttl_ms (milliseconds from
// a record's append time; 0 = none), or returns why it is invalid.
func ttlProblem(cfg *heraldpb.TopicConfig) string {
	if cfg.GetMessageTtlMs() < 0 {
		return fmt.Sprintf("message ttl %d ms must not be negative", cfg.GetMessageTtlMs())
	}
	return ""
}
