//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// selfCheckPort is the TCP port the self-check tries to reach on loopback (discard). It is
// only ever refused by Landlock (EACCES) or by the kernel (no listener); no byte is sent.
const selfCheckPort = 9

// SelfCheck proves, from inside the running process right after Apply, that what the
// report calls enforced really is in force: listing "/" (outside every allowed path) and a
// TCP connect to loopback must both fail with EACCES. A report of "enforced" that the
// kernel does not back up is an error, so --require-landlock can refuse to go on.
//
// It returns a one-line summary for the log.
func SelfCheck(r Report, p Policy) (string, error) {
	var done []string
	if r.FS == Enforced && !slices.Contains(p.ReadOnly, "/") && !slices.Contains(p.ReadWrite, "/") {
		fd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
			return "", errors.New("sandbox: self-check: fs reported enforced, but listing / succeeded")
		}
		if !errors.Is(err, unix.EACCES) {
			return "", fmt.Errorf("sandbox: self-check: listing /: %w (want EACCES)", err)
		}
		done = append(done, "read outside allowed paths denied")
	}
	if r.Net == Enforced && !slices.Contains(p.ConnectTCP, selfCheckPort) {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		switch {
		case errors.Is(err, unix.EAFNOSUPPORT) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
			// An outer layer (systemd's RestrictAddressFamilies=, a seccomp filter) already
			// refuses IPv4 sockets: TCP is blocked before Landlock is even asked.
			done = append(done, "tcp sockets refused before landlock ("+err.Error()+")")
		case err != nil:
			return "", fmt.Errorf("sandbox: self-check: socket: %w", err)
		default:
			err = unix.Connect(fd, &unix.SockaddrInet4{Port: selfCheckPort, Addr: [4]byte{127, 0, 0, 1}})
			unix.Close(fd)
			if !errors.Is(err, unix.EACCES) {
				return "", fmt.Errorf("sandbox: self-check: net reported enforced, but a TCP connect to 127.0.0.1:%d gave %v (want EACCES)", selfCheckPort, err)
			}
			done = append(done, "tcp connect denied")
		}
	}
	if len(done) == 0 {
		return "landlock self-check: nothing enforced to check", nil
	}
	return "landlock self-check: " + strings.Join(done, ", "), nil
}
