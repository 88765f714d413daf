package netio

import (
	"strings"
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
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

// fill sets every field of m (recursively, two levels of messages deep)
// to a value of the default vhost: strings "x", numbers 1, true, one
// element per list and map.
func fill(m protoreflect.Message, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.ContainingOneof() != nil && !fd.ContainingOneof().IsSynthetic() && i > 0 && fields.Get(i-1).ContainingOneof() == fd.ContainingOneof() {
			continue // one member of a oneof
		}
		value := func() (protoreflect.Value, bool) {
			switch fd.Kind() {
			case protoreflect.StringKind:
				return protoreflect.ValueOfString("x"), true
			case protoreflect.BytesKind:
				return protoreflect.ValueOfBytes([]byte("x")), true
			case protoreflect.BoolKind:
				return protoreflect.ValueOfBool(true), true
			case protoreflect.EnumKind:
				return protoreflect.ValueOfEnum(1), true
			case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
				return protoreflect.ValueOfInt32(1), true
			case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
				return protoreflect.ValueOfInt64(1), true
			case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
				return protoreflect.ValueOfUint32(1), true
			case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
				return protoreflect.ValueOfUint64(1), true
			case protoreflect.FloatKind:
				return protoreflect.ValueOfFloat32(1), true
			case protoreflect.DoubleKind:
				return protoreflect.ValueOfFloat64(1), true
			case protoreflect.MessageKind:
				if depth <= 0 {
					return protoreflect.Value{}, false
				}
				sub := m.NewField(fd)
				fill(sub.Message(), depth-1)
				return sub, true
			}
			return protoreflect.Value{}, false
		}
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			k := protoreflect.ValueOfString("x").MapKey()
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				if depth > 0 {
					v := mp.NewValue()
					fill(v.Message(), depth-1)
					mp.Set(k, v)
				}
			} else if fd.MapValue().Kind() == protoreflect.StringKind {
				mp.Set(k, protoreflect.ValueOfString("x"))
			}
		case fd.IsList():
			l := m.Mutable(fd).List()
			if fd.Kind() == protoreflect.MessageKind {
				if depth > 0 {
					v := l.NewElement()
					fill(v.Message(), depth-1)
					l.Append(v)
				}
			} else if v, ok := value(); ok {
				l.Append(v)
			}
		default:
			if v, ok := value(); ok {
				m.Set(fd, v)
			}
		}
	}
}

// TestDefaultVhostKeepsEveryResponseField: ofVhost rebuilds some
// responses to rename and filter their names; for a connection in the
// default vhost every field of every response, names of the default
// vhost, comes through unchanged (a field it forgot would be dropped
// silently: ListScheduled's fire_lateness was).
func TestDefaultVhostKeepsEveryResponseField(t *testing.T) {
	bodies := (&heraldpb.Frame{}).ProtoReflect().Descriptor().Oneofs().ByName("body").Fields()
	for i := range bodies.Len() {
		fd := bodies.Get(i)
		if !strings.HasSuffix(string(fd.Message().Name()), "Response") {
			continue
		}
		f := &heraldpb.Frame{Id: 7}
		fm := f.ProtoReflect()
		body := fm.NewField(fd)
		fill(body.Message(), 3)
		fm.Set(fd, body)
		want := proto.Clone(f)
		for _, vhost := range []string{"", registry.DefaultVhost} {
			if got := ofVhost(vhost, f); !proto.Equal(got, want) {
				t.Errorf("%s in vhost %q:\n got %v\nwant %v", fd.Message().Name(), vhost, got, want)
			}
		}
	}
}

// A transaction's end names its partitions as the vhost's client wrote
// them, in EndTxn's answer and in the answer of a produce that carried the
// commit; a plain produce's answer is passed through as it is.
func TestTxnEndInVhost(t *testing.T) {
	broker := registry.InVhost("shop", "orders") + "/1"
	end := &heraldpb.Frame{Id: 1, Body: &heraldpb.Frame_EndTxnResponse{EndTxnResponse: &heraldpb.EndTxnResponse{Partitions: []string{broker}}}}
	if got := ofVhost("shop", end).GetEndTxnResponse().GetPartitions(); len(got) != 1 || got[0] != "orders/1" {
		t.Fatalf("EndTxn's partitions in vhost shop: %v", got)
	}
	prod := &heraldpb.Frame{Id: 2, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{
		TxnEnd: &heraldpb.EndTxnResponse{Partitions: []string{broker}}}}}
	if got := ofVhost("shop", prod).GetProduceResponse().GetTxnEnd().GetPartitions(); len(got) != 1 || got[0] != "orders/1" {
		t.Fatalf("commit_txn's partitions in vhost shop: %v", got)
	}
	if prod.GetProduceResponse().GetTxnEnd().GetPartitions()[0] != broker {
		t.Fatal("the shared response was changed in place")
	}
	plain := &heraldpb.Frame{Id: 3, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{Partition: 1}}}
	if ofVhost("shop", plain) != plain {
		t.Fatal("a plain produce's answer was copied")
	}
}
