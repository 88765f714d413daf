package partition

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

var writerQueueDepth = promauto.NewGaugeVec(prometheus.GaugeOpts{
	Name: "herald_log_writer_queue_depth", Help: "Raft append messages waiting for the partition's log writer.",
}, labels)

// appendDone reports that a writer made a run of MsgStorageAppend messages
// durable (under the flush policy), or failed to.
type appendDone struct {
	gen       uint64           // the writer generation, to drop stale reports
	n         int              // messages covered
	entries   []raftpb.Entry   // entries now durable, for acks=leader
	responses []raftpb.Message // to deliver now that the writes are durable
	snapshot  *raftpb.Snapshot // the last snapshot written, to install before the responses
	err       error
}

// logWriter persists a partition's raft appends off the actor's mailbox:
// raft runs with AsyncStorageWrites, the actor hands each MsgStorageAppend
// to the writer, and the writer writes every message queued meanwhile, makes
// them durable with one fsync (group commit across Readies) and reports
// back. While it fsyncs, the actor keeps proposing, fetching and replying.
//
// Its queue is bounded (a full queue blocks the actor's submit until the
// writer catches up); raft's MaxUncommittedEntriesSize bounds the bytes
// behind it, past which producers get THROTTLED.
type logWriter struct {
	store Storage
	gen   uint64
	in    chan raftpb.Message
	done  chan struct{}
	send  func(appendDone)
	depth prometheus.Gauge
}

const maxWriterBatch = 256

func startWriter(store Storage, gen uint64, queue int, depth prometheus.Gauge, send func(appendDone)) *logWriter {
	w := &logWriter{store: store, gen: gen, in: make(chan raftpb.Message, queue), done: make(chan struct{}), send: send, depth: depth}
	go w.run()
	return w
}

// submit queues one MsgStorageAppend. Messages are written in order.
func (w *logWriter) submit(m raftpb.Message) {
	w.in <- m
	w.depth.Set(float64(len(w.in)))
}

// stop writes what is queued, then returns once the writer has exited.
func (w *logWriter) stop() {
	close(w.in)
	<-w.done
}

func (w *logWriter) run() {
	defer close(w.done)
	failed := false
	for m := range w.in {
		batch := []raftpb.Message{m}
	drain:
		for len(batch) < maxWriterBatch {
			select {
			case next, ok := <-w.in:
				if !ok {
					break drain
				}
				batch = append(batch, next)
			default:
				break drain
			}
		}
		w.depth.Set(float64(len(w.in)))
		if failed {
			continue // the actor is tearing the log down
		}
		res := appendDone{gen: w.gen, n: len(batch)}
		for i := range batch {
			if res.err = w.write(&batch[i]); res.err != nil {
				break
			}
			if sn := batch[i].Snapshot; sn != nil && !raft.IsEmptySnap(*sn) {
				res.snapshot = sn
			}
			res.entries = append(res.entries, batch[i].Entries...)
			res.responses = append(res.responses, batch[i].Responses...)
		}
		if res.err == nil {
			res.err = w.store.Flush()
		}
		if res.err != nil {
			failed = true
			res.entries, res.responses = nil, nil
		}
		w.send(res)
	}
}

// write applies one MsgStorageAppend: snapshot, hard state, entries.
func (w *logWriter) write(m *raftpb.Message) error {
	if m.Snapshot != nil && !raft.IsEmptySnap(*m.Snapshot) {
		if err := w.store.ApplySnapshot(*m.Snapshot); err != nil {
			return err
		}
	}
	hs := raftpb.HardState{Term: m.Term, Vote: m.Vote, Commit: m.Commit}
	if raft.IsEmptyHardState(hs) && len(m.Entries) == 0 {
		return nil
	}
	return w.store.Write(hs, m.Entries)
}
