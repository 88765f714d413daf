package client

import (
	"context"
	"errors"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Consumer groups in a cluster are coordinated by one node (the leader of
// __groups); any other node answers subscriptions, group admin requests
// and request-reply calls with NOT_COORDINATOR naming it. The client
// remembers that node and goes there; after the coordinator moves, the
// broker ends its subscriptions naming the new one.

// groupConn returns the connection to the group coordinator when one is
// known, else any connection.
func (c *Client) groupConn(ctx context.Context) (*conn, error) {
	if id := c.coordinator.Load(); id != 0 {
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
		c.coordinator.CompareAndSwap(id, 0) // gone: ask any node again
	}
	return c.anyConn(ctx)
}

// followCoordinator reports whether err is NOT_COORDINATOR and the
// request should be sent again: to the node it names (at once the first
// time), else after a pause that grows to a second while no node
// coordinates (an election, a new coordinator loading), for as long as
// ctx lasts.
func (c *Client) followCoordinator(ctx context.Context, err error, hop int) bool {
	var he *Error
	if !errors.As(err, &he) || he.Code != heraldpb.ErrorCode_NOT_COORDINATOR {
		return false
	}
	c.coordinator.Store(he.Leader)
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

// callGroups sends a group request to the coordinator.
func (c *Client) callGroups(ctx context.Context, req *heraldpb.Frame) (*heraldpb.Frame, error) {
	for hop := 0; ; hop++ {
		cn, err := c.groupConn(ctx)
		if err != nil {
			return nil, err
		}
		f, err := c.call(ctx, cn, req, 0)
		if c.followCoordinator(ctx, err, hop) {
			continue
		}
		return f, err
	}
}
