//go:build linux

package peercred

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xmsg/xmsg/internal/ostest"
)

// The child client is ostest's DialRole: it connects, reads until EOF and exits.
func TestMain(m *testing.M) { ostest.Main(m) }

// start runs a command and ends it (by its own pid) when the test ends.
func start(t *testing.T, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

func sleepPath(t *testing.T) string {
	t.Helper()
	return ostest.RequireTool(t, "sleep")
}

func TestStatRealChild(t *testing.T) {
	cmd := start(t, exec.Command(sleepPath(t), "60"))
	var p Proc
	st, err := p.Stat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if st.PID != cmd.Process.Pid || st.PPID != os.Getpid() || st.Comm != "sleep" {
		t.Errorf("Stat(child) = %+v, want pid %d ppid %d comm sleep", st, cmd.Process.Pid, os.Getpid())
	}
	if _, err := strconv.ParseUint(st.StartTime, 10, 64); err != nil {
		t.Errorf("StartTime %q is not a decimal number", st.StartTime)
	}
	self, err := p.Stat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if startedAfter(self, st) {
		t.Errorf("our start time %s is after our child's %s", self.StartTime, st.StartTime)
	}
	if !p.Alive(st.PID, st.StartTime) {
		t.Error("Alive(child, its start time) = false, want true")
	}
	if p.Alive(st.PID, st.StartTime+"0") {
		t.Error("Alive(child, wrong start time) = true, want false")
	}
	if p.Alive(st.PID, "") {
		t.Error("Alive(child, \"\") = true, want false")
	}
	cmd.Process.Kill()
	cmd.Wait() // reaped: its /proc entry is gone
	if p.Alive(st.PID, st.StartTime) {
		t.Error("Alive(exited child, its start time) = true, want false")
	}
	if _, err := p.StartTime(st.PID); err == nil {
		t.Error("StartTime(exited child) succeeded")
	}
}

// TestStatCommWithParen runs a real process whose comm (its executable's
// name) contains a space and ')'.
func TestStatCommWithParen(t *testing.T) {
	dir := t.TempDir()
	exe := ostest.CopyExe(t, sleepPath(t), dir, "a) b")
	cmd := start(t, exec.Command(exe, "60"))
	st, err := Proc{}.Stat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if st.Comm != "a) b" || st.PPID != os.Getpid() {
		t.Errorf("Stat = %+v, want comm %q ppid %d", st, "a) b", os.Getpid())
	}
}

func TestAncestorsRealChain(t *testing.T) {
	// sh is our child; the sleep it starts in the background is our grandchild.
	cmd := exec.Command("sh", "-c", "sleep 60 & echo $!; wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the group we created: sh and its sleep
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	grandchild, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	var p Proc
	chain, err := p.Ancestors(grandchild, 32)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) < 3 {
		t.Fatalf("Ancestors(grandchild) = %+v, want at least 3 entries", chain)
	}
	want := []int{grandchild, cmd.Process.Pid, os.Getpid()}
	for i, pid := range want {
		if chain[i].PID != pid {
			t.Errorf("Ancestors(grandchild)[%d].PID = %d, want %d", i, chain[i].PID, pid)
		}
	}
	// chain[0].Comm is not checked: the grandchild may not have exec'd
	// sleep yet when sh prints its pid.
	if last := chain[len(chain)-1]; len(chain) < 32 && last.PPID > 1 {
		t.Errorf("walk stopped at %+v with ppid > 1", last)
	}
	for i := 1; i < len(chain); i++ {
		if chain[i-1].PPID != chain[i].PID {
			t.Errorf("chain[%d].PPID = %d, but chain[%d].PID = %d", i-1, chain[i-1].PPID, i, chain[i].PID)
		}
	}
	if short, err := p.Ancestors(grandchild, 2); err != nil || len(short) != 2 {
		t.Errorf("Ancestors(grandchild, 2) = %d entries, %v; want 2", len(short), err)
	}
}

func TestExeRealChild(t *testing.T) {
	sleep := sleepPath(t)
	want, err := Canonical(sleep)
	if err != nil {
		t.Fatal(err)
	}
	cmd := start(t, exec.Command(sleep, "60"))
	if got, err := (Proc{}).Exe(cmd.Process.Pid); err != nil || got != want {
		t.Errorf("Exe(child) = %q, %v; want %q", got, err, want)
	}
}

func TestExeDeleted(t *testing.T) {
	dir := t.TempDir()
	exe := ostest.CopyExe(t, sleepPath(t), dir, "sleeper")
	cmd := start(t, exec.Command(exe, "60"))
	var p Proc
	if _, err := p.Exe(cmd.Process.Pid); err != nil {
		t.Fatalf("Exe(child) before delete: %v", err)
	}
	if err := os.Remove(exe); err != nil {
		t.Fatal(err)
	}
	if got, err := p.Exe(cmd.Process.Pid); err == nil {
		t.Errorf("Exe(child of a deleted binary) = %q, want an error", got)
	}
}

// TestExeReplacedByRename: a new file renamed over the path: the link text
// says deleted, so Exe fails even though the path exists again.
func TestExeReplacedByRename(t *testing.T) {
	dir := t.TempDir()
	exe := ostest.CopyExe(t, sleepPath(t), dir, "sleeper")
	cmd := start(t, exec.Command(exe, "60"))
	other := ostest.CopyExe(t, sleepPath(t), dir, "other")
	if err := os.Rename(other, exe); err != nil {
		t.Fatal(err)
	}
	if got, err := (Proc{}).Exe(cmd.Process.Pid); err == nil {
		t.Errorf("Exe(child of a replaced binary) = %q, want an error", got)
	}
}

// TestExeMountedOver: a file bind-mounted over the path of the running
// binary. The link text still names the path and no " (deleted)" appears;
// only the device/inode comparison notices that the path now names another
// file.
func TestExeMountedOver(t *testing.T) {
	ostest.RequireRoot(t)
	dir := t.TempDir()
	exe := ostest.CopyExe(t, sleepPath(t), dir, "sleeper")
	cmd := start(t, exec.Command(exe, "60"))
	impostor := filepath.Join(dir, "impostor")
	if err := os.WriteFile(impostor, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := unix.Mount(impostor, exe, "", unix.MS_BIND, "")
	ostest.Need(t, err == nil, fmt.Sprintf("a bind mount (%v)", err))
	t.Cleanup(func() { unix.Unmount(exe, unix.MNT_DETACH) })
	if got, err := (Proc{}).Exe(cmd.Process.Pid); err == nil {
		t.Errorf("Exe(child whose binary path is mounted over) = %q, want an error", got)
	}
}

func listen(t *testing.T, dir string) (*net.UnixListener, string) {
	t.Helper()
	path := filepath.Join(dir, "s.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, path
}

func TestFromConnSelf(t *testing.T) {
	l, path := listen(t, t.TempDir())
	client, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := l.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	want := Cred{PID: os.Getpid(), UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
	for name, c := range map[string]*net.UnixConn{"server side": server, "client side": client} {
		if got, err := FromConn(c); err != nil || got != want {
			t.Errorf("FromConn(%s) = %+v, %v; want %+v", name, got, err, want)
		}
	}
	if _, err := FromConn(nil); err == nil {
		t.Error("FromConn(nil) succeeded")
	}
	server.Close()
	if _, err := FromConn(server); err == nil {
		t.Error("FromConn(closed conn) succeeded")
	}
}

// TestFromConnChild checks that the pid is the connecting process's, not ours.
func TestFromConnChild(t *testing.T) {
	l, path := listen(t, t.TempDir())
	cmd := ostest.DialCommand("", path, "")
	start(t, cmd)
	c, err := l.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := FromConn(c)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Cred{PID: cmd.Process.Pid, UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}); got != want {
		t.Errorf("FromConn = %+v, want %+v", got, want)
	}
}

// TestFromConnOtherUser: a child running as a freshly created OS user
// connects; the kernel reports that user's uid and gid.
func TestFromConnOtherUser(t *testing.T) {
	u := ostest.AddUser(t)
	uid, gid := u.UID, u.GID
	dir, bin := ostest.WorldExe(t, "peercred.test")
	l, path := listen(t, dir)
	if err := os.Chmod(path, 0o777); err != nil {
		t.Fatal(err)
	}
	cmd := ostest.DialCommand(bin, path, "")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	start(t, cmd)
	c, err := l.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := FromConn(c)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Cred{PID: cmd.Process.Pid, UID: uid, GID: gid}); got != want {
		t.Errorf("FromConn = %+v, want %+v", got, want)
	}
}

func TestCPUTime(t *testing.T) {
	// Burn a little CPU so the figure is above zero at 10 ms resolution.
	deadline := time.Now().Add(30 * time.Millisecond)
	for x := 0; time.Now().Before(deadline); x++ {
		_ = x * x
	}
	d, err := Proc{}.CPUTime(os.Getpid())
	if err != nil || d <= 0 {
		t.Fatalf("CPUTime = %v, %v", d, err)
	}
	if _, err := (Proc{}).CPUTime(-1); err == nil {
		t.Error("pid -1 accepted")
	}
}
