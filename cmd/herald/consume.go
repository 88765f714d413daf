package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/heraldmq/herald/client"
)

func init() {
	register("consume", "print a topic's records, by partition or as a consumer group member", cliRunner(consumeCmd))
}

// groupOnlyFlags are the consume flags that need --group.
var groupOnlyFlags = []string{"mode", "tags", "filter", "ack", "window", "orderly", "ack-timeout", "name"}

// Isolation levels (--isolation of consume and bench). Transactions are
// staged by the coordinator and appended only when they commit, so a log
// never holds a record of an open or aborted transaction: both levels
// read the same records. The flag is accepted, and checked, for scripts
// written for Kafka.
const (
	isolationCommitted   = "read_committed"
	isolationUncommitted = "read_uncommitted"
	isolationUsage       = "read_committed or read_uncommitted: both read only committed records (transactions are staged until they commit)"
)

// checkIsolation checks an --isolation value.
func checkIsolation(v string) error {
	if v != isolationCommitted && v != isolationUncommitted {
		return usagef("--isolation must be %s or %s, not %q", isolationCommitted, isolationUncommitted, v)
	}
	return nil
}

// consumeCmd runs "herald consume": it prints one value per line. Without
// --group it reads partitions: without --follow it stops at the high
// watermarks seen at start; with --follow it long-polls until interrupted
// or --max messages. With --group it joins the consumer group (push, see
// consumeGroup) until interrupted or --max messages.
func consumeCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("consume", io.err)
	topic := fs.String("topic", "", "topic to read (required)")
	partition := fs.Int("partition", -1, "read only this partition (-1 = all; not with --group)")
	from := fs.String("from", "earliest", "start at earliest, latest, an OFFSET or an RFC3339 time (with --group: where a group without progress starts, default latest)")
	follow := fs.Bool("follow", false, "keep waiting for new records (always so with --group)")
	maxN := fs.Int("max", 0, "stop after N records (0 = no limit)")
	verbose := fs.Bool("verbose", false, "print partition, offset, timestamp and key (and delivery count with --group) before each value")
	maxWait := fs.Duration("max-wait", client.DefaultFetchMaxWait, "long-poll wait of each fetch (not with --group)")
	isolation := fs.String("isolation", isolationCommitted, isolationUsage)
	var g groupFlags
	fs.StringVar(&g.group, "group", "", "consume as a member of this consumer group (push delivery with acks)")
	fs.StringVar(&g.mode, "mode", "clustering", "group mode: clustering, broadcast, shared or key-shared (with --group)")
	fs.StringVar(&g.tags, "tags", "", "broker-side tag filter, e.g. 'tagA || tagB' (with --group)")
	fs.StringVar(&g.filter, "filter", "", "broker-side SQL-92 filter over headers, e.g. \"region = 'eu'\" (with --group)")
	fs.StringVar(&g.ack, "ack", "manual", "manual: ack each record after printing it (at least once); auto: the broker acks on delivery (at most once) (with --group)")
	fs.IntVar(&g.window, "window", client.DefaultWindow, "credit window: records delivered and not yet printed, at most (with --group)")
	fs.BoolVar(&g.orderly, "orderly", false, "at most one record in flight per partition (with --group)")
	fs.DurationVar(&g.ackTimeout, "ack-timeout", 0, "redeliver a record not acked within this (with --group; 0 = broker default)")
	fs.StringVar(&g.name, "name", "", "member name shown by 'herald group describe' (with --group)")
	if err := parseCLIFlags(fs, args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err := checkIsolation(*isolation); err != nil {
		return err
	}
	switch {
	case *topic == "":
		return usagef("--topic is required")
	case *maxN < 0:
		return usagef("--max must not be negative")
	case *partition < -1:
		return usagef("--partition must be >= 0 (or -1 for all)")
	}
	if g.group == "" {
		for _, n := range groupOnlyFlags {
			if set[n] {
				return usagef("--%s needs --group", n)
			}
		}
	} else {
		if set["partition"] || set["max-wait"] {
			return usagef("--partition and --max-wait do not apply with --group (the group assigns partitions)")
		}
		opts, err := g.options(*topic)
		if err != nil {
			return err
		}
		if set["from"] {
			if opts.From, err = parseStart("--from", *from); err != nil {
				return err
			}
		}
		return consumeGroup(ctx, cf, opts, *maxN, *verbose, io)
	}
	start, err := parseStart("--from", *from)
	if err != nil {
		return err
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()

	var parts []int32
	if *partition >= 0 {
		parts = []int32{int32(*partition)}
	} else {
		n, err := c.Partitions(ctx, *topic)
		if err != nil {
			return cliTopicErr(err, *topic, 0)
		}
		for i := 0; i < n; i++ {
			parts = append(parts, int32(i))
		}
	}

	w := bufio.NewWriterSize(io.out, 64<<10)
	defer w.Flush()
	printed := 0
	print := func(m *client.Message) bool {
		if *verbose {
			fmt.Fprintf(w, "partition=%d offset=%d timestamp=%s key=%q\t", m.Partition, m.Offset,
				m.Timestamp.UTC().Format(time.RFC3339Nano), m.Key)
		}
		w.Write(m.Value)
		w.WriteByte('\n')
		printed++
		return *maxN > 0 && printed >= *maxN
	}
	opts := []client.ConsumerOpt{client.WithFetchMaxWait(*maxWait)}
	// An offset past a partition's end is said on stderr: the reader
	// starts at the high watermark there (the SDK's rule), so without
	// --follow it has nothing to print.
	fromOffset, ferr := strconv.ParseInt(*from, 10, 64)
	if ferr != nil {
		fromOffset = -1
	}
	pastEnd := func(p int32, hw int64) bool {
		if fromOffset <= hw {
			return false
		}
		if *follow {
			fmt.Fprintf(io.err, "partition %d: --from %d is past the end of the log (high watermark %d); reading from the high watermark\n", p, fromOffset, hw)
		} else {
			fmt.Fprintf(io.err, "partition %d: --from %d is past the end of the log (high watermark %d); nothing to read\n", p, fromOffset, hw)
		}
		return true
	}

	if !*follow {
		// Read each partition up to the high watermark it had at start.
		skipped := 0
		for _, p := range parts {
			end, err := c.ListOffsets(ctx, *topic, p, client.OffsetLatest, time.Time{})
			if err != nil {
				return cliTopicErr(fmt.Errorf("partition %d: %w", p, err), *topic, 0)
			}
			if pastEnd(p, end.Offset) {
				skipped++
				continue
			}
			pc := c.NewPartitionConsumer(*topic, p, start, opts...)
			for {
				if err := pc.Resolve(ctx); err != nil {
					return cliTopicErr(fmt.Errorf("partition %d: %w", p, err), *topic, 0)
				}
				if next, _ := pc.Position(); next >= end.Offset {
					break
				}
				ms, err := pc.Poll(ctx)
				if err != nil {
					if ctx.Err() != nil {
						return nil // interrupted
					}
					return cliTopicErr(fmt.Errorf("partition %d: %w", p, err), *topic, 0)
				}
				for _, m := range ms {
					if m.Offset >= end.Offset {
						break
					}
					if print(m) {
						return w.Flush()
					}
				}
				if err := w.Flush(); err != nil {
					return err
				}
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if skipped > 0 && skipped == len(parts) {
			return fmt.Errorf("--from %d is past the end of every partition read: nothing to print (--follow waits for new records)", fromOffset)
		}
		return nil
	}

	if fromOffset >= 0 {
		for _, p := range parts {
			end, err := c.ListOffsets(ctx, *topic, p, client.OffsetLatest, time.Time{})
			if err != nil {
				return cliTopicErr(fmt.Errorf("partition %d: %w", p, err), *topic, 0)
			}
			pastEnd(p, end.Offset)
		}
	}
	cs := c.NewConsumer(*topic, start, parts, opts...)
	defer cs.Close()
	for {
		ms, err := cs.Poll(ctx)
		for _, m := range ms {
			if print(m) {
				return w.Flush()
			}
		}
		if ferr := w.Flush(); ferr != nil {
			return ferr
		}
		if err != nil {
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				return nil // SIGINT ends --follow normally
			}
			return cliTopicErr(err, *topic, 0)
		}
	}
}

// parseStart parses a start position given as flag (--from, --to).
func parseStart(flag, s string) (client.StartPosition, error) {
	switch s {
	case "earliest":
		return client.Earliest(), nil
	case "latest":
		return client.Latest(), nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 {
			return client.StartPosition{}, usagef("%s offset must not be negative", flag)
		}
		return client.AtOffset(n), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return client.AtTime(t), nil
	}
	return client.StartPosition{}, usagef("%s must be earliest, latest, an offset or an RFC3339 time, not %q", flag, s)
}

// groupFlags are consume's consumer-group flags.
type groupFlags struct {
	group, mode, tags, filter, ack, name string
	window                               int
	orderly                              bool
	ackTimeout                           time.Duration
}

// parseMode maps --mode to the SDK's mode.
func parseMode(s string) (client.SubscriptionMode, error) {
	for _, m := range []client.SubscriptionMode{client.Clustering, client.Broadcast, client.Shared, client.KeyShared} {
		if s == m.String() {
			return m, nil
		}
	}
	return 0, usagef("--mode must be clustering, broadcast, shared or key-shared, not %q", s)
}

// options checks the group flags and turns them into SubscribeOptions.
func (g *groupFlags) options(topic string) (client.SubscribeOptions, error) {
	mode, err := parseMode(g.mode)
	if err != nil {
		return client.SubscribeOptions{}, err
	}
	switch {
	case g.tags != "" && g.filter != "":
		return client.SubscribeOptions{}, usagef("use --tags or --filter, not both")
	case g.ack != "auto" && g.ack != "manual":
		return client.SubscribeOptions{}, usagef("--ack must be auto or manual, not %q", g.ack)
	case g.window < 1 || g.window > client.MaxWindow:
		return client.SubscribeOptions{}, usagef("--window must be between 1 and %d", client.MaxWindow)
	case g.ackTimeout < 0:
		return client.SubscribeOptions{}, usagef("--ack-timeout must not be negative")
	}
	o := client.SubscribeOptions{Group: g.group, Topic: topic, Mode: mode, Tags: g.tags, SQL: g.filter,
		AutoAck: g.ack == "auto", Orderly: g.orderly, AckTimeout: g.ackTimeout, Window: g.window, Name: g.name}
	if err := o.Validate(); err != nil {
		return client.SubscribeOptions{}, usagef("%v", cliOneLine(err))
	}
	return o, nil
}

// consumeGroup subscribes with opts and prints each record (acking it after
// printing unless auto-ack) until ctx ends (SIGINT, SIGTERM) or maxN records
// were printed. Then it closes the subscription, which waits for the record
// being printed, flushes the acks and leaves the group; records received
// and not printed are redelivered. Background failures (a lost connection:
// the subscription resubscribes) are warned about on stderr.
func consumeGroup(ctx context.Context, cf *cliFlags, opts client.SubscribeOptions, maxN int, verbose bool, io cliIO) error {
	var errMu sync.Mutex
	opts.OnError = func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		fmt.Fprintf(io.err, "herald consume: warning: %v\n", cliOneLine(err))
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()
	warnModeChange(ctx, c, opts, io.err)

	w := bufio.NewWriterSize(io.out, 64<<10)
	var mu sync.Mutex // one record printed at a time
	printed := 0
	done := make(chan error, 1)
	finish := func(err error) {
		select {
		case done <- err:
		default:
		}
	}
	sub, err := c.Subscribe(ctx, opts, func(_ context.Context, m *client.Delivered) {
		mu.Lock()
		defer mu.Unlock()
		if maxN > 0 && printed >= maxN {
			m.Nack(0) // past --max: give it back
			return
		}
		if verbose {
			fmt.Fprintf(w, "partition=%d offset=%d delivery=%d timestamp=%s key=%q\t", m.Partition, m.Offset, m.DeliveryCount,
				m.Timestamp.UTC().Format(time.RFC3339Nano), m.Key)
		}
		w.Write(m.Value)
		w.WriteByte('\n')
		if err := w.Flush(); err != nil { // printed before acked
			m.Nack(0)
			finish(err)
			return
		}
		m.Ack()
		if printed++; maxN > 0 && printed >= maxN {
			finish(nil)
		}
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while subscribing
		}
		return cliTopicErr(err, opts.Topic, 0)
	}
	var runErr error
	select {
	case <-ctx.Done(): // SIGINT or SIGTERM: a normal end
	case runErr = <-done:
	}
	closeCtx, cancel := context.WithTimeout(context.Background(), max(cf.timeout, time.Second))
	defer cancel()
	if err := sub.Close(closeCtx); err != nil && runErr == nil {
		runErr = err
	}
	return cliOneLine(runErr)
}

// warnModeChange warns on stderr when subscribing with opts is about to
// change the group's mode: the group is known (it has a topic) in another
// mode and has no live members, so the broker builds the group anew in
// opts.Mode (actors/consumer/subscribe.go), and every member that joins
// after must use it. With live members it warns of nothing: the broker
// refuses the subscription with GROUP_CONFLICT, which names the modes. A
// group the broker does not know (GROUP_NOT_FOUND), or any failure to
// describe it, warns of nothing either: the subscription says what fails.
func warnModeChange(ctx context.Context, c *client.Client, opts client.SubscribeOptions, w io.Writer) {
	gi, err := c.DescribeGroup(ctx, opts.Group)
	if err != nil || gi.GetTopic() == "" || len(gi.GetMembers()) > 0 {
		return
	}
	if cur := modeName(gi.GetMode()); cur != opts.Mode.String() {
		fmt.Fprintf(w, "herald consume: warning: group %s is in %s mode; subscribing in %s mode changes it for every member\n",
			opts.Group, cur, opts.Mode)
	}
}
