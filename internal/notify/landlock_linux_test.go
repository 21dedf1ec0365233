//go:build linux

package notify

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"

	"github.com/xmsg/xmsg/internal/ostest"
)

func TestMain(m *testing.M) { ostest.Main(m, ostest.Roles{"sandboxed": runSandboxedChild}) }

// runSandboxedChild follows the daemon's order: Open, then Landlock (here
// just the abstract-unix scope), then notify. It proves on the way that the
// sandbox really refuses a fresh connect (so the test is not vacuous).
func runSandboxedChild() int {
	addr := os.Getenv("NOTIFY_SOCKET")
	n, err := Open()
	if err != nil {
		fmt.Println("open:", err)
		return 1
	}
	if err := (landlock.Config{Scoped: llsys.ScopeAbstractUnixSocket}).RestrictScoped(); err != nil {
		fmt.Println("landlock:", err)
		return 1
	}
	// Positive control: what go-systemd's per-message dial would do now.
	if c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"}); err == nil {
		c.Close()
		fmt.Println("control: a fresh connect succeeded inside the sandbox")
		return 1
	} else if !errors.Is(err, syscall.EPERM) {
		fmt.Println("control: fresh connect:", err)
		return 1
	}
	if err := n.Ready(); err != nil {
		fmt.Println("ready:", err)
		return 1
	}
	fmt.Println("ok")
	return 0
}

// TestNotifyInsideLandlockScope: after Landlock's abstract-unix scoping a
// process can no longer connect to an abstract socket outside its sandbox
// (systemd's notify socket can be one), yet READY=1 still arrives because
// the socket was connected by Open, before the sandbox.
func TestNotifyInsideLandlockScope(t *testing.T) {
	abi, err := llsys.LandlockGetABIVersion()
	ostest.Need(t, err == nil && abi >= 6, fmt.Sprintf("Landlock ABI 6 for abstract-unix scoping (the kernel offers %d, %v)", abi, err))
	addr := "@xmsg-notify-landlock-" + strconv.Itoa(os.Getpid())
	l := listen(t, addr)
	cmd := ostest.Command("", "sandboxed")
	cmd.Env = append(cmd.Env, "NOTIFY_SOCKET="+addr)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("sandboxed child: %v\n%s", err, &out)
	}
	if got := strings.TrimSpace(out.String()); got != "ok" {
		t.Fatalf("sandboxed child said %q; want ok", got)
	}
	if got := recv(t, l); got != "READY=1" {
		t.Errorf("got %q; want READY=1", got)
	}
}
