package netio

import (
	"math"
	"time"

	"github.com/panjf2000/gnet/v2"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Flow control: how netio bounds what a connection can make the broker hold.
//
// gnet (v2.9.7, read in its source) gives two facts this is built on:
//
//   - AsyncWrite's callback runs on the event loop right after conn.write,
//     which writes what the socket takes and appends the rest to an outbound
//     buffer with no cap. The callback therefore means "buffered", not
//     "sent". Herald's patched gnet (third_party/gnet) calls
//     OnOutboundWritten when a writable event drained part of that buffer,
//     and OutboundBuffered tells what remains, so the loop knows how many of
//     the bytes it handed over have reached the socket (conn.sync).
//   - eventloop.read reads a readable socket on every readable event and
//     appends whatever OnTraffic leaves unconsumed to an inbound ring buffer
//     with no cap. Not consuming frames does not stop reading. The patched
//     gnet's PauseRead removes the read interest from epoll, so the bytes
//     stay in the kernel and TCP flow control reaches the client. After
//     PauseRead gnet has read at most one more chunk (its read buffer, 64 KiB).
//
// Output. conn.out counts bytes handed to gnet (from any goroutine, before
// AsyncWrite) until the loop sees them leave the outbound buffer.
// conn.reserved counts what routed requests may still answer
// (responseEstimate). While out+reserved >= MaxPendingOutput the connection's
// buffered frames wait and its reads are paused (pauseOutput), and
// Server.PushRoom reports no room, so push senders hold their pushes. An
// in-flight slot is freed only when its response has left the buffer, so a
// window of 1 means one response at a time. Over MaxPendingOutputHard, or
// with output pending and none of it written for WriteStallTimeout, the
// connection is closed.
//
// Input. Server.queued counts, broker-wide, the bytes buffered in
// connections' inbound buffers (incomplete frames, and whole ones waiting
// behind pauseOutput) plus the frames of routed requests until answered. At
// or over MaxQueuedRequestBytes a connection that holds buffered bytes is
// paused (pauseBudget) until the total falls below it. FrameTimeout closes a
// connection whose incomplete frame is not completed in time (it runs while
// paused for the budget too, so clients that never finish their frames
// release the budget), and a connection before Hello may send only frames of
// MaxFrameBytesBeforeHello.

// Reasons reads of a connection are paused (conn.paused bits).
const (
	pauseOutput uint8 = 1 << iota
	pauseBudget
	pauseThrottle // a produce waits for its connection's fair share (deferProduce)
)

// Estimated response sizes (conn.reserved): a Fetch may answer its max_bytes
// (1 MiB when unset or above 16 MiB, as the partition reads it) plus
// framing; any other response is small.
const (
	smallResponseEstimate = 1 << 10
	defaultFetchBytes     = 1 << 20
	maxFetchBytes         = 16 << 20
)

// responseEstimate is the output a request may add once answered, at most
// the connection's max frame.
func responseEstimate(f *heraldpb.Frame, maxFrame int64) int64 {
	fb, ok := f.Body.(*heraldpb.Frame_Fetch)
	if !ok {
		return smallResponseEstimate
	}
	n := int64(fb.Fetch.GetMaxBytes())
	if n <= 0 || n > maxFetchBytes {
		n = defaultFetchBytes
	}
	return min(n+smallResponseEstimate, maxFrame)
}

// write hands an encoded frame to gnet from any goroutine and counts it in
// the connection's pending output until it reaches the socket. A response
// frees its in-flight slot once written. est is the output its request
// reserved (conn.answer), 0 for other frames: it is released on the event
// loop once b is counted as buffered output, so that the loop, which
// decides on out+reserved whether to read more requests, never sees the
// response in neither and never misses its release. It reports false (and
// counts the frame dropped) when the frame cannot be queued: the connection
// is gone, or would exceed MaxPendingOutputHard, which closes it.
func (c *conn) write(b []byte, isResponse bool, est int64) bool {
	return c.writeThen(b, isResponse, est, nil)
}

// writeThen is write, calling then on the event loop once b is handed to
// the socket or buffered.
//
// Frames written from other goroutines are coalesced: each joins the
// connection's list of frames waiting for the loop (conn.opend), and only
// the one that finds the list empty asks the loop to write, so every frame
// that joins before the loop gets to it goes out in the same writev. A
// partition that applies a group commit answers many requests of one
// connection at once, and each used to cost a write syscall and an event
// loop task of its own. The list is bounded by MaxPendingOutputHard, as
// out counts its bytes.
func (c *conn) writeThen(b []byte, isResponse bool, est int64, then func(gnet.Conn)) bool {
	n := int64(len(b))
	if c.addOut(n) > int64(c.s.cfg.MaxPendingOutputHard) {
		c.subOut(n)
		c.reserved.Add(-est)
		mFramesDropped.Inc()
		if isResponse {
			c.release()
		}
		c.closeFor(reasonOutputOverflow, "pending output over the hard limit",
			"pending_bytes", c.out.Load()+n, "limit", c.s.cfg.MaxPendingOutputHard)
		return false
	}
	c.omu.Lock()
	c.opend = append(c.opend, outFrame{b: b, isResponse: isResponse, est: est, then: then})
	first := len(c.opend) == 1
	c.omu.Unlock()
	if !first {
		return true // the write already asked for takes it
	}
	// AsyncWritev of nothing writes nothing: it only runs flushOut on the
	// loop, after the frames queued meanwhile. A failure means the loop is
	// gone (gnet could not wake it): every frame waiting is dropped, those
	// other writers queued too (their then, which the loop would have run,
	// cannot run either).
	if err := c.gc.AsyncWritev(nil, c.flushOut); err != nil {
		for _, f := range c.takeOut() {
			c.dropOut(&f)
			mFramesDropped.Inc()
		}
		return false
	}
	return true
}

// outFrame is a frame waiting in conn.opend for the loop to write it.
type outFrame struct {
	b          []byte
	isResponse bool
	est        int64
	then       func(gnet.Conn)
}

// maxWritev bounds the frames one writev carries (Linux refuses more than
// IOV_MAX, 1024, buffers in one call).
const maxWritev = 512

// keepOutCap bounds the list and writev buffers a connection keeps for
// reuse between writes (a few KiB); larger ones, after a burst, go.
const keepOutCap = 64

// dropOut uncounts a frame of the list that will not be written: its
// bytes, its reservation and, for a response, its in-flight slot.
func (c *conn) dropOut(f *outFrame) {
	c.subOut(int64(len(f.b)))
	c.reserved.Add(-f.est)
	if f.isResponse {
		c.release()
	}
}

// takeOut empties the waiting list and returns what it held.
func (c *conn) takeOut() []outFrame {
	c.omu.Lock()
	fs := c.opend
	c.opend = c.ospare
	c.ospare = nil
	c.omu.Unlock()
	return fs
}

// flushOut, on the event loop, writes every frame waiting in the list, in
// order, with as few writev calls as the list needs, and then counts them
// as write's callback did for each (err: the connection is closed, and
// they are dropped).
func (c *conn) flushOut(gc gnet.Conn, err error) error {
	fs := c.takeOut()
	if len(fs) == 0 {
		return nil
	}
	i := 0 // fs[:i] were handed to gnet
	for err == nil && i < len(fs) {
		if c.closed.Load() {
			// Closed since the last chunk (afterWrite's writeLoop, or
			// OnClose inside a Writev): gnet's Writev does not check, and
			// the descriptor may be another connection's by now.
			break
		}
		end := i
		for end < len(fs) && end-i < maxWritev {
			end++
			if fs[end-1].then != nil {
				break // its then runs before the frames after it are written
			}
		}
		bs := c.iov[:0]
		for j := i; j < end; j++ {
			bs = append(bs, fs[j].b)
		}
		_, err = gc.Writev(bs)
		clear(bs)
		if cap(bs) <= keepOutCap {
			c.iov = bs[:0]
		}
		if err != nil {
			break
		}
		mFramesPerWrite.Observe(float64(end - i))
		for j := i; j < end; j++ {
			f := &fs[j]
			c.reserved.Add(-f.est)
			c.enq += int64(len(f.b))
			if f.isResponse {
				c.slotAt = append(c.slotAt, c.enq)
			}
		}
		i = end
		c.afterWrite(gc)
		if then := fs[end-1].then; then != nil {
			then(gc)
		}
	}
	for j := i; j < len(fs); j++ { // the connection is closed: dropped
		c.dropOut(&fs[j])
	}
	clear(fs)
	c.omu.Lock()
	if c.ospare == nil && cap(fs) <= keepOutCap {
		c.ospare = fs[:0] // reused by the next list, unless it grew large
	}
	c.omu.Unlock()
	return nil
}

// writeLoop writes b with gc.Write on the event loop, counted like write.
func (c *conn) writeLoop(gc gnet.Conn, b []byte) {
	n := int64(len(b))
	c.addOut(n)
	if _, err := gc.Write(b); err != nil {
		c.subOut(n) // gnet closed the connection; OnClose did not count b
		return
	}
	c.enq += n
	c.sync(gc)
}

// addOut counts n more bytes of pending output and returns the new total.
func (c *conn) addOut(n int64) int64 {
	v := c.out.Add(n)
	if v == n {
		c.progress.Store(time.Now().UnixNano()) // the stall clock starts now
	}
	c.s.out.Add(n)
	mPendingOutput.Add(float64(n))
	return v
}

func (c *conn) subOut(n int64) {
	c.out.Add(-n)
	c.s.out.Add(-n)
	mPendingOutput.Sub(float64(n))
}

// sync, on the event loop, learns how much of the output gnet accepted has
// reached the socket, and frees the slots of the responses wholly written.
func (c *conn) sync(gc gnet.Conn) {
	sent := c.enq - int64(gc.OutboundBuffered())
	if d := sent - c.sent; d > 0 {
		c.sent = sent
		c.subOut(d)
		c.progress.Store(time.Now().UnixNano())
	}
	for c.slotHead < len(c.slotAt) && c.slotAt[c.slotHead] <= sent {
		c.slotHead++
		c.release()
	}
	if c.slotHead == len(c.slotAt) {
		c.slotAt, c.slotHead = c.slotAt[:0], 0
	}
}

// afterWrite runs on the event loop after output was buffered or written:
// it syncs, and serves the frames that waited while the output was full.
func (c *conn) afterWrite(gc gnet.Conn) {
	c.sync(gc)
	if c.paused&pauseOutput != 0 && !c.outputFull() && !c.closed.Load() {
		c.act(gc, c.s.serve(c, gc))
	}
}

// act carries out, outside OnTraffic, an action serve returned.
func (c *conn) act(gc gnet.Conn, a gnet.Action) {
	switch a {
	case actionFinal:
		if c.finish(gc) == gnet.Close {
			_ = gc.Close()
		}
	case gnet.Close, gnet.Shutdown:
		_ = gc.Close()
	}
}

// outputFull reports whether the connection's pending and reserved output
// reached MaxPendingOutput.
func (c *conn) outputFull() bool {
	return c.out.Load()+c.reserved.Load() >= int64(c.s.cfg.MaxPendingOutput)
}

// pushRoom is how many bytes of pushes the connection can take before its
// output is full (<= 0: none).
func (c *conn) pushRoom() int {
	r := int64(c.s.cfg.MaxPendingOutput) - c.out.Load() - c.reserved.Load()
	if q := c.consumeRoom(); q < r {
		r = q // a consume quota holds pushes until its bucket refills
	}
	return int(max(min(r, math.MaxInt32), math.MinInt32))
}

// pause stops reading the connection for reason, on the event loop.
func (c *conn) pause(gc gnet.Conn, reason uint8) {
	if c.paused&reason != 0 {
		return
	}
	if c.paused == 0 {
		if err := gc.PauseRead(); err != nil {
			c.s.log.Warn("cannot pause reading", "conn", c.pid.Id, "err", err)
		}
		mPausedConns.Inc()
	}
	c.paused |= reason
	mReadPauses.WithLabelValues(pauseName(reason)).Inc()
	if reason == pauseBudget {
		c.s.budgetMu.Lock()
		c.s.budgetPaused[c] = struct{}{}
		c.s.budgetMu.Unlock()
	}
}

// unpause lifts reason; reads resume once no reason is left.
func (c *conn) unpause(gc gnet.Conn, reason uint8) {
	if c.paused&reason == 0 {
		return
	}
	c.paused &^= reason
	if reason == pauseBudget {
		c.s.budgetMu.Lock()
		delete(c.s.budgetPaused, c)
		c.s.budgetMu.Unlock()
	}
	if c.paused == 0 {
		if err := gc.ResumeRead(); err != nil {
			c.s.log.Warn("cannot resume reading", "conn", c.pid.Id, "err", err)
		}
		mPausedConns.Dec()
	}
}

func pauseName(reason uint8) string {
	if reason == pauseBudget {
		return pauseReasonBudget
	}
	if reason == pauseThrottle {
		return pauseReasonThrottle
	}
	return pauseReasonOutput
}

// setHeld counts the connection's inbound buffered bytes in the budget.
func (c *conn) setHeld(n int64) {
	if d := n - c.held; d > 0 {
		c.s.addQueued(d)
	} else if d < 0 {
		c.s.releaseQueued(-d)
	}
	c.held = n
}

// closeFor closes the connection because a limit was crossed, logging the
// reason and counting it once. Safe from any goroutine.
func (c *conn) closeFor(reason, msg string, args ...any) {
	if !c.limitClosed.CompareAndSwap(false, true) {
		return
	}
	mLimitClosed.WithLabelValues(reason).Inc()
	c.s.log.Warn("closing connection: "+msg, append([]any{"conn", c.pid.Id, "reason", reason}, args...)...)
	_ = c.gc.Close()
}

// addQueued counts n more bytes against MaxQueuedRequestBytes.
func (s *Server) addQueued(n int64) {
	if n == 0 {
		return
	}
	s.queued.Add(n)
	mQueued.Add(float64(n))
}

// releaseQueued uncounts n bytes and wakes the connections paused for the
// budget once it has room.
func (s *Server) releaseQueued(n int64) {
	if n == 0 {
		return
	}
	v := s.queued.Add(-n)
	mQueued.Sub(float64(n))
	if v < s.cfg.MaxQueuedRequestBytes {
		s.wakeBudgetPaused()
	}
}

// wakeBudgetPaused has every connection paused for the budget re-examined
// on its event loop (OnTraffic through Wake), unless a wake-up is already
// under way.
func (s *Server) wakeBudgetPaused() {
	if !s.waking.CompareAndSwap(false, true) {
		return
	}
	defer s.waking.Store(false)
	s.budgetMu.Lock()
	defer s.budgetMu.Unlock()
	for c := range s.budgetPaused {
		_ = c.gc.Wake(nil)
	}
}

// PushRoom reports how many bytes of pushes connection id can take before
// its pending output reaches MaxPendingOutput; <= 0 means hold pushes (they
// would only queue in memory) and ask again later. A connection that is
// gone reports math.MaxInt32: pushes to it are dropped anyway. Safe for
// concurrent use.
func (s *Server) PushRoom(id string) int {
	c := s.liveConn(id)
	if c == nil {
		return math.MaxInt32
	}
	return c.pushRoom()
}

// failAsync sends the connection's one final error frame from any
// goroutine (the ticker), then finishes it like fail does on the loop.
func (c *conn) failAsync(e *heraldpb.Error) {
	if !c.final.CompareAndSwap(false, true) {
		return
	}
	if !c.writeThen(errorBytes(0, e), false, 0, func(gc gnet.Conn) {
		if c.finish(gc) == gnet.Close {
			_ = gc.Close()
		}
	}) {
		_ = c.gc.Close()
	}
}

// failFrameTimeout ends a connection that did not complete a frame within
// FrameTimeout, with a final MALFORMED_FRAME (the protocol has no code of
// its own for it). From any goroutine.
func (c *conn) failFrameTimeout() {
	if !c.limitClosed.CompareAndSwap(false, true) {
		return
	}
	mLimitClosed.WithLabelValues(reasonFrameTimeout).Inc()
	c.s.log.Warn("closing connection: frame not completed in time", "conn", c.pid.Id, "reason", reasonFrameTimeout, "timeout", c.s.cfg.FrameTimeout)
	c.failAsync(heraldpb.NewError(heraldpb.ErrorCode_MALFORMED_FRAME, "frame not completed within %v", c.s.cfg.FrameTimeout))
}
