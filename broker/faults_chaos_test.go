//go:build chaos

package broker

// The chaos build's /debug/faults (internal/faults) against a broker in
// this process: run with `go test -tags chaos ./broker/ -run Chaos`. The
// fault state is the process's, so these tests clear it when they end and
// do not run in parallel.

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/internal/faults"
	heraldpb "github.com/heraldmq/herald/proto"
	"google.golang.org/protobuf/proto"
)

// startChaosBroker starts a broker with its admin listener and clears the
// faults when the test ends.
func startChaosBroker(t *testing.T) (*Broker, *wire) {
	t.Helper()
	cfg := Default()
	cfg.DataDir, cfg.Listen, cfg.Admin = t.TempDir(), "127.0.0.1:0", "127.0.0.1:0"
	b, err := Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		setFaults(t, b, `{"clear":true}`)
		b.Shutdown()
	})
	return b, dialWire(t, b.ClientAddr())
}

// callFaults sends a request to /debug/faults and returns the status code
// and body.
func callFaults(t *testing.T, b *Broker, method, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+b.AdminAddr()+faults.Path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// setFaults POSTs body and returns the new state (GET with body "").
func setFaults(t *testing.T, b *Broker, body string) faults.Status {
	t.Helper()
	method := http.MethodPost
	if body == "" {
		method = http.MethodGet
	}
	code, raw := callFaults(t, b, method, body)
	if code != http.StatusOK {
		t.Fatalf("%s %s %s: %d %s", method, faults.Path, body, code, raw)
	}
	var st faults.Status
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		t.Fatalf("status %s: %v", raw, err)
	}
	return st
}

// pollFor polls cond until it returns nil or d has passed.
func pollFor(t *testing.T, d time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fetchBatches reads partition 0 of topic from offset 0 once.
func fetchBatches(w *wire, topic string) ([]*heraldpb.StoredBatch, *heraldpb.Error) {
	r := w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{Topic: topic, Partition: 0, MaxBytes: 1 << 20}}})
	if e := r.GetError(); e != nil {
		return nil, e
	}
	return r.GetFetchResponse().GetBatches(), nil
}

func values(t *testing.T, bs []*heraldpb.StoredBatch) []string {
	t.Helper()
	var out []string
	for _, b := range bs {
		var rb heraldpb.RecordBatch
		if err := proto.Unmarshal(b.Records, &rb); err != nil {
			t.Fatal(err)
		}
		for _, r := range rb.Records {
			out = append(out, string(r.Value))
		}
	}
	return out
}

func produceOnce(w *wire, topic, value string) *heraldpb.Frame {
	raw, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte(value)}}})
	return w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: topic, Partition: proto.Uint32(0), Records: raw}}})
}

