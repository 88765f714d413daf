package cluster

import (
	"errors"
	"maps"
	"slices"
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// controllerRecord is cmd as the controller log stores it: a Record whose
// value is the command.
func controllerRecord(t *testing.T, cmd *heraldpb.ControllerCommand) []byte {
	t.Helper()
	value, err := proto.Marshal(cmd)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := proto.Marshal(&heraldpb.Record{Value: value})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func checkpointRecord(t *testing.T, md *Metadata) []byte {
	t.Helper()
	return controllerRecord(t, &heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_Checkpoint{Checkpoint: checkpointOf(md)}})
}

func emptyMetadata() *Metadata {
	return &Metadata{Nodes: map[uint64]*heraldpb.NodeRecord{}, Topics: map[string]*heraldpb.TopicRecord{}}
}

// applyAll applies recs at md.Applied on.
func applyAll(t *testing.T, md *Metadata, recs ...[]byte) {
	t.Helper()
	for _, rec := range recs {
		if _, err := applyRecord(md, md.Applied, rec); err != nil {
			t.Fatal(err)
		}
	}
}

// sameMetadata fails unless a and b hold equal nodes and topics.
func sameMetadata(t *testing.T, what string, a, b *Metadata) {
	t.Helper()
	if !slices.Equal(slices.Sorted(maps.Keys(a.Nodes)), slices.Sorted(maps.Keys(b.Nodes))) ||
		!slices.Equal(slices.Sorted(maps.Keys(a.Topics)), slices.Sorted(maps.Keys(b.Topics))) {
		t.Fatalf("%s: nodes %v and %v, topics %v and %v", what, slices.Sorted(maps.Keys(a.Nodes)), slices.Sorted(maps.Keys(b.Nodes)),
			slices.Sorted(maps.Keys(a.Topics)), slices.Sorted(maps.Keys(b.Topics)))
	}
	for id, n := range a.Nodes {
		if !proto.Equal(n, b.Nodes[id]) {
			t.Fatalf("%s: node %d: %v and %v", what, id, n, b.Nodes[id])
		}
	}
	for name, tr := range a.Topics {
		if !proto.Equal(tr, b.Topics[name]) {
			t.Fatalf("%s: topic %s: %v and %v", what, name, tr, b.Topics[name])
		}
	}
}

// A checkpoint stored at the offset it was made for replaces the
// metadata: a replica whose log starts at it (truncated before it) ends
// with the same metadata as one that applied the whole log, and what
// comes after it applies on top. One stored elsewhere (a record came
// between) is ignored, so the record it lacks is not lost.
func TestApplyCheckpoint(t *testing.T) {
	topic := func(name, id string, replicas ...uint64) *heraldpb.ControllerCommand {
		return &heraldpb.ControllerCommand{RequestId: id, Command: &heraldpb.ControllerCommand_CreateTopic{CreateTopic: &heraldpb.TopicRecord{
			Name: name, Config: &heraldpb.TopicConfig{Partitions: 1, ReplicationFactor: uint32(len(replicas))},
			Partitions: []*heraldpb.PartitionAssignment{{Id: 0, Replicas: replicas}},
		}}}
	}
	node := func(id uint64, member string) *heraldpb.ControllerCommand {
		return &heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_RegisterNode{RegisterNode: &heraldpb.NodeRecord{
			NodeId: id, ClusterAddress: "127.0.0.1:1", MemberId: member}}}
	}
	var log [][]byte
	for _, cmd := range []*heraldpb.ControllerCommand{
		node(1, "m1"), node(2, "m2"), node(3, "m3"), node(1, "m1b"),
		topic("a", "ra", 1, 2), topic("b", "rb", 2, 3), topic("c", "rc", 3),
		{Command: &heraldpb.ControllerCommand_DeleteTopic{DeleteTopic: &heraldpb.DeleteTopic{Name: "b"}}},
		{Command: &heraldpb.ControllerCommand_DecommissionNode{DecommissionNode: &heraldpb.DecommissionNode{NodeId: 3, Decommissioned: true}}},
		{RequestId: "move-a", Command: &heraldpb.ControllerCommand_ReassignPartitions{ReassignPartitions: &heraldpb.ReassignPartitions{
			Topic: "a", TopicId: "ra", Partitions: []*heraldpb.PartitionAssignment{{Id: 0, Target: []uint64{2, 1}}}}}},
	} {
		log = append(log, controllerRecord(t, cmd))
	}
	full := emptyMetadata()
	applyAll(t, full, log...)
	if full.Checkpoint != 0 || full.SinceRecords != int64(len(log)) || full.SinceBytes == 0 {
		t.Fatalf("before a checkpoint: checkpoint %d, %d records, %d bytes since", full.Checkpoint, full.SinceRecords, full.SinceBytes)
	}
	if n := full.Nodes[3]; !n.Decommissioned || full.Nodes[1].MemberId != "m1b" || full.Topics["b"] != nil || full.Topics["a"].Partitions[0].ReassignmentId != "move-a" {
		t.Fatalf("the log did not apply: %v", full)
	}

	// The checkpoint, at the offset after the last record.
	cpAt := full.Applied
	cp := checkpointRecord(t, full)
	before := full.clone()
	applyAll(t, full, cp)
	if full.Checkpoint != cpAt || full.SinceRecords != 0 || full.SinceBytes != 0 || full.Applied != cpAt+1 {
		t.Fatalf("after the checkpoint: checkpoint %d, applied %d, %d records since", full.Checkpoint, full.Applied, full.SinceRecords)
	}
	sameMetadata(t, "the whole log, then its own checkpoint", before, full)

	// A replica whose log starts at the checkpoint, holding an older state
	// (it installed a raft snapshot): the checkpoint replaces it.
	truncated := emptyMetadata()
	applyAll(t, truncated, controllerRecord(t, node(9, "gone")), controllerRecord(t, topic("stale", "rs", 9)))
	truncated.Applied = cpAt
	applyAll(t, truncated, cp)
	sameMetadata(t, "a log truncated before the checkpoint", full, truncated)

	// What comes after applies on both.
	after := [][]byte{controllerRecord(t, topic("d", "rd", 1)), controllerRecord(t, node(4, "m4"))}
	applyAll(t, full, after...)
	applyAll(t, truncated, after...)
	sameMetadata(t, "records after the checkpoint", full, truncated)
	if full.SinceRecords != 2 || full.Topics["d"] == nil || full.Nodes[4] == nil {
		t.Fatalf("after the checkpoint: %d records since, %v", full.SinceRecords, full)
	}

	// A checkpoint of the state before "d" and node 4, stored after them:
	// ignored, and counted as a record since the last checkpoint.
	stale := checkpointRecord(t, before)
	kept := full.clone()
	applyAll(t, full, stale)
	sameMetadata(t, "a checkpoint stored after records it lacks", kept, full)
	if full.Checkpoint != cpAt || full.SinceRecords != 3 {
		t.Fatalf("a superseded checkpoint: checkpoint %d, %d records since", full.Checkpoint, full.SinceRecords)
	}

	// A record that does not decode counts, and changes nothing.
	if _, err := applyRecord(full, full.Applied, []byte{0xff}); err == nil {
		t.Fatal("an undecodable record applied")
	}
	sameMetadata(t, "an undecodable record", kept, full)
	if full.SinceRecords != 4 {
		t.Fatalf("%d records since the checkpoint, want 4", full.SinceRecords)
	}
}

