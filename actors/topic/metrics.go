package topic

// The topic room's metrics.

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

var (
	mProxied = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_remote_partition_requests_total",
		Help: "Requests for partitions with no local replica, forwarded to a node that holds one, by outcome (answered, not_leader, failed, throttled).",
	}, []string{"outcome"})
	mProxiedInFlight = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_remote_partition_requests_in_flight",
		Help: "Requests for partitions with no local replica waiting for the other node's answer (at most 1024).",
	})
)
