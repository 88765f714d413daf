package auth

import (
	"fmt"
	"strings"
	"sync/atomic"

	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// ACLs is the set of ACL rules as the node's metadata has it, indexed by
// principal. Set replaces it whole; readers never block.
type ACLs struct {
	p atomic.Pointer[aclIndex]
}

type aclIndex struct {
	rules []*heraldpb.AclRule
	by    map[string][]*heraldpb.AclRule // principal -> its rules
}

// Set replaces the rules.
func (a *ACLs) Set(rules []*heraldpb.AclRule) {
	ix := &aclIndex{rules: rules, by: map[string][]*heraldpb.AclRule{}}
	for _, r := range rules {
		ix.by[r.Principal] = append(ix.by[r.Principal], r)
	}
	a.p.Store(ix)
}

// List returns the rules (of principal, unless it is "").
func (a *ACLs) List(principal string) []*heraldpb.AclRule {
	ix := a.p.Load()
	if ix == nil {
		return nil
	}
	if principal != "" {
		return ix.by[principal]
	}
	return ix.rules
}

// SameRule reports whether a and b are the same rule.
func SameRule(a, b *heraldpb.AclRule) bool { return proto.Equal(a, b) }

// CheckRule reports what is wrong with a rule a client sent, or nil.
func CheckRule(r *heraldpb.AclRule) error {
	switch {
	case r == nil:
		return fmt.Errorf("empty rule")
	case !validPrincipal(r.Principal):
		return fmt.Errorf("principal %q: want user:NAME, group:NAME, user:* or anonymous", trim(r.Principal))
	case r.ResourceType == heraldpb.AclResourceType_ACL_RESOURCE_UNSPECIFIED || heraldpb.AclResourceType_name[int32(r.ResourceType)] == "":
		return fmt.Errorf("no resource type")
	case r.Operation == heraldpb.AclOperation_ACL_OP_UNSPECIFIED || heraldpb.AclOperation_name[int32(r.Operation)] == "":
		return fmt.Errorf("no operation")
	case r.ResourceType == heraldpb.AclResourceType_ACL_RESOURCE_CLUSTER && r.Resource != "" && r.Resource != "*":
		return fmt.Errorf("the cluster resource has no name (give none, or *)")
	case r.ResourceType != heraldpb.AclResourceType_ACL_RESOURCE_CLUSTER && r.Resource == "":
		return fmt.Errorf("no resource name (give * for all)")
	case r.ResourceType == heraldpb.AclResourceType_ACL_RESOURCE_VHOST && r.Resource != "/" && r.Resource != "*" && !validName(r.Resource):
		return fmt.Errorf("vhost %q: want a vhost name, / or *", trim(r.Resource))
	case len(r.Resource) > 255:
		return fmt.Errorf("resource name of %d bytes: at most 255", len(r.Resource))
	}
	return nil
}

func validPrincipal(p string) bool {
	if p == "anonymous" || p == "user:*" {
		return true
	}
	for _, kind := range []string{"user:", "group:"} {
		if name, ok := strings.CutPrefix(p, kind); ok {
			return validName(name)
		}
	}
	return false
}

// validName is the shape of a user or group name: 1-128 characters of
// A-Z a-z 0-9 . _ @ -.
func validName(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '@', c == '-':
		default:
			return false
		}
	}
	return true
}

// ValidName reports whether s may name a user or a group.
func ValidName(s string) bool { return validName(s) }

// check is one permission a request needs.
type check struct {
	op   heraldpb.AclOperation
	typ  heraldpb.AclResourceType
	name string
}

func topicCheck(op heraldpb.AclOperation, name string) check {
	return check{op, heraldpb.AclResourceType_ACL_RESOURCE_TOPIC, name}
}

func exchangeCheck(op heraldpb.AclOperation, name string) check {
	return check{op, heraldpb.AclResourceType_ACL_RESOURCE_EXCHANGE, name}
}

func clusterCheck(op heraldpb.AclOperation) check {
	return check{op, heraldpb.AclResourceType_ACL_RESOURCE_CLUSTER, ""}
}

