package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	"github.com/heraldmq/herald/exchange"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// The controller group: cluster metadata in a raft group, `__controller`.
// Its voters are the controller voters (the lowest MaxVoters node ids of
// the cluster's peers); every other node holds a learner replica, added
// by the group's leader once the node has registered, so that every node
// reads the metadata from its own replica. The group's log is a partition
// log whose records are ControllerCommands; every node's Controller reads
// its own replica's committed records and applies them in order, so all
// nodes agree on the metadata. Writes are produce requests to the group's
// leader: made locally when this node leads, forwarded through the
// cluster transport otherwise (at most once: the proposer watches its
// replica for the command's outcome and sends it again until it is
// applied; applying is idempotent). The metadata holds the node registry
// and the topics with their replica placement. The log is compacted with
// checkpoints of the whole metadata (checkpoint.go), so a replica's log
// starts at a checkpoint and a restarting node replays only what came
// after the last one.

// ControllerTopic is the controller group's name as a partition log.
const ControllerTopic = "__controller"

// MaxVoters is how many nodes hold a replica of the controller group.
const MaxVoters = 3

// RegistrationGroup is where a node that is not a voter sends its
// registration, on every voter: a filter there drops a registration the
// metadata already holds, so that repeating it does not grow the log.
const RegistrationGroup = "controller/register"

// Voters picks the controller voters among node ids: the lowest MaxVoters.
func Voters(ids []uint64) []uint64 {
	v := slices.Clone(ids)
	slices.Sort(v)
	v = slices.Compact(v)
	return v[:min(len(v), MaxVoters)]
}

// ControllerConfig configures a node's controller.
type ControllerConfig struct {
	Node    *Node
	Local   *actor.ActorSystem // the node's local actor system
	DataDir string             // the replica's log goes to DataDir/controller
	Voters  []uint64
	// Self is what this node registers (node id, addresses, rack); the
	// member id and time are filled in at each registration.
	Self *heraldpb.NodeRecord
	// Reregister is how often a node whose registration its replica does
	// not show yet announces itself again. Default 2 s.
	Reregister time.Duration
	// OnApply, if set, is called with the new metadata once the commands
	// committed so far are applied (from the controller's goroutine; keep
	// it short).
	OnApply func(*Metadata)
	// VerifyNode, if set, proves that a registering node (other than
	// this one) is the node it says: the leader registers it only once
	// VerifyNode returns nil (with mutual TLS between nodes: the node's
	// certificate names its id). A refusal is logged and counted.
	VerifyNode func(n *heraldpb.NodeRecord) error
	// ReplicaGrace is how long a node may be down before the controller
	// moves its replicas to other nodes. Default 5 minutes.
	ReplicaGrace time.Duration
	// MaxMoves bounds the partitions the controller's own loop has being
	// moved at a time. Default 8.
	MaxMoves int
	// CheckpointRecords and CheckpointBytes: the group's leader writes a
	// checkpoint of the whole metadata once the log holds this many
	// records, or records of this many bytes, after the last checkpoint
	// (or from its start); every replica then truncates its log before
	// the checkpoint. Defaults DefaultCheckpointRecords and
	// DefaultCheckpointBytes; 0 means the default.
	CheckpointRecords int
	CheckpointBytes   int
	// MaxCheckpointBytes is the controller log's max message size, so the
	// largest encoded checkpoint: metadata past it is not compacted (the
	// leader logs ErrCheckpointTooLarge and the log keeps growing).
	// Default DefaultMaxCheckpointBytes.
	MaxCheckpointBytes int
	// FS is the controller log's filesystem; nil = persistence.OSFS.
	FS persistence.FS
	// Clock is the controller replica's clock (partition.Config.Clock);
	// nil = partition.SystemClock.
	Clock  partition.Clock
	Logger *slog.Logger
}

// Metadata is the state the controller group's log builds. It is
// immutable once published; apply makes a new one.
type Metadata struct {
	Nodes  map[uint64]*heraldpb.NodeRecord
	Topics map[string]*heraldpb.TopicRecord
	Users  map[string]*heraldpb.UserRecord
	Acls   []*heraldpb.AclRule // in the order added; never changed in place
	Vhosts map[string]*heraldpb.VhostRecord
	// Exchanges with their bindings, by name.
	Exchanges exchange.Metadata
	Applied   int64 // offset after the last record applied
	// Checkpoint is the offset of the last checkpoint applied (0: none).
	// SinceRecords and SinceBytes count the records applied after it
	// (from the log's start if none) and their bytes.
	Checkpoint   int64
	SinceRecords int64
	SinceBytes   int64
}

// clone is a copy of md whose maps may be changed (the records in them
// are shared and must not be).
func (md *Metadata) clone() *Metadata {
	c := *md
	c.Nodes, c.Topics, c.Users = maps.Clone(md.Nodes), maps.Clone(md.Topics), maps.Clone(md.Users)
	if c.Users == nil {
		c.Users = map[string]*heraldpb.UserRecord{}
	}
	c.Vhosts = maps.Clone(md.Vhosts)
	if c.Vhosts == nil {
		c.Vhosts = map[string]*heraldpb.VhostRecord{}
	}
	c.Exchanges = md.Exchanges.Clone()
	if c.Exchanges == nil {
		c.Exchanges = exchange.Metadata{}
	}
	return &c
}

