package topic

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
)

// topicActor routes produce requests of one topic to its partitions, as
// the registry lists them (a cluster topic's local replicas come and go as
// partitions move between nodes).
type topicActor struct {
	name       string
	reg        *registry.Registry
	partitions []*actor.PID
	// stats, for a cluster topic: a produce with neither partition nor key
	// goes round-robin over the partitions led by this node.
	stats []*partition.Stats
	entry *registry.Entry // the registry's entry for the request being routed
	next  uint32          // round-robin cursor
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
	t.partitions, t.stats = e.Partitions, nil
	if e.Record != nil {
		t.stats = e.Stats
	}
	t.entry = e
	part, err := t.route(req)
	if err != nil {
		ctx.Send(ctx.Sender(), heraldpb.ErrorFrame(f.Id, err))
		return
	}
	req.Partition = &part
	to := t.entry.Writer(int(part))
	if req.ProducerId != 0 {
		// An idempotent producer goes to the leader itself, in order: its
		// local follower answers NOT_LEADER naming the leader.
		to = t.partitions[part]
	}
	ctx.RequestWithCustomSender(to, f, ctx.Sender())
}

// route picks the partition of a produce request.
func (t *topicActor) route(req *heraldpb.ProduceRequest) (uint32, *heraldpb.Error) {
	n := uint32(len(t.partitions))
	if req.ProducerId != 0 && req.Partition == nil {
		// Sequences are per partition: the producer must choose it.
		return 0, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "an idempotent produce (producer_id %d) must name its partition", req.ProducerId)
	}
	if req.Partition != nil {
		if *req.Partition >= n {
			return 0, partitionNotFound(t.name, *req.Partition, int(n))
		}
		return *req.Partition, nil
	}
	info, err := heraldpb.ScanBatch(req.Records)
	if err != nil {
		return 0, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "%v", err)
	}
	if len(info.FirstKey) > 0 {
		return heraldpb.PartitionForKey(info.FirstKey, n), nil
	}
	for range t.stats {
		p := t.next % n
		t.next++
		if t.stats[p].Writable.Load() {
			return p, nil
		}
	}
	p := t.next % n
	t.next++
	return p, nil
}
