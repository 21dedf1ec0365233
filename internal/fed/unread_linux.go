//go:build linux

package fed

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// unread reports whether bytes from the client wait in c's receive buffer (SIOCINQ): a
// connection whose ClientHello arrived but was not read yet (its goroutine not scheduled
// under load) has spoken, and is no silent holder to evict.
func unread(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n > 0
}
