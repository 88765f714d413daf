package auth

import (
	"strings"
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

func rule(principal string, typ heraldpb.AclResourceType, name string, prefix bool, op heraldpb.AclOperation, deny bool) *heraldpb.AclRule {
	return &heraldpb.AclRule{Principal: principal, ResourceType: typ, Resource: name, Prefix: prefix, Operation: op, Deny: deny}
}

const (
	topicT   = heraldpb.AclResourceType_ACL_RESOURCE_TOPIC
	groupT   = heraldpb.AclResourceType_ACL_RESOURCE_GROUP
	clusterT = heraldpb.AclResourceType_ACL_RESOURCE_CLUSTER
)

func produceTo(topic string) *heraldpb.Frame {
	return &heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: topic}}}
}

func fetchFrom(topic string) *heraldpb.Frame {
	return &heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{Topic: topic}}}
}

// The rules: allow by user, group, user:* and anonymous; literal, prefix
// and *; a deny wins over every allow; describe comes with any other
// operation; nothing is allowed by default; internal topics are out of
// reach of everyone but superusers.
func TestACLs(t *testing.T) {
	s := service(t)
	u := s.cfg.Users.List()
	m := map[string]*heraldpb.UserRecord{}
	for _, r := range u {
		m[r.Name] = r
	}
	m["alice"].Groups = []string{"payments"}
	s.cfg.Users.Set(m)
	s.ACLs().Set([]*heraldpb.AclRule{
		rule("user:alice", topicT, "orders", false, opProduce, false),
		rule("group:payments", topicT, "pay.", true, opAll, false),
		rule("group:payments", topicT, "pay.secret", false, opConsume, true),
		rule("user:*", topicT, "public", false, opConsume, false),
		rule("anonymous", topicT, "open", false, opProduce, false),
		rule("user:bob", topicT, "*", false, opConsume, false),
	})
	sub := func(topic, group string) *heraldpb.Frame {
		return &heraldpb.Frame{Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{Topic: topic, Group: group}}}
	}
	for _, tc := range []struct {
		who   string
		f     *heraldpb.Frame
		allow bool
		msg   string
	}{
		{"alice", produceTo("orders"), true, ""},
		{"alice", fetchFrom("orders"), false, `user "alice" may not consume topic "orders"`},
		{"alice", &heraldpb.Frame{Body: &heraldpb.Frame_DescribeTopic{DescribeTopic: &heraldpb.DescribeTopicRequest{Name: "orders"}}}, true, ""},
		{"alice", produceTo("orders2"), false, "may not produce"},
		{"alice", produceTo("pay.in"), true, ""},
		{"alice", fetchFrom("pay.in"), true, ""},
		{"alice", fetchFrom("pay.secret"), false, "may not consume"},
		{"alice", produceTo("pay.secret"), true, ""},
		{"alice", fetchFrom("public"), true, ""},
		{"", fetchFrom("public"), false, "an anonymous connection may not consume"},
		{"", produceTo("open"), true, ""},
		{"alice", produceTo("open"), false, ""},
		{"bob", fetchFrom("anything"), true, ""},
		{"bob", sub("anything", "g"), false, `may not consume group "g"`},
		{"bob", fetchFrom("__groups"), false, `topic "__groups" is internal`},
		{"root", fetchFrom("__groups"), true, ""},
		{"root", &heraldpb.Frame{Body: &heraldpb.Frame_ClusterAdmin{ClusterAdmin: &heraldpb.ClusterAdminRequest{}}}, true, ""},
		// A prefix written in the default vhost stops at the vhost's names.
		{"alice", produceTo("pay.x"), true, ""},
		{"alice", produceTo("shop~pay.x"), false, "may not produce"},
		{"alice", &heraldpb.Frame{Body: &heraldpb.Frame_ClusterAdmin{ClusterAdmin: &heraldpb.ClusterAdminRequest{}}}, false, "may not admin on the cluster"},
	} {
		e := s.Authorize(tc.who, "/", tc.f)
		if (e == nil) != tc.allow {
			t.Errorf("%q %T: %v, want allowed %v", tc.who, tc.f.Body, e, tc.allow)
			continue
		}
		if e != nil && (e.Code != heraldpb.ErrorCode_NOT_AUTHORIZED || !strings.Contains(e.Message, tc.msg)) {
			t.Errorf("%q %T: %v, want NOT_AUTHORIZED with %q", tc.who, tc.f.Body, e, tc.msg)
		}
	}
	// Listings show only what the principal may describe.
	f := &heraldpb.Frame{Id: 3, Body: &heraldpb.Frame_ListTopicsResponse{ListTopicsResponse: &heraldpb.ListTopicsResponse{Topics: []*heraldpb.TopicInfo{
		{Name: "orders"}, {Name: "pay.x"}, {Name: "hidden"}, {Name: "__groups"},
	}}}}
	got := s.FilterResponse("alice", f).GetListTopicsResponse().GetTopics()
	if len(got) != 2 || got[0].Name != "orders" || got[1].Name != "pay.x" {
		t.Errorf("alice's listing: %v", got)
	}
	if len(f.GetListTopicsResponse().Topics) != 4 {
		t.Error("filtering changed the original response")
	}
	if s.FilterResponse("root", f) != f {
		t.Error("a superuser's listing was filtered")
	}
}

// Every request type of the protocol needs a permission the table names
// (or, for acks, replies and the like, none): a new request type cannot
// slip past the ACLs by being forgotten.
func TestEveryRequestTypeHasAPermission(t *testing.T) {
	fields := (&heraldpb.Frame{}).ProtoReflect().Descriptor().Oneofs().ByName("body").Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		name := string(fd.Message().Name())
		if !strings.HasSuffix(name, "Request") || name == "HelloRequest" || name == "SaslAuthenticateRequest" {
			continue
		}
		f := &heraldpb.Frame{}
		f.ProtoReflect().Set(fd, protoreflect.ValueOfMessage(f.ProtoReflect().NewField(fd).Message()))
		if _, ok := checks("/", f); !ok {
			t.Errorf("%s has no permission in checks()", name)
		}
	}
}

func TestCheckRule(t *testing.T) {
	good := rule("user:alice", topicT, "orders", false, opProduce, false)
	if err := CheckRule(good); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []*heraldpb.AclRule{
		rule("alice", topicT, "orders", false, opProduce, false),
		rule("user:al ice", topicT, "orders", false, opProduce, false),
		rule("user:alice", topicT, "", false, opProduce, false),
		rule("user:alice", clusterT, "x", false, opAdmin, false),
		rule("user:alice", topicT, "o", false, 0, false),
		rule("user:alice", 0, "o", false, opProduce, false),
		rule("user:alice", groupT, "o", false, 99, false),
	} {
		if CheckRule(bad) == nil {
			t.Errorf("rule %v accepted", bad)
		}
	}
}
