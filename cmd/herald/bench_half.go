package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/heraldmq/herald/client"
)

// benchHalfConfig is the configuration of "herald bench half".
type benchHalfConfig struct {
	cf             *cliFlags
	producers      int
	size           int
	duration       time.Duration
	count          int64
	topic          string
	partitions     int
	group          string
	check          int64         // --check: halves to store and leave to the check-back (0 = commit mode)
	checkAfter     time.Duration // HalfOptions.CheckInterval
	maxChecks      int           // HalfOptions.MaxChecks (0 = the broker's)
	drainTimeout   time.Duration // --check: give up once pending has not fallen for this long
	reportInterval time.Duration
	json           bool
}

func (hc *benchHalfConfig) options() client.HalfOptions {
	return client.HalfOptions{ProducerGroup: hc.group, CheckInterval: hc.checkAfter, MaxChecks: hc.maxChecks}
}

// Poll intervals of the pending count (ListTxn) while check-backs resolve
// the halves: slow while some half has not been answered yet (a ListTxn
// sorts every pending half of the group on the coordinator, which would
// compete with the commits), fast once every half was answered, so that
// the end is seen within a few milliseconds.
const (
	benchHalfPollSlow = 100 * time.Millisecond
	benchHalfPollFast = 5 * time.Millisecond
)

// benchHalfCmd runs "herald bench half". By default --producers producers
// (each on its own connection) send a half message and commit it, one at
// a time in a closed loop, and it reports committed halves/s and the
// latency of SendHalf, of Commit and of both. With --check N they store N
// halves and commit none; then one TransactionChecker (its own connection)
// answers commit to every check-back, and it reports how fast the
// check-backs resolved them, from the first check-back received to the
// group's pending count (ListTxn) reaching 0.
func benchHalfCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("bench half", io.err)
	benchUsage(fs, "herald bench half [flags]\n  half messages: producers SendHalf then Commit in a closed loop;\n  with --check N, store N halves and let one TransactionChecker commit them by check-back")
	hc := benchHalfConfig{cf: cf}
	fs.IntVar(&hc.producers, "producers", 1, "producers, each with its own connection and one half at a time")
	fs.IntVar(&hc.size, "size", 1024, "message value size in bytes (at least 1)")
	fs.DurationVar(&hc.duration, "duration", 10*time.Second, "how long to send and commit (ignored with --count; not with --check)")
	fs.Int64Var(&hc.count, "count", 0, "send and commit this many halves in total instead of running for --duration (not with --check)")
	fs.StringVar(&hc.topic, "topic", "herald-bench-half", "topic the halves are committed to (created if missing)")
	fs.IntVar(&hc.partitions, "partitions", 4, "partitions when the topic is created")
	fs.StringVar(&hc.group, "group", "herald-bench-half", "the halves' producer group (HalfOptions.ProducerGroup)")
	fs.Int64Var(&hc.check, "check", 0, "check-back mode: store this many halves, end none, then one TransactionChecker commits each when the broker checks it back (0 = SendHalf then Commit)")
	fs.DurationVar(&hc.checkAfter, "check-after", 5*time.Second, "HalfOptions.CheckInterval: when the broker first checks back a half nobody ended (at least 100ms; with --check, longer than storing takes)")
	fs.IntVar(&hc.maxChecks, "max-checks", 0, "HalfOptions.MaxChecks: check-backs before an unresolved half is rolled back (0 = the broker's default, 15)")
	fs.DurationVar(&hc.drainTimeout, "drain-timeout", 0, "with --check: give up once the pending count has not fallen for this long (0 = 8 x --check-after + 10s: the longest wait between two checks of a half, plus slack)")
	fs.DurationVar(&hc.reportInterval, "report-interval", time.Second, "progress line interval (0 = none)")
	fs.BoolVar(&hc.json, "json", false, "print the final summary as JSON on stdout (progress goes to stderr)")
	if err := parseCLIFlags(fs, args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case hc.producers < 1:
		return usagef("--producers must be at least 1")
	case hc.size < 1:
		return usagef("--size must be at least 1")
	case hc.partitions < 1:
		return usagef("--partitions must be at least 1")
	case hc.topic == "" || hc.group == "":
		return usagef("--topic and --group must not be empty")
	case hc.check < 0:
		return usagef("--check must not be negative")
	case hc.check > 0 && (set["count"] || set["duration"]):
		return usagef("--check N stores N halves: it takes neither --count nor --duration")
	case hc.check == 0 && set["drain-timeout"]:
		return usagef("--drain-timeout needs --check")
	case hc.count < 0, hc.duration <= 0 && hc.count == 0:
		return usagef("--count must not be negative, and --duration must be positive without --count")
	case hc.checkAfter < 100*time.Millisecond:
		return usagef("--check-after must be at least 100ms (the broker's minimum)")
	case hc.maxChecks < 0:
		return usagef("--max-checks must not be negative")
	case hc.drainTimeout < 0:
		return usagef("--drain-timeout must not be negative")
	}
	if err := hc.options().Validate(); err != nil {
		return usagef("%s", cliOneLine(err))
	}
	if hc.drainTimeout == 0 {
		hc.drainTimeout = 8*hc.checkAfter + 10*time.Second
	}
	sum, err := runReported(io, hc.json, func(progress progressWriter) (*benchHalfSummary, error) {
		s, err := runBenchHalf(ctx, &hc, progress)
		return s, cliTopicErr(err, hc.topic, hc.partitions)
	})
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil // interrupted: what was done is reported
	}
	if n := sum.SendErrors + sum.CommitErrors; n > 0 {
		return fmt.Errorf("%s failed, first: %s", plural(n, "half message"), sum.FirstError)
	}
	if sum.Mode != "check" {
		return nil
	}
	if sum.Pending > 0 {
		return fmt.Errorf("%d of %s %s still pending (none resolved for --drain-timeout %s)",
			sum.Pending, plural(sum.Stored, "half message"), wasWere(sum.Pending), hc.drainTimeout)
	}
	if sum.Appended < sum.Resolved {
		return fmt.Errorf("topic %s grew by %s, fewer than the %s resolved: the others were rolled back (checks exhausted?)",
			sum.Topic, plural(sum.Appended, "record"), plural(sum.Resolved, "half message"))
	}
	return nil
}

