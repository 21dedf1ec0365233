// Package inq tells whether a connection has bytes waiting in its socket's receive queue, not
// yet read by anyone. A server about to evict an "idle" connection asks it first: a client
// that has spoken (its request is in the kernel, not yet read by a server busy accepting a
// flood) is not idle, and must not be the one closed to make room.
package inq

import (
	"net"
	"syscall"
)

// Pending reports whether c has unread bytes in its receive queue. False when it cannot tell
// (c has no descriptor, or not on Linux): the caller then goes by its own idea of idle.
func Pending(c net.Conn) bool {
	sc, ok := c.(interface {
		SyscallConn() (syscall.RawConn, error)
	})
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	if err := rc.Control(func(fd uintptr) { n = queued(fd) }); err != nil {
		return false
	}
	return n > 0
}
