package cluster

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/heraldmq/herald/actors/partition"
	"github.com/heraldmq/herald/exchange"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Compaction of the controller group's log. Every command stays in the log
// until a checkpoint covers it:
//
//   - The group's leader writes a checkpoint (a ControllerCommand holding
//     the whole metadata) once the records after the last one pass
//     CheckpointRecords or CheckpointBytes. It builds it from its applied
//     state at offset A, only when its replica has nothing uncommitted, and
//     names A in it. A checkpoint stored at any other offset than the one it
//     names is ignored by every replica alike (a command came in between, and
//     the checkpoint does not hold it); the leader tries again later.
//   - Each node's controller, once it has applied a checkpoint at offset C
//     (so C is committed), truncates its own replica's log before C with the
//     partition's DeleteBefore, which never removes an entry that is not
//     applied. Truncation is local to each replica, not a raft command: every
//     replica's log starts at a checkpoint that it applied, or at 0.
//   - A replica behind the leader's truncated log gets a raft snapshot, which
//     here is the leader's log start: its log then starts at the leader's
//     checkpoint, and its tail, whose next record is gone, reads again from
//     the log's start (tail).
//
// So reading a replica's log from its start always gives the whole
// metadata. A checkpoint must fit in one record of the controller log
// (MaxCheckpointBytes); metadata larger than that is not compacted.

// Defaults of ControllerConfig's checkpoint settings.
const (
	DefaultCheckpointRecords  = 1000
	DefaultCheckpointBytes    = 4 << 20
	DefaultMaxCheckpointBytes = 4 << 20
)

// ErrCheckpointTooLarge is returned, and logged by the group's leader,
// when the metadata encoded as a checkpoint exceeds the controller log's
// max message size (ControllerConfig.MaxCheckpointBytes): the log is then
// not compacted, and keeps growing until the metadata shrinks.
var ErrCheckpointTooLarge = errors.New("herald: controller metadata too large for a checkpoint")

// checkpointOf is md as a checkpoint at md.Applied, nodes by id and
// topics by name. It shares md's records.
func checkpointOf(md *Metadata) *heraldpb.ControllerCheckpoint {
	cp := &heraldpb.ControllerCheckpoint{Offset: md.Applied}
	for _, id := range slices.Sorted(maps.Keys(md.Nodes)) {
		cp.Nodes = append(cp.Nodes, md.Nodes[id])
	}
	for _, name := range slices.Sorted(maps.Keys(md.Topics)) {
		cp.Topics = append(cp.Topics, md.Topics[name])
	}
	for _, name := range slices.Sorted(maps.Keys(md.Users)) {
		cp.Users = append(cp.Users, md.Users[name])
	}
	cp.Acls = md.Acls
	for _, name := range slices.Sorted(maps.Keys(md.Vhosts)) {
		cp.Vhosts = append(cp.Vhosts, md.Vhosts[name])
	}
	cp.Exchanges = md.Exchanges.List()
	return cp
}

// checkpointFrame is the produce request that writes md as a checkpoint,
// or an error wrapping ErrCheckpointTooLarge if its batch exceeds limit
// bytes (the partition's max message size).
func checkpointFrame(md *Metadata, limit int) (*heraldpb.Frame, error) {
	f := commandFrame(&heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_Checkpoint{Checkpoint: checkpointOf(md)}})
	if n := len(f.GetProduce().Records); n > limit {
		return nil, fmt.Errorf("%w: %d nodes and %d topics take %d bytes, over the controller log's max message size of %d",
			ErrCheckpointTooLarge, len(md.Nodes), len(md.Topics), n, limit)
	}
	return f, nil
}

// applyCheckpoint replaces md's nodes, topics, users and ACLs with cp's, the
// checkpoint stored at offset off.
func applyCheckpoint(md *Metadata, cp *heraldpb.ControllerCheckpoint, off int64) {
	md.Nodes = make(map[uint64]*heraldpb.NodeRecord, len(cp.Nodes))
	for _, n := range cp.Nodes {
		if n.NodeId != 0 {
			md.Nodes[n.NodeId] = n
		}
	}
	md.Topics = make(map[string]*heraldpb.TopicRecord, len(cp.Topics))
	for _, t := range cp.Topics {
		if t.Name != "" {
			md.Topics[t.Name] = t
		}
	}
	md.Users = make(map[string]*heraldpb.UserRecord, len(cp.Users))
	for _, u := range cp.Users {
		if u.Name != "" {
			md.Users[u.Name] = u
		}
	}
	md.Acls = cp.Acls
	md.Vhosts = make(map[string]*heraldpb.VhostRecord, len(cp.Vhosts))
	for _, v := range cp.Vhosts {
		if v.Name != "" {
			md.Vhosts[v.Name] = v
		}
	}
	md.Exchanges = exchange.FromList(cp.Exchanges)
	md.Checkpoint, md.SinceRecords, md.SinceBytes = off, 0, 0
}

