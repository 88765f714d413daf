package partition

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
)

// BenchmarkTxnWriteOnce compares, on one replica with its log fsynced
// (RF=1, the default flush), 4 producers writing batches of 25 records of
// 1 KiB (a 100-record transaction's share of one of 4 partitions), 4
// requests in flight each: plainly, and as transactions written once (a
// transaction per batch: the batch, then, once it is answered, its commit
// marker). "txn": the producer sends the marker, which takes one of its 8
// slots; "txn-coord": the marker is sent outside the producer's slots, as
// the coordinator sends it, so the producer keeps 8 batches in flight. A
// record counts once its batch (plain) or its marker is answered. It
// reports records/s; compare the modes within one run:
//
//	go test ./actors/partition -run XXX -bench TxnWriteOnce -benchtime 20000x
func BenchmarkTxnWriteOnce(b *testing.B) {
	for _, mode := range []string{"plain", "txn", "txn-coord"} {
		b.Run(mode, func(b *testing.B) {
			sys := actor.NewActorSystem()
			reps := spawnGroupWith(b, sys, 1, nil)
			p := reps[0]
			deadline := time.Now().Add(10 * time.Second)
			for !p.stats.Idempotent.Load() {
				if time.Now().After(deadline) {
					b.Fatal("no leader")
				}
				time.Sleep(5 * time.Millisecond)
			}
			values := make([]string, 25)
			for i := range values {
				values[i] = string(make([]byte, 1024))
			}
			records := batchOf(values...)
			const producers, inFlight = 4, 8
			perProducer := max(1, b.N/producers/25)
			b.SetBytes(int64(len(records)) / 25)
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			errs := make(chan error, producers)
			for w := 0; w < producers; w++ {
				wg.Add(1)
				go func(pid uint64) {
					defer wg.Done()
					in := newInbox(sys)
					sent, done, outstanding := 0, 0, 0
					epoch := uint32(0)
					send := func(f *heraldpb.Frame) {
						sys.Root.RequestWithCustomSender(p.pid, f, in.pid)
						outstanding++
					}
					// pending markers to send once their batch is answered
					batchOf := map[uint64]uint32{} // frame id -> epoch
					for done < perProducer {
						for outstanding < inFlight && sent < perProducer {
							sent++
							var f *heraldpb.Frame
							if mode == "plain" {
								f = &heraldpb.Frame{Id: frameIDs.Add(1), Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Acks: heraldpb.Acks_ACKS_ALL, Records: records}}}
							} else {
								epoch++
								f = &heraldpb.Frame{Id: frameIDs.Add(1), Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "t", Acks: heraldpb.Acks_ACKS_ALL, Records: records,
									ProducerId: pid, ProducerEpoch: epoch, TxnBatch: true}}}
								batchOf[f.Id] = epoch
							}
							send(f)
						}
						var f *heraldpb.Frame
						select {
						case f = <-in.frames:
						case <-time.After(10 * time.Second):
							errs <- fmt.Errorf("producer %d: no answer", pid)
							return
						}
						if e := f.GetError(); e != nil {
							errs <- fmt.Errorf("producer %d: %v", pid, e)
							return
						}
						if ep, ok := batchOf[f.Id]; ok {
							delete(batchOf, f.Id)
							outstanding--
							m := markerFrame(pid, ep, true, 25)
							if mode == "txn-coord" {
								// The coordinator sends it: none of the
								// producer's slots.
								sys.Root.RequestWithCustomSender(p.pid, m, in.pid)
							} else {
								send(m)
							}
							continue
						}
						if mode != "txn-coord" {
							outstanding--
						}
						done++
					}
				}(uint64(w + 1))
			}
			wg.Wait()
			elapsed := time.Since(start)
			select {
			case err := <-errs:
				b.Fatal(err)
			default:
			}
			b.ReportMetric(float64(perProducer*producers*25)/elapsed.Seconds(), "records/s")
		})
	}
}
