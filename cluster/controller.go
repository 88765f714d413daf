package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// The controller group: cluster metadata in a raft group, `__controller`,
// with a replica on each controller voter (the first MaxVoters node ids of
// the cluster's peers). The group's log is a partition log whose records
// are ControllerCommands; every voter's Controller reads its own replica's
// committed records (followers serve committed data too) and applies them
// in order, so the voters agree on the metadata. Writes are produce
// requests to the group's leader: made locally when this node leads,
// forwarded through the cluster transport otherwise. This first version
// holds the node registry; topics and replica placement come next.

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
	// Reregister is how often a node that is not a voter (it cannot see
	// the metadata) announces itself again. Default 1 minute.
	Reregister time.Duration
	Logger     *slog.Logger
}

// Metadata is the state the controller group's log builds.
type Metadata struct {
	Nodes   map[uint64]*heraldpb.NodeRecord
	Applied int64 // offset after the last record applied
}

// ControllerView is a node's view of the controller, for /cluster.
type ControllerView struct {
	Voter   bool                   `json:"voter"`
	Voters  []uint64               `json:"voters"`
	Leader  uint64                 `json:"leader"`
	Applied int64                  `json:"applied"`
	Nodes   []*heraldpb.NodeRecord `json:"nodes"`
}

// Controller runs this node's part of the controller group.
type Controller struct {
	cfg    ControllerConfig
	log    *slog.Logger
	group  string
	voter  bool
	pid    *actor.PID
	filter *actor.PID // on a voter: drops registrations already applied
	sent   atomic.Int64
	stats  *partition.Stats
	state  atomic.Pointer[Metadata]
	stop   chan struct{}
	done   sync.WaitGroup
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
		cfg.Reregister = time.Minute
	}
	c := &Controller{cfg: cfg, log: cfg.Logger.With("component", "controller"), group: partition.Name(ControllerTopic, 0),
		voter: slices.Contains(cfg.Voters, cfg.Self.NodeId), stop: make(chan struct{})}
	c.state.Store(&Metadata{Nodes: map[uint64]*heraldpb.NodeRecord{}})
	if c.voter {
		peers := map[uint64]*actor.PID{}
		for _, v := range cfg.Voters {
			peers[v] = nil
		}
		dir := filepath.Join(cfg.DataDir, "controller")
		c.stats = &partition.Stats{}
		props, err := partition.Props(cfg.Local, partition.Config{
			Topic: ControllerTopic, Partition: 0, ReplicaID: cfg.Self.NodeId, Peers: peers, Transport: cfg.Node,
			Open: func() (partition.Storage, error) {
				return persistence.Open(persistence.Options{Dir: dir, Group: "__controller-0", Logger: cfg.Logger})
			},
			Logger: cfg.Logger,
		}, c.stats)
		if err != nil {
			return nil, err
		}
		if c.pid, err = cfg.Local.Root.SpawnNamed(props, c.group); err != nil {
			return nil, fmt.Errorf("controller replica: %w", err)
		}
		cfg.Node.Register(c.group, c.pid)
		if c.filter, err = cfg.Local.Root.SpawnNamed(actor.PropsFromFunc(c.onRegistration), RegistrationGroup); err != nil {
			return nil, fmt.Errorf("controller registration filter: %w", err)
		}
		cfg.Node.Register(RegistrationGroup, c.filter)
		c.done.Add(1)
		go c.tail()
	}
	c.done.Add(1)
	go c.register()
	c.log.Info("controller started", "voter", c.voter, "voters", cfg.Voters)
	return c, nil
}

// Stop stops the controller replica and the node's registration.
func (c *Controller) Stop() {
	close(c.stop)
	c.done.Wait()
	if c.pid != nil {
		c.cfg.Node.Unregister(c.group)
		c.cfg.Node.Unregister(RegistrationGroup)
		_ = c.cfg.Local.Root.StopFuture(c.filter).Wait()
		_ = c.cfg.Local.Root.StopFuture(c.pid).Wait()
	}
}

// Metadata is the latest applied state (empty on a node that is not a
// voter: it holds no replica yet).
func (c *Controller) Metadata() *Metadata { return c.state.Load() }