// ControllerView is a node's view of the controller, for /cluster.
type ControllerView struct {
	Voter   bool                   `json:"voter"`
	Voters  []uint64               `json:"voters"`
	Leader  uint64                 `json:"leader"`
	Applied int64                  `json:"applied"`
	Nodes   []*heraldpb.NodeRecord `json:"nodes"`
	Topics  int                    `json:"topics"`
	// Learners are the nodes holding a learner replica of the group.
	Learners []uint64 `json:"learners,omitempty"`
	// LogStart is the offset the local replica's log starts at: the last
	// checkpoint it was truncated at, or 0. Checkpoint is the offset of
	// the last checkpoint applied (0: none), SinceCheckpoint the records
	// applied after it. CheckpointError is why this node, leading the
	// group, could not write its last checkpoint ("" if it could).
	LogStart        int64  `json:"log_start"`
	Checkpoint      int64  `json:"checkpoint"`
	SinceCheckpoint int64  `json:"since_checkpoint"`
	CheckpointError string `json:"checkpoint_error,omitempty"`
}

// Controller runs this node's part of the controller group.
type Controller struct {
	cfg ControllerConfig
	log *slog.Logger

	takeoverLogged time.Time // onRegistration: a refused takeover last logged
	// Registrations VerifyNode proved (by node id: its addresses) and
	// those being proved (at most maxVerifying at a time).
	vmu       sync.Mutex
	verified  map[uint64]verifyKey
	verifying map[verifyKey]bool
	refusedAt time.Time
	group     string
	voter     bool
	pid       *actor.PID
	filter    *actor.PID // on a voter: drops registrations already applied
	sent      atomic.Int64
	stats     *partition.Stats
	state     atomic.Pointer[Metadata]
	stop      chan struct{}
	done      sync.WaitGroup
	// cpErr is the last error writing a checkpoint ("" after a success).
	cpErr atomic.Pointer[string]
}

// StartController starts the controller replica (on a voter) and the
// node's registration.
func StartController(cfg ControllerConfig) (*Controller, error) {
	if cfg.Node == nil || cfg.Local == nil || cfg.Self == nil || cfg.Self.NodeId == 0 || len(cfg.Voters) == 0 {
		return nil, errors.New("herald: controller config incomplete")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Reregister <= 0 {
		cfg.Reregister = 2 * time.Second
	}
	if cfg.ReplicaGrace <= 0 {
		cfg.ReplicaGrace = 5 * time.Minute
	}
	if cfg.MaxMoves <= 0 {
		cfg.MaxMoves = 8
	}
	if cfg.CheckpointRecords <= 0 {
		cfg.CheckpointRecords = DefaultCheckpointRecords
	}
	if cfg.CheckpointBytes <= 0 {
		cfg.CheckpointBytes = DefaultCheckpointBytes
	}
	if cfg.MaxCheckpointBytes <= 0 {
		cfg.MaxCheckpointBytes = DefaultMaxCheckpointBytes
	}
	c := &Controller{cfg: cfg, log: cfg.Logger.With("component", "controller"), group: partition.Name(ControllerTopic, 0),
		voter: slices.Contains(cfg.Voters, cfg.Self.NodeId), stop: make(chan struct{})}
	c.state.Store(&Metadata{Nodes: map[uint64]*heraldpb.NodeRecord{}, Topics: map[string]*heraldpb.TopicRecord{}, Users: map[string]*heraldpb.UserRecord{}, Vhosts: map[string]*heraldpb.VhostRecord{}, Exchanges: exchange.Metadata{}})
	// Voters bootstrap the group together; any other node's replica
	// starts empty and waits to be added as a learner.
	peers := map[uint64]*actor.PID{cfg.Self.NodeId: nil}
	if c.voter {
		for _, v := range cfg.Voters {
			peers[v] = nil
		}
	}
	dir := filepath.Join(cfg.DataDir, "controller")
	c.stats = &partition.Stats{}
	props, err := partition.Props(cfg.Local, partition.Config{
		Topic: ControllerTopic, Partition: 0, ReplicaID: cfg.Self.NodeId, Peers: peers, Transport: cfg.Node, Join: !c.voter,
		Liveness: cfg.Node.Up, MaxMessageBytes: cfg.MaxCheckpointBytes,
		Open: func() (partition.Storage, error) {
			return persistence.Open(persistence.Options{Dir: dir, FS: cfg.FS, Group: "__controller-0", Logger: cfg.Logger})
		},
		Clock:  cfg.Clock,
		Logger: cfg.Logger,
	}, c.stats)
	if err != nil {
		return nil, err
	}
	if c.pid, err = cfg.Local.Root.SpawnNamed(props, c.group); err != nil {
		return nil, fmt.Errorf("controller replica: %w", err)
	}
	cfg.Node.Register(c.group, c.pid)
	if c.voter {
		if c.filter, err = cfg.Local.Root.SpawnNamed(actor.PropsFromFunc(c.onRegistration), RegistrationGroup); err != nil {
			return nil, fmt.Errorf("controller registration filter: %w", err)
		}
		cfg.Node.Register(RegistrationGroup, c.filter)
	}
	c.done.Add(5)
	go c.tail()
	go c.register()
	go c.addLearners()
	go c.moveAway()
	go c.compact()
	c.log.Info("controller started", "voter", c.voter, "voters", cfg.Voters)
	return c, nil
}

// Stop stops the controller replica and the node's registration.
func (c *Controller) Stop() {
	close(c.stop)
	c.done.Wait()
	c.cfg.Node.Unregister(c.group)
	if c.filter != nil {
		c.cfg.Node.Unregister(RegistrationGroup)
		_ = c.cfg.Local.Root.StopFuture(c.filter).Wait()
	}
	_ = c.cfg.Local.Root.StopFuture(c.pid).Wait()
}

// Metadata is the latest applied state: empty until this node's replica
// has caught up (on a node that is not a voter, until the leader has added
// it as a learner).
func (c *Controller) Metadata() *Metadata { return c.state.Load() }

// View is the controller as this node sees it.
func (c *Controller) View() ControllerView {
	md := c.state.Load()
	v := ControllerView{Voter: c.voter, Voters: c.cfg.Voters, Applied: md.Applied, Topics: len(md.Topics), Leader: c.leader(),
		LogStart: c.stats.StartOffset.Load(), Checkpoint: md.Checkpoint, SinceCheckpoint: md.SinceRecords}
	if e := c.cpErr.Load(); e != nil {
		v.CheckpointError = *e
	}
	if cs := c.stats.Conf.Load(); cs != nil {
		v.Learners = cs.Learners
	}
	for _, id := range slices.Sorted(maps.Keys(md.Nodes)) {
		v.Nodes = append(v.Nodes, md.Nodes[id])
	}
	return v
}

// tail applies the local replica's committed records as they come. It
// reads from the log's start: after a restart, or when the log was
// replaced by a raft snapshot (a replica that fell behind the leader's
// truncated log), the record it would read next is gone and the log
// starts at a checkpoint, which replaces the metadata.
func (c *Controller) tail() {
	defer c.done.Done()
	next, published := int64(0), int64(-1)
	jumped := int64(-1) // the log start the tail moved to, until read
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		// Whether the local replica has heard from a leader before this
		// read: only then is its commit index the group's (after a restart
		// it is the one saved before the crash, which may be older than
		// what this node applied then).
		leaderKnown := c.leader() != 0
		res, err := c.cfg.Local.Root.RequestFuture(c.pid, &heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
			Topic: ControllerTopic, Offset: next, MaxBytes: 1 << 20, MaxWaitMs: 500,
		}}}, 5*time.Second).Result()
		resp := frameOf(res).GetFetchResponse()
		if e := frameOf(res).GetError(); err == nil && e.GetCode() == heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE {
			if start, ok := c.logStart(); ok && start > next {
				c.log.Info("controller log starts after the next record to apply (truncated at a checkpoint, or replaced by a raft snapshot): reading from its start",
					"next", next, "log_start", start)
				next, jumped = start, start
				continue
			}
		}
		if err != nil || resp == nil {
			if !c.sleep(100 * time.Millisecond) {
				return
			}
			continue
		}
		before := next
		if len(resp.Batches) > 0 {
			next = c.apply(resp.Batches, next, jumped == next)
			jumped = -1
			md := c.state.Load()
			for id, n := range md.Nodes {
				c.cfg.Node.Learn(id, n.ClusterAddress, n.HealthAddress)
			}
			mSinceRecords.Set(float64(md.SinceRecords))
			mSinceBytes.Set(float64(md.SinceBytes))
		}
		// Replicas follow the metadata only once it is caught up with the
		// group's committed log, never an older state on the way: after a
		// restart the whole log is read again, and a replica moved away
		// and back must not be stopped or started by an old state.
		if leaderKnown && next >= resp.HighWatermark && next > published && c.cfg.OnApply != nil {
			c.cfg.OnApply(c.state.Load())
			published = next
		}
		// A long poll that ended early with nothing new (its queue full),
		// or a batch that does not decode: do not spin on it.
		if next == before && resp.HighWatermark > next {
			if !c.sleep(100 * time.Millisecond) {
				return
			}
		}
	}
}

