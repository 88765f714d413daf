package faults

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/heraldmq/herald/persistence/vfs"
)

// within reports whether d is within tol of want.
func within(d, want, tol time.Duration) bool { return d >= want-tol && d <= want+tol }

func TestClockOffset(t *testing.T) {
	s := New(vfs.Default)
	const tol = time.Second // generous: a loaded machine may stall between the reads
	if d := time.Until(s.Now()); !within(d, 0, tol) {
		t.Fatalf("fresh clock is %v off the real time", d)
	}
	for _, off := range []time.Duration{30 * time.Second, -10 * time.Second, 90 * 24 * time.Hour, 0} {
		if err := s.SetOffset(off); err != nil {
			t.Fatal(err)
		}
		if got := s.Offset(); got != off {
			t.Fatalf("Offset() = %v, want %v", got, off)
		}
		// Unix milliseconds, as schedules keep them: the wall clock moved.
		if d := time.Duration(s.Now().UnixMilli()-time.Now().UnixMilli()) * time.Millisecond; !within(d, off, tol) {
			t.Fatalf("offset %v: clock is %v ahead of the real time", off, d)
		}
		if st := s.Status(); st.ClockOffset != off.String() {
			t.Fatalf("status offset %q, want %q", st.ClockOffset, off)
		}
	}
	// The offset is absolute, not added to the last one.
	s.SetOffset(time.Minute)
	s.SetOffset(time.Minute)
	if s.Offset() != time.Minute {
		t.Fatalf("offset %v after setting 1m twice", s.Offset())
	}
	for _, bad := range []time.Duration{MaxClockOffset + 1, -MaxClockOffset - 1} {
		if err := s.SetOffset(bad); err == nil {
			t.Fatalf("offset %v accepted", bad)
		}
	}
	if s.Offset() != time.Minute {
		t.Fatalf("a refused offset changed it to %v", s.Offset())
	}
}

// waitFired fails unless ch receives within d.
func waitFired(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not called within %v", what, d)
	}
}

// AfterFunc counts in clock time: a jump forward brings a timer sooner, a
// jump back delays it, and each fires once.
func TestAfterFuncFollowsOffset(t *testing.T) {
	s := New(vfs.Default)
	fired := make(chan struct{}, 4)
	f := func() { fired <- struct{}{} }

	s.AfterFunc(time.Hour, f)
	if err := s.SetOffset(time.Hour + time.Second); err != nil {
		t.Fatal(err)
	}
	waitFired(t, fired, 5*time.Second, "an hour's timer after a jump of an hour")

	s.AfterFunc(100*time.Millisecond, f)
	s.SetOffset(0) // back by an hour: the timer is an hour and 100ms away
	select {
	case <-fired:
		t.Fatal("a timer went off early after the clock jumped back")
	case <-time.After(500 * time.Millisecond):
	}
	s.SetOffset(time.Hour + time.Second)
	waitFired(t, fired, 5*time.Second, "the delayed timer after the clock caught up")

	// Re-arming after they fired does not fire them again.
	s.SetOffset(2 * time.Hour)
	select {
	case <-fired:
		t.Fatal("a timer fired twice")
	case <-time.After(200 * time.Millisecond):
	}
	s.mu.Lock()
	n := len(s.timers)
	s.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d timers still pending", n)
	}
}

func TestOnClockChange(t *testing.T) {
	s := New(vfs.Default)
	calls := 0
	stop := s.OnClockChange(func() { calls++ })
	s.SetOffset(time.Second)
	s.Clear()
	if calls != 2 {
		t.Fatalf("%d calls, want 2 (a set and a clear)", calls)
	}
	stop()
	s.SetOffset(time.Second)
	if calls != 2 {
		t.Fatal("called after stop")
	}
}

