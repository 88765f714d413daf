package netio

import (
	"fmt"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// AuditEvent is one entry of the audit log: who did what, when, from
// where, and how it ended. netio reports administrative requests (topics
// created and deleted, group resets, cluster changes, repairs, user, ACL
// and vhost changes, transactions ended by hand) once answered, every
// request refused for want of a login or a permission, and failed logins.
type AuditEvent struct {
	Time      time.Time
	Principal string // "" = anonymous
	Remote    string
	Vhost     string
	Action    string // the request (create_topic, alter_user, ...) or "login"
	Resource  string // what it named, as the client named it
	Outcome   string // "ok", or the error code
	Message   string // the error's message, if any
}

// auditOf is the audit entry of request f (named as the client named
// it), or nil if f is not an administrative request.
func auditOf(f *heraldpb.Frame) *AuditEvent {
	var action, res string
	switch b := f.Body.(type) {
	case *heraldpb.Frame_CreateTopic:
		action, res = "create_topic", b.CreateTopic.Name
	case *heraldpb.Frame_DeleteTopic:
		action, res = "delete_topic", b.DeleteTopic.Name
	case *heraldpb.Frame_ResetGroup:
		action, res = "reset_group", fmt.Sprintf("%s force=%v", b.ResetGroup.Group, b.ResetGroup.Force)
	case *heraldpb.Frame_ClusterAdmin:
		action, res = "cluster_admin", fmt.Sprintf("%s node=%d dry_run=%v", b.ClusterAdmin.Op, b.ClusterAdmin.NodeId, b.ClusterAdmin.DryRun)
	case *heraldpb.Frame_RepairPartition:
		action, res = "repair_partition", fmt.Sprintf("%s/%d accept_loss=%v", b.RepairPartition.Topic, b.RepairPartition.Partition, b.RepairPartition.AcceptLoss)
	case *heraldpb.Frame_AlterUser:
		u := b.AlterUser
		kind := "passwd"
		switch {
		case u.Delete:
			kind = "delete"
		case u.Create:
			kind = "add"
		case u.SetGroups:
			kind = fmt.Sprintf("groups %v", u.Groups)
		case u.SetQuotas:
			kind = "quota"
		}
		action, res = "alter_user", u.Name+" "+kind
	case *heraldpb.Frame_AlterAcls:
		action, res = "alter_acls", fmt.Sprintf("add %d rule(s), remove %d: %v", len(b.AlterAcls.Add), len(b.AlterAcls.Remove), rules(b.AlterAcls))
	case *heraldpb.Frame_AlterVhost:
		kind := "set"
		switch {
		case b.AlterVhost.Delete:
			kind = "delete"
		case b.AlterVhost.Create:
			kind = "add"
		}
		action, res = "alter_vhost", b.AlterVhost.Name+" "+kind
	case *heraldpb.Frame_DeclareExchange:
		x := b.DeclareExchange.GetExchange()
		action, res = "declare_exchange", fmt.Sprintf("%s type=%s alternate=%q", x.GetName(), x.GetType(), x.GetAlternate())
	case *heraldpb.Frame_DeleteExchange:
		action, res = "delete_exchange", b.DeleteExchange.Name
	case *heraldpb.Frame_Bind:
		bd := b.Bind.GetBinding()
		action = "bind"
		if b.Bind.Unbind {
			action = "unbind"
		}
		res = fmt.Sprintf("%s -> topic=%q exchange=%q key=%q headers=%v any=%v", bd.GetExchange(), bd.GetTopic(), bd.GetToExchange(), bd.GetKey(), bd.GetHeaders(), bd.GetMatchAny())
	case *heraldpb.Frame_EndHalf:
		if !b.EndHalf.Manual && b.EndHalf.ProducerGroup != "" {
			return nil
		}
		action, res = "end_half", fmt.Sprintf("%s %s", b.EndHalf.Id, b.EndHalf.Action)
	case *heraldpb.Frame_EndTxn:
		if !b.EndTxn.Manual {
			return nil
		}
		action, res = "abort_txn", b.EndTxn.TransactionalId
	default:
		return nil
	}
	return &AuditEvent{Action: action, Resource: res}
}

// rules is an AlterAcls's rules in short.
func rules(r *heraldpb.AlterAclsRequest) string {
	s := ""
	for i, x := range append(append([]*heraldpb.AclRule{}, r.Add...), r.Remove...) {
		if i == 8 {
			return s + " ..."
		}
		if s != "" {
			s += "; "
		}
		perm := "allow"
		if x.Deny {
			perm = "deny"
		}
		s += fmt.Sprintf("%s %s %s %s %q prefix=%v", perm, x.Principal, x.Operation, x.ResourceType, x.Resource, x.Prefix)
	}
	return s
}

// audit reports ev, completed with the connection's identity, to the
// configured audit hook.
func (c *conn) audit(ev *AuditEvent, e *heraldpb.Error) {
	hook := c.s.cfg.Audit
	if hook == nil || ev == nil {
		return
	}
	ev.Time = time.Now()
	ev.Principal, ev.Vhost = c.who(), c.vhostName()
	if ev.Remote == "" {
		ev.Remote = c.remote() // on the loop; a routed request's was noted then
	}
	ev.Outcome = "ok"
	if e != nil {
		ev.Outcome, ev.Message = e.Code.String(), e.Message
	}
	hook(*ev)
}

// auditRequest notes an administrative request routed (its entry is
// reported with the answer), or reports a refused request now.
func (c *conn) auditRequest(ev *AuditEvent, f *heraldpb.Frame, refused *heraldpb.Error) {
	if c.s.cfg.Audit == nil {
		return
	}
	if refused != nil {
		switch refused.Code {
		case heraldpb.ErrorCode_NOT_AUTHENTICATED:
			// Requests before a login are noise anyone can make (and
			// could flood the log with); failed logins are recorded.
			return
		case heraldpb.ErrorCode_NOT_AUTHORIZED:
			if ev == nil {
				name, _ := bodyKind(f)
				ev = &AuditEvent{Action: name}
			}
		}
		c.audit(ev, refused)
		return
	}
	if ev != nil {
		ev.Remote = c.remote()
		c.mu.Lock()
		if c.audits == nil {
			c.audits = map[uint64]*AuditEvent{}
		}
		c.audits[f.Id] = ev
		c.mu.Unlock()
	}
}

// auditAnswer reports the entry of the request f answers, if any.
func (c *conn) auditAnswer(f *heraldpb.Frame) {
	if c.s.cfg.Audit == nil {
		return
	}
	c.mu.Lock()
	ev := c.audits[f.Id]
	delete(c.audits, f.Id)
	c.mu.Unlock()
	if ev != nil {
		c.audit(ev, f.GetError())
	}
}
