package partition

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

var writerQueueDepth = promauto.NewGaugeVec(prometheus.GaugeOpts{
	Name: "herald_log_writer_queue_depth", Help: "Raft append messages waiting for the partition's log writer.",
}, labels)

// MaxSyncPace bounds Config.SyncPace: a sync held longer would add more
// to every acknowledgement than it saves.
const MaxSyncPace = 20 * time.Millisecond

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

// Reports of the writer's jobs (retain, onDeleteBefore, onRepair).
type (
	retained struct {
		gen uint64
		n   int64
		err error
	}
	deletedBefore struct {
		gen     uint64
		replyTo *actor.PID
		n       int64
		err     error
	}
	repaired struct {
		gen       uint64
		f         *heraldpb.Frame
		replyTo   *actor.PID
		err       error
		maxCommit uint64
	}
)

// logWriter persists a partition's raft appends off the actor's mailbox:
// raft runs with AsyncStorageWrites, the actor hands each MsgStorageAppend
// to the writer, and the writer writes every message queued meanwhile, makes
// them durable with one fsync (group commit across Readies) and reports
// back. While it fsyncs, the actor keeps proposing, fetching and replying.
//
// The writer is also the only goroutine that changes the log in other ways
// (retention, membership records, damage records): those run as jobs, in
// order with the appends, and report back by message, so the actor never
// waits on the log's write lock or an fsync.
//
// Its queue is bounded and submit never blocks: what does not fit waits in
// the actor's backlog (raft's own limits bound it: MaxInflightMsgs,
// MaxUncommittedEntriesSize), and while there is a backlog new produces are
// answered THROTTLED.
type logWriter struct {
	store Storage
	gen   uint64
	// pace is Config.SyncPace; lastSync is when the last sync began, and
	// entries the moving average of the entries a sync carried (the
	// writer's goroutine only).
	pace     time.Duration
	lastSync time.Time
	entries  float64
	in       chan writerItem
	done     chan struct{}
	send     func(any)
	depth    prometheus.Gauge
	// backlog holds what the full queue did not take, in order; the
	// actor's goroutine only (submit, do, drain).
	backlog []writerItem
}

// writerItem is an append, or a job run in order with the appends. A job
// is told whether the log failed earlier (it must not touch it then) and
// reports its own result.
type writerItem struct {
	msg raftpb.Message
	job func(failed bool)
}

const maxWriterBatch = 256

func startWriter(store Storage, gen uint64, queue int, pace time.Duration, depth prometheus.Gauge, send func(any)) *logWriter {
	w := &logWriter{store: store, gen: gen, pace: pace, in: make(chan writerItem, queue), done: make(chan struct{}), send: send, depth: depth}
	go w.run()
	return w
}

// submit queues one MsgStorageAppend; it never blocks. Actor only.
func (w *logWriter) submit(m raftpb.Message) { w.queue(writerItem{msg: m}) }

// do queues a job after everything queued so far; it never blocks. Actor
// only.
func (w *logWriter) do(job func(failed bool)) { w.queue(writerItem{job: job}) }

func (w *logWriter) queue(it writerItem) {
	if len(w.backlog) == 0 {
		select {
		case w.in <- it:
			w.depth.Set(float64(len(w.in)))
			return
		default:
		}
	}
	w.backlog = append(w.backlog, it)
	w.depth.Set(float64(len(w.in) + len(w.backlog)))
}

// drain moves what the queue has room for from the backlog. Actor only,
// after each report of the writer.
func (w *logWriter) drain() {
	for len(w.backlog) > 0 {
		select {
		case w.in <- w.backlog[0]:
			w.backlog[0] = writerItem{}
			w.backlog = w.backlog[1:]
		default:
			w.depth.Set(float64(len(w.in) + len(w.backlog)))
			return
		}
	}
	w.backlog = nil
	w.depth.Set(float64(len(w.in)))
}

// busy reports whether items wait in the backlog: the queue is full.
func (w *logWriter) busy() bool { return len(w.backlog) > 0 }

// stop writes what is queued, then returns once the writer has exited.
// It may wait for the writer (the actor is stopping).
func (w *logWriter) stop() {
	for _, it := range w.backlog {
		w.in <- it
	}
	w.backlog = nil
	close(w.in)
	<-w.done
}

