//go:build linux

package activation

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// listenFDsStart is SD_LISTEN_FDS_START: systemd passes fds 3, 4, ...
const listenFDsStart = 3

// inherit takes the sockets that systemd passed. It returns (nil, nil) when
// LISTEN_PID does not name this process: then the fds are not ours.
//
// This is go-systemd's activation.Files plus the checks that it leaves to the
// caller (it drops nothing, checks no names and trusts LISTEN_FDS), and one
// it cannot make because it marks the fds close-on-exec first: an fd that
// already has FD_CLOEXEC set was opened by this process after exec (Go opens
// every fd close-on-exec), so it was not inherited and must be neither used
// nor closed — a LISTEN_FDS larger than what was really passed would
// otherwise make us adopt, and on error close, the runtime's own fds.
func inherit() (*Sockets, error) {
	pidEnv, fdsEnv, namesEnv := os.Getenv("LISTEN_PID"), os.Getenv("LISTEN_FDS"), os.Getenv("LISTEN_FDNAMES")
	handedOver := os.Getenv(EnvHandover)
	// Children must not mistake our fds for theirs (sd_listen_fds(3) with
	// unset_environment).
	for _, k := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", EnvHandover} {
		_ = os.Unsetenv(k)
	}
	if pid, err := strconv.Atoi(pidEnv); err != nil || pid != os.Getpid() {
		return nil, nil
	}
	n, err := strconv.Atoi(fdsEnv)
	if err != nil || n <= 0 {
		return nil, fmt.Errorf("activation: LISTEN_FDS=%q: want a positive number of fds", fdsEnv)
	}
	// Bound n before looping over it: systemd never passes more than a
	// handful here, and a huge value must not make us probe every fd.
	const maxFDs = 64
	if n > maxFDs {
		return nil, fmt.Errorf("activation: LISTEN_FDS=%d: more than %d fds", n, maxFDs)
	}

	// Take ownership of every fd first, so that every error path below
	// closes all of them.
	files := make([]*os.File, 0, n)
	closeAll := func() {
		for _, f := range files {
			_ = f.Close()
		}
	}
	for fd := listenFDsStart; fd < listenFDsStart+n; fd++ {
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("activation: fd %d: not open (LISTEN_FDS=%d): %w", fd, n, err)
		}
		if flags&unix.FD_CLOEXEC != 0 {
			closeAll()
			return nil, fmt.Errorf("activation: fd %d: not inherited (close-on-exec set; LISTEN_FDS=%d)", fd, n)
		}
		unix.CloseOnExec(fd)
		files = append(files, os.NewFile(uintptr(fd), "LISTEN_FD_"+strconv.Itoa(fd)))
	}
	defer closeAll() // net.FileListener dups; the originals are closed either way

	// An unnamed fd cannot be matched to a socket; a count mismatch means
	// the names and fds cannot be paired reliably.
	names := strings.Split(namesEnv, ":")
	if namesEnv == "" || len(names) != n {
		return nil, fmt.Errorf("activation: LISTEN_FDNAMES=%q: want one name per fd (LISTEN_FDS=%d)", namesEnv, n)
	}

	s := &Sockets{Activated: true}
	fail := func(err error) (*Sockets, error) {
		_ = s.Close()
		return nil, err
	}
	seen := map[string]int{}
	for i, f := range files {
		fd, name := listenFDsStart+i, names[i]
		var dst *net.Listener
		switch name {
		case NameHTTP:
			dst = &s.HTTP
		case NameAgent:
			dst = &s.Agent
		case NameRegister:
			dst = &s.Register
		default:
			// An fd we do not know is a misconfigured unit (or an fd
			// meant for someone else): refuse rather than ignore it.
			return fail(fmt.Errorf("activation: fd %d (name %q): unknown name, want http, agent or register", fd, name))
		}
		if prev, dup := seen[name]; dup {
			// Two sockets under one name: which one would we serve,
			// and who listens on the other?
			return fail(fmt.Errorf("activation: fd %d (name %q): duplicate name (also fd %d)", fd, name, prev))
		}
		seen[name] = fd
		if err := verifyListener(fd); err != nil {
			return fail(fmt.Errorf("activation: fd %d (name %q): %w", fd, name, err))
		}
		l, err := net.FileListener(f)
		if err != nil {
			return fail(fmt.Errorf("activation: fd %d (name %q): %w", fd, name, err))
		}
		// The socket unit owns the path: removing it on close would
		// leave systemd listening on an unreachable inode. Sockets handed
		// over by the daemon this one replaced are ours, as if bound here.
		if ul, ok := l.(*net.UnixListener); ok {
			ul.SetUnlinkOnClose(handedOver != "")
		}
		*dst = l
	}
	for _, name := range []string{NameHTTP, NameAgent, NameRegister} {
		if _, ok := seen[name]; !ok {
			s.Missing = append(s.Missing, name)
		}
	}
	if handedOver != "" {
		s.Activated, s.HandedOver = false, handedOver
	}
	return s, nil
}

// verifyListener checks one inherited fd: a listening AF_UNIX stream socket
// bound to a socket file owned by our euid with mode 0600, in a directory
// owned by our euid with mode 0700 that is not a symlink. These are the same
// guarantees the self-bind path gives, so that a mistake in a unit file
// (SocketMode=0666, a missing DirectoryMode=, another tier's socket) cannot
// open the bus to other users.
func verifyListener(fd int) error {
	domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if errors.Is(err, unix.ENOTSOCK) {
		return errors.New("not a socket")
	}
	if err != nil {
		return fmt.Errorf("getsockopt SO_DOMAIN: %w", err)
	}
	if domain != unix.AF_UNIX {
		return fmt.Errorf("socket family %d, want AF_UNIX", domain)
	}
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return fmt.Errorf("getsockopt SO_TYPE: %w", err)
	}
	if typ != unix.SOCK_STREAM {
		return fmt.Errorf("socket type %d, want SOCK_STREAM", typ)
	}
	acc, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if err != nil {
		return fmt.Errorf("getsockopt SO_ACCEPTCONN: %w", err)
	}
	if acc == 0 {
		return errors.New("socket is not listening")
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return fmt.Errorf("getsockname: %w", err)
	}
	ua, ok := sa.(*unix.SockaddrUnix)
	if !ok {
		return fmt.Errorf("getsockname: unexpected address type %T", sa)
	}
	path := ua.Name
	switch {
	case path == "":
		return errors.New("socket is not bound to a path")
	case path[0] == '@':
		// Abstract sockets have no file mode: any local user can
		// connect, so the directory and file barriers would be gone.
		return fmt.Errorf("abstract socket %q, want a socket file", path)
	case !filepath.IsAbs(path):
		// A relative path was resolved against the binder's working
		// directory, which we cannot know: we could check the wrong file.
		return fmt.Errorf("bound path %q is not absolute", path)
	}
	if err := checkDir(filepath.Dir(path)); err != nil {
		return err
	}
	return checkSocketFile(path)
}
