package client

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// In a cluster, consumer groups are coordinated by one node (the leader of
// __groups) and transactions by one node (the leader of __txn), not
// necessarily the same; any other node answers their requests with
// NOT_COORDINATOR naming the coordinator. The client remembers each
// area's coordinator separately and goes there; after the groups
// coordinator moves, the broker ends its subscriptions naming the new one.

// coordinator is the node coordinating one area, as the last
// NOT_COORDINATOR answer to a request of that area named it (0: unknown,
// ask any node).
type coordinator struct{ node atomic.Uint32 }

// coordConn returns the connection to co's node when one is known, else
// any connection.
func (c *Client) coordConn(ctx context.Context, co *coordinator) (*conn, error) {
	if id := co.node.Load(); id != 0 {
		c.mu.Lock()
		addr := c.brokers[id]
		c.mu.Unlock()
		if addr == "" {
			_, _ = c.Metadata(ctx) // learn the node's address
			c.mu.Lock()
			addr = c.brokers[id]
			c.mu.Unlock()
		}
		if addr != "" {
			if cn, err := c.connTo(ctx, addr); err == nil {
				return cn, nil
			}
		}
		co.node.CompareAndSwap(id, 0) // gone: ask any node again
	}
	return c.anyConn(ctx)
}

// follow reports whether err is NOT_COORDINATOR and the request of co's
// area should be sent again: to the node it names (at once the first
// time), else after a pause that grows to a second while no node
// coordinates (an election, a new coordinator loading), for as long as
// ctx lasts.
func (c *Client) follow(ctx context.Context, co *coordinator, err error, hop int) bool {
	var he *Error
	if !errors.As(err, &he) || he.Code != heraldpb.ErrorCode_NOT_COORDINATOR {
		return false
	}
	co.node.Store(he.Leader)
	if he.Leader != 0 && hop == 0 {
		return true
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(min(time.Duration(hop+1)*100*time.Millisecond, time.Second)):
		return true
	}
}

// callGroups sends a group request to the groups coordinator.
func (c *Client) callGroups(ctx context.Context, req *heraldpb.Frame) (*heraldpb.Frame, error) {
	for hop := 0; ; hop++ {
		cn, err := c.coordConn(ctx, &c.groups)
		if err != nil {
			return nil, err
		}
		f, err := c.call(ctx, cn, req, 0)
		if c.follow(ctx, &c.groups, err, hop) {
			continue
		}
		return f, err
	}
}
