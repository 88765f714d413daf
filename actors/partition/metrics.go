package partition

import (
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

var (
	labels = []string{"topic", "partition"}

	produceRecords = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_produce_records_total", Help: "Records appended to the partition (committed).",
	}, labels)
	produceBytes = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_produce_bytes_total", Help: "Record batch bytes appended to the partition (committed).",
	}, labels)
	fetchRecords = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_fetch_records_total", Help: "Records returned by fetches.",
	}, labels)
	fetchBytes = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_fetch_bytes_total", Help: "Record batch bytes returned by fetches.",
	}, labels)
	logStartOffset = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_log_start_offset", Help: "First offset still in the partition log.",
	}, labels)
	logEndOffset = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_log_end_offset", Help: "Offset after the last record in the log, committed or not.",
	}, labels)
	highWatermark = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_high_watermark", Help: "Offset after the last committed record; consumers never read past it.",
	}, labels)
	mailboxDepth = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_partition_mailbox_depth", Help: "User messages waiting in the partition actor's mailbox.",
	}, labels)
	throttled = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_throttled_total", Help: "Requests answered THROTTLED (mailbox full, uncommitted bytes, readers busy).",
	}, labels)
	parkedFetches = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_parked_fetches", Help: "Long-poll fetches waiting for data.",
	}, labels)
	isQuiesced = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_partition_quiesced", Help: "1 while this replica's raft group is quiesced (idle: no ticks, no heartbeats).",
	}, labels)
	isLeader = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_partition_leader", Help: "1 when this replica leads the partition.",
	}, labels)
	notEnoughReplicas = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_not_enough_replicas_total", Help: "acks=all produce requests refused because fewer voters than min-in-sync were in sync.",
	}, labels)
	storageFailures = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_partition_storage_failures_total", Help: "Times the partition's log failed and was reopened.",
	}, labels)
	idemProducers = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_idempotent_producers", Help: "Idempotent producers whose recent batches the partition remembers (bounded by MaxProducers).",
	}, labels)
	txnOpen = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_partition_txn_open", Help: "Transactions with batches written to the partition and not ended by a marker yet.",
	}, labels)
	txnOpenBytes = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_partition_txn_open_bytes", Help: "Bytes of the open transactions' batches on the partition (bounded by MaxTxnOpenBytes).",
	}, labels)
	txnMarkers = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_partition_txn_markers_total", Help: "Transaction markers applied on the partition, by outcome.",
	}, append(slices.Clone(labels), "marker"))
	txnCommitsAlone = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_partition_txn_commits_alone_total", Help: "Transactions that wrote only this partition committed by their last batch (commit_txn), without their coordinator; counted by the leader as it proposes the commit.",
	}, labels)
	txnCommitsWaiting = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_partition_txn_commits_waiting", Help: "Single-partition commits the leader holds until an earlier transaction of their producer ends (at most 4096; THROTTLED past it).",
	}, labels)
	markersPerEntry = promauto.NewHistogram(prometheus.HistogramOpts{
		Name: "herald_partition_txn_markers_per_entry", Help: "Transaction markers a partition's leader wrote together in one log entry (the markers that reached it together, at most 256).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 9),
	})
	idemEvictions = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_idempotent_evictions_total", Help: "Idempotent producers forgotten because the partition's table was full.",
	}, labels)
	produceDuplicates = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_produce_duplicates_total", Help: "Idempotent produce retries answered with the original offsets instead of being appended again.",
	}, labels)
	produceOutOfOrder = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_produce_out_of_order_total", Help: "Idempotent produces refused with OUT_OF_ORDER_SEQUENCE.",
	}, labels)
	heldBatches = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_partition_held_batches", Help: "Committed batches held unreadable until their time (scheduled fires appended ahead; at most 4096 tracked, each held at most 1 s).",
	}, labels)
	holdReleaseLateness = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "herald_partition_hold_release_lateness_seconds",
		Help:    "How long after its time a held batch became readable (a batch committed after its time is not held, and not counted).",
		Buckets: []float64{0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1},
	})
	raftMisaddressed = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_raft_messages_misaddressed_total",
		Help: "Raft messages a replica dropped because they were addressed to another raft id: to an earlier (or later) incarnation of the node's replica of that partition.",
	})
	partitionDamaged = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_partition_damaged", Help: "1 while this replica's log holds damage not yet repaired: a lone replica is read-only (PARTITION_DAMAGED), one with other voters rebuilds from its leader and does not vote.",
	}, labels)
	votesWithheld = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_raft_votes_withheld_total", Help: "Vote requests and granted votes a replica rebuilding a damaged log did not send.",
	})
	followerResets = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_raft_follower_resets_total", Help: "Followers a leader found to have lost entries they had acknowledged (a damaged log); each makes it hand its leadership over, or start a new term, so that they are sent them again.",
	})
	syncsPaced = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_log_syncs_paced_total", Help: "Log syncs a partition's writer held back to its sync pace (Config.SyncPace), so that the appends arriving meanwhile join them.",
	})
	syncPacedSeconds = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_log_sync_paced_seconds_total", Help: "Time partitions' log writers held syncs back to their sync pace.",
	})
	txnFenced = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_partition_txn_fenced_total", Help: "Appends and fences of a transaction coordinator refused (PRODUCER_FENCED) because a newer coordinator had fenced the partition.",
	})
	zombieRefused = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_partition_txn_zombie_refused_total", Help: "Transactional batches written once refused (PRODUCER_FENCED) because a newer session of their transactional id had started.",
	})
	sessionFenceCount = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_partition_txn_session_fences", Help: "Producers of replaced transaction sessions whose older epochs the partition refuses (bounded by 10,000; the oldest is forgotten past it).",
	}, labels)
	sessionFenceWaiting = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_partition_txn_session_fence_waiting", Help: "The coordinator's sweeps waiting for the session fence they raised to be applied (bounded by 10,000; THROTTLED past it).",
	}, labels)
	readerQueueDepth = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_log_reader_queue_depth", Help: "Catch-up fetches queued for the log reader pool.",
	})
)

