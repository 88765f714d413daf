package main

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

func init() { register("group", "list, describe or reset consumer groups", cliRunner(groupCmd)) }

const groupUsage = "usage: herald group list | describe GROUP | reset GROUP --to earliest|latest|OFFSET|RFC3339 [--force] [--partitions 0,1,...]"

// groupCmd runs "herald group SUBCOMMAND ...".
func groupCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("group", io.err)
	to := fs.String("to", "", "reset: move the group to earliest, latest, an OFFSET or an RFC3339 time")
	force := fs.Bool("force", false, "reset: even with live members (their subscriptions end)")
	partitions := fs.String("partitions", "", "reset: only these partitions (comma-separated; default all)")
	fs.Usage = func() {
		fmt.Fprintln(io.err, groupUsage)
		fs.PrintDefaults()
	}
	pos, err := parseCLIArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing subcommand; %s", groupUsage)
	}
	sub, rest := pos[0], pos[1:]
	wantArgs := map[string]int{"list": 0, "describe": 1, "reset": 1}
	n, ok := wantArgs[sub]
	if !ok {
		return usagef("unknown subcommand %q; %s", sub, groupUsage)
	}
	if len(rest) != n {
		if n == 0 {
			return usagef("group %s takes no arguments", sub)
		}
		return usagef("group %s needs exactly one GROUP", sub)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var (
		start client.StartPosition
		parts []int32
	)
	if sub == "reset" {
		if *to == "" {
			return usagef("group reset needs --to earliest|latest|OFFSET|RFC3339")
		}
		if start, err = parseStart("--to", *to); err != nil {
			return err
		}
		if parts, err = parsePartitions(*partitions); err != nil {
			return err
		}
	} else {
		for _, f := range []string{"to", "force", "partitions"} {
			if set[f] {
				return usagef("--%s is only for group reset", f)
			}
		}
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()
	switch sub {
	case "list":
		gs, err := c.ListGroups(ctx)
		if err != nil {
			return cliOneLine(err)
		}
		printGroupList(io, gs)
	case "describe":
		gi, err := c.DescribeGroup(ctx, rest[0])
		if err != nil {
			return cliTopicErr(err, "", 0)
		}
		printGroup(io, gi)
	case "reset":
		topic := "" // the group's, when known: for the TOPIC_NOT_FOUND hint
		if !*force {
			// The broker refuses too (GROUP_HAS_MEMBERS); checking first
			// gives a clearer message.
			gi, err := c.DescribeGroup(ctx, rest[0])
			if err != nil {
				return cliOneLine(err)
			}
			topic = gi.GetTopic()
			if ms := gi.GetMembers(); len(ms) > 0 {
				return fmt.Errorf("group %s has %s (%s): stop them, or pass --force to end their subscriptions",
					rest[0], plural(len(ms), "live member"), memberNames(ms))
			}
		}
		gi, err := c.ResetGroup(ctx, rest[0], start, *force, parts...)
		if err != nil {
			return cliTopicErr(err, topic, 0)
		}
		fmt.Fprintf(io.out, "reset group %s to %s\n\n", rest[0], start)
		printGroupPartitions(io, gi)
	}
	return nil
}

// parsePartitions parses --partitions: "" (all) or "0,2,5".
func parsePartitions(s string) ([]int32, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []int32
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 32)
		if err != nil || n < 0 {
			return nil, usagef("--partitions must list partition numbers like 0,2,5, not %q", s)
		}
		out = append(out, int32(n))
	}
	return out, nil
}

func memberNames(ms []*heraldpb.MemberInfo) string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.GetMemberId()
		if m.GetName() != "" {
			names[i] = m.GetName()
		}
	}
	return strings.Join(names, ", ")
}

// modeName is the CLI's name of a wire mode (as --mode takes it).
func modeName(m heraldpb.SubscriptionMode) string {
	switch m {
	case heraldpb.SubscriptionMode_MODE_CLUSTERING:
		return client.Clustering.String()
	case heraldpb.SubscriptionMode_MODE_BROADCAST:
		return client.Broadcast.String()
	case heraldpb.SubscriptionMode_MODE_SHARED:
		return client.Shared.String()
	case heraldpb.SubscriptionMode_MODE_KEY_SHARED:
		return client.KeyShared.String()
	}
	return m.String()
}