func frameOf(res interface{}) *heraldpb.Frame {
	f, _ := res.(*heraldpb.Frame)
	return f
}

// logStart is where the local replica's log starts, if it answers.
func (c *Controller) logStart() (int64, bool) {
	res, err := c.cfg.Local.Root.RequestFuture(c.pid, &heraldpb.Frame{Body: &heraldpb.Frame_ListOffsets{ListOffsets: &heraldpb.ListOffsetsRequest{
		Topic: ControllerTopic, Spec: heraldpb.OffsetSpec_OFFSET_SPEC_EARLIEST,
	}}}, 5*time.Second).Result()
	lo := frameOf(res).GetListOffsetsResponse()
	if err != nil || lo == nil {
		return 0, false
	}
	return lo.LogStartOffset, true
}

// apply applies the records from offset from on, and returns where the
// next read starts. atStart: from is where the log starts, after a
// truncation, so its record must be a checkpoint; so must a record that
// follows a gap (a read that spanned a raft snapshot's install).
func (c *Controller) apply(batches []*heraldpb.StoredBatch, from int64, atStart bool) int64 {
	md := c.state.Load().clone()
	expect := from // the next record's offset, unless there is a gap
	if atStart {
		expect = -1
	}
	for _, b := range batches {
		err := heraldpb.ForEachRawRecord(b.Records, func(i int, rec []byte) bool {
			off := b.BaseOffset + int64(i)
			if off < from {
				return true
			}
			resumed := off != expect
			expect = off + 1
			cmd, err := applyRecord(md, off, rec)
			switch cp := cmd.GetCheckpoint(); {
			case resumed && (cp == nil || md.Checkpoint != off):
				c.log.Error("the controller log resumes at a record that is not a checkpoint: the metadata lacks what was truncated before it",
					"offset", off, "from", from, "err", err)
			case err != nil:
				c.log.Error("undecodable controller record; skipped", "offset", off, "err", err)
			case cp != nil && md.Checkpoint == off:
				c.log.Info("controller checkpoint applied", "offset", off, "nodes", len(md.Nodes), "topics", len(md.Topics))
			case cp != nil:
				c.log.Info("controller checkpoint ignored: records came between the state it holds and itself",
					"offset", off, "checkpoint_of", cp.Offset)
			case cmd.GetReassignPartitions() != nil || cmd.GetCompleteReassignment() != nil:
				c.log.Info("partition move metadata applied", "offset", off, "command", cmd.String())
			}
			return true
		})
		if end := b.BaseOffset + int64(b.Count); err != nil && end > from {
			c.log.Error("undecodable controller batch; skipped", "offset", b.BaseOffset, "err", err)
			md.Applied = max(md.Applied, end)
			expect = max(expect, end)
		}
	}
	c.state.Store(md)
	return max(from, md.Applied)
}