func vhostCheck(op heraldpb.AclOperation, vhost string) check {
	if vhost == "" {
		vhost = "/"
	}
	return check{op, heraldpb.AclResourceType_ACL_RESOURCE_VHOST, vhost}
}

const (
	opAll      = heraldpb.AclOperation_ACL_OP_ALL
	opProduce  = heraldpb.AclOperation_ACL_OP_PRODUCE
	opConsume  = heraldpb.AclOperation_ACL_OP_CONSUME
	opCreate   = heraldpb.AclOperation_ACL_OP_CREATE
	opDelete   = heraldpb.AclOperation_ACL_OP_DELETE
	opAlter    = heraldpb.AclOperation_ACL_OP_ALTER
	opDescribe = heraldpb.AclOperation_ACL_OP_DESCRIBE
	opAdmin    = heraldpb.AclOperation_ACL_OP_ADMIN
)

// checks are the permissions request f needs from a connection in vhost.
// A request that needs none (it acts on what the connection already
// holds: an ack of its own subscription, a reply to an inbox) returns
// none; a request type this table does not know returns ok false, and is
// refused. What concerns a vhost's resources without naming one (its
// delayed messages, its transactions) needs a permission on the vhost;
// the cluster's permissions are for operators.
func checks(vhost string, f *heraldpb.Frame) (out []check, ok bool) {
	switch b := f.Body.(type) {
	case *heraldpb.Frame_Metadata:
		if len(b.Metadata.Topics) == 0 {
			return nil, true // every topic, filtered by describe (FilterResponse)
		}
		for _, t := range b.Metadata.Topics {
			out = append(out, topicCheck(opDescribe, t))
		}
	case *heraldpb.Frame_CreateTopic:
		out = append(out, topicCheck(opCreate, b.CreateTopic.Name))
	case *heraldpb.Frame_DeleteTopic:
		out = append(out, topicCheck(opDelete, b.DeleteTopic.Name))
	case *heraldpb.Frame_ListTopics, *heraldpb.Frame_ListGroups:
		return nil, true // filtered by describe (FilterResponse)
	case *heraldpb.Frame_DescribeTopic:
		out = append(out, topicCheck(opDescribe, b.DescribeTopic.Name))
	case *heraldpb.Frame_Produce:
		p := b.Produce
		out = append(out, topicCheck(opProduce, p.Topic))
		if p.TransactionalId != "" {
			out = append(out, check{opProduce, heraldpb.AclResourceType_ACL_RESOURCE_TRANSACTIONAL_ID, p.TransactionalId})
		}
		if g := p.GetHalf().GetProducerGroup(); g != "" {
			out = append(out, check{opProduce, heraldpb.AclResourceType_ACL_RESOURCE_PRODUCER_GROUP, g})
		}
		out = append(out, offsetChecks(p.TxnGroupOffsets)...)
	case *heraldpb.Frame_Publish:
		if b.Publish.Exchange == "" {
			// The default exchange: the routing key names the topic.
			out = append(out, topicCheck(opProduce, b.Publish.RoutingKey))
		} else {
			out = append(out, exchangeCheck(opProduce, b.Publish.Exchange))
		}
	case *heraldpb.Frame_DeclareExchange:
		out = append(out, exchangeCheck(opCreate, b.DeclareExchange.GetExchange().GetName()))
	case *heraldpb.Frame_DeleteExchange:
		out = append(out, exchangeCheck(opDelete, b.DeleteExchange.Name))
	case *heraldpb.Frame_Bind:
		// Binding lets the source's publishers write to the destination.
		bd := b.Bind.GetBinding()
		out = append(out, exchangeCheck(opAlter, bd.GetExchange()))
		if bd.GetTopic() != "" {
			out = append(out, topicCheck(opProduce, bd.GetTopic()))
		}
		if bd.GetToExchange() != "" {
			out = append(out, exchangeCheck(opProduce, bd.GetToExchange()))
		}
	case *heraldpb.Frame_ListExchanges:
		if n := b.ListExchanges.Name; n != "" {
			out = append(out, exchangeCheck(opDescribe, n))
		} else {
			out = append(out, vhostCheck(opDescribe, vhost)) // the answer lists the vhost's only
		}
	case *heraldpb.Frame_Fetch:
		out = append(out, topicCheck(opConsume, b.Fetch.Topic))
	case *heraldpb.Frame_ListOffsets:
		out = append(out, topicCheck(opDescribe, b.ListOffsets.Topic))
	case *heraldpb.Frame_Subscribe:
		s := b.Subscribe
		out = append(out, topicCheck(opConsume, s.Topic), check{opConsume, heraldpb.AclResourceType_ACL_RESOURCE_GROUP, s.Group})
		if s.DeadLetterTopic != "" {
			out = append(out, topicCheck(opProduce, s.DeadLetterTopic))
		}
	case *heraldpb.Frame_Ack, *heraldpb.Frame_Nack, *heraldpb.Frame_Commit, *heraldpb.Frame_Unsubscribe, *heraldpb.Frame_Reply:
		return nil, true // the connection's own subscription or a caller's inbox
	case *heraldpb.Frame_DescribeGroup:
		out = append(out, check{opDescribe, heraldpb.AclResourceType_ACL_RESOURCE_GROUP, b.DescribeGroup.Group})
	case *heraldpb.Frame_ResetGroup:
		out = append(out, check{opAlter, heraldpb.AclResourceType_ACL_RESOURCE_GROUP, b.ResetGroup.Group})
	case *heraldpb.Frame_Call:
		out = append(out, topicCheck(opProduce, b.Call.Topic))
	case *heraldpb.Frame_CancelScheduled:
		// The id names no topic before the scheduler looks it up (and
		// refuses one of another vhost's topics).
		out = append(out, vhostCheck(opAlter, vhost))
	case *heraldpb.Frame_ListScheduled:
		if b.ListScheduled.Topic == "" {
			out = append(out, vhostCheck(opDescribe, vhost)) // the answer lists the vhost's only
		} else {
			out = append(out, topicCheck(opDescribe, b.ListScheduled.Topic))
		}
	case *heraldpb.Frame_ClusterAdmin, *heraldpb.Frame_RepairPartition, *heraldpb.Frame_AlterUser,
		*heraldpb.Frame_ListUsers, *heraldpb.Frame_AlterAcls, *heraldpb.Frame_ListAcls,
		*heraldpb.Frame_AlterVhost, *heraldpb.Frame_ListVhosts,
		*heraldpb.Frame_CommitTxnOffsets, *heraldpb.Frame_ListOpenTxns: // (internal: no client route either)
		out = append(out, clusterCheck(opAdmin))
	case *heraldpb.Frame_EndHalf:
		// With the group named, the coordinator refuses a half of another
		// group; without it (an operator's), the half may be any
		// vhost's.
		if g := b.EndHalf.ProducerGroup; g != "" {
			out = append(out, check{opProduce, heraldpb.AclResourceType_ACL_RESOURCE_PRODUCER_GROUP, g})
		} else {
			out = append(out, clusterCheck(opAdmin))
		}
	case *heraldpb.Frame_RegisterProducer:
		out = append(out, check{opProduce, heraldpb.AclResourceType_ACL_RESOURCE_PRODUCER_GROUP, b.RegisterProducer.ProducerGroup})
	case *heraldpb.Frame_ListTxn:
		switch l := b.ListTxn; {
		case l.Transactions && l.Id != "":
			out = append(out, check{opDescribe, heraldpb.AclResourceType_ACL_RESOURCE_TRANSACTIONAL_ID, l.Id})
		case l.Transactions:
			out = append(out, vhostCheck(opDescribe, vhost)) // the answer lists the vhost's only
		case l.ProducerGroup != "":
			// With an id too, the coordinator answers only for a half of
			// that group.
			out = append(out, check{opDescribe, heraldpb.AclResourceType_ACL_RESOURCE_PRODUCER_GROUP, l.ProducerGroup})
		default:
			out = append(out, vhostCheck(opDescribe, vhost))
		}
	case *heraldpb.Frame_InitProducerId:
		out = append(out, check{opProduce, heraldpb.AclResourceType_ACL_RESOURCE_TRANSACTIONAL_ID, b.InitProducerId.TransactionalId})
	case *heraldpb.Frame_EndTxn:
		op := opProduce
		if b.EndTxn.Manual {
			op = opAlter
		}
		out = append(out, check{op, heraldpb.AclResourceType_ACL_RESOURCE_TRANSACTIONAL_ID, b.EndTxn.TransactionalId})
		out = append(out, offsetChecks(b.EndTxn.GroupOffsets)...)
	default:
		return nil, false
	}
	return out, true
}

