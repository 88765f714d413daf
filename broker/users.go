package broker

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/auth/scramcred"
	"github.com/heraldmq/herald/cluster"
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// Users and ACL rules live in the node's metadata: the controller group's
// in a cluster (replicated like topics, so every node can check a login
// and a permission), DATA/security on a single node. Only salted, iterated
// SCRAM credentials are stored.

// securityFile is a single node's users and ACLs, a heraldpb.SecurityState.
const securityFile = "security"

// validUser is the shape of a user name.
var validUser = regexp.MustCompile(`^[A-Za-z0-9._@-]{1,128}$`)

// validateAuth parses --auth and checks the login settings.
func (c *Config) validateAuth(bad func(name, format string, args ...any)) {
	switch c.Auth {
	case "":
		c.authMode = auth.Off
		if exposed(c.Listen) || (c.ListenTLS != "" && exposed(c.ListenTLS)) {
			c.authMode = auth.Required
		}
	default:
		m, err := auth.ParseMode(c.Auth)
		if err != nil {
			bad("auth", "want required, optional or off")
		}
		c.authMode = m
	}
	for _, n := range c.superusers() {
		if !validUser.MatchString(n) {
			bad("superusers", "%q is not a user name (1-128 characters of A-Z a-z 0-9 . _ @ -)", n)
		}
	}
	switch {
	case c.BootstrapUser != "" && !validUser.MatchString(c.BootstrapUser):
		bad("bootstrap-user", "%q is not a user name (1-128 characters of A-Z a-z 0-9 . _ @ -)", c.BootstrapUser)
	case (c.BootstrapUser == "") != (c.BootstrapPasswordFile == ""):
		bad("bootstrap-user", "--bootstrap-user and --bootstrap-password-file go together")
	}
}

