package netio

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics live in the default registry and are shared by every Server in
// the process.
var (
	mConnections = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_connections",
		Help: "Open client connections.",
	})
	mConnectionsTotal = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_connections_total",
		Help: "Client connections accepted.",
	})
	mConnectionsRejected = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_connections_rejected_total",
		Help: "Client connections refused at open, by reason (max_connections, shutting_down).",
	}, []string{"reason"})
	mInflight = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_inflight_requests",
		Help: "Requests handed to the actors whose response is not yet written.",
	})
	mRequests = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_requests_total",
		Help: "Request frames received, by body type (the Frame oneof field name).",
	}, []string{"type"})
	mBadFrames = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_bad_frames_total",
		Help: "Frames that closed their connection, by reason (malformed, too_large, unknown_body, not_a_request, truncated).",
	}, []string{"reason"})
	mPendingOutput = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_pending_output_bytes",
		Help: "Bytes of responses and pushes handed to the network layer and not yet written to client sockets, all connections.",
	})
	mQueued = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_queued_request_bytes",
		Help: "Bytes of incomplete and queued client requests counted against --max-queued-request-bytes.",
	})
	mPausedConns = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_connections_read_paused",
		Help: "Client connections the broker is not reading (output full or request budget spent).",
	})
	mReadPauses = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_read_pauses_total",
		Help: "Times a client connection stopped being read, by reason (output, budget).",
	}, []string{"reason"})
	mLimitClosed = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_connections_limit_closed_total",
		Help: "Client connections closed for a limit, by reason (output_overflow, write_stall, frame_timeout).",
	}, []string{"reason"})
	mProduceInflight = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_produce_inflight_bytes",
		Help: "Bytes of produce requests admitted and not yet answered, all connections (admission control).",
	})
	mProduceDrained = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_produce_drained_total",
		Help: "Produce requests a partition held written, unanswered (a transaction's commit waiting for an earlier one of its producer), whose bytes stopped counting as admitted before their answer.",
	})
	mProduceDeferred = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_produce_deferred_total",
		Help: "Times a produce frame over its connection's fair share was left unread until the connection's turn (admission control; THROTTLED only after --max-produce-defer).",
	})
	mProduceWaiting = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_produce_waiting_connections",
		Help: "Connections in the admission line: a produce waits for room and the connection has nothing in flight (woken in order as produces are answered).",
	})
	mProduceLimit = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_produce_limit_bytes",
		Help: "The admission limit in force: --max-inflight-produce-bytes, unless the latency control lowered it because a sparse produce took longer than --produce-latency-target.",
	})
	mSparseLatency = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "herald_produce_sparse_latency_seconds",
		Help:    "Time from admission to answer of sparse produces (a connection with at most 64 KiB of produces in flight, now and all through the last 100-200 ms: a light producer's), which the latency control keeps under --produce-latency-target.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 1.5, 22),
	})
	mProducePace = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_produce_pace_bytes_per_second",
		Help: "Pacing rate of produces that are not sparse, set by the latency control once the admission limit is at its floor and a light producer is still slow (0: not paced).",
	})
	mProduceLimitCuts = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_produce_limit_cuts_total",
		Help: "Times the latency control lowered the admission limit in force (a sparse produce took longer than --produce-latency-target).",
	})
	mProduceThrottled = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_produce_throttled_total",
		Help: "Produce requests answered THROTTLED by admission control, by reason (fair_share: over half the limit and the connection over its share; limit: over the limit and the connection over its share).",
	}, []string{"reason"})
	mProduceDrainRate = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_produce_drain_bytes_per_second",
		Help: "Produce bytes answered per second, as admission control measures it for its retry-after hints (0 until measured).",
	})
	mFramesPerWrite = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "herald_frames_per_write",
		Help:    "Outgoing frames a connection's event loop wrote in one writev (of those queued for it since its last write, at most 512 a writev).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 10),
	})
	mFramesDropped = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_frames_dropped_total",
		Help: "Outgoing frames dropped because their connection had closed or sent its final frame.",
	})
)

// Rejection and bad-frame reasons, the label values used above.
const (
	reasonMaxConnections = "max_connections"
	reasonShuttingDown   = "shutting_down"

	badMalformed   = "malformed"
	badTooLarge    = "too_large"
	badUnknownBody = "unknown_body"
	badNotRequest  = "not_a_request"
	badTruncated   = "truncated"

	pauseReasonOutput   = "output"
	pauseReasonBudget   = "budget"
	pauseReasonThrottle = "throttle"

	reasonOutputOverflow = "output_overflow"
	reasonWriteStall     = "write_stall"
	reasonFrameTimeout   = "frame_timeout"

	throttleFairShare = "fair_share"
	throttleLimit     = "limit"
)