// principals are the ACL principals a connection acts as.
func (s *Service) principals(principal string) []string {
	if principal == "" {
		return []string{"anonymous"}
	}
	out := []string{"user:" + principal, "user:*"}
	if u := s.cfg.Users.Get(principal); u != nil {
		for _, g := range u.Groups {
			out = append(out, "group:"+g)
		}
	}
	return out
}

// allowed decides one check for the principals: a matching deny wins,
// else a matching allow allows, else it is denied.
func (s *Service) allowed(who []string, c check) bool {
	ix := s.cfg.ACLs.p.Load()
	if ix == nil {
		return false
	}
	allow := false
	for _, p := range who {
		for _, r := range ix.by[p] {
			if r.ResourceType != c.typ || !opMatches(r.Operation, c.op) || !nameMatches(r, c.name) {
				continue
			}
			if r.Deny {
				return false
			}
			allow = true
		}
	}
	return allow
}

func opMatches(rule, want heraldpb.AclOperation) bool {
	switch {
	case rule == opAll || rule == want:
		return true
	case want == opDescribe:
		return rule != opAdmin // describe comes with every operation on the resource
	}
	return false
}

func nameMatches(r *heraldpb.AclRule, name string) bool {
	switch {
	case r.ResourceType == heraldpb.AclResourceType_ACL_RESOURCE_CLUSTER:
		return true
	case r.Resource == "*":
		// The default vhost's "*": a vhost's is the prefix of its names
		// (netio rewrites it), and the vhost resource's matches them all.
		return r.ResourceType == heraldpb.AclResourceType_ACL_RESOURCE_VHOST || !strings.Contains(name, vhostSep)
	case r.Prefix:
		// A prefix written in the default vhost (no separator) matches
		// only the default vhost's names: "sh" must not match "shop~x".
		return strings.HasPrefix(name, r.Resource) && (strings.Contains(r.Resource, vhostSep) || !strings.Contains(name, vhostSep))
	}
	return r.Resource == name
}