// A checkpoint over the controller log's max message size is refused with
// ErrCheckpointTooLarge; under it, it is the metadata.
func TestCheckpointFrameSize(t *testing.T) {
	md := metadataWith(3, nil, map[string][][]uint64{"a": {{1, 2, 3}}, "b": {{2, 3, 1}, {3, 1, 2}}})
	md.Applied = 42
	f, err := checkpointFrame(md, DefaultMaxCheckpointBytes)
	if err != nil {
		t.Fatal(err)
	}
	var batch heraldpb.RecordBatch
	var cmd heraldpb.ControllerCommand
	if err := proto.Unmarshal(f.GetProduce().Records, &batch); err != nil || len(batch.Records) != 1 {
		t.Fatalf("batch: %v, %d records", err, len(batch.Records))
	}
	if err := proto.Unmarshal(batch.Records[0].Value, &cmd); err != nil {
		t.Fatal(err)
	}
	if cp := cmd.GetCheckpoint(); cp.GetOffset() != 42 || len(cp.Nodes) != 3 || len(cp.Topics) != 2 {
		t.Fatalf("checkpoint %v", cp)
	}
	if _, err := checkpointFrame(md, len(f.GetProduce().Records)-1); !errors.Is(err, ErrCheckpointTooLarge) {
		t.Fatalf("one byte over the limit: %v", err)
	}
}

