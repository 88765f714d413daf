package consumer

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics of consumer groups. Per-group series are deleted when the group's
// coordinator stops.
var (
	mLag = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_consumer_lag",
		Help: "Messages of a partition not yet acknowledged by the group (high watermark - durable ack floor - offsets done above it, acks still being written included), per group, subscriber view and partition.",
	}, []string{"group", "topic", "partition"})
	mInFlight = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_consumer_in_flight",
		Help: "Messages delivered to the group's members and not yet acknowledged.",
	}, []string{"group"})
	mMembers = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_consumer_members",
		Help: "Live members of the group.",
	}, []string{"group"})
	mDelivered = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_consumer_delivered_total",
		Help: "Messages pushed to members, redeliveries included.",
	}, []string{"group"})
	mRedelivered = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_consumer_redelivered_total",
		Help: "Messages pushed again after a nack, an ack timeout or a member leaving.",
	}, []string{"group"})
	mAcked = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_consumer_acked_total",
		Help: "Messages acknowledged.",
	}, []string{"group"})
	mNacked = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_consumer_nacked_total",
		Help: "Messages negatively acknowledged.",
	}, []string{"group"})
	mAckTimeouts = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_consumer_ack_timeouts_total",
		Help: "Deliveries whose ack timeout expired.",
	}, []string{"group"})
	mStaleAcks = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_consumer_stale_acks_total",
		Help: "Acks and nacks of messages already done or not in flight (late acks after a timeout or rebalance), ignored.",
	}, []string{"group"})
	mRetries = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_consumer_retries_total",
		Help: "Failed deliveries scheduled for a retry by the retry policy, by reason (nack, timeout).",
	}, []string{"group", "reason"})
	mDeadLettered = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_consumer_dead_lettered_total",
		Help: "Messages appended (durably) to the group's dead-letter topic.",
	}, []string{"group"})
	mDeadLetterErrors = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_consumer_dead_letter_errors_total",
		Help: "Failed attempts to create the dead-letter topic or append to it (each is retried with backoff).",
	}, []string{"group"})
	mExpired = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_consumer_expired_total",
		Help: "Messages whose time-to-live ran out before delivery, by action (drop, dead_letter).",
	}, []string{"group", "action"})
	mAhead = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_consumer_priority_ahead_total",
		Help: "Messages offered from a partition's priority sub-queues ahead of the group's ordered read (it was stalled behind a backlog).",
	}, []string{"group"})
	mFiltered = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_consumer_filtered_total",
		Help: "Messages the group's filter skipped (they still advance progress).",
	}, []string{"group"})
	mAckLatency = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "herald_consumer_ack_latency_seconds",
		Help:    "Time from a push to its ack reaching the coordinator.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2.5, 14),
	}, []string{"group"})
	mProgressWrites = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_consumer_progress_writes_total",
		Help: "Progress records written to __groups, by outcome.",
	}, []string{"outcome"})
	mCalls = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_calls_total",
		Help: "Request-reply calls routed to responders.",
	})
	mCallsDropped = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_calls_dropped_total",
		Help: "Request-reply calls dropped because the group's call queue was full (the caller times out).",
	}, []string{"group"})
	mCallQueue = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_calls_queued",
		Help: "Request-reply calls waiting for a responder with credit, per group.",
	}, []string{"group"})
	mReplies = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_replies_total",
		Help: "Request-reply replies, by outcome (ok, no_inbox).",
	}, []string{"outcome"})
	mIdleStops = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_group_coordinator_idle_stops_total",
		Help: "Group coordinators stopped after Options.IdleStop with no members (started again on the group's next request).",
	})
	mCoordinators = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_group_coordinators",
		Help: "Group coordinators running on this node (groups whose coordinator stopped while idle are not counted).",
	})
	mCompactions = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_groups_compactions_total",
		Help: "Compactions of __groups that removed superseded progress records.",
	})
	mGroupQueue = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_groups_queued_requests",
		Help: "Group requests held while the groups manager loads __groups.",
	})
)

func deleteGroupMetrics(group string) {
	for _, v := range []*prometheus.GaugeVec{mInFlight, mMembers, mCallQueue} {
		v.DeleteLabelValues(group)
	}
	for _, v := range []*prometheus.CounterVec{mDelivered, mRedelivered, mAcked, mNacked, mAckTimeouts, mStaleAcks, mFiltered, mAhead, mCallsDropped,
		mDeadLettered, mDeadLetterErrors} {
		v.DeleteLabelValues(group)
	}
	for _, v := range []*prometheus.CounterVec{mRetries, mExpired} {
		v.DeletePartialMatch(prometheus.Labels{"group": group})
	}
	mAckLatency.DeleteLabelValues(group)
	mLag.DeletePartialMatch(prometheus.Labels{"group": group})
}
