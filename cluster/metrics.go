package cluster

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

var (
	mMembers = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_cluster_members",
		Help: "Herald nodes in this node's view of the cluster, itself included.",
	})
	mRejoins = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_cluster_rejoins_total",
		Help: "Times this node rejoined under a new member id after its peers blocked the old one.",
	})
)

// The controller group's log and its compaction (checkpoint.go).
var (
	mSinceRecords = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_controller_log_records_since_checkpoint",
		Help: "Records in this node's controller log after the last checkpoint it applied (from the log's start if none).",
	})
	mSinceBytes = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_controller_log_bytes_since_checkpoint",
		Help: "Bytes of the records in this node's controller log after the last checkpoint it applied.",
	})
	mLogStart = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_controller_log_start_offset",
		Help: "Offset this node's controller log starts at: the checkpoint it was last truncated at, or 0.",
	})
	mLogBytes = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_controller_log_size_bytes",
		Help: "Bytes this node's controller log occupies on disk.",
	})
	mCheckpoints = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_controller_checkpoints_written_total",
		Help: "Controller checkpoints this node wrote as the controller group's leader that took effect.",
	})
	mCheckpointFailures = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_controller_checkpoint_failures_total",
		Help: "Controller checkpoints this node, leading the group, did not write (too_large: the metadata exceeds the controller log's max message size; error) or wrote in vain (superseded: a record came before it).",
	}, []string{"reason"})
	mCheckpointSize = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_controller_checkpoint_bytes",
		Help: "Size of the last checkpoint this node built as the controller group's leader; it must stay under the controller log's max message size (4 MiB by default).",
	})
)