// Users are metadata like topics: created (or, with create, only when
// absent), replaced, deleted by commands, and carried whole by a
// checkpoint, so a replica that starts from one knows every user.
func TestUsersInMetadata(t *testing.T) {
	md := &Metadata{Nodes: map[uint64]*heraldpb.NodeRecord{}, Topics: map[string]*heraldpb.TopicRecord{}, Users: map[string]*heraldpb.UserRecord{}}
	cred := func(b byte) *heraldpb.ScramCredential {
		return &heraldpb.ScramCredential{Salt: []byte{b}, Iterations: 4096}
	}
	apply := func(cmd *heraldpb.ControllerCommand) {
		next := md.clone()
		applyCommand(next, cmd)
		md = next
	}
	apply(&heraldpb.ControllerCommand{RequestId: "a", Command: &heraldpb.ControllerCommand_UpsertUser{UpsertUser: &heraldpb.UserRecord{Name: "alice", ScramSha256: cred(1), Create: true}}})
	apply(&heraldpb.ControllerCommand{RequestId: "b", Command: &heraldpb.ControllerCommand_UpsertUser{UpsertUser: &heraldpb.UserRecord{Name: "alice", ScramSha256: cred(2), Create: true}}})
	if u := md.Users["alice"]; u.RequestId != "a" || u.ScramSha256.Salt[0] != 1 {
		t.Fatalf("a second create replaced the user: %v", u)
	}
	apply(&heraldpb.ControllerCommand{RequestId: "c", Command: &heraldpb.ControllerCommand_UpsertUser{UpsertUser: &heraldpb.UserRecord{Name: "alice", ScramSha256: cred(3)}}})
	apply(&heraldpb.ControllerCommand{RequestId: "d", Command: &heraldpb.ControllerCommand_UpsertUser{UpsertUser: &heraldpb.UserRecord{Name: "bob", ScramSha256: cred(4)}}})
	if u := md.Users["alice"]; u.RequestId != "c" || u.ScramSha256.Salt[0] != 3 {
		t.Fatalf("a change did not replace the credentials: %v", u)
	}
	apply(&heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_DeleteUser{DeleteUser: &heraldpb.DeleteUser{Name: "bob"}}})
	apply(&heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_DeleteUser{DeleteUser: &heraldpb.DeleteUser{Name: "nobody"}}})
	if len(md.Users) != 1 || md.Users["alice"] == nil {
		t.Fatalf("users after deletes: %v", md.Users)
	}
	r1 := &heraldpb.AclRule{Principal: "user:alice", ResourceType: heraldpb.AclResourceType_ACL_RESOURCE_TOPIC, Resource: "t", Operation: heraldpb.AclOperation_ACL_OP_PRODUCE}
	r2 := &heraldpb.AclRule{Principal: "group:g", ResourceType: heraldpb.AclResourceType_ACL_RESOURCE_CLUSTER, Operation: heraldpb.AclOperation_ACL_OP_ADMIN}
	apply(&heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_AlterAcls{AlterAcls: &heraldpb.AlterAclsRequest{Add: []*heraldpb.AclRule{r1, r2, r1}}}})
	apply(&heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_AlterAcls{AlterAcls: &heraldpb.AlterAclsRequest{Remove: []*heraldpb.AclRule{r2}}}})
	if len(md.Acls) != 1 || !proto.Equal(md.Acls[0], r1) {
		t.Fatalf("rules: %v, want only %v once", md.Acls, r1)
	}
	apply(&heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_UpsertUser{UpsertUser: &heraldpb.UserRecord{Name: "alice", Groups: []string{"g"}, GroupsOnly: true}}})
	if u := md.Users["alice"]; len(u.Groups) != 1 || u.ScramSha256.Salt[0] != 3 {
		t.Fatalf("groups only: %v", u)
	}
	restored := &Metadata{}
	applyCheckpoint(restored, checkpointOf(md), 7)
	if len(restored.Users) != 1 || !proto.Equal(restored.Users["alice"], md.Users["alice"]) || len(restored.Acls) != 1 || !proto.Equal(restored.Acls[0], r1) {
		t.Fatalf("checkpoint round trip: %v %v, want %v %v", restored.Users, restored.Acls, md.Users, md.Acls)
	}
}

