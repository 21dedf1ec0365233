package main

import (
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
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
