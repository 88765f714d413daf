package partition

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/mailbox"
	"github.com/heraldmq/herald/internal/dispatch"
	"github.com/heraldmq/herald/internal/raftwire"
	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Stats is a partition's state published for admin requests and metrics.
// The actor writes it; anyone may read it.
type Stats struct {
	StartOffset   atomic.Int64
	HighWatermark atomic.Int64
	EndOffset     atomic.Int64
	SizeBytes     atomic.Int64
	// BytesOut counts the record bytes this replica has answered fetches
	// with (clients' pulls and the consumer groups' reads for their
	// pushes), since it started.
	BytesOut atomic.Int64
	// Leader is the node id of the group's leader as this replica knows
	// it (0: unknown): heraldpb.ReplicaNode of its raft id.
	Leader atomic.Uint64
	Term   atomic.Uint64
	// Writable is true while this replica leads and accepts produce
	// requests (its log is written up to its election).
	Writable atomic.Bool
	// Quiesced is true while the replica's group is quiesced (quiesce.go).
	Quiesced atomic.Bool
	// Conf is the group's membership as this replica last applied it.
	Conf atomic.Pointer[raftpb.ConfState]
	// Idempotent is true while this replica leads and accepts idempotent
	// produce requests: it is Writable, has applied every entry of earlier
	// terms and has its producer table complete.
	Idempotent atomic.Bool
	// InSync is, while this replica leads, the node ids of the replicas in
	// sync with it (itself included; see inSync), sorted; nil otherwise.
	InSync atomic.Pointer[[]uint32]
	// PriorityEnd[l] is the offset after the last record of priority l
	// (1-9) in the partition's sub-queue of that level, 0 when it has none
	// or while the sub-queues are being rebuilt after an open.
	PriorityEnd [Levels]atomic.Int64
}

// writerGens numbers log writers process-wide.
var writerGens atomic.Uint64

// Messages the actor sends itself. They never leave the node.
type (
	readyMsg      struct{}
	fetchDeadline struct{ seq uint64 }
)

// Actor is one replica of one partition. Create it with Props.
type Actor struct {
	cfg   Config
	sys   *actor.ActorSystem
	stats *Stats
	mb    *mailbox.Shedding
	m     *partMetrics
	log   *slog.Logger

	self   *actor.PID
	store  Storage
	rn     *raft.RawNode
	writer *logWriter
	gen    uint64 // writer generation: bumped on every (re)open

	appendsQueued int  // MsgStorageAppend messages the writer has not reported
	stampReady    bool // leader's tail is known: its whole log is written

	isLeader bool
	leader   uint64
	term     uint64 // the term this replica leads in, while isLeader
	tail     int64  // offset after the last entry in the raft log, proposals included
	hw       int64  // offset after the last applied (committed) record
	applied  uint64

	pending map[proposalKey]proposal
	win     window
	park    parking

	readyQueued  bool
	campaignSoon bool
	tickQueued   atomic.Bool
	elapsed      atomic.Int64 // tick periods since the last tick message
	lastRetain   int          // tick of the last retention check
	sleeping     atomic.Bool  // quiesced, as the ticker goroutine sees it
	cancelTick   func()       // stops this replica's ticks (ticker.go)
	ticks        int
	lastActive   int               // tick of the last produce, fetch or raft message
	heard        map[uint64]int    // tick of the last raft message from each replica
	quiesced     bool              // idle: raft's clock stands still (quiesce.go)
	quiesceAt    *heraldpb.Quiesce // a leader's quiesce, taken once applied
	lastBusy     int               // tick of the last proposal, or of becoming leader
	released     bool              // caches dropped while idle

	failure      error // last storage failure while store == nil
	reopenAt     time.Time
	reopenBackup time.Duration

	prio        prioIndex     // the priority sub-queues
	prioThrough int64         // the offset the saved index file is complete up to
	prioStop    chan struct{} // closed to stop the catch-up read
	prioAck     chan struct{} // the actor took a catch-up chunk
	prioRun     uint64        // numbers the catch-up reads of this actor

	// Transactions written once (txnlog.go), and the sessions replaced
	// (zombie.go).
	txn      txnLog
	sessions sessionFences

	// Idempotent producers (idempotence.go).
	producers *producerTable           // committed batches of idempotent producers
	inflight  map[uint64][]inflightSeq // this leader's idempotent proposals not applied yet, by producer
	// txnProposed is the highest epoch of each fencer this leader proposed
	// in its term (fence.go); fencing is each fencer's fence proposed and
	// not applied yet, if any.
	txnProposed    epochList
	fencing        [heraldpb.NumFencers]*proposalKey
	prodEpochFloor epochList     // the epochs the table had (or its file) before a rebuild
	termApplied    bool          // the leader applied an entry of its own term
	appliedTerm    uint64        // term of the entry at applied
	prodLoading    bool          // the table is being read from the log; producers holds what was applied since
	prodRun        uint64        // numbers the table reads of this actor
	prodStop       chan struct{} // closed to stop the read
	prodDirty      bool          // changed since the last save
	prodSaving     bool          // a save is writing the file
	prodSavedIndex uint64        // the raft index the last save covered
	prodLastSave   int           // actor tick of the last save

	// Moving the group to other replicas (reassign.go).
	joined         map[uint64]string   // the move that started each node's replica, by node id (SetTarget)
	joining        map[uint64]joinSeen // empty replicas' announcements, by raft id (reassign.go)
	stale          map[uint64]bool     // nodes that now run another incarnation under the same raft id
	lastAnnounce   int                 // tick of this (empty, joining) replica's last announcement
	resetAsked     map[uint64]int      // leader: tick a follower that lost entries was last reset (damage.go)
	restartRaft    bool                // leader: give the leadership up by starting raft again (damage.go)
	leaderSeenTick int                 // last tick a leader was known (damage.go)
	clearing       bool                // the writer is clearing the damage record (damage.go)
	target         []uint64            // the replica set the group moves to, by raft id; nil: none
	targetStep     int                 // tick of the last step taken towards it
	targetTransfer bool                // leadership was handed to the target's first replica

	// Batches committed but not readable yet (hold.go).
	holds       []hold
	holdTimerAt time.Time // the time the armed timer is for (zero: none)
	holdGen     uint64    // numbers the timers: only the last one counts
	// When held entries not applied yet reached this replica (the
	// leader's receipt, a follower's arrival): their holds run from then.
	heldFrom map[holdKey]time.Time
}

