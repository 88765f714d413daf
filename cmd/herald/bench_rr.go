package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/heraldmq/herald/client"
)

// benchRRConfig is the configuration of "herald bench rr".
type benchRRConfig struct {
	cf             *cliFlags
	responders     int
	clients        int
	size           int
	concurrency    int
	window         int
	rate           float64
	duration       time.Duration
	count          int64
	topic          string
	group          string
	reportInterval time.Duration
	json           bool
}

// benchRRStamp is the prefix of every request value: the caller's id (high
// bits) and sequence number (low benchSeqBits bits), so that a caller can
// tell that a reply echoes its own request.
const benchRRStamp = 8

// benchRRCmd runs "herald bench rr": --responders responders (client.Respond,
// one shared group, each on its own connection) echo the requests that
// --clients callers (client.Request, each on its own connection) send in a
// closed loop, or paced to --rate in total. It reports calls/s and the
// round-trip time.
func benchRRCmd(ctx context.Context, args []string, io cliIO) error {
	fs, cf := newCLIFlagSet("bench rr", io.err)
	benchUsage(fs, "herald bench rr [flags]\n  request-reply: responders echo the requests of callers, which measure the round trip")
	rc := benchRRConfig{cf: cf}
	fs.IntVar(&rc.responders, "responders", 1, "responders, each with its own connection, in one shared group")
	fs.IntVar(&rc.clients, "clients", 1, "callers, each with its own connection and one call outstanding")
	fs.IntVar(&rc.size, "size", 100, "request payload in bytes (at least 8; the reply echoes it)")
	fs.IntVar(&rc.concurrency, "concurrency", 1, "handler goroutines per responder")
	fs.IntVar(&rc.window, "window", benchDefaultWindow, "credits per responder: requests delivered and not yet answered, at most")
	fs.Float64Var(&rc.rate, "rate", 0, "aggregate call rate in calls/s; RTT counts from each call's scheduled time (0 = closed loop)")
	fs.DurationVar(&rc.duration, "duration", 10*time.Second, "how long to call (ignored with --count)")
	fs.Int64Var(&rc.count, "count", 0, "make this many calls in total instead of running for --duration")
	fs.StringVar(&rc.topic, "topic", "herald-bench-rr", "request topic (created with 1 partition if missing)")
	fs.StringVar(&rc.group, "group", "herald-bench-rr", "the responders' group")
	fs.DurationVar(&rc.reportInterval, "report-interval", time.Second, "progress line interval (0 = none)")
	fs.BoolVar(&rc.json, "json", false, "print the final summary as JSON on stdout (progress goes to stderr)")
	if err := parseCLIFlags(fs, args); err != nil {
		return err
	}
	switch {
	case rc.responders < 1:
		return usagef("--responders must be at least 1")
	case rc.clients < 1:
		return usagef("--clients must be at least 1")
	case rc.size < benchRRStamp:
		return usagef("--size must be at least %d (the caller and sequence stamp)", benchRRStamp)
	case rc.concurrency < 1 || rc.concurrency > client.MaxWindow:
		return usagef("--concurrency must be between 1 and %d", client.MaxWindow)
	case rc.window < 1 || rc.window > client.MaxWindow:
		return usagef("--window must be between 1 and %d", client.MaxWindow)
	case rc.rate < 0, rc.count < 0, rc.duration <= 0 && rc.count == 0:
		return usagef("--rate and --count must not be negative, and --duration must be positive without --count")
	case rc.topic == "" || rc.group == "":
		return usagef("--topic and --group must not be empty")
	}
	sum, err := runReported(io, rc.json, func(progress progressWriter) (*benchRRSummary, error) {
		s, err := runBenchRR(ctx, &rc, progress)
		return s, cliTopicErr(err, rc.topic, 1)
	})
	if err != nil {
		return err
	}
	if sum.Errors > 0 && ctx.Err() == nil {
		return fmt.Errorf("%s failed, first: %s", plural(sum.Errors, "call"), sum.FirstError)
	}
	return nil
}

