// Package faults holds the process-wide fault state of a chaos build: the
// broker's clock (the real time plus an offset that can be changed while
// it runs) and the disk faults of its data dir (a slow disk, failing
// fsyncs, failing writes), armed over HTTP at the admin listener's
// /debug/faults by the chaos suite. The contract is in docs/chaos.md,
// "Fault injection in chaos builds".
//
// The process-wide part (NodeClock, NodeFS, Register, OnClockChange) is
// compiled in only with the build tag chaos (`go build -tags chaos
// ./cmd/herald`). In every other build NodeClock is the system clock,
// NodeFS the real filesystem, Register adds no endpoint and OnClockChange
// never calls back: the broker passes the rooms exactly what they would
// default to, so the hot path costs what it costs without this package,
// and nothing outside a chaos build can arm a fault. State and its HTTP
// handler are plain code (so their tests run in every build), unreachable
// from a normal binary.
//
// Disk faults go through persistence/errorfs, with the WAL included
// (errorfs.FS.IncludeWAL): every persistence.Log, the scheduler's far
// store and the topic catalog of the node use NodeFS.
package faults

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/heraldmq/herald/persistence/errorfs"
	"github.com/heraldmq/herald/persistence/vfs"
)

// Clock is the broker's time as the rooms take it: it satisfies
// partition.Clock (Now) and consumer.Clock (Now, AfterFunc), and Now is
// the scheduler's Options.Now.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once the clock has advanced
	// by d.
	AfterFunc(d time.Duration, f func())
}

// System is the machine's clock.
type System struct{}

// Now is time.Now.
func (System) Now() time.Time { return time.Now() }

// AfterFunc is time.AfterFunc.
func (System) AfterFunc(d time.Duration, f func()) { time.AfterFunc(d, f) }

// MaxClockOffset bounds the clock offset either way (about ten years).
const MaxClockOffset = 10 * 366 * 24 * time.Hour

// MaxDiskDelay bounds the disk delay.
const MaxDiskDelay = time.Minute

// State is one process's fault state: a Clock whose offset can be moved,
// and a fault-injecting filesystem. All methods are safe for concurrent
// use. The zero value is not usable; call New.
type State struct {
	fs     *errorfs.FS
	offset atomic.Int64 // nanoseconds added to the real time

	// mu guards the fields below and orders offset changes, so that the
	// timers are re-armed for the offset that stays.
	mu        sync.Mutex
	timers    map[*timer]struct{}
	listeners map[int]func()
	nextID    int
	// syncErr, writeErr: the error names armed ("eio", "enospc").
	syncErr, writeErr string
}

// timer is a pending AfterFunc: due at the clock's at, whatever the
// offset does meanwhile.
type timer struct {
	at time.Time
	f  func()
	t  *time.Timer
}

// New returns a State with the real time and no faults, whose FS wraps
// inner and reaches the WAL too.
func New(inner vfs.FS) *State {
	return &State{fs: errorfs.Wrap(inner).IncludeWAL(), timers: map[*timer]struct{}{}, listeners: map[int]func(){}}
}

// Now is the real time plus the offset, as a step of the machine's clock
// (an NTP step) would make it: the wall clock moves by the offset, the
// monotonic reading does not. So times kept as Unix milliseconds
// (schedules, TTLs, a hold's end by another node's clock) see a change of
// the offset, while a duration measured with Sub across it (a hold held
// for a duration) does not, as with Go's monotonic clock on a real
// machine.
func (s *State) Now() time.Time { return wallShift(time.Now(), time.Duration(s.offset.Load())) }

// wallShift is t moved by d on the wall clock only. Go has no API for
// that (Add moves the monotonic reading too), so it sets the monotonic
// reading of t.Add(d) back to t's through time.Time's layout ({wall
// uint64; ext int64; loc}, ext the monotonic reading when the wall's top
// bit says there is one), which TestNowShiftsTheWallClockOnly pins. Only
// chaos builds call it with d != 0.
func wallShift(t time.Time, d time.Duration) time.Time {
	if d == 0 {
		return t
	}
	s := t.Add(d)
	type layout struct {
		wall uint64
		ext  int64
		loc  *time.Location
	}
	const hasMonotonic = 1 << 63
	ts, ss := (*layout)(unsafe.Pointer(&t)), (*layout)(unsafe.Pointer(&s))
	if ts.wall&hasMonotonic == 0 || ss.wall&hasMonotonic == 0 {
		return s // no monotonic reading to keep
	}
	ss.ext = ts.ext
	return s
}

// AfterFunc calls f in its own goroutine when Now reaches Now()+d: a
// jump forward brings it sooner, a jump back delays it.
func (s *State) AfterFunc(d time.Duration, f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tm := &timer{at: s.Now().Add(d), f: f}
	s.timers[tm] = struct{}{}
	tm.t = time.AfterFunc(d, func() { s.fire(tm) })
}

