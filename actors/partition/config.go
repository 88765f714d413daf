// Package partition implements the partition actor: one supervised actor per
// replica of a partition, owning its raft node (go.etcd.io/raft/v3 RawNode)
// and its durable log. The actor proposes produced batches to raft, persists
// each Ready with one fsync (group commit), sends raft messages to the other
// replicas through their PIDs, applies committed entries (advancing the high
// watermark), answers producers according to their acks, and serves fetches
// from an in-memory window of recent batches or, for catch-up readers, from
// the log on a bounded reader pool outside its mailbox.
package partition

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/internal/raftwire"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Storage is the durable raft log the actor owns. persistence.Log implements
// it. Save and the other writers are called only from the actor; the readers
// may be called from the reader pool concurrently.
type Storage interface {
	raft.Storage
	// Write persists a raft Ready's hard state and entries (truncating a
	// conflicting suffix) without the WAL fsync; Flush makes all writes so
	// far durable under the flush policy. Called by the log writer only.
	Write(hs raftpb.HardState, entries []raftpb.Entry) error
	Flush() error
	// SetConfState records the membership after the change at index.
	SetConfState(index uint64, cs raftpb.ConfState) error
	// NoteConfState tells the log, at once, the membership raft applied
	// at index, before the writer's SetConfState saves it: a snapshot
	// asked for meanwhile must name a replica the change added.
	NoteConfState(index uint64, cs raftpb.ConfState)
	ApplySnapshot(snap raftpb.Snapshot) error
	StartOffset() int64
	EndOffset() int64
	ReadBatches(offset int64, maxBytes int, limit int64) ([]*heraldpb.StoredBatch, error)
	OffsetForTime(tsMs int64) int64
	Size() int64
	// TxnFloor is at or below the first transactional entry (0: none).
	TxnFloor() uint64
	Retain(now time.Time, maxAge time.Duration, maxBytes int64, upTo uint64) (int64, error)
	DeleteBefore(offset int64, upTo uint64) (int64, error)
	// ClearCache drops the log's read caches (an idle partition).
	ClearCache() error
	Close() error
	// Damage, Damaged, AcceptDamage, ClearDamage and ReadCorruption are
	// the log's record of corruption it found (persistence/damage.go).
	Damage() (persistence.Damage, bool)
	Damaged() bool
	AcceptDamage(floor int64, maxCommit uint64) error
	// NextOffset is EndOffset, or past the offsets an accepted damage
	// lost: the leader stamps new entries from it.
	NextOffset() int64
	ClearDamage() error
	ReadCorruption() error
}

// Transport carries a raft message to the replica with raft id to, on
// another node: the node heraldpb.ReplicaNode(to), whose replica of the
// group checks the id (a message for an earlier incarnation of it is
// dropped). Delivery is at most once (raft retransmits); Send must not
// block.
type Transport interface {
	Send(to uint64, m *raftwire.Message)
}

// Clock is the only way the actor reads time, so tests can move it.
type Clock interface{ Now() time.Time }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// SystemClock reads the machine's clock.
var SystemClock Clock = systemClock{}

