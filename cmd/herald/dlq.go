package main

// herald dlq: list, peek at and redrive the dead-letter topics of consumer
// groups. A dead letter is an ordinary record whose herald-dlq-* headers
// name where it came from (actors/scheduler/deadletter.go); these commands
// read them with the pull API, so they work on any topic and never join a
// group.

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/dlq"
	"github.com/heraldmq/herald/filter"
	heraldpb "github.com/heraldmq/herald/proto"
	"github.com/heraldmq/herald/retry"
)

func init() { register("dlq", "list, peek at and redrive dead-lettered messages", cliRunner(dlqCmd)) }

const dlqUsage = "usage: herald dlq list" +
	" | peek --topic G.dlq [--partition P] [--from earliest|OFFSET|P:OFFSET,...] [--count N] [--filter SQL] [--value-bytes N]" +
	" | redrive --topic G.dlq [--partition P] [--from earliest|OFFSET|P:OFFSET,...] [--to latest|OFFSET|P:OFFSET,...] [--filter SQL] [--dry-run]"

// dlqFlagFor names the subcommands that take each dlq flag (the common
// client flags apply to all).
var dlqFlagFor = map[string][]string{
	"topic":       {"peek", "redrive"},
	"partition":   {"peek", "redrive"},
	"from":        {"peek", "redrive"},
	"filter":      {"peek", "redrive"},
	"to":          {"redrive"},
	"dry-run":     {"redrive"},
	"count":       {"peek"},
	"value-bytes": {"peek"},
}

// dlqCmd runs "herald dlq SUBCOMMAND ...". Every flag is checked before it
// dials, so a bad filter or offset is a usage error (exit 2) that touches
// nothing.
func dlqCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("dlq", io.err)
	topic := fs.String("topic", "", "peek, redrive: the dead-letter topic, a name ending in "+retry.DLQSuffix)
	partition := fs.Int("partition", -1, "peek, redrive: read only this partition of the dead-letter topic (-1 = all)")
	from := fs.String("from", "earliest", "peek, redrive: first offset to read: earliest (the log start), an OFFSET for every partition read, or P:OFFSET,... for each")
	to := fs.String("to", "latest", "redrive: stop before this offset: latest (the high watermark when the command starts), an OFFSET, or P:OFFSET,...")
	sql := fs.String("filter", "", "peek, redrive: only records whose headers match this SQL-92 condition (the consumer-group filter language), e.g. '\"herald-dlq-deliveries\" >= 5'")
	dryRun := fs.Bool("dry-run", false, "redrive: print what would be redriven, write nothing")
	count := fs.Int("count", 10, "peek: print at most N records (0 = all up to the high watermark)")
	valueBytes := fs.Int("value-bytes", 120, "peek: print at most N bytes of each value (0 = all)")
	fs.Usage = func() {
		fmt.Fprintln(io.err, dlqUsage)
		fs.PrintDefaults()
	}
	pos, err := parseCLIArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing subcommand; %s", dlqUsage)
	}
	sub := pos[0]
	if sub != "list" && sub != "peek" && sub != "redrive" {
		return usagef("unknown subcommand %q; %s", sub, dlqUsage)
	}
	if len(pos) > 1 {
		return usagef("dlq %s takes no arguments (name the topic with --topic), not %q", sub, pos[1])
	}
	var bad error
	fs.Visit(func(f *flag.Flag) {
		if subs, ok := dlqFlagFor[f.Name]; ok && bad == nil && !slices.Contains(subs, sub) {
			bad = usagef("--%s does not apply to dlq %s (only to %s)", f.Name, sub, strings.Join(subs, ", "))
		}
	})
	if bad != nil {
		return bad
	}
	if sub == "list" {
		c, err := cf.dial(ctx)
		if err != nil {
			return cliOneLine(err)
		}
		defer c.Close()
		return dlqList(ctx, c, io)
	}

	switch {
	case *topic == "":
		return usagef("dlq %s needs --topic G%s", sub, retry.DLQSuffix)
	case !strings.HasSuffix(*topic, retry.DLQSuffix) || *topic == retry.DLQSuffix:
		return usagef("%q is not a dead-letter topic: their names end in %s (herald dlq list shows them)", *topic, retry.DLQSuffix)
	case *partition < -1:
		return usagef("--partition must be >= 0 (or -1 for all)")
	case *count < 0:
		return usagef("--count must not be negative")
	case *valueBytes < 0:
		return usagef("--value-bytes must not be negative")
	}
	rs := dlqReadSpec{topic: *topic, partition: int32(*partition)}
	if rs.from, err = parseDLQOffsets("--from", *from, "earliest"); err != nil {
		return err
	}
	if rs.to, err = parseDLQOffsets("--to", *to, "latest"); err != nil {
		return err
	}
	if rs.from.set && rs.to.set && rs.from.per == nil && rs.to.per == nil && rs.to.all < rs.from.all {
		return usagef("--to %d is below --from %d", rs.to.all, rs.from.all)
	}
	if rs.filter, err = parseDLQFilter(*sql); err != nil {
		return err
	}

	c, err := cf.dial(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	defer c.Close()
	ranges, err := rs.resolve(ctx, c, io.err)
	if err != nil {
		return err
	}
	if sub == "peek" {
		return dlqPeek(ctx, c, io, rs, ranges, *count, *valueBytes)
	}
	return dlqRedrive(ctx, c, io, rs, ranges, *dryRun)
}

