//go:build chaos

package faults

import (
	"net/http"

	"github.com/heraldmq/herald/persistence/vfs"
)

// Enabled reports whether this is a chaos build (build tag chaos), whose
// faults can be armed.
const Enabled = true

// process is the fault state of this process, over the real filesystem.
var process = New(vfs.Default)

// NodeClock returns the broker's clock: the real time plus the offset set at
// /debug/faults.
func NodeClock() Clock { return process }

// NodeFS returns the filesystem for the node's data dir, with the faults set
// at /debug/faults (the WAL included).
func NodeFS() vfs.FS { return process.FS() }

// Register serves the fault state at Path (GET and POST) on the admin mux.
func Register(mux *http.ServeMux) { mux.Handle(Path, process) }

// OnClockChange calls f after every change of the clock's offset, until
// stop is called.
func OnClockChange(f func()) (stop func()) { return process.OnClockChange(f) }
