package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

func init() { register("consume", cliRunner(consumeCmd)) }

// consumeCmd runs "herald consume": it prints one value per line. Without
// --follow it stops at the high watermarks seen at start; with --follow it
// long-polls until interrupted or --max messages.
func consumeCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("consume", io.err)
	topic := fs.String("topic", "", "topic to read (required)")
	partition := fs.Int("partition", -1, "read only this partition (-1 = all)")
	from := fs.String("from", "earliest", "start at earliest, latest, an OFFSET or an RFC3339 time")
	follow := fs.Bool("follow", false, "keep waiting for new records")
	maxN := fs.Int("max", 0, "stop after N records (0 = no limit)")
	verbose := fs.Bool("verbose", false, "print partition, offset, timestamp and key before each value")
	maxWait := fs.Duration("max-wait", client.DefaultFetchMaxWait, "long-poll wait of each fetch")
	un := declareCLIUnsupported(fs, map[string]string{
		"group":  "consumer groups come in a later release",
		"mode":   "consumer group modes come in a later release",
		"filter": "broker-side filters come in a later release",
		"ack":    "acknowledgements come with consumer groups",
	})
	if err := parseCLIFlags(fs, args, un); err != nil {
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
	start, err := parseStart(*from)
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
			return cliOneLine(err)
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

	if !*follow {
		// Read each partition up to the high watermark it had at start.
		for _, p := range parts {
			end, err := c.ListOffsets(ctx, *topic, p, heraldpb.OffsetSpec_OFFSET_SPEC_LATEST, time.Time{})
			if err != nil {
				return cliOneLine(fmt.Errorf("partition %d: %w", p, err))
			}
			pc := c.NewPartitionConsumer(*topic, p, start, opts...)
			for {
				if err := pc.Resolve(ctx); err != nil {
					return cliOneLine(fmt.Errorf("partition %d: %w", p, err))
				}
				if next, _ := pc.Position(); next >= end.Offset {
					break
				}
				ms, err := pc.Poll(ctx)
				if err != nil {
					if ctx.Err() != nil {
						return nil // interrupted
					}
					return cliOneLine(fmt.Errorf("partition %d: %w", p, err))
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
		return w.Flush()
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
			return cliOneLine(err)
		}
	}
}

// parseStart parses --from.
func parseStart(s string) (client.StartPosition, error) {
	switch s {
	case "earliest":
		return client.Earliest(), nil
	case "latest":
		return client.Latest(), nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 {
			return client.StartPosition{}, usagef("--from offset must not be negative")
		}
		return client.AtOffset(n), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return client.AtTime(t), nil
	}
	return client.StartPosition{}, usagef("--from must be earliest, latest, an offset or an RFC3339 time, not %q", s)
}