// applyRecord applies the record at offset off, rec (a Record whose value
// is a ControllerCommand), to md (a private copy whose maps are its own),
// and returns the command. A checkpoint stored at the offset it was made
// for replaces the metadata; any other record counts as one since the
// last checkpoint, whether it applies or not.
func applyRecord(md *Metadata, off int64, rec []byte) (*heraldpb.ControllerCommand, error) {
	md.Applied = off + 1
	var r heraldpb.Record
	var cmd heraldpb.ControllerCommand
	err := proto.Unmarshal(rec, &r)
	if err == nil {
		err = proto.Unmarshal(r.Value, &cmd)
	}
	if cp := cmd.GetCheckpoint(); err == nil && cp != nil && cp.Offset == off {
		applyCheckpoint(md, cp, off)
		return &cmd, nil
	}
	md.SinceRecords++
	md.SinceBytes += int64(len(rec))
	if err != nil {
		return nil, err
	}
	applyCommand(md, &cmd)
	return &cmd, nil
}

// applyCommand applies one command to md (a private copy whose maps are
// its own). Commands that do not apply (a topic that exists already, a
// deletion of one that does not, a checkpoint, which applyRecord handles)
// change nothing.
func applyCommand(md *Metadata, cmd *heraldpb.ControllerCommand) {
	switch {
	case cmd.GetRegisterNode() != nil:
		if n := cmd.GetRegisterNode(); n.NodeId != 0 {
			if old := md.Nodes[n.NodeId]; old != nil && old.Decommissioned != n.Decommissioned {
				n = proto.Clone(n).(*heraldpb.NodeRecord)
				n.Decommissioned = old.Decommissioned // only DecommissionNode changes it
			}
			md.Nodes[n.NodeId] = n
		}
	case cmd.GetCreateTopic() != nil:
		t := cmd.GetCreateTopic()
		if t.Name != "" && md.Topics[t.Name] == nil {
			t.RequestId = cmd.RequestId
			md.Topics[t.Name] = t
		}
	case cmd.GetDeleteTopic() != nil:
		delete(md.Topics, cmd.GetDeleteTopic().Name)
		md.Exchanges.DeleteTopic(cmd.GetDeleteTopic().Name)
	case cmd.GetReassignPartitions() != nil:
		applyReassign(md, cmd)
	case cmd.GetCompleteReassignment() != nil:
		applyComplete(md, cmd.GetCompleteReassignment())
	case cmd.GetDecommissionNode() != nil:
		applyDecommission(md, cmd.GetDecommissionNode())
	case cmd.GetUpsertUser() != nil:
		u := cmd.GetUpsertUser()
		have := md.Users[u.Name]
		switch {
		case u.Name == "" || u.Create && have != nil || u.GroupsOnly && have == nil:
		case u.GroupsOnly && u.QuotasOnly:
		case u.GroupsOnly:
			n := proto.Clone(have).(*heraldpb.UserRecord)
			n.Groups, n.UpdatedMs, n.RequestId = u.Groups, u.UpdatedMs, cmd.RequestId
			md.Users[u.Name] = n
		case u.QuotasOnly:
			if have == nil {
				break
			}
			n := proto.Clone(have).(*heraldpb.UserRecord)
			n.Quotas, n.UpdatedMs, n.RequestId = u.Quotas, u.UpdatedMs, cmd.RequestId
			md.Users[u.Name] = n
		default:
			u.RequestId = cmd.RequestId
			if have != nil && !u.Create {
				u.Groups, u.Quotas = have.Groups, have.Quotas // a new password keeps them
			}
			md.Users[u.Name] = u
		}
	case cmd.GetDeleteUser() != nil:
		delete(md.Users, cmd.GetDeleteUser().Name)
	case cmd.GetAlterAcls() != nil:
		md.Acls = AlterRules(md.Acls, cmd.GetAlterAcls())
	case cmd.GetUpsertVhost() != nil:
		v := cmd.GetUpsertVhost()
		if v.Name != "" && !(v.Create && md.Vhosts[v.Name] != nil) {
			v.RequestId = cmd.RequestId
			md.Vhosts[v.Name] = v
		}
	case cmd.GetDeleteVhost() != nil:
		delete(md.Vhosts, cmd.GetDeleteVhost().Name)
		md.Acls = RulesWithoutVhost(md.Acls, cmd.GetDeleteVhost().Name)
		md.Exchanges.DeleteVhost(cmd.GetDeleteVhost().Name + "~")
	case cmd.GetDeclareExchange() != nil:
		x := cmd.GetDeclareExchange()
		x.RequestId = cmd.RequestId
		_, _ = md.Exchanges.Declare(x) // a conflict or a bad one changes nothing
	case cmd.GetDeleteExchange() != nil:
		d := cmd.GetDeleteExchange()
		_ = md.Exchanges.Delete(d.Name, d.IfUnused)
	case cmd.GetBind() != nil:
		b := cmd.GetBind()
		if t := b.GetBinding().GetTopic(); t != "" && !b.Unbind && md.Topics[t] == nil {
			break // the topic was deleted meanwhile
		}
		_, _ = md.Exchanges.Bind(b.Binding, b.Unbind)
	}
}

