//go:build linux

package claude

import (
	"errors"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// deliverFast connects and writes with non-blocking system calls: in the common case (room
// in the listener's backlog and in the socket buffer) that is four system calls, without the
// runtime's poller or a timer. done is false only when the connect would block, before any
// connection exists; then the caller delivers through the net package, which waits with a
// timeout. A write that would block is finished through the poller, with the timeout, on the
// same connection: the inbox sees exactly one connection and one line either way.
func deliverFast(path string, line []byte, timeout time.Duration) (done bool, err error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false, nil
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINPROGRESS) || errors.Is(err, unix.EINTR) {
			return false, nil
		}
		return true, err
	}
	for len(line) > 0 {
		n, err := unix.Write(fd, line)
		if n > 0 {
			line = line[n:]
		}
		switch {
		case err == nil || errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return true, finishWrite(fd, line, timeout)
		default:
			unix.Close(fd)
			return true, err
		}
	}
	unix.Close(fd)
	return true, nil
}

// finishWrite writes the rest of line on fd through the poller, within timeout, and closes fd.
func finishWrite(fd int, line []byte, timeout time.Duration) error {
	f := os.NewFile(uintptr(fd), "inbox")
	c, err := net.FileConn(f) // dups fd
	f.Close()
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := c.Write(line); err != nil {
		if isTimeout(err) {
			return ErrInboxTimeout
		}
		return err
	}
	return nil
}
