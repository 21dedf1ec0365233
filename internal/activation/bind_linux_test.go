//go:build linux

package activation

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/xmsg/xmsg/internal/ostest"
)

func TestDefaultDir(t *testing.T) {
	tests := []struct {
		name    string
		xdg     string
		want    string
		wantErr string
	}{
		{name: "set", xdg: "/run/user/1000", want: "/run/user/1000/xmsg"},
		{name: "unset", xdg: "", wantErr: "insecure_socket_dir: XDG_RUNTIME_DIR is not set"},
		{name: "blank", xdg: "  ", wantErr: "insecure_socket_dir: XDG_RUNTIME_DIR is not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("XDG_RUNTIME_DIR", tt.xdg)
			got, err := DefaultDir()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrInsecureSocketDir) {
					t.Fatalf("DefaultDir() = %q, %v; want error containing %q wrapping ErrInsecureSocketDir", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("DefaultDir() = %q, %v; want %q", got, err, tt.want)
			}
			p, err := DefaultPaths()
			want := Paths{HTTP: tt.want + "/http.sock", Agent: tt.want + "/agent.sock", Register: tt.want + "/register.sock"}
			if err != nil || p != want {
				t.Fatalf("DefaultPaths() = %+v, %v; want %+v", p, err, want)
			}
		})
	}
}

func TestEnsureDir(t *testing.T) {
	tests := []struct {
		name     string
		root     bool                                 // needs root (chown)
		setup    func(t *testing.T, dir string) error // prepares dir (which does not exist yet)
		wantErr  string                               // "" = must succeed
		wantMode os.FileMode                          // mode after success
	}{
		{name: "missing is created 0700", setup: func(*testing.T, string) error { return nil }, wantMode: 0o700},
		{name: "existing 0700", setup: func(_ *testing.T, d string) error { return mkdirMode(d, 0o700) }, wantMode: 0o700},
		{name: "existing 0755", setup: func(_ *testing.T, d string) error { return mkdirMode(d, 0o755) }, wantErr: "mode 0755, want 0700"},
		{name: "existing 0500", setup: func(_ *testing.T, d string) error { return mkdirMode(d, 0o500) }, wantErr: "mode 0500, want 0700"},
		{name: "existing setgid 2700", setup: func(_ *testing.T, d string) error { return mkdirMode(d, os.ModeSetgid|0o700) }, wantErr: "mode 2700, want 0700"},
		{name: "symlink to a good dir", setup: func(t *testing.T, d string) error {
			target := mkdir0700(t, "target")
			return os.Symlink(target, d)
		}, wantErr: "is a symlink"},
		{name: "regular file", setup: func(_ *testing.T, d string) error { return os.WriteFile(d, nil, 0o600) }, wantErr: "not a directory"},
		{name: "owned by another uid", root: true, setup: func(_ *testing.T, d string) error {
			if err := mkdirMode(d, 0o700); err != nil {
				return err
			}
			return os.Chown(d, 65534, 65534)
		}, wantErr: "owned by uid 65534, want 0"},
		{name: "parent missing", setup: func(_ *testing.T, d string) error { return nil }, wantErr: "mkdir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root {
				ostest.RequireRoot(t)
			}
			dir := filepath.Join(t.TempDir(), "xmsg")
			if tt.name == "parent missing" {
				dir = filepath.Join(t.TempDir(), "no", "xmsg")
			}
			if err := tt.setup(t, dir); err != nil {
				t.Fatal(err)
			}
			err := EnsureDir(dir)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrInsecureSocketDir) {
					t.Fatalf("EnsureDir() = %v; want error containing %q wrapping ErrInsecureSocketDir", err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), dir) {
					t.Errorf("EnsureDir() = %v; want the error to name %s", err, dir)
				}
				return
			}
			if err != nil {
				t.Fatalf("EnsureDir() = %v; want nil", err)
			}
			if got := permOf(t, dir); got != tt.wantMode {
				t.Errorf("mode of %s = %04o; want %04o", dir, got, tt.wantMode)
			}
		})
	}
}

func mkdirMode(d string, mode os.FileMode) error {
	if err := os.Mkdir(d, 0o700); err != nil {
		return err
	}
	return os.Chmod(d, mode)
}

