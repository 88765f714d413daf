package netio

import (
	"fmt"
	"github.com/heraldmq/herald/auth"
	"log/slog"
	"math"
	"net"
	"strings"
	"time"

	heraldpb "github.com/heraldmq/herald/proto"
)

// Defaults applied by Config.EnsureDefaults.
const (
	DefaultListen         = "127.0.0.1:7420"
	DefaultMaxConnections = 10000
	DefaultIdleTimeout    = 5 * time.Minute
	DefaultMaxInFlight    = 1024
	// DefaultMaxPendingOutput is a connection's default output bound.
	DefaultMaxPendingOutput = 8 << 20
	// DefaultMaxPendingOutputHard is the least default hard output limit
	// (see Config.MaxPendingOutputHard).
	DefaultMaxPendingOutputHard = 64 << 20
	// DefaultWriteStallTimeout closes a connection whose pending output
	// made no progress for this long.
	DefaultWriteStallTimeout = 30 * time.Second
	// DefaultMaxQueuedRequestBytes is the default broker-wide budget of
	// incomplete and queued request bytes.
	DefaultMaxQueuedRequestBytes = 64 << 20
	// DefaultFrameTimeout is the default deadline for completing a frame.
	DefaultFrameTimeout = 30 * time.Second
	// DefaultMaxFrameBytesBeforeHello is the default largest frame a
	// connection may send before its Hello.
	DefaultMaxFrameBytesBeforeHello = 64 << 10
	// DefaultMaxInFlightProduceBytes is the default admission limit of
	// produce bytes in flight (see Config.MaxInFlightProduceBytes).
	DefaultMaxInFlightProduceBytes = 16 << 20
	// DefaultMaxProduceDefer is how long a produce over its connection's
	// fair share waits unread before it is answered THROTTLED (see
	// Config.MaxProduceDefer).
	DefaultMaxProduceDefer = time.Second
	// DefaultProduceLatencyTarget is the default latency target of sparse
	// produces (see Config.ProduceLatencyTarget).
	DefaultProduceLatencyTarget = 10 * time.Millisecond
)

