package netio

import (
	"strings"

	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"google.golang.org/protobuf/proto"
)

// A connection works in one vhost (Hello's vhost; the default "/"
// otherwise). Requests name topics, groups, transactional ids and
// producer groups as the vhost's clients see them; netio turns each into
// the broker's name (registry.InVhost) before authorization and routing,
// and turns the broker's names in responses back, leaving out of listings
// whatever belongs to another vhost. The actors never see a vhost.

// clientName checks a name a client gave: it may not hold the vhost
// separator (which would reach another vhost), nor, in a vhost, start
// with __ (internal names).
func clientName(vhost, what, name string) *heraldpb.Error {
	if strings.Contains(name, registry.VhostSep) {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "%s %q: names may not contain %q", what, cutName(name), registry.VhostSep)
	}
	if !registry.IsDefaultVhost(vhost) && strings.HasPrefix(name, "__") {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "%s %q: names starting with __ are reserved", what, cutName(name))
	}
	return nil
}

func cutName(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// inVhost rewrites the names of request f into the broker's names for a
// connection in vhost. It changes f in place (a frame just decoded is the
// connection's own).
func inVhost(vhost string, f *heraldpb.Frame) *heraldpb.Error {
	var bad *heraldpb.Error
	name := func(what string, p *string) {
		if bad != nil || *p == "" {
			return
		}
		if bad = clientName(vhost, what, *p); bad == nil {
			*p = registry.InVhost(vhost, *p)
		}
	}
	switch b := f.Body.(type) {
	case *heraldpb.Frame_Metadata:
		for i := range b.Metadata.Topics {
			name("topic", &b.Metadata.Topics[i])
		}
	case *heraldpb.Frame_CreateTopic:
		name("topic", &b.CreateTopic.Name)
	case *heraldpb.Frame_DeleteTopic:
		name("topic", &b.DeleteTopic.Name)
	case *heraldpb.Frame_DescribeTopic:
		name("topic", &b.DescribeTopic.Name)
	case *heraldpb.Frame_Produce:
		name("topic", &b.Produce.Topic)
		name("transactional id", &b.Produce.TransactionalId)
		if h := b.Produce.Half; h != nil {
			name("producer group", &h.ProducerGroup)
		}
		for _, o := range b.Produce.TxnGroupOffsets {
			name("group", &o.Group)
			name("topic", &o.Topic)
		}
	case *heraldpb.Frame_Publish:
		if b.Publish.Exchange == "" {
			name("topic", &b.Publish.RoutingKey) // the default exchange's key is a topic
		} else {
			name("exchange", &b.Publish.Exchange)
		}
	case *heraldpb.Frame_DeclareExchange:
		if x := b.DeclareExchange.Exchange; x != nil {
			name("exchange", &x.Name)
			name("alternate exchange", &x.Alternate)
		}
	case *heraldpb.Frame_DeleteExchange:
		name("exchange", &b.DeleteExchange.Name)
	case *heraldpb.Frame_Bind:
		if bd := b.Bind.Binding; bd != nil {
			name("exchange", &bd.Exchange)
			name("topic", &bd.Topic)
			name("exchange", &bd.ToExchange)
		}
	case *heraldpb.Frame_ListExchanges:
		name("exchange", &b.ListExchanges.Name)
	case *heraldpb.Frame_Fetch:
		name("topic", &b.Fetch.Topic)
	case *heraldpb.Frame_ListOffsets:
		name("topic", &b.ListOffsets.Topic)
	case *heraldpb.Frame_Subscribe:
		name("group", &b.Subscribe.Group)
		name("topic", &b.Subscribe.Topic)
		name("dead-letter topic", &b.Subscribe.DeadLetterTopic)
	case *heraldpb.Frame_DescribeGroup:
		name("group", &b.DescribeGroup.Group)
	case *heraldpb.Frame_ResetGroup:
		name("group", &b.ResetGroup.Group)
	case *heraldpb.Frame_Call:
		name("topic", &b.Call.Topic)
	case *heraldpb.Frame_ListScheduled:
		name("topic", &b.ListScheduled.Topic)
	case *heraldpb.Frame_CancelScheduled:
		b.CancelScheduled.Vhost = vhost // the scheduler checks the batch's topic
		if b.CancelScheduled.Vhost == "" {
			b.CancelScheduled.Vhost = registry.DefaultVhost
		}
	case *heraldpb.Frame_RepairPartition:
		name("topic", &b.RepairPartition.Topic)
	case *heraldpb.Frame_EndHalf:
		if b.EndHalf.ProducerGroup == "" && !registry.IsDefaultVhost(vhost) {
			return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "in a vhost, EndHalf must name the half's producer group")
		}
		name("producer group", &b.EndHalf.ProducerGroup)
	case *heraldpb.Frame_RegisterProducer:
		name("producer group", &b.RegisterProducer.ProducerGroup)
	case *heraldpb.Frame_ListTxn:
		name("producer group", &b.ListTxn.ProducerGroup)
		if b.ListTxn.Transactions {
			name("transactional id", &b.ListTxn.Id)
		} else if b.ListTxn.Id != "" && !registry.IsDefaultVhost(vhost) && b.ListTxn.ProducerGroup == "" {
			return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "in a vhost, describing a half message needs its producer group")
		}
	case *heraldpb.Frame_InitProducerId:
		name("transactional id", &b.InitProducerId.TransactionalId)
	case *heraldpb.Frame_EndTxn:
		name("transactional id", &b.EndTxn.TransactionalId)
		for _, o := range b.EndTxn.GroupOffsets {
			name("group", &o.Group)
			name("topic", &o.Topic)
		}
	case *heraldpb.Frame_AlterAcls:
		for _, r := range append(append([]*heraldpb.AclRule{}, b.AlterAcls.Add...), b.AlterAcls.Remove...) {
			if bad == nil {
				bad = ruleInVhost(vhost, r)
			}
		}
	}
	return bad
}