// View is the controller as this node sees it.
func (c *Controller) View() ControllerView {
	md := c.state.Load()
	v := ControllerView{Voter: c.voter, Voters: c.cfg.Voters, Applied: md.Applied}
	if c.stats != nil {
		v.Leader = c.stats.Leader.Load()
	}
	for _, id := range slices.Sorted(maps.Keys(md.Nodes)) {
		v.Nodes = append(v.Nodes, md.Nodes[id])
	}
	return v
}

// tail applies the local replica's committed records as they come.
func (c *Controller) tail() {
	defer c.done.Done()
	next := int64(0)
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		res, err := c.cfg.Local.Root.RequestFuture(c.pid, &heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
			Topic: ControllerTopic, Offset: next, MaxBytes: 1 << 20, MaxWaitMs: 500,
		}}}, 5*time.Second).Result()
		resp := frameOf(res).GetFetchResponse()
		if err != nil || resp == nil {
			if !c.sleep(100 * time.Millisecond) {
				return
			}
			continue
		}
		before := next
		if len(resp.Batches) > 0 {
			next = c.apply(resp.Batches, next)
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

// apply applies the records from offset from on, and returns where the
// next read starts.
func (c *Controller) apply(batches []*heraldpb.StoredBatch, from int64) int64 {
	old := c.state.Load()
	md := &Metadata{Nodes: maps.Clone(old.Nodes), Applied: old.Applied}
	for _, b := range batches {
		err := heraldpb.ForEachRawRecord(b.Records, func(i int, rec []byte) bool {
			off := b.BaseOffset + int64(i)
			if off < from {
				return true
			}
			var r heraldpb.Record
			var cmd heraldpb.ControllerCommand
			if proto.Unmarshal(rec, &r) != nil || proto.Unmarshal(r.Value, &cmd) != nil {
				c.log.Error("undecodable controller record; skipped", "offset", off)
			} else if n := cmd.GetRegisterNode(); n != nil && n.NodeId != 0 {
				md.Nodes[n.NodeId] = n
			}
			md.Applied = off + 1
			return true
		})
		if end := b.BaseOffset + int64(b.Count); err != nil && end > from {
			c.log.Error("undecodable controller batch; skipped", "offset", b.BaseOffset, "err", err)
			md.Applied = max(md.Applied, end)
		}
	}
	c.state.Store(md)
	return max(from, md.Applied)
}

// register announces this node to the controller group until the
// metadata holds it under its current member id: produced locally when
// this node leads the group, else forwarded to the leader (or, on a node
// without a replica, to every voter; the followers drop it). A node that
// is not a voter cannot see the metadata yet, so it announces itself
// when its member id changes and otherwise every minute.
func (c *Controller) register() {
	defer c.done.Done()
	lastSent, lastMember := time.Time{}, ""
	for c.sleep(min(time.Second, c.cfg.Reregister)) {
		member := c.cfg.Node.View().Self.MemberID
		if c.voter {
			if n := c.state.Load().Nodes[c.cfg.Self.NodeId]; n != nil && n.MemberId == member {
				continue
			}
		} else if member == lastMember && time.Since(lastSent) < c.cfg.Reregister {
			continue
		}
		rec := proto.Clone(c.cfg.Self).(*heraldpb.NodeRecord)
		rec.MemberId, rec.RegisteredMs = member, time.Now().UnixMilli()
		value, _ := proto.Marshal(&heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_RegisterNode{RegisterNode: rec}})
		batch, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: value}}})
		f := &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{
			Topic: ControllerTopic, Partition: proto.Uint32(0), Records: batch,
		}}}
		switch leader := c.leader(); {
		case c.voter && leader == c.cfg.Self.NodeId:
			_, _ = c.cfg.Local.Root.RequestFuture(c.pid, f, 5*time.Second).Result()
		case leader != 0:
			c.cfg.Node.Forward(leader, c.group, f)
		case !c.voter:
			for _, v := range c.cfg.Voters {
				c.cfg.Node.Forward(v, RegistrationGroup, f)
			}
		}
		c.sent.Add(1)
		lastSent, lastMember = time.Now(), member
	}
}

// leader is the controller group's leader as the local replica knows it
// (0: unknown, or no local replica).
func (c *Controller) leader() uint64 {
	if c.stats == nil {
		return 0
	}
	return c.stats.Leader.Load()
}

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
		have.ClusterAddress == n.ClusterAddress && have.ClientAddress == n.ClientAddress && have.Rack == n.Rack {
		return // applied already
	}
	ctx.Send(c.pid, f)
}
