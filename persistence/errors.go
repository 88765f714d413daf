package persistence

import (
	"errors"
	"fmt"
)

var (
	// ErrStorage marks every failure of the disk underneath a Log: a failed
	// write, fsync, rename or truncation. The OS error stays in the chain, so
	// errors.Is(err, syscall.ENOSPC) works. After Save or Retain returns
	// ErrStorage the Log is failed: later Saves return ErrStorage until the
	// owner Closes and re-Opens it.
	ErrStorage = errors.New("herald: storage error")
	// ErrOffsetOutOfRange is returned by ReadBatches for an offset below
	// StartOffset or above the caller's limit (the high watermark).
	ErrOffsetOutOfRange = errors.New("herald: offset out of range")
	// ErrClosed is returned by every method of a closed Log.
	ErrClosed = errors.New("herald: log closed")
	// ErrCorrupt marks data that failed its checksum or did not decode. Test
	// for it with IsCorruption.
	ErrCorrupt = errors.New("herald: corrupt log data")
	// ErrBadEntry is returned by Save, before anything is written, for entries
	// that are not contiguous or whose data is not a valid heraldpb.LogEntry.
	// It does not fail the Log.
	ErrBadEntry = errors.New("herald: invalid raft entry")
)

// IsCorruption reports whether err is marked as corruption of stored data.
func IsCorruption(err error) bool { return errors.Is(err, ErrCorrupt) }

// corruptf returns an error marked ErrCorrupt.
func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// storageErr wraps an OS or WAL error as ErrStorage, keeping err in the chain.
func storageErr(op string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrStorage, op, err)
}

// FlushPolicyError reports a flush policy string that does not parse.
type FlushPolicyError struct {
	Input  string
	Reason string
}

func (e *FlushPolicyError) Error() string {
	return fmt.Sprintf("herald: bad flush policy %q: %s (want \"always\" or \"interval:<duration>\")", e.Input, e.Reason)
}
