package netio

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Flow-control tests (output.go): real servers on 127.0.0.1:0, clients that
// stop reading. A client that does not read is dialled with a small receive
// buffer (dialNoRead), so that what the kernel holds for it (the client's
// receive buffer and the server's send buffer, a few MiB at most on
// loopback) is small next to the responses the tests make the server send,
// and the rest must wait in gnet's outbound buffer, where netio counts it.

// smallRcvBuf is the receive buffer of a client that does not read. Set
// before connect, it also keeps the TCP window small.
const smallRcvBuf = 16 << 10

// dialNoRead dials with a small receive buffer.
func (h *harness) dialNoRead() *client {
	h.t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, smallRcvBuf)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", h.addr)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return &client{t: h.t, c: c}
}

// hello negotiates maxInFlight (0: the server's) and checks the answer.
func (c *client) hello(id uint64, maxInFlight uint32) *heraldpb.HelloResponse {
	c.t.Helper()
	c.send(&heraldpb.Frame{Id: id, Body: &heraldpb.Frame_Hello{Hello: &heraldpb.HelloRequest{
		ClientId: "flow", ProtocolVersion: heraldpb.ProtocolVersion, MaxInFlight: maxInFlight}}})
	f := c.mustRead()
	hr := f.GetHelloResponse()
	if f.Id != id || hr == nil {
		c.t.Fatalf("hello: got %v", f)
	}
	if maxInFlight != 0 && hr.MaxInFlight != maxInFlight {
		c.t.Fatalf("hello negotiated max_in_flight %d, want %d", hr.MaxInFlight, maxInFlight)
	}
	return hr
}

// fetch is a Fetch the test router answers with maxBytes of records.
func fetch(id uint64, maxBytes uint32) *heraldpb.Frame {
	return &heraldpb.Frame{Id: id, Body: &heraldpb.Frame_Fetch{Fetch: &heraldpb.FetchRequest{Topic: "t", MaxBytes: maxBytes}}}
}

// expectFetch reads a frame and checks it answers Fetch id with n bytes.
func (c *client) expectFetch(id uint64, n int) {
	c.t.Helper()
	f := c.mustRead()
	b := f.GetFetchResponse().GetBatches()
	if f.Id != id || len(b) != 1 || len(b[0].Records) != n {
		c.t.Fatalf("want the %d-byte fetch response %d, got id %d body %T", n, id, f.Id, f.Body)
	}
}

// conn returns the server side of the harness's only connection.
func (h *harness) onlyConn() *conn {
	h.t.Helper()
	h.srv.regMu.Lock()
	defer h.srv.regMu.Unlock()
	if len(h.srv.registry) != 1 {
		h.t.Fatalf("%d connections, want 1", len(h.srv.registry))
	}
	for c := range h.srv.registry {
		return c
	}
	return nil
}

// logBuffer is a slog handler's destination the tests can search.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.b.String(), s)
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

func counter(reason string) float64 { return testutil.ToFloat64(mLimitClosed.WithLabelValues(reason)) }

// TestInFlightSlotFreedOnlyWhenWritten: with a negotiated window of 1, the
// slot of a request is not given back when its response is handed to gnet
// but only once the response has left gnet's buffer for the socket. A
// client that does not read keeps its one slot busy, and its next request
// is refused with TOO_MANY_IN_FLIGHT (the documented answer to a request
// beyond the window), never routed; once it reads, the slot is free.
func TestInFlightSlotFreedOnlyWhenWritten(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxPendingOutput = 32 << 20 })
	c := h.dialNoRead()
	c.hello(1, 1)
	const size = 12 << 20 // more than the kernel holds for a client that does not read
	c.send(fetch(2, size))
	sc := h.onlyConn()
	waitFor(t, "the response handed to gnet and stuck in its buffer", func() bool {
		// Below size: gnet took the frame and the socket part of it.
		return h.router.routed.Load() == 1 && sc.reserved.Load() == 0 && sc.out.Load() > 0 && sc.out.Load() < size
	})
	t.Logf("pending output with the response queued: %d bytes", sc.out.Load())
	produces := testutil.ToFloat64(mRequests.WithLabelValues("produce"))
	c.send(produce(3, "t"))
	waitFor(t, "the second request read", func() bool {
		return testutil.ToFloat64(mRequests.WithLabelValues("produce")) == produces+1
	})
	if n := h.router.routed.Load(); n != 1 {
		t.Fatalf("%d requests routed with the window's one slot still held, want 1", n)
	}
	if n := sc.inflightCount(); n != 1 {
		t.Fatalf("in flight = %d with the response unwritten, want 1", n)
	}
	c.expectFetch(2, size)
	c.expectError(3, heraldpb.ErrorCode_TOO_MANY_IN_FLIGHT)
	waitFor(t, "the slot freed once the response was read", func() bool { return sc.inflightCount() == 0 && sc.out.Load() == 0 })
	c.roundTrip(4)
}

