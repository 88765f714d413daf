package broker

import (
	"reflect"
	"strings"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/heraldmq/herald/actors/consumer"
	"github.com/heraldmq/herald/actors/topic"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
)

// TestRoutingTableCoversEveryRequest: the node's one routing table has a
// handler for every request type of the protocol (a Frame body whose
// message is named ...Request), except Hello and SaslAuthenticate, which
// netio answers itself;
// building it would panic on a type claimed twice.
func TestRoutingTableCoversEveryRequest(t *testing.T) {
	sys := actor.NewActorSystem()
	r := newRouter(sys, consumer.NewRouter(sys, &consumer.Directory{}, nil), topic.NewRouter(sys, &registry.Registry{}, nil),
		func(*heraldpb.Frame, *actor.PID) {}, func(*heraldpb.Frame, *actor.PID) {}, func(*heraldpb.Frame, *actor.PID) {}, &exchanges{})
	fields := (&heraldpb.Frame{}).ProtoReflect().Descriptor().Oneofs().ByName("body").Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		name := string(fd.Message().Name())
		if !strings.HasSuffix(name, "Request") || name == "HelloRequest" || name == "SaslAuthenticateRequest" {
			continue
		}
		f := &heraldpb.Frame{}
		m := f.ProtoReflect()
		m.Set(fd, m.NewField(fd)) // an empty request of the generated type
		if r.table[reflect.TypeOf(f.Body)] == nil {
			t.Errorf("no handler for %s (%T)", name, f.Body)
		}
	}
}