// Config configures a Server. The zero value of every field means "use the
// default" (see EnsureDefaults), except where a field says otherwise.
type Config struct {
	// Listen is the TCP address to listen on, host:port. Port 0 picks a free
	// port (see Server.Addr). Default DefaultListen.
	Listen string
	// Multicore runs one gnet event loop per CPU unless EventLoops is set.
	Multicore bool
	// EventLoops is the number of gnet event loops; 0 lets Multicore decide
	// (one per CPU, or 1 without Multicore).
	EventLoops int
	// MaxFrameBytes is the largest frame payload, in bytes, the server
	// accepts or sends. A frame whose header declares more is refused with a
	// final FRAME_TOO_LARGE. Hello may negotiate it down per connection.
	// Default heraldpb.DefaultMaxFrameBytes (16 MiB).
	MaxFrameBytes int
	// MaxConnections is the number of open client connections. The
	// connection past it gets a final TOO_MANY_CONNECTIONS frame and is
	// closed. Default DefaultMaxConnections.
	MaxConnections int
	// IdleTimeout closes a connection that has exchanged no frame in either
	// direction for this long and has no request in flight, after a final
	// IDLE_TIMEOUT frame. 0 means the default (5m); a negative value means
	// never (EnsureDefaults turns it into 0, which then means never).
	IdleTimeout time.Duration
	// MaxInFlight is the per-connection window of requests awaiting a
	// response; Hello may negotiate it down. A request beyond it is answered
	// at once with TOO_MANY_IN_FLIGHT. Default DefaultMaxInFlight.
	MaxInFlight int
	// MaxPendingOutput bounds, in bytes, a connection's pending output:
	// responses and pushes handed to gnet and not yet written to the socket,
	// plus what its routed requests may still answer (a Fetch reserves its
	// max_bytes, any other request 1 KiB). At or over it the connection's
	// further requests wait unread (gnet stops reading the socket, so TCP
	// pushes back on the client) and push senders see no room
	// (Server.PushRoom). It is a soft bound: one response or push may cross
	// it. Default DefaultMaxPendingOutput (8 MiB).
	MaxPendingOutput int
	// MaxPendingOutputHard closes a connection whose pending output exceeds
	// it (reason output_overflow). Default the larger of
	// DefaultMaxPendingOutputHard (64 MiB) and MaxPendingOutput +
	// 2*MaxFrameBytes; it must be at least MaxPendingOutput + MaxFrameBytes.
	MaxPendingOutputHard int
	// WriteStallTimeout closes a connection that has had output pending
	// for this long without a byte of it reaching the socket (reason
	// write_stall): a client that stopped reading. 0 means the default
	// (30s); negative means never.
	WriteStallTimeout time.Duration
	// MaxQueuedRequestBytes is the broker-wide budget, in bytes, of request
	// data read from clients and not yet answered: incomplete frames and
	// whole frames waiting in connection buffers, plus the frames of routed
	// requests until their response (like Kafka's queued.max.request.bytes).
	// At or over it, a connection that holds buffered request bytes is no
	// longer read until the total falls below it. Default
	// DefaultMaxQueuedRequestBytes (64 MiB).
	MaxQueuedRequestBytes int64
	// FrameTimeout ends a connection that started a frame and has not
	// completed it for this long: a final MALFORMED_FRAME error frame, then
	// close (reason frame_timeout). The clock runs while the connection is
	// paused for MaxQueuedRequestBytes, not while it is paused for its own
	// output. 0 means the default (30s); negative means never.
	FrameTimeout time.Duration
	// MaxFrameBytesBeforeHello is the largest frame payload a connection
	// may send before its Hello (responses are not limited by it). A bigger
	// one gets the final FRAME_TOO_LARGE. Default
	// DefaultMaxFrameBytesBeforeHello (64 KiB), and never above
	// MaxFrameBytes.
	MaxFrameBytesBeforeHello int
	// MaxInFlightProduceBytes is the admission limit, in bytes, of produce
	// requests routed and not yet answered, broker-wide (admission.go).
	// Over half of it, a connection whose own produce bytes in flight
	// exceed its fair share (the limit divided by the connections with
	// produce bytes in flight) is answered THROTTLED at once, with a
	// retry-after from the measured drain rate; connections within their
	// share, and any connection with no produce in flight, are admitted.
	// Size it to what the disk drains in a few tens of milliseconds.
	// Default DefaultMaxInFlightProduceBytes (16 MiB); negative turns
	// admission off (EnsureDefaults turns it into 0, which then means off).
	MaxInFlightProduceBytes int64
	// MaxProduceDefer is how long a produce refused by admission waits,
	// unread at the head of its connection's input with reads paused, for
	// its connection's turn before it is answered THROTTLED (admission.go).
	// Default DefaultMaxProduceDefer (1s); negative answers THROTTLED at
	// once (EnsureDefaults turns it into 0, which then means no wait).
	MaxProduceDefer time.Duration
	// ProduceLatencyTarget is the latency control's target (latency.go):
	// while a sparse produce (a light producer's) takes longer than this
	// (or four times the fastest one of the last 10 s, if more) from
	// admission to answer, the admission limit in force is halved, down to
	// a sixty-fourth of MaxInFlightProduceBytes (at least 256 KiB), and it
	// climbs back to MaxInFlightProduceBytes otherwise. Default
	// DefaultProduceLatencyTarget (10ms); negative turns it off
	// (EnsureDefaults turns it into 0, which then means off).
	ProduceLatencyTarget time.Duration
	// Auth authenticates connections (Hello's SASL login, SaslAuthenticate,
	// the TLS listener's verified client certificates) and authorizes each
	// request before it is routed. nil: every connection is anonymous and
	// may do everything (--auth off).
	Auth *auth.Service
	// Audit, if set, receives the audit log's entries (audit.go). It is
	// called on the event loops and the session actors: keep it short.
	Audit func(AuditEvent)
	// Tenancy knows the vhosts and the quotas. nil: only the default vhost,
	// and no quotas.
	Tenancy Tenancy
	// NodeID and ServerVersion are reported in HelloResponse.
	NodeID        uint32
	ServerVersion string
	// Logger receives the server's and gnet's logs. Default slog.Default().
	Logger *slog.Logger

	defaulted bool
}

