package broker

import (
	"context"
	"github.com/heraldmq/herald/cluster"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/exchange"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/registry"
	"google.golang.org/protobuf/proto"
)

// tenancy is netio.Tenancy over the node's metadata: the vhosts (the
// controller's in a cluster, DATA/security on a single node), the users'
// quotas, and each vhost's usage counted from the registry every second.
type tenancy struct {
	vhosts atomic.Pointer[map[string]*heraldpb.VhostRecord]
	usage  atomic.Pointer[map[string]vhostUsage] // by vhost, and by "user:NAME" for topic owners
	store  *userStore
}

type vhostUsage struct {
	topics, partitions int
	stored             int64
}

func (t *tenancy) setVhosts(list []*heraldpb.VhostRecord) {
	m := make(map[string]*heraldpb.VhostRecord, len(list))
	for _, v := range list {
		m[v.Name] = v
	}
	t.vhosts.Store(&m)
}

func (t *tenancy) list() []*heraldpb.VhostRecord {
	m := t.vhosts.Load()
	if m == nil {
		return nil
	}
	out := make([]*heraldpb.VhostRecord, 0, len(*m))
	for _, n := range slices.Sorted(maps.Keys(*m)) {
		out = append(out, (*m)[n])
	}
	return out
}

// Vhost is netio.Tenancy.Vhost.
func (t *tenancy) Vhost(name string) (*heraldpb.Quotas, bool) {
	m := t.vhosts.Load()
	if m == nil {
		return nil, false
	}
	v, ok := (*m)[name]
	if !ok {
		return nil, false
	}
	return nonZero(v.Quotas), true
}

// UserQuotas is netio.Tenancy.UserQuotas.
func (t *tenancy) UserQuotas(user string) *heraldpb.Quotas {
	if u := t.store.users.Get(user); u != nil {
		return nonZero(u.Quotas)
	}
	return nil
}

// Usage is netio.Tenancy.Usage.
func (t *tenancy) Usage(vhost string, fresh bool) (int, int, int64) {
	if fresh && t.store != nil {
		t.count(t.store.b.reg)
	}
	if m := t.usage.Load(); m != nil {
		u := (*m)[vhost]
		return u.topics, u.partitions, u.stored
	}
	return 0, 0, 0
}

// UserUsage is netio.Tenancy.UserUsage.
func (t *tenancy) UserUsage(user string, fresh bool) (int, int, int64) {
	return t.Usage("user:"+user, fresh)
}

// TopicOwner is netio.Tenancy.TopicOwner.
func (t *tenancy) TopicOwner(topic string) string {
	if t.store == nil {
		return ""
	}
	if e := t.store.b.reg.Get(topic); e != nil {
		return e.Config.GetOwner()
	}
	return ""
}

// nonZero is q, or nil when it sets no quota.
func nonZero(q *heraldpb.Quotas) *heraldpb.Quotas {
	if q == nil || proto.Equal(q, &heraldpb.Quotas{}) {
		return nil
	}
	return q
}

// count recounts every vhost's topics, partitions and stored bytes (of
// the replicas on this node).
func (t *tenancy) count(reg *registry.Registry) {
	m := map[string]vhostUsage{}
	for _, e := range reg.All() {
		if registry.IsInternal(e.Name) {
			continue
		}
		var stored int64
		for _, s := range e.Stats {
			if s != nil {
				stored += s.SizeBytes.Load()
			}
		}
		v, _ := registry.VhostOf(e.Name)
		keys := []string{v}
		if o := e.Config.GetOwner(); o != "" {
			keys = append(keys, "user:"+o) // vhost names hold no ':'
		}
		for _, k := range keys {
			u := m[k]
			u.topics++
			u.partitions += len(e.Partitions)
			u.stored += stored
			m[k] = u
		}
	}
	t.usage.Store(&m)
}

