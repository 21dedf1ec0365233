//go:build linux

package peercred

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// FromConn returns the SO_PEERCRED credentials of the peer of c: the pid,
// uid and gid the kernel recorded when the peer called connect(2).
func FromConn(c *net.UnixConn) (Cred, error) {
	if c == nil {
		return Cred{}, errors.New("peercred: nil connection")
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("peercred: syscallconn: %w", err)
	}
	var (
		ucred  *unix.Ucred
		optErr error
	)
	err = raw.Control(func(fd uintptr) {
		ucred, optErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err != nil {
		return Cred{}, fmt.Errorf("peercred: control: %w", err)
	}
	if optErr != nil {
		return Cred{}, fmt.Errorf("peercred: getsockopt: %w", optErr)
	}
	return Cred{PID: int(ucred.Pid), UID: ucred.Uid, GID: ucred.Gid}, nil
}