// parseDLQFilter compiles --filter. A malformed expression is a usage error
// giving the position, with the expression and a caret under it.
func parseDLQFilter(expr string) (*filter.Filter, error) {
	if strings.TrimSpace(expr) == "" {
		return nil, nil // nil matches every record
	}
	f, err := filter.ParseSQL(expr)
	var se *filter.SyntaxError
	switch {
	case errors.As(err, &se):
		return nil, usagef("--filter: %v\n  %s", err, strings.ReplaceAll(se.Caret(expr), "\n", "\n  "))
	case err != nil:
		return nil, usagef("--filter: %v", err)
	}
	return f, nil
}

// dlqOffsets is a parsed --from or --to: unset (the default: the log start,
// or the high watermark), one offset for every partition read, or one offset
// per partition ("0:12,1:7"), which must then name every partition read.
type dlqOffsets struct {
	set bool
	all int64
	per map[int32]int64
}

func parseDLQOffsets(flag, s, dflt string) (dlqOffsets, error) {
	s = strings.TrimSpace(s)
	if s == dflt {
		return dlqOffsets{}, nil
	}
	bad := func() (dlqOffsets, error) {
		return dlqOffsets{}, usagef("%s must be %s, an OFFSET (>= 0) or PARTITION:OFFSET,... (like 0:12,1:7), not %q", flag, dflt, s)
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 {
			return bad()
		}
		return dlqOffsets{set: true, all: n}, nil
	}
	o := dlqOffsets{set: true, per: map[int32]int64{}}
	for _, item := range strings.Split(s, ",") {
		ps, ns, ok := strings.Cut(strings.TrimSpace(item), ":")
		if !ok {
			return bad()
		}
		p, err1 := strconv.ParseInt(ps, 10, 32)
		n, err2 := strconv.ParseInt(ns, 10, 64)
		if err1 != nil || err2 != nil || p < 0 || n < 0 {
			return bad()
		}
		if _, dup := o.per[int32(p)]; dup {
			return dlqOffsets{}, usagef("%s names partition %d twice", flag, p)
		}
		o.per[int32(p)] = n
	}
	return o, nil
}

// at returns the offset o gives partition p, if any.
func (o dlqOffsets) at(p int32) (int64, bool) {
	if !o.set {
		return 0, false
	}
	if o.per == nil {
		return o.all, true
	}
	n, ok := o.per[p]
	return n, ok
}

// check refuses a per-partition list that does not name exactly parts.
func (o dlqOffsets) check(flag string, parts []int32) error {
	if o.per == nil {
		return nil
	}
	read := map[int32]bool{}
	for _, p := range parts {
		read[p] = true
		if _, ok := o.per[p]; !ok {
			return usagef("%s does not name partition %d: name every partition read (%s), or choose one with --partition", flag, p, partitionNums(parts))
		}
	}
	for p := range o.per {
		if !read[p] {
			return usagef("%s names partition %d, which is not read (reading %s)", flag, p, partitionNums(parts))
		}
	}
	return nil
}

func partitionNums(ps []int32) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}

// dlqReadSpec is what peek and redrive read: which topic, partitions and
// offsets, and which records (filter; nil = all).
type dlqReadSpec struct {
	topic     string
	partition int32 // -1: all
	from, to  dlqOffsets
	filter    *filter.Filter
}

