// Package heraldpb holds Herald's protobuf schemas and generated Go: the client
// wire protocol (herald.proto), internal log and actor messages (log.proto) and
// consumer-group state (group.proto), scheduler state (schedule.proto), transaction state (txn.proto),
// plus hand-written framing and batch scanning helpers.
package heraldpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative herald.proto log.proto group.proto schedule.proto txn.proto controller.proto exchange.proto
