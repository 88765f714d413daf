package persistence

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are registered once, on the default registry. Histograms carry no
// group label (thousands of groups would multiply their buckets); counters do.
var (
	fsyncSeconds = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "herald_fsync_seconds",
		Help:    "Latency of WAL and state-file fsyncs.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16), // 50µs .. ~1.6s
	})
	saveBatchEntries = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "herald_save_batch_entries",
		Help:    "Raft entries made durable per WAL fsync (the group-commit batch).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 12),
	})
	saveBatchBytes = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "herald_save_batch_bytes",
		Help:    "WAL bytes made durable per WAL fsync.",
		Buckets: prometheus.ExponentialBuckets(256, 4, 10),
	})
	storageErrors = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_storage_errors_total",
		Help: "Storage failures that failed a raft group's log.",
	}, []string{"group"})
	retentionRemoved = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_retention_removed_records_total",
		Help: "Records removed from the front of the log by retention.",
	}, []string{"group"})
	damagedLogs = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_log_damaged",
		Help: "1 while the raft group's log holds damage no operator has accepted (it is read-only); 0 otherwise.",
	}, []string{"group"})
	damageFoundTotal = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_log_damage_found_total",
		Help: "Damaged log parts found and quarantined on open (corruption, not torn tails).",
	})
	damageReadsTotal = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_log_corrupt_reads_total",
		Help: "Logs whose live reads found corrupt data (the owner reopens them).",
	})
)
