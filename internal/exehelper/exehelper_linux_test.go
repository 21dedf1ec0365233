//go:build linux

package exehelper

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/xmsg/xmsg/internal/ostest"
	"github.com/xmsg/xmsg/internal/peercred"
)

// The helper is this test binary in the role "helper", standing in for `xmsg __exe-helper`
// (cmd/xmsg's main dispatches Arg; its e2e tests run that path).
func TestMain(m *testing.M) {
	ostest.Main(m, ostest.Roles{"helper": func() int {
		if err := Serve(); err != nil {
			return 1
		}
		return 0
	}})
}

// helperEnv is the environment Start passes to the helper: ours, in the role "helper".
func helperEnv() []string { return append(os.Environ(), ostest.Role("helper")) }

func TestExeThroughTheHelper(t *testing.T) {
	c, err := Start(os.Args[0], helperEnv())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sleep := exec.Command("sleep", "30")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	got, err := c.Exe(sleep.Process.Pid)
	want, _ := filepath.EvalSymlinks(sleep.Path)
	if err != nil || got != want {
		t.Errorf("Exe(sleep) = %q, %v; want %q", got, err, want)
	}
	if _, err := c.Exe(1 << 30); err == nil {
		t.Error("Exe of a pid that does not exist succeeded")
	}
	// After the helper is gone, attestation fails closed.
	c.cmd.Process.Kill()
	c.cmd.Process.Wait()
	if _, err := c.Exe(sleep.Process.Pid); err == nil {
		t.Error("Exe after the helper died succeeded")
	}
}

// TestLateAnswerIsSkipped: an answer that arrives after its request gave up must not be
// taken for the answer to the next request (review finding: desync after a timeout).
func TestLateAnswerIsSkipped(t *testing.T) {
	ours, theirs, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer theirs.Close()
	c := &Client{conn: ours}
	c.r = bufio.NewReader(ours)
	// A fake helper: answers request 1 late (after request 2 was written), then request 2.
	go func() {
		buf := make([]byte, requestLen)
		io.ReadFull(theirs, buf) // request 1 (pid 111), not answered yet
		io.ReadFull(theirs, buf) // request 2 (pid 222)
		fmt.Fprintln(theirs, `{"seq":1,"path":"/bin/one-one-one"}`)
		fmt.Fprintln(theirs, `{"seq":2,"path":"/bin/two-two-two"}`)
	}()
	// Request 1 gives up (we simulate its timeout by writing it by hand and never reading).
	c.seq++
	var req [requestLen]byte
	binary.BigEndian.PutUint32(req[:4], c.seq)
	binary.BigEndian.PutUint32(req[4:8], opExe)
	binary.BigEndian.PutUint32(req[8:], 111)
	ours.Write(req[:])
	got, err := c.Exe(222)
	if err != nil || got != "/bin/two-two-two" {
		t.Fatalf("Exe(222) = %q, %v; want pid 222's answer, not the late one for 111", got, err)
	}
}

func socketPair() (*net.UnixConn, *net.UnixConn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	var conns [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			return nil, nil, err
		}
		conns[i] = c.(*net.UnixConn)
	}
	return conns[0], conns[1], nil
}

func TestOpenFilesThroughTheHelper(t *testing.T) {
	c, err := Start(os.Args[0], helperEnv())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	path := filepath.Join(t.TempDir(), "held")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	files, err := c.OpenFiles(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := peercred.HoldsOpen(files, uint64(st.Dev), st.Ino); !ok || got.FD != int(f.Fd()) || got.Path != path {
		t.Fatalf("OpenFiles(self) = %+v; want fd %d on %s", got, f.Fd(), path)
	}
	if _, err := c.OpenFiles(1 << 30); err == nil {
		t.Error("OpenFiles of a pid that does not exist succeeded")
	}
}
