//go:build !unix

package netio

import "errors"

// shutdownWrite is unsupported here; the caller closes outright instead.
func shutdownWrite(int) error { return errors.New("half-close unsupported") }
