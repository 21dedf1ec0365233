//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/ostest"
	"github.com/xmsg/xmsg/internal/sandbox"
)

// TestRunningDaemonIsConfined shows Landlock on the running daemon, not on a test helper:
//   - its own self-check (listing /, a TCP connect) is logged as denied;
//   - a session directory replaced after the sandbox was applied is a new inode outside every
//     allowed path (Landlock rules hold inodes, not names): a valid session file planted
//     there, readable by the daemon's uid, stays unreadable to the daemon (the marker), while
//     the directory that was there at startup keeps working (the positive control), and the
//     bus serves on.
func TestRunningDaemonIsConfined(t *testing.T) {
	ostest.Need(t, sandbox.Probe() >= 6, "Landlock ABI 6")
	late := filepath.Join(shortTemp(t), "late-sessions")
	d := newDaemon(t, "--require-landlock", "--sessions-dir", late)
	log := d.stderr.String()
	for _, want := range []string{"landlock: abi=", "fs=enforced", "net=enforced", "scope=enforced",
		"landlock self-check: read outside allowed paths denied, tcp connect denied"} {
		if !strings.Contains(log, want) {
			t.Errorf("daemon log lacks %q:\n%s", want, log)
		}
	}
	ok := startClaude(t, d.sess, "abababab-0000-0000-0000-000000000001", "inside", "/")
	// A session in the late directory is served while the directory is the one from startup.
	before := startClaude(t, late, "abababab-0000-0000-0000-000000000003", "before", "/")
	if status, v := d.do("GET", "/v1/sessions", ""); status != 200 || len(v.([]any)) != 2 {
		t.Fatalf("sessions before the replacement = %d %v, want both", status, v)
	}
	// The daemon created the missing directory before applying Landlock; replace it. The
	// session that was there keeps running: a stale index would go on serving it.
	if err := os.RemoveAll(late); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(late, 0o700); err != nil {
		t.Fatal(err)
	}
	marker := startClaude(t, late, "abababab-0000-0000-0000-000000000002", "outside", "/")
	if _, err := os.ReadFile(filepath.Join(late, marker.id+"-7.json")); err != nil {
		t.Fatalf("the marker must be readable by the daemon's uid outside the sandbox: %v", err)
	}
	status, v := d.do("GET", "/v1/sessions", "")
	list, _ := v.([]any)
	if status != 200 || len(list) != 1 || field(list[0], "sessionId") != ok.id {
		t.Errorf("sessions = %d %v, want only the session from the directory allowed at startup", status, v)
	}
	status, v = d.do("POST", "/v1/sessions/"+ok.id+"/messages", `{"from":"a","text":"still works"}`)
	if status != 202 {
		t.Errorf("send while confined = %d %v", status, v)
	}
	if !strings.Contains(d.stderr.String(), "permission denied") {
		t.Errorf("no permission-denied warning for the late directory:\n%s", d.stderr)
	}
	// The directory is named as not served, in healthz, instead of silently serving less.
	status, v = d.do("GET", "/healthz", "")
	probs, _ := field(v, "sessions_dir_problems").([]any)
	if status != 200 || len(probs) != 1 || !strings.Contains(probs[0].(string), late) {
		t.Errorf("healthz = %d %v, want the late directory named as a problem", status, v)
	}
	if status, v := d.do("GET", "/v1/sessions/"+before.id, ""); status != 404 {
		t.Errorf("the session of the replaced directory = %d %v, want 404 (not served from a stale index)", status, v)
	}
	// Self-bound socket files are removed at stop, also under Landlock (a remove-only rule on
	// the socket directory; without it unlinkat fails with EACCES and the files stay).
	d.stop()
	for _, name := range []string{"http", "agent", "register"} {
		if _, err := os.Lstat(d.sock(name)); !os.IsNotExist(err) {
			t.Errorf("%s.sock after stop under Landlock: %v, want it removed", name, err)
		}
	}
}
