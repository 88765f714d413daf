package e2e

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

func headerOf(m *client.Message, k string) string {
	v := ""
	for _, h := range m.Headers {
		if h.Key == k {
			v = string(h.Value) // the last wins, as the broker appends its own
		}
	}
	return v
}

var scheduledLine = regexp.MustCompile(`^scheduled (\d+) for (\S+) \(partition (\d+)\)$`)

// TestDelayedProduceAcrossRestart is the acceptance scenario with
// the real binary: produce --delay, see nothing until the time, restart
// the broker in between, then get the message exactly once, not early.
func TestDelayedProduceAcrossRestart(t *testing.T) {
	n := startProc(t, t.TempDir())
	run := func(stdin string, want int, args ...string) (string, string) {
		t.Helper()
		out, errs, code := herald(t, stdin, append(args, "--addr="+n.Addr())...)
		if code != want {
			t.Fatalf("herald %v: exit %d, want %d\nstdout: %s\nstderr: %s", args, code, want, out, errs)
		}
		return out, errs
	}
	run("", 0, "topic", "create", "t", "--partitions", "2")
	out, _ := run("hello\n", 0, "produce", "--topic", "t", "--delay", "3s")
	m := scheduledLine.FindStringSubmatch(strings.TrimSpace(out))
	if m == nil {
		t.Fatalf("produce --delay printed %q", out)
	}
	id := m[1]
	at, err := time.Parse(time.RFC3339Nano, m[2])
	if err != nil {
		t.Fatal(err)
	}
	if list, _ := run("", 0, "schedule", "list", "--topic", "t"); !strings.Contains(list, id) {
		t.Fatalf("schedule list lacks %s:\n%s", id, list)
	}
	n.Stop(t)
	n.Start(t)
	c := dial(t, n)
	read := func() []*client.Message {
		return append(readPartition(t, c, "t", 0), readPartition(t, c, "t", 1)...)
	}
	if got := read(); len(got) != 0 {
		if time.Now().Before(at) {
			t.Fatalf("delayed message visible %v early: %v", time.Until(at), got)
		}
	}
	var got []*client.Message
	checkFor(t, 15*time.Second, "the delayed message", func() error {
		if got = read(); len(got) == 0 {
			return fmt.Errorf("not yet (due %v)", at)
		}
		return nil
	})
	// One more delayed message after it, so that a duplicate would show.
	run("sentinel\n", 0, "produce", "--topic", "t", "--delay", "1ms")
	checkFor(t, 15*time.Second, "the sentinel", func() error {
		if got = read(); len(got) < 2 {
			return fmt.Errorf("%d records", len(got))
		}
		return nil
	})
	if len(got) != 2 || string(got[0].Value) != "hello" && string(got[1].Value) != "hello" {
		t.Fatalf("records after the fire: %d, want hello once and the sentinel", len(got))
	}
	for _, r := range got {
		if string(r.Value) != "hello" {
			continue
		}
		if r.Timestamp.Before(at) {
			t.Fatalf("appended at %v, before its time %v", r.Timestamp, at)
		}
		if headerOf(r, "herald-schedule-id") != id {
			t.Fatalf("herald-schedule-id %q, want %s", headerOf(r, "herald-schedule-id"), id)
		}
	}
	if _, errs, code := herald(t, "", "schedule", "cancel", id, "--addr="+n.Addr()); code != 1 || !strings.Contains(errs, "SCHEDULE_NOT_FOUND") {
		t.Fatalf("cancel after the fire: exit %d, %q", code, errs)
	}
}

