package topic

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/persistence/errorfs"
	"github.com/heraldmq/herald/persistence/vfs"
	heraldpb "github.com/heraldmq/herald/proto"
)

// TestCreateUndoneWhenTheCatalogCannotBeSaved: a topic whose creation
// could not be written to the catalog is answered STORAGE_ERROR and does
// not exist, neither now nor after a restart; once the disk works again,
// creating it succeeds and the topic survives a restart. (Before the fix
// the topic stayed live in memory: a retry was told it already existed,
// and a restart forgot it.)
func TestCreateUndoneWhenTheCatalogCannotBeSaved(t *testing.T) {
	dir := t.TempDir()
	fs := errorfs.Wrap(vfs.Default)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := func() (*actor.ActorSystem, *actor.PID, func(string) bool) {
		sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
		mgr, reg, err := Spawn(sys, Config{DataDir: dir, NodeID: 1, Advertise: "x", Logger: quiet, FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		return sys, mgr, func(name string) bool { return reg.Get(name) != nil }
	}
	create := func(sys *actor.ActorSystem, mgr *actor.PID) *heraldpb.Frame {
		res, err := sys.Root.RequestFuture(mgr, &heraldpb.Frame{Id: 1, Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{
			Name: "orders", Config: &heraldpb.TopicConfig{Partitions: 2}}}}, 20*time.Second).Result()
		if err != nil {
			t.Fatal(err)
		}
		return res.(*heraldpb.Frame)
	}

	sys, mgr, exists := start()
	fs.FailSync(0, nil) // every fsync fails, the catalog's too
	if f := create(sys, mgr); f.GetError().GetCode() != heraldpb.ErrorCode_STORAGE_ERROR {
		t.Fatalf("create with failing fsyncs = %v, want STORAGE_ERROR", f)
	}
	if exists("orders") {
		t.Fatal("the topic exists after its creation failed")
	}
	fs.Reset()
	if f := create(sys, mgr); f.GetError() != nil {
		t.Fatalf("create once the disk works = %v, want success (not TOPIC_ALREADY_EXISTS)", f.GetError())
	}
	_, _ = sys.Root.StopFuture(mgr).Result()
	sys.Shutdown()

	sys, mgr, exists = start()
	defer func() {
		_, _ = sys.Root.StopFuture(mgr).Result()
		sys.Shutdown()
	}()
	if !exists("orders") {
		t.Fatal("the topic created once the disk worked is gone after a restart")
	}
}