// Config configures one replica of one partition.
type Config struct {
	Topic     string
	Partition uint32
	// ReplicaID is this replica's raft id; not 0. In a cluster it is the
	// node id, or for a replica a move added its own id
	// (heraldpb.ReplicaRaftID), whose low 32 bits are the node id: raft
	// ids that leave the actor (Stats.Leader, NOT_LEADER, Liveness) are
	// turned into node ids with heraldpb.ReplicaNode. The replica drops
	// raft messages addressed to another raft id.
	ReplicaID uint64
	// Peers maps every voter's raft id, this replica's included, to the PID
	// of its partition actor. A fresh group bootstraps with these voters.
	// With a Transport the PIDs may be nil: only the ids count.
	Peers map[uint64]*actor.PID
	// Group names the raft group on the transport; default
	// Name(Topic, Partition). A cluster topic's includes the topic's id,
	// so that replicas of a deleted topic and of one made again under its
	// name never exchange raft messages.
	Group string
	// Transport, if set, carries raft messages to the other replicas
	// (on other nodes) instead of sending them to Peers' PIDs.
	Transport Transport
	// Join: this replica joins a group that exists already (a replica
	// moved or added to this node, a learner of the controller group). It
	// does not bootstrap from Peers; the group's leader adds it with a
	// membership change and sends it the log or a snapshot.
	Join bool
	// JoinAs, with Join, names this replica's incarnation (the partition
	// move that started it). A replica whose raft id is its node id (a
	// move recorded before raft ids per incarnation) announces itself to
	// the nodes in Announce (node ids) while its log is empty and it has
	// heard from no leader, and the group's leader adds it only once it
	// has (reassign.go).
	JoinAs   string
	Announce []uint64
	// Campaign: this replica is its new group's preferred leader. It
	// campaigns as soon as the group is bootstrapped instead of waiting
	// out an election timeout (only at bootstrap, never on a reopen).
	Campaign bool
	// MinInSync is the number of in-sync voters, the leader included, that
	// an acks=all produce needs; below it the produce fails with
	// NOT_ENOUGH_REPLICAS before anything is appended. A voter is in sync
	// while the leader hears from it and replicates to it without probing.
	// 0 or 1: no check.
	MinInSync int
	// Liveness, if set, reports whether a node (a node id, not a raft id)
	// is up (cluster membership), and lets the group quiesce when idle:
	// see quiesce.go. Nil: the group never quiesces.
	Liveness func(node uint64) bool
	// OnTargetReached, if set, is called (from the actor) while this
	// replica leads a group that has the membership of the target set by
	// SetTarget (raft ids, as SetTarget gave them), about once a second
	// until the target is cleared. Keep it short: it runs in the actor.
	OnTargetReached func(target []uint64)
	// QuiesceTicks is how many ticks without a proposal an idle group
	// waits before it quiesces. Default 5.
	QuiesceTicks int
	// Open opens (or re-opens after a storage failure) the replica's log.
	Open func() (Storage, error)

	// TickInterval is raft's logical clock period. Default 100ms.
	TickInterval time.Duration
	// ElectionTicks and HeartbeatTicks are raft's timeouts in ticks.
	// Defaults 6 and 1: a follower that has not heard from its leader for
	// 0.6-1.2 s (raft randomizes it) calls an election, so writes resume
	// about a second after a leader's node dies.
	ElectionTicks, HeartbeatTicks int

	// MaxMessageBytes is the largest record batch accepted. Default 1 MiB.
	MaxMessageBytes int
	// Retention: data older than RetentionAge or beyond RetentionBytes per
	// partition is deleted from the front of the log every RetentionCheck.
	// Zero age or bytes means no limit. RetentionCheck default 30s.
	RetentionAge   time.Duration
	RetentionBytes int64
	RetentionCheck time.Duration

	// MailboxLimit bounds the client requests queued in the mailbox; past it
	// produce and fetch requests are answered THROTTLED. Default 512.
	MailboxLimit int
	// ThrottleRetryAfter is the retry-after sent with THROTTLED. Default 5ms.
	ThrottleRetryAfter time.Duration
	// MaxUncommittedBytes bounds proposals not yet committed (raft's
	// MaxUncommittedEntriesSize); past it produce gets THROTTLED. It bounds
	// the memory a producer faster than the disk can pin per partition.
	// Default 8 MiB.
	MaxUncommittedBytes uint64
	// WindowBytes bounds the in-memory window of recent committed batches
	// that tail readers are served from. Default 4 MiB.
	WindowBytes int
	// WriterQueue bounds the raft append messages waiting for the log
	// writer. Default 1024.
	WriterQueue int
	// SyncPace paces the log writer's syncs under concurrent load: while
	// its syncs carry two or more entries on average, a writer starts the
	// next no sooner than SyncPace after the last began, and what arrives
	// meanwhile joins it. A sync costs the kernel about the same processor
	// time whatever it carries, so small concurrent appends (transactions
	// of a few records) share fewer syncs. Appends of one entry a sync (a
	// producer that waits for each acknowledgement) are never held; a
	// producer with several requests in flight, or a follower taking
	// several entries at a time, counts as concurrent. 0 = off (sync as
	// soon as the last sync ends); at most MaxSyncPace.
	SyncPace time.Duration
	// MaxParkedFetches bounds the long-poll fetches waiting for data; past it
	// a fetch is answered at once, empty. Default 1024.
	MaxParkedFetches int
	// IdleRelease: a partition with no produce, fetch or raft traffic for
	// this long drops its in-memory window and log caches, so idle
	// partitions cost little memory. Default 30s.
	IdleRelease time.Duration
	// OnRelease, if set, is called (from the actor) after an idle release,
	// so the node can hand the freed memory back to the OS.
	OnRelease func()
	// IndexPath is the file the priority sub-queues are saved to ("": not
	// saved, so every open reads the whole log to rebuild them), every
	// IndexSaveInterval (default 10s) and at stop.
	IndexPath         string
	IndexSaveInterval time.Duration
	// ProducerStatePath is the file the table of idempotent producers'
	// recent batches is saved to, with the raft index it covers, every
	// IndexSaveInterval and at stop ("": not saved, so every open reads the
	// whole log to rebuild it). At open the committed entries after the
	// saved index are read from the log off the actor; until then the
	// leader answers idempotent produces THROTTLED.
	ProducerStatePath string
	// MaxTxnOpenBytes bounds the bytes of the open transactions' batches
	// on the partition (txnlog.go); past it a transactional batch is
	// answered THROTTLED until markers end some. Default 64 MiB.
	MaxTxnOpenBytes int
	// MaxTxnOpenPerProducer bounds the transactions (epochs) of one
	// producer open on the partition at once (THROTTLED past it): a
	// producer that keeps batches in flight across transactions has the
	// ones whose markers are on their way open too: up to 64 commits in
	// flight (client.MaxTxnCommitsInFlight) plus the transactions whose
	// markers follow. Default 128.
	MaxTxnOpenPerProducer int
	// MaxProducers bounds the idempotent producers whose recent batches the
	// partition remembers; past it the least recently written one is
	// forgotten, and its next batch is accepted whatever its sequence.
	// Default 10,000 (about 1 MiB).
	MaxProducers int
	// Readers serves fetches below the window from the log, off the mailbox.
	// Nil means a private pool of 2 readers.
	Readers *ReaderPool

	Clock Clock
	// ClockID names Clock among the broker's rooms (0: none): a held
	// produce request with this clock_id was timed on this very clock, so
	// its not_before_ms is exact here and the hold is that alone (hold.go).
	// The broker draws one at its start for all of them; a room given
	// another clock must not share the id.
	ClockID uint64
	// MaxHold bounds how long a batch appended with a hold (hold_us,
	// not_before_ms) is held unreadable (hold.go). Default MaxHold (1 s);
	// at most maxHoldLimit (1 h: holds travel as 32-bit µs counts).
	MaxHold time.Duration
	Logger  *slog.Logger
}

