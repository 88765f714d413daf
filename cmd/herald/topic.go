package main

import (
	"context"
	"fmt"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

func init() { register("topic", "create, list, describe or delete topics", cliRunner(topicCmd)) }

const topicUsage = "usage: herald topic create NAME --partitions N [--replication R] [--retention D] [--retention-bytes B] [--max-message-bytes B] [--message-ttl D] | list | describe NAME | delete NAME"

// topicCmd runs "herald topic SUBCOMMAND ...".
func topicCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("topic", io.err)
	partitions := fs.Uint("partitions", 1, "number of partitions (create)")
	replication := fs.Uint("replication", 0, "replication factor (create; 0 = broker default)")
	retention := fs.Duration("retention", 0, "delete records older than this (create; 0 = keep forever)")
	retentionBytes := fs.Int64("retention-bytes", 0, "keep at most this many bytes per partition (create; 0 = unlimited)")
	maxMessage := fs.Uint("max-message-bytes", 0, "largest record batch accepted (create; 0 = broker default)")
	messageTTL := fs.Duration("message-ttl", 0, "consumer groups never deliver a message this long after its append (create; 0 = no TTL; a record's own TTL wins)")
	fs.Usage = func() {
		fmt.Fprintln(io.err, topicUsage)
		fs.PrintDefaults()
	}
	pos, err := parseCLIArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing subcommand; %s", topicUsage)
	}
	sub, rest := pos[0], pos[1:]
	wantArgs := map[string]int{"create": 1, "list": 0, "describe": 1, "delete": 1}
	n, ok := wantArgs[sub]
	if !ok {
		return usagef("unknown subcommand %q; %s", sub, topicUsage)
	}
	if len(rest) != n {
		if n == 0 {
			return usagef("topic %s takes no arguments", sub)
		}
		return usagef("topic %s needs exactly one topic NAME", sub)
	}
	if sub == "create" {
		if *partitions < 1 || *partitions > 1<<20 {
			return usagef("--partitions must be between 1 and %d", 1<<20)
		}
		if *retention < 0 || *retentionBytes < 0 {
			return usagef("--retention and --retention-bytes must not be negative")
		}
		if *messageTTL < 0 || (*messageTTL > 0 && *messageTTL < time.Millisecond) {
			return usagef("--message-ttl must be 0 or at least 1ms")
		}
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()
	switch sub {
	case "create":
		cfg := &heraldpb.TopicConfig{
			Partitions:        uint32(*partitions),
			ReplicationFactor: uint32(*replication),
			RetentionMs:       retention.Milliseconds(),
			RetentionBytes:    *retentionBytes,
			MaxMessageBytes:   uint32(*maxMessage),
			MessageTtlMs:      messageTTL.Milliseconds(),
		}
		ti, err := c.CreateTopic(ctx, rest[0], cfg)
		if err != nil {
			return cliOneLine(err)
		}
		fmt.Fprintf(io.out, "created topic %s with %s\n", ti.GetName(), plural(len(ti.GetPartitions()), "partition"))
	case "list":
		topics, err := c.ListTopics(ctx)
		if err != nil {
			return cliOneLine(err)
		}
		printTopicList(io, topics)
	case "describe":
		ti, err := c.DescribeTopic(ctx, rest[0])
		if err != nil {
			return cliTopicErr(err, rest[0], 0)
		}
		printTopic(io, ti)
	case "delete":
		if err := c.DeleteTopic(ctx, rest[0]); err != nil {
			return cliOneLine(err)
		}
		fmt.Fprintf(io.out, "deleted topic %s\n", rest[0])
	}
	return nil
}

func fmtRetention(ms int64) string {
	if ms <= 0 {
		return "forever"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

func fmtLimit(n int64) string {
	if n <= 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func printTopicList(io cliIO, topics []*heraldpb.TopicInfo) {
	sort.Slice(topics, func(i, j int) bool { return topics[i].GetName() < topics[j].GetName() })
	tw := tabwriter.NewWriter(io.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tPARTITIONS\tREPLICATION\tRETENTION\tRETENTION-BYTES\tMESSAGES")
	for _, t := range topics {
		var msgs int64
		for _, p := range t.GetPartitions() {
			msgs += p.GetHighWatermark() - p.GetLogStartOffset()
		}
		parts := len(t.GetPartitions())
		if parts == 0 {
			parts = int(t.GetConfig().GetPartitions())
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%d\n", t.GetName(), parts, t.GetConfig().GetReplicationFactor(),
			fmtRetention(t.GetConfig().GetRetentionMs()), fmtLimit(t.GetConfig().GetRetentionBytes()), msgs)
	}
	tw.Flush()
}

func printTopic(io cliIO, t *heraldpb.TopicInfo) {
	cfg := t.GetConfig()
	fmt.Fprintf(io.out, "topic:             %s\n", t.GetName())
	fmt.Fprintf(io.out, "partitions:        %d\n", len(t.GetPartitions()))
	fmt.Fprintf(io.out, "replication:       %d\n", cfg.GetReplicationFactor())
	fmt.Fprintf(io.out, "retention:         %s\n", fmtRetention(cfg.GetRetentionMs()))
	fmt.Fprintf(io.out, "retention-bytes:   %s\n", fmtLimit(cfg.GetRetentionBytes()))
	fmt.Fprintf(io.out, "max-message-bytes: %s\n", fmtLimit(int64(cfg.GetMaxMessageBytes())))
	if ttl := cfg.GetMessageTtlMs(); ttl > 0 {
		fmt.Fprintf(io.out, "message-ttl:       %s\n", time.Duration(ttl)*time.Millisecond)
	}
	fmt.Fprintln(io.out)
	moving := false
	for _, p := range t.GetPartitions() {
		moving = moving || len(p.GetTargetReplicas()) > 0
	}
	tw := tabwriter.NewWriter(io.out, 0, 0, 2, ' ', 0)
	head := "PARTITION\tLEADER\tREPLICAS\tLOG-START\tHIGH-WATERMARK\tSIZE"
	if moving {
		head += "\tMOVING-TO"
	}
	fmt.Fprintln(tw, head)
	for _, p := range t.GetPartitions() {
		line := fmt.Sprintf("%d\t%d\t%s\t%d\t%d\t%s", p.GetId(), p.GetLeader(), joinIDs(p.GetReplicas()),
			p.GetLogStartOffset(), p.GetHighWatermark(), cliBytes(float64(p.GetSizeBytes())))
		if moving {
			line += "\t" + joinIDs(p.GetTargetReplicas())
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
}

// topicExists reports whether a topic exists, distinguishing "no" from a
// failure to find out.
func topicExists(ctx context.Context, c *client.Client, name string) (bool, error) {
	_, err := c.DescribeTopic(ctx, name)
	if client.IsCode(err, heraldpb.ErrorCode_TOPIC_NOT_FOUND) {
		return false, nil
	}
	return err == nil, err
}
