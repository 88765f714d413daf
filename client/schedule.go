package client

import (
	"context"

	heraldpb "github.com/heraldmq/herald/proto"
)

// CancelScheduled cancels a delayed message (Message.Delay or DeliverAt)
// before the broker appends it to its topic; id is Result.ScheduleID. A
// message that is not pending (unknown id, already appended or cancelled)
// fails with a SCHEDULE_NOT_FOUND *Error.
func (c *Client) CancelScheduled(ctx context.Context, id string) error {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_CancelScheduled{CancelScheduled: &heraldpb.CancelScheduledRequest{Id: id}}})
	if err != nil {
		return err
	}
	if f.GetCancelScheduledResponse() == nil {
		return unexpected(f, "CancelScheduledResponse")
	}
	return nil
}

// ListScheduled returns up to limit (0 = 100, at most 10000) pending
// delayed messages, earliest first, of topic (empty = all topics), and how
// many are pending in all. The broker reads its schedule log to answer:
// it is an admin call, not for a hot path.
func (c *Client) ListScheduled(ctx context.Context, topic string, limit int) ([]*heraldpb.ScheduledInfo, uint64, error) {
	r, err := c.DescribeScheduler(ctx, topic, limit)
	if err != nil {
		return nil, 0, err
	}
	return r.GetScheduled(), r.GetPending(), nil
}

// DescribeScheduler is ListScheduled's whole answer: the pending delayed
// batches (up to limit, soonest first), their count, and the scheduler's
// fire lateness since its node started.
func (c *Client) DescribeScheduler(ctx context.Context, topic string, limit int) (*heraldpb.ListScheduledResponse, error) {
	f, err := c.callAny(ctx, &heraldpb.Frame{Body: &heraldpb.Frame_ListScheduled{ListScheduled: &heraldpb.ListScheduledRequest{Topic: topic, Limit: uint32(max(limit, 0))}}})
	if err != nil {
		return nil, err
	}
	r := f.GetListScheduledResponse()
	if r == nil {
		return nil, unexpected(f, "ListScheduledResponse")
	}
	return r, nil
}
