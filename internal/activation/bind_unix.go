//go:build unix

package activation

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// umaskMu serialises this package's umask changes. The umask is process wide:
// the lock keeps two of our own binds from restoring each other's value, but
// a file created by another goroutine during a bind also gets umask 0177 (it
// can only come out narrower than intended, never wider).
var umaskMu sync.Mutex

// withUmask runs fn with the process umask set to mask and restores it.
func withUmask(mask int, fn func() error) error {
	umaskMu.Lock()
	defer umaskMu.Unlock()
	old := unix.Umask(mask)
	defer unix.Umask(old)
	return fn()
}

// EnsureDir creates dir (only its last element; the parent must exist) with
// mode 0700 if it is missing, then requires that it is not a symlink, is a
// directory, is owned by our euid and has mode bits exactly 0700. Any
// violation is an error wrapping [ErrInsecureSocketDir]: the directory is
// the barrier that keeps other users away from the sockets, so we fail
// closed rather than repair (chmod or chown) something another user may have
// planted.
func EnsureDir(dir string) error {
	dir = filepath.Clean(dir)
	// Mkdir under umask 0077 so that the result is exactly 0700 whatever
	// the process umask is (a narrower umask would otherwise leave a
	// directory that fails the check below).
	err := withUmask(0o077, func() error { return os.Mkdir(dir, 0o700) })
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("activation: %w: %w", ErrInsecureSocketDir, err)
	}
	if err := checkDir(dir); err != nil {
		return fmt.Errorf("activation: %w", err)
	}
	return nil
}

// checkDir verifies an existing socket directory (see [EnsureDir]). Its
// errors wrap [ErrInsecureSocketDir] and carry no package prefix.
func checkDir(dir string) error {
	// Lstat, not Stat: a symlink could point the sockets into a directory
	// someone else controls, and its target's mode says nothing about who
	// can replace the link.
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInsecureSocketDir, err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("%w: %s: is a symlink", ErrInsecureSocketDir, dir)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: %s: not a directory", ErrInsecureSocketDir, dir)
	}
	uid, mode := owner(fi)
	if euid := os.Geteuid(); uid != euid {
		return fmt.Errorf("%w: %s: owned by uid %d, want %d", ErrInsecureSocketDir, dir, uid, euid)
	}
	// Exactly 0700: any group/other bit lets another user at least look
	// up the sockets, and setgid/sticky bits are not ours to accept either.
	if mode != 0o700 {
		return fmt.Errorf("%w: %s: mode %04o, want 0700", ErrInsecureSocketDir, dir, mode)
	}
	return nil
}

// checkSocketFile verifies that path is a socket file owned by our euid with
// mode exactly 0600.
func checkSocketFile(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s: not a socket file (%s)", path, fi.Mode().Type())
	}
	uid, mode := owner(fi)
	if euid := os.Geteuid(); uid != euid {
		return fmt.Errorf("%s: owned by uid %d, want %d", path, uid, euid)
	}
	if mode != 0o600 {
		return fmt.Errorf("%s: mode %04o, want 0600", path, mode)
	}
	return nil
}

// owner returns the owner uid and the permission bits (including setuid,
// setgid and sticky) of fi.
func owner(fi fs.FileInfo) (uid int, mode uint32) {
	st := fi.Sys().(*syscall.Stat_t)
	return int(st.Uid), uint32(st.Mode) & 0o7777
}

// Bind self-binds one listening socket at path (absolute): it ensures the
// directory ([EnsureDir]), refuses when a live server answers on path or when
// path exists and is not a socket, removes a stale socket file, binds under
// umask 0177 and listens. The listener removes its socket file when closed.
func Bind(path string) (*net.UnixListener, error) {
	// Relative paths would depend on the working directory, and "@name"
	// would make an abstract socket, which has no file mode and no
	// directory: any local user could connect.
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("activation: bind %q: path must be absolute", path)
	}
	path = filepath.Clean(path)
	if err := EnsureDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	var l *net.UnixListener
	// Umask 0177 makes bind(2) create the file as 0600 directly: there is
	// no moment, as there is with bind-then-chmod, at which it is wider.
	err := withUmask(0o177, func() error {
		var err error
		l, err = net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("activation: bind %s: %w", path, err)
	}
	// Our own file in our own directory: remove it on a clean shutdown so
	// that the next start does not have to probe a stale socket.
	l.SetUnlinkOnClose(true)
	// A default ACL on the directory could still change the mode the
	// kernel gives the file; check what we got instead of trusting it.
	if err := checkSocketFile(path); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("activation: bind: %w", err)
	}
	return l, nil
}

// removeStale makes path free for bind: absent is fine; a socket nobody
// listens on is removed; a live server or anything that is not a socket is
// an error.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("activation: bind %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		// Never unlink a regular file (or a symlink, or a directory):
		// a wrong flag must not delete someone's data.
		return fmt.Errorf("activation: bind %s: exists and is not a socket (%s)", path, fi.Mode().Type())
	}
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err == nil {
		_ = c.Close()
		return fmt.Errorf("activation: another server instance is actively listening on %s", path)
	}
	// Only "connection refused" proves that nobody listens. Anything else
	// (EAGAIN from a full backlog, EACCES, a timeout) may be a live
	// server, whose socket we must not pull away.
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("activation: bind %s: probe existing socket: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("activation: bind %s: remove stale socket: %w", path, err)
	}
	return nil
}
