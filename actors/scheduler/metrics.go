package scheduler

import (
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	dto "github.com/prometheus/client_model/go"
)

// Metrics of the scheduler (delayed and scheduled delivery).
var (
	mPending = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_scheduler_pending",
		Help: "Delayed batches waiting for their time (neither delivered nor cancelled).",
	})
	mScheduled = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_scheduler_scheduled_total",
		Help: "Delayed batches stored.",
	})
	mDedupEntries = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_scheduler_dedup_entries",
		Help: "Delayed batches of idempotent producers the scheduler remembers, to recognise their retries (bounded by the dedup window and its maximum).",
	})
	mDedupEvicted = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_scheduler_dedup_evicted_total",
		Help: "Delayed batches of idempotent producers forgotten before the end of the dedup window, because the scheduler remembered its maximum: a retry of one would be stored again.",
	})
	mDuplicates = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_scheduler_duplicates_total",
		Help: "Retries of delayed batches of idempotent producers recognised: answered with the first attempt's schedule id (stored), or asked to retry later while its write is in flight (writing) or its outcome unknown (unknown).",
	}, []string{"outcome"})
	mCancelled = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_scheduler_cancelled_total",
		Help: "Delayed batches cancelled before their time.",
	})
	mFired = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_scheduler_fired_total",
		Help: "Delayed batches appended to their topics.",
	})
	mEpochRestarts = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_scheduler_epoch_restarts_total",
		Help: "Scheduler restarts to reload __schedule: a partition refused it as fenced and its replica of __schedule leads in a later term than its epoch, or a write to __schedule ended with its outcome unknown.",
	})
	mEpochResets = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_scheduler_epoch_resets_total",
		Help: "Partitions whose scheduler epoch was reset to a lower one, left by a __schedule whose state was lost.",
	})
	mDropped = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_scheduler_dropped_total",
		Help: "Delayed batches given up at their time: their topic or partition is gone (topic_gone), the topic refused them (refused), or their record in __schedule was unreadable (unreadable).",
	}, []string{"reason"})
	mLateness = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "herald_scheduler_fire_lateness_seconds",
		Help:    "From a delayed batch's time to its append on its topic being committed (durable and readable), as the partition's clock stamps the commit.",
		Buckets: []float64{.001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 10, 60},
	})
	mSendLateness = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "herald_scheduler_send_lateness_seconds",
		Help:    "From a delayed batch's time to the scheduler sending its append (the scheduler's share of fire_lateness; the rest is the partition's commit).",
		Buckets: []float64{.001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 10, 60},
	})
	mHeldBytes = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_scheduler_held_bytes",
		Help: "Records of announced appends waiting for their time (bounded by MaxHeldBytes).",
	})
	mDue = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_scheduler_due",
		Help: "Batches whose time has come, waiting for a fire round.",
	})
	mWriteQueue = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_scheduler_write_queue",
		Help: "Writes waiting to go to __schedule (bounded by the scheduler's max queued; past it, THROTTLED).",
	})
	mRefused = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_scheduler_refused_total",
		Help: "Delayed produce requests refused with THROTTLED, by reason (max_pending, queue_full).",
	}, []string{"reason"})
	mNear = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_scheduler_wheel_near",
		Help: "Timers in memory: the wheel's near window (65.536 s) and those due.",
	})
	mFar = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_scheduler_wheel_far",
		Help: "Timers beyond the near window, in the far store (cancelled ones included until their bucket loads).",
	})
	mMoved = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_scheduler_moved_total",
		Help: "Long-pending delayed batches that compaction moved up __schedule so that the log could be truncated behind them.",
	})
	mFarBuffered = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_scheduler_far_buffered",
		Help: "Far timers in memory waiting to be written to their bucket file (bounded; more only while writes fail).",
	})
	mFarFiles = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_scheduler_far_files",
		Help: "Bucket files of the far timer store.",
	})
)

// fireLateness is the fire-lateness histogram as it stands, for
// ListScheduled's answer (nil if it cannot be read).
func fireLateness() *heraldpb.LatencyHistogram {
	var m dto.Metric
	if err := mLateness.Write(&m); err != nil || m.GetHistogram() == nil {
		return nil
	}
	ph := m.GetHistogram()
	h := &heraldpb.LatencyHistogram{Count: ph.GetSampleCount()}
	for _, b := range ph.GetBucket() {
		h.Bounds = append(h.Bounds, b.GetUpperBound())
		h.CumulativeCounts = append(h.CumulativeCounts, b.GetCumulativeCount())
	}
	return h
}
