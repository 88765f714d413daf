package main

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/heraldmq/herald/client"
)

func init() {
	register("produce", "send stdin lines (or synthetic records) to a topic", cliRunner(produceCmd))
}

// produceCmd runs "herald produce": one record per stdin line, or --count
// synthetic records. It reports the acknowledged count on stderr and fails
// when any record failed.
func produceCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("produce", io.err)
	topic := fs.String("topic", "", "topic to produce to (required)")
	key := fs.String("key", "", "record key (records with a key go to PartitionForKey(key), unless --partition names one)")
	partition := fs.Int("partition", -1, "write every record to this partition (-1 = any: the key's partition, or spread over the partitions)")
	acks := fs.String("acks", "all", "acknowledgement: none, leader or all")
	count := fs.Int("count", 0, "produce N synthetic records instead of reading stdin")
	size := fs.Int("size", 100, "value size in bytes of synthetic records (--count)")
	linger := fs.Duration("linger", client.DefaultLinger, "how long a batch waits for more records")
	batchBytes := fs.Int("batch-bytes", client.DefaultBatchBytes, "largest batch in bytes")
	maxLine := fs.Int("max-line-bytes", 1<<20, "longest stdin line accepted")
	delay := fs.Duration("delay", 0, "deliver each record this long after the broker receives it (1ms .. the broker's max delay); prints each record's schedule id")
	at := fs.String("at", "", "deliver each record at this time (RFC 3339); prints each record's schedule id")
	priority := fs.Int("priority", 0, "record priority, 0 (lowest) to 9")
	ttl := fs.Duration("ttl", 0, "record time-to-live: consumer groups never deliver it after this (0 = the topic's)")
	if err := parseCLIFlags(fs, args); err != nil {
		return err
	}
	var deliverAt time.Time
	if *at != "" {
		t, err := time.Parse(time.RFC3339Nano, *at)
		if err != nil {
			return usagef("--at %q is not an RFC 3339 time (like 2026-12-24T18:00:00Z): %v", *at, err)
		}
		deliverAt = t
	}
	switch {
	case *delay < 0:
		return usagef("--delay must not be negative")
	case *delay > 0 && *delay < time.Millisecond:
		return usagef("--delay must be at least 1ms")
	case *delay > 0 && *at != "":
		return usagef("--delay and --at are exclusive")
	case *priority < 0 || *priority > 9:
		return usagef("--priority must be 0..9")
	case *ttl < 0:
		return usagef("--ttl must not be negative")
	}
	scheduled := *delay > 0 || *at != ""
	switch {
	case *topic == "":
		return usagef("--topic is required")
	case *count < 0:
		return usagef("--count must not be negative")
	case *size < 0:
		return usagef("--size must not be negative")
	case *partition < -1:
		return usagef("--partition must be >= 0 (or -1 for any)")
	}
	ack, err := parseCLIAcks(*acks)
	if err != nil {
		return err
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()
	opts := []client.ProducerOpt{client.WithAcks(ack), client.WithLinger(*linger), client.WithBatchBytes(*batchBytes)}
	if *partition >= 0 {
		opts = append(opts, client.WithManualPartitions()) // Message.Partition is honoured
	}
	p := c.NewProducer(opts...)

	var (
		sent, acked atomic.Int64
		mu          sync.Mutex
		firstErr    error
	)
	send := func(value []byte) {
		m := &client.Message{Topic: *topic, Value: value,
			Priority: uint8(*priority), TTL: *ttl, Delay: *delay, DeliverAt: deliverAt}
		if *partition >= 0 {
			m.Partition = int32(*partition)
		}
		if *key != "" {
			m.Key = []byte(*key)
		}
		sent.Add(1)
		p.SendAsync(ctx, m, func(r client.Result, err error) {
			if err == nil && scheduled {
				mu.Lock()
				fmt.Fprintf(io.out, "scheduled %s for %s (partition %d)\n", r.ScheduleID, r.DeliverAt.UTC().Format(time.RFC3339Nano), r.Partition)
				mu.Unlock()
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				return
			}
			acked.Add(1)
		})
	}
	var readErr error
	if *count > 0 {
		for i := 0; i < *count && ctx.Err() == nil; i++ {
			send(syntheticValue(i, *size))
		}
	} else {
		sc := bufio.NewScanner(io.in)
		sc.Buffer(make([]byte, 64<<10), *maxLine)
		for sc.Scan() && ctx.Err() == nil {
			send(append([]byte(nil), sc.Bytes()...))
		}
		readErr = sc.Err()
	}
	closeErr := p.Close(ctx)
	fmt.Fprintf(io.err, "%d of %s acknowledged\n", acked.Load(), plural(sent.Load(), "record"))
	mu.Lock()
	defer mu.Unlock()
	switch {
	case readErr != nil:
		return fmt.Errorf("reading stdin: %v", readErr)
	case firstErr != nil:
		return cliTopicErr(fmt.Errorf("%s failed, first: %w", plural(sent.Load()-acked.Load(), "record"), firstErr), *topic, 0)
	case closeErr != nil:
		return cliTopicErr(closeErr, *topic, 0)
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return nil
}

// syntheticValue is record i of a --count run: its sequence number, then
// filler up to size bytes. Values are unique per record (a value shorter
// than the number is just the number).
func syntheticValue(i, size int) []byte {
	v := strconv.AppendInt(make([]byte, 0, max(size, 20)), int64(i), 10)
	if len(v) < size {
		v = append(v, ' ')
	}
	for len(v) < size {
		v = append(v, byte('a'+len(v)%26))
	}
	return v
}
