package cluster

import (
	"testing"

	"github.com/heraldmq/herald/exchange"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// FuzzApplyRecord: any bytes as a record of the controller's log apply
// (or fail to decode) without panicking, twice over as a replay would,
// and leave the exchanges within their limits.
func FuzzApplyRecord(f *testing.F) {
	for _, cmd := range []*heraldpb.ControllerCommand{
		{Command: &heraldpb.ControllerCommand_CreateTopic{CreateTopic: &heraldpb.TopicRecord{Name: "t"}}},
		{Command: &heraldpb.ControllerCommand_DeclareExchange{DeclareExchange: &heraldpb.ExchangeRecord{Config: &heraldpb.ExchangeConfig{Name: "x", Type: heraldpb.ExchangeType_EXCHANGE_TOPIC}}}},
		{Command: &heraldpb.ControllerCommand_Bind{Bind: &heraldpb.BindRequest{Binding: &heraldpb.Binding{Exchange: "x", Topic: "t", Key: "a.#"}}}},
		{Command: &heraldpb.ControllerCommand_Bind{Bind: &heraldpb.BindRequest{Binding: &heraldpb.Binding{Exchange: "x", ToExchange: "x"}, Unbind: true}}},
		{Command: &heraldpb.ControllerCommand_DeleteExchange{DeleteExchange: &heraldpb.DeleteExchangeRequest{Name: "x"}}},
		{Command: &heraldpb.ControllerCommand_DeleteVhost{DeleteVhost: &heraldpb.DeleteVhost{Name: "A"}}},
		{Command: &heraldpb.ControllerCommand_Checkpoint{Checkpoint: &heraldpb.ControllerCheckpoint{Offset: 1, Exchanges: []*heraldpb.ExchangeRecord{{}}}}},
	} {
		v, _ := proto.Marshal(cmd)
		rec, _ := proto.Marshal(&heraldpb.Record{Value: v})
		f.Add(rec)
	}
	f.Fuzz(func(t *testing.T, rec []byte) {
		md := &Metadata{Nodes: map[uint64]*heraldpb.NodeRecord{}, Topics: map[string]*heraldpb.TopicRecord{"t": {Name: "t"}},
			Exchanges: exchange.Metadata{}}
		_, _ = md.Exchanges.Declare(&heraldpb.ExchangeRecord{Config: &heraldpb.ExchangeConfig{Name: "x", Type: heraldpb.ExchangeType_EXCHANGE_DIRECT}})
		for off := range int64(2) {
			next := md.clone()
			_, _ = applyRecord(next, off+1, rec)
			md = next
		}
		if len(md.Exchanges) > exchange.MaxExchanges || md.Exchanges.Bindings() > exchange.MaxBindings {
			t.Fatalf("over the limits: %d exchanges, %d bindings", len(md.Exchanges), md.Exchanges.Bindings())
		}
		_ = exchange.Build(md.Exchanges)
		_ = checkpointOf(md)
	})
}
