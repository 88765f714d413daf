package partition

import (
	"errors"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
)

// ErrReadersBusy is returned by ReaderPool.Submit when its queue is full.
var ErrReadersBusy = errors.New("herald: log readers busy")

// ReaderPool reads batches from partition logs for fetches below the
// in-memory window, outside the partitions' mailboxes, and answers the
// fetching session directly. Its queue is bounded: Submit refuses work past
// it and the partition answers THROTTLED.
type ReaderPool struct {
	sys   *actor.ActorSystem
	queue chan readJob
	wg    sync.WaitGroup
	once  sync.Once
}

type readJob struct {
	store    Storage
	replyTo  *actor.PID
	frameID  uint64
	part     uint32
	offset   int64
	maxBytes int
	hw       int64
	start    int64
	done     func(records, bytes int)
	// A priority fetch: the records at these offsets, and where the
	// next read of their sub-queue starts.
	offsets []int64
	next    int64
}

// NewReaderPool starts workers goroutines with a queue of queueLen jobs.
func NewReaderPool(sys *actor.ActorSystem, workers, queueLen int) *ReaderPool {
	if workers <= 0 {
		workers = 2
	}
	if queueLen <= 0 {
		queueLen = 256
	}
	p := &ReaderPool{sys: sys, queue: make(chan readJob, queueLen)}
	for i := 0; i < workers; i++ {
		p.wg.Add(1)
		go p.work()
	}
	readerQueueDepth.Set(0)
	return p
}

// Submit queues a read; ErrReadersBusy when the queue is full.
func (p *ReaderPool) Submit(j readJob) error {
	select {
	case p.queue <- j:
		readerQueueDepth.Inc()
		return nil
	default:
		return ErrReadersBusy
	}
}

// Close stops the workers after the queued jobs.
func (p *ReaderPool) Close() {
	p.once.Do(func() { close(p.queue) })
	p.wg.Wait()
}

func (p *ReaderPool) work() {
	defer p.wg.Done()
	for j := range p.queue {
		readerQueueDepth.Dec()
		p.sys.Root.Send(j.replyTo, j.run())
	}
}

func (j readJob) run() *heraldpb.Frame {
	var (
		batches []*heraldpb.StoredBatch
		err     error
		next    int64
	)
	if j.offsets != nil {
		batches, next = pickRecords(j.offsets, j.next, j.maxBytes, func(o int64) []*heraldpb.StoredBatch {
			bs, rerr := j.store.ReadBatches(o, 1, j.hw)
			if rerr != nil && err == nil {
				err = rerr
			}
			return bs
		})
	} else {
		batches, err = j.store.ReadBatches(j.offset, j.maxBytes, j.hw)
	}
	if err != nil {
		return heraldpb.ErrorFrame(j.frameID, storageError(err))
	}
	if j.done != nil {
		recs, bytes := 0, 0
		for _, b := range batches {
			recs += int(b.Count)
			bytes += len(b.Records)
		}
		j.done(recs, bytes)
	}
	return &heraldpb.Frame{Id: j.frameID, Body: &heraldpb.Frame_FetchResponse{FetchResponse: &heraldpb.FetchResponse{
		Partition: j.part, HighWatermark: j.hw, LogStartOffset: j.start, Batches: batches, NextOffset: next,
	}}}
}
