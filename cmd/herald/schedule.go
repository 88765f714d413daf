package main

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"
)

func init() { register("schedule", "list or cancel delayed messages", cliRunner(scheduleCmd)) }

const scheduleUsage = "usage: herald schedule list [--topic T] [--limit N] | cancel ID..."

// scheduleCmd runs "herald schedule list|cancel": the delayed messages the
// broker holds (produced with --delay or --at).
func scheduleCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("schedule", io.err)
	topic := fs.String("topic", "", "list: only this topic's delayed messages")
	limit := fs.Int("limit", 100, "list: at most this many, earliest first (max 10000)")
	fs.Usage = func() {
		fmt.Fprintln(io.err, scheduleUsage)
		fs.PrintDefaults()
	}
	pos, err := parseCLIArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing subcommand; %s", scheduleUsage)
	}
	sub, rest := pos[0], pos[1:]
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch sub {
	case "list":
		if len(rest) > 0 {
			return usagef("schedule list takes no arguments")
		}
		if *limit < 1 || *limit > 10000 {
			return usagef("--limit must be 1..10000")
		}
	case "cancel":
		if len(rest) == 0 {
			return usagef("schedule cancel needs one or more IDs")
		}
		for _, f := range []string{"topic", "limit"} {
			if set[f] {
				return usagef("--%s is only for schedule list", f)
			}
		}
	default:
		return usagef("unknown subcommand %q; %s", sub, scheduleUsage)
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()
	if sub == "list" {
		items, pending, err := c.ListScheduled(ctx, *topic, *limit)
		if err != nil {
			return cliOneLine(err)
		}
		tw := tabwriter.NewWriter(io.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tTOPIC\tPARTITION\tDELIVER AT\tIN\tRECORDS\tBYTES")
		now := time.Now()
		for _, s := range items {
			at := time.UnixMilli(s.DeliverAtMs)
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%d\n", s.Id, s.Topic, s.Partition, at.UTC().Format(time.RFC3339Nano),
				max(at.Sub(now), 0).Round(time.Millisecond), s.Count, s.Bytes)
		}
		tw.Flush()
		fmt.Fprintf(io.err, "%d shown, %d pending in all\n", len(items), pending)
		return nil
	}
	failed := 0
	for _, id := range rest {
		if err := c.CancelScheduled(ctx, id); err != nil {
			fmt.Fprintf(io.err, "%s: %v\n", id, err)
			failed++
			continue
		}
		fmt.Fprintf(io.out, "cancelled %s\n", id)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d not cancelled", failed, len(rest))
	}
	return nil
}