// frameReader reads whole frames through a buffer, for clients that read
// many.
type frameReader struct {
	c *client
	r *bufio.Reader
}

func (c *client) reader() *frameReader { return &frameReader{c: c, r: bufio.NewReaderSize(c.c, 1<<20)} }

func (fr *frameReader) read() (*heraldpb.Frame, error) {
	_ = fr.c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hdr [4]byte
	if _, err := io.ReadFull(fr.r, hdr[:]); err != nil {
		return nil, err
	}
	p := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if _, err := io.ReadFull(fr.r, p); err != nil {
		return nil, err
	}
	return heraldpb.DecodeFrame(p)
}

// peak samples f every millisecond until stop is closed and returns the
// largest value.
func peak(f func() int64, stop <-chan struct{}) func() int64 {
	var mu sync.Mutex
	var top int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			v := f()
			mu.Lock()
			top = max(top, v)
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return func() int64 {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return top
	}
}

// TestNeverReadingFetcherWindowOne is issue 14's max_in_flight=1
// reproduction at the package level: a client negotiates a window of 1,
// pipelines 1,100 one-MiB Fetches and then more until TCP stops taking
// them, and never reads. One Fetch is routed; the rest are refused with
// TOO_MANY_IN_FLIGHT; once the refusals fill the connection's output bound
// the broker stops reading it, so the broker's pending output and queued
// request bytes stay bounded however long the client writes, and the client's
// writes block. When it reads, every request has had exactly one answer
// and nothing stays counted.
func TestNeverReadingFetcherWindowOne(t *testing.T) {
	const soft = 512 << 10
	h := newHarness(t, func(c *Config) { c.MaxPendingOutput = soft })
	c := h.dialNoRead()
	if err := c.c.(*net.TCPConn).SetWriteBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	c.hello(1, 1)
	sc := h.onlyConn()
	pausedBefore := testutil.ToFloat64(mPausedConns)
	pausesBefore := testutil.ToFloat64(mReadPauses.WithLabelValues(pauseReasonOutput))

	stop := make(chan struct{})
	peakOut := peak(h.srv.out.Load, stop)
	peakQueued := peak(h.srv.queued.Load, stop)

	// A writer sends 1,100 Fetches, then chunks of 1,000 more until told
	// to stop (or a failsafe amount was written).
	var (
		mu      sync.Mutex
		written int
		lastID  uint64
	)
	topic := strings.Repeat("t", 100)
	stopWriting := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		id := uint64(10)
		for n := 1100; ; n = 1000 {
			select {
			case <-stopWriting:
				writerDone <- nil
				return
			default:
			}
			var b []byte
			for range n {
				f := fetch(id, 1<<20)
				f.GetFetch().Topic = topic // fewer frames to read back
				b, _ = heraldpb.AppendFrame(b, f)
				id++
			}
			if _, err := c.c.Write(b); err != nil {
				writerDone <- err
				return
			}
			mu.Lock()
			written += len(b)
			lastID = id - 1
			total := written
			mu.Unlock()
			if total >= 32<<20 || h.srv.out.Load() > 64<<20 { // failsafe

				writerDone <- nil
				return
			}
		}
	}()
	progress := func() int {
		mu.Lock()
		defer mu.Unlock()
		return written
	}
	// TCP stops the writer: no progress for a second.
	deadline := time.Now().Add(30 * time.Second)
	for last, since := progress(), time.Now(); time.Since(since) < time.Second; {
		if time.Now().After(deadline) || last >= 32<<20 || h.srv.out.Load() > 64<<20 {
			t.Fatalf("the broker read %d MiB from a client that never reads without pushing back (pending output %d MiB)", last>>20, h.srv.out.Load()>>20)
		}
		time.Sleep(20 * time.Millisecond)
		if p := progress(); p != last {
			last, since = p, time.Now()
		}
	}
	close(stop)
	po, pq := peakOut(), peakQueued()
	t.Logf("client wrote %d KiB before TCP stopped it; peak pending output %d KiB, peak queued request bytes %d KiB",
		progress()>>10, po>>10, pq>>10)
	// A fetch is routed once the previous response has left gnet's
	// buffer; the kernel takes a few of them (the server's send buffer is
	// at most tcp_wmem's maximum), and from then on none.
	if n, most := h.router.routed.Load(), 2+kernelSendMax(t)/(1<<20); n > most {
		t.Fatalf("%d one-MiB fetches routed with a window of 1 and nothing read, want at most %d", n, most)
	}
	// One response may cross the bound, plus the refusals of one read.
	if po > soft+1<<20+256<<10 {
		t.Fatalf("pending output peaked at %d bytes, bound %d", po, soft)
	}
	if pq > 1<<20 {
		t.Fatalf("queued request bytes peaked at %d", pq)
	}
	waitFor(t, "the connection paused for output", func() bool { return testutil.ToFloat64(mPausedConns) == pausedBefore+1 })
	if got := testutil.ToFloat64(mReadPauses.WithLabelValues(pauseReasonOutput)); got <= pausesBefore {
		t.Fatal("herald_read_pauses_total{reason=output} did not move")
	}

	// The client reads: the writer's blocked write completes, and there is
	// one fetch response, then a refusal for every other request.
	close(stopWriting)
	fr := c.reader()
	answered := make(map[uint64]bool)
	seen, fetched := 0, 0
	writerFinished := false
	for {
		mu.Lock()
		end := lastID
		mu.Unlock()
		if seen == int(end-9) {
			if writerFinished {
				break
			}
			// Every answer so far is read, so the writer's last write
			// completes (or has).
			select {
			case err := <-writerDone:
				if err != nil {
					t.Fatalf("writer: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the writer's last write never completed")
			}
			writerFinished = true
			continue
		}
		f, err := fr.read()
		if err != nil {
			t.Fatalf("read answer %d: %v", seen+1, err)
		}
		// Answers come out of id order: netio writes its refusals at once,
		// the router's responses later.
		if f.Id < 10 || answered[f.Id] {
			t.Fatalf("unexpected or duplicate answer to %d", f.Id)
		}
		answered[f.Id] = true
		if b := f.GetFetchResponse().GetBatches(); len(b) == 1 && len(b[0].Records) == 1<<20 {
			fetched++
		} else if f.GetError().GetCode() != heraldpb.ErrorCode_TOO_MANY_IN_FLIGHT {
			t.Fatalf("answer to %d: %v, want a fetch response or TOO_MANY_IN_FLIGHT", f.Id, f)
		}
		seen++
	}
	waitFor(t, "nothing left counted", func() bool {
		return sc.out.Load() == 0 && sc.inflightCount() == 0 && testutil.ToFloat64(mPausedConns) == pausedBefore
	})
	if n := h.router.routed.Load(); n != int64(fetched) {
		t.Fatalf("%d fetches routed, %d fetch responses read", n, fetched)
	}
	t.Logf("read %d answers, %d of them fetch responses", seen, fetched)
}

