//go:build !chaos

package faults

import (
	"net/http"

	"github.com/heraldmq/herald/persistence/vfs"
)

// Enabled reports whether this is a chaos build (build tag chaos), whose
// faults can be armed.
const Enabled = false

// NodeClock returns the broker's clock: the system clock outside a chaos build.
func NodeClock() Clock { return System{} }

// NodeFS returns the filesystem for the node's data dir: the real one outside
// a chaos build.
func NodeFS() vfs.FS { return vfs.Default }

// Register adds the fault endpoint to the admin mux: nothing outside a
// chaos build, where /debug/faults is not found (404).
func Register(*http.ServeMux) {}

// OnClockChange calls f after every change of the clock's offset: never
// outside a chaos build.
func OnClockChange(func()) (stop func()) { return func() {} }