// Props returns the props of a partition replica actor. sys answers shed
// requests; stats receives the published state (it may be shared across
// restarts, and is never nil).
func Props(sys *actor.ActorSystem, cfg Config, stats *Stats) (*actor.Props, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Readers == nil {
		cfg.Readers = NewReaderPool(sys, 2, 256)
	}
	m := newPartMetrics(cfg.Topic, cfg.Partition)
	retry := uint32(cfg.ThrottleRetryAfter / time.Millisecond)
	mb := mailbox.New(cfg.MailboxLimit, func(msg interface{}) bool {
		env, ok := msg.(*actor.MessageEnvelope)
		if !ok || env.Sender == nil {
			return false
		}
		f, ok := env.Message.(*heraldpb.Frame)
		if !ok {
			return false
		}
		switch f.Body.(type) {
		case *heraldpb.Frame_Produce, *heraldpb.Frame_Fetch, *heraldpb.Frame_ListOffsets:
		default:
			return false
		}
		e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "partition %s-%d is saturated", cfg.Topic, cfg.Partition)
		e.RetryAfterMs = retry
		sys.Root.Send(env.Sender, heraldpb.ErrorFrame(f.Id, e))
		m.throttled.Inc()
		return true
	})
	producer := func() actor.Actor {
		return &Actor{cfg: cfg, sys: sys, stats: stats, mb: mb, m: m,
			log: cfg.Logger.With("topic", cfg.Topic, "partition", cfg.Partition, "replica", cfg.ReplicaID)}
	}
	return actor.PropsFromProducer(producer, actor.WithMailbox(mb.Producer()), actor.WithDispatcher(dispatch.Shared())), nil
}

// Receive is the actor's one entry point.
func (a *Actor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.onStarted(ctx)
	case *actor.Stopping:
		a.onStopping(ctx, heraldpb.NewError(heraldpb.ErrorCode_SHUTTING_DOWN, "partition %s-%d is stopping", a.cfg.Topic, a.cfg.Partition))
	case *actor.Restarting:
		a.onStopping(ctx, heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "partition %s-%d is restarting after a failure", a.cfg.Topic, a.cfg.Partition))
	case *heraldpb.Tick:
		a.onTick(ctx)
	case *raftwire.Message:
		a.active()
		a.onRaftMessage(m)
	case readyMsg:
		a.onReady(ctx)
	case appendDone:
		a.onAppended(ctx, m)
	case retained:
		a.onRetained(m)
	case deletedBefore:
		a.onDeletedBefore(ctx, m)
	case repaired:
		a.onRepaired(ctx, m)
	case fetchDeadline:
		a.onFetchDeadline(ctx, m)
	case heldDue:
		a.onHeldDue(ctx, m)
	case *DeleteBefore:
		a.onDeleteBefore(ctx, m)
	case *ChangeMembership:
		a.onChangeMembership(ctx, m)
	case *SetTarget:
		a.onSetTarget(m)
	case prioChunk:
		a.onPrioChunk(m)
	case prioSaved:
		a.onPrioSaved(m)
	case producersLoaded:
		a.onProducersLoaded(ctx, m)
	case producersSaved:
		a.onProducersSaved(m)
	case flushMarkersMsg:
		a.txn.flushQueued = false
		a.flushMarkers(ctx)
	case *heraldpb.Frame:
		a.active()
		switch m.Body.(type) {
		case *heraldpb.Frame_Produce:
			a.onProduce(ctx, m)
		case *heraldpb.Frame_Fetch:
			a.onFetch(ctx, m)
		case *heraldpb.Frame_ListOpenTxns:
			a.onListOpenTxns(ctx, m)
		case *heraldpb.Frame_ListOffsets:
			a.onListOffsets(ctx, m)
		case *heraldpb.Frame_RepairPartition:
			a.onRepair(ctx, m)
		default:
			a.reply(ctx, ctx.Sender(), heraldpb.ErrorFrame(m.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "partition actors do not handle %T", m.Body)))
		}
	}
	if len(a.holds) > 0 && !a.cfg.Clock.Now().Before(a.holds[0].until) {
		// Due before its timer got through (a busy node): release now.
		a.releaseHolds(ctx)
	}
	if a.rn != nil && !a.readyQueued && a.rn.HasReady() {
		// Handle Ready after the messages already queued: every produce that
		// arrived meanwhile joins the same Ready and so the same fsync.
		a.readyQueued = true
		ctx.Send(ctx.Self(), readyMsg{})
	}
}

func (a *Actor) onStarted(ctx actor.Context) {
	a.self = ctx.Self()
	a.pending = make(map[proposalKey]proposal)
	a.win = window{limit: a.cfg.WindowBytes}
	a.park = parking{limit: a.cfg.MaxParkedFetches}
	a.startTicker()
	if err := a.open(); err != nil {
		a.storageFailed(ctx, err)
	}
}

// open opens the log and starts a raft node on it.
func (a *Actor) open() error {
	store, err := a.cfg.Open()
	if err != nil {
		return err
	}
	hs, cs, err := store.InitialState()
	if err != nil {
		store.Close()
		return err
	}
	first, err := store.FirstIndex()
	if err != nil {
		store.Close()
		return err
	}
	last, err := store.LastIndex()
	if err != nil {
		store.Close()
		return err
	}
	var storage raft.Storage = store
	if len(cs.Voters) == 1 && cs.Voters[0] == a.cfg.ReplicaID && hs.Commit < last {
		// A lone voter's persisted entries are all committed (its quorum is
		// itself), but the log persists commit lazily: restore it now so
		// the high watermark does not step back across a restart.
		hs.Commit = last
		storage = committedStorage{Storage: store, hs: hs}
	}
	applied := hs.Commit
	if applied < first-1 {
		applied = first - 1
	}
	storage = epochSnapshots{Storage: storage, a: a}
	rc := &raft.Config{
		ID:                        a.cfg.ReplicaID,
		ElectionTick:              a.cfg.ElectionTicks,
		HeartbeatTick:             a.cfg.HeartbeatTicks,
		Storage:                   storage,
		Applied:                   applied,
		MaxSizePerMsg:             1 << 20,
		MaxCommittedSizePerReady:  16 << 20,
		MaxUncommittedEntriesSize: a.cfg.MaxUncommittedBytes,
		MaxInflightMsgs:           256,
		CheckQuorum:               true,
		PreVote:                   true,
		StepDownOnRemoval:         true,
		Logger:                    raftLogger{a.log},
		AsyncStorageWrites:        true,
	}
	rn, err := raft.NewRawNode(rc)
	if err != nil {
		store.Close()
		return err
	}
	voters := cs.Voters
	bootstrap := last == 0 && len(cs.Voters) == 0 && !a.cfg.Join
	if bootstrap {
		peers := make([]raft.Peer, 0, len(a.cfg.Peers))
		voters = voters[:0]
		for id := range a.cfg.Peers {
			peers = append(peers, raft.Peer{ID: id})
			voters = append(voters, id)
		}
		sort.Slice(peers, func(i, j int) bool { return peers[i].ID < peers[j].ID })
		if err := rn.Bootstrap(peers); err != nil {
			store.Close()
			return err
		}
	}
	a.store, a.rn = store, rn
	// Generations are unique across actor restarts too: a restarted actor
	// keeps its mailbox, which may still hold its predecessor's reports.
	a.gen = writerGens.Add(1)
	gen, sys, self := a.gen, a.sys, a.self
	a.writer = startWriter(store, gen, a.cfg.WriterQueue, a.cfg.SyncPace, a.m.writerQueue, func(m any) { sys.Root.Send(self, m) })
	a.appendsQueued, a.stampReady, a.clearing = 0, false, false
	a.applied = applied
	// (never below the log's start: retention that cut a transaction's
	// span starts the log after it and keeps entries below until its next
	// truncation)
	a.hw = max(a.endOffsetAt(applied), store.StartOffset())
	a.holds = nil
	a.heldFrom = nil // (what follows is applied again, held from then)
	if err := a.restoreHolds(); err != nil {
		a.store, a.rn = nil, nil
		a.stopWriter()
		store.Close()
		return err
	}
	a.tail = store.NextOffset()
	a.isLeader, a.leader = false, 0
	a.win.reset()
	a.failure = nil
	a.reopenBackup = 0
	// A lone voter need not wait out an election timeout: it campaigns once
	// its first Ready (which applies a fresh group's bootstrap conf change)
	// has been handled.
	a.campaignSoon = (len(voters) == 1 && voters[0] == a.cfg.ReplicaID) || (bootstrap && a.cfg.Campaign)
	a.stats.Conf.Store(&cs)
	a.openPrio()
	a.openProducers(applied)
	if err := a.openTxnLog(applied); err != nil {
		a.store, a.rn = nil, nil
		a.stopWriter()
		store.Close()
		return err
	}
	a.publish()
	return nil
}

// endOffsetAt is the offset after the last record in entries up to index.
func (a *Actor) endOffsetAt(index uint64) int64 {
	first, _ := a.store.FirstIndex()
	for i := index; i >= first && i > 0; i-- {
		ents, err := a.store.Entries(i, i+1, 1<<62)
		if err != nil || len(ents) == 0 {
			break
		}
		if base, count, ok := entryOffsets(ents[0]); ok {
			return base + int64(count)
		}
	}
	return a.store.StartOffset()
}

func (a *Actor) onStopping(ctx actor.Context, why *heraldpb.Error) {
	if a.cancelTick != nil {
		a.cancelTick()
		a.cancelTick = nil
	}
	a.stopCatchUp()
	a.stopProducerLoad()
	if a.store != nil {
		a.saveTxnState()
		a.savePrio(true)
		a.saveProducers(true)
	}
	a.failPending(ctx, why)
	a.dropHolds(ctx)
	for _, f := range a.park.drain() {
		a.answerFetch(ctx, f.replyTo, f.frameID, nil)
	}
	a.stopWriter()
	if a.store != nil {
		if err := a.store.Close(); err != nil {
			a.log.Error("closing log", "err", err)
		}
		a.store, a.rn = nil, nil
	}
}

// stopWriter lets the log writer finish what is queued and exit.
func (a *Actor) stopWriter() {
	if a.writer != nil {
		a.writer.stop()
		a.writer = nil
	}
}

func (a *Actor) startTicker() {
	self, sys := a.self, a.sys
	a.cancelTick = subscribeTick(a.cfg.TickInterval, func() {
		// A quiesced replica needs a tick only now and then (liveness,
		// retention, idle release): the periods add up in elapsed and one
		// message carries them.
		n := a.elapsed.Add(1)
		if a.sleeping.Load() && n < quiescedTickEvery {
			return
		}
		// At most one tick queued: a stalled actor does not pile them up.
		if a.tickQueued.CompareAndSwap(false, true) {
			sys.Root.Send(self, &heraldpb.Tick{})
		}
	})
}

func (a *Actor) onTick(ctx actor.Context) {
	a.tickQueued.Store(false)
	a.ticks += int(max(1, a.elapsed.Swap(0)))
	a.m.mailbox.Set(float64(a.mb.Depth()))
	if a.rn == nil {
		if a.cfg.Clock.Now().After(a.reopenAt) {
			if err := a.open(); err != nil {
				a.storageFailed(ctx, err)
			} else {
				a.log.Info("log reopened after storage failure")
			}
		}
		return
	}
	if err := a.store.ReadCorruption(); err != nil {
		// A read found corrupt data: reopen, and the open handles the
		// damage (quarantine, read-only or rebuild).
		a.storageFailed(ctx, err)
		a.reopenAt = a.cfg.Clock.Now()
		return
	}
	a.writer.drain()
	if a.restartRaft {
		// A follower lost entries and no voter could take the leadership
		// over (damage.go): a new term, from this replica's log.
		a.restartRaft = false
		a.closeLog(ctx, heraldpb.NewError(heraldpb.ErrorCode_NOT_LEADER, "partition %s-%d: the leader is starting a new term", a.cfg.Topic, a.cfg.Partition))
		a.reopenAt = a.cfg.Clock.Now()
		return
	}
	a.checkRebuilt()
	if len(a.txn.parked) > 0 {
		a.expireParked(ctx, nil)
	}
	if a.leader != 0 {
		a.leaderSeenTick = a.ticks
	}
	if a.quiesced {
		a.quiescedTick()
	} else {
		a.rn.Tick()
		a.maybeQuiesce()
	}
	a.stepTarget()
	a.announce()
	a.releaseHolds(ctx) // (the timer's backup)
	if every := max(1, int(a.cfg.RetentionCheck/a.cfg.TickInterval)); a.ticks-a.lastRetain >= every {
		a.lastRetain = a.ticks
		a.retain()
	}
	if idle := max(1, int(a.cfg.IdleRelease/a.cfg.TickInterval)); !a.released && a.ticks-a.lastActive >= idle {
		a.release()
	}
	if every := max(1, int(a.cfg.IndexSaveInterval/a.cfg.TickInterval)); a.ticks-a.prio.lastSave >= every {
		a.saveTxnState()
		a.savePrio(false)
	}
	if every := max(1, int(a.cfg.IndexSaveInterval/a.cfg.TickInterval)); a.ticks-a.prodLastSave >= every {
		a.saveProducers(false)
	}
	a.publish()
}

// retain has the writer truncate the front of the log by the retention
// settings (job); onRetained takes the result.
func (a *Actor) retain() {
	if a.cfg.RetentionAge == 0 && a.cfg.RetentionBytes == 0 {
		return
	}
	store, gen, send := a.store, a.gen, a.writer.send
	now, age, bytes, applied := a.cfg.Clock.Now(), a.cfg.RetentionAge, a.cfg.RetentionBytes, a.retainUpTo()
	a.writer.do(func(failed bool) {
		if failed {
			return
		}
		n, err := store.Retain(now, age, bytes, applied)
		send(retained{gen: gen, n: n, err: err})
	})
}

func (a *Actor) onRetained(m retained) {
	if m.gen != a.gen || a.store == nil {
		return
	}
	a.writer.drain()
	if m.err != nil {
		a.log.Error("retention", "err", m.err)
		return
	}
	if m.n > 0 {
		a.log.Info("retention removed records", "records", m.n, "log_start", a.store.StartOffset())
		a.trimmed()
	}
}

// trimmed follows a truncation of the log's front: the window and the
// priority sub-queues forget what is gone.
func (a *Actor) trimmed() {
	if s := a.store.StartOffset(); a.win.start() >= 0 && a.win.start() < s {
		a.win.reset()
	}
	a.prio.trim(a.store.StartOffset())
	a.publishPrio()
	a.publish()
}

// DeleteBefore asks a partition actor to remove the records below Offset
// (whole log entries; see persistence.Log.DeleteBefore), as compaction of an
// internal topic does once they are superseded. The answer is a
// DeleteBeforeResult.
type DeleteBefore struct{ Offset int64 }

// DeleteBeforeResult answers DeleteBefore.
type DeleteBeforeResult struct {
	Removed int64
	Err     error
}

