package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

func init() {
	register("cluster", "move replicas: add a node, remove a node, rebalance", cliRunner(clusterCmd))
}

const clusterUsage = "usage: herald cluster add-node NODE-ID | remove-node NODE-ID | rebalance [--dry-run] [--wait] [--wait-timeout D]"

// clusterCmd runs "herald cluster SUBCOMMAND ...": replica moves.
func clusterCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("cluster", io.err)
	dryRun := fs.Bool("dry-run", false, "print the moves without making them")
	wait := fs.Bool("wait", false, "wait until every partition move is done")
	waitTimeout := fs.Duration("wait-timeout", 30*time.Minute, "give up waiting after this long (with --wait)")
	fs.Usage = func() {
		fmt.Fprintln(io.err, clusterUsage)
		fs.PrintDefaults()
	}
	pos, err := parseCLIArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing subcommand; %s", clusterUsage)
	}
	req := &heraldpb.ClusterAdminRequest{DryRun: *dryRun}
	switch sub, rest := pos[0], pos[1:]; sub {
	case "add-node", "remove-node":
		if len(rest) != 1 {
			return usagef("cluster %s needs exactly one NODE-ID", sub)
		}
		id, err := strconv.ParseUint(rest[0], 10, 32)
		if err != nil || id == 0 {
			return usagef("NODE-ID %q must be a positive integer", rest[0])
		}
		req.NodeId = id
		req.Op = heraldpb.ClusterAdminRequest_ADD_NODE
		if sub == "remove-node" {
			req.Op = heraldpb.ClusterAdminRequest_REMOVE_NODE
		}
	case "rebalance":
		if len(rest) != 0 {
			return usagef("cluster rebalance takes no arguments")
		}
		req.Op = heraldpb.ClusterAdminRequest_REBALANCE
	default:
		return usagef("unknown subcommand %q; %s", sub, clusterUsage)
	}
	if *waitTimeout <= 0 {
		return usagef("--wait-timeout must be positive")
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()
	resp, err := c.ClusterAdmin(ctx, req)
	if err != nil {
		return cliOneLine(err)
	}
	verb := "moving"
	if *dryRun {
		verb = "would move"
	}
	fmt.Fprintf(io.out, "%s %s\n", verb, plural(len(resp.GetMoves()), "partition"))
	if len(resp.GetMoves()) > 0 {
		tw := tabwriter.NewWriter(io.out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TOPIC\tPARTITION\tFROM\tTO")
		for _, mv := range resp.GetMoves() {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", mv.GetTopic(), mv.GetPartition(), joinIDs(mv.GetFrom()), joinIDs(mv.GetTo()))
		}
		tw.Flush()
	}
	if !*wait || *dryRun {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, *waitTimeout)
	defer cancel()
	start := time.Now()
	if left, err := c.WaitForMoves(wctx, 500*time.Millisecond); err != nil {
		return cliOneLine(fmt.Errorf("%s still moving after %v: %w", plural(left, "partition"), time.Since(start).Round(time.Second), err))
	}
	fmt.Fprintf(io.out, "all moves done in %v\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}

func joinIDs(ids []uint32) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(uint64(id), 10)
	}
	return strings.Join(s, ",")
}
