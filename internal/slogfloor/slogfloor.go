// Package slogfloor wraps a slog.Handler so that records below a level are
// dropped: protoactor-go logs chattily at Info, and Herald hands its actor
// systems a logger that keeps only warnings and errors.
package slogfloor

import (
	"context"
	"log/slog"
)

// Handler drops records below Min and passes the rest to Handler.
type Handler struct {
	slog.Handler
	Min slog.Level
}

// New returns a logger writing to h the records at min and above.
func New(h slog.Handler, min slog.Level) *slog.Logger {
	return slog.New(Handler{h, min})
}

// Enabled reports whether a record at l is kept.
func (h Handler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.Min && h.Handler.Enabled(ctx, l)
}

// WithAttrs keeps the floor.
func (h Handler) WithAttrs(a []slog.Attr) slog.Handler {
	return Handler{h.Handler.WithAttrs(a), h.Min}
}

// WithGroup keeps the floor.
func (h Handler) WithGroup(n string) slog.Handler {
	return Handler{h.Handler.WithGroup(n), h.Min}
}
