// Package ostest is test support for tests that need real OS facilities: root, real users,
// and tools from the machine. Outside CI a missing facility skips the test; in CI
// (CI=true) it fails it, so a clean CI machine can never pass by skipping.
package ostest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
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
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	exe = filepath.Join(dir, name)
	if err := os.WriteFile(exe, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, exe
}
