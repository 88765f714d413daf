package persistence

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/heraldmq/herald/persistence/vfs"
)

// FS is the filesystem interface persistence uses for its own files. See
// package vfs.
type FS = vfs.FS

// File is an open file of an FS.
type File = vfs.File

// OSFS is the real filesystem.
var OSFS FS = vfs.Default

// FlushPolicy says when Save fsyncs the WAL.
type FlushPolicy struct {
	// Interval between background fsyncs. 0 means "always": Save fsyncs once
	// before returning, so a returned Save is durable.
	Interval time.Duration
}

// ParseFlushPolicy parses "always" or "interval:<Go duration>" (for example
// "interval:50ms"). A bad input returns a *FlushPolicyError naming it.
func ParseFlushPolicy(s string) (FlushPolicy, error) {
	if s == "always" {
		return FlushPolicy{}, nil
	}
	rest, ok := strings.CutPrefix(s, "interval:")
	if !ok {
		return FlushPolicy{}, &FlushPolicyError{Input: s, Reason: "unknown policy"}
	}
	d, err := time.ParseDuration(rest)
	if err != nil {
		return FlushPolicy{}, &FlushPolicyError{Input: s, Reason: err.Error()}
	}
	if d <= 0 {
		return FlushPolicy{}, &FlushPolicyError{Input: s, Reason: "interval must be positive"}
	}
	return FlushPolicy{Interval: d}, nil
}

// String returns the form ParseFlushPolicy accepts.
func (p FlushPolicy) String() string {
	if p.Interval <= 0 {
		return "always"
	}
	return "interval:" + p.Interval.String()
}

// Options configures one raft group's Log.
type Options struct {
	// Dir is this group's directory; created if missing. Required.
	Dir string
	// FS is used for Herald's own file operations; nil = OSFS.
	FS FS
	// Flush is the fsync policy; the zero value is "always".
	Flush FlushPolicy
	// SegmentBytes is the WAL segment size in bytes (tidwall SegmentSize).
	// The tail segment lives in memory. 0 = 8 MiB.
	SegmentBytes int
	// SegmentCacheSize is how many older segments the WAL keeps in memory for
	// reads. 0 = 1.
	SegmentCacheSize int
	// IndexIntervalBytes is the granularity in WAL bytes of the sparse offset
	// and time indexes: a lookup reads at most about this much. 0 = 64 KiB.
	IndexIntervalBytes int
	// CacheBytes bounds the in-memory cache of the most recent entries that
	// serves Entries, ReadBatches and tail reads without touching the WAL.
	// 0 = 4 MiB; negative disables the cache.
	CacheBytes int
	// Logger receives recovery and failure reports; nil = slog.Default().
	Logger *slog.Logger
	// Group labels logs and metrics, e.g. "orders-0".
	Group string

	// wrapWAL, when set (tests only), wraps the WAL after every open so
	// tests can inject write and fsync failures.
	wrapWAL func(walLog) walLog
}

// Defaults used by EnsureDefaults.
const (
	DefaultSegmentBytes       = 8 << 20
	DefaultSegmentCacheSize   = 1
	DefaultIndexIntervalBytes = 64 << 10
	DefaultCacheBytes         = 4 << 20
)

// EnsureDefaults fills zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.FS == nil {
		o.FS = OSFS
	}
	if o.SegmentBytes == 0 {
		o.SegmentBytes = DefaultSegmentBytes
	}
	if o.SegmentCacheSize == 0 {
		o.SegmentCacheSize = DefaultSegmentCacheSize
	}
	if o.IndexIntervalBytes == 0 {
		o.IndexIntervalBytes = DefaultIndexIntervalBytes
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports every problem with o at once (call after EnsureDefaults).
func (o *Options) Validate() error {
	var errs []error
	if o.Dir == "" {
		errs = append(errs, errors.New("persistence: Options.Dir is required"))
	}
	if o.SegmentBytes < 0 {
		errs = append(errs, fmt.Errorf("SegmentBytes %d is negative", o.SegmentBytes))
	}
	if o.SegmentCacheSize < 0 {
		errs = append(errs, fmt.Errorf("SegmentCacheSize %d is negative", o.SegmentCacheSize))
	}
	if o.IndexIntervalBytes < 0 {
		errs = append(errs, fmt.Errorf("IndexIntervalBytes %d is negative", o.IndexIntervalBytes))
	}
	if o.Flush.Interval < 0 {
		errs = append(errs, fmt.Errorf("Flush.Interval %v is negative", o.Flush.Interval))
	}
	if len(errs) > 0 {
		return fmt.Errorf("persistence: invalid options: %w", errors.Join(errs...))
	}
	return nil
}
