package topic

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/actors/partition"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"google.golang.org/protobuf/proto"
)

// The state tests run the room's pure logic without actors.

func TestNormalize(t *testing.T) {
	c := &Config{DataDir: "d", NodeID: 1}
	c.EnsureDefaults()
	c.MaxPartitions, c.MaxMessageBytes = 8, 1000
	for _, tc := range []struct {
		name, topic string
		in          *heraldpb.TopicConfig
		clustered   bool
		want        *heraldpb.TopicConfig
		err         string // in the INVALID_REQUEST's message
	}{
		{name: "no config takes the defaults", topic: "t",
			want: &heraldpb.TopicConfig{Partitions: 1, ReplicationFactor: 1, MaxMessageBytes: 1000}},
		{name: "a config keeps its values", topic: "t", in: &heraldpb.TopicConfig{Partitions: 3, RetentionMs: 5, RetentionBytes: 6, MaxMessageBytes: 7, MessageTtlMs: 8, MinInsyncReplicas: 1},
			want: &heraldpb.TopicConfig{Partitions: 3, ReplicationFactor: 1, RetentionMs: 5, RetentionBytes: 6, MaxMessageBytes: 7, MessageTtlMs: 8, MinInsyncReplicas: 1}},
		{name: "a cluster leaves the replication factor to the controller", topic: "t", clustered: true, in: &heraldpb.TopicConfig{Partitions: 2},
			want: &heraldpb.TopicConfig{Partitions: 2, MaxMessageBytes: 1000}},
		{name: "bad name", topic: "a b", err: "must be 1-200 characters"},
		{name: "internal name", topic: "__x", err: "reserved for internal topics"},
		{name: "negative ttl", topic: "t", in: &heraldpb.TopicConfig{Partitions: 1, MessageTtlMs: -1}, err: "must not be negative"},
		{name: "zero partitions stated", topic: "t", in: &heraldpb.TopicConfig{}, err: "partitions must be at least 1"},
		{name: "too many partitions", topic: "t", in: &heraldpb.TopicConfig{Partitions: 9}, err: "exceeds the broker's max of 8"},
		{name: "replicas on one node", topic: "t", in: &heraldpb.TopicConfig{Partitions: 1, ReplicationFactor: 3}, err: "needs 3 nodes"},
		{name: "negative retention", topic: "t", in: &heraldpb.TopicConfig{Partitions: 1, RetentionBytes: -1}, err: "retention must not be negative"},
		{name: "message size above the broker's", topic: "t", in: &heraldpb.TopicConfig{Partitions: 1, MaxMessageBytes: 1001}, err: "exceeds the broker's max of 1000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc := *c
			cc.Clustered = tc.clustered
			got, e := normalize(&cc, tc.topic, tc.in)
			if tc.err != "" {
				if e == nil || e.Code != heraldpb.ErrorCode_INVALID_REQUEST || !strings.Contains(e.Message, tc.err) {
					t.Fatalf("got %v, %v; want INVALID_REQUEST with %q", got, e, tc.err)
				}
				return
			}
			if e != nil || !proto.Equal(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, e, tc.want)
			}
		})
	}
}

func entry(name string, parts int) *registry.Entry {
	e := &registry.Entry{Name: name, Config: &heraldpb.TopicConfig{Partitions: uint32(parts)}}
	for range parts {
		e.Partitions = append(e.Partitions, actor.NewPID("x", name))
		e.Stats = append(e.Stats, &partition.Stats{})
	}
	return e
}

func names(ts []*heraldpb.TopicInfo) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Name)
	}
	return out
}

