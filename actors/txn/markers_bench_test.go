package txn

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// BenchmarkWriteOnceTxn: in process, one node's coordinator and a topic of
// 4 partitions (RF=1, fsynced), 4 producers writing 1 KiB records in
// transactions of 100 records over the 4 partitions (25 each), written
// once: each transaction's 4 batches, then its commit listing them (one
// decision in __txn, then the markers). A producer keeps two
// transactions' batches in flight (8 batches, as many as the plain run),
// and sends a transaction's commit once its batches are answered: "txn"
// with one commit in flight (the next waits for its answer), "txn-piped"
// with up to 8 (queued behind the one being decided, decided together). Against "plain": the same
// batches as plain acks=all produces, 8 in flight per producer. A run ends
// when every record is readable. It reports records/s; compare the modes
// within one run:
//
//	go test ./actors/txn -run XXX -bench WriteOnceTxn -benchtime 100000x
func BenchmarkWriteOnceTxn(b *testing.B) {
	for _, mode := range []string{"plain", "txn", "txn-piped"} {
		b.Run(mode, func(b *testing.B) {
			depth := 1 // commits in flight per producer
			if mode == "txn-piped" {
				depth = 8
			}
			r := newRig(b, b.TempDir(), Options{})
			r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_CreateTopic{CreateTopic: &heraldpb.CreateTopicRequest{Name: "w", Config: &heraldpb.TopicConfig{Partitions: 4}}}}, r.mgr)
			waitFor(b, "topic w writable", func() error {
				e := r.reg.Get("w")
				if e == nil {
					return fmt.Errorf("no topic")
				}
				for p, s := range e.Stats {
					if !s.Writable.Load() || !s.Idempotent.Load() {
						return fmt.Errorf("partition %d not ready", p)
					}
				}
				return nil
			})
			e := r.reg.Get("w")
			rb := &heraldpb.RecordBatch{}
			for range 25 {
				rb.Records = append(rb.Records, &heraldpb.Record{Value: make([]byte, 1024)})
			}
			records, _ := proto.Marshal(rb)
			const producers = 4
			txns := max(1, b.N/producers/100)
			total := int64(txns * producers * 100)
			b.SetBytes(1024)
			ask := func(to int, f *heraldpb.Frame) func() *heraldpb.Frame {
				fut := r.sys.Root.RequestFuture(e.Writer(to), f, 20*time.Second)
				return func() *heraldpb.Frame {
					res, err := fut.Result()
					if err != nil {
						return heraldpb.ErrorFrame(0, heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "%v", err))
					}
					return res.(*heraldpb.Frame)
				}
			}
			var commitNs, commitCount atomic.Int64
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			errs := make(chan error, producers)
			for w := range producers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if mode == "plain" {
						var inflight []func() *heraldpb.Frame
						for i := range txns * 4 {
							part := uint32(i % 4)
							inflight = append(inflight, ask(int(part), &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
								Topic: "w", Partition: &part, Acks: heraldpb.Acks_ACKS_ALL, Records: records}}}))
							if len(inflight) == 8 || i == txns*4-1 {
								for _, wait := range inflight {
									if f := wait(); f.GetError() != nil {
										errs <- fmt.Errorf("produce: %v", f.GetError())
										return
									}
								}
								inflight = inflight[:0]
							}
						}
						return
					}
					init := r.ok(&heraldpb.Frame{Body: &heraldpb.Frame_InitProducerId{InitProducerId: &heraldpb.InitProducerIdRequest{TransactionalId: fmt.Sprintf("bench-%d", w)}}}, r.txn).GetInitProducerIdResponse()
					pid, next := init.ProducerId, init.ProducerEpoch
					type txnInFlight struct {
						epoch   uint32
						batches []func() *heraldpb.Frame
					}
					type commitInFlight struct {
						epoch uint32
						sent  time.Time
						fut   *actor.Future
					}
					var queue []txnInFlight
					var commits []commitInFlight
					// awaitCommit waits for the oldest commit in flight.
					awaitCommit := func() bool {
						cf := commits[0]
						commits = commits[1:]
						res, err := cf.fut.Result()
						commitNs.Add(int64(time.Since(cf.sent)))
						commitCount.Add(1)
						if err != nil {
							errs <- err
							return false
						}
						f := res.(*heraldpb.Frame)
						if r := f.GetEndTxnResponse(); r == nil || r.NextEpoch != cf.epoch+1 {
							errs <- fmt.Errorf("commit of epoch %d: %v", cf.epoch, f)
							return false
						}
						return true
					}
					// sendCommit sends t's commit once its batches are answered,
					// with at most `depth` commits in flight.
					sendCommit := func(t txnInFlight) bool {
						for _, bw := range t.batches {
							if f := bw(); f.GetError() != nil {
								errs <- fmt.Errorf("batch: %v", f.GetError())
								return false
							}
						}
						for len(commits) >= depth {
							if !awaitCommit() {
								return false
							}
						}
						var written []*heraldpb.TxnWritten
						for p := range uint32(4) {
							written = append(written, &heraldpb.TxnWritten{Topic: "w", Partition: p, Records: 25})
						}
						commits = append(commits, commitInFlight{epoch: t.epoch, sent: time.Now(), fut: r.sys.Root.RequestFuture(r.txn, &heraldpb.Frame{Body: &heraldpb.Frame_EndTxn{EndTxn: &heraldpb.EndTxnRequest{
							TransactionalId: fmt.Sprintf("bench-%d", w), ProducerId: pid, ProducerEpoch: t.epoch, Commit: true, Written: written}}}, 20*time.Second)})
						return true
					}
					for range txns {
						t := txnInFlight{epoch: next}
						next++
						for p := range uint32(4) {
							part := p
							t.batches = append(t.batches, ask(int(p), &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
								Topic: "w", Partition: &part, Acks: heraldpb.Acks_ACKS_ALL, Records: records, ProducerId: pid, ProducerEpoch: t.epoch, TxnBatch: true}}}))
						}
						queue = append(queue, t)
						if len(queue) == 2 {
							if !sendCommit(queue[0]) {
								return
							}
							queue = queue[1:]
						}
					}
					for _, t := range queue {
						if !sendCommit(t) {
							return
						}
					}
					for len(commits) > 0 {
						if !awaitCommit() {
							return
						}
					}
				}()
			}
			wg.Wait()
			select {
			case err := <-errs:
				b.Fatal(err)
			default:
			}
			waitFor(b, "every record readable", func() error {
				var hw int64
				for _, s := range e.Stats {
					hw += s.HighWatermark.Load()
				}
				if hw != total {
					return fmt.Errorf("%d of %d", hw, total)
				}
				return nil
			})
			b.ReportMetric(float64(total)/time.Since(start).Seconds(), "records/s")
			if n := commitCount.Load(); n > 0 {
				b.ReportMetric(float64(commitNs.Load())/float64(n)/1e6, "ms/commit")
			}
		})
	}
}