// checkpointDue reports whether the log after md's last checkpoint has
// grown past a threshold.
func (c *Controller) checkpointDue(md *Metadata) bool {
	return md.SinceRecords >= int64(c.cfg.CheckpointRecords) || md.SinceBytes >= int64(c.cfg.CheckpointBytes)
}

// compact runs on every node: it truncates the local replica's log before
// the last checkpoint applied, and on the group's leader writes a
// checkpoint when one is due. See the top of this file.
func (c *Controller) compact() {
	defer c.done.Done()
	var (
		truncated int64       // the checkpoint the local log was last truncated at
		wait      = int64(-1) // no checkpoint until the state is applied past this offset
		retryAt   time.Time   // no checkpoint before this, after a failure
		self      = c.cfg.Self.NodeId
	)
	for c.sleep(200 * time.Millisecond) {
		md := c.state.Load()
		if md.Checkpoint > truncated && c.truncate(md.Checkpoint) {
			truncated = md.Checkpoint
		}
		mLogStart.Set(float64(c.stats.StartOffset.Load()))
		mLogBytes.Set(float64(c.stats.SizeBytes.Load()))
		// Only a leader whose replica has applied every record it holds:
		// a checkpoint built otherwise would land after those records.
		if c.leader() != self || md.Applied <= wait || time.Now().Before(retryAt) || !c.checkpointDue(md) ||
			c.stats.HighWatermark.Load() != md.Applied || c.stats.EndOffset.Load() != md.Applied {
			continue
		}
		at, size, err := c.writeCheckpoint(md)
		if size > 0 {
			mCheckpointSize.Set(float64(size))
		}
		switch {
		case errors.Is(err, ErrCheckpointTooLarge):
			mCheckpointFailures.WithLabelValues("too_large").Inc()
			c.setCheckpointErr(err)
			c.log.Error("controller log not compacted; trying again in a minute", "err", err)
			retryAt = time.Now().Add(time.Minute)
		case err != nil:
			mCheckpointFailures.WithLabelValues("error").Inc()
			c.setCheckpointErr(err)
			c.log.Warn("writing a controller checkpoint", "err", err)
			retryAt = time.Now().Add(time.Second)
		case at != md.Applied:
			mCheckpointFailures.WithLabelValues("superseded").Inc()
			c.log.Info("controller checkpoint superseded: records came before it; will try again", "offset", at, "checkpoint_of", md.Applied)
			wait = at
		default:
			mCheckpoints.Inc()
			c.setCheckpointErr(nil)
			c.log.Info("controller checkpoint written", "offset", at, "bytes", size, "nodes", len(md.Nodes), "topics", len(md.Topics),
				"records_since_last", md.SinceRecords, "bytes_since_last", md.SinceBytes)
			wait = at
		}
	}
}

// writeCheckpoint produces md as a checkpoint to the local replica (the
// leader) and returns the offset it was stored at, and its size in bytes.
func (c *Controller) writeCheckpoint(md *Metadata) (int64, int, error) {
	f, err := checkpointFrame(md, c.cfg.MaxCheckpointBytes)
	if err != nil {
		return 0, 0, err
	}
	size := len(f.GetProduce().Records)
	res, err := c.cfg.Local.Root.RequestFuture(c.pid, f, 10*time.Second).Result()
	if err != nil {
		return 0, size, err
	}
	if e := frameOf(res).GetError(); e != nil {
		return 0, size, e
	}
	pr := frameOf(res).GetProduceResponse()
	if pr == nil {
		return 0, size, fmt.Errorf("unexpected answer %T to a produce", res)
	}
	return pr.BaseOffset, size, nil
}

// truncate removes the local replica's records before the checkpoint at
// offset at, which this node applied; it reports success.
func (c *Controller) truncate(at int64) bool {
	res, err := c.cfg.Local.Root.RequestFuture(c.pid, &partition.DeleteBefore{Offset: at}, 10*time.Second).Result()
	if err == nil {
		if r, ok := res.(*partition.DeleteBeforeResult); !ok {
			err = fmt.Errorf("unexpected answer %T", res)
		} else {
			err = r.Err
		}
	}
	if err != nil {
		c.log.Warn("truncating the controller log before a checkpoint", "checkpoint", at, "err", err)
		return false
	}
	c.log.Info("controller log truncated before a checkpoint", "checkpoint", at, "log_start", c.stats.StartOffset.Load())
	return true
}

func (c *Controller) setCheckpointErr(err error) {
	var s string
	if err != nil {
		s = err.Error()
	}
	c.cpErr.Store(&s)
}