func TestListTopicsAndMetadata(t *testing.T) {
	entries := []*registry.Entry{entry("__groups", 1), entry("a", 2), entry("b", 1)}
	if got := names(listTopics(entries, 1).Topics); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("listTopics: %v, want the client topics a, b", got)
	}
	brokers := []*heraldpb.BrokerInfo{{NodeId: 1, Addr: "x"}}
	resp, e := metadata(entries, nil, brokers, 1)
	if e != nil || !slices.Equal(names(resp.Topics), []string{"a", "b"}) || resp.Brokers[0].Addr != "x" {
		t.Fatalf("metadata of all: %v, %v", resp, e)
	}
	if len(resp.Topics[0].Partitions) != 2 || resp.Topics[0].Partitions[1].Replicas[0] != 1 {
		t.Fatalf("metadata's topic a: %v", resp.Topics[0])
	}
	resp, e = metadata(entries, []string{"__groups", "b"}, brokers, 1)
	if e != nil || !slices.Equal(names(resp.Topics), []string{"__groups", "b"}) {
		t.Fatalf("metadata of named topics (internal ones by name): %v, %v", resp, e)
	}
	if _, e = metadata(entries, []string{"z", "a", "y"}, brokers, 1); e.GetCode() != heraldpb.ErrorCode_TOPIC_NOT_FOUND || !strings.Contains(e.Message, `"y"`) {
		t.Fatalf("metadata of missing topics: %v, want TOPIC_NOT_FOUND naming y (the first by name)", e)
	}
	for f, want := range map[*heraldpb.Frame]string{
		{Body: &heraldpb.Frame_DescribeTopic{DescribeTopic: &heraldpb.DescribeTopicRequest{Name: "d"}}}:   "d",
		{Body: &heraldpb.Frame_Metadata{Metadata: &heraldpb.MetadataRequest{Topics: []string{"m", "n"}}}}: "m",
		{Body: &heraldpb.Frame_Metadata{Metadata: &heraldpb.MetadataRequest{}}}:                           "*",
		{Body: &heraldpb.Frame_ListTopics{ListTopics: &heraldpb.ListTopicsRequest{}}}:                     "*",
	} {
		if got := requestedTopic(f); got != want {
			t.Errorf("requestedTopic(%T) = %q, want %q", f.Body, got, want)
		}
	}
}

func TestCatalogRoundTrip(t *testing.T) {
	a, b, cl := entry("a", 2), entry("__schedule", 1), entry("c", 1)
	a.Config.RetentionMs = 60000
	cl.Record = &heraldpb.TopicRecord{Name: "c"} // a cluster topic: the controller's
	data, err := encodeCatalog([]*registry.Entry{a, b, cl})
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeCatalog(strings.NewReader(string(data)), "dir/catalog.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "a" || !proto.Equal(got[0].Config, a.Config) || got[1].Name != "__schedule" {
		t.Fatalf("decoded %v from\n%s", got, data)
	}
	if _, err := decodeCatalog(strings.NewReader(`{"topics": [`), "dir/catalog.json"); err == nil || !strings.Contains(err.Error(), "catalog dir/catalog.json is damaged") {
		t.Fatalf("a torn catalog: %v", err)
	}
	if _, err := decodeCatalog(strings.NewReader(`{"topics": [{"name": 5}]}`), "p"); err == nil || !strings.Contains(err.Error(), "catalog entry") {
		t.Fatalf("a bad entry: %v", err)
	}
}

func TestReplicaDir(t *testing.T) {
	rec := &heraldpb.TopicRecord{Name: "t", RequestId: "r1"}
	for _, tc := range []struct {
		pa   *heraldpb.PartitionAssignment
		want string
	}{
		{&heraldpb.PartitionAssignment{Id: 2, Replicas: []uint64{1, 3}}, ""},
		{&heraldpb.PartitionAssignment{Id: 2, Replicas: []uint64{1, 7}}, "t-2-r1"},
		{&heraldpb.PartitionAssignment{Id: 2, Replicas: []uint64{1}, Target: []uint64{7}, Joined: map[uint64]string{7: "m9"}}, "t-2-r1-m9"},
	} {
		want := tc.want
		if want != "" {
			want = filepath.Join("data", "replicas", want)
		}
		if got := replicaDir("data", 7, rec, tc.pa); got != want {
			t.Errorf("replicaDir(node 7, %v) = %q, want %q", tc.pa, got, want)
		}
	}
	if g := groupOf(rec, 2); g != partition.Name("t", 2)+"@r1" {
		t.Errorf("groupOf = %q", g)
	}
	if got := sortedKeys(map[string]int{"b": 1, "a": 2, "c": 3}); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("sortedKeys = %v", got)
	}
}

