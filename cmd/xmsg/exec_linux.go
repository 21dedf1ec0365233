//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// reserveFDs occupies each free target number with /dev/null (close-on-exec, with raw
// system calls that open nothing else). A number already open was inherited: placeFD
// replaces it.
func reserveFDs(wants []credentialWant) error {
	for _, w := range wants {
		if _, err := unix.FcntlInt(uintptr(w.fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
			// Open already: inherited (placeFD replaces it), unless this process opened it
			// itself, such as the runtime's poller, which must not be replaced under it.
			if l, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(w.fd)); strings.HasPrefix(l, "anon_inode:") {
				return usageError{fmt.Sprintf("xmsg exec: fd %d is in use by xmsg itself (%s); choose another --fd", w.fd, l)}
			}
			continue
		}
		null, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("xmsg exec: open /dev/null: %w", err)
		}
		if null != w.fd {
			err = unix.Dup3(null, w.fd, unix.O_CLOEXEC)
			unix.Close(null)
			if err != nil {
				return fmt.Errorf("xmsg exec: reserve fd %d: %w", w.fd, err)
			}
		}
	}
	return nil
}

// placeFD moves f to number fd, not close-on-exec (CMD inherits it), and closes f.
func placeFD(f *os.File, fd int) error {
	defer f.Close()
	if err := unix.Dup3(int(f.Fd()), fd, 0); err != nil {
		return fmt.Errorf("xmsg exec: dup3 to fd %d: %w", fd, err)
	}
	return nil
}

func execve(path string, argv, env []string) error {
	return fmt.Errorf("xmsg exec: %w", syscall.Exec(path, argv, env))
}
