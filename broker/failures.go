package broker

import (
	"log/slog"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

var mActorFailures = promauto.NewCounterVec(prometheus.CounterOpts{
	Name: "herald_actor_failures_total",
	Help: "Actors that panicked and were restarted (or stopped) by their supervisor, by directive.",
}, []string{"directive"})

// logFailures reports every actor failure: protoactor logs them at info
// level only ("[ACTOR] Recovering"), which the broker's actor log floor
// hides, and a restarted actor loses its in-memory state.
func logFailures(sys *actor.ActorSystem, log *slog.Logger) {
	sys.EventStream.Subscribe(func(ev interface{}) {
		if e, ok := ev.(*actor.SupervisorEvent); ok {
			directive := e.Directive.String()
			mActorFailures.WithLabelValues(directive).Inc()
			log.Error("an actor failed", "actor", e.Child.String(), "reason", e.Reason, "directive", directive)
		}
	})
}
