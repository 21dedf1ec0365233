//go:build linux

package claude

import (
	"errors"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// connectNow connects to the Unix socket at path with non-blocking system calls, without the
// runtime's poller or a timer. errWouldBlock means the listener's backlog is full: no
// connection exists then.
func connectNow(path string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	for {
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: path})
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		if err == unix.EAGAIN {
			return -1, errWouldBlock
		}
		return -1, &net.OpError{Op: "dial", Net: "unix", Addr: &net.UnixAddr{Name: path, Net: "unix"}, Err: os.NewSyscallError("connect", err)}
	}
	return fd, nil
}

// dialWait connects within timeout. A Unix socket whose backlog is full offers nothing to
// wait on (poll reports it writable; a non-blocking connect says EAGAIN, and net.Dial gives
// up at once), so the connect is tried again after a pause that doubles from 1 ms to 50 ms:
// a session that is slow to accept gets the protocol's 5 s, and no thread is held meanwhile.
func dialWait(path string, timeout time.Duration) (net.Conn, error) {
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for {
		fd, err := connectNow(path)
		if err == nil {
			return adopt(fd)
		}
		if err != errWouldBlock || time.Now().Add(pause).After(deadline) {
			return nil, err
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
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
