package client

import (
	"context"
	"errors"
	"fmt"

	heraldpb "github.com/heraldmq/herald/proto"
)

// ListGroups lists every consumer group: its topic, mode, live members and
// total lag.
func (c *Client) ListGroups(ctx context.Context) ([]*heraldpb.GroupSummary, error) {
	f, err := c.callGroups(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_ListGroups{ListGroups: &heraldpb.ListGroupsRequest{}}})
	if err != nil {
		return nil, err
	}
	r := f.GetListGroupsResponse()
	if r == nil {
		return nil, unexpected(f, "ListGroupsResponse")
	}
	return r.GetGroups(), nil
}

// DescribeGroup returns a group's settings, members (assignment, in-flight,
// credits, breaker state) and per-partition progress. A group the broker
// does not know fails with a GROUP_NOT_FOUND *Error.
func (c *Client) DescribeGroup(ctx context.Context, group string) (*heraldpb.GroupInfo, error) {
	f, err := c.callGroups(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_DescribeGroup{DescribeGroup: &heraldpb.DescribeGroupRequest{Group: group}}})
	if err != nil {
		return nil, err
	}
	r := f.GetDescribeGroupResponse()
	if r == nil {
		return nil, unexpected(f, "DescribeGroupResponse")
	}
	return r.GetGroup(), nil
}

// ResetGroup moves the group's position in every partition (or only those
// listed) to `to`, and returns the group as it is afterwards. While members
// are connected the broker refuses with GROUP_HAS_MEMBERS unless force is
// set, which first ends their subscriptions.
func (c *Client) ResetGroup(ctx context.Context, group string, to StartPosition, force bool, partitions ...int32) (*heraldpb.GroupInfo, error) {
	if to.IsZero() {
		return nil, errors.New("herald: ResetGroup needs a position (Earliest, Latest, AtOffset or AtTime)")
	}
	req := &heraldpb.ResetGroupRequest{Group: group, To: to.wire(), Force: force}
	for _, p := range partitions {
		if p < 0 {
			return nil, fmt.Errorf("herald: ResetGroup: bad partition %d", p)
		}
		req.Partitions = append(req.Partitions, uint32(p))
	}
	f, err := c.callGroups(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_ResetGroup{ResetGroup: req}})
	if err != nil {
		return nil, err
	}
	r := f.GetResetGroupResponse()
	if r == nil {
		return nil, unexpected(f, "ResetGroupResponse")
	}
	return r.GetGroup(), nil
}