// Deleting a vhost takes its rules with it: on its resources, or letting
// principals into it; others stay.
func TestRulesWithoutVhost(t *testing.T) {
	r := func(typ heraldpb.AclResourceType, res string) *heraldpb.AclRule {
		return &heraldpb.AclRule{Principal: "user:a", ResourceType: typ, Resource: res, Operation: heraldpb.AclOperation_ACL_OP_ALL}
	}
	keep := []*heraldpb.AclRule{
		r(heraldpb.AclResourceType_ACL_RESOURCE_TOPIC, "shopping"),
		r(heraldpb.AclResourceType_ACL_RESOURCE_TOPIC, "other~t"),
		r(heraldpb.AclResourceType_ACL_RESOURCE_VHOST, "other"),
		r(heraldpb.AclResourceType_ACL_RESOURCE_CLUSTER, ""),
	}
	gone := []*heraldpb.AclRule{
		r(heraldpb.AclResourceType_ACL_RESOURCE_TOPIC, "shop~t"),
		r(heraldpb.AclResourceType_ACL_RESOURCE_GROUP, "shop~"),
		r(heraldpb.AclResourceType_ACL_RESOURCE_VHOST, "shop"),
	}
	got := RulesWithoutVhost(append(slices.Clone(keep), gone...), "shop")
	if len(got) != len(keep) {
		t.Fatalf("left %v, want %v", got, keep)
	}
	for i := range keep {
		if !proto.Equal(got[i], keep[i]) {
			t.Fatalf("left %v, want %v", got, keep)
		}
	}
}

// Exchanges in the controller's metadata: declares (a second of the name
// changes nothing), binds (not to a topic deleted meanwhile), deleting a
// topic takes the bindings to it, deleting an exchange the bindings to
// it; the checkpoint carries them; an earlier metadata snapshot never
// sees a later change.
func TestExchangesInMetadata(t *testing.T) {
	md := &Metadata{Nodes: map[uint64]*heraldpb.NodeRecord{}, Topics: map[string]*heraldpb.TopicRecord{"t": {Name: "t"}, "u": {Name: "u"}}}
	apply := func(cmd *heraldpb.ControllerCommand) {
		next := md.clone()
		applyCommand(next, cmd)
		md = next
	}
	declare := func(id, name string, typ heraldpb.ExchangeType) {
		apply(&heraldpb.ControllerCommand{RequestId: id, Command: &heraldpb.ControllerCommand_DeclareExchange{DeclareExchange: &heraldpb.ExchangeRecord{
			Config: &heraldpb.ExchangeConfig{Name: name, Type: typ}}}})
	}
	bind := func(b *heraldpb.Binding, unbind bool) {
		apply(&heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_Bind{Bind: &heraldpb.BindRequest{Binding: b, Unbind: unbind}}})
	}
	declare("a", "x", heraldpb.ExchangeType_EXCHANGE_DIRECT)
	declare("b", "x", heraldpb.ExchangeType_EXCHANGE_TOPIC)
	declare("c", "y", heraldpb.ExchangeType_EXCHANGE_FANOUT)
	if x := md.Exchanges["x"]; x.RequestId != "a" || x.Config.Type != heraldpb.ExchangeType_EXCHANGE_DIRECT {
		t.Fatalf("a second declare replaced the exchange: %v", x)
	}
	before := md
	bind(&heraldpb.Binding{Exchange: "x", Topic: "t", Key: "k"}, false)
	bind(&heraldpb.Binding{Exchange: "x", Topic: "u", Key: "k"}, false)
	bind(&heraldpb.Binding{Exchange: "x", Topic: "gone", Key: "k"}, false)
	bind(&heraldpb.Binding{Exchange: "y", ToExchange: "x"}, false)
	if len(before.Exchanges["x"].Bindings) != 0 {
		t.Fatal("a bind reached an earlier metadata")
	}
	if n := len(md.Exchanges["x"].Bindings); n != 2 {
		t.Fatalf("x has %d bindings, want 2 (none to a missing topic)", n)
	}
	apply(&heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_DeleteTopic{DeleteTopic: &heraldpb.DeleteTopic{Name: "u"}}})
	if bs := md.Exchanges["x"].Bindings; len(bs) != 1 || bs[0].Topic != "t" {
		t.Fatalf("after deleting u: %v", bs)
	}
	restored := &Metadata{}
	applyCheckpoint(restored, checkpointOf(md), 9)
	if len(restored.Exchanges) != 2 || !proto.Equal(restored.Exchanges["x"], md.Exchanges["x"]) || !proto.Equal(restored.Exchanges["y"], md.Exchanges["y"]) {
		t.Fatalf("checkpoint round trip: %v, want %v", restored.Exchanges, md.Exchanges)
	}
	apply(&heraldpb.ControllerCommand{Command: &heraldpb.ControllerCommand_DeleteExchange{DeleteExchange: &heraldpb.DeleteExchangeRequest{Name: "x"}}})
	if md.Exchanges["x"] != nil || len(md.Exchanges["y"].Bindings) != 0 {
		t.Fatalf("after deleting x: %v", md.Exchanges)
	}
}