func breakerName(b heraldpb.BreakerState) string {
	switch b {
	case heraldpb.BreakerState_BREAKER_CLOSED:
		return "closed"
	case heraldpb.BreakerState_BREAKER_HALF_OPEN:
		return "half-open"
	case heraldpb.BreakerState_BREAKER_OPEN:
		return "open"
	}
	return b.String()
}

func filterText(t heraldpb.FilterType, f string) string {
	switch t {
	case heraldpb.FilterType_FILTER_TAG:
		return fmt.Sprintf("tags %q", f)
	case heraldpb.FilterType_FILTER_SQL:
		return fmt.Sprintf("sql %q", f)
	}
	return "-"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func partitionList(ps []uint32) string {
	if len(ps) == 0 {
		return "-"
	}
	ps = append([]uint32(nil), ps...)
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.FormatUint(uint64(p), 10)
	}
	return strings.Join(s, ",")
}

func printGroupList(io cliIO, gs []*heraldpb.GroupSummary) {
	sort.Slice(gs, func(i, j int) bool { return gs[i].GetGroup() < gs[j].GetGroup() })
	tw := tabwriter.NewWriter(io.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tTOPIC\tMODE\tMEMBERS\tLAG")
	for _, g := range gs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", g.GetGroup(), g.GetTopic(), modeName(g.GetMode()), g.GetMembers(), g.GetLag())
	}
	tw.Flush()
}

func printGroup(io cliIO, g *heraldpb.GroupInfo) {
	fmt.Fprintf(io.out, "group:        %s\n", g.GetGroup())
	fmt.Fprintf(io.out, "topic:        %s\n", g.GetTopic())
	fmt.Fprintf(io.out, "mode:         %s\n", modeName(g.GetMode()))
	fmt.Fprintf(io.out, "filter:       %s\n", filterText(g.GetFilterType(), g.GetFilter()))
	fmt.Fprintf(io.out, "members:      %d\n", len(g.GetMembers()))
	fmt.Fprintf(io.out, "in-flight:    %d\n", g.GetInFlight())
	fmt.Fprintf(io.out, "redelivered:  %d\n", g.GetRedelivered())
	fmt.Fprintf(io.out, "retry:        %s\n", dash(g.GetRetryPolicy()))
	fmt.Fprintf(io.out, "dlq-topic:    %s\n", dash(g.GetDeadLetterTopic()))
	fmt.Fprintf(io.out, "retrying:     %d\n", g.GetRetrying())
	fmt.Fprintf(io.out, "dead-letters: %d\n", g.GetDeadLettered())
	fmt.Fprintf(io.out, "expired:      %d\n\n", g.GetExpired())
	tw := tabwriter.NewWriter(io.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tNAME\tADDRESS\tPARTITIONS\tIN-FLIGHT\tCREDITS\tDELIVERED\tREDELIVERED\tBREAKER\tRESPONDER")
	ms := append([]*heraldpb.MemberInfo(nil), g.GetMembers()...)
	sort.Slice(ms, func(i, j int) bool { return ms[i].GetMemberId() < ms[j].GetMemberId() })
	for _, m := range ms {
		resp := "no"
		if m.GetResponder() {
			resp = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", m.GetMemberId(), dash(m.GetName()), dash(m.GetAddress()),
			partitionList(m.GetPartitions()), m.GetInFlight(), m.GetCredits(), m.GetDelivered(), m.GetRedelivered(),
			breakerName(m.GetBreaker()), resp)
	}
	tw.Flush()
	fmt.Fprintln(io.out)
	printGroupPartitions(io, g)
}

func printGroupPartitions(io cliIO, g *heraldpb.GroupInfo) {
	tw := tabwriter.NewWriter(io.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tSUBSCRIBER\tOWNER\tFLOOR\tACKED-ABOVE\tHIGH-WATERMARK\tLAG")
	ps := append([]*heraldpb.PartitionLag(nil), g.GetPartitions()...)
	sort.SliceStable(ps, func(i, j int) bool {
		if ps[i].GetPartition() != ps[j].GetPartition() {
			return ps[i].GetPartition() < ps[j].GetPartition()
		}
		return ps[i].GetSubscriber() < ps[j].GetSubscriber()
	})
	var lag int64
	for _, p := range ps {
		lag += p.GetLag()
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%d\t%d\n", p.GetPartition(), dash(p.GetSubscriber()), dash(p.GetOwner()),
			p.GetAckFloor(), p.GetAckedAbove(), p.GetHighWatermark(), p.GetLag())
	}
	tw.Flush()
	fmt.Fprintf(io.out, "total lag: %d\n", lag)
}