// dlqRange is the part of one partition a command reads: [lo, hi), hi
// being at most the high watermark seen when the command started.
type dlqRange struct {
	partition int32
	lo, hi    int64
}

// resolve checks the topic and turns the flags into one range per partition
// read, from the log start and high watermark of each partition now. Records
// appended later are not read. Offsets below the log start (removed by
// retention) are skipped with a note on w.
func (rs dlqReadSpec) resolve(ctx context.Context, c *client.Client, w io.Writer) ([]dlqRange, error) {
	ti, err := c.DescribeTopic(ctx, rs.topic)
	if client.IsCode(err, heraldpb.ErrorCode_TOPIC_NOT_FOUND) {
		return nil, fmt.Errorf("dead-letter topic %s does not exist yet: a group's dead-letter topic is created with its first dead letter, though `herald group describe` names it before (herald dlq list shows the ones that exist)", rs.topic)
	}
	if err != nil {
		return nil, cliOneLine(err)
	}
	n := len(ti.GetPartitions())
	var parts []int32
	if rs.partition >= 0 {
		if int(rs.partition) >= n {
			return nil, usagef("--partition %d: %s has %s", rs.partition, rs.topic, plural(n, "partition"))
		}
		parts = []int32{rs.partition}
	} else {
		for p := 0; p < n; p++ {
			parts = append(parts, int32(p))
		}
	}
	if err := rs.from.check("--from", parts); err != nil {
		return nil, err
	}
	if err := rs.to.check("--to", parts); err != nil {
		return nil, err
	}
	out := make([]dlqRange, 0, len(parts))
	for _, p := range parts {
		o, err := c.ListOffsets(ctx, rs.topic, p, client.OffsetLatest, time.Time{})
		if err != nil {
			return nil, cliOneLine(fmt.Errorf("partition %d: %w", p, err))
		}
		r := dlqRange{partition: p, lo: o.LogStart, hi: o.HighWatermark}
		if from, ok := rs.from.at(p); ok {
			if from > o.HighWatermark {
				return nil, usagef("--from %d is past the high watermark %d of partition %d", from, o.HighWatermark, p)
			}
			r.lo = from
		}
		if to, ok := rs.to.at(p); ok {
			if to < r.lo {
				return nil, usagef("partition %d: --to %d is below the first offset to read, %d", p, to, r.lo)
			}
			r.hi = min(to, o.HighWatermark) // a snapshot: nothing appended after the start
		}
		if r.lo < o.LogStart {
			fmt.Fprintf(w, "herald dlq: partition %d: offsets %d to %d were removed by retention; reading from %d\n",
				p, r.lo, min(o.LogStart, r.hi)-1, min(o.LogStart, r.hi))
			r.lo = min(o.LogStart, r.hi)
		}
		out = append(out, r)
	}
	return out, nil
}

const dlqTimeFormat = "2006-01-02T15:04:05.000Z07:00"

