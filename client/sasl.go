package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/heraldmq/herald/auth/scramcred"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/xdg-go/scram"
)

// ErrNotAuthenticated: the broker refused the login (unknown user or wrong
// password, which it says the same way), requires one (WithSCRAM), or
// failed to prove it knows the user's credentials. The error also matches
// IsCode(err, NOT_AUTHENTICATED) when the broker said so. Not retryable.
var ErrNotAuthenticated = errors.New("herald: not authenticated")

// ErrNotAuthorized: the connection's principal may not make the request;
// the broker's message names the operation and the resource. Not
// retryable.
var ErrNotAuthorized = errors.New("herald: not authorized")

const scramMechanism = "SCRAM-SHA-256"

// scramLogin is one client's SCRAM credentials: the xdg-go/scram client
// caches the salted password per salt and iteration count, so each new
// connection's login costs no PBKDF2.
type scramLogin struct {
	client *scram.Client
	err    error // the name or password is not valid for SCRAM
}

// WithSCRAM logs every connection in as user (SCRAM-SHA-256, RFC 5802 and
// 7677). The password never crosses the network, and the client checks
// that the broker knows the user's credentials too. A broker with --auth
// required refuses every request of a connection that has not logged in;
// a TLS client certificate logs a connection in without this option.
func WithSCRAM(user, password string) Option {
	return clientOpt(func(c *clientConfig) {
		sc, err := scram.SHA256.NewClient(user, password, "")
		if err != nil {
			err = fmt.Errorf("%w: the user name or password is not valid for SCRAM (SASLprep): %w", ErrNotAuthenticated, err)
		}
		c.login = &scramLogin{client: sc, err: err}
	})
}

// Principal is who the broker says the connection to addr acts as: the
// user logged in, the subject of the TLS client certificate, or "" for an
// anonymous connection.
func (c *Client) Principal(ctx context.Context) (string, error) {
	cn, err := c.anyConn(ctx)
	if err != nil {
		return "", err
	}
	return cn.principal, nil
}

// NewSCRAMCredential derives the SCRAM-SHA-256 credentials a broker stores
// for a user from the password, with a fresh salt, on this side: AlterUser
// sends them, never the password. iterations 0 means the default (8192).
func NewSCRAMCredential(user, password string, iterations int) (*heraldpb.ScramCredential, error) {
	return scramcred.New(user, password, iterations)
}

// AddUser creates user with SCRAM credentials derived here from password
// (NewSCRAMCredential; iterations 0 = the default). It fails with
// USER_ALREADY_EXISTS if the user exists, and needs a superuser when the
// broker requires logins.
func (c *Client) AddUser(ctx context.Context, user, password string, iterations int) error {
	cred, err := NewSCRAMCredential(user, password, iterations)
	if err != nil {
		return err
	}
	return c.AlterUser(ctx, &heraldpb.AlterUserRequest{Name: user, ScramSha256: cred, Create: true})
}

// SetPassword replaces an existing user's credentials (USER_NOT_FOUND if
// there is no such user).
func (c *Client) SetPassword(ctx context.Context, user, password string, iterations int) error {
	cred, err := NewSCRAMCredential(user, password, iterations)
	if err != nil {
		return err
	}
	return c.AlterUser(ctx, &heraldpb.AlterUserRequest{Name: user, ScramSha256: cred})
}

// DeleteUser deletes a user (USER_NOT_FOUND if there is no such user).
// Connections already logged in as the user stay so until they close.
func (c *Client) DeleteUser(ctx context.Context, user string) error {
	return c.AlterUser(ctx, &heraldpb.AlterUserRequest{Name: user, Delete: true})
}

// AlterUser sends an AlterUser request as is.
func (c *Client) AlterUser(ctx context.Context, req *heraldpb.AlterUserRequest) error {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_AlterUser{AlterUser: req}})
	if err != nil {
		return err
	}
	if f.GetAlterUserResponse() == nil {
		return unexpected(f, "AlterUserResponse")
	}
	return nil
}

// ListUsers returns the users by name (never their credentials).
func (c *Client) ListUsers(ctx context.Context) ([]*heraldpb.UserInfo, error) {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_ListUsers{ListUsers: &heraldpb.ListUsersRequest{}}})
	if err != nil {
		return nil, err
	}
	r := f.GetListUsersResponse()
	if r == nil {
		return nil, unexpected(f, "ListUsersResponse")
	}
	return r.GetUsers(), nil
}

// SetUserGroups replaces an existing user's groups (its ACL principals
// "group:NAME"); the credentials stay.
func (c *Client) SetUserGroups(ctx context.Context, user string, groups []string) error {
	return c.AlterUser(ctx, &heraldpb.AlterUserRequest{Name: user, Groups: groups, SetGroups: true})
}

// AlterAcls adds and removes ACL rules (needs admin on the cluster when
// the broker requires logins).
func (c *Client) AlterAcls(ctx context.Context, add, remove []*heraldpb.AclRule) error {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_AlterAcls{AlterAcls: &heraldpb.AlterAclsRequest{Add: add, Remove: remove}}})
	if err != nil {
		return err
	}
	if f.GetAlterAclsResponse() == nil {
		return unexpected(f, "AlterAclsResponse")
	}
	return nil
}

// ListAcls returns the ACL rules (of principal, unless it is "").
func (c *Client) ListAcls(ctx context.Context, principal string) ([]*heraldpb.AclRule, error) {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_ListAcls{ListAcls: &heraldpb.ListAclsRequest{Principal: principal}}})
	if err != nil {
		return nil, err
	}
	r := f.GetListAclsResponse()
	if r == nil {
		return nil, unexpected(f, "ListAclsResponse")
	}
	return r.GetRules(), nil
}

// AlterVhost creates, changes or deletes a vhost (needs admin on the
// cluster when the broker requires logins).
func (c *Client) AlterVhost(ctx context.Context, req *heraldpb.AlterVhostRequest) error {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_AlterVhost{AlterVhost: req}})
	if err != nil {
		return err
	}
	if f.GetAlterVhostResponse() == nil {
		return unexpected(f, "AlterVhostResponse")
	}
	return nil
}

// ListVhosts returns the vhosts, the default first, with their quotas
// and usage as the answering node sees it.
func (c *Client) ListVhosts(ctx context.Context) ([]*heraldpb.VhostInfo, error) {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_ListVhosts{ListVhosts: &heraldpb.ListVhostsRequest{}}})
	if err != nil {
		return nil, err
	}
	r := f.GetListVhostsResponse()
	if r == nil {
		return nil, unexpected(f, "ListVhostsResponse")
	}
	return r.GetVhosts(), nil
}

// SetUserQuotas replaces an existing user's quotas (nil: none).
func (c *Client) SetUserQuotas(ctx context.Context, user string, q *heraldpb.Quotas) error {
	return c.AlterUser(ctx, &heraldpb.AlterUserRequest{Name: user, Quotas: q, SetQuotas: true})
}