// register announces this node to the controller group until this
// node's replica shows it under its current member id: produced locally
// when this node leads the group, else sent to the leader's registration
// filter (or, with no leader known, to every voter's; the followers drop
// it). It announces itself again every Reregister until it sees itself.
func (c *Controller) register() {
	defer c.done.Done()
	lastSent, lastMember := time.Time{}, ""
	for c.sleep(100 * time.Millisecond) {
		member := c.cfg.Node.View().Self.MemberID
		if n := c.state.Load().Nodes[c.cfg.Self.NodeId]; n != nil && n.MemberId == member {
			continue
		}
		if member == lastMember && time.Since(lastSent) < c.cfg.Reregister {
			continue
		}
		rec := proto.Clone(c.cfg.Self).(*heraldpb.NodeRecord)
		rec.MemberId, rec.RegisteredMs = member, time.Now().UnixMilli()
		// This version gives replicas raft ids per incarnation and routes
		// them (applyReassign turns that on once every node says so).
		rec.ReplicaRaftIds = true
		f := commandFrame(&heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_RegisterNode{RegisterNode: rec}})
		switch leader := c.leader(); {
		case leader == c.cfg.Self.NodeId:
			_, _ = c.cfg.Local.Root.RequestFuture(c.pid, f, 5*time.Second).Result()
		case leader != 0:
			c.cfg.Node.Forward(leader, RegistrationGroup, f)
		default:
			for _, v := range c.cfg.Voters {
				c.cfg.Node.Forward(v, RegistrationGroup, f)
			}
		}
		c.sent.Add(1)
		lastSent, lastMember = time.Now(), member
	}
}

// commandFrame is the produce request that appends cmd to the group.
func commandFrame(cmd *heraldpb.ControllerCommand) *heraldpb.Frame {
	value, _ := proto.Marshal(cmd)
	batch, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: value}}})
	return &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
		Topic: ControllerTopic, Partition: proto.Uint32(0), Records: batch, Acks: heraldpb.Acks_ACKS_ALL,
	}}}
}

// addLearners runs on every node and acts on the group's leader: each
// registered node that holds no replica of the group yet is added as a
// learner, one membership change at a time.
func (c *Controller) addLearners() {
	defer c.done.Done()
	for c.sleep(200 * time.Millisecond) {
		if c.leader() != c.cfg.Self.NodeId {
			continue
		}
		cs := c.stats.Conf.Load()
		if cs == nil || len(cs.VotersOutgoing) > 0 {
			continue
		}
		md := c.state.Load()
		for _, id := range slices.Sorted(maps.Keys(md.Nodes)) {
			if slices.Contains(cs.Voters, id) || slices.Contains(cs.Learners, id) || slices.Contains(cs.LearnersNext, id) {
				continue
			}
			res, err := c.cfg.Local.Root.RequestFuture(c.pid, &partition.ChangeMembership{Changes: []raftpb.ConfChangeSingle{
				{Type: raftpb.ConfChangeAddLearnerNode, NodeID: id},
			}}, 5*time.Second).Result()
			if err == nil {
				err = res.(*partition.ChangeMembershipResult).Err
			}
			if err != nil {
				c.log.Debug("adding a learner to the controller group", "node", id, "err", err)
			} else {
				c.log.Info("controller group: node added as a learner", "node", id)
			}
			break // one change at a time: the next round sees its result
		}
	}
}

// leader is the controller group's leader as the local replica knows it
// (0: unknown).
func (c *Controller) leader() uint64 { return c.stats.Leader.Load() }

// Leader is the controller group's leader as this node knows it (0:
// unknown).
func (c *Controller) Leader() uint64 { return c.leader() }

// sleep waits d, or reports false when the controller stops.
func (c *Controller) sleep(d time.Duration) bool {
	select {
	case <-c.stop:
		return false
	case <-time.After(d):
		return true
	}
}

// onRegistration is the registration filter of a voter: a registration
// from a node that is not a voter goes to the group's leader replica
// unless the metadata holds it already (the same member id, addresses and
// rack), or this voter does not lead (the node sends it to every voter).
func (c *Controller) onRegistration(ctx actor.Context) {
	f, ok := ctx.Message().(*heraldpb.Frame)
	if !ok || f.GetProduce() == nil || c.leader() != c.cfg.Self.NodeId {
		return
	}
	var batch heraldpb.RecordBatch
	var cmd heraldpb.ControllerCommand
	if proto.Unmarshal(f.GetProduce().Records, &batch) != nil || len(batch.Records) != 1 ||
		proto.Unmarshal(batch.Records[0].Value, &cmd) != nil || cmd.GetRegisterNode() == nil {
		return
	}
	n := cmd.GetRegisterNode()
	if have := c.state.Load().Nodes[n.NodeId]; have != nil && have.MemberId == n.MemberId &&
		have.ClusterAddress == n.ClusterAddress && have.ClientAddress == n.ClientAddress && have.ClientTlsAddress == n.ClientTlsAddress && have.Rack == n.Rack && have.HealthAddress == n.HealthAddress &&
		have.ReplicaRaftIds == n.ReplicaRaftIds {
		return // applied already
	}
	if have := c.state.Load().Nodes[n.NodeId]; takeover(have, n, c.cfg.Node.View()) {
		mTakeovers.Inc()
		if time.Since(c.takeoverLogged) >= time.Second {
			c.takeoverLogged = time.Now()
			c.log.Warn("refused a registration: its node id is held by a live member at another address",
				"node", n.NodeId, "live_member", have.MemberId, "live_address", have.ClusterAddress,
				"refused_member", n.MemberId, "refused_address", n.ClusterAddress)
		}
		return
	}
	if c.cfg.VerifyNode != nil && !c.proved(n, f) {
		return
	}
	ctx.Send(c.pid, f)
}

// verifyKey is a registration's identity as VerifyNode proves it.
type verifyKey struct {
	id              uint64
	cluster, health string
}

// maxVerifying bounds the registrations being proved at once.
const maxVerifying = 8

