package e2e

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	heraldpb "github.com/heraldmq/herald/proto"
)

// rssBound is what the flow-control tests allow the broker's resident set
// to reach under attack (the unbounded broker reached 3.3 GB and 1.09 GB).
// Measured: about 110-130 MiB for the never-reading clients, 270-280 MiB
// for the half-sent frames (see TestHalfSentFrames).
const rssBound = 320 << 20

// rssOf reads VmRSS of pid from /proc, in bytes; 0 if it cannot.
func rssOf(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// watchRSS samples the broker's RSS every 50ms until stop is closed and
// returns the peak.
func watchRSS(t testing.TB, pid int, stop <-chan struct{}) func() int64 {
	var peak atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for {
			if r := rssOf(pid); r > peak.Load() {
				peak.Store(r)
			}
			select {
			case <-stop:
				return
			case <-tk.C:
			}
		}
	}()
	return func() int64 { <-done; return peak.Load() }
}

// steadyProducer sends one small record every 20ms until stop is closed,
// and returns its worst latency and its failures.
func steadyProducer(t testing.TB, n node, topic string, stop <-chan struct{}) func() (time.Duration, int, []error) {
	c := dial(t, n)
	p := c.NewProducer(client.WithManualPartitions())
	var (
		mu    sync.Mutex
		worst time.Duration
		sent  int
		errs  []error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			start := time.Now()
			_, err := p.Send(ctxT(t, 10*time.Second), &client.Message{Topic: topic, Partition: 0, Value: []byte("tick " + strconv.Itoa(i))})
			d := time.Since(start)
			mu.Lock()
			if err != nil {
				errs = append(errs, err)
			} else {
				sent++
				worst = max(worst, d)
			}
			mu.Unlock()
		}
	}()
	return func() (time.Duration, int, []error) {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return worst, sent, errs
	}
}

func rawHello(t testing.TB, rc *rawConn) {
	t.Helper()
	rc.send(&heraldpb.Frame{Id: 1, Body: &heraldpb.Frame_Hello{Hello: &heraldpb.HelloRequest{ProtocolVersion: heraldpb.ProtocolVersion}}})
	if f := rc.read(); f.GetHelloResponse() == nil {
		t.Fatalf("hello: %v", f)
	}
}

