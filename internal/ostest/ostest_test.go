package ostest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestMain(m *testing.M) {
	Main(m, Roles{
		"echo": func() int {
			os.Stdout.WriteString(strings.Join(os.Args[1:], " ") + " " + os.Getenv("EXTRA"))
			return 7
		},
	})
}

// TestCommandRunsRole: a child started by Command runs its role with the arguments and the
// environment given, exits with the role's result, and runs no test.
func TestCommandRunsRole(t *testing.T) {
	cmd := Command("", "echo", "a", "b")
	cmd.Env = append(cmd.Env, "EXTRA=x")
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("exit: got %v, want code 7", err)
	}
	if string(out) != "a b x" {
		t.Errorf("output: got %q, want %q", out, "a b x")
	}
}

// TestUnknownRole: a role the binary does not define is an error, not a test run.
func TestUnknownRole(t *testing.T) {
	out, err := Command("", "nonesuch").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), `unknown role "nonesuch"`) {
		t.Errorf("got %v %q, want exit 2 naming the role", err, out)
	}
}

// TestNeedInCI: in CI a missing facility fails the test instead of skipping it.
func TestNeedInCI(t *testing.T) {
	for _, ci := range []string{"true", ""} {
		t.Setenv("CI", ci)
		var r recorder
		func() {
			defer func() { recover() }()
			Need(&r, false, "a thing")
		}()
		if ci == "true" && (!r.failed || r.skipped) {
			t.Errorf("CI=true: failed=%v skipped=%v, want a failure", r.failed, r.skipped)
		}
		if ci == "" && (r.failed || !r.skipped) {
			t.Errorf("CI unset: failed=%v skipped=%v, want a skip", r.failed, r.skipped)
		}
		if !strings.Contains(r.msg, "needs a thing") {
			t.Errorf("message %q does not say what is needed", r.msg)
		}
	}
}

// recorder is a testing.TB that records Fatalf/Skipf instead of ending the test.
type recorder struct {
	testing.TB
	failed, skipped bool
	msg             string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, sprintf(format, args...)
	panic("fatal")
}
func (r *recorder) Skipf(format string, args ...any) {
	r.skipped, r.msg = true, sprintf(format, args...)
	panic("skip")
}

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }
