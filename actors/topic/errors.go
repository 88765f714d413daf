package topic

// The topic room's wire errors.

import heraldpb "github.com/heraldmq/herald/proto"

// topicNotFound answers a request for a topic the node does not have.
func topicNotFound(name string) *heraldpb.Error {
	return heraldpb.NewError(heraldpb.ErrorCode_TOPIC_NOT_FOUND, "topic %q does not exist", name)
}

// partitionNotFound answers a request for a partition the topic does not have.
func partitionNotFound(topic string, part uint32, n int) *heraldpb.Error {
	return heraldpb.NewError(heraldpb.ErrorCode_PARTITION_NOT_FOUND, "topic %q has %d partitions; there is no partition %d", topic, n, part)
}

// clusterStarting answers requests while the node joins its cluster.
func clusterStarting() *heraldpb.Error {
	e := heraldpb.NewError(heraldpb.ErrorCode_THROTTLED, "the node is joining its cluster; try again shortly")
	e.RetryAfterMs = 500
	return e
}