// dlqPeek prints up to count matching records (0: all), one line each:
// where it is in the DLQ, its origin, deliveries, dead-letter time and
// reason, key, its other headers, and its value, quoted and truncated to
// valueBytes. A record without valid dead-letter headers is printed with
// the reason instead of an origin.
func dlqPeek(ctx context.Context, c *client.Client, io cliIO, rs dlqReadSpec, ranges []dlqRange, count, valueBytes int) error {
	w := bufio.NewWriterSize(io.out, 64<<10)
	defer w.Flush()
	printed := 0
	for _, r := range ranges {
		_, err := dlq.Read(ctx, c, rs.topic, r.partition, r.lo, r.hi, func(m *client.Message) bool {
			rec := dlq.Record(m)
			if !rs.filter.Match(filter.FromProto(rec)) {
				return false
			}
			printDeadLetter(w, m, rec, valueBytes)
			printed++
			return count > 0 && printed >= count
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil // interrupted: a normal end, as for consume
			}
			return cliOneLine(fmt.Errorf("partition %d: %w", r.partition, err))
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if count > 0 && printed >= count {
			break
		}
	}
	return w.Flush()
}

func printDeadLetter(w io.Writer, m *client.Message, rec *heraldpb.Record, valueBytes int) {
	fmt.Fprintf(w, "partition=%d offset=%d ", m.Partition, m.Offset)
	if o, err := retry.OriginOf(rec); err != nil {
		fmt.Fprintf(w, "not-a-dead-letter=%q", strings.TrimPrefix(err.Error(), retry.ErrNotDeadLetter.Error()+": "))
	} else {
		fmt.Fprintf(w, "origin=%s/%d@%d deliveries=%d dead-lettered=%s reason=%q",
			o.Topic, o.Partition, o.Offset, o.Deliveries, o.Time.UTC().Format(dlqTimeFormat), o.Reason)
	}
	fmt.Fprintf(w, " key=%q", m.Key)
	for _, h := range retry.Redriven(rec).GetHeaders() {
		fmt.Fprintf(w, " header.%s=%q", h.GetKey(), h.GetValue())
	}
	v, more := m.Value, ""
	if valueBytes > 0 && len(v) > valueBytes {
		v, more = v[:valueBytes], fmt.Sprintf("...(%d bytes)", len(m.Value))
	}
	fmt.Fprintf(w, " value=%q%s\n", v, more)
}

// redriveReport counts and prints the outcome of a redrive. Its methods
// are called from the reading goroutine and from producer callbacks.
type redriveReport struct {
	mu                                       sync.Mutex
	w                                        *bufio.Writer
	read, matched, redriven, skipped, failed int
}

func (r *redriveReport) line(count *int, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if count != nil {
		*count++
	}
	fmt.Fprintf(r.w, format+"\n", args...)
}

// dlqRedrive sends every matching dead letter of ranges back to its origin
// topic as retry.Redriven makes it (dead-letter headers stripped; key,
// value, tags, other headers and timestamp kept), with acks=all, and prints
// one line per matching record and a summary ending with the --from of the
// next run. The DLQ is not modified: a second run over the same offsets
// redrives the same records again. It fails if any record failed (or would,
// with dryRun) or the run was interrupted.
func dlqRedrive(ctx context.Context, c *client.Client, cio cliIO, rs dlqReadSpec, ranges []dlqRange, dryRun bool) error {
	rep := &redriveReport{w: bufio.NewWriterSize(cio.out, 64<<10)}
	defer rep.w.Flush()
	for _, r := range ranges {
		fmt.Fprintf(rep.w, "%s partition %d: offsets %d to %d (%s)\n", rs.topic, r.partition, r.lo, r.hi, plural(r.hi-r.lo, "record"))
	}
	rd := dlq.NewRedriver(c, dryRun)
	next := make([]int64, len(ranges))
	var readErr error
	for i, r := range ranges {
		next[i] = r.lo
		if readErr != nil {
			continue
		}
		next[i], readErr = dlq.Read(ctx, c, rs.topic, r.partition, r.lo, r.hi, func(m *client.Message) bool {
			rep.mu.Lock()
			rep.read++
			rep.mu.Unlock()
			rec := dlq.Record(m)
			if !rs.filter.Match(filter.FromProto(rec)) {
				return false
			}
			at := fmt.Sprintf("%s/%d@%d", rs.topic, m.Partition, m.Offset)
			rep.mu.Lock()
			rep.matched++
			rep.mu.Unlock()
			rd.Send(ctx, m, rec, func(o dlq.Outcome) {
				switch o.Kind {
				case dlq.Skipped:
					rep.line(&rep.skipped, "skipped %s: %v", at, cliOneLine(o.Err))
				case dlq.Failed:
					to := o.Origin
					if o.Partition != "" {
						to += "/" + o.Partition
					}
					rep.line(&rep.failed, "failed %s -> %s: %v", at, to, cliOneLine(o.Err))
				case dlq.WouldRedrive:
					rep.line(&rep.redriven, "would redrive %s -> %s/%s", at, o.Origin, o.Partition)
				default:
					rep.line(&rep.redriven, "redrove %s -> %s/%d@%d", at, o.Origin, o.Result.Partition, o.Result.Offset)
				}
			})
			return false
		})
		if readErr != nil {
			readErr = fmt.Errorf("partition %d: %w", r.partition, readErr)
		}
	}
	rd.Close() // every outcome has been counted once it returns

	rep.mu.Lock()
	defer rep.mu.Unlock()
	w := rep.w
	if dryRun {
		fmt.Fprintf(w, "matched %d of %s read: would redrive %d, skip %d, fail %d (dry run: nothing written)\n",
			rep.matched, plural(rep.read, "record"), rep.redriven, rep.skipped, rep.failed)
	} else {
		fmt.Fprintf(w, "matched %d of %s read: redriven %d, skipped %d, failed %d\n",
			rep.matched, plural(rep.read, "record"), rep.redriven, rep.skipped, rep.failed)
		fmt.Fprintf(w, "next run: %s\n", nextFromFlags(rs, ranges, next))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	switch {
	case readErr != nil && ctx.Err() != nil:
		return errors.New("interrupted; the next run's --from above continues after the records already read")
	case readErr != nil:
		return cliOneLine(readErr)
	case rep.failed > 0 && dryRun:
		return fmt.Errorf("%d of %s would fail", rep.failed, plural(rep.matched, "matched record"))
	case rep.failed > 0:
		return fmt.Errorf("%d of %s failed (redrive one again with --partition P --from OFFSET --to OFFSET+1)", rep.failed, plural(rep.matched, "matched record"))
	}
	return nil
}

// nextFromFlags is the --from (and --partition) that makes the next redrive
// start after what this one read.
func nextFromFlags(rs dlqReadSpec, ranges []dlqRange, next []int64) string {
	switch {
	case rs.partition >= 0:
		return fmt.Sprintf("--partition %d --from %d", rs.partition, next[0])
	case len(ranges) == 1:
		return fmt.Sprintf("--from %d", next[0])
	}
	s := make([]string, len(ranges))
	for i, r := range ranges {
		s[i] = fmt.Sprintf("%d:%d", r.partition, next[i])
	}
	return "--from " + strings.Join(s, ",")
}

// dlqList prints the dead-letter topics (names ending in .dlq) with their
// record counts (high watermark - log start, summed over partitions) and
// the dead-letter times of their oldest and newest records: the first and
// last record of each partition, two small fetches per partition.
func dlqList(ctx context.Context, c *client.Client, io cliIO) error {
	topics, err := c.ListTopics(ctx)
	if err != nil {
		return cliOneLine(err)
	}
	sort.Slice(topics, func(i, j int) bool { return topics[i].GetName() < topics[j].GetName() })
	tw := tabwriter.NewWriter(io.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tPARTITIONS\tMESSAGES\tOLDEST\tNEWEST")
	for _, t := range topics {
		if !strings.HasSuffix(t.GetName(), retry.DLQSuffix) {
			continue
		}
		var (
			msgs           int64
			oldest, newest time.Time
		)
		for _, p := range t.GetPartitions() {
			n := p.GetHighWatermark() - p.GetLogStartOffset()
			if n <= 0 {
				continue
			}
			msgs += n
			first, err := dlqTimeAt(ctx, c, t.GetName(), int32(p.GetId()), p.GetLogStartOffset())
			if err != nil {
				return cliOneLine(fmt.Errorf("%s partition %d: %w", t.GetName(), p.GetId(), err))
			}
			last, err := dlqTimeAt(ctx, c, t.GetName(), int32(p.GetId()), p.GetHighWatermark()-1)
			if err != nil {
				return cliOneLine(fmt.Errorf("%s partition %d: %w", t.GetName(), p.GetId(), err))
			}
			if !first.IsZero() && (oldest.IsZero() || first.Before(oldest)) {
				oldest = first
			}
			if last.After(newest) {
				newest = last
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", t.GetName(), len(t.GetPartitions()), msgs, fmtDLQTime(oldest), fmtDLQTime(newest))
	}
	return tw.Flush()
}

// dlqTimeAt is when the record at offset was dead-lettered (its
// herald-dlq-time, or its timestamp when it is not a dead letter), or the
// zero time when retention removed it meanwhile.
func dlqTimeAt(ctx context.Context, c *client.Client, topic string, partition int32, offset int64) (time.Time, error) {
	res, err := c.Fetch(ctx, topic, partition, offset, 1, 0) // the broker still returns one batch
	if client.IsCode(err, heraldpb.ErrorCode_OFFSET_OUT_OF_RANGE) {
		return time.Time{}, nil
	}
	if err != nil || len(res.Messages) == 0 {
		return time.Time{}, err
	}
	m := res.Messages[0]
	if o, err := retry.OriginOf(dlq.Record(m)); err == nil {
		return o.Time, nil
	}
	return m.Timestamp, nil
}

func fmtDLQTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(dlqTimeFormat)
}