// onDeleteBefore has the writer delete the log's front up to m.Offset
// (job); onDeletedBefore answers the requester.
func (a *Actor) onDeleteBefore(ctx actor.Context, m *DeleteBefore) {
	if a.store == nil {
		ctx.Respond(&DeleteBeforeResult{Err: fmt.Errorf("partition %s-%d: storage unavailable", a.cfg.Topic, a.cfg.Partition)})
		return
	}
	store, gen, send, replyTo := a.store, a.gen, a.writer.send, ctx.Sender()
	off, applied := min(m.Offset, a.hw), a.retainUpTo()
	a.writer.do(func(failed bool) {
		if failed {
			send(deletedBefore{gen: gen, replyTo: replyTo, err: fmt.Errorf("%w: the log failed", ErrStorageFailed)})
			return
		}
		n, err := store.DeleteBefore(off, applied)
		send(deletedBefore{gen: gen, replyTo: replyTo, n: n, err: err})
	})
}

func (a *Actor) onDeletedBefore(ctx actor.Context, m deletedBefore) {
	if m.gen == a.gen && a.store != nil {
		a.writer.drain()
		if m.err == nil && m.n > 0 {
			a.trimmed()
		}
	}
	if m.replyTo != nil {
		ctx.Send(m.replyTo, &DeleteBeforeResult{Removed: m.n, Err: m.err})
	}
}

func (a *Actor) active() {
	a.lastActive = a.ticks
	a.released = false
}

// release drops an idle partition's in-memory window and log caches; tail
// readers are then served from the log until new data arrives.
func (a *Actor) release() {
	a.released = true
	a.win.reset()
	if err := a.store.ClearCache(); err != nil {
		a.log.Warn("clearing log caches", "err", err)
	}
	if a.cfg.OnRelease != nil {
		a.cfg.OnRelease()
	}
}

func (a *Actor) onRaftMessage(m *raftwire.Message) {
	if a.rn == nil {
		return
	}
	if m.Quiesce != nil {
		a.onQuiesce(m.Quiesce)
		return
	}
	if m.Joining != nil {
		a.onJoining(m.Joining)
		return
	}
	msg := m.Raft
	if msg.To != a.cfg.ReplicaID {
		// For an earlier (or later) incarnation of this node's replica:
		// the transport routes by node, and raft would take it as its own.
		raftMisaddressed.Inc()
		return
	}
	if a.emptyJoiner() && msg.Type == raftpb.MsgHeartbeat && msg.Commit > 0 {
		// A leader that counts an earlier replica of this node as caught
		// up: raft would panic on it (commit beyond an empty log). The
		// leader sees this replica announce itself and adds it afresh.
		return
	}
	a.clampHeartbeat(&msg)
	if !a.voteAllowed(&msg) {
		return
	}
	if msg.Type == raftpb.MsgAppResp && msg.Reject {
		a.onAppReject(&msg)
	}
	if a.quiesced && a.wakes(&msg) {
		a.wake()
	}
	a.heardFrom(msg.From)
	if err := a.rn.Step(msg); err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) {
		a.log.Debug("raft step", "err", err)
	}
}

func (a *Actor) onReady(ctx actor.Context) {
	a.readyQueued = false
	for a.rn != nil && a.rn.HasReady() {
		rd := a.rn.Ready()
		if rd.SoftState != nil {
			a.onSoftState(ctx, rd.SoftState)
		}
		// With AsyncStorageWrites the Ready's work arrives as messages:
		// appends go to the log writer, applies are done here, in order.
		for i := range rd.Messages {
			m := rd.Messages[i]
			switch m.To {
			case raft.LocalAppendThread:
				a.noteArrivals(m.Entries)
				a.appendsQueued++
				a.writer.submit(m)
			case raft.LocalApplyThread:
				a.applyMsg(ctx, m)
			default:
				a.send(ctx, m)
			}
		}
		if a.rn == nil {
			return // storage failed while applying
		}
	}
	a.maybeCampaign()
	a.maybeStampReady()
	a.quiesceLater()
	a.serveParked(ctx)
	a.publish()
}

// maybeCampaign starts a lone voter's election as soon as raft allows one:
// once every committed entry (a fresh group's bootstrap conf change) is
// applied.
func (a *Actor) maybeCampaign() {
	if !a.campaignSoon || a.rn == nil {
		return
	}
	if st := a.rn.BasicStatus(); st.Applied < st.Commit {
		return
	}
	a.campaignSoon = false
	if err := a.rn.Campaign(); err != nil {
		a.log.Warn("campaign failed", "err", err)
	}
}

// onAppended delivers the responses of writes the log writer made durable.
func (a *Actor) onAppended(ctx actor.Context, d appendDone) {
	if d.gen != a.gen || a.rn == nil {
		return // from a writer of a log since closed
	}
	a.appendsQueued -= d.n
	if d.err != nil {
		a.storageFailed(ctx, d.err)
		return
	}
	if d.snapshot != nil {
		a.installSnapshot(ctx, d.snapshot)
	}
	for _, r := range d.responses {
		if r.To == a.cfg.ReplicaID {
			if err := a.rn.Step(r); err != nil {
				a.log.Debug("raft step (local)", "err", err)
			}
		} else {
			a.send(ctx, r)
		}
	}
	if a.isLeader {
		a.ackPersisted(ctx, d.entries)
	}
	a.writer.drain()
	a.maybeCampaign()
	a.maybeStampReady()
}

// installSnapshot moves the replica's state to a snapshot the log writer
// has made durable (a follower behind a leader whose log retention
// truncated): the log now starts at the snapshot's offset, and what was
// derived from the replaced log is rebuilt. Raft takes the snapshot as
// applied when it gets the write's response, which comes right after.
func (a *Actor) installSnapshot(ctx actor.Context, snap *raftpb.Snapshot) {
	var sd heraldpb.SnapshotData
	if err := proto.Unmarshal(snap.Data, &sd); err == nil {
		a.hw = sd.NextOffset
	} else {
		a.log.Error("undecodable snapshot data", "err", err)
	}
	a.log.Info("installed a snapshot from the leader", "index", snap.Metadata.Index, "next_offset", a.hw)
	a.dropHolds(ctx) // what they held is gone
	a.heldFrom = nil
	a.applied = snap.Metadata.Index
	a.appliedTerm = snap.Metadata.Term
	cs := snap.Metadata.ConfState
	a.stats.Conf.Store(&cs)
	a.win.reset()
	a.openPrio()       // the log was replaced: index it again
	a.resetProducers() // and its earlier batches are gone
	a.failTxnPending(ctx, notLeader(a.cfg.Topic, a.cfg.Partition, a.leader))
	a.txn = newTxnLog() // the leader keeps every open batch after its snapshot point
	for _, e := range sd.TxnEnded {
		a.txn.noteEnd(e.GetProducerId(), txnEnd{epoch: e.GetEpoch(), committed: e.GetCommitted(), base: e.GetBaseOffset(), count: e.GetCount()})
	}
	a.restoreSessions(sd.SessionFences) // (zombie.go)
	a.txn.endedDirty = true
	a.saveTxnState()
	a.publishTxn()
	if a.producers.raiseEpochs(epochList{sd.TxnEpoch, sd.SchedulerEpoch}) {
		// The fences it replaced hold: saved now, with the table's file.
		a.saveProducers(true)
	}
	a.serveParked(ctx)
	a.publish()
}