// proved reports whether registration n was proved already; if not, it
// starts proving it (unless already under way), and registers it once
// proved. A node repeats its registration until it sees it applied.
func (c *Controller) proved(n *heraldpb.NodeRecord, f *heraldpb.Frame) bool {
	key := verifyKey{n.NodeId, n.ClusterAddress, n.HealthAddress}
	c.vmu.Lock()
	defer c.vmu.Unlock()
	if c.verified[n.NodeId] == key {
		return true
	}
	if c.verifying == nil {
		c.verifying, c.verified = map[verifyKey]bool{}, map[uint64]verifyKey{}
	}
	if c.verifying[key] || len(c.verifying) >= maxVerifying {
		return false
	}
	c.verifying[key] = true
	go func() {
		err := c.cfg.VerifyNode(n)
		c.vmu.Lock()
		delete(c.verifying, key)
		if err == nil {
			c.verified[n.NodeId] = key
		}
		logIt := err != nil && time.Since(c.refusedAt) >= time.Second
		if logIt {
			c.refusedAt = time.Now()
		}
		c.vmu.Unlock()
		if err != nil {
			mIdentityRefused.Inc()
			if logIt {
				c.log.Warn("refused a registration: the node did not prove its id", "node", n.NodeId, "cluster_address", n.ClusterAddress, "err", err)
			}
			return
		}
		c.cfg.Local.Root.Send(c.pid, f)
	}()
	return false
}

var mIdentityRefused = promauto.NewCounter(prometheus.CounterOpts{
	Name: "herald_cluster_identity_refused_total",
	Help: "Registrations refused because the node did not prove its id (with mutual TLS: its certificate does not name it).",
})

var mTakeovers = promauto.NewCounter(prometheus.CounterOpts{
	Name: "herald_cluster_takeovers_refused_total",
	Help: "Registrations refused because their node id is held by a live member at another address (another process claiming a live node's id).",
})

// takeover reports whether registration n would take node n.NodeId over
// from have, a member of the view (alive) at another cluster or health
// address: another process claiming a live node's id. A node that
// restarts at its addresses registers at once; one that moved waits until
// its old member leaves the view (its process died).
func takeover(have, n *heraldpb.NodeRecord, v View) bool {
	if have == nil || have.MemberId == "" || have.MemberId == n.MemberId ||
		(have.ClusterAddress == n.ClusterAddress && have.HealthAddress == n.HealthAddress) {
		return false
	}
	alive := v.Self.MemberID == have.MemberId
	for _, m := range v.Members {
		alive = alive || m.MemberID == have.MemberId
	}
	return alive
}

// propose sends cmd to the group's leader: locally when this node leads,
// through the transport otherwise. It reports whether a leader was known;
// the caller watches the metadata for the command's effect.
func (c *Controller) propose(cmd *heraldpb.ControllerCommand) bool {
	f := commandFrame(cmd)
	switch leader := c.leader(); {
	case leader == 0:
		return false
	case leader == c.cfg.Self.NodeId:
		c.cfg.Local.Root.Send(c.pid, f)
	default:
		c.cfg.Node.Forward(leader, c.group, f)
	}
	return true
}

// await proposes cmd, then waits until done reports the metadata shows its
// effect, proposing it again every second meanwhile (a forwarded command
// may be lost, or its leader may have lost its term).
func (c *Controller) await(ctx context.Context, cmd *heraldpb.ControllerCommand, done func(*Metadata) bool) error {
	resend := time.Now()
	c.propose(cmd)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !done(c.state.Load()) {
		select {
		case <-ctx.Done():
			return heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "the controller did not apply the change in time (leader: node %d)", c.leader())
		case <-c.stop:
			return heraldpb.NewError(heraldpb.ErrorCode_SHUTTING_DOWN, "the node is stopping")
		case <-tick.C:
		}
		if time.Since(resend) >= time.Second {
			resend = time.Now()
			c.propose(cmd)
		}
	}
	return nil
}

// newRequestID is a command's unique id.
func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// CreateTopic places a new topic's replicas over the registered nodes
// that are up, has the controller group record it, and returns the
// record once this node's replica has applied it. cfg must be normalized
// (partitions set); a replication factor of 0 means the default, 3 when
// the cluster has 3 or more nodes, else 1 per node there is. Errors are
// *heraldpb.Error values.
func (c *Controller) CreateTopic(ctx context.Context, name string, cfg *heraldpb.TopicConfig) (*heraldpb.TopicRecord, error) {
	md := c.state.Load()
	if md.Nodes[c.cfg.Self.NodeId] == nil {
		// The metadata has not caught up yet (the node just started).
		e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "node %d is joining its cluster (its metadata does not show it registered yet); try again shortly", c.cfg.Self.NodeId)
		e.RetryAfterMs = 500
		return nil, e
	}
	if md.Topics[name] != nil {
		return nil, heraldpb.NewError(heraldpb.ErrorCode_TOPIC_ALREADY_EXISTS, "topic %q already exists", name)
	}
	view := c.cfg.Node.View()
	var nodes []NodeInfo
	for _, id := range slices.Sorted(maps.Keys(md.Nodes)) {
		if view.Up(id) && !md.Nodes[id].Decommissioned {
			nodes = append(nodes, NodeInfo{ID: id, Rack: md.Nodes[id].Rack})
		}
	}
	cfg = proto.Clone(cfg).(*heraldpb.TopicConfig)
	if cfg.ReplicationFactor == 0 {
		cfg.ReplicationFactor = uint32(min(3, max(1, len(md.Nodes))))
	}
	if int(cfg.ReplicationFactor) > len(md.Nodes) {
		return nil, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST,
			"replication factor %d needs %d nodes; the cluster has %d", cfg.ReplicationFactor, cfg.ReplicationFactor, len(md.Nodes))
	}
	if cfg.MinInsyncReplicas == 0 {
		cfg.MinInsyncReplicas = 1
		if cfg.ReplicationFactor >= 3 {
			cfg.MinInsyncReplicas = 2
		}
	}
	if cfg.MinInsyncReplicas > cfg.ReplicationFactor {
		return nil, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST,
			"min in-sync replicas %d exceeds the replication factor %d", cfg.MinInsyncReplicas, cfg.ReplicationFactor)
	}
	placed, err := Place(int(cfg.Partitions), int(cfg.ReplicationFactor), nodes, Loads(md))
	if err != nil {
		return nil, heraldpb.NewError(heraldpb.ErrorCode_NOT_ENOUGH_REPLICAS,
			"placing %d replicas of each partition: %d of %d registered nodes are up", cfg.ReplicationFactor, len(nodes), len(md.Nodes))
	}
	rec := &heraldpb.TopicRecord{Name: name, Config: cfg, CreatedMs: time.Now().UnixMilli()}
	for p, replicas := range placed {
		rec.Partitions = append(rec.Partitions, &heraldpb.PartitionAssignment{Id: uint32(p), Replicas: replicas})
	}
	id := newRequestID()
	cmd := &heraldpb.ControllerCommand{RequestId: id, Command: &heraldpb.ControllerCommand_CreateTopic{CreateTopic: rec}}
	if err := c.await(ctx, cmd, func(md *Metadata) bool { return md.Topics[name] != nil }); err != nil {
		return nil, err
	}
	got := c.state.Load().Topics[name]
	if got.RequestId != id {
		return nil, heraldpb.NewError(heraldpb.ErrorCode_TOPIC_ALREADY_EXISTS, "topic %q already exists", name)
	}
	return got, nil
}

