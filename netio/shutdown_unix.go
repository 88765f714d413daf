//go:build unix

package netio

import "syscall"

// shutdownWrite half-closes fd: the peer reads what was sent, then EOF.
func shutdownWrite(fd int) error { return syscall.Shutdown(fd, syscall.SHUT_WR) }