// maybeStampReady lets a new leader accept produce requests once every
// append queued before its election is written: only then is the offset
// after its last entry known.
func (a *Actor) maybeStampReady() {
	if a.isLeader && !a.stampReady && a.appendsQueued == 0 && a.store != nil {
		a.tail = a.store.NextOffset()
		a.stampReady = true
	}
	a.stats.Writable.Store(a.isLeader && a.stampReady)
	a.stats.Idempotent.Store(a.idempotentReady())
}

// applyMsg applies a MsgStorageApply: committed entries, then steps its
// responses. (With AsyncStorageWrites a snapshot comes in a
// MsgStorageAppend instead: see installSnapshot.)
func (a *Actor) applyMsg(ctx actor.Context, m raftpb.Message) {
	a.apply(ctx, m.Entries)
	for _, r := range m.Responses {
		if err := a.rn.Step(r); err != nil {
			a.log.Debug("raft step (apply)", "err", err)
		}
	}
}

// onSoftState tracks leadership.
func (a *Actor) onSoftState(ctx actor.Context, ss *raft.SoftState) {
	was := a.isLeader
	if a.leader != 0 || ss.Lead != 0 {
		a.leaderSeenTick = a.ticks
	}
	a.leader = ss.Lead
	a.isLeader = ss.RaftState == raft.StateLeader
	if a.isLeader {
		a.m.leader.Set(1)
	} else {
		a.m.leader.Set(0)
	}
	if was && !a.isLeader {
		a.log.Info("lost leadership", "leader", ss.Lead)
		a.failPending(ctx, notLeader(a.cfg.Topic, a.cfg.Partition, ss.Lead))
	}
	if a.isLeader != was {
		a.stampReady = false
		a.stats.Writable.Store(false)
		a.stats.Idempotent.Store(false)
		// A new term: proposals of the old one are settled by the log
		// alone, and the new leader waits until it applied them.
		clear(a.inflight)
		a.txnProposed, a.fencing = epochList{}, [heraldpb.NumFencers]*proposalKey{}
		a.termApplied = false
	}
	if a.isLeader && !was {
		a.lastBusy = a.ticks
		a.term = a.rn.BasicStatus().Term
		a.log.Info("became leader", "term", a.term)
	}
}

// group is the raft group's name on the transport.
func (a *Actor) group() string {
	if a.cfg.Group != "" {
		return a.cfg.Group
	}
	return Name(a.cfg.Topic, a.cfg.Partition)
}

// send delivers a raft message to another replica's actor. The transport
// encodes it later, off this actor (raftwire): its entries are immutable.
func (a *Actor) send(ctx actor.Context, m raftpb.Message) {
	if !a.filterVotes(&m) {
		return
	}
	a.sendRaft(m.To, &raftwire.Message{Group: a.group(), Raft: m})
	if m.Type == raftpb.MsgSnap {
		// The transport gives no receipt, and raft holds the replica in
		// StateSnapshot until told: report the snapshot sent, so raft
		// probes the replica next. If the replica dropped or refused it,
		// the probe fails and raft sends a snapshot again, rather than
		// waiting forever for a report.
		a.rn.ReportSnapshot(m.To, raft.SnapshotFinish)
	}
}

// sendRaft hands rm to replica to: through the transport, or to its PID.
func (a *Actor) sendRaft(to uint64, rm *raftwire.Message) {
	if a.cfg.Transport != nil {
		a.cfg.Transport.Send(to, rm)
		return
	}
	if pid := a.cfg.Peers[to]; pid != nil {
		a.sys.Root.Send(pid, rm)
	}
}

// ackPersisted answers acks=leader producers whose entries are now on disk.
func (a *Actor) ackPersisted(ctx actor.Context, ents []raftpb.Entry) {
	for _, e := range ents {
		if e.Term != a.term {
			continue
		}
		base, _, ok := entryOffsets(e)
		if !ok {
			continue
		}
		k := proposalKey{term: e.Term, base: base}
		if p, ok := a.pending[k]; ok && p.acks == heraldpb.Acks_ACKS_LEADER {
			delete(a.pending, k)
			a.answer(ctx, p, func(id uint64, dup bool) *heraldpb.Frame {
				q := p
				q.duplicate = dup
				return produced(id, a.cfg.Partition, base, q)
			})
		}
	}
}

func (a *Actor) apply(ctx actor.Context, ents []raftpb.Entry) {
	for _, e := range ents {
		switch e.Type {
		case raftpb.EntryConfChange:
			var cc raftpb.ConfChange
			if err := cc.Unmarshal(e.Data); err == nil {
				a.applyConfState(e.Index, a.rn.ApplyConfChange(cc))
			}
		case raftpb.EntryConfChangeV2:
			var cc raftpb.ConfChangeV2
			if err := cc.Unmarshal(e.Data); err == nil {
				a.applyConfState(e.Index, a.rn.ApplyConfChange(cc))
			}
		case raftpb.EntryNormal:
			if len(e.Data) > 0 {
				a.applyBatch(ctx, e)
			}
		}
		a.applied, a.appliedTerm = e.Index, e.Term
		if a.isLeader && e.Term == a.term && !a.termApplied {
			a.termApplied = true
			a.stats.Idempotent.Store(a.idempotentReady())
		}
	}
	if len(a.heldFrom) > 0 {
		a.sweepArrivals()
	}
}

func (a *Actor) applyConfState(index uint64, cs *raftpb.ConfState) {
	store, log, saved := a.store, a.log, *cs
	store.NoteConfState(index, saved)
	a.writer.do(func(failed bool) {
		if failed {
			return
		}
		if err := store.SetConfState(index, saved); err != nil {
			log.Error("saving conf state", "err", err)
		}
	})
	c := *cs
	a.stats.Conf.Store(&c)
}

// applyRecords makes an applied entry's records readable: the high
// watermark moves past them, the window and the priority sub-queues take
// them. It reports false for an entry below a snapshot this replica
// installed (skipped).
func (a *Actor) applyRecords(e raftpb.Entry, h heraldpb.LogEntryHeader, records []byte) bool {
	if h.Count > 0 && h.BaseOffset+int64(h.Count) <= a.hw && h.BaseOffset < a.hw {
		// Below the start of a snapshot this replica installed: a leader
		// whose retention cut a transaction's span starts its log after
		// the transaction, and keeps the entries below until its next
		// truncation (persistence.Log.Retain). Anything else is a bug.
		a.log.Warn("committed entry lies below the high watermark; skipped", "index", e.Index, "base", h.BaseOffset, "count", h.Count, "hw", a.hw,
			"log_start", a.store.StartOffset())
		return false
	}
	if h.BaseOffset != a.hw && !a.acceptedGap(a.hw, h.BaseOffset) {
		a.log.Error("committed entry's base offset does not follow the high watermark",
			"index", e.Index, "base", h.BaseOffset, "hw", a.hw)
	}
	a.hw = h.BaseOffset + int64(h.Count)
	if h.MaxPriority > 0 && a.prio.add(h.BaseOffset, records) != 0 {
		a.publishPrio()
	}
	a.win.add(&heraldpb.StoredBatch{BaseOffset: h.BaseOffset, Count: h.Count, AppendTimeMs: h.AppendTimeMs, Records: records})
	a.m.produceRecords.Add(float64(h.Count))
	a.m.produceBytes.Add(float64(len(records)))
	return true
}