// vhostSep is registry.VhostSep (auth does not import the registry).
const vhostSep = "~"

// isInternal reports whether a topic name is an internal topic's (or one
// starting with __ in a vhost, which cannot exist).
func isInternal(name string) bool {
	if _, local, ok := strings.Cut(name, vhostSep); ok {
		name = local
	}
	return strings.HasPrefix(name, "__")
}

// MayUseVhost reports whether principal may work in vhost (a vhost other
// than the default): a superuser, or one an ACL rule on the vhost allows
// any operation. With logins off every vhost is open.
func (s *Service) MayUseVhost(principal, vhost string) *heraldpb.Error {
	if s.cfg.Mode == Off || s.Superuser(principal) {
		return nil
	}
	c := check{opDescribe, heraldpb.AclResourceType_ACL_RESOURCE_VHOST, vhost}
	if s.allowed(s.principals(principal), c) {
		return nil
	}
	mDenied.Inc()
	return heraldpb.NewError(heraldpb.ErrorCode_NOT_AUTHORIZED, "%s may not use vhost %q (needs an ACL allowing an operation on vhost %q)", who(principal), trim(vhost), trim(vhost))
}

// denied is the NOT_AUTHORIZED error of a check.
func denied(principal string, c check) *heraldpb.Error {
	mDenied.Inc()
	op := strings.ToLower(strings.TrimPrefix(c.op.String(), "ACL_OP_"))
	typ := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(c.typ.String(), "ACL_RESOURCE_"), "_", " "))
	if c.typ == heraldpb.AclResourceType_ACL_RESOURCE_CLUSTER {
		return heraldpb.NewError(heraldpb.ErrorCode_NOT_AUTHORIZED, "%s may not %s on the cluster (needs an ACL allowing %s on cluster)", who(principal), op, op)
	}
	return heraldpb.NewError(heraldpb.ErrorCode_NOT_AUTHORIZED, "%s may not %s %s %q (needs an ACL allowing %s on %s %q)", who(principal), op, typ, trim(c.name), op, typ, trim(c.name))
}

