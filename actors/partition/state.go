package partition

import (
	"sort"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
)

// window holds the most recent committed batches, in offset order, up to a
// byte budget. Tail readers are served from it without touching the log.
// Owned by the partition actor.
type window struct {
	batches []*heraldpb.StoredBatch
	bytes   int
	limit   int
}

func batchBytes(b *heraldpb.StoredBatch) int { return len(b.Records) + 32 }

// add appends a committed batch and evicts from the front past the budget.
// The newest batch always stays, even when it alone exceeds the budget.
func (w *window) add(b *heraldpb.StoredBatch) {
	w.batches = append(w.batches, b)
	w.bytes += batchBytes(b)
	drop := 0
	for w.bytes > w.limit && drop < len(w.batches)-1 {
		w.bytes -= batchBytes(w.batches[drop])
		w.batches[drop] = nil
		drop++
	}
	if drop > 0 {
		// Reslice, not copy: copying the whole window on every add made a
		// full window of small batches cost O(window) per append (a
		// profile of 50k small appends/s showed 19% of the broker there).
		// The dropped slots are nil; append reallocates to the live part
		// once the array's end is reached, so the cost is amortised O(1).
		w.batches = w.batches[drop:]
	}
}

// reset empties the window (after a leadership change truncated the log or
// a storage reopen).
func (w *window) reset() {
	clear(w.batches)
	w.batches = w.batches[:0]
	w.bytes = 0
}

// start is the first offset the window covers, or -1 when it is empty.
func (w *window) start() int64 {
	if len(w.batches) == 0 {
		return -1
	}
	return w.batches[0].BaseOffset
}

// covers reports whether offset is served by the window.
func (w *window) covers(offset int64) bool {
	s := w.start()
	return s >= 0 && offset >= s
}

// read returns the batches holding offsets from offset on, at least one, up
// to maxBytes. offset must be covered.
func (w *window) read(offset int64, maxBytes int) []*heraldpb.StoredBatch {
	i := sort.Search(len(w.batches), func(i int) bool {
		b := w.batches[i]
		return b.BaseOffset+int64(b.Count) > offset
	})
	var out []*heraldpb.StoredBatch
	size := 0
	for ; i < len(w.batches); i++ {
		b := w.batches[i]
		if len(out) > 0 && size+batchBytes(b) > maxBytes {
			break
		}
		out = append(out, b)
		size += batchBytes(b)
	}
	return out
}

// proposalKey identifies a proposal this replica made as leader: one leader
// per term, and each base offset is proposed once per term, so the entry with
// this term and base offset is the proposal and no other. A fence holds no
// offset (its base is the next record's): it is told apart by its epoch
// and fencer (fence.go), which data entries leave 0.
type proposalKey struct {
	term   uint64
	base   int64
	fence  uint64
	fencer heraldpb.Fencer
}

// proposal is a produce request waiting for its entry to be persisted or
// committed.
type proposal struct {
	replyTo    *actor.PID
	frameID    uint64
	acks       heraldpb.Acks
	count      uint32
	appendTime int64
	bytes      int
	// duplicate: replyTo is a retry of an idempotent batch already proposed
	// (its answer says so); dups are more such retries, answered with it.
	duplicate bool
	dups      []waiter
	// txnCommit: a transactional batch that commits its transaction here
	// once applied (ProduceRequest.commit_txn, a single-partition
	// transaction); answered with the commit marker's offsets. txnAfter:
	// its txn_commit_after + 1 (0: none).
	txnCommit bool
	txnAfter  uint64
	// txnEnd: a transaction end being proposed (txnLog.closing), commit or
	// abort.
	txnEnd heraldpb.TxnMarker
	// drained: its senders were told its bytes are held no more (a parked
	// commit's, onephase.go).
	drained bool
}

// waiter is a request to answer: its session and frame id.
type waiter struct {
	replyTo *actor.PID
	frameID uint64
}

// parkedFetch is a long-poll fetch waiting for data at offset.
type parkedFetch struct {
	seq      uint64
	replyTo  *actor.PID
	frameID  uint64
	offset   int64
	maxBytes int
}

// parking holds parked fetches in arrival order, bounded by limit.
type parking struct {
	fetches []parkedFetch
	limit   int
	nextSeq uint64
}

// park adds a fetch; false when full.
func (p *parking) park(f parkedFetch) (uint64, bool) {
	if len(p.fetches) >= p.limit {
		return 0, false
	}
	p.nextSeq++
	f.seq = p.nextSeq
	p.fetches = append(p.fetches, f)
	return f.seq, true
}

// take removes and returns the fetch with seq, if still parked.
func (p *parking) take(seq uint64) (parkedFetch, bool) {
	for i, f := range p.fetches {
		if f.seq == seq {
			p.fetches = append(p.fetches[:i], p.fetches[i+1:]...)
			return f, true
		}
	}
	return parkedFetch{}, false
}

// ready removes and returns the fetches whose offset is below hw.
func (p *parking) ready(hw int64) []parkedFetch {
	var out []parkedFetch
	kept := p.fetches[:0]
	for _, f := range p.fetches {
		if f.offset < hw {
			out = append(out, f)
		} else {
			kept = append(kept, f)
		}
	}
	clear(p.fetches[len(kept):])
	p.fetches = kept
	return out
}

// drain removes and returns every parked fetch.
func (p *parking) drain() []parkedFetch {
	out := p.fetches
	p.fetches = nil
	return out
}
