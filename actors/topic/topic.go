package topic

import (
	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
)

// topicActor routes the produce requests sent to a topic's PID (the
// consumer room's dead letters) through the registry's routing
// (registry.Entry.Route), as the network loops route clients' produces
// themselves. Its PID is also the topic's identity (registry.Same).
type topicActor struct {
	name string
	reg  *registry.Registry
}

func topicProps(name string, reg *registry.Registry) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &topicActor{name: name, reg: reg}
	})
}

func (t *topicActor) Receive(ctx actor.Context) {
	f, ok := ctx.Message().(*heraldpb.Frame)
	if !ok {
		return
	}
	req := f.GetProduce()
	if req == nil {
		ctx.Send(ctx.Sender(), heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "topic actors route produce requests only")))
		return
	}
	e := t.reg.Get(t.name)
	if e == nil || e.Topic == nil || !e.Topic.Equal(ctx.Self()) {
		ctx.Send(ctx.Sender(), heraldpb.ErrorFrame(f.Id, topicNotFound(t.name))) // deleted meanwhile
		return
	}
	part, to, perr := e.Route(req)
	if perr != nil {
		ctx.Send(ctx.Sender(), heraldpb.ErrorFrame(f.Id, perr))
		return
	}
	req.Partition = &part
	ctx.RequestWithCustomSender(to, f, ctx.Sender())
}
