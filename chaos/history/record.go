// The Recorder: appends ops to a history as JSON lines while a run goes on.

package history

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"
)

// Recorder appends ops to a history, one JSON line each. It is safe for
// concurrent use by every process of a run: it numbers the ops in the order
// it writes them and stamps each with the clock, under one lock, so the
// indexes, the times and the lines agree.
//
// The first write error sticks: Record returns it from then on and writes
// nothing more, and Err reports it. The Recorder does not buffer or flush;
// the caller owns w (a bufio.Writer over a file, flushed at the end).
type Recorder struct {
	mu   sync.Mutex
	w    io.Writer
	now  func() time.Duration
	next int64
	err  error
	buf  []byte
}

// NewRecorder returns a Recorder that writes to w and stamps each op with
// now(), the time since the run started (for instance
// func() time.Duration { return time.Since(start) }). now must not go back.
func NewRecorder(w io.Writer, now func() time.Duration) *Recorder {
	return &Recorder{w: w, now: now}
}

// Record sets op's Index and Time, writes it as one line, and returns it as
// written. An op that fails Validate is not written, takes no index, and
// its error matches ErrBadOp; a write error is returned as is.
func (r *Recorder) Record(op Op) (Op, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return op, r.err
	}
	op.Index = r.next
	op.Time = int64(r.now())
	if err := op.Validate(); err != nil {
		return op, err
	}
	b, err := appendLine(r.buf[:0], op)
	if err != nil {
		return op, err
	}
	r.buf = b
	if _, err := r.w.Write(b); err != nil {
		r.err = fmt.Errorf("herald: writing history op %d: %w", op.Index, err)
		return op, r.err
	}
	r.next++
	return op, nil
}

// Err returns the write error that stopped the Recorder, if any.
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Write writes ops to w as JSON lines, as they are (Index and Time
// included): for tools that filter or rewrite a history.
func Write(w io.Writer, ops []Op) error {
	var b []byte
	for _, op := range ops {
		var err error
		if b, err = appendLine(b[:0], op); err != nil {
			return err
		}
		if _, err := w.Write(b); err != nil {
			return fmt.Errorf("herald: writing history op %d: %w", op.Index, err)
		}
	}
	return nil
}

func appendLine(b []byte, op Op) ([]byte, error) {
	j, err := json.Marshal(op)
	if err != nil {
		return b, fmt.Errorf("herald: encoding history op %d: %w", op.Index, err)
	}
	return append(append(b, j...), '\n'), nil
}
