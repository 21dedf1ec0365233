//go:build !linux

package peercred

import (
	"errors"
	"net"
)

// FromConn is not implemented off Linux. It always fails, so every gate that
// depends on it refuses every connection (fail closed) instead of trusting
// an unidentified peer.
func FromConn(c *net.UnixConn) (Cred, error) {
	return Cred{}, errors.New("peercred: SO_PEERCRED is only supported on linux")
}