// EnsureDefaults fills every zero field with its default. It is idempotent:
// after the first call IdleTimeout 0 means "never".
func (c *Config) EnsureDefaults() {
	if c.defaulted {
		return
	}
	c.defaulted = true
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.MaxFrameBytes == 0 {
		c.MaxFrameBytes = heraldpb.DefaultMaxFrameBytes
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	c.IdleTimeout = durationOrOff(c.IdleTimeout, DefaultIdleTimeout)
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxPendingOutput == 0 {
		c.MaxPendingOutput = DefaultMaxPendingOutput
	}
	if c.MaxPendingOutputHard == 0 {
		c.MaxPendingOutputHard = max(DefaultMaxPendingOutputHard, c.MaxPendingOutput+2*c.MaxFrameBytes)
	}
	c.WriteStallTimeout = durationOrOff(c.WriteStallTimeout, DefaultWriteStallTimeout)
	if c.MaxQueuedRequestBytes == 0 {
		c.MaxQueuedRequestBytes = DefaultMaxQueuedRequestBytes
	}
	c.FrameTimeout = durationOrOff(c.FrameTimeout, DefaultFrameTimeout)
	switch {
	case c.MaxInFlightProduceBytes == 0:
		c.MaxInFlightProduceBytes = DefaultMaxInFlightProduceBytes
	case c.MaxInFlightProduceBytes < 0:
		c.MaxInFlightProduceBytes = 0
	}
	c.MaxProduceDefer = durationOrOff(c.MaxProduceDefer, DefaultMaxProduceDefer)
	c.ProduceLatencyTarget = durationOrOff(c.ProduceLatencyTarget, DefaultProduceLatencyTarget)
	if c.MaxFrameBytesBeforeHello == 0 {
		c.MaxFrameBytesBeforeHello = min(DefaultMaxFrameBytesBeforeHello, c.MaxFrameBytes)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports every problem of c at once, each naming its field, wrapped
// in ErrInvalidConfig. Call it after EnsureDefaults.
func (c Config) Validate() error {
	var probs []string
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		probs = append(probs, fmt.Sprintf("Listen %q: %v", c.Listen, err))
	}
	if c.EventLoops < 0 {
		probs = append(probs, fmt.Sprintf("EventLoops %d: must be >= 0", c.EventLoops))
	}
	if c.MaxFrameBytes < heraldpb.HeaderLen || c.MaxFrameBytes > math.MaxUint32 {
		probs = append(probs, fmt.Sprintf("MaxFrameBytes %d: must be in [%d, %d]", c.MaxFrameBytes, heraldpb.HeaderLen, uint64(math.MaxUint32)))
	}
	if c.MaxConnections < 1 {
		probs = append(probs, fmt.Sprintf("MaxConnections %d: must be >= 1", c.MaxConnections))
	}
	if c.IdleTimeout < 0 {
		probs = append(probs, fmt.Sprintf("IdleTimeout %v: must be >= 0 (0 = never)", c.IdleTimeout))
	}
	if c.MaxInFlight < 1 || c.MaxInFlight > math.MaxUint32 {
		probs = append(probs, fmt.Sprintf("MaxInFlight %d: must be in [1, %d]", c.MaxInFlight, uint64(math.MaxUint32)))
	}
	if c.MaxPendingOutput < 1 {
		probs = append(probs, fmt.Sprintf("MaxPendingOutput %d: must be >= 1", c.MaxPendingOutput))
	}
	if c.MaxPendingOutputHard < c.MaxPendingOutput+c.MaxFrameBytes {
		probs = append(probs, fmt.Sprintf("MaxPendingOutputHard %d: must be >= MaxPendingOutput + MaxFrameBytes (%d)", c.MaxPendingOutputHard, c.MaxPendingOutput+c.MaxFrameBytes))
	}
	if c.WriteStallTimeout < 0 {
		probs = append(probs, fmt.Sprintf("WriteStallTimeout %v: must be >= 0 (0 = never)", c.WriteStallTimeout))
	}
	if c.MaxQueuedRequestBytes < int64(c.MaxFrameBytes) {
		probs = append(probs, fmt.Sprintf("MaxQueuedRequestBytes %d: must be >= MaxFrameBytes (%d)", c.MaxQueuedRequestBytes, c.MaxFrameBytes))
	}
	if c.FrameTimeout < 0 {
		probs = append(probs, fmt.Sprintf("FrameTimeout %v: must be >= 0 (0 = never)", c.FrameTimeout))
	}
	if c.MaxFrameBytesBeforeHello < heraldpb.HeaderLen || c.MaxFrameBytesBeforeHello > c.MaxFrameBytes {
		probs = append(probs, fmt.Sprintf("MaxFrameBytesBeforeHello %d: must be in [%d, MaxFrameBytes]", c.MaxFrameBytesBeforeHello, heraldpb.HeaderLen))
	}
	if c.MaxInFlightProduceBytes < 0 {
		probs = append(probs, fmt.Sprintf("MaxInFlightProduceBytes %d: must be >= 0 (0 = off)", c.MaxInFlightProduceBytes))
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(probs, "; "))
}

// durationOrOff is a duration setting's value: 0 takes the default, a
// negative value turns the setting off (0).
func durationOrOff(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}