func TestReady(t *testing.T) {
	local := entry("t", 2)
	local.Stats[0].Writable.Store(true)
	local.Stats[1].Writable.Store(true)
	if !ready(local, nil, true) {
		t.Fatal("an internal topic whose partitions are writable is ready")
	}
	if ready(local, nil, false) {
		t.Fatal("a client topic is ready only once idempotent producers may write")
	}
	local.Stats[0].Idempotent.Store(true)
	local.Stats[1].Idempotent.Store(true)
	if !ready(local, nil, false) {
		t.Fatal("a client topic writable by idempotent producers is ready")
	}
	remote := actor.NewPID("x", "remote")
	cl := entry("c", 2)
	cl.Record = &heraldpb.TopicRecord{Name: "c"}
	cl.Partitions[1] = remote
	if ready(cl, remote, false) {
		t.Fatal("a local replica that knows no leader is not ready")
	}
	cl.Stats[0].Leader.Store(3)
	if !ready(cl, remote, false) {
		t.Fatal("every local replica knows its leader (partition 1 is held elsewhere): ready")
	}
}

func TestProxyNodes(t *testing.T) {
	pa := &heraldpb.PartitionAssignment{Replicas: []uint64{1, 2, 3}, Target: []uint64{4, 2}}
	for _, tc := range []struct {
		hint, leader uint64
		want         []uint64
	}{
		{0, 0, []uint64{2, 3, 4}},
		{3, 0, []uint64{3, 2, 4}},
		{0, 4, []uint64{4, 2, 3}},
		{3, 3, []uint64{3, 2, 4}},
		{2, 1, []uint64{2, 3, 4}}, // self (1) as the leader seen: never tried
	} {
		if got := proxyNodes(tc.hint, tc.leader, 1, pa); !slices.Equal(got, tc.want) {
			t.Errorf("proxyNodes(hint %d, leader %d) = %v, want %v", tc.hint, tc.leader, got, tc.want)
		}
	}
}

func TestNoteRemote(t *testing.T) {
	st := &partition.Stats{}
	produce := &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{}}}
	fetch := &heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{}}}
	held := &heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{IncludeHeld: true}}}
	fetched := func(hw, start int64) *heraldpb.Frame {
		return &heraldpb.Frame{Body: &heraldpb.Frame_FetchResponse{FetchResponse: &heraldpb.FetchResponse{HighWatermark: hw, LogStartOffset: start}}}
	}
	noteRemote(st, produce, &heraldpb.Frame{Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{}}}, 2)
	if st.Leader.Load() != 2 {
		t.Fatalf("the node that took a produce leads: leader %d", st.Leader.Load())
	}
	noteRemote(st, produce, heraldpb.ErrorFrame(0, &heraldpb.Error{Code: heraldpb.ErrorCode_NOT_LEADER, Leader: 3}), 2)
	if st.Leader.Load() != 3 {
		t.Fatalf("NOT_LEADER names the leader: leader %d", st.Leader.Load())
	}
	noteRemote(st, fetch, fetched(10, 4), 2)
	noteRemote(st, fetch, fetched(8, 2), 3) // a replica that lags
	noteRemote(st, held, fetched(50, 9), 2) // counts batches not readable yet
	if st.HighWatermark.Load() != 10 || st.StartOffset.Load() != 4 {
		t.Fatalf("bounds %d..%d, want 4..10: they only grow, and not from include_held answers", st.StartOffset.Load(), st.HighWatermark.Load())
	}
	noteRemote(nil, fetch, fetched(10, 4), 2) // a local follower's stats: left alone
}
