package netio

import (
	"fmt"
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
	switch {
	case c.IdleTimeout == 0:
		c.IdleTimeout = DefaultIdleTimeout
	case c.IdleTimeout < 0:
		c.IdleTimeout = 0
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
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
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(probs, "; "))
}
