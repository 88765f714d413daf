// Read: parses a history, naming the line of the first malformed op.

package history

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// ErrMalformed marks every error of Read about the history's content (as
// opposed to the reader's own errors); check it with errors.Is, and use
// errors.As with *LineError for the line.
var ErrMalformed = errors.New("herald: malformed history")

// LineError is a malformed line of a history: not one JSON object, an
// unknown field, an op that fails Validate, or an Index not above the
// previous line's.
type LineError struct {
	Line int // from 1
	Err  error
}

func (e *LineError) Error() string {
	return fmt.Sprintf("herald: history line %d: %s", e.Line, strings.TrimPrefix(e.Err.Error(), "herald: "))
}

// Unwrap returns the cause (matching ErrBadOp for an op that fails
// Validate).
func (e *LineError) Unwrap() error { return e.Err }

// Is makes every LineError match ErrMalformed.
func (e *LineError) Is(target error) bool { return target == ErrMalformed }

// Read parses a history: one JSON op a line, blank lines skipped, a last
// line with or without its newline. It stops at the first malformed line
// with a *LineError. An error of r itself is returned wrapped, without
// ErrMalformed. An empty history is no error.
func Read(r io.Reader) ([]Op, error) {
	br := bufio.NewReader(r)
	var ops []Op
	for line := 1; ; line++ {
		b, err := br.ReadBytes('\n')
		if err != nil && err != io.EOF {
			return ops, fmt.Errorf("herald: reading history line %d: %w", line, err)
		}
		if t := bytes.TrimSpace(b); len(t) > 0 {
			op, perr := parseLine(t)
			if perr == nil && len(ops) > 0 && op.Index <= ops[len(ops)-1].Index {
				perr = fmt.Errorf("index %d not above the previous line's %d", op.Index, ops[len(ops)-1].Index)
			}
			if perr != nil {
				return ops, &LineError{Line: line, Err: perr}
			}
			ops = append(ops, op)
		}
		if err == io.EOF {
			return ops, nil
		}
	}
}

func parseLine(b []byte) (Op, error) {
	var op Op
	if b[0] != '{' {
		return op, errors.New("not a JSON object")
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&op); err != nil {
		return Op{}, err
	}
	if d.InputOffset() != int64(len(b)) {
		return Op{}, errors.New("more than one JSON value")
	}
	if len(op.Records) == 0 {
		op.Records = nil
	}
	return op, op.Validate()
}
