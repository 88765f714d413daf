//go:build linux

package netio

import "golang.org/x/sys/unix"

// unsentBytes is how many bytes the kernel still holds unsent in the
// socket's send queue (SIOCOUTQ), if it can tell.
func unsentBytes(fd int) (int, bool) {
	n, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
	return n, err == nil
}
