package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

func init() {
	register("partition", "repair a damaged partition (show the loss, accept it)", cliRunner(partitionCmd))
}

const partitionUsage = "usage: herald partition repair TOPIC/N [--accept-loss] [--addr HOST:PORT]"

// partitionCmd runs "herald partition repair TOPIC/N [--accept-loss]": it
// shows the damage the addressed node's replica of the partition found in
// its log and, with --accept-loss, accepts the loss so that the partition
// takes writes again (never reusing a lost offset).
func partitionCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("partition", io.err)
	accept := fs.Bool("accept-loss", false, "accept the loss the damage record names and make the partition writable again")
	fs.Usage = func() {
		fmt.Fprintln(io.err, partitionUsage)
		fs.PrintDefaults()
	}
	pos, err := parseCLIArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing subcommand; %s", partitionUsage)
	}
	if pos[0] != "repair" {
		return usagef("unknown subcommand %q; %s", pos[0], partitionUsage)
	}
	if len(pos) != 2 {
		return usagef("partition repair needs exactly one TOPIC/N; %s", partitionUsage)
	}
	topic, num, ok := strings.Cut(pos[1], "/")
	n, perr := strconv.ParseUint(num, 10, 32)
	if !ok || topic == "" || perr != nil {
		return usagef("%q is not TOPIC/N (for example orders/0)", pos[1])
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()
	reps, err := c.RepairPartition(ctx, topic, uint32(n), *accept)
	if err != nil {
		return cliOneLine(err)
	}
	name := fmt.Sprintf("%s/%d", topic, n)
	readOnly := false
	whole := 0
	for _, r := range reps {
		if !r.GetDamaged() {
			whole++
			fmt.Fprintf(io.out, "partition %s on node %d: the log is whole; next offset %d\n", name, r.GetNode(), r.GetNextOffset())
			continue
		}
		bound := ""
		if !r.GetLostToExact() {
			bound = "at most "
		}
		fmt.Fprintf(io.out, "partition %s on node %d: offsets %d to %s%d were lost (%s)\n", name, r.GetNode(), r.GetLostFrom(), bound, r.GetLostTo()-1, r.GetReason())
		for _, q := range r.GetQuarantine() {
			fmt.Fprintf(io.out, "damaged files kept in %s (in the partition's directory)\n", q)
		}
		if r.GetAccepted() {
			fmt.Fprintf(io.out, "the loss is accepted: the partition is writable; the next record gets offset %d\n", r.GetNextOffset())
		} else {
			readOnly = true
		}
	}
	switch {
	case readOnly && whole > 0:
		fmt.Fprintf(io.out, "%d replica(s) hold a whole log: the damaged ones rebuild from the leader and need no repair\n", whole)
	case readOnly:
		fmt.Fprintf(io.out, "the partition is read-only; run again with --accept-loss to make it writable (lost offsets are never reused)\n")
		return fmt.Errorf("partition %s is damaged", name)
	}
	return nil
}
