package netio

import "errors"

var (
	// ErrInvalidConfig marks a Config that Validate rejected; the wrapped
	// message lists every problem.
	ErrInvalidConfig = errors.New("herald: invalid netio config")
	// ErrAlreadyStarted is returned by a second call to Server.Start.
	ErrAlreadyStarted = errors.New("herald: server already started")
	// ErrServerClosed is returned by Start after Shutdown.
	ErrServerClosed = errors.New("herald: server closed")
)
