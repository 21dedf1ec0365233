//go:build linux

package claude

import (
	"errors"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// connectNow connects to the Unix socket at path with non-blocking system calls, without the
// runtime's poller or a timer. It returns fd -1 and no error when the connect would block (or
// no socket could be made): no connection exists then, and Write makes one through the poller.
func connectNow(path string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, nil
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINPROGRESS) || errors.Is(err, unix.EINTR) {
			return -1, nil
		}
		return -1, err
	}
	return fd, nil
}

// writeNow writes as much of line as the socket buffer takes without blocking and returns
// the rest (empty: all written).
func writeNow(fd int, line []byte) ([]byte, error) {
	for len(line) > 0 {
		n, err := unix.Write(fd, line)
		if n > 0 {
			line = line[n:]
		}
		switch {
		case err == nil || errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EAGAIN):
			return line, nil
		default:
			return nil, err
		}
	}
	return nil, nil
}

// adopt hands fd to the poller as a net.Conn; fd itself is closed (the conn holds a dup).
func adopt(fd int) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "inbox")
	c, err := net.FileConn(f)
	f.Close()
	return c, err
}

func closeNow(fd int) { unix.Close(fd) }
