//go:build !unix

package activation

import (
	"errors"
	"net"
)

var errUnsupported = errors.New("activation: unix socket directories are not supported on this OS")

// EnsureDir is not supported off Unix: there is no owner or mode to verify.
func EnsureDir(dir string) error { return errUnsupported }

// Bind is not supported off Unix.
func Bind(path string) (*net.UnixListener, error) { return nil, errUnsupported }