// Name is the deterministic actor name of a partition replica.
func Name(topic string, partition uint32) string {
	return fmt.Sprintf("p/%s-%d", topic, partition)
}

// EnsureDefaults fills zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.TickInterval == 0 {
		c.TickInterval = 100 * time.Millisecond
	}
	if c.ElectionTicks == 0 {
		c.ElectionTicks = 6
	}
	if c.HeartbeatTicks == 0 {
		c.HeartbeatTicks = 1
	}
	if c.MaxTxnOpenBytes == 0 {
		c.MaxTxnOpenBytes = 64 << 20
	}
	if c.MaxTxnOpenPerProducer == 0 {
		c.MaxTxnOpenPerProducer = 128
	}
	if c.QuiesceTicks == 0 {
		c.QuiesceTicks = 5
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = 1 << 20
	}
	if c.RetentionCheck == 0 {
		c.RetentionCheck = 30 * time.Second
	}
	if c.MailboxLimit == 0 {
		c.MailboxLimit = 512
	}
	if c.ThrottleRetryAfter == 0 {
		c.ThrottleRetryAfter = 5 * time.Millisecond
	}
	if c.MaxUncommittedBytes == 0 {
		c.MaxUncommittedBytes = 8 << 20
	}
	if c.WindowBytes == 0 {
		c.WindowBytes = 4 << 20
	}
	if c.WriterQueue == 0 {
		c.WriterQueue = 1024
	}
	if c.IdleRelease == 0 {
		c.IdleRelease = 30 * time.Second
	}
	if c.MaxParkedFetches == 0 {
		c.MaxParkedFetches = 1024
	}
	if c.IndexSaveInterval == 0 {
		c.IndexSaveInterval = 10 * time.Second
	}
	if c.MaxProducers == 0 {
		c.MaxProducers = 10_000
	}
	if c.MaxHold <= 0 {
		c.MaxHold = MaxHold
	}
	if c.Clock == nil {
		c.Clock = SystemClock
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports every problem with the config at once.
func (c *Config) Validate() error {
	var errs []error
	if c.Topic == "" {
		errs = append(errs, errors.New("partition: Topic is empty"))
	}
	if c.ReplicaID == 0 {
		errs = append(errs, errors.New("partition: ReplicaID must not be 0"))
	}
	if _, ok := c.Peers[c.ReplicaID]; !ok {
		errs = append(errs, fmt.Errorf("partition: Peers lacks this replica (%d)", c.ReplicaID))
	}
	if c.Open == nil {
		errs = append(errs, errors.New("partition: Open is nil"))
	}
	if c.HeartbeatTicks >= c.ElectionTicks {
		errs = append(errs, fmt.Errorf("partition: HeartbeatTicks (%d) must be below ElectionTicks (%d)", c.HeartbeatTicks, c.ElectionTicks))
	}
	if c.SyncPace < 0 || c.SyncPace > MaxSyncPace {
		errs = append(errs, fmt.Errorf("partition: SyncPace %v is not between 0 and %v", c.SyncPace, MaxSyncPace))
	}
	if c.MaxHold > maxHoldLimit {
		errs = append(errs, fmt.Errorf("partition: MaxHold %v is above %v", c.MaxHold, maxHoldLimit))
	}
	if c.WindowBytes < 0 || c.MailboxLimit < 0 || c.MaxParkedFetches < 0 || c.MaxMessageBytes < 0 || c.MaxProducers < 0 {
		errs = append(errs, errors.New("partition: limits must not be negative"))
	}
	return errors.Join(errs...)
}
