package txn

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics of the transaction coordinator.
var (
	mHalfPending = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_txn_half_pending",
		Help: "Half messages stored and not yet appended to their topics or rolled back (waiting for an outcome, kept after their last check, or committed and waiting).",
	})
	mHalfStored = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_txn_half_stored_total",
		Help: "Half messages stored.",
	})
	mHalfEnded = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_txn_half_ended_total",
		Help: "Half messages ended, by outcome (commit, rollback) and by whom (producer, check, manual, exhausted, topic_gone).",
	}, []string{"outcome", "by"})
	mHalfAppended = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_txn_half_appended_total",
		Help: "Committed half messages appended to their topics.",
	})
	mChecks = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_txn_checks_total",
		Help: "Check-backs due, by result: sent to a producer of the group (sent), no producer of the group connected (no_producer, counts as a check), or every producer of the group has 1,024 unanswered (postponed 100 ms, not counted as a check).",
	}, []string{"result"})
	mCheckAnswers = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_txn_check_answers_total",
		Help: "Answers to check-backs, by action (commit, rollback, unknown).",
	}, []string{"action"})
	mExhausted = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_txn_checks_exhausted_total",
		Help: "Half messages still unresolved after their last check, by the policy applied (rollback, keep).",
	}, []string{"policy"})
	mProducers = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_txn_producers",
		Help: "Producer registrations (connection and producer group) that check-backs can go to.",
	})
	mTxnOpen = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_txn_open",
		Help: "Transactions open (records staged) or committing.",
	})
	mTxnCommitting = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_txn_committing",
		Help: "Committed transactions (commit answered) whose records are still being appended.",
	})
	mStagedCache = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_txn_staged_cache_bytes",
		Help: "Staged transactional records kept in memory for their commit (at most 64 MiB; the rest is read back from __txn).",
	})
	mTxnIDs = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_txn_ids",
		Help: "Transactional ids the coordinator keeps (sessions).",
	})
	mTxnEnded = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_txn_ended_total",
		Help: "Transactions ended, by outcome (commit, abort) and by whom (producer, timeout, fenced: a new session of the id, manual).",
	}, []string{"outcome", "by"})
	mTxnStaged = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_txn_staged_records_total",
		Help: "Records staged in transactions.",
	})
	mTxnCommitted = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_txn_committed_records_total",
		Help: "Records of committed transactions appended to their topics.",
	})
	mTxnEpochRestarts = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_txn_epoch_restarts_total",
		Help: "Transaction coordinator restarts because a newer coordinator fenced it, or its replica of __txn was elected again in a later term.",
	})
	mTxnEpochResets = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_txn_epoch_resets_total",
		Help: "Partitions whose transaction coordinator epoch the coordinator reset: it was above the coordinator's own, whose term a write to __txn proved the latest (__txn's state was lost).",
	})
	mTxnDropped = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_txn_dropped_total",
		Help: "Staged batches of committed transactions dropped: their topic is gone, or their record in __txn is unreadable (logged).",
	})
	mTxnOffsets = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_txn_group_offsets_total",
		Help: "Consumer group offsets of committed transactions, one per group and transaction: applied at the groups coordinator, or dropped (refused for good, as for a broadcast group or a group of another topic; logged).",
	}, []string{"result"})
	mTxnMarkers = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_txn_markers_total",
		Help: "Markers of transactions written once that their partitions took (commit, abort), or refused for good (refused; logged).",
	}, []string{"result"})
	mTxnOrphans = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_txn_orphans_total",
		Help: "Transactions written once found open on a partition that nobody would end, ended by the coordinator's sweep: aborted, or committed (its commit did not list the partition; logged).",
	}, []string{"result"})
	mTxnFenced = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_txn_fenced_total",
		Help: "Transaction requests refused with PRODUCER_FENCED (a zombie of an older session).",
	})
	mWriteQueue = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_txn_write_queue",
		Help: "Writes waiting for the one in flight to __txn.",
	})
)