// TestEnsureDirCreatesWithoutWindow proves the directory is created 0700
// by mkdir itself, whatever the process umask: no chmod follows (inotify
// would report IN_ATTRIB), so it is never wider, not even for an instant.
func TestEnsureDirCreatesWithoutWindow(t *testing.T) {
	for _, mask := range []int{0, 0o022, 0o277} {
		t.Run(fmt.Sprintf("umask_%04o", mask), func(t *testing.T) {
			parent := mkdir0700(t, "run")
			w := newWatch(t, parent)
			setUmask(t, mask)
			dir := filepath.Join(parent, "xmsg")
			if err := EnsureDir(dir); err != nil {
				t.Fatalf("EnsureDir(umask %04o) = %v; want nil", mask, err)
			}
			if got := currentUmask(); got != mask {
				t.Errorf("umask after EnsureDir = %04o; want %04o (restored)", got, mask)
			}
			if got := permOf(t, dir); got != 0o700 {
				t.Errorf("mode = %04o; want 0700", got)
			}
			w.assertCreatedOnly(t, "xmsg")
		})
	}
}

// TestBindMode proves the socket file is 0600 right after Bind under any
// process umask (0 included), that the umask is restored, and that the
// file was created with that mode by bind(2) itself: inotify sees its
// creation and no attribute change, so there was no wider-then-chmod window.
func TestBindMode(t *testing.T) {
	for _, mask := range []int{0, 0o022, 0o077} {
		t.Run(fmt.Sprintf("umask_%04o", mask), func(t *testing.T) {
			dir := mkdir0700(t, "xmsg")
			w := newWatch(t, dir)
			setUmask(t, mask)
			path := filepath.Join(dir, "agent.sock")
			l, err := Bind(path)
			if err != nil {
				t.Fatalf("Bind(umask %04o) = %v; want nil", mask, err)
			}
			defer l.Close()
			if got := currentUmask(); got != mask {
				t.Errorf("umask after Bind = %04o; want %04o (restored)", got, mask)
			}
			if got := permOf(t, path); got != 0o600 {
				t.Errorf("socket mode = %04o; want 0600", got)
			}
			w.assertCreatedOnly(t, "agent.sock")
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatalf("dial the bound socket: %v", err)
			}
			c.Close()
		})
	}
}

func TestBindCreatesDir(t *testing.T) {
	setUmask(t, 0)
	dir := filepath.Join(t.TempDir(), "xmsg")
	l, err := Bind(filepath.Join(dir, "http.sock"))
	if err != nil {
		t.Fatalf("Bind() = %v; want nil", err)
	}
	defer l.Close()
	if got := permOf(t, dir); got != 0o700 {
		t.Errorf("dir mode = %04o; want 0700", got)
	}
}

func TestBindRefusesInsecureDir(t *testing.T) {
	dir := mkdir0700(t, "xmsg")
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "http.sock")
	if l, err := Bind(path); err == nil || !errors.Is(err, ErrInsecureSocketDir) {
		if l != nil {
			l.Close()
		}
		t.Fatalf("Bind() in a 0755 dir = %v; want an insecure_socket_dir error", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket file after refused Bind: %v; want it absent", err)
	}
}

// TestBindChecksResultingMode: a default ACL on the directory overrides
// what umask alone would give (here it makes the socket 0400). Bind checks
// the mode the kernel really gave the file instead of assuming 0600.
func TestBindChecksResultingMode(t *testing.T) {
	dir := mkdir0700(t, "xmsg")
	// system.posix_acl_default: version 2, then {tag, perm, id} entries:
	// user::r--, group::---, other::---.
	acl := []byte{2, 0, 0, 0,
		0x01, 0, 4, 0, 0xff, 0xff, 0xff, 0xff,
		0x04, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
		0x20, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
	}
	if err := unix.Setxattr(dir, "system.posix_acl_default", acl, 0); err != nil {
		t.Skipf("no POSIX ACLs on %s: %v", dir, err)
	}
	path := filepath.Join(dir, "http.sock")
	l, err := Bind(path)
	if err == nil {
		l.Close()
		t.Fatalf("Bind() under a default ACL giving 0400 = nil; want a mode error")
	}
	if want := path + ": mode 0400, want 0600"; !strings.Contains(err.Error(), want) {
		t.Fatalf("Bind() = %v; want error containing %q", err, want)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket file after refused Bind: %v; want it removed", err)
	}
}