// TestNeverReadingClients is issue 14's reproduction of a client that never
// reads: 1,100 pipelined 1 MiB Fetches on a topic of 20 MB, plus a push
// subscriber granted 100,000 credits that never reads either. Before the
// output bound the broker's RSS reached 3.3 GB. Now each connection's
// pending output stops at about --max-pending-output (8 MiB), the broker
// stops reading them, RSS stays under rssBound, and another client's
// produces go on.
func TestNeverReadingClients(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	ctx := ctxT(t, 60*time.Second)
	for _, name := range []string{"big", "steady"} {
		if _, err := c.CreateTopic(ctx, name, nil); err != nil {
			t.Fatal(err)
		}
	}
	p := c.NewProducer(client.WithManualPartitions())
	val := bytes.Repeat([]byte("x"), 250<<10)
	for i := 0; i < 80; i++ { // 20 MB
		if _, err := p.Send(ctx, &client.Message{Topic: "big", Partition: 0, Value: val}); err != nil {
			t.Fatal(err)
		}
	}
	base := rssOf(n.cmd.Process.Pid)
	if base == 0 {
		t.Skip("no VmRSS in /proc")
	}

	stop := make(chan struct{})
	peak := watchRSS(t, n.cmd.Process.Pid, stop)
	steady := steadyProducer(t, n, "steady", stop)

	fetcher := rawDial(t, n)
	rawHello(t, fetcher)
	var pipe []byte
	for i := 0; i < 1100; i++ {
		var err error
		pipe, err = heraldpb.AppendFrame(pipe, &heraldpb.Frame{Id: uint64(10 + i), Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{
			Topic: "big", Offset: 0, MaxBytes: 1 << 20}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	fetcher.write(pipe)

	sub := rawDial(t, n)
	rawHello(t, sub)
	sub.send(&heraldpb.Frame{Id: 2, Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{
		Group: "slow", Topic: "big", Credits: 100_000, Start: &heraldpb.StartPosition{At: &heraldpb.StartPosition_Earliest{Earliest: true}}}}})

	checkFor(t, 20*time.Second, "both connections paused for output", func() error {
		if v := metricSum(t, n, "herald_connections_read_paused"); v < 1 {
			return fmt.Errorf("herald_connections_read_paused = %v", v)
		}
		if v := metricSum(t, n, "herald_pending_output_bytes"); v < 12<<20 {
			return fmt.Errorf("herald_pending_output_bytes = %v", v)
		}
		return nil
	})
	// Let the attack run: nothing may grow from here.
	for deadline := time.Now().Add(6 * time.Second); time.Now().Before(deadline); {
		if v := metricSum(t, n, "herald_pending_output_bytes"); v > 2*(8<<20)+2*(1<<20)+(4<<20) {
			t.Fatalf("herald_pending_output_bytes = %v, want about 2 connections x 8 MiB", v)
		}
		time.Sleep(200 * time.Millisecond)
	}
	close(stop)
	worst, sent, errs := steady()
	pk := peak()
	t.Logf("broker RSS: %d MiB before, peak %d MiB under the never-reading fetcher and subscriber (bound %d MiB); pending output %.1f MiB; steady producer: %d sends, worst latency %v",
		base>>20, pk>>20, rssBound>>20, metricSum(t, n, "herald_pending_output_bytes")/(1<<20), sent, worst)
	if len(errs) > 0 || sent < 50 {
		t.Fatalf("steady producer: %d sent, errors %v", sent, errs)
	}
	if worst > 2*time.Second {
		t.Errorf("steady producer's worst latency %v", worst)
	}
	if pk > rssBound {
		t.Fatalf("broker RSS peaked at %d MiB, over %d MiB", pk>>20, rssBound>>20)
	}
}

// TestHalfSentFrames is issue 14's reproduction of half-sent frames: 60
// connections each declare a 16 MiB frame and send 16 MiB - 1 bytes of it
// (after Hello, which allows 16 MiB frames; without Hello the header alone
// is refused). Before the request budget that pinned 1.09 GB. Now the
// broker stops reading at --max-queued-request-bytes, RSS stays under
// rssBound (about 4x the budget above the baseline: gnet's inbound buffers
// grow in 1.25x steps, and the outgrown ones wait for the GC), a normal
// client still produces, and --frame-timeout closes the stalled
// connections, releasing the budget. The test runs with half the default
// budget (32 MiB): with the default 64 MiB the peak, 270-303 MiB, came too
// close to the bound to be a test that passes every time.
func TestHalfSentFrames(t *testing.T) {
	const budget = 32 << 20
	n := startProc(t, t.TempDir(), "--frame-timeout", "8s", "--max-queued-request-bytes", fmt.Sprint(budget))
	c := dial(t, n)
	ctx := ctxT(t, 60*time.Second)
	if _, err := c.CreateTopic(ctx, "steady", nil); err != nil {
		t.Fatal(err)
	}
	pid := n.cmd.Process.Pid
	base := rssOf(pid)
	if base == 0 {
		t.Skip("no VmRSS in /proc")
	}

	// Before Hello a 16 MiB header is refused at once.
	pre := rawDial(t, n)
	pre.write(binary.BigEndian.AppendUint32(nil, 16<<20))
	if f := pre.read(); f.GetError().GetCode() != heraldpb.ErrorCode_FRAME_TOO_LARGE {
		t.Fatalf("16 MiB frame before Hello: %v", f)
	}

	stop := make(chan struct{})
	peak := watchRSS(t, pid, stop)
	steady := steadyProducer(t, n, "steady", stop)

	const conns, frame = 60, 16 << 20
	body := make([]byte, frame-1)
	var wg sync.WaitGroup
	for i := 0; i < conns; i++ {
		rc := rawDial(t, n)
		rawHello(t, rc)
		wg.Add(1)
		go func(cn net.Conn) {
			defer wg.Done()
			// The broker stops reading: the write blocks (TCP window), and
			// the frame deadline ends it.
			cn.SetWriteDeadline(time.Now().Add(20 * time.Second))
			cn.Write(binary.BigEndian.AppendUint32(nil, frame))
			cn.Write(body)
		}(rc.c)
	}
	checkFor(t, 10*time.Second, "the request budget to fill", func() error {
		if v := metricSum(t, n, "herald_queued_request_bytes"); v < budget*9/10 {
			return fmt.Errorf("herald_queued_request_bytes = %v", v)
		}
		return nil
	})
	queuedPeak := 0.0
	checkFor(t, 20*time.Second, "frame timeouts to close the 60 connections", func() error {
		queuedPeak = max(queuedPeak, metricSum(t, n, "herald_queued_request_bytes"))
		if v := metricSum(t, n, `herald_connections_limit_closed_total{reason="frame_timeout"}`); v < conns {
			return fmt.Errorf("frame_timeout closes = %v", v)
		}
		return nil
	})
	checkFor(t, 5*time.Second, "the budget to be released", func() error {
		if v := metricSum(t, n, "herald_queued_request_bytes"); v > 1<<20 {
			return fmt.Errorf("herald_queued_request_bytes = %v", v)
		}
		return nil
	})
	close(stop)
	wg.Wait()
	worst, sent, errs := steady()
	pk := peak()
	t.Logf("broker RSS: %d MiB before, peak %d MiB under %d half-sent 16 MiB frames (bound %d MiB); queued request bytes peak %.1f MiB; steady producer: %d sends, worst latency %v",
		base>>20, pk>>20, conns, rssBound>>20, queuedPeak/(1<<20), sent, worst)
	if queuedPeak > budget+conns*(64<<10)+(4<<20) {
		t.Errorf("queued request bytes peaked at %.1f MiB, over the %d MiB budget plus one read per connection", queuedPeak/(1<<20), budget>>20)
	}
	if len(errs) > 0 || sent < 50 {
		t.Fatalf("steady producer: %d sent, errors %v", sent, errs)
	}
	if worst > 2*time.Second {
		t.Errorf("steady producer's worst latency %v", worst)
	}
	if pk > rssBound {
		t.Fatalf("broker RSS peaked at %d MiB, over %d MiB", pk>>20, rssBound>>20)
	}
}

// A group member that never reads is pushed no more than its connection's
// output bound (8 MiB) plus a record or two (one step; and a push being
// handed from the member's session to the connection is briefly in neither
// count), whatever the records' size: the coordinator weighs its steps by
// the records' bytes. It used to step by 64 records between checks of the
// room: with 250 KiB records TestNeverReadingClients then saw 3-4 MiB over
// the bound now and then (a step is up to 16 MiB of them).
func TestPushesStayWithinTheOutputBound(t *testing.T) {
	n := startProc(t, t.TempDir())
	c := dial(t, n)
	ctx := ctxT(t, 60*time.Second)
	createTopic(t, c, "big", 1)
	p := c.NewProducer()
	val := bytes.Repeat([]byte("x"), 250<<10)
	for range 120 { // 30 MB
		p.SendAsync(ctx, &client.Message{Topic: "big", Value: val}, nil)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	sub := rawDial(t, n)
	rawHello(t, sub)
	sub.send(&heraldpb.Frame{Id: 2, Body: &heraldpb.Frame_Subscribe{Subscribe: &heraldpb.SubscribeRequest{
		Group: "never", Topic: "big", Credits: 100_000, Start: &heraldpb.StartPosition{At: &heraldpb.StartPosition_Earliest{Earliest: true}}}}})
	const bound = 8<<20 + 2*(250<<10) + 64<<10 // the bound, two records, framing
	checkFor(t, 20*time.Second, "the member's connection full", func() error {
		if v := metricSum(t, n, "herald_pending_output_bytes"); v < 7<<20 {
			return fmt.Errorf("herald_pending_output_bytes = %v", v)
		}
		return nil
	})
	peak := 0.0
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		peak = max(peak, metricSum(t, n, "herald_pending_output_bytes"))
	}
	if peak > bound {
		t.Fatalf("herald_pending_output_bytes peaked at %.2f MiB, over the 8 MiB bound plus two records", peak/(1<<20))
	}
	t.Logf("pending output peaked at %.2f MiB (bound 8 MiB)", peak/(1<<20))
}