// benchRRSummary is the final report of "herald bench rr" (--json prints
// it as is).
type benchRRSummary struct {
	Topic       string  `json:"topic"`
	Group       string  `json:"group"`
	Responders  int     `json:"responders"`
	Clients     int     `json:"clients"`
	Concurrency int     `json:"concurrency"`
	Window      int     `json:"window"`
	Size        int     `json:"size_bytes"`
	Rate        float64 `json:"target_rate"`
	Seconds     float64 `json:"seconds"`
	// Calls counts the calls answered with their own request echoed;
	// Errors the others (failed, or a wrong reply).
	Calls               int64   `json:"calls"`
	CallsPerSec         float64 `json:"calls_per_sec"`
	Errors              int64   `json:"errors"`
	FirstError          string  `json:"first_error,omitempty"`
	ResponderErrors     int64   `json:"responder_errors"`
	FirstResponderError string  `json:"first_responder_error,omitempty"`
	RTTP50Ms            float64 `json:"rtt_p50_ms"`
	RTTP90Ms            float64 `json:"rtt_p90_ms"`
	RTTP99Ms            float64 `json:"rtt_p99_ms"`
	RTTP999Ms           float64 `json:"rtt_p999_ms"`
	RTTMaxMs            float64 `json:"rtt_max_ms"`
}

func (s *benchRRSummary) print(w io.Writer) {
	loop := "closed loop"
	if s.Rate > 0 {
		loop = fmt.Sprintf("%.0f calls/s in total", s.Rate)
	}
	fmt.Fprintf(w, "request-reply on topic %s: %s (group %s, concurrency %d, window %d), %s (%s), %d-byte requests\n",
		s.Topic, plural(s.Responders, "responder"), s.Group, s.Concurrency, s.Window, plural(s.Clients, "client"), loop, s.Size)
	fmt.Fprintf(w, "calls %d in %.2fs: %.0f calls/s (%s, %s)\n", s.Calls, s.Seconds, s.CallsPerSec, plural(s.Errors, "error"), plural(s.ResponderErrors, "responder error"))
	if s.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", s.FirstError)
	}
	if s.FirstResponderError != "" {
		fmt.Fprintf(w, "first responder error: %s\n", s.FirstResponderError)
	}
	if s.Calls == 0 {
		fmt.Fprintln(w, "rtt: none measured (no call answered)")
		return
	}
	fmt.Fprintf(w, "rtt: p50 %.3fms p90 %.3fms p99 %.3fms p99.9 %.3fms max %.3fms\n", s.RTTP50Ms, s.RTTP90Ms, s.RTTP99Ms, s.RTTP999Ms, s.RTTMaxMs)
}

