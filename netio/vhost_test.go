package netio

import (
	"strings"
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
)

// FuzzVhostNames checks the vhost mapping of names for any vhost and any
// client name: inVhost never panics; it refuses every name holding the
// separator (which would reach another vhost); a name it accepts becomes
// the vhost's broker name, which the vhost's listings show back as the
// client's name and no other vhost's listings show at all.
func FuzzVhostNames(f *testing.F) {
	for _, s := range [][2]string{{"/", "orders"}, {"A", "orders"}, {"A", "B~orders"}, {"A", "__groups"}, {"", "x"}, {"shop", "*"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, vhost, name string) {
		if !registry.IsDefaultVhost(vhost) && !registry.ValidVhost(vhost) {
			return // Hello refuses it before any request
		}
		req := &heraldpb.Frame{Id: 1, Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{Topic: name}}}
		e := inVhost(vhost, req)
		if strings.Contains(name, registry.VhostSep) {
			if e == nil {
				t.Fatalf("vhost %q accepted %q", vhost, name)
			}
			return
		}
		if e != nil {
			if !registry.IsDefaultVhost(vhost) && strings.HasPrefix(name, "__") {
				return
			}
			t.Fatalf("vhost %q refused %q: %v", vhost, name, e)
		}
		broker := req.GetFetch().Topic
		if name != "" && !registry.InVhostOf(vhost, broker) {
			t.Fatalf("vhost %q: %q became %q, not one of its names", vhost, name, broker)
		}
		list := &heraldpb.Frame{Id: 2, Body: &heraldpb.Frame_ListTopicsResponse{ListTopicsResponse: &heraldpb.ListTopicsResponse{
			Topics: []*heraldpb.TopicInfo{{Name: broker}},
		}}}
		got := ofVhost(vhost, list).GetListTopicsResponse().GetTopics()
		if name != "" && (len(got) != 1 || got[0].Name != name) {
			t.Fatalf("vhost %q lists %q as %v, want %q", vhost, broker, got, name)
		}
		for _, other := range []string{"/", "A", "zz"} {
			if other == vhost || registry.IsDefaultVhost(other) && registry.IsDefaultVhost(vhost) || name == "" {
				continue
			}
			if shown := ofVhost(other, list).GetListTopicsResponse().GetTopics(); len(shown) != 0 {
				t.Fatalf("vhost %q sees vhost %q's %q as %v", other, vhost, name, shown)
			}
		}
	})
}

// A rule written in a vhost is about its names only, and lists back as
// written.
func TestRulesInVhost(t *testing.T) {
	all := &heraldpb.AclRule{Principal: "user:a", ResourceType: heraldpb.AclResourceType_ACL_RESOURCE_TOPIC, Resource: "*", Operation: heraldpb.AclOperation_ACL_OP_ALL}
	if e := ruleInVhost("shop", all); e != nil || all.Resource != "shop~" || !all.Prefix {
		t.Fatalf("* in shop: %v %v", all, e)
	}
	if back := ruleOfVhost("shop", all); back == nil || back.Resource != "*" || back.Prefix {
		t.Fatalf("* in shop lists as %v", back)
	}
	if ruleOfVhost("/", all) != nil || ruleOfVhost("other", all) != nil {
		t.Fatal("shop's rule shows in another vhost")
	}
	lit := &heraldpb.AclRule{Principal: "user:a", ResourceType: heraldpb.AclResourceType_ACL_RESOURCE_GROUP, Resource: "g", Operation: heraldpb.AclOperation_ACL_OP_CONSUME}
	if e := ruleInVhost("shop", lit); e != nil || lit.Resource != "shop~g" {
		t.Fatalf("g in shop: %v %v", lit, e)
	}
	bad := &heraldpb.AclRule{Principal: "user:a", ResourceType: heraldpb.AclResourceType_ACL_RESOURCE_TOPIC, Resource: "other~t", Operation: heraldpb.AclOperation_ACL_OP_ALL}
	if ruleInVhost("/", bad) == nil || ruleInVhost("shop", bad) == nil {
		t.Fatal("a rule naming another vhost's topic was accepted")
	}
}
