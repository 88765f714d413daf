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
	"github.com/heraldmq/herald/persistence"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// Users live in the node's metadata: the controller group's in a cluster
// (replicated like topics, so every node can check a login), DATA/users
// on a single node. Only salted, iterated SCRAM credentials are stored.

// usersFile is a single node's users, a heraldpb.UserList.
const usersFile = "users"

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
	clustered bool // the controller keeps them (else DATA/users)
	users     *auth.Users
	boot      *heraldpb.AlterUserRequest // --bootstrap-user, for the controller
	mu        sync.Mutex                 // a single node's file: one change at a time
}

// loadUsers reads a single node's users file (none: no users).
func loadUsers(fsys persistence.FS, dir string) (map[string]*heraldpb.UserRecord, error) {
	path := filepath.Join(dir, usersFile)
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]*heraldpb.UserRecord{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var list heraldpb.UserList
	if err := proto.Unmarshal(data, &list); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := make(map[string]*heraldpb.UserRecord, len(list.Users))
	for _, u := range list.Users {
		out[u.Name] = u
	}
	return out, nil
}

// alterLocal changes a single node's users: the file first (atomically,
// synced), then the set logins check.
func (s *userStore) alterLocal(req *heraldpb.AlterUserRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := map[string]*heraldpb.UserRecord{}
	for _, u := range s.users.List() {
		cur[u.Name] = u
	}
	have := cur[req.Name]
	switch {
	case req.Create && have != nil:
		return heraldpb.NewError(heraldpb.ErrorCode_USER_ALREADY_EXISTS, "user %q already exists", req.Name)
	case !req.Create && have == nil:
		return heraldpb.NewError(heraldpb.ErrorCode_USER_NOT_FOUND, "user %q does not exist", req.Name)
	}
	if req.Delete {
		delete(cur, req.Name)
	} else {
		cur[req.Name] = &heraldpb.UserRecord{Name: req.Name, ScramSha256: req.ScramSha256, UpdatedMs: time.Now().UnixMilli()}
	}
	list := &heraldpb.UserList{}
	for _, n := range slices.Sorted(maps.Keys(cur)) {
		list.Users = append(list.Users, cur[n])
	}
	data, err := proto.Marshal(list)
	if err != nil {
		return heraldpb.NewError(heraldpb.ErrorCode_INTERNAL, "encoding users: %v", err)
	}
	if err := persistence.WriteFileAtomic(s.b.fs, filepath.Join(s.b.cfg.DataDir, usersFile), data, 0o600); err != nil {
		return heraldpb.NewError(heraldpb.ErrorCode_STORAGE_ERROR, "saving users: %v; nothing changed", err)
	}
	s.users.Set(cur)
	return nil
}

// alter applies a checked AlterUser where this node keeps its users.
func (s *userStore) alter(ctx context.Context, req *heraldpb.AlterUserRequest) error {
	if !s.clustered {
		return s.alterLocal(req)
	}
	ctrl := s.b.ctrlReady.Load()
	if ctrl == nil {
		e := heraldpb.NewError(heraldpb.ErrorCode_NOT_READY, "the node is joining its cluster")
		e.RetryAfterMs = 500
		return e
	}
	return ctrl.AlterUser(ctx, req)
}

// checkAlterUser refuses an AlterUser no store accepts.
func checkAlterUser(req *heraldpb.AlterUserRequest) *heraldpb.Error {
	if !validUser.MatchString(req.Name) {
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "user name %q: must be 1-128 characters of A-Z a-z 0-9 . _ @ -", cut(req.Name))
	}
	switch {
	case req.Delete && (req.Create || req.ScramSha256 != nil):
		return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "delete takes neither create nor credentials")
	case !req.Delete:
		if err := scramcred.Check(req.ScramSha256); err != nil {
			return heraldpb.NewError(heraldpb.ErrorCode_INVALID_REQUEST, "user %q: %v", req.Name, err)
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
			info := &heraldpb.UserInfo{Name: u.Name, UpdatedMs: u.UpdatedMs, Superuser: s.b.auth.Superuser(u.Name)}
			if c := u.ScramSha256; c != nil {
				info.Mechanisms = []string{auth.SCRAMSHA256}
				info.Iterations = c.Iterations
			}
			resp.Users = append(resp.Users, info)
		}
		root.Send(replyTo, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_ListUsersResponse{ListUsersResponse: resp}})
	case *heraldpb.Frame_AlterUser:
		req := body.AlterUser
		if e := checkAlterUser(req); e != nil {
			root.Send(replyTo, heraldpb.ErrorFrame(f.Id, e))
			return
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), userRequestTimeout)
			defer cancel()
			if err := s.alter(ctx, req); err != nil {
				root.Send(replyTo, heraldpb.ErrorFrame(f.Id, asError(err)))
				return
			}
			what := "changed"
			switch {
			case req.Delete:
				what = "deleted"
			case req.Create:
				what = "created"
			}
			s.b.log.Info("user "+what, "user", req.Name)
			root.Send(replyTo, &heraldpb.Frame{Id: f.Id, Body: &heraldpb.Frame_AlterUserResponse{AlterUserResponse: &heraldpb.AlterUserResponse{}}})
		}()
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
	users := &auth.Users{}
	if !clustered {
		have, err := loadUsers(b.fs, b.cfg.DataDir)
		if err != nil {
			return fmt.Errorf("users: %w", err)
		}
		users.Set(have)
	} else {
		users.Set(map[string]*heraldpb.UserRecord{})
	}
	b.auth = auth.New(auth.Config{Mode: b.cfg.authMode, Superusers: b.cfg.superusers(), Users: users, Logger: b.log})
	b.users = &userStore{b: b, clustered: clustered, users: users}
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
