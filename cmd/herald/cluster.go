package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/heraldmq/herald/adminapi"
	heraldpb "github.com/heraldmq/herald/proto"
)

func init() {
	register("cluster", "move replicas: add a node, remove a node, rebalance, move one replica", cliRunner(clusterCmd))
}

const clusterUsage = "usage: herald cluster status [--admin HOST:PORT] | add-node NODE-ID | remove-node NODE-ID | rebalance | move-replica TOPIC PARTITION FROM-NODE TO-NODE [--dry-run] [--wait] [--wait-timeout D]"

// clusterCmd runs "herald cluster SUBCOMMAND ...": replica moves.
func clusterCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("cluster", io.err)
	dryRun := fs.Bool("dry-run", false, "print the moves without making them")
	wait := fs.Bool("wait", false, "wait until every partition move is done")
	waitTimeout := fs.Duration("wait-timeout", 30*time.Minute, "give up waiting after this long (with --wait)")
	adminAddr := os.Getenv("HERALD_ADMIN")
	if adminAddr == "" {
		adminAddr = "127.0.0.1:7480"
	}
	fs.StringVar(&adminAddr, "admin", adminAddr, "the admin port whose API 'status' reads, `HOST:PORT` or a URL (env HERALD_ADMIN)")
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
	if pos[0] == "status" {
		if len(pos) != 1 {
			return usagef("cluster status takes no arguments")
		}
		return clusterStatus(ctx, cf, adminAddr, io)
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
	case "move-replica":
		if len(rest) != 4 {
			return usagef("cluster move-replica needs TOPIC PARTITION FROM-NODE TO-NODE")
		}
		part, err := strconv.ParseUint(rest[1], 10, 32)
		if err != nil {
			return usagef("PARTITION %q must be a non-negative integer", rest[1])
		}
		var ids [2]uint64
		for i, a := range rest[2:] {
			if ids[i], err = strconv.ParseUint(a, 10, 32); err != nil || ids[i] == 0 {
				return usagef("NODE-ID %q must be a positive integer", a)
			}
		}
		req.Op, req.Topic, req.Partition, req.NodeId, req.ToNode = heraldpb.ClusterAdminRequest_MOVE_REPLICA, rest[0], uint32(part), ids[0], ids[1]
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

// clusterStatus prints the members as the admin API's /api/v1/cluster
// shows them (the same view as the dashboard's cards).
func clusterStatus(ctx context.Context, cf *cliFlags, admin string, io cliIO) error {
	base := admin
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/api/v1/cluster", nil)
	if err != nil {
		return usagef("--admin %q: %v", admin, err)
	}
	if cf.user != "" {
		pw, err := cf.password()
		if err != nil {
			return err
		}
		req.SetBasicAuth(cf.user, pw)
	}
	resp, err := (&http.Client{Timeout: cf.timeout}).Do(req)
	if err != nil {
		return cliOneLine(fmt.Errorf("the admin API at %s: %w (is the broker's --admin there?)", admin, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e adminapi.ErrorBody
		if json.NewDecoder(resp.Body).Decode(&e) == nil && e.Error.Code != "" {
			return cliOneLine(fmt.Errorf("%s: %s", e.Error.Code, e.Error.Message))
		}
		return cliOneLine(fmt.Errorf("the admin API at %s answered %s", admin, resp.Status))
	}
	var cl adminapi.Cluster
	if err := json.NewDecoder(resp.Body).Decode(&cl); err != nil {
		return cliOneLine(fmt.Errorf("the admin API at %s: %w", admin, err))
	}
	fmt.Fprintf(io.out, "%s, as node %d sees it; controller leader: %s\n", cl.Mode, cl.ViewOf, map[bool]string{true: fmt.Sprintf("node %d", cl.ControllerLeader), false: "none known"}[cl.ControllerLeader != 0])
	if cl.Stale != "" {
		fmt.Fprintf(io.out, "warning: %s\n", cl.Stale)
	}
	tw := tabwriter.NewWriter(io.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDRESS\tSTATE\tFOR\tLEADS\tFOLLOWS\tCONTROLLER\tVERSION")
	for _, m := range cl.Members {
		roles := strings.ReplaceAll(strings.Join(m.Roles, ","), "controller-", "")
		if roles == "" {
			roles = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%v\t%d\t%d\t%s\t%s\n", m.NodeID, m.Address, m.State, time.Since(m.Since).Round(time.Second), m.Leads, m.Follows, roles, m.Version)
	}
	tw.Flush()
	for _, m := range cl.Members {
		if m.Note != "" {
			fmt.Fprintf(io.out, "node %d: %s\n", m.NodeID, m.Note)
		}
	}
	return nil
}
