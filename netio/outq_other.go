//go:build !linux

package netio

// unsentBytes cannot tell on this platform: the write-stall clock then
// sees progress only when gnet writes more of the connection's output.
func unsentBytes(int) (int, bool) { return 0, false }