// named reports whether rules on resources of type t name a vhost's
// resource (topics, groups, transactional ids, producer groups).
func named(t heraldpb.AclResourceType) bool {
	switch t {
	case heraldpb.AclResourceType_ACL_RESOURCE_TOPIC, heraldpb.AclResourceType_ACL_RESOURCE_GROUP,
		heraldpb.AclResourceType_ACL_RESOURCE_TRANSACTIONAL_ID, heraldpb.AclResourceType_ACL_RESOURCE_PRODUCER_GROUP,
		heraldpb.AclResourceType_ACL_RESOURCE_EXCHANGE:
		return true
	}
	return false
}

// ruleInVhost rewrites a rule's resource into the broker's names: "*" in
// a vhost becomes the prefix of its names (in the default vhost "*"
// matches only the default vhost's names: auth.nameMatches).
func ruleInVhost(vhost string, r *heraldpb.AclRule) *heraldpb.Error {
	if !named(r.ResourceType) || registry.IsDefaultVhost(vhost) {
		if named(r.ResourceType) && r.Resource != "*" {
			return clientName(vhost, "resource", r.Resource)
		}
		return nil
	}
	if r.Resource == "*" {
		r.Resource, r.Prefix = registry.InVhost(vhost, ""), true
		return nil
	}
	if e := clientName(vhost, "resource", r.Resource); e != nil {
		return e
	}
	r.Resource = registry.InVhost(vhost, r.Resource)
	return nil
}

// ruleOfVhost is a rule as a client of vhost sees it, or nil if it is on
// another vhost's resources.
func ruleOfVhost(vhost string, r *heraldpb.AclRule) *heraldpb.AclRule {
	if !named(r.ResourceType) {
		return r
	}
	if !registry.IsDefaultVhost(vhost) && r.Prefix && r.Resource == registry.InVhost(vhost, "") {
		c := proto.Clone(r).(*heraldpb.AclRule)
		c.Resource, c.Prefix = "*", false
		return c
	}
	if r.Resource == "*" {
		if registry.IsDefaultVhost(vhost) {
			return r
		}
		return nil
	}
	if !registry.InVhostOf(vhost, r.Resource) {
		return nil
	}
	_, local := registry.VhostOf(r.Resource)
	if local == r.Resource {
		return r
	}
	c := proto.Clone(r).(*heraldpb.AclRule)
	c.Resource = local
	return c
}