// A delayed message's time is the scheduler's, which a step of its
// node's wall clock does not move (the chaos build's offset steps the wall
// clock only, as NTP does): with the clock stepped back 10 s and then a
// minute forward while it waits, it becomes readable at its time in real
// time, neither early (it came at once after the forward jump when the
// scheduler read its time off the wall clock) nor the 10 s late the step
// back made it.
func TestChaosClockJumpDelayed(t *testing.T) {
	const delay = 3 * time.Second
	b, w := startChaosBroker(t)
	newTopic(t, w, "d", 1)
	raw, _ := proto.Marshal(&heraldpb.RecordBatch{Records: []*heraldpb.Record{{Value: []byte("later")}}})
	var sent time.Time
	checkFor(t, func() error { // the scheduler may still be loading
		sent = time.Now()
		r := w.call(&heraldpb.Frame{Body: &heraldpb.Frame_Produce{Produce: &heraldpb.ProduceRequest{Topic: "d", Partition: proto.Uint32(0), DelayMs: uint64(delay / time.Millisecond), Records: raw}}})
		if e := r.GetError(); e != nil {
			if !e.Retriable {
				t.Fatalf("delayed produce: %v", e)
			}
			return e
		}
		return nil
	})
	// In real time (monotonic, which the steps do not move): its time is
	// rounded down to its millisecond.
	due := sent.Add(delay - time.Millisecond)
	notYet := func(until time.Time, clock string) {
		t.Helper()
		for time.Now().Before(until) {
			bs, e := fetchBatches(w, "d")
			if e != nil {
				t.Fatalf("fetch: %v", e)
			}
			if len(bs) > 0 && time.Now().Before(due) {
				t.Fatalf("delivered %v before its time, with the clock %s", due.Sub(time.Now()), clock)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if st := setFaults(t, b, `{"clock_offset":"-10s"}`); st.ClockOffset != "-10s" {
		t.Fatalf("status after the jump back: %+v", st)
	}
	notYet(sent.Add(delay/2), "10 s back")
	if st := setFaults(t, b, `{"clock_offset":"1m"}`); st.ClockOffset != "1m0s" {
		t.Fatalf("status after the jump forward: %+v", st)
	}
	notYet(due.Add(-20*time.Millisecond), "1 m ahead")
	var bs []*heraldpb.StoredBatch
	pollFor(t, 10*time.Second, "delivery at its time", func() error {
		var e *heraldpb.Error
		if bs, e = fetchBatches(w, "d"); e != nil {
			return e
		}
		if len(bs) == 0 {
			return fmt.Errorf("not delivered")
		}
		return nil
	})
	got := time.Now()
	if got.Before(due) {
		t.Fatalf("delivered %v before its time, with the clock 1 m ahead", due.Sub(got))
	}
	if late := got.Sub(due); late > time.Second {
		t.Fatalf("delivered %v after its time", late)
	}
	t.Logf("delivered %v after its time", got.Sub(due))
	if v := values(t, bs); len(v) != 1 || v[0] != "later" {
		t.Fatalf("topic holds %q", v)
	}
}

// A nacked message's retry follows the clock like a delayed message: not
// redelivered early when the clock jumps back, at once when it jumps past
// the retry's time (the groups' timers are set through the clock).
func TestChaosClockJumpRetry(t *testing.T) {
	b, w := startChaosBroker(t)
	newTopic(t, w, "jobs", 1)
	produce(t, w, "jobs", 0, 1)
	sub := subscribe(t, w, &heraldpb.SubscribeRequest{Group: "workers", Topic: "jobs", Mode: heraldpb.SubscriptionMode_MODE_SHARED,
		Credits: 10, AckTimeoutMs: 600_000})
	d, _ := nextDelivery(t, w, 10*time.Second)
	nack(t, w, sub, d, proto.Uint32(2000), "later")
	setFaults(t, b, `{"clock_offset":"-10s"}`)
	// Watched for 3 s of real time, a second past the retry's time: by
	// the broker's clock, 9 s before it.
	if got := w.deliveries(1, 3*time.Second); len(got) > 0 {
		t.Fatalf("redelivered with the clock 10 s back, before the retry's time: %v", got)
	}
	jumped := time.Now()
	setFaults(t, b, `{"clock_offset":"1m"}`)
	d, at := nextDelivery(t, w, 10*time.Second)
	// Measured: 1 ms; without the clock re-arming the group's timer, the
	// coordinator's once-a-second stats round found it after 1 s.
	if d.DeliveryCount != 2 || at.Sub(jumped) > 600*time.Millisecond {
		t.Fatalf("redelivery: count %d, %v after the jump forward", d.DeliveryCount, at.Sub(jumped))
	}
}

// fsync errors: produces fail with STORAGE_ERROR and none is
// acknowledged, reads of what was acknowledged before go on, and after
// the fault is cleared the partition reopens its log and takes writes
// again, as after any storage failure, with nothing acknowledged lost.
func TestChaosFsyncErrorsFailProduces(t *testing.T) {
	b, w := startChaosBroker(t)
	newTopic(t, w, "s", 1)
	var want []string
	for i := range 5 {
		v := fmt.Sprintf("v%d", i)
		produceRecords(t, w, "s", 0, &heraldpb.Record{Value: []byte(v)})
		want = append(want, v)
	}
	st := setFaults(t, b, `{"fsync_error":"eio","fsync_count":0}`)
	if st.FsyncError != "eio" || st.FsyncCount != 0 {
		t.Fatalf("status %+v", st)
	}
	var storageErr *heraldpb.Error
	for i := 0; storageErr == nil; i++ {
		r := produceOnce(w, "s", fmt.Sprintf("failed-%d", i))
		e := r.GetError()
		switch {
		case e == nil:
			t.Fatalf("produce %d acknowledged while every fsync fails: %v", i, r)
		case e.Code == heraldpb.ErrorCode_STORAGE_ERROR:
			storageErr = e
		case !e.Retriable || i > 100:
			t.Fatalf("produce %d: %v, want STORAGE_ERROR", i, e)
		}
	}
	if !storageErr.Retriable || !strings.Contains(storageErr.Message, "input/output error") {
		t.Fatalf("the storage error is not a retriable EIO: %v", storageErr)
	}
	// Reads of the acknowledged records work on, the fault still armed
	// (between the partition's attempts to reopen its log, a read may be
	// answered with the retriable STORAGE_ERROR).
	pollFor(t, 15*time.Second, "reading the acknowledged records with fsyncs failing", func() error {
		bs, e := fetchBatches(w, "s")
		if e != nil {
			if !e.Retriable {
				t.Fatalf("fetch: %v", e)
			}
			return e
		}
		if got := values(t, bs); len(got) < len(want) || strings.Join(got[:len(want)], ",") != strings.Join(want, ",") {
			return fmt.Errorf("read %q, want %q first", got, want)
		}
		return nil
	})
	if st := setFaults(t, b, ""); st.FsyncError != "eio" || st.FsyncFailures == 0 {
		t.Fatalf("status with the fault armed: %+v", st)
	}

	setFaults(t, b, `{"clear":true}`)
	// The partition reopens on its backoff (up to 16 s between attempts).
	pollFor(t, 40*time.Second, "a produce after clearing the fault", func() error {
		if e := produceOnce(w, "s", "after").GetError(); e != nil {
			return e
		}
		return nil
	})
	bs, e := fetchBatches(w, "s")
	if e != nil {
		t.Fatal(e)
	}
	got := values(t, bs)
	if strings.Join(got[:len(want)], ",") != strings.Join(want, ",") || got[len(got)-1] != "after" {
		t.Fatalf("after recovery the partition holds %q", got)
	}
}

// fsync_count N fails the next N fsyncs only: writes resume without a
// clear once they are spent.
func TestChaosFsyncCount(t *testing.T) {
	b, w := startChaosBroker(t)
	newTopic(t, w, "n", 1)
	produceRecords(t, w, "n", 0, &heraldpb.Record{Value: []byte("before")})
	failed := setFaults(t, b, `{"fsync_error":"eio","fsync_count":1}`).FsyncFailures // counted since the process started
	if e := produceOnce(w, "n", "failed").GetError(); e.GetCode() != heraldpb.ErrorCode_STORAGE_ERROR {
		t.Fatalf("produce with one fsync failing: %v, want STORAGE_ERROR", e)
	}
	if st := setFaults(t, b, ""); st.FsyncError != "" || st.FsyncFailures != failed+1 {
		t.Fatalf("status after the one failure: %+v", st)
	}
	pollFor(t, 20*time.Second, "a produce once the failing fsync is spent", func() error {
		if e := produceOnce(w, "n", "after").GetError(); e != nil {
			return e
		}
		return nil
	})
}

// Write errors fail produces like fsync errors, with the WAL written
// nothing; clearing lets writes resume.
func TestChaosWriteErrors(t *testing.T) {
	b, w := startChaosBroker(t)
	newTopic(t, w, "w", 1)
	produceRecords(t, w, "w", 0, &heraldpb.Record{Value: []byte("before")})
	setFaults(t, b, `{"write_error":"eio"}`)
	e := produceOnce(w, "w", "failed").GetError()
	if e.GetCode() != heraldpb.ErrorCode_STORAGE_ERROR || !strings.Contains(e.GetMessage(), "wal write") {
		t.Fatalf("produce with writes failing: %v, want STORAGE_ERROR from the WAL write", e)
	}
	if st := setFaults(t, b, ""); st.WriteError != "eio" || st.WriteFailures == 0 {
		t.Fatalf("status %+v", st)
	}
	setFaults(t, b, `{"write_error":"none"}`)
	pollFor(t, 40*time.Second, "a produce after clearing the fault", func() error {
		if e := produceOnce(w, "w", "after").GetError(); e != nil {
			return e
		}
		return nil
	})
	bs, fe := fetchBatches(w, "w")
	if fe != nil {
		t.Fatal(fe)
	}
	if got := values(t, bs); len(got) != 2 || got[0] != "before" || got[1] != "after" {
		t.Fatalf("partition holds %q", got)
	}
}

// A slow disk slows acknowledged produces by at least the delay of the
// WAL write and of its fsync.
func TestChaosDiskDelay(t *testing.T) {
	b, w := startChaosBroker(t)
	newTopic(t, w, "slow", 1)
	produceRecords(t, w, "slow", 0, &heraldpb.Record{Value: []byte("warm")})
	const d = 150 * time.Millisecond
	if st := setFaults(t, b, `{"disk_delay":"150ms"}`); st.DiskDelay != "150ms" {
		t.Fatalf("status %+v", st)
	}
	start := time.Now()
	if e := produceOnce(w, "slow", "slow").GetError(); e != nil {
		t.Fatal(e)
	}
	if took := time.Since(start); took < 2*d {
		t.Fatalf("a produce on a %v disk took %v, want at least %v", d, took, 2*d)
	}
	if st := setFaults(t, b, `{"disk_delay":"0s"}`); st.DelayedOps < 2 {
		t.Fatalf("status %+v", st)
	}
}

// Bad requests reach the broker's endpoint as 400s.
func TestChaosFaultsBadRequest(t *testing.T) {
	b, _ := startChaosBroker(t)
	code, body := callFaults(t, b, http.MethodPost, `{"clock_offset":"soon"}`)
	if code != http.StatusBadRequest || !strings.Contains(body, "not a Go duration") {
		t.Fatalf("bad offset: %d %s", code, body)
	}
	if code, body := callFaults(t, b, http.MethodPost, `{"fsync_errors":"eio"}`); code != http.StatusBadRequest || !strings.Contains(body, "unknown field") {
		t.Fatalf("unknown field: %d %s", code, body)
	}
}
