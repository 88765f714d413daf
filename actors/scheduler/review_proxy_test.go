package scheduler

import (
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/topic"
	heraldpb "github.com/heraldmq/herald/proto"
)

// proxy stands in front of a partition actor: it forwards each request and
// passes the answer back to the original sender, with delays chosen per
// message (before forwarding, and before answering). intercept may answer
// a message itself (return non-nil) instead of forwarding it.
type proxy struct {
	real      *actor.PID
	before    func(msg any) time.Duration
	after     func(msg any) time.Duration
	intercept func(msg any) any
	override  func(msg, res any) any
}

func (p *proxy) Receive(ctx actor.Context) {
	msg := ctx.Message()
	switch msg.(type) {
	case *heraldpb.Frame, any:
		if _, sys := msg.(actor.SystemMessage); sys {
			return
		}
		switch msg.(type) {
		case *actor.Started, *actor.Stopping, *actor.Stopped, *actor.Restarting:
			return
		}
	}
	sender, sys := ctx.Sender(), ctx.ActorSystem()
	go func() {
		if p.before != nil {
			time.Sleep(p.before(msg))
		}
		var res any
		if p.intercept != nil {
			res = p.intercept(msg)
		}
		if res == nil {
			var err error
			res, err = sys.Root.RequestFuture(p.real, msg, 30*time.Second).Result()
			if err != nil {
				return
			}
		}
		if p.override != nil {
			res = p.override(msg, res)
		}
		if p.after != nil {
			time.Sleep(p.after(msg))
		}
		if sender != nil {
			sys.Root.Send(sender, res)
		}
	}()
}

// newProxyRig is newRig with a proxy in front of partition part of topic
// name, installed before the scheduler starts, and a visible logger if
// HERALD_LOG is set.
func newProxyRig(t *testing.T, dir string, o Options, name string, part int, p *proxy) *rig {
	t.Helper()
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
	mgr, reg, err := topic.Spawn(sys, topic.Config{DataDir: dir, NodeID: 1, Advertise: "x", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, sys: sys, mgr: mgr, reg: reg}
	res, err := sys.Root.RequestFuture(mgr, &topic.EnsureInternal{Name: ScheduleTopic, Partitions: 1, MaxMessageBytes: 2 << 20}, 10*time.Second).Result()
	if err != nil || res.(*topic.EnsureInternalResult).Err != nil {
		t.Fatal(err, res)
	}
	if reg.Get("t") == nil {
		r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "t", Config: &heraldpb.TopicConfig{Partitions: 2}}}}, mgr)
	}
	if p != nil {
		e := reg.Get(name)
		p.real = e.Partitions[part]
		e.Partitions[part] = sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return p }))
	}
	var h slog.Handler = slog.NewTextHandler(io.Discard, nil)
	if os.Getenv("HERALD_LOG") != "" {
		h = slog.NewTextHandler(os.Stderr, nil)
	}
	o.Topics, o.Logger = reg, slog.New(h)
	r.o = o
	r.sched = sys.Root.Spawn(Props(o))
	return r
}