// benchHalfSummary is the final report of "herald bench half" (--json
// prints it as is). The check-back fields are zero in commit mode.
type benchHalfSummary struct {
	// Mode is "commit" (SendHalf then Commit) or "check" (--check:
	// committed by check-back).
	Mode         string  `json:"mode"`
	Topic        string  `json:"topic"`
	Partitions   int     `json:"partitions"`
	Group        string  `json:"group"`
	Producers    int     `json:"producers"`
	Size         int     `json:"size_bytes"`
	CheckAfterMs float64 `json:"check_after_ms"`
	// Seconds is how long the producers ran (with --check: storing).
	// Stored counts the halves SendHalf stored, Committed those then
	// committed by Commit (commit mode).
	Seconds           float64 `json:"seconds"`
	Stored            int64   `json:"stored"`
	StoredPerSec      float64 `json:"stored_per_sec"`
	Committed         int64   `json:"committed"`
	CommittedPerSec   float64 `json:"committed_per_sec"`
	CommittedMBPerSec float64 `json:"committed_mb_per_sec"`
	SendErrors        int64   `json:"send_errors"`
	CommitErrors      int64   `json:"commit_errors"`
	FirstError        string  `json:"first_error,omitempty"`
	// Latencies, over the calls that succeeded: SendHalf, Commit, and both
	// (one half, from its SendHalf to its Commit returning).
	SendP50Ms   float64 `json:"send_p50_ms"`
	SendP90Ms   float64 `json:"send_p90_ms"`
	SendP99Ms   float64 `json:"send_p99_ms"`
	SendMaxMs   float64 `json:"send_max_ms"`
	CommitP50Ms float64 `json:"commit_p50_ms"`
	CommitP90Ms float64 `json:"commit_p90_ms"`
	CommitP99Ms float64 `json:"commit_p99_ms"`
	CommitMaxMs float64 `json:"commit_max_ms"`
	WholeP50Ms  float64 `json:"whole_p50_ms"`
	WholeP90Ms  float64 `json:"whole_p90_ms"`
	WholeP99Ms  float64 `json:"whole_p99_ms"`
	WholeMaxMs  float64 `json:"whole_max_ms"`

	// Check-back mode. CheckerLate: the checker registered after the
	// first half's first check was due, so early checks found no
	// producer (they count in ChecksSkipped). Resolved is the group's
	// pending count when the checker registered minus at the end, and
	// CheckSeconds the time from the first check-back received to the
	// pending count reaching 0, seen by polling ListTxn (when it did not
	// reach 0: to the last time it fell). ChecksReceived
	// counts the checks the checker ran, HalvesChecked the distinct
	// halves among them, and ChecksSkipped the checks the broker made
	// and the checker did not run (the SDK runs 16 at once and drops the
	// others, or no checker was registered yet), up to the last check
	// of each half received; LastCheck is the highest check number
	// received, of MaxChecks. Pending is what ListTxn says is left, and
	// Appended how much the topic grew (high watermarks).
	CheckerLate    bool    `json:"checker_late"`
	CheckSeconds   float64 `json:"check_seconds"`
	Resolved       int64   `json:"resolved"`
	ResolvedPerSec float64 `json:"resolved_per_sec"`
	ChecksReceived int64   `json:"checks_received"`
	HalvesChecked  int64   `json:"halves_checked"`
	ChecksSkipped  int64   `json:"checks_skipped"`
	LastCheck      int     `json:"last_check"`
	MaxChecks      int     `json:"max_checks"`
	Pending        int     `json:"pending"`
	Appended       int64   `json:"appended"`
}