// DeleteTopic has the controller group delete a topic and returns once
// this node's replica has applied it.
func (c *Controller) DeleteTopic(ctx context.Context, name string) error {
	if c.state.Load().Topics[name] == nil {
		return heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q does not exist", name)
	}
	cmd := &heraldpb.ControllerCommand{RequestId: newRequestID(), Command: &heraldpb.ControllerCommand_DeleteTopic{DeleteTopic: &heraldpb.DeleteTopic{Name: name}}}
	return c.await(ctx, cmd, func(md *Metadata) bool { return md.Topics[name] == nil })
}

// AlterUser has the controller group create, change or delete a user
// (the broker checked the request) and returns once this node's replica
// has applied it. Errors are *heraldpb.Error values.
func (c *Controller) AlterUser(ctx context.Context, req *heraldpb.AlterUserRequest) error {
	name := req.Name
	have := c.state.Load().Users[name]
	switch {
	case req.Create && have != nil:
		return heraldpb.NewError(heraldpb.ErrorCode_USER_ALREADY_EXISTS, "user %q already exists", name)
	case !req.Create && have == nil:
		return heraldpb.NewError(heraldpb.ErrorCode_USER_NOT_FOUND, "user %q does not exist", name)
	}
	id := newRequestID()
	if req.Delete {
		cmd := &heraldpb.ControllerCommand{RequestId: id, Command: &heraldpb.ControllerCommand_DeleteUser{DeleteUser: &heraldpb.DeleteUser{Name: name}}}
		return c.await(ctx, cmd, func(md *Metadata) bool { return md.Users[name] == nil })
	}
	rec := &heraldpb.UserRecord{Name: name, ScramSha256: req.ScramSha256, UpdatedMs: time.Now().UnixMilli(), Create: req.Create,
		Groups: req.Groups, GroupsOnly: req.SetGroups, Quotas: req.Quotas, QuotasOnly: req.SetQuotas}
	cmd := &heraldpb.ControllerCommand{RequestId: id, Command: &heraldpb.ControllerCommand_UpsertUser{UpsertUser: rec}}
	if err := c.await(ctx, cmd, func(md *Metadata) bool {
		u := md.Users[name]
		return u != nil && (u.RequestId == id || req.Create)
	}); err != nil {
		return err
	}
	if req.Create && c.state.Load().Users[name].GetRequestId() != id {
		return heraldpb.NewError(heraldpb.ErrorCode_USER_ALREADY_EXISTS, "user %q already exists", name)
	}
	return nil
}

// AlterRules is rules with req's removals taken out and its additions
// appended (a rule already there is not added twice), as a new slice.
func AlterRules(rules []*heraldpb.AclRule, req *heraldpb.AlterAclsRequest) []*heraldpb.AclRule {
	out := make([]*heraldpb.AclRule, 0, len(rules)+len(req.Add))
	for _, r := range rules {
		if !slices.ContainsFunc(req.Remove, func(x *heraldpb.AclRule) bool { return proto.Equal(x, r) }) {
			out = append(out, r)
		}
	}
	for _, r := range req.Add {
		if !slices.ContainsFunc(out, func(x *heraldpb.AclRule) bool { return proto.Equal(x, r) }) {
			out = append(out, r)
		}
	}
	return out
}

// RulesWithoutVhost is rules without those of vhost: on its resources
// (names vhost~...) or letting principals into it. A vhost deleted and
// made again starts with no rules.
func RulesWithoutVhost(rules []*heraldpb.AclRule, vhost string) []*heraldpb.AclRule {
	if vhost == "" || vhost == "/" {
		return rules
	}
	return slices.DeleteFunc(slices.Clone(rules), func(r *heraldpb.AclRule) bool {
		switch r.ResourceType {
		case heraldpb.AclResourceType_ACL_RESOURCE_VHOST:
			return r.Resource == vhost
		case heraldpb.AclResourceType_ACL_RESOURCE_CLUSTER:
			return false
		}
		return strings.HasPrefix(r.Resource, vhost+"~")
	})
}