func (c *Config) superusers() []string {
	var out []string
	for _, n := range strings.Split(c.Superusers, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	if c.BootstrapUser != "" && !slices.Contains(out, c.BootstrapUser) {
		out = append(out, c.BootstrapUser)
	}
	return out
}

// exposed reports whether addr is reachable beyond this host.
func exposed(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "" {
		return true // every interface
	}
	if host == "localhost" {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsLoopback()
}

// userStore is where a node keeps its users.
type userStore struct {
	b         *Broker
	clustered bool // the controller keeps them (else DATA/security)
	users     *auth.Users
	acls      *auth.ACLs
	boot      *heraldpb.AlterUserRequest // --bootstrap-user, for the controller
	mu        sync.Mutex                 // a single node's file: one change at a time
}

// loadSecurity reads a single node's security file (none: no users, no
// rules).
func loadSecurity(fsys persistence.FS, dir string) (*heraldpb.SecurityState, error) {
	var st heraldpb.SecurityState
	if err := readStateFile(fsys, filepath.Join(dir, securityFile), &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// readStateFile reads a node's state file (a protobuf message) into m;
// a file that does not exist leaves m empty.
func readStateFile(fsys persistence.FS, path string, m proto.Message) error {
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := proto.Unmarshal(data, m); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func usersByName(list []*heraldpb.UserRecord) map[string]*heraldpb.UserRecord {
	out := make(map[string]*heraldpb.UserRecord, len(list))
	for _, u := range list {
		out[u.Name] = u
	}
	return out
}

// saveLocal writes a single node's users and rules (atomically, synced)
// and then makes them the ones logins and requests are checked against.
func (s *userStore) saveLocal(users map[string]*heraldpb.UserRecord, acls []*heraldpb.AclRule, vhosts []*heraldpb.VhostRecord) error {
	st := &heraldpb.SecurityState{Acls: acls, Vhosts: vhosts}
	for _, n := range slices.Sorted(maps.Keys(users)) {
		st.Users = append(st.Users, users[n])
	}
	data, err := proto.Marshal(st)
	if err != nil {
		return heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "encoding users and ACLs: %v", err)
	}
	if err := persistence.WriteFileAtomic(s.b.fs, filepath.Join(s.b.cfg.DataDir, securityFile), data, 0o600); err != nil {
		return heraldpb.NewError(heraldpb.ErrorCode_STORAGE_ERROR, "saving users and ACLs: %v; nothing changed", err)
	}
	s.users.Set(users)
	s.acls.Set(acls)
	s.b.tenancy.setVhosts(vhosts)
	return nil
}

// alterLocal changes a single node's users.
func (s *userStore) alterLocal(req *heraldpb.AlterUserRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := usersByName(s.users.List())
	have := cur[req.Name]
	switch {
	case req.Create && have != nil:
		return heraldpb.NewError(heraldpb.ErrorCode_USER_ALREADY_EXISTS, "user %q already exists", req.Name)
	case !req.Create && have == nil:
		return heraldpb.NewError(heraldpb.ErrorCode_USER_NOT_FOUND, "user %q does not exist", req.Name)
	}
	now := time.Now().UnixMilli()
	switch {
	case req.Delete:
		delete(cur, req.Name)
	case req.SetGroups:
		n := proto.Clone(have).(*heraldpb.UserRecord)
		n.Groups, n.UpdatedMs = req.Groups, now
		cur[req.Name] = n
	case req.SetQuotas:
		n := proto.Clone(have).(*heraldpb.UserRecord)
		n.Quotas, n.UpdatedMs = req.Quotas, now
		cur[req.Name] = n
	default:
		cur[req.Name] = &heraldpb.UserRecord{Name: req.Name, ScramSha256: req.ScramSha256, UpdatedMs: now, Groups: req.Groups, Quotas: req.Quotas}
		if have != nil {
			cur[req.Name].Groups, cur[req.Name].Quotas = have.Groups, have.Quotas // passwd keeps them
		}
	}
	return s.saveLocal(cur, s.acls.List(""), s.b.tenancy.list())
}

// alterAclsLocal changes a single node's rules.
func (s *userStore) alterAclsLocal(req *heraldpb.AlterAclsRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.saveLocal(usersByName(s.users.List()), cluster.AlterRules(s.acls.List(""), req), s.b.tenancy.list())
}

// alter applies a checked AlterUser where this node keeps its users.
func (s *userStore) alter(ctx context.Context, req *heraldpb.AlterUserRequest) error {
	if !s.clustered {
		return s.alterLocal(req)
	}
	ctrl, err := s.controller()
	if err != nil {
		return err
	}
	return ctrl.AlterUser(ctx, req)
}

// controller is the node's controller, or NOT_READY while it starts.
func (s *userStore) controller() (*cluster.Controller, error) {
	ctrl := s.b.ctrlReady.Load()
	if ctrl == nil {
		e := heraldpb.NewError(heraldpb.ErrorCode_NOT_READY, "the node is joining its cluster")
		e.RetryAfterMs = 500
		return nil, e
	}
	return ctrl, nil
}

// inBackground runs a change of the users, ACLs or vhosts off the
// routing path (it may wait for the controller, within
// userRequestTimeout), then answers replyTo with ok() or the error.
func (s *userStore) inBackground(f *heraldpb.Frame, replyTo *actor.PID, apply func(context.Context) error, ok func() *heraldpb.Frame) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), userRequestTimeout)
		defer cancel()
		if err := apply(ctx); err != nil {
			s.b.sys.Root.Send(replyTo, heraldpb.ErrorFrame(f.Id, asError(err)))
			return
		}
		s.b.sys.Root.Send(replyTo, ok())
	}()
}