// TestScheduleCancelAndList: a cancelled message never appears; list shows
// pending ones earliest first; bad ids are refused.
func TestScheduleCancelAndList(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "t", 1)
	ctx := ctxT(t, 30*time.Second)
	p := c.NewProducer()
	defer p.Close(ctx)
	send := func(v string, d time.Duration) client.Result {
		r, err := p.Send(ctx, &client.Message{Topic: "t", Value: []byte(v), Delay: d})
		if err != nil {
			t.Fatal(err)
		}
		if r.ScheduleID == "" || r.Offset != -1 {
			t.Fatalf("delayed send result %+v", r)
		}
		return r
	}
	// Times beyond the scheduler's 1 s lead: a batch within it is already
	// being delivered, so it is neither listed nor cancellable.
	doomed := send("doomed", 2500*time.Millisecond)
	later := send("later", 2900*time.Millisecond)
	first := send("first", 2100*time.Millisecond)
	items, pending, err := c.ListScheduled(ctx, "t", 10)
	if err != nil || pending != 3 || len(items) != 3 || items[0].Id != first.ScheduleID || items[1].Id != doomed.ScheduleID || items[2].Id != later.ScheduleID {
		t.Fatalf("list: %v pending=%d err=%v", items, pending, err)
	}
	if err := c.CancelScheduled(ctx, doomed.ScheduleID); err != nil {
		t.Fatal(err)
	}
	if err := c.CancelScheduled(ctx, doomed.ScheduleID); !isCode(err, heraldpb.ErrorCode_SCHEDULE_NOT_FOUND) {
		t.Fatalf("second cancel: %v", err)
	}
	if err := c.CancelScheduled(ctx, "x1"); !isCode(err, heraldpb.ErrorCode_INVALID_REQUEST) {
		t.Fatalf("bad id: %v", err)
	}
	// "later" is due after "doomed": once it is there, doomed would be too.
	var got []*client.Message
	checkFor(t, 15*time.Second, "later", func() error {
		got = readPartition(t, c, "t", 0)
		for _, m := range got {
			if string(m.Value) == "later" {
				return nil
			}
		}
		return fmt.Errorf("%d records", len(got))
	})
	var vals []string
	for _, m := range got {
		vals = append(vals, string(m.Value))
	}
	if strings.Join(vals, ",") != "first,later" {
		t.Fatalf("topic holds %v, want first,later", vals)
	}
	if _, pending, _ := c.ListScheduled(ctx, "", 10); pending != 0 {
		t.Fatalf("%d still pending", pending)
	}
	// Bad delayed produces get typed errors.
	for _, m := range []*client.Message{
		{Topic: "missing", Value: []byte("x"), Delay: time.Second},
		{Topic: "t", Value: []byte("x"), Delay: 400 * 24 * time.Hour},
		{Topic: "t", Value: []byte("x"), Delay: time.Second, DeliverAt: time.Now()},
	} {
		if _, err := p.Send(ctx, m); err == nil {
			t.Errorf("delayed send %+v accepted", m)
		}
	}
}

