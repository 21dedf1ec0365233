//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/xmsg/xmsg/internal/ostest"
)

// TestMonitorPeerGate: another OS user gets zero bytes from GET /v1/events and GET /metrics
// on http.sock, with every mode on the way relaxed so that only the peer gate stands in the
// way; the owner gets the metrics.
func TestMonitorPeerGate(t *testing.T) {
	other := ostest.AddUser(t)
	d := newDaemon(t)
	for dir := d.sock("http"); dir != "/"; dir = filepath.Dir(dir) {
		if strings.HasPrefix(dir, os.TempDir()+"/") {
			os.Chmod(dir, 0o755)
		}
	}
	if err := os.Chmod(d.sock("http"), 0o777); err != nil {
		t.Fatal(err)
	}
	_, bin := ostest.WorldExe(t, "client")
	probe := func(path string, cred *syscall.Credential) string {
		cmd := ostest.DialCommand(bin, d.sock("http"), "GET "+path+" HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("client: %v", err)
		}
		return strings.TrimSpace(string(out))
	}
	as := &syscall.Credential{Uid: other.UID, Gid: other.GID}
	for _, path := range []string{"/v1/events", "/metrics"} {
		if got := probe(path, as); got != "bytes=0" {
			t.Errorf("%s as %s: %s, want bytes=0", path, other.Name, got)
		}
	}
	if got := probe("/metrics", nil); got == "bytes=0" || strings.HasPrefix(got, "dial-error") {
		t.Errorf("/metrics as owner: %s, want an answer", got)
	}
}