// kernelSendMax is the most a TCP send buffer may grow to (tcp_wmem's
// maximum), 4 MiB if unknown.
func kernelSendMax(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_wmem")
	if f := strings.Fields(string(b)); err == nil && len(f) == 3 {
		if v, err := strconv.ParseInt(f[2], 10, 64); err == nil {
			return v
		}
	}
	return 4 << 20
}

// TestReadPausedUntilClientReads: a connection whose pending output reaches
// MaxPendingOutput is no longer read (herald_connections_read_paused), so
// its further requests stay unrouted in the kernel; once the client reads,
// reading resumes and every request is answered.
func TestReadPausedUntilClientReads(t *testing.T) {
	const soft, n, size = 1 << 20, 40, 256 << 10 // 10 MiB of responses
	h := newHarness(t, func(c *Config) { c.MaxPendingOutput = soft })
	c := h.dialNoRead()
	c.hello(1, 0)
	sc := h.onlyConn()
	pausedBefore := testutil.ToFloat64(mPausedConns)
	pausesBefore := testutil.ToFloat64(mReadPauses.WithLabelValues(pauseReasonOutput))
	var fs []*heraldpb.Frame
	for i := range n {
		fs = append(fs, fetch(uint64(10+i), size))
	}
	c.send(fs...)
	// Steady state: every routed request answered, the output full, reads paused.
	waitFor(t, "the connection paused with its output full", func() bool {
		return testutil.ToFloat64(mPausedConns) == pausedBefore+1 && sc.reserved.Load() == 0 && sc.out.Load() >= soft
	})
	routedAtPause := h.router.routed.Load()
	t.Logf("paused with %d of %d fetches routed, pending output %d KiB", routedAtPause, n, sc.out.Load()>>10)
	if routedAtPause >= n {
		t.Fatalf("all %d fetches routed: the connection was read with its output full", n)
	}
	if sc.out.Load() > soft+size+1<<10 {
		t.Fatalf("pending output %d, more than one response over the bound %d", sc.out.Load(), soft)
	}
	if testutil.ToFloat64(mReadPauses.WithLabelValues(pauseReasonOutput)) <= pausesBefore {
		t.Fatal("herald_read_pauses_total{reason=output} did not move")
	}
	fr := c.reader()
	for i := range n {
		f, err := fr.read()
		if err != nil {
			t.Fatalf("read response %d: %v", i, err)
		}
		if b := f.GetFetchResponse().GetBatches(); f.Id != uint64(10+i) || len(b) != 1 || len(b[0].Records) != size {
			t.Fatalf("response %d: id %d %T", i, f.Id, f.Body)
		}
	}
	waitFor(t, "reading resumed and nothing left counted", func() bool {
		return testutil.ToFloat64(mPausedConns) == pausedBefore && sc.out.Load() == 0 && sc.inflightCount() == 0
	})
	if got := h.router.routed.Load(); got != n {
		t.Fatalf("%d fetches routed, want %d", got, n)
	}
	c.roundTrip(99)
}

