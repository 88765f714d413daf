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
		Help: "Check-backs due, by result: sent to a producer of the group (sent), or no producer of the group connected (no_producer).",
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
	mWriteQueue = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_txn_write_queue",
		Help: "Writes waiting for the one in flight to __txn.",
	})
)