func (s *benchHalfSummary) print(w io.Writer) {
	checkAfter := time.Duration(s.CheckAfterMs * float64(time.Millisecond))
	if s.Mode == "check" {
		fmt.Fprintf(w, "half messages on topic %s (%s), group %s: %s store them, then 1 checker commits each at its check-back (first %s after it was stored); %d-byte values\n",
			s.Topic, plural(s.Partitions, "partition"), s.Group, plural(s.Producers, "producer"), checkAfter, s.Size)
		fmt.Fprintf(w, "stored %s in %.2fs: %.0f halves/s (%s)\n", plural(s.Stored, "half message"), s.Seconds, s.StoredPerSec, plural(s.SendErrors, "error"))
	} else {
		fmt.Fprintf(w, "half messages on topic %s (%s), group %s: %s, SendHalf then Commit in a closed loop; %d-byte values\n",
			s.Topic, plural(s.Partitions, "partition"), s.Group, plural(s.Producers, "producer"), s.Size)
		fmt.Fprintf(w, "committed %s in %.2fs: %.0f halves/s, %.2f MB/s (%d stored; failed: %s, %s)\n",
			plural(s.Committed, "half message"), s.Seconds, s.CommittedPerSec, s.CommittedMBPerSec, s.Stored,
			plural(s.SendErrors, "send"), plural(s.CommitErrors, "commit"))
	}
	if s.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", s.FirstError)
	}
	if s.Stored > 0 {
		fmt.Fprintf(w, "latency SendHalf: p50 %.3fms p90 %.3fms p99 %.3fms max %.3fms\n", s.SendP50Ms, s.SendP90Ms, s.SendP99Ms, s.SendMaxMs)
	}
	if s.Committed > 0 {
		fmt.Fprintf(w, "latency Commit:   p50 %.3fms p90 %.3fms p99 %.3fms max %.3fms\n", s.CommitP50Ms, s.CommitP90Ms, s.CommitP99Ms, s.CommitMaxMs)
		fmt.Fprintf(w, "latency both:     p50 %.3fms p90 %.3fms p99 %.3fms max %.3fms\n", s.WholeP50Ms, s.WholeP90Ms, s.WholeP99Ms, s.WholeMaxMs)
	}
	if s.Mode != "check" {
		return
	}
	if s.CheckerLate {
		fmt.Fprintln(w, "warning: storing took longer than --check-after: the first halves were checked before the checker registered (raise --check-after)")
	}
	left := ""
	if s.Pending > 0 {
		left = fmt.Sprintf(" (%d still pending; the time runs to the last one resolved)", s.Pending)
	}
	fmt.Fprintf(w, "resolved %s in %.2fs from the first check-back%s: %.0f halves/s\n", plural(s.Resolved, "half message"), s.CheckSeconds, left, s.ResolvedPerSec)
	fmt.Fprintf(w, "checks: %d received for %s, %d skipped (made by the broker, not run by the checker); highest check %d of %d\n",
		s.ChecksReceived, plural(s.HalvesChecked, "half message"), s.ChecksSkipped, s.LastCheck, s.MaxChecks)
	fmt.Fprintf(w, "left pending: %d; topic grew by %s\n", s.Pending, plural(s.Appended, "record"))
}

// benchHalfStats are the producers' counters: a benchStats per latency
// (SendHalf, Commit, both), each producer recording into its own sinks
// (n counts the calls that succeeded, bytes their values).
type benchHalfStats struct {
	send, commit, whole  *benchStats
	sendErrs, commitErrs benchErrors
}

