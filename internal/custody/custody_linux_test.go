//go:build linux

package custody

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const value = "s3cr3t-value-7f1e9c"

// syncBuf is a log sink safe for concurrent use.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// holder loads one secret "tok" from a 0600 file, allowed to svc:a, with both services
// trusted to exe; exe(pid) answers what the map says.
func holder(t *testing.T, exes map[int]string) (*Holder, string, *syncBuf) {
	t.Helper()
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	dir := t.TempDir()
	path := filepath.Join(dir, "tok")
	if err := os.WriteFile(path, []byte(value), 0o600); err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable()
	logs := &syncBuf{}
	h, err := Load(Config{
		Secrets: []Secret{{Name: "tok", File: path, Allow: []string{"a"}}},
		SvcExe:  map[string]string{"a": self, "b": self},
		Exe: func(pid int) (string, error) {
			if e, ok := exes[pid]; ok {
				return e, nil
			}
			return "", errors.New("no such process")
		},
		Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h, path, logs
}

func readAll(t *testing.T, f *os.File) string {
	t.Helper()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func code(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code.String()
	}
	return ""
}

func TestGivePolicy(t *testing.T) {
	self, _ := os.Executable()
	h, _, logs := holder(t, map[int]string{10: self, 11: "/usr/bin/other"})
	cases := []struct {
		name string
		p    Principal
		ask  string
		want string // code; "" = handed over
	}{
		{"allowed service", Principal{Service: "a", Actor: "svc:a", PID: 10}, "tok", ""},
		{"another service", Principal{Service: "b", Actor: "svc:b", PID: 10}, "tok", "op_denied"},
		{"not a service (claude session)", Principal{Actor: "claude:alice", PID: 10}, "tok", "op_denied"},
		{"exe no longer trusted (exec'd)", Principal{Service: "a", Actor: "svc:a", PID: 11}, "tok", "unattested"},
		{"process gone", Principal{Service: "a", Actor: "svc:a", PID: 12}, "tok", "unattested"},
		{"process replaced after its exe was read", Principal{Service: "a", Actor: "svc:a", PID: 10, Alive: func() bool { return false }}, "tok", "unattested"},
		{"still alive", Principal{Service: "a", Actor: "svc:a", PID: 10, Alive: func() bool { return true }}, "tok", ""},
		{"unknown secret", Principal{Service: "a", Actor: "svc:a", PID: 10}, "nope", "not_found"},
		{"unknown secret, not a service", Principal{Actor: "pid:5", PID: 5}, "nope", "op_denied"},
	}
	for _, c := range cases {
		f, g, err := h.Give(c.ask, c.p)
		if got := code(err); got != c.want {
			t.Errorf("%s: code %q, want %q (%v)", c.name, got, c.want, err)
		}
		if c.want != "" {
			if f != nil {
				t.Errorf("%s: refused but handed a file", c.name)
			}
			if strings.Contains(err.Error(), value) {
				t.Errorf("%s: error holds the value", c.name)
			}
			continue
		}
		if got := readAll(t, f); got != value {
			t.Errorf("%s: read %q", c.name, got)
		}
		if g.Name != "tok" || g.Pin != Pin([]byte(value)) {
			t.Errorf("%s: grant %+v", c.name, g)
		}
		f.Close()
	}
	if n := h.Handed("tok"); n != 2 {
		t.Errorf("handed %d, want 2", n)
	}
	// Audit: a line per outcome, none with the value; an unknown name is not echoed.
	l := logs.String()
	for _, want := range []string{"custody handed over", "custody refused", "code=op_denied", "code=unattested", "code=not_found", "actor=svc:b", "secret=unknown"} {
		if !strings.Contains(l, want) {
			t.Errorf("log lacks %q:\n%s", want, l)
		}
	}
	if strings.Contains(l, value) || strings.Contains(l, "nope") {
		t.Errorf("log holds the value or a client's name:\n%s", l)
	}
	for _, line := range h.Lines() {
		if strings.Contains(line, value) {
			t.Errorf("doctor line holds the value: %s", line)
		}
		if !strings.Contains(line, "tok pin "+Pin([]byte(value))) || !strings.Contains(line, "svc:a") || !strings.Contains(line, "handed over 2 times") {
			t.Errorf("doctor line %q", line)
		}
	}
}

// TestSealed: what is handed over is read-only and sealed: writing through it, through a
// read-write reopen of it, truncating, growing, mapping it writable and removing or adding
// seals all fail; each recipient has its own offset.
func TestSealed(t *testing.T) {
	self, _ := os.Executable()
	h, _, _ := holder(t, map[int]string{10: self})
	p := Principal{Service: "a", Actor: "svc:a", PID: 10}
	f, _, err := h.Give("tok", p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	if fl, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); fl&unix.FD_CLOEXEC == 0 {
		t.Error("handed fd is not close-on-exec")
	}
	if err := CheckSealed(fd); err != nil {
		t.Error(err)
	}
	if fl, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); fl&unix.O_ACCMODE != unix.O_RDONLY {
		t.Errorf("handed fd opened with access mode %#x, want read-only", fl&unix.O_ACCMODE)
	}
	if _, err := unix.Write(fd, []byte("x")); err == nil {
		t.Error("write through the handed fd succeeded")
	}
	rw, err := os.OpenFile("/proc/self/fd/"+itoa(fd), os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("reopen rw: %v", err) // allowed by the mode: the seals must stop the write
	}
	defer rw.Close()
	if _, err := rw.Write([]byte("x")); !errors.Is(err, unix.EPERM) {
		t.Errorf("write through a rw reopen: %v, want EPERM", err)
	}
	if err := rw.Truncate(1); err == nil {
		t.Error("shrink succeeded")
	}
	if err := rw.Truncate(1 << 20); err == nil {
		t.Error("grow succeeded")
	}
	if _, err := unix.Mmap(int(rw.Fd()), 0, len(value), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
		t.Error("writable shared mapping succeeded")
	}
	if _, err := unix.FcntlInt(rw.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE); err == nil {
		t.Error("adding a seal succeeded (F_SEAL_SEAL missing)")
	}
	// Own offsets: reading f to the end leaves a second hand-over at 0.
	readAll(t, f)
	g, _, err := h.Give("tok", p)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if got := readAll(t, g); got != value {
		t.Errorf("second recipient read %q", got)
	}
	// Still the value: nothing changed it.
	if b, _ := os.ReadFile("/proc/self/fd/" + itoa(int(g.Fd()))); string(b) != value {
		t.Errorf("content now %q", b)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestRotation: a changed file is picked up by Reload; an invalid one is refused and the held
// secret kept; an fd handed over before keeps the old content.
func TestRotation(t *testing.T) {
	self, _ := os.Executable()
	h, path, logs := holder(t, map[int]string{10: self})
	p := Principal{Service: "a", Actor: "svc:a", PID: 10}
	old, _, err := h.Give("tok", p)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if n := h.Reload(); n != 0 {
		t.Errorf("reload of an unchanged file rotated %d", n)
	}
	const next = "n3xt-value-22aa"
	tmp := path + ".new"
	os.WriteFile(tmp, []byte(next), 0o600)
	os.Rename(tmp, path)
	if n := h.Reload(); n != 1 {
		t.Fatalf("reload rotated %d, want 1", n)
	}
	f, g, err := h.Give("tok", p)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, f); got != next || g.Pin != Pin([]byte(next)) {
		t.Errorf("after rotation read %q pin %s", got, g.Pin)
	}
	f.Close()
	if got := readAll(t, old); got != value {
		t.Errorf("fd handed before the rotation reads %q", got)
	}
	// A file that fails creds' checks is refused; the held secret stays.
	os.Chmod(path, 0o644)
	if n := h.Reload(); n != 0 {
		t.Errorf("reload of a world-readable file rotated %d", n)
	}
	f, _, err = h.Give("tok", p)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, f); got != next {
		t.Errorf("after a refused reload read %q", got)
	}
	f.Close()
	if l := logs.String(); !strings.Contains(l, "custody reload refused") || strings.Contains(l, value) || strings.Contains(l, next) {
		t.Errorf("log:\n%s", l)
	}
}

// TestLoadRefuses: every check of package creds applies, and a secret without a source or
// without principals is a startup error; no error holds the content.
func TestLoadRefuses(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	dir := t.TempDir()
	write := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(value), mode)
		os.Chmod(p, mode)
		return p
	}
	good := write("good", 0o600)
	link := filepath.Join(dir, "link")
	os.Symlink(good, link)
	big := filepath.Join(dir, "big")
	os.WriteFile(big, bytes.Repeat([]byte("x"), 1<<20+1), 0o600)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o600)
	cases := []struct {
		name string
		s    Secret
		want string
	}{
		{"group readable", Secret{Name: "t", File: write("g", 0o640), Allow: []string{"a"}}, "accessible by group"},
		{"world readable", Secret{Name: "t", File: write("w", 0o604), Allow: []string{"a"}}, "accessible by group or others"},
		{"symlink", Secret{Name: "t", File: link, Allow: []string{"a"}}, "symlink"},
		{"too big", Secret{Name: "t", File: big, Allow: []string{"a"}}, "larger than"},
		{"empty", Secret{Name: "t", File: empty, Allow: []string{"a"}}, "empty"},
		{"no source", Secret{Name: "t", Allow: []string{"a"}}, "no $CREDENTIALS_DIRECTORY/custody-t"},
		{"no principal", Secret{Name: "t", File: good}, "no principal"},
		{"bad name", Secret{Name: "../t", File: good, Allow: []string{"a"}}, "invalid secret name"},
	}
	for _, c := range cases {
		h, err := Load(Config{Secrets: []Secret{c.s}})
		if err == nil {
			h.Close()
			t.Errorf("%s: loaded", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), value) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	// $CREDENTIALS_DIRECTORY/custody-<name> comes first.
	cd := t.TempDir()
	os.WriteFile(filepath.Join(cd, "custody-t"), []byte("from-systemd"), 0o400)
	t.Setenv("CREDENTIALS_DIRECTORY", cd)
	h, err := Load(Config{Secrets: []Secret{{Name: "t", File: good, Allow: []string{"a"}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if l := h.Lines()[0]; !strings.Contains(l, Pin([]byte("from-systemd"))) || !strings.Contains(l, "credentials-directory") {
		t.Errorf("doctor %q", l)
	}
}

// TestWireFD: a descriptor written with a line arrives with it through recvmsg,
// close-on-exec; a line without one arrives without.
func TestWireFD(t *testing.T) {
	self, _ := os.Executable()
	h, _, _ := holder(t, map[int]string{10: self})
	f, _, err := h.Give("tok", Principal{Service: "a", Actor: "svc:a", PID: 10})
	if err != nil {
		t.Fatal(err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		c, err := net.FileConn(os.NewFile(uintptr(fd), "sp"))
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		return c.(*net.UnixConn)
	}
	a, b := conn(fds[0]), conn(fds[1])
	defer a.Close()
	defer b.Close()
	if err := WriteFD(a, []byte("{\"status\":\"ok\"}\n"), f, time.Second); err != nil {
		t.Fatal(err)
	}
	f.Close()
	a.Write([]byte("{\"status\":\"second\"}\n"))
	line, got, err := ReadFD(b, 1<<16)
	if err != nil || got == nil {
		t.Fatalf("ReadFD: %q %v %v", line, got, err)
	}
	if string(line) != "{\"status\":\"ok\"}\n" {
		t.Errorf("line %q", line)
	}
	if fl, _ := unix.FcntlInt(got.Fd(), unix.F_GETFD, 0); fl&unix.FD_CLOEXEC == 0 {
		t.Error("received fd is not close-on-exec")
	}
	if v := readAll(t, got); v != value {
		t.Errorf("read %q", v)
	}
	got.Close()
	line, got, err = ReadFD(b, 1<<16)
	if err != nil || got != nil || string(line) != "{\"status\":\"second\"}\n" {
		t.Errorf("second: %q %v %v", line, got, err)
	}
}