func TestBindExistingPath(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, path string) // creates something at path
		wantErr string                          // "" = Bind must succeed
	}{
		{name: "live server", setup: func(t *testing.T, path string) {
			l, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
		}, wantErr: "another server instance is actively listening on "},
		{name: "live server with a full backlog", setup: func(t *testing.T, path string) {
			// listen(2) with backlog 0 queues one connection; the
			// next connect fails with EAGAIN instead of succeeding.
			// That is still a live server and must not be unlinked.
			fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Close(fd) })
			if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
				t.Fatal(err)
			}
			if err := unix.Listen(fd, 0); err != nil {
				t.Fatal(err)
			}
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
		}, wantErr: "probe existing socket"},
		{name: "stale socket", setup: func(t *testing.T, path string) {
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			l.SetUnlinkOnClose(false)
			l.Close() // the file stays, nobody listens
		}},
		{name: "regular file", setup: func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, wantErr: "exists and is not a socket"},
		{name: "directory", setup: func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}, wantErr: "exists and is not a socket"},
		{name: "symlink to a stale socket", setup: func(t *testing.T, path string) {
			target := filepath.Join(filepath.Dir(path), "target.sock")
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: target, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			l.SetUnlinkOnClose(false)
			l.Close()
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
		}, wantErr: "exists and is not a socket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := mkdir0700(t, "xmsg")
			path := filepath.Join(dir, "http.sock")
			tt.setup(t, path)
			before, _ := os.Lstat(path)
			l, err := Bind(path)
			if tt.wantErr != "" {
				if err == nil {
					l.Close()
					t.Fatalf("Bind() = nil; want error containing %q", tt.wantErr)
				}
				if want := tt.wantErr; !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), path) {
					t.Fatalf("Bind() = %v; want error containing %q and naming %s", err, want, path)
				}
				after, err := os.Lstat(path)
				if err != nil || !os.SameFile(before, after) {
					t.Errorf("after refused Bind, %s was replaced or removed (%v)", path, err)
				}
				if tt.name == "regular file" {
					if b, _ := os.ReadFile(path); string(b) != "precious" {
						t.Errorf("regular file content = %q; want it untouched", b)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Bind() = %v; want nil", err)
			}
			defer l.Close()
			// Nobody listened on the stale file, so a successful dial
			// proves it was replaced (inode numbers may be reused).
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatalf("dial the new socket: %v", err)
			}
			c.Close()
		})
	}
}

func TestBindRejectsPath(t *testing.T) {
	for _, path := range []string{"relative.sock", "@abstract-xmsg-test", ""} {
		if l, err := Bind(path); err == nil || !strings.Contains(err.Error(), "must be absolute") {
			if l != nil {
				l.Close()
			}
			t.Errorf("Bind(%q) = %v; want a 'must be absolute' error", path, err)
		}
	}
}

// TestBindCloseRemovesFile: a clean shutdown leaves no stale socket.
func TestBindCloseRemovesFile(t *testing.T) {
	path := filepath.Join(mkdir0700(t, "xmsg"), "register.sock")
	l, err := Bind(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Lstat after Close = %v; want not exist", err)
	}
}

func TestAcquireSelfBind(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "xmsg")
	p := Paths{HTTP: dir + "/http.sock", Agent: dir + "/agent.sock", Register: dir + "/register.sock"}
	s, err := Acquire(p)
	if err != nil {
		t.Fatalf("Acquire() = %v; want nil", err)
	}
	if s.Activated || len(s.Missing) != 0 {
		t.Errorf("Acquire() = activated %v missing %v; want false, none", s.Activated, s.Missing)
	}
	for _, path := range []string{p.HTTP, p.Agent, p.Register} {
		if got := permOf(t, path); got != 0o600 {
			t.Errorf("%s mode = %04o; want 0600", path, got)
		}
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Errorf("dial %s: %v", path, err)
			continue
		}
		c.Close()
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	for _, path := range []string{p.HTTP, p.Agent, p.Register} {
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Close: %v; want removed", path, err)
		}
	}
}

func TestAcquireSelfBindEmptyPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "xmsg")
	s, err := Acquire(Paths{Agent: dir + "/agent.sock", Register: dir + "/register.sock"})
	if err != nil {
		t.Fatalf("Acquire() = %v; want nil", err)
	}
	defer s.Close()
	if s.HTTP != nil || s.Agent == nil || s.Register == nil {
		t.Errorf("listeners http=%v agent=%v register=%v; want only agent and register", s.HTTP, s.Agent, s.Register)
	}
	if want := []string{"http"}; !slices.Equal(s.Missing, want) {
		t.Errorf("Missing = %v; want %v", s.Missing, want)
	}
}

// TestAcquireSelfBindFailureCleansUp: when the last socket cannot be bound,
// the ones already bound are closed and their files removed.
func TestAcquireSelfBindFailureCleansUp(t *testing.T) {
	dir := mkdir0700(t, "xmsg")
	p := Paths{HTTP: dir + "/http.sock", Agent: dir + "/agent.sock", Register: dir + "/register.sock"}
	if err := os.WriteFile(p.Register, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := Acquire(p); err == nil {
		s.Close()
		t.Fatal("Acquire() = nil; want an error for the regular file at register.sock")
	}
	for _, path := range []string{p.HTTP, p.Agent} {
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after failed Acquire: %v; want removed", path, err)
		}
	}
}

// TestAcquireForeignListenPID: LISTEN_* inherited from a parent (LISTEN_PID
// is not ours) means the fds are not ours: self-bind, and drop the variables.
func TestAcquireForeignListenPID(t *testing.T) {
	t.Setenv("LISTEN_PID", "1")
	t.Setenv("LISTEN_FDS", "1")
	t.Setenv("LISTEN_FDNAMES", "http")
	dir := filepath.Join(t.TempDir(), "xmsg")
	s, err := Acquire(Paths{HTTP: dir + "/http.sock", Agent: dir + "/agent.sock", Register: dir + "/register.sock"})
	if err != nil {
		t.Fatalf("Acquire() = %v; want nil", err)
	}
	defer s.Close()
	if s.Activated {
		t.Errorf("Activated = true; want false (LISTEN_PID names another process)")
	}
	for _, k := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		if v, ok := os.LookupEnv(k); ok {
			t.Errorf("%s=%q after Acquire; want unset", k, v)
		}
	}
}

// TestSocketsCloseAfterServers: a clean stop closes each listener in its server first; the
// sockets' own Close after that is no error (it was logged as a warning on every stop).
func TestSocketsCloseAfterServers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "xmsg")
	s, err := Acquire(Paths{HTTP: dir + "/http.sock", Agent: dir + "/agent.sock", Register: dir + "/register.sock"})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []net.Listener{s.HTTP, s.Agent, s.Register} {
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close() after the servers closed their listeners = %v; want nil", err)
	}
}

func TestSocketsCloseNil(t *testing.T) {
	var s *Sockets
	if err := s.Close(); err != nil {
		t.Errorf("(*Sockets)(nil).Close() = %v; want nil", err)
	}
}

// watch is an inotify watch on one directory.
type watch struct{ fd int }

func newWatch(t *testing.T, dir string) *watch {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_ATTRIB); err != nil {
		t.Fatal(err)
	}
	return &watch{fd: fd}
}

// assertCreatedOnly checks that name was created in the watched directory
// and that its attributes (mode) were never changed afterwards.
func (w *watch) assertCreatedOnly(t *testing.T, name string) {
	t.Helper()
	buf := make([]byte, 64*1024)
	n, err := unix.Read(w.fd, buf)
	if err != nil {
		t.Fatalf("read inotify events: %v", err)
	}
	var created bool
	for off := 0; off+unix.SizeofInotifyEvent <= n; {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
		evName := string(bytes.TrimRight(nameBytes, "\x00"))
		off += unix.SizeofInotifyEvent + int(ev.Len)
		if evName != name {
			continue
		}
		if ev.Mask&unix.IN_CREATE != 0 {
			created = true
		}
		if ev.Mask&unix.IN_ATTRIB != 0 {
			t.Errorf("inotify: IN_ATTRIB on %s: its mode was changed after creation (a window where it had another mode)", name)
		}
	}
	if !created {
		t.Errorf("inotify: no IN_CREATE for %s", name)
	}
}