func newBenchHalfStats() *benchHalfStats {
	return &benchHalfStats{send: newBenchStats(benchValid{}, true), commit: newBenchStats(benchValid{}, true), whole: newBenchStats(benchValid{}, true)}
}

// benchQuantiles returns p50, p90, p99 and max of s's whole run, in ms; the
// caller has run s.collect since the last record.
func benchQuantiles(s *benchStats) (p50, p90, p99, maxV float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.total
	return usToMs(h.ValueAtQuantile(50)), usToMs(h.ValueAtQuantile(90)), usToMs(h.ValueAtQuantile(99)), usToMs(h.Max())
}

// benchRecord counts a call that succeeded after d, for a value of size
// bytes, in k.
func benchRecord(k *benchSink, d time.Duration, size int) {
	us := max(d.Microseconds(), 1)
	k.mu.Lock()
	k.n++
	k.bytes += int64(size)
	_ = k.hist.RecordValue(min(us, k.hist.HighestTrackableValue()))
	k.mu.Unlock()
}

func runBenchHalf(ctx context.Context, hc *benchHalfConfig, progress io.Writer) (*benchHalfSummary, error) {
	admin, err := hc.cf.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	nparts, err := benchTopic(ctx, admin, hc.topic, hc.partitions, 0)
	if err != nil {
		return nil, err
	}
	sum := &benchHalfSummary{
		Mode: "commit", Topic: hc.topic, Partitions: nparts, Group: hc.group, Producers: hc.producers, Size: hc.size,
		CheckAfterMs: float64(hc.checkAfter) / float64(time.Millisecond),
	}
	var hwBefore int64
	if hc.check > 0 {
		sum.Mode = "check"
		// The checker answers for every half of the group: halves left by
		// an earlier run would be resolved too and skew the figures.
		if _, pending, err := admin.ListTxn(ctx, hc.group, 1); err != nil {
			return nil, err
		} else if pending > 0 {
			return nil, fmt.Errorf("producer group %s has %s pending already (see herald txn list --group %s): use another --group, or end them",
				hc.group, plural(pending, "half message"), hc.group)
		}
		if hwBefore, err = benchHighWatermarks(ctx, admin, hc.topic, nparts); err != nil {
			return nil, err
		}
	}

	var clients []*client.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	dial := func() (*client.Client, error) {
		c, err := hc.cf.dial(ctx)
		if err == nil {
			clients = append(clients, c)
		}
		return c, err
	}
	// Every connection is dialled before any producer starts.
	pclients := make([]*client.Client, hc.producers)
	for i := range pclients {
		if pclients[i], err = dial(); err != nil {
			return nil, err
		}
	}

	st := newBenchHalfStats()
	count := hc.count
	if hc.check > 0 {
		count = hc.check
	}
	start := time.Now()
	deadline := start.Add(hc.duration)
	var wg sync.WaitGroup
	for i, c := range pclients {
		n := int64(-1)
		if count > 0 {
			n = count / int64(hc.producers)
			if int64(i) < count%int64(hc.producers) {
				n++
			}
		}
		ks, kc, kw := st.send.newSink(), st.commit.newSink(), st.whole.newSink()
		wg.Add(1)
		go func() {
			defer wg.Done()
			benchHalfLoop(ctx, c, hc, n, deadline, ks, kc, kw, st)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	var tick <-chan time.Time
	if hc.reportInterval > 0 {
		t := time.NewTicker(hc.reportInterval)
		defer t.Stop()
		tick = t.C
	}
	last := time.Now()
	var lastN, lastB int64
wait:
	for {
		select {
		case <-tick:
			now := time.Now()
			el := now.Sub(last).Seconds()
			is, ic := st.send.collect(), st.commit.collect()
			st.whole.collect()
			line := fmt.Sprintf("%6.1fs", now.Sub(start).Seconds())
			if hc.check > 0 {
				line += fmt.Sprintf("  stored %8.0f/s  send p50 %.2fms p99 %.2fms max %.2fms", float64(is.consumed-lastN)/el, usToMs(is.p50), usToMs(is.p99), usToMs(is.maxV))
				lastN = is.consumed
			} else {
				line += fmt.Sprintf("  committed %8.0f/s %8.2f MB/s  send p50 %.2fms p99 %.2fms  commit p50 %.2fms p99 %.2fms",
					float64(ic.consumed-lastN)/el, float64(ic.bytes-lastB)/el/1e6, usToMs(is.p50), usToMs(is.p99), usToMs(ic.p50), usToMs(ic.p99))
				lastN, lastB = ic.consumed, ic.bytes
			}
			fmt.Fprintf(progress, "%s  errors %d\n", line, st.sendErrs.n.Load()+st.commitErrs.n.Load())
			last = now
		case <-done:
			break wait
		}
	}
	elapsed := time.Since(start)
	is, ic := st.send.collect(), st.commit.collect()
	st.whole.collect()
	sum.Seconds = elapsed.Seconds()
	sum.Stored, sum.Committed = is.consumed, ic.consumed
	sum.StoredPerSec = perSec(float64(sum.Stored), sum.Seconds)
	sum.CommittedPerSec = perSec(float64(sum.Committed), sum.Seconds)
	sum.CommittedMBPerSec = perSec(float64(ic.bytes)/1e6, sum.Seconds)
	sum.SendErrors, sum.CommitErrors = st.sendErrs.n.Load(), st.commitErrs.n.Load()
	if sum.FirstError = st.sendErrs.firstText(); sum.FirstError == "" {
		sum.FirstError = st.commitErrs.firstText()
	}
	sum.SendP50Ms, sum.SendP90Ms, sum.SendP99Ms, sum.SendMaxMs = benchQuantiles(st.send)
	sum.CommitP50Ms, sum.CommitP90Ms, sum.CommitP99Ms, sum.CommitMaxMs = benchQuantiles(st.commit)
	sum.WholeP50Ms, sum.WholeP90Ms, sum.WholeP99Ms, sum.WholeMaxMs = benchQuantiles(st.whole)
	if hc.check == 0 || ctx.Err() != nil {
		return sum, nil
	}
	for _, c := range pclients {
		c.Close() // idle from now on
	}
	return sum, runBenchHalfChecks(ctx, hc, progress, admin, dial, sum, start, hwBefore)
}

// benchHalfLoop runs one producer: n halves (n >= 0), or halves until
// deadline, one at a time: SendHalf, then (without --check) Commit. Calls
// interrupted by ctx are not counted.
func benchHalfLoop(ctx context.Context, c *client.Client, hc *benchHalfConfig, n int64, deadline time.Time, ks, kc, kw *benchSink, st *benchHalfStats) {
	payload := make([]byte, hc.size)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	// SendHalf has encoded msg when it returns: it may be sent again.
	msg := &client.Message{Topic: hc.topic, Value: payload}
	opt := hc.options()
	for seq := int64(0); n < 0 || seq < n; seq++ {
		if n < 0 && !time.Now().Before(deadline) {
			return
		}
		t0 := time.Now()
		h, err := c.SendHalf(ctx, msg, opt)
		t1 := time.Now()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			st.sendErrs.add(err)
			time.Sleep(time.Millisecond) // no hot loop against a failing broker
			continue
		}
		benchRecord(ks, t1.Sub(t0), hc.size)
		if hc.check > 0 {
			continue
		}
		end, err := h.Commit(ctx)
		t2 := time.Now()
		if ctx.Err() != nil {
			return
		}
		if err == nil && end.Offset < 0 {
			err = fmt.Errorf("half %s: committed but not appended (offset %d)", h.ID, end.Offset)
		}
		if err != nil {
			st.commitErrs.add(fmt.Errorf("commit: %w", err))
			time.Sleep(time.Millisecond)
			continue
		}
		benchRecord(kc, t2.Sub(t1), hc.size)
		benchRecord(kw, t2.Sub(t0), hc.size)
	}
}

// benchChecker is the check-back mode's TransactionChecker: it answers
// commit to every check and notes, per half, how many checks it ran and
// the highest check number among them.
type benchChecker struct {
	mu        sync.Mutex
	first     time.Time // when the first check arrived
	checks    int64
	halves    map[string]*benchChecked
	maxChecks int
}

type benchChecked struct{ ran, last int }

func (b *benchChecker) check(_ context.Context, hc *client.HalfCheck) client.HalfAction {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.checks == 0 {
		b.first = now
	}
	b.checks++
	h := b.halves[hc.ID]
	if h == nil {
		h = &benchChecked{}
		b.halves[hc.ID] = h
	}
	h.ran++
	h.last = max(h.last, hc.Check)
	b.maxChecks = hc.MaxChecks
	return client.HalfCommit
}

// answered returns the number of distinct halves checked.
func (b *benchChecker) answered() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.halves)
}