func (a *Actor) applyBatch(ctx actor.Context, e raftpb.Entry) {
	// The window aliases the entry's data (immutable once saved) instead of
	// copying the records.
	h, records, err := heraldpb.ScanLogEntry(e.Data)
	if err != nil {
		a.log.Error("undecodable committed entry", "index", e.Index, "err", err)
		return
	}
	if a.producers.applyTxnEpoch(h, e.Index) {
		a.prodDirty = true
	}
	if h.Fence() {
		a.applyFence(ctx, e, h)
		return
	}
	if h.SessionFence > 0 {
		a.applySessionFence(ctx, h)
		return
	}
	if h.TxnBatch() {
		a.applyTxnBatch(ctx, e, h, records)
		return
	}
	if h.TxnMarker != heraldpb.TxnMarker_TXN_MARKER_NONE {
		a.applyTxnMarker(ctx, e, h)
		return
	}
	if h.TxnCommitInline {
		a.applyTxnInline(ctx, e, h, records)
		return
	}
	if !a.applyRecords(e, h, records) {
		return
	}
	if h.ProducerID != 0 {
		a.applyProducerBatch(e, h)
	}
	k := proposalKey{term: e.Term, base: h.BaseOffset}
	p, ok := a.pending[k]
	if ok {
		delete(a.pending, k)
	}
	if from, until, held := a.holdOf(e.Term, h, a.cfg.Clock.Now()); held {
		var wait *proposal
		if ok {
			wait = &p // answered when it becomes readable
		}
		a.addHold(ctx, h.BaseOffset, from, until, wait)
		return
	}
	if ok {
		now := a.cfg.Clock.Now().UnixMicro()
		a.answer(ctx, p, func(id uint64, dup bool) *heraldpb.Frame {
			q := p
			q.duplicate = dup
			f := produced(id, a.cfg.Partition, h.BaseOffset, q)
			f.GetProduceResponse().CommitTimeUs = now
			return f
		})
	}
}

// answer answers a proposal's producer and the retries waiting with it;
// resp builds each answer from its frame id and whether it is a retry.
func (a *Actor) answer(ctx actor.Context, p proposal, resp func(id uint64, dup bool) *heraldpb.Frame) {
	a.reply(ctx, p.replyTo, resp(p.frameID, p.duplicate))
	for _, w := range p.dups {
		a.reply(ctx, w.replyTo, resp(w.frameID, true))
	}
}

// produced is a ProduceResponse for the batch of p at base. A duplicate's
// answer carries no times: it was appended by an earlier request.
func produced(id uint64, part uint32, base int64, p proposal) *heraldpb.Frame {
	r := &heraldpb.ProduceResponse{Partition: part, BaseOffset: base, Count: p.count, AppendTimeMs: p.appendTime, Duplicate: p.duplicate}
	if p.duplicate {
		r.AppendTimeMs = 0
	}
	return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: r}}
}

func (a *Actor) onProduce(ctx actor.Context, f *heraldpb.Frame) {
	req := f.GetProduce()
	replyTo := ctx.Sender()
	fail := func(e *heraldpb.Error) { a.reply(ctx, replyTo, heraldpb.ErrorFrame(f.Id, e)) }
	if a.rn == nil {
		fail(storageError(a.failure))
		return
	}
	if !a.isLeader {
		if e := a.leaderlessDamage(); e != nil {
			fail(e)
			return
		}
		fail(notLeader(a.cfg.Topic, a.cfg.Partition, a.leader))
		return
	}
	if e := a.damagedError(); e != nil {
		fail(e)
		return
	}
	if a.writer.busy() {
		e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "partition %s-%d: its log writer is behind", a.cfg.Topic, a.cfg.Partition)
		e.RetryAfterMs = uint32(a.cfg.ThrottleRetryAfter / time.Millisecond)
		a.m.throttled.Inc()
		fail(e)
		return
	}
	if !a.stampReady {
		e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "partition %s-%d: new leader is still writing its log", a.cfg.Topic, a.cfg.Partition)
		e.RetryAfterMs = uint32(a.cfg.ThrottleRetryAfter / time.Millisecond)
		fail(e)
		return
	}
	// A quiesced leader wakes first: quiet is why it heard nothing from
	// its followers, and wake counts the live ones in sync again.
	a.wake()
	if e := a.checkInSync(req.Acks); e != nil {
		fail(e)
		return
	}
	if req.TxnBatch || req.TxnMarker != heraldpb.TxnMarker_TXN_MARKER_NONE {
		a.onTxnProduce(ctx, replyTo, f.Id, req, fail)
		return
	}
	if e := validFencer(req.Fencer); e != nil {
		fail(e)
		return
	}
	if len(req.Records) == 0 && req.TxnEpoch != 0 {
		a.onFence(ctx, replyTo, f.Id, req)
		return
	}
	if len(req.Records) > a.cfg.MaxMessageBytes {
		fail(heraldpb.NewError(heraldpb.ErrorCode_MESSAGE_TOO_LARGE, "batch of %d bytes exceeds max message size %d", len(req.Records), a.cfg.MaxMessageBytes))
		return
	}
	info, err := heraldpb.ScanBatch(req.Records)
	if err != nil {
		fail(heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "%v", err))
		return
	}
	if info.Count == 0 {
		fail(heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "empty record batch"))
		return
	}
	if req.TxnEpoch != 0 && req.ProducerId == 0 {
		// An epoch without an idempotent producer (the scheduler's): the
		// same readiness and check as checkIdempotent's.
		if e := a.notIdempotentReady(); e != nil {
			fail(e)
			return
		}
		if e := a.checkTxnEpoch(req.Fencer, req.TxnEpoch); e != nil {
			fail(e)
			return
		}
	}
	if req.ProducerId != 0 && a.checkIdempotent(ctx, replyTo, f.Id, req, uint32(info.Count)) {
		return
	}
	received := a.cfg.Clock.Now()
	// A held batch (hold.go) counts as appended when it becomes readable
	// by this clock; it is held at most MaxHold, from its receipt.
	hold := a.holdFor(req, received)
	appendTime, notBefore, holdUs := received.UnixMilli(), int64(0), uint32(0)
	if hold > 0 {
		notBefore, holdUs = ceilMilli(received.Add(hold)), ceilMicros(hold)
		appendTime = notBefore
	}
	maxTs := info.MaxTimestamp
	if maxTs == 0 {
		maxTs = appendTime
	}
	a.flushMarkers(ctx) // (queued markers take their offsets first)
	base := a.tail
	if e := a.proposeEntry(&heraldpb.LogEntry{
		BaseOffset: base, Count: uint32(info.Count), AppendTimeMs: appendTime, MaxTimestampMs: maxTs, Records: req.Records,
		MaxPriority: uint32(info.MaxPriority), ProducerId: req.ProducerId, BaseSequence: req.BaseSequence,
		NotBeforeMs: notBefore, HoldUs: holdUs, TxnEpoch: req.TxnEpoch, Fencer: req.Fencer,
	}); e != nil {
		fail(e)
		return
	}
	a.tail = base + int64(info.Count)
	a.txnProposed[req.Fencer] = max(a.txnProposed[req.Fencer], req.TxnEpoch)
	if holdUs > 0 {
		a.noteReceipt(holdKey{term: a.term, base: base}, received)
	}
	if req.ProducerId != 0 {
		a.inflight[req.ProducerId] = append(a.inflight[req.ProducerId], inflightSeq{seq: req.BaseSequence, count: uint32(info.Count), offset: base, term: a.term})
	}
	p := proposal{replyTo: replyTo, frameID: f.Id, acks: req.Acks, count: uint32(info.Count), appendTime: appendTime, bytes: len(req.Records)}
	if req.Acks == heraldpb.Acks_ACKS_NONE {
		a.reply(ctx, replyTo, produced(f.Id, a.cfg.Partition, -1, p))
		return
	}
	a.pending[proposalKey{term: a.term, base: base}] = p
}