// checkAlterUser refuses an AlterUser no store accepts.
func checkAlterUser(req *heraldpb.AlterUserRequest) *heraldpb.Error {
	if !validUser.MatchString(req.Name) {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "user name %q: must be 1-128 characters of A-Z a-z 0-9 . _ @ -", cut(req.Name))
	}
	if len(req.Groups) > 64 {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "user %q: %d groups, at most 64", req.Name, len(req.Groups))
	}
	for _, g := range req.Groups {
		if !auth.ValidName(g) {
			return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "group name %q: must be 1-128 characters of A-Z a-z 0-9 . _ @ -", cut(g))
		}
	}
	switch {
	case req.Delete && (req.Create || req.ScramSha256 != nil || req.SetGroups):
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "delete takes neither create, credentials nor groups")
	case req.Delete && req.SetQuotas:
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "delete takes no quotas")
	case (req.SetGroups || req.SetQuotas) && (req.Create || req.ScramSha256 != nil):
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "set_groups and set_quotas change only those: no create, no credentials")
	case req.SetGroups && req.SetQuotas:
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "change the groups and the quotas one at a time")
	case req.SetGroups, req.SetQuotas:
	case !req.Delete:
		if err := scramcred.Check(req.ScramSha256); err != nil {
			return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "user %q: %v", req.Name, err)
		}
	}
	return nil
}

// checkAlterAcls refuses an AlterAcls whose rules are malformed.
func checkAlterAcls(req *heraldpb.AlterAclsRequest) *heraldpb.Error {
	if n := len(req.Add) + len(req.Remove); n == 0 || n > 1000 {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "%d rules: give 1 to 1000", n)
	}
	for _, r := range append(slices.Clone(req.Add), req.Remove...) {
		if err := auth.CheckRule(r); err != nil {
			return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "ACL rule: %v", err)
		}
	}
	return nil
}

func cut(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// userRequestTimeout bounds an AlterUser's wait for the controller.
const userRequestTimeout = 10 * time.Second

// routeUsers serves AlterUser and ListUsers (netio authorized them).
func (s *userStore) route(f *heraldpb.Frame, replyTo *actor.PID) {
	root := s.b.sys.Root
	switch body := f.Body.(type) {
	case *heraldpb.Frame_ListUsers:
		resp := &heraldpb.ListUsersResponse{}
		for _, u := range s.users.List() {
			info := &heraldpb.UserInfo{Name: u.Name, UpdatedMs: u.UpdatedMs, Superuser: s.b.auth.Superuser(u.Name), Groups: u.Groups, Quotas: u.Quotas}
			if c := u.ScramSha256; c != nil {
				info.Mechanisms = []string{auth.SCRAMSHA256}
				info.Iterations = c.Iterations
			}
			resp.Users = append(resp.Users, info)
		}
		root.Send(replyTo, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListUsersResponse{ListUsersResponse: resp}})
	case *heraldpb.Frame_AlterVhost, *heraldpb.Frame_ListVhosts:
		s.routeVhosts(f, replyTo)
	case *heraldpb.Frame_ListAcls:
		root.Send(replyTo, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListAclsResponse{ListAclsResponse: &heraldpb.ListAclsResponse{Rules: s.acls.List(body.ListAcls.Principal)}}})
	case *heraldpb.Frame_AlterAcls:
		req := body.AlterAcls
		if e := checkAlterAcls(req); e != nil {
			root.Send(replyTo, heraldpb.ErrorFrame(f.Id, e))
			return
		}
		s.inBackground(f, replyTo, func(ctx context.Context) error {
			if !s.clustered {
				return s.alterAclsLocal(req)
			}
			ctrl, err := s.controller()
			if err != nil {
				return err
			}
			return ctrl.AlterAcls(ctx, req)
		}, func() *heraldpb.Frame {
			s.b.log.Info("ACLs changed", "added", len(req.Add), "removed", len(req.Remove))
			return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_AlterAclsResponse{AlterAclsResponse: &heraldpb.AlterAclsResponse{}}}
		})
	case *heraldpb.Frame_AlterUser:
		req := body.AlterUser
		if e := checkAlterUser(req); e != nil {
			root.Send(replyTo, heraldpb.ErrorFrame(f.Id, e))
			return
		}
		s.inBackground(f, replyTo, func(ctx context.Context) error { return s.alter(ctx, req) }, func() *heraldpb.Frame {
			what := "changed"
			switch {
			case req.Delete:
				what = "deleted"
			case req.Create:
				what = "created"
			}
			s.b.log.Info("user "+what, "user", req.Name)
			return &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_AlterUserResponse{AlterUserResponse: &heraldpb.AlterUserResponse{}}}
		})
	}
}

