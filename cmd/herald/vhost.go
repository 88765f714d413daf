package main

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"

	heraldpb "github.com/heraldmq/herald/proto"
)

func init() {
	register("vhost", "vhosts (tenants) and their quotas: add, list, set, delete", cliRunner(vhostCmd))
}

const vhostUsage = "usage: herald vhost add NAME [quota flags] | list | set NAME [quota flags] | delete NAME"

// quotaFlags are the flags of a Quotas (vhost add|set, user quota).
type quotaFlags struct {
	produce, consume, stored uint64
	conns, topics, parts     uint
}

func addQuotaFlags(fs *flag.FlagSet, counts bool) *quotaFlags {
	q := &quotaFlags{}
	fs.Uint64Var(&q.produce, "produce-rate", 0, "produce bytes per second at most (THROTTLED past it; 0 = none)")
	fs.Uint64Var(&q.consume, "consume-rate", 0, "fetched bytes per second at most (THROTTLED past it; 0 = none)")
	fs.UintVar(&q.conns, "max-connections", 0, "connections at once per node (QUOTA_EXCEEDED past it; 0 = none)")
	if counts {
		fs.UintVar(&q.topics, "max-topics", 0, "topics at most (a user's: those it created; 0 = none)")
		fs.UintVar(&q.parts, "max-partitions", 0, "partitions in all at most (0 = none)")
		fs.Uint64Var(&q.stored, "max-stored-bytes", 0, "stored bytes in all at most, as each node counts its replicas (0 = none)")
	}
	return q
}

func (q *quotaFlags) wire() *heraldpb.Quotas {
	return &heraldpb.Quotas{ProduceBytesPerSec: q.produce, ConsumeBytesPerSec: q.consume, MaxConnections: uint32(q.conns),
		MaxTopics: uint32(q.topics), MaxPartitions: uint32(q.parts), MaxStoredBytes: q.stored}
}

// quotaText is a Quotas in one cell.
func quotaText(q *heraldpb.Quotas) string {
	if q == nil {
		return "-"
	}
	s := ""
	add := func(name string, v uint64) {
		if v > 0 {
			if s != "" {
				s += ","
			}
			s += fmt.Sprintf("%s=%d", name, v)
		}
	}
	add("produce-rate", q.ProduceBytesPerSec)
	add("consume-rate", q.ConsumeBytesPerSec)
	add("max-connections", uint64(q.MaxConnections))
	add("max-topics", uint64(q.MaxTopics))
	add("max-partitions", uint64(q.MaxPartitions))
	add("max-stored-bytes", q.MaxStoredBytes)
	if s == "" {
		return "-"
	}
	return s
}

// vhostCmd runs "herald vhost add|list|set|delete".
func vhostCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("vhost", io.err)
	q := addQuotaFlags(fs, true)
	fs.Usage = func() {
		fmt.Fprintln(io.err, vhostUsage)
		fs.PrintDefaults()
	}
	pos, err := parseCLIArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing subcommand; %s", vhostUsage)
	}
	sub, rest := pos[0], pos[1:]
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	quotaSet := false
	for _, f := range []string{"produce-rate", "consume-rate", "max-connections", "max-topics", "max-partitions", "max-stored-bytes"} {
		quotaSet = quotaSet || set[f]
	}
	switch sub {
	case "list":
		if len(rest) > 0 || quotaSet {
			return usagef("vhost list takes no arguments")
		}
	case "add", "set", "delete":
		if len(rest) != 1 {
			return usagef("vhost %s needs exactly one NAME", sub)
		}
		if sub == "delete" && quotaSet {
			return usagef("vhost delete takes no quota flags")
		}
	default:
		return usagef("unknown subcommand %q; %s", sub, vhostUsage)
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()
	switch sub {
	case "list":
		vhosts, err := c.ListVhosts(ctx)
		if err != nil {
			return cliOneLine(err)
		}
		tw := tabwriter.NewWriter(io.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "VHOST\tTOPICS\tPARTITIONS\tSTORED\tCONNECTIONS\tQUOTAS")
		for _, v := range vhosts {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%s\n", v.Name, v.Topics, v.Partitions, cliBytes(float64(v.StoredBytes)), v.Connections, quotaText(v.Quotas))
		}
		return tw.Flush()
	case "add":
		if err := c.AlterVhost(ctx, &heraldpb.AlterVhostRequest{Name: rest[0], Quotas: q.wire(), Create: true}); err != nil {
			return cliOneLine(err)
		}
		fmt.Fprintf(io.out, "created vhost %s\n", rest[0])
	case "set":
		if err := c.AlterVhost(ctx, &heraldpb.AlterVhostRequest{Name: rest[0], Quotas: q.wire()}); err != nil {
			return cliOneLine(err)
		}
		fmt.Fprintf(io.out, "vhost %s quotas: %s\n", rest[0], quotaText(q.wire()))
	case "delete":
		if err := c.AlterVhost(ctx, &heraldpb.AlterVhostRequest{Name: rest[0], Delete: true}); err != nil {
			return cliOneLine(err)
		}
		fmt.Fprintf(io.out, "deleted vhost %s\n", rest[0])
	}
	return nil
}
