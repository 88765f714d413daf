package consumer

import (
	"testing"

	heraldpb "github.com/heraldmq/herald/proto"
)

// A client's request that carries the id of the coordinator's dead-letter
// request in flight is the client's, not the answer: taking it for the
// answer hung the client's DescribeGroup (the one-off 30 s timeout of the
// quickstart's payments example) and counted the dead letters appended
// before their append was acknowledged.
func TestClientRequestIsNotTheDeadLetterAnswer(t *testing.T) {
	c := &coordinator{live: &live{}}
	c.live.dlq.reqID = 7
	for _, tc := range []struct {
		f    *heraldpb.Frame
		want bool
	}{
		{&heraldpb.Frame{Id: 7, Body: &heraldpb.Frame_DescribeGroup{DescribeGroup: &heraldpb.DescribeGroupRequest{Group: "g"}}}, false},
		{&heraldpb.Frame{Id: 7, Body: &heraldpb.Frame_Ack{Ack: &heraldpb.AckRequest{}}}, false},
		{&heraldpb.Frame{Id: 7, Body: &heraldpb.Frame_Commit{Commit: &heraldpb.CommitRequest{}}}, false},
		{&heraldpb.Frame{Id: 7, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{}}}, true},
		{&heraldpb.Frame{Id: 7, Body: &heraldpb.Frame_CreateTopicResponse{CreateTopicResponse: &heraldpb.CreateTopicResponse{}}}, true},
		{heraldpb.ErrorFrame(7, heraldpb.NewError(heraldpb.ErrorCode_TIMEOUT, "t")), true},
		{&heraldpb.Frame{Id: 8, Body: &heraldpb.Frame_ProduceResponse{ProduceResponse: &heraldpb.ProduceResponse{}}}, false},
	} {
		if got := c.isDLQ(tc.f); got != tc.want {
			t.Errorf("isDLQ(%T id %d) = %v, want %v", tc.f.Body, tc.f.Id, got, tc.want)
		}
	}
}