// asError is err as a wire error.
func asError(err error) *heraldpb.Error {
	var e *heraldpb.Error
	if errors.As(err, &e) {
		return e
	}
	return heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "%v", err)
}

// readPasswordFile is the first line of path.
func readPasswordFile(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	line, _, _ := bufio.NewReader(bytes.NewReader(data)).ReadLine()
	if len(line) == 0 {
		return "", fmt.Errorf("%s: the first line is empty", path)
	}
	return string(line), nil
}

// startAuth makes the node's login service and user store: a single
// node reads DATA/users, and creates --bootstrap-user now when absent.
func (b *Broker) startAuth(clustered bool) error {
	users, acls := &auth.Users{}, &auth.ACLs{}
	b.tenancy = &tenancy{}
	if !clustered {
		st, err := loadSecurity(b.fs, b.cfg.DataDir)
		if err != nil {
			return fmt.Errorf("users and ACLs: %w", err)
		}
		users.Set(usersByName(st.Users))
		acls.Set(st.Acls)
		b.tenancy.setVhosts(st.Vhosts)
	} else {
		users.Set(map[string]*heraldpb.UserRecord{})
		acls.Set(nil)
		b.tenancy.setVhosts(nil)
	}
	b.auth = auth.New(auth.Config{Mode: b.cfg.authMode, Superusers: b.cfg.superusers(), Users: users, ACLs: acls, Logger: b.log})
	if path := b.auditPath(); path != "" {
		a, err := openAudit(path, b.log.Warn)
		if err != nil {
			return err
		}
		b.audit = a
	}
	b.users = &userStore{b: b, clustered: clustered, users: users, acls: acls}
	b.tenancy.store = b.users
	b.tenancy.countEvery(b.reg, time.Second, b.readyStop)
	name := b.cfg.BootstrapUser
	if name == "" {
		return nil
	}
	pw, err := readPasswordFile(b.cfg.BootstrapPasswordFile)
	if err != nil {
		return fmt.Errorf("--bootstrap-password-file: %w", err)
	}
	if !clustered && users.Get(name) != nil {
		return nil
	}
	cred, err := scramcred.New(name, pw, scramcred.DefaultIterations)
	if err != nil {
		return fmt.Errorf("--bootstrap-user %s: %w", name, err)
	}
	req := &heraldpb.AlterUserRequest{Name: name, ScramSha256: cred, Create: true}
	if clustered {
		b.users.boot = req // proposed once the controller runs
		return nil
	}
	if err := b.users.alterLocal(req); err != nil {
		return fmt.Errorf("--bootstrap-user %s: %w", name, err)
	}
	b.log.Info("bootstrap user created", "user", name)
	return nil
}

// bootstrapCluster has the controller create --bootstrap-user when
// absent, retrying until it is there or stop closes.
func (s *userStore) bootstrapCluster(stop <-chan struct{}) {
	req := s.boot
	if req == nil {
		return
	}
	go func() {
		for s.users.Get(req.Name) == nil {
			ctx, cancel := context.WithTimeout(context.Background(), userRequestTimeout)
			err := s.alter(ctx, req)
			cancel()
			var e *heraldpb.Error
			switch {
			case err == nil:
				s.b.log.Info("bootstrap user created", "user", req.Name)
				return
			case errors.As(err, &e) && e.Code == heraldpb.ErrorCode_USER_ALREADY_EXISTS:
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
		}
	}()
}