// ofVhost turns the broker's names in response f back into vhost's,
// leaving out of listings what belongs to other vhosts. It returns f when
// nothing changes, else a copy: responses may be shared.
func ofVhost(vhost string, f *heraldpb.Frame) *heraldpb.Frame {
	def := registry.IsDefaultVhost(vhost)
	mine := func(n string) bool { return registry.InVhostOf(vhost, n) }
	local := func(n string) string {
		_, l := registry.VhostOf(n)
		if def && l != n {
			return n // another vhost's name: never shown, but never shortened either
		}
		return l
	}
	topics := func(in []*heraldpb.TopicInfo) []*heraldpb.TopicInfo {
		out := make([]*heraldpb.TopicInfo, 0, len(in))
		for _, t := range in {
			if !mine(t.Name) {
				continue
			}
			if l := local(t.Name); l != t.Name {
				t = proto.Clone(t).(*heraldpb.TopicInfo)
				t.Name = l
			}
			out = append(out, t)
		}
		return out
	}
	group := func(g *heraldpb.GroupInfo) *heraldpb.GroupInfo {
		if g == nil || def {
			return g
		}
		g = proto.Clone(g).(*heraldpb.GroupInfo)
		g.Group, g.Topic, g.DeadLetterTopic = local(g.Group), local(g.Topic), local(g.DeadLetterTopic)
		return g
	}
	switch b := f.Body.(type) {
	case *heraldpb.Frame_Error:
		if def {
			return f
		}
		prefix := registry.InVhost(vhost, "")
		if !strings.Contains(b.Error.Message, prefix) {
			return f
		}
		e := proto.Clone(b.Error).(*heraldpb.Error)
		e.Message = strings.ReplaceAll(e.Message, prefix, "")
		return heraldpb.ErrorFrame(f.Id, e)
	case *heraldpb.Frame_MetadataResponse:
		r := &heraldpb.MetadataResponse{Brokers: b.MetadataResponse.Brokers, Topics: topics(b.MetadataResponse.Topics)}
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_MetadataResponse{MetadataResponse: r}}
	case *heraldpb.Frame_ListTopicsResponse:
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListTopicsResponse{ListTopicsResponse: &heraldpb.ListTopicsResponse{Topics: topics(b.ListTopicsResponse.Topics)}}}
	case *heraldpb.Frame_CreateTopicResponse:
		if def || b.CreateTopicResponse.Topic == nil {
			return f
		}
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_CreateTopicResponse{CreateTopicResponse: &heraldpb.CreateTopicResponse{Topic: topics([]*heraldpb.TopicInfo{b.CreateTopicResponse.Topic})[0]}}}
	case *heraldpb.Frame_DescribeTopicResponse:
		if def || b.DescribeTopicResponse.Topic == nil {
			return f
		}
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_DescribeTopicResponse{DescribeTopicResponse: &heraldpb.DescribeTopicResponse{Topic: topics([]*heraldpb.TopicInfo{b.DescribeTopicResponse.Topic})[0]}}}
	case *heraldpb.Frame_ListGroupsResponse:
		r := &heraldpb.ListGroupsResponse{Groups: keepMine(b.ListGroupsResponse.Groups, def, mine, func(g *heraldpb.GroupSummary) string { return g.Group },
			func(g *heraldpb.GroupSummary) { g.Group, g.Topic = local(g.Group), local(g.Topic) })}
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListGroupsResponse{ListGroupsResponse: r}}
	case *heraldpb.Frame_DescribeGroupResponse:
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_DescribeGroupResponse{DescribeGroupResponse: &heraldpb.DescribeGroupResponse{Group: group(b.DescribeGroupResponse.Group)}}}
	case *heraldpb.Frame_ResetGroupResponse:
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ResetGroupResponse{ResetGroupResponse: &heraldpb.ResetGroupResponse{Group: group(b.ResetGroupResponse.Group)}}}
	case *heraldpb.Frame_ListScheduledResponse:
		r := &heraldpb.ListScheduledResponse{Pending: b.ListScheduledResponse.Pending, FireLateness: b.ListScheduledResponse.FireLateness,
			Scheduled: keepMine(b.ListScheduledResponse.Scheduled, def, mine, func(si *heraldpb.ScheduledInfo) string { return si.Topic },
				func(si *heraldpb.ScheduledInfo) { si.Topic = local(si.Topic) })}
		if len(r.Scheduled) < len(b.ListScheduledResponse.Scheduled) {
			r.Pending = uint64(len(r.Scheduled)) // the others' count is theirs
		}
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListScheduledResponse{ListScheduledResponse: r}}
	case *heraldpb.Frame_ListTxnResponse:
		r := &heraldpb.ListTxnResponse{Total: b.ListTxnResponse.Total,
			Halves: keepMine(b.ListTxnResponse.Halves, def, mine, func(h *heraldpb.HalfInfo) string { return h.ProducerGroup },
				func(h *heraldpb.HalfInfo) { h.ProducerGroup, h.Topic = local(h.ProducerGroup), local(h.Topic) }),
			Transactions: keepMine(b.ListTxnResponse.Transactions, def, mine, func(t *heraldpb.TxnInfo) string { return t.TransactionalId },
				func(t *heraldpb.TxnInfo) {
					t.TransactionalId = local(t.TransactionalId)
					for i, p := range t.Partitions {
						t.Partitions[i] = local(p)
					}
				}),
		}
		if len(r.Halves) < len(b.ListTxnResponse.Halves) || len(r.Transactions) < len(b.ListTxnResponse.Transactions) {
			r.Total = uint32(len(r.Halves) + len(r.Transactions))
		}
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListTxnResponse{ListTxnResponse: r}}
	case *heraldpb.Frame_CancelScheduledResponse:
		if def {
			return f
		}
		r := proto.Clone(b.CancelScheduledResponse).(*heraldpb.CancelScheduledResponse)
		r.Topic = local(r.Topic)
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_CancelScheduledResponse{CancelScheduledResponse: r}}
	case *heraldpb.Frame_EndTxnResponse:
		if def {
			return f
		}
		r := proto.Clone(b.EndTxnResponse).(*heraldpb.EndTxnResponse)
		for i, p := range r.Partitions {
			r.Partitions[i] = local(p)
		}
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_EndTxnResponse{EndTxnResponse: r}}
	case *heraldpb.Frame_ProduceResponse:
		if def || b.ProduceResponse.TxnEnd == nil {
			return f
		}
		r := proto.Clone(b.ProduceResponse).(*heraldpb.ProduceResponse)
		for i, p := range r.TxnEnd.Partitions {
			r.TxnEnd.Partitions[i] = local(p)
		}
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: r}}
	case *heraldpb.Frame_EndHalfResponse:
		if def {
			return f
		}
		r := proto.Clone(b.EndHalfResponse).(*heraldpb.EndHalfResponse)
		r.Topic = local(r.Topic)
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_EndHalfResponse{EndHalfResponse: r}}
	case *heraldpb.Frame_ListExchangesResponse:
		r := &heraldpb.ListExchangesResponse{Exchanges: keepMine(b.ListExchangesResponse.Exchanges, def, mine,
			func(x *heraldpb.ExchangeInfo) string { return x.GetConfig().GetName() },
			func(x *heraldpb.ExchangeInfo) { // a clone: renamed in place
				x.Config.Name, x.Config.Alternate = local(x.Config.Name), local(x.Config.Alternate)
				for _, bd := range x.Bindings {
					bd.Exchange, bd.Topic, bd.ToExchange = local(bd.Exchange), local(bd.Topic), local(bd.ToExchange)
				}
			})}
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListExchangesResponse{ListExchangesResponse: r}}
	case *heraldpb.Frame_PublishResponse:
		if def {
			return f
		}
		r := proto.Clone(b.PublishResponse).(*heraldpb.PublishResponse)
		for _, d := range r.Destinations {
			d.Topic = local(d.Topic)
		}
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_PublishResponse{PublishResponse: r}}
	case *heraldpb.Frame_ListAclsResponse:
		r := &heraldpb.ListAclsResponse{}
		for _, rule := range b.ListAclsResponse.Rules {
			if c := ruleOfVhost(vhost, rule); c != nil {
				r.Rules = append(r.Rules, c)
			}
		}
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListAclsResponse{ListAclsResponse: r}}
	}
	return f
}

// keepMine is the items of a listing that belong to the vhost (mine of
// their key), each a renamed copy (rename) outside the default vhost:
// responses may be shared.
func keepMine[T proto.Message](items []T, def bool, mine func(string) bool, key func(T) string, rename func(T)) []T {
	var out []T
	for _, x := range items {
		if !mine(key(x)) {
			continue
		}
		if !def {
			x = proto.Clone(x).(T)
			rename(x)
		}
		out = append(out, x)
	}
	return out
}
