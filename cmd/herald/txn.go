package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

func init() {
	register("txn", "half messages: list, describe, commit, roll back; transactions: list, abort", cliRunner(txnCmd))
}

const txnUsage = "usage: herald txn list [--group G] [--limit N] | list --transactions [--limit N] | describe ID | commit ID... | rollback ID... | abort TRANSACTIONAL_ID..."

// txnCmd runs "herald txn list|describe|commit|rollback": the half
// messages the transaction coordinator holds, and ending them by hand;
// and "herald txn list --transactions|abort": the transactional ids and
// their open transactions, and aborting those by hand.
func txnCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("txn", io.err)
	group := fs.String("group", "", "list: only this producer group's half messages")
	limit := fs.Int("limit", 100, "list: at most this many, oldest first (with --transactions: open transactions first)")
	transactions := fs.Bool("transactions", false, "list: the transactional ids and their transactions instead of half messages")
	fs.Usage = func() {
		fmt.Fprintln(io.err, txnUsage)
		fs.PrintDefaults()
	}
	pos, err := parseCLIArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing subcommand; %s", txnUsage)
	}
	sub, rest := pos[0], pos[1:]
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch sub {
	case "list":
		if len(rest) > 0 {
			return usagef("txn list takes no arguments")
		}
		if *limit < 1 {
			return usagef("--limit must be at least 1")
		}
		if *transactions && set["group"] {
			return usagef("--group is for half messages, not with --transactions")
		}
	case "describe", "commit", "rollback", "abort":
		switch {
		case sub == "describe" && len(rest) != 1:
			return usagef("txn describe needs exactly one ID")
		case sub == "abort" && len(rest) == 0:
			return usagef("txn abort needs one or more transactional ids")
		case len(rest) == 0:
			return usagef("txn %s needs one or more IDs", sub)
		}
		for _, f := range []string{"group", "limit", "transactions"} {
			if set[f] {
				return usagef("--%s is only for txn list", f)
			}
		}
	default:
		return usagef("unknown subcommand %q; %s", sub, txnUsage)
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()
	switch sub {
	case "list":
		if *transactions {
			infos, total, err := c.ListTransactions(ctx, "", *limit)
			if err != nil {
				return cliOneLine(err)
			}
			printTxnsList(io, infos, time.Now())
			fmt.Fprintf(io.err, "%d shown, %s in all\n", len(infos), plural(total, "transactional id"))
			return nil
		}
		halves, total, err := c.ListTxn(ctx, *group, *limit)
		if err != nil {
			return cliOneLine(err)
		}
		printTxnList(io, halves, time.Now())
		fmt.Fprintf(io.err, "%d shown, %d pending in all\n", len(halves), total)
	case "describe":
		h, err := c.DescribeTxn(ctx, rest[0])
		if err != nil {
			return cliTxnErr(err, rest[0])
		}
		printTxn(io, h, time.Now())
	case "abort":
		return abortTxns(ctx, c, rest, io)
	default:
		return endHalves(ctx, c, sub, rest, io)
	}
	return nil
}

// abortTxns aborts the open transaction of each transactional id by hand.
func abortTxns(ctx context.Context, c *client.Client, ids []string, io cliIO) error {
	failed := 0
	for _, id := range ids {
		end, err := c.AbortTransaction(ctx, id)
		if err != nil {
			if client.IsCode(err, heraldpb.ErrorCode_TXN_NOT_FOUND) {
				err = fmt.Errorf("no open transaction of %s (an unknown id, or nothing open; 'herald txn list --transactions' shows them): %w", id, err)
			} else {
				err = fmt.Errorf("%s: %w", id, err)
			}
			fmt.Fprintln(io.err, cliOneLine(err))
			failed++
			continue
		}
		if len(end.Partitions) == 0 {
			fmt.Fprintf(io.out, "aborted %s: nothing was staged\n", id)
			continue
		}
		fmt.Fprintf(io.out, "aborted %s: %s dropped from %s\n", id, plural(end.Records, "record"), strings.Join(end.Partitions, ","))
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d not aborted", failed, len(ids))
	}
	return nil
}