// partMetrics caches one partition's label-bound metrics.
type partMetrics struct {
	produceRecords, produceBytes, fetchRecords, fetchBytes, throttled, storageFailures, notEnoughReplicas prometheus.Counter
	idemEvictions, duplicates, outOfOrder                                                                 prometheus.Counter
	start, end, hw, mailbox, parked, leader, writerQueue, quiesced, producers, held, damaged              prometheus.Gauge
	txnOpen, txnOpenBytes, sessionFences, fenceWaiting                                                    prometheus.Gauge
	txnMarkers                                                                                            *prometheus.CounterVec
	markerCounters                                                                                        [2]prometheus.Counter // abort, commit: resolved at first use
	markersPerEntry                                                                                       prometheus.Observer
	commitsAlone                                                                                          prometheus.Counter
	commitsWaiting                                                                                        prometheus.Gauge
	votesWithheld, followerResets, txnFenced, zombieRefused                                               prometheus.Counter
	lv                                                                                                    []string
}

func newPartMetrics(topic string, part uint32) *partMetrics {
	lv := []string{topic, strconv.FormatUint(uint64(part), 10)}
	return &partMetrics{
		lv:                lv,
		produceRecords:    produceRecords.WithLabelValues(lv...),
		produceBytes:      produceBytes.WithLabelValues(lv...),
		fetchRecords:      fetchRecords.WithLabelValues(lv...),
		fetchBytes:        fetchBytes.WithLabelValues(lv...),
		throttled:         throttled.WithLabelValues(lv...),
		storageFailures:   storageFailures.WithLabelValues(lv...),
		notEnoughReplicas: notEnoughReplicas.WithLabelValues(lv...),
		start:             logStartOffset.WithLabelValues(lv...),
		end:               logEndOffset.WithLabelValues(lv...),
		hw:                highWatermark.WithLabelValues(lv...),
		mailbox:           mailboxDepth.WithLabelValues(lv...),
		parked:            parkedFetches.WithLabelValues(lv...),
		leader:            isLeader.WithLabelValues(lv...),
		quiesced:          isQuiesced.WithLabelValues(lv...),
		writerQueue:       writerQueueDepth.WithLabelValues(lv...),
		producers:         idemProducers.WithLabelValues(lv...),
		held:              heldBatches.WithLabelValues(lv...),
		damaged:           partitionDamaged.WithLabelValues(lv...),
		votesWithheld:     votesWithheld,
		followerResets:    followerResets,
		txnFenced:         txnFenced,
		zombieRefused:     zombieRefused,
		sessionFences:     sessionFenceCount.WithLabelValues(lv...),
		fenceWaiting:      sessionFenceWaiting.WithLabelValues(lv...),
		idemEvictions:     idemEvictions.WithLabelValues(lv...),
		txnOpen:           txnOpen.WithLabelValues(lv...),
		txnOpenBytes:      txnOpenBytes.WithLabelValues(lv...),
		txnMarkers:        txnMarkers,
		markersPerEntry:   markersPerEntry,
		commitsAlone:      txnCommitsAlone.WithLabelValues(lv...),
		commitsWaiting:    txnCommitsWaiting.WithLabelValues(lv...),
		duplicates:        produceDuplicates.WithLabelValues(lv...),
		outOfOrder:        produceOutOfOrder.WithLabelValues(lv...),
	}
}

// DeleteMetrics removes a deleted partition's series.
func DeleteMetrics(topic string, part uint32) {
	lv := []string{topic, strconv.FormatUint(uint64(part), 10)}
	for _, v := range []*prometheus.CounterVec{produceRecords, produceBytes, fetchRecords, fetchBytes, throttled, storageFailures, notEnoughReplicas, idemEvictions, produceDuplicates, produceOutOfOrder, txnCommitsAlone} {
		v.DeleteLabelValues(lv...)
	}
	for _, v := range []*prometheus.GaugeVec{logStartOffset, logEndOffset, highWatermark, mailboxDepth, parkedFetches, isLeader, isQuiesced, writerQueueDepth, idemProducers, heldBatches, partitionDamaged, txnOpen, txnOpenBytes, sessionFenceCount, sessionFenceWaiting, txnCommitsWaiting} {
		v.DeleteLabelValues(lv...)
	}
	txnMarkers.DeletePartialMatch(prometheus.Labels{"topic": topic, "partition": lv[1]})
}

// marker counts a transaction marker applied, by outcome.
func (m *partMetrics) marker(commit bool) {
	i := 0
	if commit {
		i = 1
	}
	if m.markerCounters[i] == nil {
		m.markerCounters[i] = m.txnMarkers.WithLabelValues(append(slices.Clone(m.lv), markerLabel(commit))...)
	}
	m.markerCounters[i].Inc()
}
