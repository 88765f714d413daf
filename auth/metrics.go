package auth

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Reasons of herald_auth_failures_total.
const (
	reasonPassword    = "wrong_password"
	reasonUnknownUser = "unknown_user"
	reasonMalformed   = "malformed"
	reasonMechanism   = "mechanism"
	reasonAuthzid     = "authzid"
	reasonThrottled   = "throttled"
)

var (
	mLogins = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_auth_logins_total",
		Help: "Connections logged in, by mechanism (SCRAM-SHA-256, or TLS for a verified client certificate).",
	}, []string{"mechanism"})
	mFailures = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "herald_auth_failures_total",
		Help: "Logins refused, by reason (wrong_password, unknown_user, malformed, mechanism, authzid, throttled: the source had too many failures).",
	}, []string{"reason"})
	mLimited = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "herald_auth_limiter_addresses",
		Help: "Source addresses the failed-login limiter tracks (bounded by its table size).",
	})
	mDenied = promauto.NewCounter(prometheus.CounterOpts{
		Name: "herald_auth_denied_total",
		Help: "Requests refused with NOT_AUTHORIZED or NOT_AUTHENTICATED.",
	})
)