// printTxnsList prints the transactional ids, one a line.
func printTxnsList(io cliIO, infos []*heraldpb.TxnInfo, now time.Time) {
	tw := tabwriter.NewWriter(io.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPRODUCER ID\tEPOCH\tSTATE\tPARTITIONS\tRECORDS\tAGE\tTIMEOUT")
	for _, ti := range infos {
		age := "-"
		if ti.GetStartedMs() != 0 {
			age = txnAge(now, ti.GetStartedMs())
		}
		state := ti.GetState()
		if ti.GetWrittenOnce() {
			state += " (written once)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%d\t%s\t%s\n", ti.GetTransactionalId(), ti.GetProducerId(), ti.GetProducerEpoch(), state,
			txnPartitions(ti.GetPartitions(), 3), ti.GetRecords(), age, time.Duration(ti.GetTimeoutMs())*time.Millisecond)
	}
	tw.Flush()
}

// txnPartitions lists "topic/partition"s, at most show of them then how
// many more; "-" for none.
func txnPartitions(parts []string, show int) string {
	if len(parts) == 0 {
		return "-"
	}
	if len(parts) <= show {
		return strings.Join(parts, ",")
	}
	return fmt.Sprintf("%s +%d", strings.Join(parts[:show], ","), len(parts)-show)
}

// endHalves commits or rolls back (sub) each of ids by hand.
func endHalves(ctx context.Context, c *client.Client, sub string, ids []string, io cliIO) error {
	action, done := client.HalfCommit, "committed"
	if sub == "rollback" {
		action, done = client.HalfRollback, "rolled back"
	}
	failed := 0
	for _, id := range ids {
		end, err := c.EndHalfManually(ctx, id, action)
		switch {
		case err != nil:
			if !client.IsCode(err, heraldpb.ErrorCode_TXN_NOT_FOUND) {
				err = fmt.Errorf("%s: %w", id, err)
			}
			fmt.Fprintln(io.err, cliTxnErr(err, id))
			failed++
		case end.AlreadyEnded:
			fmt.Fprintf(io.out, "%s %s already (%s/%d)\n", id, done, end.Topic, end.Partition)
		case action == client.HalfRollback:
			fmt.Fprintf(io.out, "rolled back %s\n", id)
		case !end.DeliverAt.IsZero():
			fmt.Fprintf(io.out, "committed %s: %s/%d, delivered at %s\n", id, end.Topic, end.Partition, end.DeliverAt.UTC().Format(time.RFC3339Nano))
		default:
			fmt.Fprintf(io.out, "committed %s: %s/%d at offset %d\n", id, end.Topic, end.Partition, end.Offset)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d not %s", failed, len(ids), done)
	}
	return nil
}

// cliTxnErr is cliOneLine(err), saying what TXN_NOT_FOUND means for the
// half id.
func cliTxnErr(err error, id string) error {
	if client.IsCode(err, heraldpb.ErrorCode_TXN_NOT_FOUND) {
		err = fmt.Errorf("no pending half message %s (unknown, or already committed or rolled back; 'herald txn list' shows the pending ones): %w", id, err)
	}
	return cliOneLine(err)
}

func printTxnList(io cliIO, halves []*heraldpb.HalfInfo, now time.Time) {
	tw := tabwriter.NewWriter(io.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tGROUP\tTOPIC/PARTITION\tSTATE\tAGE\tCHECKS\tNEXT CHECK")
	for _, h := range halves {
		fmt.Fprintf(tw, "%s\t%s\t%s/%d\t%s\t%s\t%d/%d\t%s\n", h.GetId(), h.GetProducerGroup(), h.GetTopic(), h.GetPartition(), h.GetState(),
			txnAge(now, h.GetCreatedMs()), h.GetChecks(), h.GetMaxChecks(), txnNextCheck(now, h.GetNextCheckMs()))
	}
	tw.Flush()
}

func printTxn(io cliIO, h *heraldpb.HalfInfo, now time.Time) {
	at := func(ms int64) string {
		if ms == 0 {
			return "-"
		}
		return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano)
	}
	next := at(h.GetNextCheckMs())
	if h.GetNextCheckMs() != 0 {
		next += " (" + txnNextCheck(now, h.GetNextCheckMs()) + ")"
	}
	fmt.Fprintf(io.out, "id:          %s\n", h.GetId())
	fmt.Fprintf(io.out, "group:       %s\n", h.GetProducerGroup())
	fmt.Fprintf(io.out, "topic:       %s/%d\n", h.GetTopic(), h.GetPartition())
	fmt.Fprintf(io.out, "state:       %s\n", h.GetState())
	fmt.Fprintf(io.out, "created:     %s (%s ago)\n", at(h.GetCreatedMs()), txnAge(now, h.GetCreatedMs()))
	fmt.Fprintf(io.out, "checks:      %d/%d\n", h.GetChecks(), h.GetMaxChecks())
	fmt.Fprintf(io.out, "next check:  %s\n", next)
	fmt.Fprintf(io.out, "deliver at:  %s\n", at(h.GetDeliverAtMs()))
	fmt.Fprintf(io.out, "records:     %d\n", h.GetCount())
	fmt.Fprintf(io.out, "bytes:       %d\n", h.GetBytes())
}

// txnAge is how long ago createdMs was, to the second.
func txnAge(now time.Time, createdMs int64) string {
	return max(now.Sub(time.UnixMilli(createdMs)), 0).Round(time.Second).String()
}

// txnNextCheck is when the next check-back is due: "in 4s", "due" once
// the time has passed, "-" when none is planned (checks exhausted and the
// half kept, or committed and waiting for its delivery time).
func txnNextCheck(now time.Time, nextMs int64) string {
	if nextMs == 0 {
		return "-"
	}
	d := time.UnixMilli(nextMs).Sub(now)
	if d <= 0 {
		return "due"
	}
	return "in " + d.Round(time.Second).String()
}
