//go:build linux

package inq

import "golang.org/x/sys/unix"

// queued is the count of unread bytes (SIOCINQ, FIONREAD by another name: Unix and TCP sockets alike), 0 on error.
func queued(fd uintptr) int {
	n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
	if err != nil {
		return 0
	}
	return n
}