// TestOutputOverflowCloses: a push sender that ignores PushRoom drives a
// connection that does not read past MaxPendingOutputHard. Push then
// refuses, and the connection is closed with reason output_overflow: logged,
// counted in herald_connections_limit_closed_total, its pending output
// uncounted. Another connection goes on.
func TestOutputOverflowCloses(t *testing.T) {
	logs := &logBuffer{}
	const soft, hard = 64 << 10, 256 << 10
	h := newHarness(t, func(c *Config) {
		c.MaxFrameBytes = 64 << 10
		c.MaxPendingOutput = soft
		c.MaxPendingOutputHard = hard
		c.Logger = logs.logger()
	})
	good := h.dial()
	good.roundTrip(1)
	c := h.dialNoRead()
	c.hello(1, 0)
	c.roundTrip(2)
	id := h.router.last.Load().Id
	before := counter(reasonOutputOverflow)
	push, err := heraldpb.AppendFrame(nil, &heraldpb.Frame{Body: &heraldpb.Frame_FetchResponse{FetchResponse: &heraldpb.FetchResponse{
		Batches: []*heraldpb.StoredBatch{{Records: make([]byte, 60<<10)}}}}})
	if err != nil {
		t.Fatal(err)
	}
	sawNoRoom := false
	pushed := 0
	for ; pushed < 10000; pushed++ {
		if h.srv.PushRoom(id) <= 0 {
			sawNoRoom = true
		}
		if !h.srv.Push(id, push) {
			break
		}
	}
	t.Logf("Push refused after %d pushes of %d bytes", pushed, len(push))
	if pushed == 10000 {
		t.Fatal("Push never refused a connection that does not read")
	}
	if !sawNoRoom {
		t.Fatal("PushRoom never reported the connection full before the hard limit")
	}
	waitFor(t, "the connection closed and uncounted", func() bool {
		return h.srv.conns.Load() == 1 && h.srv.out.Load() == 0
	})
	if got := counter(reasonOutputOverflow); got != before+1 {
		t.Fatalf("limit_closed_total{reason=output_overflow} went %v -> %v", before, got)
	}
	if !logs.contains("reason=output_overflow") {
		t.Fatalf("no log line with reason=output_overflow:\n%s", logs.b.String())
	}
	expectClosed(t, c)
	good.roundTrip(2)
}