// fire runs a timer once: a timer re-armed after it went off may go off
// twice.
func (s *State) fire(tm *timer) {
	s.mu.Lock()
	_, ok := s.timers[tm]
	delete(s.timers, tm)
	s.mu.Unlock()
	if ok {
		tm.f()
	}
}

// Offset is the clock's offset from the real time.
func (s *State) Offset() time.Duration { return time.Duration(s.offset.Load()) }

// SetOffset sets the clock's offset from the real time (not relative to
// the current offset), re-arms the pending AfterFuncs for it, then calls
// the OnClockChange listeners. An offset beyond MaxClockOffset either way
// is refused.
func (s *State) SetOffset(d time.Duration) error {
	if d > MaxClockOffset || d < -MaxClockOffset {
		return fmt.Errorf("clock offset %v is beyond ±%v", d, MaxClockOffset)
	}
	s.mu.Lock()
	s.offset.Store(int64(d))
	now := s.Now()
	for tm := range s.timers {
		tm.t.Reset(max(tm.at.Round(0).Sub(now.Round(0)), 0)) // by the wall clock: a jump moves the timers
	}
	ls := make([]func(), 0, len(s.listeners))
	for _, f := range s.listeners {
		ls = append(ls, f)
	}
	s.mu.Unlock()
	for _, f := range ls {
		f()
	}
	return nil
}

// OnClockChange calls f (on the goroutine that changed it) after every
// change of the offset, until the returned function is called. The
// broker pokes its scheduler with it, whose timers run on real time.
func (s *State) OnClockChange(f func()) (stop func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.nextID
	s.nextID++
	s.listeners[id] = f
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.listeners, id)
	}
}

// FS is the fault-injecting filesystem, to hand to everything that writes
// the node's data dir.
func (s *State) FS() vfs.FS { return s.fs }

// SetDiskDelay makes every write and fsync wait d (0 removes it).
func (s *State) SetDiskDelay(d time.Duration) error {
	if d < 0 || d > MaxDiskDelay {
		return fmt.Errorf("disk delay %v is outside [0, %v]", d, MaxDiskDelay)
	}
	s.fs.SetDelay(d)
	return nil
}

// FailSyncs makes the next n fsyncs fail with the named error ("eio" or
// "enospc"), every one until cleared when n is 0. The name "none" clears
// the fault.
func (s *State) FailSyncs(name string, n int) error {
	err, ok := errnoOf(name)
	if !ok {
		return fmt.Errorf("fsync error %q: want one of %s", name, errnoNames)
	}
	if n < 0 {
		return fmt.Errorf("fsync count %d is negative", n)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		s.fs.ClearSyncFaults()
		s.syncErr = ""
		return nil
	}
	s.fs.FailNextSyncs(n, err)
	s.syncErr = name
	return nil
}

// FailWrites makes every write fail with the named error ("eio" or
// "enospc"), writing nothing; "none" clears the fault.
func (s *State) FailWrites(name string) error {
	err, ok := errnoOf(name)
	if !ok {
		return fmt.Errorf("write error %q: want one of %s", name, errnoNames)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fs.FailWrites(err)
	s.writeErr = name
	if err == nil {
		s.writeErr = ""
	}
	return nil
}

// Clear sets the offset back to 0 and disarms every disk fault.
func (s *State) Clear() {
	s.mu.Lock()
	s.fs.Reset()
	s.syncErr, s.writeErr = "", ""
	s.mu.Unlock()
	_ = s.SetOffset(0)
}

// Status is the state as GET /debug/faults reports it.
type Status struct {
	// ClockOffset is the offset from the real time, a Go duration.
	ClockOffset string `json:"clock_offset"`
	// Now is the broker's clock (RFC 3339, nanoseconds).
	Now string `json:"now"`
	// DiskDelay is waited before every write and fsync, a Go duration.
	DiskDelay string `json:"disk_delay"`
	// FsyncError names the error fsyncs fail with, "" when they do not.
	FsyncError string `json:"fsync_error"`
	// FsyncCount is how many more fsyncs fail; 0 with FsyncError set
	// means every fsync until cleared.
	FsyncCount int `json:"fsync_count"`
	// WriteError names the error writes fail with, "" when they do not.
	WriteError string `json:"write_error"`
	// FsyncFailures, WriteFailures and DelayedOps count the fsyncs and
	// writes failed and the operations delayed since the process started.
	FsyncFailures int64 `json:"fsync_failures"`
	WriteFailures int64 `json:"write_failures"`
	DelayedOps    int64 `json:"delayed_ops"`
}

// Status reports the state.
func (s *State) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.fs.Armed()
	st := Status{
		ClockOffset: s.Offset().String(), Now: s.Now().UTC().Format(time.RFC3339Nano), DiskDelay: a.Delay.String(),
		FsyncFailures: a.FailedSyncs, WriteFailures: a.FailedWrites, DelayedOps: a.Delayed,
	}
	if a.SyncErr != nil {
		st.FsyncError, st.FsyncCount = s.syncErr, a.SyncNext
	}
	if a.WriteErr != nil {
		st.WriteError = s.writeErr
	}
	return st
}