// countEvery recounts every period until stop closes.
func (t *tenancy) countEvery(reg *registry.Registry, period time.Duration, stop <-chan struct{}) {
	t.count(reg)
	go func() {
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				t.count(reg)
			}
		}
	}()
}

// routeVhosts serves AlterVhost and ListVhosts (netio authorized them).
func (s *userStore) routeVhosts(f *heraldpb.Frame, replyTo *actor.PID) {
	root := s.b.sys.Root
	t := s.b.tenancy
	switch body := f.Body.(type) {
	case *heraldpb.Frame_ListVhosts:
		resp := &heraldpb.ListVhostsResponse{}
		for _, v := range append([]*heraldpb.VhostRecord{{Name: registry.DefaultVhost}}, t.list()...) {
			topics, parts, stored := t.Usage(v.Name, false)
			resp.Vhosts = append(resp.Vhosts, &heraldpb.VhostInfo{Name: v.Name, Quotas: v.Quotas,
				Topics: uint32(topics), Partitions: uint32(parts), StoredBytes: uint64(stored), Connections: uint32(s.b.server.VhostConnections(v.Name))})
		}
		root.Send(replyTo, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListVhostsResponse{ListVhostsResponse: resp}})
	case *heraldpb.Frame_AlterVhost:
		req := body.AlterVhost
		switch {
		case !registry.ValidVhost(req.Name):
			root.Send(replyTo, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "vhost name %q: must be 1-64 characters of A-Z a-z 0-9 . _ - (the default vhost / cannot be changed)", cut(req.Name))))
			return
		case req.Delete && (req.Create || req.Quotas != nil):
			root.Send(replyTo, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "delete takes neither create nor quotas")))
			return
		}
		_, exists := t.Vhost(req.Name)
		switch {
		case req.Create && exists:
			root.Send(replyTo, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "vhost %q already exists", req.Name)))
			return
		case !req.Create && !exists:
			root.Send(replyTo, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_VHOST_NOT_FOUND, "vhost %q does not exist", req.Name)))
			return
		case req.Delete:
			if n := s.topicsIn(req.Name); n > 0 {
				root.Send(replyTo, heraldpb.ErrorFrame(f.Id, heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "vhost %q has %d topics: delete them first", req.Name, n)))
				return
			}
		}
		s.inBackground(f, replyTo, func(ctx context.Context) error { return s.alterVhost(ctx, req) }, func() *heraldpb.Frame {
			s.b.log.Info("vhost changed", "vhost", req.Name, "create", req.Create, "delete", req.Delete)
			return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_AlterVhostResponse{AlterVhostResponse: &heraldpb.AlterVhostResponse{}}}
		})
	}
}

// topicsIn counts vhost's topics.
func (s *userStore) topicsIn(vhost string) int {
	n := 0
	for _, e := range s.b.reg.All() {
		if registry.InVhostOf(vhost, e.Name) {
			n++
		}
	}
	return n
}

// alterVhost applies a checked AlterVhost where this node keeps them.
func (s *userStore) alterVhost(ctx context.Context, req *heraldpb.AlterVhostRequest) error {
	if s.clustered {
		ctrl, err := s.controller()
		if err != nil {
			return err
		}
		return ctrl.AlterVhost(ctx, req)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	list := s.b.tenancy.list()
	list = slices.DeleteFunc(list, func(v *heraldpb.VhostRecord) bool { return v.Name == req.Name })
	if !req.Delete {
		list = append(list, &heraldpb.VhostRecord{Name: req.Name, Quotas: req.Quotas})
	}
	acls := s.acls.List("")
	if req.Delete {
		acls = cluster.RulesWithoutVhost(acls, req.Name)
		if _, err := s.b.exchanges.changeLocal(func(md exchange.Metadata) (bool, error) {
			n := len(md)
			md.DeleteVhost(registry.InVhost(req.Name, ""))
			return len(md) != n, nil
		}); err != nil {
			return err
		}
	}
	return s.saveLocal(usersByName(s.users.List()), acls, list)
}