// expectClosed reads c until the server's close shows: EOF or a reset,
// not a timeout.
func expectClosed(t *testing.T, c *client) {
	t.Helper()
	fr := c.reader()
	for {
		_, err := fr.read()
		if err == nil {
			continue
		}
		if isTimeout(err) {
			t.Fatalf("connection still open: %v", err)
		}
		return
	}
}

// TestWriteStallCloses: a connection with output pending and none of it
// reaching the socket for WriteStallTimeout is closed with reason
// write_stall (logged, counted, its slot and output uncounted), while a
// client that reads slowly but steadily is not.
//
// "Reaching the socket" is seen from gnet's buffer: the kernel reports the
// socket writable again only once about a third of its send buffer (up to
// tcp_wmem's maximum, 4 MiB here) is free, so a reader is seen to make
// progress about every sndbuf/3 bytes it reads. The slow reader here reads
// 2.5 MB/s, about 1.3 MB per 0.5s, against a 1s timeout (with a 500ms
// timeout it was cut off after 5.9 MB in the run tried).
func TestWriteStallCloses(t *testing.T) {
	logs := &logBuffer{}
	const stall = time.Second
	h := newHarness(t, func(c *Config) {
		c.WriteStallTimeout = stall
		c.Logger = logs.logger()
	})
	before := counter(reasonWriteStall)
	slow := h.dialNoRead()
	slow.hello(1, 0)
	stuck := h.dialNoRead()
	stuck.hello(1, 0)
	const size = 8 << 20
	slow.send(fetch(2, size))
	stuck.send(fetch(2, size))
	start := time.Now()

	// slow reads the 8 MiB response, 256 KiB every 100ms.
	body := readSlowly(t, slow, 256<<10, start)
	if f, err := heraldpb.DecodeFrame(body); err != nil || f.Id != 2 || len(f.GetFetchResponse().GetBatches()[0].GetRecords()) != size {
		t.Fatalf("slow reader's response: %v", err)
	}
	got := body
	t.Logf("slow reader read %d bytes in %v", len(got), time.Since(start))
	slow.roundTrip(3)

	waitFor(t, "the stalled connection closed and uncounted", func() bool {
		return h.srv.conns.Load() == 1 && h.srv.out.Load() == 0 && h.srv.inflight.Load() == 0
	})
	if got := counter(reasonWriteStall); got != before+1 {
		t.Fatalf("limit_closed_total{reason=write_stall} went %v -> %v, want one close", before, got)
	}
	if !logs.contains("reason=write_stall") {
		t.Fatalf("no log line with reason=write_stall:\n%s", logs.b.String())
	}
	expectClosed(t, stuck)
}