func openFile(t *testing.T, s *State) vfs.File {
	t.Helper()
	f, err := s.FS().OpenFile(filepath.Join(t.TempDir(), "f"), os.O_CREATE|os.O_RDWR, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// fsync_count N fails the next N fsyncs and then stops; 0 fails every one
// until cleared; the status follows.
func TestSyncFaultCounting(t *testing.T) {
	s := New(vfs.Default)
	f := openFile(t, s)
	if err := s.FailSyncs("eio", 2); err != nil {
		t.Fatal(err)
	}
	if st := s.Status(); st.FsyncError != "eio" || st.FsyncCount != 2 {
		t.Fatalf("status %+v", st)
	}
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("first sync: %v", err)
	}
	if st := s.Status(); st.FsyncCount != 1 || st.FsyncFailures != 1 {
		t.Fatalf("status after one failure %+v", st)
	}
	if err := s.FS().SyncDir(filepath.Dir(t.TempDir())); !errors.Is(err, syscall.EIO) {
		t.Fatalf("second sync (a directory): %v", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("third sync: %v", err)
	}
	if st := s.Status(); st.FsyncError != "" || st.FsyncCount != 0 || st.FsyncFailures != 2 {
		t.Fatalf("status after the faults ran out %+v", st)
	}

	s.FailSyncs("enospc", 0)
	for i := range 10 {
		if err := f.Sync(); !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("sync %d with every fsync failing: %v", i, err)
		}
	}
	if st := s.Status(); st.FsyncError != "enospc" || st.FsyncCount != 0 {
		t.Fatalf("status %+v", st)
	}
	s.FailSyncs("none", 0)
	if err := f.Sync(); err != nil {
		t.Fatalf("sync after none: %v", err)
	}
	if err := s.FailSyncs("eperm", 1); err == nil {
		t.Fatal("eperm accepted")
	}
	if err := s.FailSyncs("eio", -1); err == nil {
		t.Fatal("a negative count accepted")
	}
}

func TestWriteFault(t *testing.T) {
	s := New(vfs.Default)
	f := openFile(t, s)
	s.FailWrites("eio")
	if n, err := f.Write([]byte("x")); n != 0 || !errors.Is(err, syscall.EIO) {
		t.Fatalf("write: %d %v", n, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("a write fault failed a sync: %v", err)
	}
	if st := s.Status(); st.WriteError != "eio" || st.WriteFailures != 1 {
		t.Fatalf("status %+v", st)
	}
	s.Clear()
	if n, err := f.Write([]byte("x")); n != 1 || err != nil {
		t.Fatalf("write after clear: %d %v", n, err)
	}
	if st := s.Status(); st.WriteError != "" {
		t.Fatalf("status after clear %+v", st)
	}
}

func TestDiskDelay(t *testing.T) {
	s := New(vfs.Default)
	f := openFile(t, s)
	const d = 25 * time.Millisecond
	if err := s.SetDiskDelay(d); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	f.Write([]byte("x"))
	f.Sync()
	s.FS().(vfs.WALHook).BeforeWALSync("wal") // the WAL's fsync waits too
	if took := time.Since(start); took < 3*d {
		t.Fatalf("a write and two syncs on a %v disk took %v", d, took)
	}
	if st := s.Status(); st.DiskDelay != "25ms" || st.DelayedOps != 3 {
		t.Fatalf("status %+v", st)
	}
	for _, bad := range []time.Duration{-time.Millisecond, MaxDiskDelay + 1} {
		if err := s.SetDiskDelay(bad); err == nil {
			t.Fatalf("delay %v accepted", bad)
		}
	}
	s.SetDiskDelay(0)
	if st := s.Status(); st.DiskDelay != "0s" {
		t.Fatalf("status %+v", st)
	}
}

// The normal build's process hooks are the real clock and filesystem and
// register nothing (the chaos build's are tested in http_chaos_test.go).
func TestNodeHooks(t *testing.T) {
	if Enabled {
		t.Skip("chaos build")
	}
	if _, ok := NodeClock().(System); !ok {
		t.Fatalf("NodeClock is %T, want the system clock", NodeClock())
	}
	if NodeFS() != vfs.Default {
		t.Fatalf("NodeFS is %T, want vfs.Default", NodeFS())
	}
}

// TestNowShiftsTheWallClockOnly: an offset moves what Now says the time is
// (Unix milliseconds) but not the durations measured between two Nows, as
// a step of the machine's clock leaves Go's monotonic clock alone; and it
// pins time.Time's layout, which wallShift relies on.
func TestNowShiftsTheWallClockOnly(t *testing.T) {
	s := New(vfs.Default)
	before := s.Now()
	if err := s.SetOffset(time.Hour); err != nil {
		t.Fatal(err)
	}
	after := s.Now()
	if d := after.Sub(before); d < 0 || d > time.Minute {
		t.Fatalf("a duration measured across a +1h step is %v, want the real time between the two reads", d)
	}
	if d := after.Round(0).Sub(before.Round(0)); d < time.Hour || d > time.Hour+time.Minute {
		t.Fatalf("the wall clock moved %v across a +1h step, want about 1h", d)
	}
	if got, want := after.UnixMilli()-time.Now().UnixMilli(), time.Hour.Milliseconds(); got < want-60_000 || got > want+60_000 {
		t.Fatalf("Now is %d ms from the real time, want about %d", got, want)
	}
	if err := s.SetOffset(-time.Hour); err != nil {
		t.Fatal(err)
	}
	if back := s.Now(); back.Sub(after) < 0 || !back.After(after) && !back.Equal(after) {
		t.Fatalf("after a -2h step, Now (%v) is before the earlier reading (%v) by the monotonic clock", back, after)
	}
	if w := wallShift(time.Unix(100, 0), time.Second); w.Unix() != 101 {
		t.Fatalf("wallShift of a time without a monotonic reading: %v", w)
	}
}
