// Package ostest is test support for tests that need real OS facilities: root, real users,
// tools from the machine, and child processes. Outside CI a missing facility skips the test;
// in CI (CI=true) it fails it, so a clean CI machine can never pass by skipping: every test
// says what it needs with Need (or RequireRoot, RequireTool) and nothing else decides to skip.
//
// Child processes are the test binary itself, re-executed in a role: TestMain is
// ostest.Main(m, roles), and a test starts a child with Command(exe, role, args...). One
// protocol (the RoleEnv variable) serves every package, as go-landlock's single
// lltest.RunInSubprocess serves its tests.
package ostest

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Need skips (or, in CI, fails) the test unless cond holds.
func Need(t testing.TB, cond bool, what string) {
	t.Helper()
	if cond {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("this test needs %s", what)
	}
	t.Skipf("this test needs %s", what)
}

// RequireRoot needs euid 0.
func RequireRoot(t testing.TB) { t.Helper(); Need(t, os.Geteuid() == 0, "root") }

// RequireTool needs an executable on PATH and returns its path.
func RequireTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	Need(t, err == nil, name+" on PATH")
	return p
}

// User is a system user created for one test.
type User struct {
	Name     string
	UID, GID uint32
}

// AddUser creates a system user (with its own group, no home, no login shell) and deletes
// it when the test ends. Needs root and useradd.
func AddUser(t testing.TB) User {
	t.Helper()
	RequireRoot(t)
	RequireTool(t, "useradd")
	name := fmt.Sprintf("xmsgt%d", rand.IntN(1e8))
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() {
		// Reported, not ignored: a user left behind would outlive the test on the machine.
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return User{Name: name, UID: uint32(uid), GID: uint32(gid)}
}

// WorldExe returns a new temporary directory that every user can traverse (it and its parents
// below the system temporary directory get mode 0755) holding dir/name, a copy of the running
// test binary that every user can run: what a child started as another user needs.
func WorldExe(t testing.TB, name string) (dir, exe string) {
	t.Helper()
	dir = t.TempDir()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir, CopyExe(t, "", dir, name)
}

// CopyExe copies the executable src (the running test binary when "") to dir/name, mode
// 0755: a different file with the same content, closed before anyone can exec it.
func CopyExe(t testing.TB, src, dir, name string) string {
	t.Helper()
	if src == "" {
		src = os.Args[0]
	}
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, name)
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// RoleEnv names the role of a re-executed test binary: a test starts a copy of itself as a
// child process (a fake session, a client of another uid, a sandboxed probe) and the child's
// TestMain, through Main, runs that role instead of the tests.
const RoleEnv = "XMSG_TEST_ROLE"

// Roles maps a role name to what the re-executed test binary does in it; the result is the
// child's exit code.
type Roles map[string]func() int

// Main is the whole TestMain of a test binary that re-executes itself: it runs the role named
// by RoleEnv when this process is such a child, and the tests otherwise. Several role sets may
// be given (a package's own and a shared helper's); a name must not appear twice.
func Main(m *testing.M, roles ...Roles) {
	name := os.Getenv(RoleEnv)
	if name == "" {
		os.Exit(m.Run())
	}
	var run func() int
	for _, rs := range append(roles, Roles{DialRole: dial}) {
		if fn, ok := rs[name]; ok {
			if run != nil {
				fmt.Fprintf(os.Stderr, "ostest: role %q is defined twice\n", name)
				os.Exit(2)
			}
			run = fn
		}
	}
	if run == nil {
		fmt.Fprintf(os.Stderr, "ostest: unknown role %q\n", name)
		os.Exit(2)
	}
	os.Exit(run())
}

// Role returns the environment entry that selects role, for a child started with an
// environment of its own or by another program (systemd-socket-activate -E, a clean env).
func Role(role string) string { return RoleEnv + "=" + role }

// Command returns a command that runs exe (the running test binary when "") in role, with
// args and the current environment. The caller may add to Env, Stdin, SysProcAttr and so on.
// Grandchildren inherit the role unless they are given another one (the last entry for a
// name in Env wins).
func Command(exe, role string, args ...string) *exec.Cmd {
	if exe == "" {
		exe = os.Args[0]
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), Role(role))
	return cmd
}

// DialRole is a role every test binary using Main has: the smallest client of a Unix socket.
// It connects to DialSockEnv, writes DialSendEnv, half-closes (no more requests), reads until
// the server closes, and prints "bytes=N", what came back; or "dial-error <err>" when the
// connect fails. Run as another user it shows a peer gate at work: 0 bytes, nothing answered.
const DialRole = "dial"

// Environment of DialRole.
const (
	DialSockEnv = "XMSG_DIAL_SOCK"
	DialSendEnv = "XMSG_DIAL_SEND"
)

// DialCommand returns a command running exe ("" = this test binary) as DialRole against sock.
func DialCommand(exe, sock, send string) *exec.Cmd {
	cmd := Command(exe, DialRole)
	cmd.Env = append(cmd.Env, DialSockEnv+"="+sock, DialSendEnv+"="+send)
	return cmd
}

func dial() int {
	c, err := net.Dial("unix", os.Getenv(DialSockEnv))
	if err != nil {
		fmt.Printf("dial-error %v\n", err)
		return 0
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second)) // a safety net against hangs
	c.Write([]byte(os.Getenv(DialSendEnv)))
	c.(*net.UnixConn).CloseWrite() // no more requests: a line server answers, then closes
	n, _ := io.Copy(io.Discard, c)
	fmt.Printf("bytes=%d\n", n)
	return 0
}