func (a *Actor) onFetch(ctx actor.Context, f *heraldpb.Frame) {
	req := f.GetFetch()
	replyTo := ctx.Sender()
	if a.rn == nil {
		a.reply(ctx, replyTo, heraldpb.ErrorFrame(f.Id, storageError(a.failure)))
		return
	}
	if req.IncludeHeld {
		// A broker-internal read that looks for its own appends (the
		// scheduler's and the transaction coordinator's, before appending
		// again): only a leader that has applied an entry of its own term
		// holds every committed entry, so only it answers.
		switch {
		case !a.isLeader:
			a.reply(ctx, replyTo, heraldpb.ErrorFrame(f.Id, notLeader(a.cfg.Topic, a.cfg.Partition, a.leader)))
			return
		case !a.termApplied:
			e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "partition %s-%d: new leader has not applied its log yet", a.cfg.Topic, a.cfg.Partition)
			e.RetryAfterMs = uint32(a.cfg.ThrottleRetryAfter / time.Millisecond)
			a.reply(ctx, replyTo, heraldpb.ErrorFrame(f.Id, e))
			return
		}
	}
	start := a.store.StartOffset()
	if req.Priority > 0 && req.Offset < start && req.Offset >= 0 {
		// A sub-queue read below the log's start reads from the start.
		a.onPriorityFetch(ctx, f.Id, req, replyTo, start, fetchMaxBytes(req))
		return
	}
	if req.Offset < start || req.Offset > a.hw {
		a.reply(ctx, replyTo, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE,
			"offset %d is outside [%d, %d] of %s-%d", req.Offset, start, a.hw, a.cfg.Topic, a.cfg.Partition)))
		return
	}
	maxBytes := fetchMaxBytes(req)
	if req.Priority > 0 {
		a.onPriorityFetch(ctx, f.Id, req, replyTo, start, maxBytes)
		return
	}
	end := a.readable()
	if req.IncludeHeld {
		end = a.hw
	}
	switch {
	case req.Offset >= end:
		if req.MaxWaitMs == 0 || req.IncludeHeld {
			a.answerFetch(ctx, replyTo, f.Id, nil)
			return
		}
		seq, ok := a.park.park(parkedFetch{replyTo: replyTo, frameID: f.Id, offset: req.Offset, maxBytes: maxBytes})
		if !ok {
			a.answerFetch(ctx, replyTo, f.Id, nil)
			return
		}
		a.m.parked.Set(float64(len(a.park.fetches)))
		self, sys := a.self, a.sys
		time.AfterFunc(time.Duration(req.MaxWaitMs)*time.Millisecond, func() { sys.Root.Send(self, fetchDeadline{seq: seq}) })
	case a.win.covers(req.Offset):
		a.answerFetchTo(ctx, replyTo, f.Id, a.readWindow(req.Offset, maxBytes, end), end)
	default:
		err := a.cfg.Readers.Submit(readJob{
			store: a.store, replyTo: replyTo, frameID: f.Id, part: a.cfg.Partition,
			offset: req.Offset, maxBytes: maxBytes, hw: end, start: start, done: a.countFetched(),
		})
		if err != nil {
			e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "log readers are busy")
			e.RetryAfterMs = uint32(a.cfg.ThrottleRetryAfter / time.Millisecond)
			a.m.throttled.Inc()
			a.reply(ctx, replyTo, heraldpb.ErrorFrame(f.Id, e))
		}
	}
}

// fetchMaxBytes is a fetch's byte budget: its max_bytes, 1 MiB when unset
// or above 16 MiB.
func fetchMaxBytes(req *heraldpb.FetchRequest) int {
	n := int(req.MaxBytes)
	if n <= 0 || n > 16<<20 {
		n = 1 << 20
	}
	return n
}

func (a *Actor) answerFetch(ctx actor.Context, replyTo *actor.PID, id uint64, batches []*heraldpb.StoredBatch) {
	a.answerFetchTo(ctx, replyTo, id, batches, a.readable())
}

// answerFetchTo answers a fetch that read up to end (its high watermark).
func (a *Actor) answerFetchTo(ctx actor.Context, replyTo *actor.PID, id uint64, batches []*heraldpb.StoredBatch, end int64) {
	recs, bytes := 0, 0
	for _, b := range batches {
		recs += int(b.Count)
		bytes += len(b.Records)
	}
	countFetch(a.m, a.stats, recs, bytes)
	var start int64
	if a.store != nil {
		start = a.store.StartOffset()
	}
	a.reply(ctx, replyTo, &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_FetchResponse{FetchResponse: &heraldpb.FetchResponse{
		Partition: a.cfg.Partition, HighWatermark: end, LogStartOffset: start, Batches: batches,
	}}})
}

// countFetched is what counts the records and bytes a fetch answered
// with, for the readers' goroutines; countFetch counts them on the actor.
func (a *Actor) countFetched() func(recs, bytes int) {
	m, stats := a.m, a.stats
	return func(recs, bytes int) { countFetch(m, stats, recs, bytes) }
}

func countFetch(m *partMetrics, stats *Stats, recs, bytes int) {
	m.fetchRecords.Add(float64(recs))
	m.fetchBytes.Add(float64(bytes))
	stats.BytesOut.Add(int64(bytes))
}

// serveParked answers the long polls that new committed data satisfies.
func (a *Actor) serveParked(ctx actor.Context) {
	if len(a.park.fetches) == 0 {
		return
	}
	end := a.readable()
	for _, f := range a.park.ready(end) {
		if a.win.covers(f.offset) {
			a.answerFetchTo(ctx, f.replyTo, f.frameID, a.readWindow(f.offset, f.maxBytes, end), end)
		} else {
			// The window moved past it (a huge burst): let the client fetch again.
			a.answerFetchTo(ctx, f.replyTo, f.frameID, nil, end)
		}
	}
	a.m.parked.Set(float64(len(a.park.fetches)))
}

func (a *Actor) onFetchDeadline(ctx actor.Context, m fetchDeadline) {
	if f, ok := a.park.take(m.seq); ok {
		a.answerFetch(ctx, f.replyTo, f.frameID, nil)
		a.m.parked.Set(float64(len(a.park.fetches)))
	}
}

