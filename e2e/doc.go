// Package e2e holds Herald's end-to-end tests: real brokers on loopback with
// real files and fsync, driven through the Go SDK, raw sockets and the CLI.
// The same suite runs against an in-process broker (broker.Start) and
// against the built binary as a subprocess, which is also what the crash
// tests SIGKILL.
package e2e
