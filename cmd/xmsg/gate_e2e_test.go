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

// TestPeerGateOnRunningDaemon: with the directory and socket modes relaxed so that only the
// peer gate stands in the way, another real OS user gets zero bytes from each of the three
// sockets of the running daemon, while the same request from the owner is answered.
func TestPeerGateOnRunningDaemon(t *testing.T) {
	other := ostest.AddUser(t)
	d := newDaemon(t)
	// Relax every mode on the way: only the uid check is left.
	for dir := d.sock("http"); dir != "/"; dir = filepath.Dir(dir) {
		if strings.HasPrefix(dir, os.TempDir()+"/") {
			os.Chmod(dir, 0o755)
		}
	}
	requests := map[string]string{
		"http":     "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
		"agent":    `{"action":"send","ref":"x","text":"y"}` + "\n",
		"register": `{"action":"check","conversation_id":"x"}` + "\n",
	}
	// The other user must be able to run the client: a world-readable copy of this binary.
	_, bin := ostest.WorldExe(t, "client")
	for name, req := range requests {
		if err := os.Chmod(d.sock(name), 0o777); err != nil {
			t.Fatal(err)
		}
		probe := func(cred *syscall.Credential) string {
			cmd := ostest.DialCommand(bin, d.sock(name), req)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("client: %v", err)
			}
			return strings.TrimSpace(string(out))
		}
		if got := probe(&syscall.Credential{Uid: other.UID, Gid: other.GID}); got != "bytes=0" {
			t.Errorf("%s.sock as %s: %s, want bytes=0", name, other.Name, got)
		}
		if got := probe(nil); got == "bytes=0" || strings.HasPrefix(got, "dial-error") {
			t.Errorf("%s.sock as owner: %s, want an answer", name, got)
		}
	}
	if !strings.Contains(d.stderr.String(), "peer refused") {
		t.Errorf("refusals not logged:\n%s", d.stderr)
	}
}