// MayDescribeTopic reports whether principal may see topic name in a
// listing.
func (s *Service) MayDescribeTopic(principal, name string) bool {
	return s.mayDescribe(principal, topicCheck(opDescribe, name))
}

// MayDescribeGroup reports whether principal may see group name in a
// listing.
func (s *Service) MayDescribeGroup(principal, name string) bool {
	return s.mayDescribe(principal, check{opDescribe, heraldpb.AclResourceType_ACL_RESOURCE_GROUP, name})
}

func (s *Service) mayDescribe(principal string, c check) bool {
	switch {
	case s.cfg.Mode == Off || s.Superuser(principal):
		return true
	case c.typ == heraldpb.AclResourceType_ACL_RESOURCE_TOPIC && isInternal(c.name):
		return false
	}
	return s.allowed(s.principals(principal), c)
}

// FilterResponse removes from a listing (Metadata of every topic,
// ListTopics, ListGroups) what principal may not describe. It returns f
// itself when nothing is removed, else a copy: responses may be shared.
func (s *Service) FilterResponse(principal string, f *heraldpb.Frame) *heraldpb.Frame {
	if s.cfg.Mode == Off || s.Superuser(principal) {
		return f
	}
	switch b := f.Body.(type) {
	case *heraldpb.Frame_MetadataResponse:
		keep := filter(b.MetadataResponse.Topics, func(t *heraldpb.TopicInfo) bool { return s.MayDescribeTopic(principal, t.GetName()) })
		if len(keep) == len(b.MetadataResponse.Topics) {
			return f
		}
		r := proto.Clone(b.MetadataResponse).(*heraldpb.MetadataResponse)
		r.Topics = filter(r.Topics, func(t *heraldpb.TopicInfo) bool { return s.MayDescribeTopic(principal, t.GetName()) })
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_MetadataResponse{MetadataResponse: r}}
	case *heraldpb.Frame_ListTopicsResponse:
		keep := filter(b.ListTopicsResponse.Topics, func(t *heraldpb.TopicInfo) bool { return s.MayDescribeTopic(principal, t.GetName()) })
		if len(keep) == len(b.ListTopicsResponse.Topics) {
			return f
		}
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListTopicsResponse{ListTopicsResponse: &heraldpb.ListTopicsResponse{Topics: keep}}}
	case *heraldpb.Frame_ListGroupsResponse:
		keep := filter(b.ListGroupsResponse.Groups, func(g *heraldpb.GroupSummary) bool { return s.MayDescribeGroup(principal, g.GetGroup()) })
		if len(keep) == len(b.ListGroupsResponse.Groups) {
			return f
		}
		return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListGroupsResponse{ListGroupsResponse: &heraldpb.ListGroupsResponse{Groups: keep}}}
	}
	return f
}

// filter is the elements of in that keep, in a new slice.
func filter[T any](in []T, keep func(T) bool) []T {
	out := make([]T, 0, len(in))
	for _, x := range in {
		if keep(x) {
			out = append(out, x)
		}
	}
	return out
}

// offsetChecks: committing a consumer group's offsets in a transaction
// needs the right to consume as that group (Kafka asks READ on the group
// for TxnOffsetCommit).
func offsetChecks(offs []*heraldpb.TxnGroupOffsets) []check {
	var out []check
	for _, o := range offs {
		out = append(out, check{opConsume, heraldpb.AclResourceType_ACL_RESOURCE_GROUP, o.Group})
	}
	return out
}
