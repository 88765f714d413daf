//go:build race

package client

// raceEnabled is set when tests run under the race detector, which makes
// some allocation-free code allocate.
const raceEnabled = true
