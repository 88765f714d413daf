package topic

// The topic room's pure logic: create requests checked, the answers to topic reads, the catalog's encoding, replica names and the stand-in's choices (no goroutines, clock, disk or network).

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sort"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"google.golang.org/protobuf/encoding/protojson"
)

// ---- requests ---------------------------------------------------------------

// normalize validates a create request's config and fills its defaults,
// by the manager's config c.
func normalize(c *Config, name string, in *heraldpb.TopicConfig) (*heraldpb.TopicConfig, *heraldpb.Error) {
	bad := func(format string, args ...any) *heraldpb.Error {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, format, args...)
	}
	if !registry.WellFormed(name) {
		return nil, bad("topic name %q must be 1-200 characters of A-Z a-z 0-9 . _ -", name)
	}
	if registry.IsInternal(name) {
		return nil, bad("topic name %q: names starting with __ are reserved for internal topics", name)
	}
	cfg := &heraldpb.TopicConfig{}
	if in != nil {
		cfg = &heraldpb.TopicConfig{Partitions: in.Partitions, ReplicationFactor: in.ReplicationFactor,
			RetentionMs: in.RetentionMs, RetentionBytes: in.RetentionBytes, MaxMessageBytes: in.MaxMessageBytes,
			MessageTtlMs: in.MessageTtlMs}
	}
	if p := ttlProblem(cfg); p != "" {
		return nil, bad("%s", p)
	}
	if cfg.Partitions == 0 {
		if in != nil {
			// A config that states 0 partitions is a mistake (the CLI
			// refuses it too); only a request without a config takes the
			// broker's default.
			return nil, bad("partitions must be at least 1 (omit the config to take the broker's default-partitions, %d)", c.DefaultPartitions)
		}
		cfg.Partitions = c.DefaultPartitions
	}
	if cfg.Partitions > c.MaxPartitions {
		return nil, bad("partitions %d exceeds the broker's max of %d", cfg.Partitions, c.MaxPartitions)
	}
	if !c.Clustered {
		if cfg.ReplicationFactor == 0 {
			cfg.ReplicationFactor = 1
		}
		if cfg.ReplicationFactor > 1 {
			return nil, bad("replication factor %d needs %d nodes; this cluster has 1", cfg.ReplicationFactor, cfg.ReplicationFactor)
		}
	}
	cfg.MinInsyncReplicas = in.GetMinInsyncReplicas()
	if cfg.RetentionMs < 0 || cfg.RetentionBytes < 0 {
		return nil, bad("retention must not be negative")
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = c.MaxMessageBytes
	}
	if cfg.MaxMessageBytes > c.MaxMessageBytes {
		return nil, bad("max message bytes %d exceeds the broker's max of %d", cfg.MaxMessageBytes, c.MaxMessageBytes)
	}
	return cfg, nil
}

// requestedTopic names a topic of a metadata request, for messages.
func requestedTopic(f *heraldpb.Frame) string {
	switch b := f.Body.(type) {
	case *heraldpb.Frame_DescribeTopic:
		return b.DescribeTopic.Name
	case *heraldpb.Frame_Metadata:
		if len(b.Metadata.Topics) > 0 {
			return b.Metadata.Topics[0]
		}
	}
	return "*"
}

// listTopics answers ListTopics from the registry's entries, as node
// sees them: the client topics (an internal one is described by name
// only).
func listTopics(entries []*registry.Entry, node uint32) *heraldpb.ListTopicsResponse {
	resp := &heraldpb.ListTopicsResponse{}
	for _, e := range entries {
		if !registry.IsInternal(e.Name) { // internal topics: DescribeTopic by name
			resp.Topics = append(resp.Topics, e.Info(node))
		}
	}
	return resp
}

// metadata answers Metadata from the registry's entries: brokers, and
// the topics named (every client topic when none is). A topic named and
// not there is TOPIC_NOT_FOUND, naming the first missing by name.
func metadata(entries []*registry.Entry, topics []string, brokers []*heraldpb.BrokerInfo, node uint32) (*heraldpb.MetadataResponse, *heraldpb.Error) {
	resp := &heraldpb.MetadataResponse{Brokers: brokers}
	want := map[string]bool{}
	for _, t := range topics {
		want[t] = true
	}
	for _, e := range entries {
		if (len(want) == 0 && !registry.IsInternal(e.Name)) || want[e.Name] {
			resp.Topics = append(resp.Topics, e.Info(node))
			delete(want, e.Name)
		}
	}
	if len(want) > 0 {
		var missing []string
		for t := range want {
			missing = append(missing, t)
		}
		sort.Strings(missing)
		return nil, topicNotFound(missing[0])
	}
	return resp, nil
}

// ---- the catalog --------------------------------------------------------------

type catalogDoc struct {
	Topics []json.RawMessage `json:"topics"`
}

// encodeCatalog is the content of the catalog file: the node's own
// topics among entries, with their configs.
func encodeCatalog(entries []*registry.Entry) ([]byte, error) {
	var doc catalogDoc
	for _, e := range entries {
		if e.Record != nil {
			continue // a cluster topic: the controller holds it
		}
		raw, err := protojson.Marshal(&heraldpb.TopicInfo{Name: e.Name, Config: e.Config})
		if err != nil {
			return nil, err
		}
		doc.Topics = append(doc.Topics, raw)
	}
	return json.MarshalIndent(doc, "", "  ")
}