// runBenchHalfChecks is the second half of --check: it registers one
// TransactionChecker on a connection of its own, and polls the group's
// pending count until it reaches 0, or has not fallen for
// --drain-timeout. It fills the check-back fields of sum.
func runBenchHalfChecks(ctx context.Context, hc *benchHalfConfig, progress io.Writer, admin *client.Client, dial func() (*client.Client, error),
	sum *benchHalfSummary, start time.Time, hwBefore int64) error {
	_, before, err := admin.ListTxn(ctx, hc.group, 1)
	if err != nil {
		return err
	}
	cc, err := dial()
	if err != nil {
		return err
	}
	bk := &benchChecker{halves: map[string]*benchChecked{}}
	stop, err := cc.RegisterTransactionChecker(ctx, hc.group, bk.check)
	if err != nil {
		return fmt.Errorf("registering the transaction checker: %w", err)
	}
	defer stop()
	registered := time.Now()
	sum.CheckerLate = registered.After(start.Add(hc.checkAfter))

	var tick <-chan time.Time
	if hc.reportInterval > 0 {
		t := time.NewTicker(hc.reportInterval)
		defer t.Stop()
		tick = t.C
	}
	poll := time.NewTimer(0)
	defer poll.Stop()
	pending, progressAt := before, time.Now()
	lastAt, lastPending, lastChecks := registered, before, int64(0)
	var end, fell time.Time // pending reached 0; last fell
	for gaveUp := false; ctx.Err() == nil && end.IsZero() && !gaveUp; {
		select {
		case <-tick:
			now := time.Now()
			el := now.Sub(lastAt).Seconds()
			bk.mu.Lock()
			checks := bk.checks
			bk.mu.Unlock()
			fmt.Fprintf(progress, "%6.1fs  checks %8.0f/s  resolved %8.0f/s  pending %d\n",
				now.Sub(registered).Seconds(), float64(checks-lastChecks)/el, float64(lastPending-pending)/el, pending)
			lastAt, lastPending, lastChecks = now, pending, checks
			continue
		case <-poll.C:
		case <-ctx.Done():
			continue
		}
		_, n, err := admin.ListTxn(ctx, hc.group, 1)
		now := time.Now()
		switch {
		case err != nil && ctx.Err() == nil && !client.IsRetryable(err):
			return err
		case err != nil:
		case n == 0:
			end = now
		case n < pending:
			pending, progressAt, fell = n, now, now
		}
		gaveUp = end.IsZero() && now.Sub(progressAt) >= hc.drainTimeout
		if bk.answered() >= before {
			poll.Reset(benchHalfPollFast)
		} else {
			poll.Reset(benchHalfPollSlow)
		}
	}
	stop()

	bk.mu.Lock()
	first := bk.first
	sum.ChecksReceived, sum.HalvesChecked, sum.MaxChecks = bk.checks, int64(len(bk.halves)), bk.maxChecks
	for _, h := range bk.halves {
		sum.ChecksSkipped += int64(h.last - h.ran)
		sum.LastCheck = max(sum.LastCheck, h.last)
	}
	bk.mu.Unlock()

	// What is left, and what was appended: a committed half is appended
	// before its commit is answered, but the high watermark of a
	// replicated partition may follow a little later.
	vctx, cancel := context.WithTimeout(context.Background(), max(hc.cf.timeout, 5*time.Second))
	defer cancel()
	if _, sum.Pending, err = admin.ListTxn(vctx, hc.group, 1); err != nil {
		return err
	}
	sum.Resolved = int64(max(before-sum.Pending, 0))
	for wait := time.Now().Add(2 * time.Second); ; {
		hw, err := benchHighWatermarks(vctx, admin, hc.topic, sum.Partitions)
		if err != nil {
			return err
		}
		sum.Appended = hw - hwBefore
		if sum.Appended >= sum.Resolved || time.Now().After(wait) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !end.IsZero() {
		fell = end
	}
	if !first.IsZero() && fell.After(first) {
		sum.CheckSeconds = fell.Sub(first).Seconds()
		sum.ResolvedPerSec = perSec(float64(sum.Resolved), sum.CheckSeconds)
	}
	return nil
}

// benchHighWatermarks returns the sum of the high watermarks of topic's
// partitions 0 to n-1.
func benchHighWatermarks(ctx context.Context, c *client.Client, topic string, n int) (int64, error) {
	var sum int64
	for p := 0; p < n; p++ {
		o, err := c.ListOffsets(ctx, topic, int32(p), client.OffsetLatest, time.Time{})
		if err != nil {
			return 0, err
		}
		sum += o.HighWatermark
	}
	return sum, nil
}
