// Package registry is the node's table of live topics: for each, its
// partitions' actors and published state, read by the network loops, the
// actor rooms and the admin API without an actor hop. The topic manager
// (actors/topic) writes it. It belongs to the shared layer that the actor
// rooms use; it imports only actors/partition (for its published Stats)
// and proto.
package registry

import (
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	heraldpb "github.com/heraldmq/herald/proto"
)

// Entry is a live topic as the router and admin requests see it.
type Entry struct {
	Name       string
	Config     *heraldpb.TopicConfig
	Topic      *actor.PID
	Partitions []*actor.PID
	Stats      []*partition.Stats
	// Record is a cluster topic's controller record (nil: a local topic).
	// Partitions without a local replica have a stand-in PID.
	Record *heraldpb.TopicRecord
	// Dirs, for a cluster topic: each local replica's log folder ("" for a
	// partition with no local replica).
	Dirs []string
	// Remote, for a cluster topic, is the stand-in that forwards requests
	// to the nodes holding a partition's replicas.
	Remote *actor.PID
	// next is the round-robin cursor of produces that name neither a
	// partition nor a key (Route).
	next atomic.Uint32
}

// Route chooses the partition of a produce request and the actor it goes
// to from this node: the named partition, else the first record key's
// hash, else round robin (over the partitions this node leads, for a
// cluster topic, when it leads any). An idempotent produce must name its
// partition, and goes to the partition's actor here even if a follower
// (which answers NOT_LEADER naming the leader): its batches must reach the
// leader in order. Safe for concurrent use (the network loops call it).
func (e *Entry) Route(req *heraldpb.ProduceRequest) (uint32, *actor.PID, *heraldpb.Error) {
	n := uint32(len(e.Partitions))
	var part uint32
	switch {
	case req.ProducerId != 0 && req.Partition == nil:
		return 0, nil, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "an idempotent produce (producer_id %d) must name its partition", req.ProducerId)
	case req.Partition != nil:
		if *req.Partition >= n {
			return 0, nil, heraldpb.NewError(heraldpb.ErrorCode_PARTITION_NOT_FOUND, "topic %q has %d partitions; there is no partition %d", e.Name, n, *req.Partition)
		}
		part = *req.Partition
	default:
		info, err := heraldpb.ScanBatch(req.Records)
		if err != nil {
			return 0, nil, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "%v", err)
		}
		if len(info.FirstKey) > 0 {
			part = heraldpb.PartitionForKey(info.FirstKey, n)
		} else {
			part = e.roundRobin(n)
		}
	}
	if req.ProducerId != 0 {
		return part, e.Partitions[part], nil
	}
	return part, e.Writer(int(part)), nil
}

// roundRobin is the next partition in turn; for a cluster topic, the next
// one this node leads, if it leads any.
func (e *Entry) roundRobin(n uint32) uint32 {
	if e.Record != nil {
		for range n {
			p := (e.next.Add(1) - 1) % n
			if e.Stats[p].Writable.Load() {
				return p
			}
		}
	}
	return (e.next.Add(1) - 1) % n
}

// LeadTerm is the raft term of the local replica of an internal topic's
// single partition while it accepts writes (leads), else 0: the epoch of
// the room that runs on that leader (the transaction coordinator on
// __txn's, the scheduler on __schedule's).
func (e *Entry) LeadTerm() uint64 {
	if e == nil || len(e.Stats) != 1 || !e.Stats[0].Writable.Load() {
		return 0
	}
	return e.Stats[0].Term.Load()
}

// Writer is where a produce to partition p goes from this node: its
// local replica, unless that is a follower in a cluster (its leader is on
// another node), then the stand-in, which forwards it to the leader.
func (e *Entry) Writer(p int) *actor.PID {
	if e.Record == nil || e.Remote == nil || e.Stats[p].Writable.Load() {
		return e.Partitions[p]
	}
	return e.Remote
}

// Registry maps topic names to their actors. The manager writes it
// (copy-on-write); readers never lock.
type Registry struct {
	mu sync.Mutex // serialises writers
	v  atomic.Pointer[map[string]*Entry]
	// synced is set once the registry lists the node's topics: at once on
	// a single node (the catalog is read before serving), in a cluster
	// once the manager applied the controller's metadata, which the
	// controller hands over only when it has caught up with its group.
	synced atomic.Bool
}

// Synced reports whether the registry lists the node's topics yet. Until
// then a topic missing from it may exist: requests for it are answered
// NOT_READY (NotReady), never TOPIC_NOT_FOUND.
func (r *Registry) Synced() bool { return r.synced.Load() }

