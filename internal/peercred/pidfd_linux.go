//go:build linux

package peercred

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Pidfd is a handle on one process (pidfd_open): whether it has exited is one poll(2), with
// no /proc read, and it cannot come to name another process when the pid is reused.
type Pidfd struct{ f *os.File }

// OpenPidfd opens a pidfd for pid and confirms that it names the process with start time
// start: the start time is read after the pidfd is open, and a pid cannot be held by two
// processes at once, so a match means the pidfd is that process's. ErrExited means it is gone.
// Only the real /proc is supported (a test tree under Root has no pidfds).
func (p Proc) OpenPidfd(pid int, start string) (*Pidfd, error) {
	if p.Root != "" && p.Root != "/proc" {
		return nil, errors.New("peercred: pidfd needs the real /proc")
	}
	if pid <= 0 {
		return nil, fmt.Errorf("peercred: invalid pid %d", pid)
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return nil, ErrExited
	}
	if err != nil {
		return nil, fmt.Errorf("peercred: pidfd_open: %w", err)
	}
	if !p.Alive(pid, start) {
		unix.Close(fd)
		return nil, ErrExited
	}
	return &Pidfd{f: os.NewFile(uintptr(fd), "pidfd")}, nil
}

func pidfdExited(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(p, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		// An error is a bad descriptor, never a live process: fail closed.
		return err != nil || n > 0
	}
}

// Exited reports whether the process has exited (a zombie has). known is false when the
// Pidfd was closed meanwhile: then the caller must ask /proc.
func (w *Pidfd) Exited() (exited, known bool) {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return false, false
	}
	if err := rc.Control(func(fd uintptr) { exited = pidfdExited(int(fd)) }); err != nil {
		return false, false
	}
	return exited, true
}

// Wait blocks until the process exits (true) or the Pidfd is closed (false). It waits in the
// runtime's poller: no thread is held per process.
func (w *Pidfd) Wait() bool {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return false
	}
	var exited bool
	err = rc.Read(func(fd uintptr) bool {
		exited = pidfdExited(int(fd))
		return exited
	})
	return err == nil && exited
}

// Close releases the handle; a Wait in progress returns false.
func (w *Pidfd) Close() { w.f.Close() }
