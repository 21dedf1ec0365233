//go:build linux

package claude

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/peercred"
)

// TestStill: what agent.sock re-checks before each frame of an attested connection. True
// while the attested file names the same process (pid and start time) under the same
// address and that process lives; false once any of that changes, each change seen by the
// very next call.
func TestStill(t *testing.T) {
	dir := t.TempDir()
	s, _ := newScanner(t, dir)
	defer s.Close()
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	pid := child.Process.Pid
	start, err := peercred.Proc{}.StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, id, start string) {
		raw, _ := json.Marshal(map[string]any{"pid": pid, "sessionId": id, "procStart": start, "messagingSocketPath": "/x"})
		if err := os.WriteFile(filepath.Join(dir, name), raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	still := func(path, id string, start string) bool {
		t.Helper()
		ok, err := s.Still(path, id, pid, start, nil)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	write("a.json", "A", start)
	found := lookup(t, s, "A", 0)
	if len(found) != 1 || !found[0].Live {
		t.Fatalf("lookup: %v", names(found))
	}
	path := found[0].Path
	if !still(path, "A", start) {
		t.Fatal("the attested session is not still there")
	}
	if still(path, "A", start+"0") || still(path, "B", start) || still(path+"x", "A", start) {
		t.Fatal("another start time, address or file passed")
	}
	write("a.json", "B", start) // the file now names another session
	if still(path, "A", start) {
		t.Fatal("a file rewritten for another session still passes")
	}
	write("a.json", "A", "1") // the same pid, another start time (a reused pid)
	if still(path, "A", start) {
		t.Fatal("a file naming another start time still passes")
	}
	write("a.json", "A", start)
	// A fork claim: a file of the same id sorted before it, live, takes the plain id.
	write("0.json", "A", start)
	if still(path, "A", start) {
		t.Fatal("a file that lost its id to a fork claim still passes under it")
	}
	if !still(path, "A~2", start) {
		t.Fatal("the fork-claimed address does not pass")
	}
	os.Remove(filepath.Join(dir, "0.json"))
	if !still(path, "A", start) {
		t.Fatal("the id came back, the check did not")
	}
	child.Process.Kill()
	child.Wait()
	if still(path, "A", start) {
		t.Fatal("a dead process still passes")
	}
}

// TestStillUsesThePidfd: once an entry has its pidfd, liveness is one poll of it and no
// /proc read: the /proc the Scanner is switched to afterwards has a FIFO for the pid's
// stat, which a read would block on.
func TestStillUsesThePidfd(t *testing.T) {
	dir, proc := t.TempDir(), t.TempDir()
	s, _ := newScanner(t, dir)
	defer s.Close()
	writeSession(t, dir, "a.json", "A", "a", true)
	found := lookup(t, s, "A", 0) // reads /proc once, then opens the pidfd
	if len(found) != 1 || !found[0].Live {
		t.Fatalf("lookup: %v", names(found))
	}
	if s.idx.byPath[found[0].Path].pidfd == nil {
		t.Skip("no pidfds on this kernel")
	}
	pidDir := filepath.Join(proc, fmt.Sprint(os.Getpid()))
	os.MkdirAll(pidDir, 0o700)
	if err := syscall.Mkfifo(filepath.Join(pidDir, "stat"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.Proc = peercred.Proc{Root: proc}
	done := make(chan bool, 1)
	go func() {
		ok, _ := s.Still(found[0].Path, "A", os.Getpid(), found[0].Start(), nil)
		if again, _ := s.Lookup("A", 0); len(again) != 1 || !again[0].Live {
			ok = false
		}
		done <- ok
	}()
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("the live session did not pass")
		}
	case <-time.After(20 * time.Second):
		if f, err := os.OpenFile(filepath.Join(pidDir, "stat"), os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		t.Fatal("liveness was read from /proc although the entry has a pidfd")
	}
}