// SetSynced marks the registry as listing the node's topics (the topic
// manager, once it has them).
func (r *Registry) SetSynced() { r.synced.Store(true) }

// NotReadyRetryAfter is the retry-after of a NOT_READY answer.
const NotReadyRetryAfter = 200 * time.Millisecond

// NotReady is the answer to a request for a topic the node may not know
// yet because it has not caught up with the controller.
func NotReady(topic string) *heraldpb.Error {
	e := heraldpb.NewError(heraldpb.ErrorCode_NOT_READY, "this node has not loaded the cluster's metadata yet (topic %q); try again shortly", topic)
	e.RetryAfterMs = uint32(NotReadyRetryAfter / time.Millisecond)
	return e
}

// Get returns the live topic name, or nil.
func (r *Registry) Get(name string) *Entry {
	if m := r.v.Load(); m != nil {
		return (*m)[name]
	}
	return nil
}

// All returns the live topics sorted by name.
func (r *Registry) All() []*Entry {
	m := r.v.Load()
	if m == nil {
		return nil
	}
	out := make([]*Entry, 0, len(*m))
	for _, e := range *m {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Same reports whether a and b are entries of the same topic (not one
// deleted and created again under its name): in a cluster a topic's
// entry is replaced whenever its placement or local replicas change.
func Same(a, b *Entry) bool { return a != nil && b != nil && a.Topic == b.Topic }

// Current is the live entry of e's topic: the registry's now if it is
// the same topic (its partition PIDs and stats may have changed as
// replicas moved), else e itself (the topic is gone).
func (r *Registry) Current(e *Entry) *Entry {
	if cur := r.Get(e.Name); Same(cur, e) && len(cur.Partitions) == len(e.Partitions) {
		return cur
	}
	return e
}

// Update replaces the table with a copy that fn changed. Writers (the
// topic manager) only; readers see either the old table or the new one.
func (r *Registry) Update(fn func(m map[string]*Entry)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := make(map[string]*Entry)
	if m := r.v.Load(); m != nil {
		for k, v := range *m {
			next[k] = v
		}
	}
	fn(next)
	r.v.Store(&next)
}

// Info renders an entry for Metadata and Describe, as node sees it.
func (e *Entry) Info(node uint32) *heraldpb.TopicInfo {
	ti := &heraldpb.TopicInfo{Name: e.Name, Config: e.Config}
	for i, s := range e.Stats {
		leader := uint32(s.Leader.Load())
		replicas, target := []uint32{node}, []uint32(nil)
		if e.Record != nil {
			replicas = replicas[:0]
			for _, r := range e.Record.Partitions[i].Replicas {
				replicas = append(replicas, uint32(r))
			}
			for _, r := range e.Record.Partitions[i].Target {
				target = append(target, uint32(r))
			}
		}
		pi := &heraldpb.PartitionInfo{
			Id: uint32(i), Leader: leader, Replicas: replicas, TargetReplicas: target,
			LogStartOffset: s.StartOffset.Load(), HighWatermark: s.HighWatermark.Load(), SizeBytes: s.SizeBytes.Load(),
			BytesOut: uint64(s.BytesOut.Load()),
		}
		if isr := s.InSync.Load(); isr != nil {
			pi.InSyncReplicas = *isr
		}
		ti.Partitions = append(ti.Partitions, pi)
	}
	return ti
}

var validName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,200}$`)

// ValidName reports whether name may name a client topic: 1-200
// characters of A-Z a-z 0-9 . _ -, not "." or "..", and not an internal
// topic's (starting with __), in the default vhost or after a vhost's
// prefix (vhost.go). CreateTopic refuses any other name.
func ValidName(name string) bool { return WellFormed(name) && !IsInternal(name) }

// WellFormed reports whether name has a topic name's form (1-200
// characters of A-Z a-z 0-9 . _ -, not "." or "..", after a vhost's
// prefix if any), internal or not.
func WellFormed(name string) bool {
	if v, local, ok := strings.Cut(name, VhostSep); ok {
		if !ValidVhost(v) {
			return false
		}
		name = local
	}
	return validName.MatchString(name) && name != "." && name != ".."
}

// IsInternal reports whether name is an internal topic's (__groups,
// __schedule, ...): clients cannot produce to it or create one. In a
// vhost, names starting with __ are refused too.
func IsInternal(name string) bool {
	_, local := VhostOf(name)
	return len(local) >= 2 && local[:2] == "__"
}
