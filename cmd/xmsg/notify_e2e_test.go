package main

import (
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/daemontest"
)

// TestSdNotifySequence: the real daemon under a real notify socket says READY=1 (after its
// sockets accept), keeps STATUS= current, pets the watchdog when WatchdogSec= asks for it, and
// says STOPPING=1 on SIGTERM before it exits.
func TestSdNotifySequence(t *testing.T) {
	dir := shortTemp(t)
	path := filepath.Join(dir, "notify.sock")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	base := shortTemp(t)
	d := &daemon{t: t, rt: filepath.Join(base, "rt"), db: filepath.Join(base, "state", "xmsg.db"), sess: filepath.Join(base, "s")}
	d.env = []string{"XDG_RUNTIME_DIR=" + d.rt, "HOME=" + base, "NOTIFY_SOCKET=" + path, "WATCHDOG_USEC=400000"}
	d.args = []string{"serve", "--db-path", d.db, "--sessions-dir", d.sess}
	if err := mkdirs(d.rt, d.sess); err != nil {
		t.Fatal(err)
	}
	d.start()
	t.Cleanup(d.stop)
	got := map[string]bool{}
	buf := make([]byte, 4096)
	l.SetReadDeadline(time.Now().Add(20 * time.Second))
	for !(got["READY=1"] && got["STATUS"] && got["WATCHDOG=1"]) {
		n, err := l.Read(buf)
		if err != nil {
			t.Fatalf("notify messages so far %v: %v", got, err)
		}
		msg := string(buf[:n])
		if strings.HasPrefix(msg, "STATUS=serving: ") {
			msg = "STATUS"
		}
		if msg == "WATCHDOG=1" && !got["READY=1"] {
			t.Error("WATCHDOG=1 before READY=1")
		}
		got[msg] = true
	}
	// The socket must accept by the time READY=1 was sent.
	if status, _ := d.do("GET", "/healthz", ""); status != 200 {
		t.Errorf("healthz after READY=1 = %d", status)
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	for {
		n, err := l.Read(buf)
		if err != nil {
			t.Fatalf("no STOPPING=1 after SIGTERM: %v", err)
		}
		if string(buf[:n]) == "STOPPING=1" {
			break
		}
	}
	if err := d.cmd.Wait(); err != nil {
		t.Errorf("daemon exit after SIGTERM: %v", err)
	}
	d.stopped = true
}

// TestFailedReadyStopsTheDaemon: systemd waits for READY=1 (Type=notify), so a READY=1 that
// cannot be sent is a failed start: the daemon exits non-zero with a line saying so, instead
// of serving while the unit stays "activating". The notify socket's queue is filled first, so
// the daemon's send times out.
func TestFailedReadyStopsTheDaemon(t *testing.T) {
	dir := shortTemp(t)
	path := filepath.Join(dir, "notify.sock")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	filler, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer filler.Close()
	filled := 0
	for filled < 100000 {
		filler.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := filler.Write([]byte("STATUS=filler")); err != nil {
			break
		}
		filled++
	}
	if filled == 100000 {
		t.Fatal("the notify socket's queue never filled")
	}
	base := shortTemp(t)
	rt, sess := filepath.Join(base, "rt"), filepath.Join(base, "s")
	if err := mkdirs(rt, sess); err != nil {
		t.Fatal(err)
	}
	cmd := xmsgCmd([]string{"XDG_RUNTIME_DIR=" + rt, "HOME=" + base, "NOTIFY_SOCKET=" + path},
		"serve", "--db-path", filepath.Join(base, "state", "xmsg.db"), "--sessions-dir", sess)
	var stderr daemontest.LogBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("daemon exited 0 although READY=1 failed:\n%s", stderr.String())
		}
		if !strings.Contains(stderr.String(), "notify: send") {
			t.Errorf("exit without a line naming the failed notification:\n%s", stderr.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("daemon still running 30 s after its READY=1 failed:\n%s", stderr.String())
	}
}
