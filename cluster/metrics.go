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
