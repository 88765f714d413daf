// Package dlq reads dead-letter topics and sends dead letters back to
// where they came from (a redrive). A dead letter is an ordinary record
// whose herald-dlq-* headers name its origin (package retry); the reads
// use the pull API, so they work on any topic and never join a group. The
// CLI (herald dlq) and the admin API share it.
package dlq

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/retry"
)

// FetchWait is the long-poll of the reads. They stop at a high watermark
// seen at start, so a fetch always has records to return; the wait only
// matters if retention removes them meanwhile.
const FetchWait = 100 * time.Millisecond

// Read calls fn for each record of topic's partition in [lo, hi), in offset
// order, until fn returns true (stop), ctx ends or hi. It returns the
// offset to read next: hi when done, else the offset after the last record
// given to fn (or past records retention removed).
func Read(ctx context.Context, c *client.Client, topic string, partition int32, lo, hi int64, fn func(*client.Message) (stop bool)) (int64, error) {
	next := lo
	pc := c.NewPartitionConsumer(topic, partition, client.AtOffset(lo), client.WithFetchMaxWait(FetchWait))
	for next < hi {
		if err := ctx.Err(); err != nil {
			return next, err
		}
		ms, err := pc.Poll(ctx)
		if err != nil {
			return next, err
		}
		for _, m := range ms {
			if m.Offset >= hi {
				return hi, nil
			}
			next = m.Offset + 1
			if fn(m) {
				return next, nil
			}
		}
		if p, _ := pc.Position(); p > next { // moved past records retention removed
			next = min(p, hi)
		}
	}
	return hi, nil
}

// Record is m as the wire record the retry helpers and the filters take.
// It shares m's bytes.
func Record(m *client.Message) *heraldpb.Record {
	r := &heraldpb.Record{Key: m.Key, Value: m.Value, Tags: m.Tags}
	if !m.Timestamp.IsZero() {
		r.TimestampMs = m.Timestamp.UnixMilli()
	}
	if len(m.Headers) > 0 {
		r.Headers = make([]*heraldpb.Header, len(m.Headers))
		for i, h := range m.Headers {
			r.Headers[i] = &heraldpb.Header{Key: h.Key, Value: h.Value}
		}
	}
	return r
}

// PartitionFor is where a redriven record goes in its origin topic of
// partitions partitions. A keyed record goes where its key goes now, so it
// stays in order with newer records of its key even if the topic gained
// partitions; that is its origin partition unless the topic was resized or
// the original producer chose a partition explicitly. An unkeyed record
// goes back to its origin partition while the topic has it, else anywhere
// (-1). The second result names it for printing ("any" for -1).
func PartitionFor(key []byte, o retry.Origin, partitions int) (int32, string) {
	switch {
	case len(key) > 0:
		part := int32(client.PartitionForKey(key, uint32(partitions)))
		return part, strconv.Itoa(int(part))
	case int(o.Partition) < partitions:
		return int32(o.Partition), strconv.Itoa(int(o.Partition))
	}
	return -1, "any"
}

// Outcome kinds.
const (
	Redriven     = "redriven"      // sent back and acknowledged
	WouldRedrive = "would_redrive" // a dry run's: it would be sent
	Skipped      = "skipped"       // not a dead letter (no valid origin headers)
	Failed       = "failed"        // its origin cannot take it, or the send failed
)

// Outcome is what became of one dead letter.
type Outcome struct {
	Kind      string
	Origin    string // the origin topic ("" when skipped)
	Partition string // where it went or would go: a number or "any"
	Result    client.Result
	Err       error
}

// Redriver sends dead letters back to their origin topics as
// retry.Redriven makes them (dead-letter headers stripped; key, value,
// tags, other headers and timestamp kept), with acks=all. A dry run sends
// nothing. Close waits for every send's outcome.
type Redriver struct {
	c      *client.Client
	dryRun bool
	// manual writes the records PartitionFor names a partition for,
	// which keeps them in order; anyPart the others.
	manual, anyPart *client.Producer
	mu              sync.Mutex
	dests           map[string]dest
}

type dest struct {
	partitions int
	err        error
}

// NewRedriver returns a Redriver over c.
func NewRedriver(c *client.Client, dryRun bool) *Redriver {
	r := &Redriver{c: c, dryRun: dryRun, dests: map[string]dest{}}
	if !dryRun {
		r.manual = c.NewProducer(client.WithAcks(heraldpb.Acks_ACKS_ALL), client.WithManualPartitions())
		r.anyPart = c.NewProducer(client.WithAcks(heraldpb.Acks_ACKS_ALL))
	}
	return r
}

func (r *Redriver) dest(ctx context.Context, topic string) dest {
	r.mu.Lock()
	d, ok := r.dests[topic]
	r.mu.Unlock()
	if ok {
		return d
	}
	d.partitions, d.err = r.c.Partitions(ctx, topic)
	if client.IsCode(d.err, heraldpb.ErrorCode_TOPIC_NOT_FOUND) {
		d.err = errors.New("origin topic does not exist")
	} else if d.err == nil && d.partitions == 0 {
		d.err = errors.New("origin topic has no partitions")
	}
	r.mu.Lock()
	r.dests[topic] = d
	r.mu.Unlock()
	return d
}

// Send redrives m, the dead letter whose record is rec; done gets its
// outcome, at once or when the send is acknowledged (from another
// goroutine). A record taken is finished even when ctx ends: the sends use
// a context without its cancellation, bounded by the request timeout and
// the producer's retries.
func (r *Redriver) Send(ctx context.Context, m *client.Message, rec *heraldpb.Record, done func(Outcome)) {
	sendCtx := context.WithoutCancel(ctx)
	o, err := retry.OriginOf(rec)
	if err != nil {
		done(Outcome{Kind: Skipped, Err: err})
		return
	}
	d := r.dest(sendCtx, o.Topic)
	if d.err != nil {
		done(Outcome{Kind: Failed, Origin: o.Topic, Err: d.err})
		return
	}
	part, partName := PartitionFor(m.Key, o, d.partitions)
	if r.dryRun {
		done(Outcome{Kind: WouldRedrive, Origin: o.Topic, Partition: partName})
		return
	}
	back := retry.Redriven(rec)
	out := &client.Message{Topic: o.Topic, Key: back.GetKey(), Value: back.GetValue(), Tags: back.GetTags()}
	p := r.anyPart
	if part >= 0 {
		p, out.Partition = r.manual, part
	}
	if ts := back.GetTimestampMs(); ts != 0 {
		out.Timestamp = time.UnixMilli(ts)
	}
	for _, h := range back.GetHeaders() {
		out.Headers = append(out.Headers, client.Header{Key: h.GetKey(), Value: h.GetValue()})
	}
	p.SendAsync(sendCtx, out, func(res client.Result, err error) {
		if err != nil {
			done(Outcome{Kind: Failed, Origin: o.Topic, Partition: partName, Err: err})
			return
		}
		done(Outcome{Kind: Redriven, Origin: o.Topic, Partition: partName, Result: res})
	})
}

// Close waits until every send's done ran.
func (r *Redriver) Close() {
	if r.manual != nil {
		_ = r.manual.Close(context.Background())
		_ = r.anyPart.Close(context.Background())
	}
}