// TestDelayedBrokerKilledMidFire SIGKILLs the broker while it fires
// delayed messages, restarts it, and checks every acknowledged delayed
// message arrives exactly once and never before its time; those whose
// time passed while the broker was down fire at once after the restart.
func TestDelayedBrokerKilledMidFire(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	createTopic(t, c, "t", 2)
	ctx := ctxT(t, 60*time.Second)
	const total = 3000
	start := time.Now()
	due := sendDelayed(ctx, t, c, total, func(i int) time.Duration { return time.Duration(i%1500)*time.Millisecond + time.Millisecond })
	sendTook := time.Since(start)
	if acked := len(due); acked != total {
		t.Fatalf("%d of %d delayed sends acknowledged", acked, total)
	}
	// Kill it while about half are due.
	for time.Since(start) < 800*time.Millisecond {
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%d delayed sends acknowledged in %v; killing at %v", total, sendTook.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	n.Kill(t)
	downUntil := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(downUntil) {
		time.Sleep(10 * time.Millisecond) // the clock must pass: overdue ones are the point
	}
	n.Start(t)
	c = dial(t, n)
	var got []*client.Message
	checkFor(t, 30*time.Second, "every delayed message", func() error {
		got = append(readPartition(t, c, "t", 0), readPartition(t, c, "t", 1)...)
		if len(got) < total {
			return fmt.Errorf("%d of %d", len(got), total)
		}
		return nil
	})
	seen := map[string]int{}
	for _, m := range got {
		v := string(m.Value)
		seen[v]++
		at, ok := due[v]
		if !ok {
			t.Fatalf("unexpected record %q", v)
		}
		if m.Timestamp.Before(at) {
			t.Fatalf("%s appended at %v, %v before its time", v, m.Timestamp, at.Sub(m.Timestamp))
		}
	}
	for v, k := range seen {
		if k != 1 {
			t.Errorf("%s appended %d times", v, k)
		}
	}
	if len(seen) != total {
		t.Fatalf("%d distinct of %d", len(seen), total)
	}
}

// TestDelayedNeverReadableEarly: delayed messages are appended ahead of
// their time (--schedule-ahead) but held unreadable until it: consumers
// long-polling every partition receive each exactly once, never before
// its time.
func TestDelayedNeverReadableEarly(t *testing.T) {
	n := startProc(t, t.TempDir(), "--schedule-ahead=200ms")
	c := dial(t, n)
	createTopic(t, c, "t", 2)
	ctx := ctxT(t, 60*time.Second)
	const total = 2000
	due := sendDelayed(ctx, t, c, total, func(i int) time.Duration { return time.Duration(300+i%1200) * time.Millisecond })
	type seen struct {
		at    time.Time
		count int
	}
	var got sync.Map
	var wg sync.WaitGroup
	var failed atomic.Value
	for part := int32(0); part < 2; part++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := int64(0)
			for ctx.Err() == nil {
				res, err := c.Fetch(ctx, "t", part, next, 1<<20, 200*time.Millisecond)
				now := time.Now()
				if err != nil {
					failed.Store(err)
					return
				}
				for _, m := range res.Messages {
					s, _ := got.LoadOrStore(string(m.Value), &seen{at: now})
					s.(*seen).count++
				}
				next = res.NextOffset
				n := 0
				got.Range(func(any, any) bool { n++; return true })
				if n >= total {
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatal(err)
	}
	var late []time.Duration
	for v, at := range due {
		s, ok := got.Load(v)
		if !ok {
			t.Fatalf("%s never delivered", v)
		}
		r := s.(*seen)
		if r.count != 1 {
			t.Errorf("%s delivered %d times", v, r.count)
		}
		// The broker's clock is this machine's; deliver-at has ms precision.
		if r.at.Before(at) {
			t.Fatalf("%s readable %v before its time", v, at.Sub(r.at))
		}
		late = append(late, r.at.Sub(at))
	}
	slices.Sort(late)
	t.Logf("%d delayed messages, none early; lateness to a long-polling reader: p50 %v, p99 %v, max %v",
		len(late), late[len(late)/2], late[len(late)*99/100], late[len(late)-1])
}

// sendDelayed sends total delayed messages d-00000... to topic t (keys
// spread over 7 values), message i with delay(i), and returns the
// deliver-at time of each one acknowledged.
func sendDelayed(ctx context.Context, t *testing.T, c *client.Client, total int, delay func(i int) time.Duration) map[string]time.Time {
	t.Helper()
	p := c.NewProducer()
	var mu sync.Mutex
	due := map[string]time.Time{}
	for i := range total {
		v := fmt.Sprintf("d-%05d", i)
		p.SendAsync(ctx, &client.Message{Topic: "t", Key: []byte(strconv.Itoa(i % 7)), Value: []byte(v), Delay: delay(i)}, func(r client.Result, err error) {
			if err == nil {
				mu.Lock()
				due[v] = r.DeliverAt
				mu.Unlock()
			}
		})
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	p.Close(ctx)
	mu.Lock()
	defer mu.Unlock()
	return due
}