func runBenchRR(ctx context.Context, rc *benchRRConfig, progress io.Writer) (*benchRRSummary, error) {
	admin, err := rc.cf.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if _, err := benchTopic(ctx, admin, rc.topic, 1, 0); err != nil {
		return nil, err
	}
	var clients []*client.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	dial := func() (*client.Client, error) {
		c, err := rc.cf.dial(ctx)
		if err == nil {
			clients = append(clients, c)
		}
		return c, err
	}

	// Responders echo each request's value.
	var respErrs, callErrs benchErrors
	echo := func(_ context.Context, req *client.Delivered) (*client.Message, error) {
		return &client.Message{Value: req.Value}, nil
	}
	var subs []*client.Subscription
	closeResponders := func() {
		cctx, cancel := context.WithTimeout(context.Background(), max(rc.cf.timeout, 5*time.Second))
		defer cancel()
		var wg sync.WaitGroup
		for _, sub := range subs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := sub.Close(cctx); err != nil {
					respErrs.add(fmt.Errorf("close responder: %w", err))
				}
			}()
		}
		wg.Wait()
		subs = nil
	}
	defer closeResponders()
	for i := 0; i < rc.responders; i++ {
		c, err := dial()
		if err != nil {
			return nil, err
		}
		sub, err := c.Respond(ctx, rc.topic, rc.group, echo, func(o *client.SubscribeOptions) {
			o.Concurrency, o.Window, o.Name = rc.concurrency, rc.window, fmt.Sprintf("herald-bench-rr-%d", i)
			o.OnError = func(err error) { respErrs.add(fmt.Errorf("responder %d: %w", i, err)) }
		})
		if err != nil {
			return nil, fmt.Errorf("responder %d: %w", i, err)
		}
		subs = append(subs, sub)
	}

	// Callers, each with its own sink (calls counted as consumed).
	stats := newBenchStats(benchValid{}, true)
	callers := make([]*client.Client, rc.clients)
	for i := range callers {
		if callers[i], err = dial(); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	deadline := start.Add(rc.duration)
	var wg sync.WaitGroup
	for i, c := range callers {
		n := int64(-1)
		if rc.count > 0 {
			n = rc.count / int64(rc.clients)
			if int64(i) < rc.count%int64(rc.clients) {
				n++
			}
		}
		k := stats.newSink()
		wg.Add(1)
		go func() {
			defer wg.Done()
			benchCall(ctx, c, rc, i, n, start, deadline, k, &callErrs)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	var tick <-chan time.Time
	if rc.reportInterval > 0 {
		t := time.NewTicker(rc.reportInterval)
		defer t.Stop()
		tick = t.C
	}
	last := time.Now()
	var lastCalls int64
wait:
	for {
		select {
		case <-tick:
			now := time.Now()
			iv := stats.collect()
			fmt.Fprintf(progress, "%6.1fs  calls %8.0f/s  rtt p50 %.2fms p90 %.2fms p99 %.2fms p99.9 %.2fms max %.2fms  errors %d\n",
				now.Sub(start).Seconds(), float64(iv.consumed-lastCalls)/now.Sub(last).Seconds(),
				usToMs(iv.p50), usToMs(iv.p90), usToMs(iv.p99), usToMs(iv.p999), usToMs(iv.maxV), callErrs.n.Load()+respErrs.n.Load())
			last, lastCalls = now, iv.consumed
		case <-done:
			break wait
		}
	}
	elapsed := time.Since(start)
	closeResponders()

	iv := stats.collect()
	sum := &benchRRSummary{
		Topic: rc.topic, Group: rc.group, Responders: rc.responders, Clients: rc.clients, Concurrency: rc.concurrency,
		Window: rc.window, Size: rc.size, Rate: rc.rate, Seconds: elapsed.Seconds(),
		Calls: iv.consumed, Errors: callErrs.n.Load(), FirstError: callErrs.firstText(),
		ResponderErrors: respErrs.n.Load(), FirstResponderError: respErrs.firstText(),
	}
	sum.CallsPerSec = perSec(float64(sum.Calls), sum.Seconds)
	stats.mu.Lock()
	h := stats.total
	sum.RTTP50Ms, sum.RTTP90Ms, sum.RTTP99Ms = usToMs(h.ValueAtQuantile(50)), usToMs(h.ValueAtQuantile(90)), usToMs(h.ValueAtQuantile(99))
	sum.RTTP999Ms, sum.RTTMaxMs = usToMs(h.ValueAtQuantile(99.9)), usToMs(h.Max())
	stats.mu.Unlock()
	return sum, nil
}

// benchCall runs caller id: n calls (n >= 0), or calls until deadline, one
// at a time. Under --rate it paces to its share of the rate, offset from
// the other callers, and measures each call from its scheduled time, so a
// late call's wait counts (no coordinated omission); a call that is late
// starts at once. Calls interrupted by ctx are not counted.
func benchCall(ctx context.Context, c *client.Client, rc *benchRRConfig, id int, n int64, start, deadline time.Time, k *benchSink, errs *benchErrors) {
	payload := make([]byte, rc.size)
	for i := benchRRStamp; i < len(payload); i++ {
		payload[i] = byte('a' + i%26)
	}
	msg := &client.Message{Value: payload}
	var interval time.Duration
	if rc.rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(rc.clients) / rc.rate)
	}
	offset := interval * time.Duration(id) / time.Duration(rc.clients)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for seq := int64(0); n < 0 || seq < n; seq++ {
		sched := time.Now()
		if interval > 0 {
			sched = start.Add(offset + time.Duration(seq)*interval)
		}
		if n < 0 && !sched.Before(deadline) {
			return
		}
		if d := time.Until(sched); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return
			}
		}
		// Request has encoded msg when it returns: the payload may be
		// rewritten for the next call.
		binary.BigEndian.PutUint64(payload, uint64(id)<<benchSeqBits|uint64(seq))
		reply, err := c.Request(ctx, rc.topic, msg)
		now := time.Now()
		if ctx.Err() != nil {
			return
		}
		if err == nil && !bytes.Equal(reply.Value, payload) {
			err = fmt.Errorf("caller %d: reply to call %d does not echo it", id, seq)
		}
		if err != nil {
			errs.add(err)
			if interval == 0 {
				time.Sleep(time.Millisecond) // no hot loop against a failing broker
			}
			continue
		}
		us := max(now.Sub(sched).Microseconds(), 1)
		k.mu.Lock()
		k.n++
		k.bytes += int64(len(payload))
		_ = k.hist.RecordValue(min(us, k.hist.HighestTrackableValue()))
		k.mu.Unlock()
	}
}