// TestBudgetPausedConnectionsResume: while the broker-wide request budget
// (MaxQueuedRequestBytes) is spent by held requests, a connection that sends
// a frame is paused with its bytes unread; when the held requests are
// answered, or their connection closes, it is woken at once (not by the
// ticker's safety net, which runs once a second: each round checks the
// resumed request is answered within 300ms, and in the rounds after the
// first the ticker would take about a second).
func TestBudgetPausedConnectionsResume(t *testing.T) {
	const budget = 64 << 10
	h := newHarness(t, func(c *Config) {
		c.MaxFrameBytes = budget
		c.MaxQueuedRequestBytes = budget
	})
	b := h.dial()
	b.hello(1, 0)
	holdFrame := func(id uint64) *heraldpb.Frame {
		f := produce(id, "hold")
		f.GetProduce().Records = make([]byte, 36<<10)
		return f
	}
	for round := range 4 {
		a := h.dial()
		a.hello(1, 0)
		base := h.router.routed.Load()
		// Two held requests of 36 KiB: 72 KiB of the 64 KiB budget.
		a.send(holdFrame(2))
		waitFor(t, "the first held request routed", func() bool { return h.router.routed.Load() == base+1 })
		a.send(holdFrame(3))
		waitFor(t, "the second held request routed", func() bool { return h.router.routed.Load() == base+2 })
		if q := h.srv.queued.Load(); q < budget {
			t.Fatalf("queued request bytes %d, want the budget %d spent", q, budget)
		}
		pauses := testutil.ToFloat64(mReadPauses.WithLabelValues(pauseReasonBudget))
		id := uint64(10 + round)
		f := produce(id, "t")
		f.GetProduce().Records = make([]byte, 30<<10)
		raw, err := heraldpb.AppendFrame(nil, f)
		if err != nil {
			t.Fatal(err)
		}
		b.sendRaw(raw[:10<<10])
		waitFor(t, "b paused for the budget", func() bool {
			return testutil.ToFloat64(mReadPauses.WithLabelValues(pauseReasonBudget)) == pauses+1
		})
		b.sendRaw(raw[10<<10:])
		time.Sleep(50 * time.Millisecond) // not synchronisation: b's frame must stay unread meanwhile
		if n := h.router.routed.Load(); n != base+2 {
			t.Fatalf("%d requests routed while the budget was spent, want %d", n, base+2)
		}
		start := time.Now()
		if round < 3 {
			h.router.release() // the held requests are answered
		} else {
			a.c.Close() // their connection goes
		}
		if got := b.mustRead(); got.Id != id || got.GetProduceResponse() == nil {
			t.Fatalf("round %d: b got %v", round, got)
		}
		d := time.Since(start)
		t.Logf("round %d: b answered %v after the budget was freed", round, d)
		if d > 300*time.Millisecond {
			t.Fatalf("round %d: b resumed %v after the budget was freed: not woken by the release", round, d)
		}
		if round < 3 {
			got := map[uint64]bool{}
			for range 2 {
				got[a.mustRead().Id] = true
			}
			if !got[2] || !got[3] {
				t.Fatalf("held responses %v", got)
			}
			a.c.Close()
		}
		waitFor(t, "a gone and the budget free", func() bool { return h.srv.conns.Load() == 1 && h.srv.queued.Load() == 0 })
	}
	h.router.release()
}

// TestSlowSteadyReaderIsNotStalled: a client that reads steadily but slowly
// (64 KiB every 100 ms) is not a stalled one. gnet sees its output drain
// only when the kernel reports the socket writable again, after about a
// third of the send buffer is free (MiBs, with autotuning), which at this
// rate takes longer than the 1 s stall timeout; the kernel's unsent count
// (SIOCOUTQ) going down counts as progress.
func TestSlowSteadyReaderIsNotStalled(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the kernel's unsent count is read on Linux only")
	}
	h := newHarness(t, func(c *Config) { c.WriteStallTimeout = time.Second })
	before := counter(reasonWriteStall)
	slow := h.dialNoRead()
	slow.hello(1, 0)
	const size = 4 << 20
	slow.send(fetch(2, size))
	start := time.Now()
	body := readSlowly(t, slow, 64<<10, start)
	if got := counter(reasonWriteStall); got != before {
		t.Fatalf("limit_closed_total{reason=write_stall} went %v -> %v", before, got)
	}
	t.Logf("slow reader read %d bytes in %v without a stall close", len(body), time.Since(start).Round(time.Millisecond))
}

// readSlowly reads one frame from c, chunk bytes every 100 ms, and returns
// its payload; it fails the test if the broker cuts the connection off.
func readSlowly(t *testing.T, c *client, chunk int, start time.Time) []byte {
	t.Helper()
	var hdr [4]byte
	_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c.c, hdr[:]); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	for off := 0; off < len(body); {
		time.Sleep(100 * time.Millisecond) // the reader's pace, not a wait for the broker
		_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := io.ReadFull(c.c, body[off:min(off+chunk, len(body))])
		off += n
		if err != nil {
			t.Fatalf("slow reader cut off after %d bytes in %v: %v", off, time.Since(start), err)
		}
	}
	return body
}