// AlterAcls has the controller group add and remove ACL rules (the broker
// checked them) and returns once this node's replica has applied it.
func (c *Controller) AlterAcls(ctx context.Context, req *heraldpb.AlterAclsRequest) error {
	cmd := &heraldpb.ControllerCommand{RequestId: newRequestID(), Command: &heraldpb.ControllerCommand_AlterAcls{AlterAcls: req}}
	has := func(md *Metadata, r *heraldpb.AclRule) bool {
		return slices.ContainsFunc(md.Acls, func(x *heraldpb.AclRule) bool { return proto.Equal(x, r) })
	}
	return c.await(ctx, cmd, func(md *Metadata) bool {
		for _, r := range req.Add {
			if !has(md, r) {
				return false
			}
		}
		for _, r := range req.Remove {
			if has(md, r) && !slices.ContainsFunc(req.Add, func(x *heraldpb.AclRule) bool { return proto.Equal(x, r) }) {
				return false
			}
		}
		return true
	})
}

// AlterVhost has the controller group create, change or delete a vhost
// (the broker checked the request) and returns once this node's replica
// has applied it.
func (c *Controller) AlterVhost(ctx context.Context, req *heraldpb.AlterVhostRequest) error {
	id := newRequestID()
	name := req.Name
	if req.Delete {
		cmd := &heraldpb.ControllerCommand{RequestId: id, Command: &heraldpb.ControllerCommand_DeleteVhost{DeleteVhost: &heraldpb.DeleteVhost{Name: name}}}
		return c.await(ctx, cmd, func(md *Metadata) bool { return md.Vhosts[name] == nil })
	}
	cmd := &heraldpb.ControllerCommand{RequestId: id, Command: &heraldpb.ControllerCommand_UpsertVhost{UpsertVhost: &heraldpb.VhostRecord{Name: name, Quotas: req.Quotas, Create: req.Create}}}
	if err := c.await(ctx, cmd, func(md *Metadata) bool {
		v := md.Vhosts[name]
		return v != nil && (v.RequestId == id || req.Create)
	}); err != nil {
		return err
	}
	if req.Create && c.state.Load().Vhosts[name].GetRequestId() != id {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "vhost %q already exists", name)
	}
	return nil
}

// DeclareExchange has the controller group declare an exchange (or
// check that the one of the name is the same: created false), returning
// once this node's replica has applied it. Errors are *heraldpb.Error
// values.
func (c *Controller) DeclareExchange(ctx context.Context, cfg *heraldpb.ExchangeConfig) (created bool, err error) {
	rec := &heraldpb.ExchangeRecord{Config: cfg, CreatedMs: time.Now().UnixMilli()}
	if _, e := c.state.Load().Exchanges.Clone().Declare(rec); e != nil {
		return false, e
	}
	id := newRequestID()
	cmd := &heraldpb.ControllerCommand{RequestId: id, Command: &heraldpb.ControllerCommand_DeclareExchange{DeclareExchange: rec}}
	if err := c.await(ctx, cmd, func(md *Metadata) bool { return md.Exchanges[cfg.Name] != nil }); err != nil {
		return false, err
	}
	have := c.state.Load().Exchanges[cfg.Name]
	if have.RequestId == id {
		return true, nil
	}
	// Another declaration came first: the same one is a no-op.
	_, e := exchange.Metadata{cfg.Name: have}.Declare(&heraldpb.ExchangeRecord{Config: cfg})
	if e != nil {
		return false, e
	}
	return false, nil
}

// DeleteExchange has the controller group delete an exchange with its
// bindings and the bindings to it.
func (c *Controller) DeleteExchange(ctx context.Context, req *heraldpb.DeleteExchangeRequest) error {
	if e := c.state.Load().Exchanges.Clone().Delete(req.Name, req.IfUnused); e != nil {
		return e
	}
	cmd := &heraldpb.ControllerCommand{RequestId: newRequestID(), Command: &heraldpb.ControllerCommand_DeleteExchange{DeleteExchange: req}}
	return c.await(ctx, cmd, func(md *Metadata) bool { return md.Exchanges[req.Name] == nil })
}

// Bind has the controller group add or remove a binding. A binding to a
// topic needs the topic.
func (c *Controller) Bind(ctx context.Context, req *heraldpb.BindRequest) (changed bool, err error) {
	md := c.state.Load()
	if t := req.GetBinding().GetTopic(); t != "" && !req.Unbind && md.Topics[t] == nil {
		return false, heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q does not exist", t)
	}
	changed, e := md.Exchanges.Clone().Bind(req.Binding, req.Unbind)
	if e != nil {
		return false, e
	}
	if !changed {
		return false, nil
	}
	cmd := &heraldpb.ControllerCommand{RequestId: newRequestID(), Command: &heraldpb.ControllerCommand_Bind{Bind: req}}
	b := req.Binding
	return true, c.await(ctx, cmd, func(md *Metadata) bool {
		x := md.Exchanges[b.Exchange]
		if x == nil {
			return true // deleted meanwhile
		}
		has := slices.ContainsFunc(x.Bindings, func(o *heraldpb.Binding) bool { return exchange.SameBinding(o, b) })
		return has != req.Unbind || !req.Unbind && b.Topic != "" && md.Topics[b.Topic] == nil
	})
}

// Loads counts each node's replicas and preferred leaderships (those of
// running moves' targets).
func Loads(md *Metadata) map[uint64]Load {
	out := map[uint64]Load{}
	for _, t := range md.Topics {
		for _, p := range t.Partitions {
			for i, r := range effective(p) {
				l := out[r]
				l.Replicas++
				if i == 0 {
					l.Leaders++
				}
				out[r] = l
			}
		}
	}
	return out
}
