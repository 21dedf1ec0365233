//go:build linux

package activation

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xmsg/xmsg/internal/ostest"
)

// Environment of the re-executed test binary (see runChild).
const (
	envChildDir     = "XMSG_ACTIVATION_DIR"            // self-bind directory handed to Acquire
	envSetListenPID = "XMSG_ACTIVATION_SET_LISTEN_PID" // "1": set LISTEN_PID to our own pid first
	envCloexecFD3   = "XMSG_ACTIVATION_CLOEXEC_FD3"    // "1": make fd 3 a close-on-exec fd of our own
	envRelativeFD3  = "XMSG_ACTIVATION_RELATIVE_FD3"   // "1": make fd 3 a listener bound to a relative path
)

// Exit codes of the child.
const (
	childAcquireFailed = 3
	childEnvLeaked     = 4
	childSetupFailed   = 5
)

// childRole is the ostest role of the re-executed test binary (runChild).
const childRole = "activated"

func TestMain(m *testing.M) { ostest.Main(m, ostest.Roles{childRole: runChild}) }

// runChild is the daemon stand-in: it calls Acquire exactly as the daemon
// does, reports on stdout "activated=<bool> missing=<names>", then accepts
// one connection on every listener it got, writes the socket's name to it
// and exits 0. A failed Acquire is printed on stderr (exit 3).
func runChild() int {
	if os.Getenv(envSetListenPID) == "1" {
		// The trick that lets exec.Cmd (which cannot know the child's
		// pid in advance) hand over ExtraFiles as LISTEN_FDS.
		os.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()))
	}
	if os.Getenv(envCloexecFD3) == "1" {
		f, err := os.Open(os.DevNull)
		if err != nil {
			fmt.Fprintln(os.Stderr, "child setup:", err)
			return childSetupFailed
		}
		// fd 3 now looks like an fd this process opened itself.
		if err := unix.Dup3(int(f.Fd()), listenFDsStart, unix.O_CLOEXEC); err != nil {
			fmt.Fprintln(os.Stderr, "child setup:", err)
			return childSetupFailed
		}
	}
	if os.Getenv(envRelativeFD3) == "1" {
		// A socket bound to "agent.sock" in the working directory:
		// the kind of fd whose getsockname path cannot be checked.
		if err := relativeListenerAt3(); err != nil {
			fmt.Fprintln(os.Stderr, "child setup:", err)
			return childSetupFailed
		}
	}
	dir := os.Getenv(envChildDir)
	s, err := Acquire(Paths{
		HTTP:     filepath.Join(dir, "http.sock"),
		Agent:    filepath.Join(dir, "agent.sock"),
		Register: filepath.Join(dir, "register.sock"),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child error:", err)
		// Report whether fd 3 survived: an fd that was not inherited
		// must not be closed by Acquire.
		if _, ferr := unix.FcntlInt(listenFDsStart, unix.F_GETFD, 0); ferr == nil {
			fmt.Fprintln(os.Stderr, "child fd3=open")
		} else {
			fmt.Fprintln(os.Stderr, "child fd3=closed")
		}
		return childAcquireFailed
	}
	for _, k := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		if v, ok := os.LookupEnv(k); ok {
			fmt.Fprintf(os.Stderr, "child error: %s=%q still set after Acquire\n", k, v)
			return childEnvLeaked
		}
	}
	fmt.Printf("activated=%v missing=%s\n", s.Activated, strings.Join(s.Missing, ","))
	var wg sync.WaitGroup
	for name, l := range map[string]net.Listener{NameHTTP: s.HTTP, NameAgent: s.Agent, NameRegister: s.Register} {
		if l == nil {
			continue
		}
		wg.Go(func() {
			c, err := l.Accept()
			if err != nil {
				fmt.Fprintln(os.Stderr, "child accept:", err)
				return
			}
			_, _ = io.WriteString(c, name+"\n")
			_ = c.Close()
		})
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "child close:", err)
		return childSetupFailed
	}
	return 0
}

func relativeListenerAt3() error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	old := unix.Umask(0o177)
	err = unix.Bind(fd, &unix.SockaddrUnix{Name: "agent.sock"})
	unix.Umask(old)
	if err != nil {
		return err
	}
	if err := unix.Listen(fd, 1); err != nil {
		return err
	}
	// Dup3 without O_CLOEXEC: fd 3 looks inherited.
	return unix.Dup3(fd, listenFDsStart, 0)
}

// mkdir0700 creates a fresh 0700 directory under t.TempDir().
func mkdir0700(t *testing.T, name string) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), name)
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o700); err != nil { // whatever the umask was
		t.Fatal(err)
	}
	return d
}

func permOf(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	_, mode := owner(fi)
	return os.FileMode(mode)
}

// setUmask sets the process umask for the rest of the test.
func setUmask(t *testing.T, mask int) {
	t.Helper()
	old := unix.Umask(mask)
	t.Cleanup(func() { unix.Umask(old) })
}

// currentUmask reads the umask without changing it for longer than a call.
func currentUmask() int {
	m := unix.Umask(0)
	unix.Umask(m)
	return m
}