func (w *logWriter) run() {
	defer close(w.done)
	failed := false
	for it := range w.in {
		w.hold()
		items := []writerItem{it}
	drain:
		for len(items) < maxWriterBatch {
			select {
			case next, ok := <-w.in:
				if !ok {
					break drain
				}
				items = append(items, next)
			default:
				break drain
			}
		}
		var batch []raftpb.Message
		for _, it := range items {
			if it.job == nil {
				batch = append(batch, it.msg)
				continue
			}
			failed = w.flush(batch, failed)
			batch = nil
			it.job(failed)
		}
		failed = w.flush(batch, failed)
	}
}

// paceFrom is the average of entries per sync from which the writer
// paces its syncs: appends arrive faster than one a sync, concurrently.
const paceFrom = 2

// hold waits, before the writer takes what is queued, until its sync
// pace lets the next sync begin: only while its syncs carry paceFrom
// entries or more on average (appends arrive concurrently, faster than
// the syncs), and no longer than the pace after the last sync began.
// What arrives meanwhile joins the next sync. Under a lighter load (one
// entry a sync, the average falling back) nothing is held, nor when a
// whole batch waits already (the writer is behind: holding would only
// cap it).
func (w *logWriter) hold() {
	if w.pace <= 0 || w.entries < paceFrom || len(w.in) >= maxWriterBatch-1 {
		return
	}
	if wait := time.Until(w.lastSync.Add(w.pace)); wait > 0 {
		time.Sleep(wait)
		syncsPaced.Inc()
		syncPacedSeconds.Add(wait.Seconds())
	}
}

// flush writes a run of appends, makes them durable with one Flush and
// reports; it returns whether the log has failed.
func (w *logWriter) flush(batch []raftpb.Message, failed bool) bool {
	if len(batch) == 0 || failed {
		return failed // after a failure the actor is tearing the log down
	}
	res := appendDone{gen: w.gen, n: len(batch)}
	w.lastSync = time.Now()
	var run appendRun
	for i := range batch {
		m := &batch[i]
		if !run.add(m) {
			if res.err = run.write(w.store); res.err != nil {
				break
			}
			if !run.add(m) { // (a snapshot: alone)
				if res.err = w.write(m); res.err != nil {
					break
				}
			}
		}
		if sn := m.Snapshot; sn != nil && !raft.IsEmptySnap(*sn) {
			res.snapshot = sn
		}
		res.entries = append(res.entries, m.Entries...)
		res.responses = append(res.responses, m.Responses...)
	}
	if res.err == nil {
		res.err = run.write(w.store)
	}
	if res.err == nil {
		res.err = w.store.Flush()
	}
	if res.err != nil {
		failed = true
		res.entries, res.responses = nil, nil
	}
	w.entries += (float64(len(res.entries)) - w.entries) / 8 // (the sync pace's moving average)
	w.send(res)
	return failed
}

// appendRun merges consecutive MsgStorageAppends into one Storage.Write
// (one write to the WAL, not one per Ready): those without a snapshot whose
// entries follow each other and whose hard states keep the same term and
// vote, so a new term or vote is still written before the entries that
// follow it, as Write orders them.
type appendRun struct {
	hs      raftpb.HardState
	entries []raftpb.Entry
	merged  bool // entries is a copy of its own
}

// add merges m into the run, and reports whether it did (false: write
// the run, then m alone).
func (r *appendRun) add(m *raftpb.Message) bool {
	if m.Snapshot != nil && !raft.IsEmptySnap(*m.Snapshot) {
		return false
	}
	hs := raftpb.HardState{Term: m.Term, Vote: m.Vote, Commit: m.Commit}
	empty := raft.IsEmptyHardState(hs)
	switch {
	case !empty && !raft.IsEmptyHardState(r.hs) && (hs.Term != r.hs.Term || hs.Vote != r.hs.Vote):
		return false
	case !empty && raft.IsEmptyHardState(r.hs) && len(r.entries) > 0:
		return false // (its term or vote may be new: written before its entries)
	case len(r.entries) > 0 && len(m.Entries) > 0 && m.Entries[0].Index != r.entries[len(r.entries)-1].Index+1:
		return false
	}
	if !empty {
		r.hs = hs
	}
	switch {
	case len(m.Entries) == 0:
	case len(r.entries) == 0:
		r.entries = m.Entries
	default:
		if !r.merged {
			r.entries, r.merged = append(make([]raftpb.Entry, 0, len(r.entries)+len(m.Entries)), r.entries...), true
		}
		r.entries = append(r.entries, m.Entries...)
	}
	return true
}

// write writes the run and empties it.
func (r *appendRun) write(s Storage) error {
	hs, entries := r.hs, r.entries
	*r = appendRun{}
	if raft.IsEmptyHardState(hs) && len(entries) == 0 {
		return nil
	}
	return s.Write(hs, entries)
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