// decodeCatalog reads the catalog from r, the file at path (named in
// errors).
func decodeCatalog(r io.Reader, path string) ([]*heraldpb.TopicInfo, error) {
	var doc catalogDoc
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return nil, fmt.Errorf("topic: catalog %s is damaged: %w", path, err)
	}
	var out []*heraldpb.TopicInfo
	for _, raw := range doc.Topics {
		ti := &heraldpb.TopicInfo{}
		if err := protojson.Unmarshal(raw, ti); err != nil {
			return nil, fmt.Errorf("topic: catalog entry: %w", err)
		}
		out = append(out, ti)
	}
	return out, nil
}

// ---- replicas (cluster mode) --------------------------------------------------

func sortedKeys[V any](mp map[string]V) []string {
	out := make([]string, 0, len(mp))
	for k := range mp {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func partKey(topic string, p uint32) string { return fmt.Sprintf("%s/%d", topic, p) }

// groupOf is the transport name of a cluster topic partition's raft
// group: with the topic's id, so that the replicas of a topic deleted
// and made again under its name (one node may run an old one for a
// moment) never take each other's raft messages.
func groupOf(rec *heraldpb.TopicRecord, p uint32) string {
	return partition.Name(rec.Name, p) + "@" + rec.RequestId
}

// replicaDir is the log folder, under dataDir, of node self's replica of
// a partition, or "" when self holds none (it is neither among the
// replicas nor in the target). The topic's id keeps a re-created topic of
// the same name from reopening an old log, and the id of the move that
// added this node a replica added again after it left.
func replicaDir(dataDir string, self uint64, rec *heraldpb.TopicRecord, pa *heraldpb.PartitionAssignment) string {
	if !slices.Contains(pa.Replicas, self) && !slices.Contains(pa.Target, self) {
		return ""
	}
	name := fmt.Sprintf("%s-%d-%s", rec.Name, pa.Id, rec.RequestId)
	if j := pa.Joined[self]; j != "" {
		name += "-" + j
	}
	return filepath.Join(dataDir, "replicas", name)
}

// setTarget tells a replica its partition's target, by raft id.
func setTarget(pa *heraldpb.PartitionAssignment) *partition.SetTarget {
	return &partition.SetTarget{Target: pa.RaftIDs(pa.Target), Joined: pa.Joined}
}

// ready reports whether a new topic can take writes: every partition of
// a local topic is writable, by idempotent producers (the SDK's default)
// too unless the topic is internal; every local replica of a cluster
// topic knows its leader.
func ready(e *registry.Entry, remote *actor.PID, internal bool) bool {
	for i, st := range e.Stats {
		switch {
		case e.Record == nil && (!st.Writable.Load() || (!internal && !st.Idempotent.Load())):
			return false
		case e.Record != nil && e.Partitions[i] != remote && st.Leader.Load() == 0:
			return false
		}
	}
	return true
}

// ---- the stand-in for remote partitions ------------------------------------------

// proxyNodes is the order in which the stand-in tries the nodes for a
// partition placed as pa: hint (the node that took the partition's last
// produce; 0: none), the leader this node last saw (0: none), then the
// replicas and the target; each once, and never self.
func proxyNodes(hint, leader, self uint64, pa *heraldpb.PartitionAssignment) []uint64 {
	var nodes []uint64
	if hint != 0 {
		nodes = append(nodes, hint)
	}
	if leader != 0 && leader != self && !slices.Contains(nodes, leader) {
		nodes = append(nodes, leader)
	}
	for _, n := range append(slices.Clone(pa.Replicas), pa.Target...) {
		if n != self && !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	return nodes
}

// noteRemote keeps the published state of a partition with no local
// replica from the answers the stand-in relays (the node that took a
// produce leads it; a fetch gives the log's bounds), so that metadata
// and group lag show more than zeros for it.
func noteRemote(st *partition.Stats, f, resp *heraldpb.Frame, from uint64) {
	if st == nil {
		return
	}
	// The bounds only grow: an answer from a replica that lags must not
	// make readers think the log ends earlier than they read.
	bounds := func(hw, start int64) {
		if hw > st.HighWatermark.Load() {
			st.HighWatermark.Store(hw)
		}
		if start > st.StartOffset.Load() {
			st.StartOffset.Store(start)
		}
	}
	switch {
	case resp.GetProduceResponse() != nil:
		st.Leader.Store(from)
	case resp.GetFetchResponse() != nil && !f.GetFetch().GetIncludeHeld():
		// (an include_held answer's end counts batches not readable yet)
		bounds(resp.GetFetchResponse().HighWatermark, resp.GetFetchResponse().LogStartOffset)
	case resp.GetListOffsetsResponse() != nil:
		bounds(resp.GetListOffsetsResponse().HighWatermark, resp.GetListOffsetsResponse().LogStartOffset)
	case resp.GetError().GetCode() == heraldpb.ErrorCode_NOT_LEADER && f.GetProduce() != nil:
		st.Leader.Store(uint64(resp.GetError().GetLeader()))
	}
}
