//go:build !race

package cluster

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// BenchmarkReplicatedProduce: acks=all produce of batches of 16 records of
// 1 KiB to partition t-0, 64 requests in flight, with one replica (rf1) and
// with three replicas on three in-process cluster nodes talking through the
// transport (rf3: protoactor remote over loopback gRPC). Every replica
// fsyncs its own log on the same disk. Compare the two as a ratio within
// one run.
func BenchmarkReplicatedProduce(b *testing.B) {
	for _, rf := range []int{1, 3} {
		b.Run(fmt.Sprintf("rf%d", rf), func(b *testing.B) {
			leader, sys, stats := benchGroup(b, rf)
			rec := make([]byte, 1024)
			batch := &heraldpb.RecordBatch{}
			for i := 0; i < 16; i++ {
				batch.Records = append(batch.Records, &heraldpb.Record{Value: rec})
			}
			raw, _ := proto.Marshal(batch)
			b.SetBytes(int64(len(raw)))
			b.ResetTimer()
			sem := make(chan struct{}, 64)
			var wg sync.WaitGroup
			var failed sync.Once
			for i := 0; i < b.N; i++ {
				sem <- struct{}{}
				wg.Add(1)
				f := sys.Root.RequestFuture(leader, &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
					Topic: "t", Records: raw,
				}}}, 30*time.Second)
				go func() {
					defer wg.Done()
					res, err := f.Result()
					if err != nil || res.(*heraldpb.Frame).GetProduceResponse() == nil {
						failed.Do(func() { b.Errorf("produce: %v %v", err, res) })
					}
					<-sem
				}()
			}
			wg.Wait()
			b.StopTimer()
			// Every replica catches up with the leader: a follower left
			// behind (one that never got its appends) would make rf3 a
			// two-replica run.
			var hw int64
			for _, st := range stats {
				hw = max(hw, st.HighWatermark.Load())
			}
			deadline := time.Now().Add(10 * time.Second)
			for i := 0; i < len(stats); i++ {
				for stats[i].HighWatermark.Load() < hw {
					if time.Now().After(deadline) {
						b.Fatalf("replica %d stuck at %d of %d", i+1, stats[i].HighWatermark.Load(), hw)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
}

// benchGroup starts partition t-0 with rf replicas (on rf nodes when rf >
// 1) and returns its leader and the leader's local actor system.
func benchGroup(b *testing.B, rf int) (*actor.PID, *actor.ActorSystem, []*partition.Stats) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := b.TempDir()
	peers := map[uint64]*actor.PID{}
	for id := 1; id <= rf; id++ {
		peers[uint64(id)] = nil
	}
	type rep struct {
		pid   *actor.PID
		sys   *actor.ActorSystem
		stats *partition.Stats
	}
	var reps []rep
	var tc *testCluster
	if rf > 1 {
		tc = newTestCluster(b, rf)
	}
	for id := uint64(1); id <= uint64(rf); id++ {
		local := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
		cfg := partition.Config{Topic: "t", Partition: 0, ReplicaID: id, Peers: peers, Logger: quiet}
		if rf > 1 {
			nd, err := Start(Config{NodeID: id, Bind: tc.peers[id], HealthBind: tc.health[id], Peers: tc.peers, PeerHealth: tc.health,
				Local: local, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(nd.Stop)
			cfg.Transport = nd
			tc.nodes[id] = nd
		} else {
			cfg.Peers = map[uint64]*actor.PID{1: actor.NewPID(local.Address(), partition.Name("t", 0))}
		}
		rdir := filepath.Join(dir, fmt.Sprint(id))
		cfg.Open = func() (partition.Storage, error) {
			return persistence.Open(persistence.Options{Dir: rdir, Group: "t-0", Logger: quiet})
		}
		st := &partition.Stats{}
		props, err := partition.Props(local, cfg, st)
		if err != nil {
			b.Fatal(err)
		}
		pid, err := local.Root.SpawnNamed(props, partition.Name("t", 0))
		if err != nil {
			b.Fatal(err)
		}
		if rf > 1 {
			tc.nodes[id].Register(partition.Name("t", 0), pid)
		}
		reps = append(reps, rep{pid, local, st})
		b.Cleanup(func() { local.Root.StopFuture(pid).Wait(); local.Shutdown() })
	}
	var stats []*partition.Stats
	for _, r := range reps {
		stats = append(stats, r.stats)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, r := range reps {
			if r.stats.Writable.Load() {
				return r.pid, r.sys, stats
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("no leader")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