func (a *Actor) onListOffsets(ctx actor.Context, f *heraldpb.Frame) {
	req := f.GetListOffsets()
	if a.rn == nil {
		a.reply(ctx, ctx.Sender(), heraldpb.ErrorFrame(f.Id, storageError(a.failure)))
		return
	}
	start := a.store.StartOffset()
	var off int64
	switch req.Spec {
	case heraldpb.OffsetSpec_OFFSET_SPEC_EARLIEST:
		off = start
	case heraldpb.OffsetSpec_OFFSET_SPEC_LATEST:
		off = a.readable()
	case heraldpb.OffsetSpec_OFFSET_SPEC_TIMESTAMP:
		off = a.store.OffsetForTime(req.TimestampMs)
		off = max(start, min(off, a.readable()))
	default:
		a.reply(ctx, ctx.Sender(), heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "unknown offset spec %d", req.Spec)))
		return
	}
	resp := &heraldpb.ListOffsetsResponse{Partition: a.cfg.Partition, Offset: off, LogStartOffset: start, HighWatermark: a.readable(),
		BytesOut: uint64(a.stats.BytesOut.Load())}
	if isr := a.stats.InSync.Load(); isr != nil {
		resp.InSyncReplicas = *isr
	}
	a.reply(ctx, ctx.Sender(), &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListOffsetsResponse{ListOffsetsResponse: resp}})
}

// storageFailed drops the raft node and the log after a storage error,
// answers everything waiting, and schedules a reopen from durable state.
func (a *Actor) storageFailed(ctx actor.Context, err error) {
	a.log.Error("partition storage failed; will reopen", "err", err)
	a.m.storageFailures.Inc()
	a.failure = err
	a.closeLog(ctx, storageError(err))
	if a.reopenBackup == 0 {
		a.reopenBackup = 500 * time.Millisecond
	} else if a.reopenBackup < 10*time.Second {
		a.reopenBackup *= 2
	}
	a.reopenAt = a.cfg.Clock.Now().Add(a.reopenBackup)
}

// closeLog answers everything waiting with why, stops the writer and closes
// the log; the tick reopens it at reopenAt.
func (a *Actor) closeLog(ctx actor.Context, why *heraldpb.Error) {
	a.failPending(ctx, why)
	a.dropHolds(ctx)
	for _, f := range a.park.drain() {
		a.answerFetch(ctx, f.replyTo, f.frameID, nil)
	}
	a.stopWriter()
	if a.store != nil {
		a.store.Close()
	}
	a.store, a.rn = nil, nil
	a.isLeader, a.stampReady = false, false
	a.setQuiesced(false)
	a.stopProducerLoad()
	clear(a.inflight)
	a.txnProposed, a.fencing = epochList{}, [heraldpb.NumFencers]*proposalKey{}
	a.termApplied = false
	a.stats.Writable.Store(false)
	a.stats.Idempotent.Store(false)
	a.m.leader.Set(0)
}

// propose hands a produce's or a fence's entry to raft, or says why not.
// A leader whose raft has stepped down, before the actor handled that
// Ready, refuses it (NOT_LEADER): raft would forward the proposal to the
// new leader, which would append it unchecked (no sequence or
// coordinator-epoch check there) at an offset this replica stamped.
func (a *Actor) propose(data []byte) *heraldpb.Error {
	a.wake()
	a.lastBusy = a.ticks
	st := a.rn.BasicStatus()
	if st.RaftState != raft.StateLeader {
		return notLeader(a.cfg.Topic, a.cfg.Partition, st.Lead)
	}
	err := a.rn.Propose(data)
	switch {
	case err == nil:
		return nil
	case st.LeadTransferee != 0:
		return notLeader(a.cfg.Topic, a.cfg.Partition, st.LeadTransferee) // handing over leadership
	case errors.Is(err, raft.ErrProposalDropped):
		e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "partition %s-%d has too many uncommitted bytes", a.cfg.Topic, a.cfg.Partition)
		e.RetryAfterMs = uint32(a.cfg.ThrottleRetryAfter / time.Millisecond)
		a.m.throttled.Inc()
		return e
	}
	return notLeader(a.cfg.Topic, a.cfg.Partition, a.leader)
}

// proposeEntry encodes le and proposes it (propose).
func (a *Actor) proposeEntry(le *heraldpb.LogEntry) *heraldpb.Error {
	data, err := proto.Marshal(le)
	if err != nil {
		return heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "encoding entry: %v", err)
	}
	return a.propose(data)
}

// failPending answers every proposed, unanswered produce with why, marked
// outcome_unknown: its entry is in raft already and may still be (or have
// been) written and committed.
func (a *Actor) failPending(ctx actor.Context, why *heraldpb.Error) {
	if len(a.pending) > 0 {
		why = proto.Clone(why).(*heraldpb.Error)
		why.OutcomeUnknown = true
	}
	for k, p := range a.pending {
		a.answer(ctx, p, func(id uint64, _ bool) *heraldpb.Frame { return heraldpb.ErrorFrame(id, why) })
		delete(a.pending, k)
	}
	if len(a.txn.batchWait) > 0 || len(a.txn.closing) > 0 {
		why = proto.Clone(why).(*heraldpb.Error)
		why.OutcomeUnknown = true
	}
	a.failTxnPending(ctx, why)
}

func (a *Actor) reply(ctx actor.Context, to *actor.PID, f *heraldpb.Frame) {
	if to != nil {
		ctx.Send(to, f)
	}
}

// publish copies the replica's state into Stats and the gauges.
func (a *Actor) publish() {
	if a.store == nil {
		return
	}
	start, end := a.store.StartOffset(), a.store.EndOffset()
	a.stats.StartOffset.Store(start)
	a.stats.HighWatermark.Store(a.readable())
	a.stats.EndOffset.Store(end)
	a.stats.SizeBytes.Store(a.store.Size())
	a.stats.Leader.Store(heraldpb.ReplicaNode(a.leader))
	if a.rn != nil {
		a.stats.Term.Store(a.rn.BasicStatus().Term)
	}
	a.m.start.Set(float64(start))
	a.m.end.Set(float64(end))
	a.m.hw.Set(float64(a.readable()))
	if a.store.Damaged() {
		a.m.damaged.Set(1)
	} else {
		a.m.damaged.Set(0)
	}
	a.publishInSync()
	a.publishProducers()
}

// publishInSync stores the in-sync replicas' node ids in Stats while this
// replica leads (kept as they were while the group is quiesced: the
// followers are silent then, and were in sync when it quiesced).
func (a *Actor) publishInSync() {
	if a.rn == nil || !a.isLeader {
		if a.stats.InSync.Load() != nil {
			a.stats.InSync.Store(nil)
		}
		return
	}
	if a.quiesced && a.stats.InSync.Load() != nil {
		return
	}
	var buf [8]uint32
	ids := a.inSyncNodes(buf[:0])
	if cur := a.stats.InSync.Load(); cur == nil || !slices.Equal(*cur, ids) {
		ids = slices.Clone(ids)
		a.stats.InSync.Store(&ids)
	}
}

// committedStorage reports a raised commit index in InitialState.
type committedStorage struct {
	Storage
	hs raftpb.HardState
}

func (s committedStorage) InitialState() (raftpb.HardState, raftpb.ConfState, error) {
	_, cs, err := s.Storage.InitialState()
	return s.hs, cs, err
}
