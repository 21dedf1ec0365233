//go:build linux

package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/xmsg/xmsg/internal/ostest"
)

// TestListenRelayRefusesOtherUID: an `xmsg listen` reply socket, with every mode on the way
// relaxed so that only its own uid check stands, gives another real OS user nothing (zero
// bytes, no reply recorded), while the same frame from the owner is passed on as the
// session's reply. Mutant tried: serveRelay without the uid check (red: the other user's
// reply is recorded).
func TestListenRelayRefusesOtherUID(t *testing.T) {
	other := ostest.AddUser(t)
	d := newDaemon(t)
	_, lines, id := startListen(t, d, "frank")
	out, _, _ := cliRun(t, d.env, "", "send", "frank", "hi")
	msg := strings.TrimSpace(out)
	nextLine(t, lines)
	relay := filepath.Join(relayDir(d.sock("register")), id+".sock")
	for dir := relay; dir != "/"; dir = filepath.Dir(dir) {
		if strings.HasPrefix(dir, os.TempDir()+"/") {
			os.Chmod(dir, 0o755)
		}
	}
	if err := os.Chmod(relay, 0o777); err != nil {
		t.Fatal(err)
	}
	_, bin := ostest.WorldExe(t, "client")
	frame, _ := json.Marshal(relayFrame{MessageID: msg, Text: "relayed"})
	probe := func(cred *syscall.Credential) string {
		cmd := ostest.DialCommand(bin, relay, string(frame)+"\n")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("client: %v", err)
		}
		return strings.TrimSpace(string(out))
	}
	if got := probe(&syscall.Credential{Uid: other.UID, Gid: other.GID}); got != "bytes=0" {
		t.Errorf("reply socket as %s: %s, want bytes=0", other.Name, got)
	}
	if out, _, _ := cliRun(t, d.env, "", "replies", msg); out != "" {
		t.Fatalf("a reply was recorded from another uid: %q", out)
	}
	if got := probe(nil); got == "bytes=0" || strings.HasPrefix(got, "dial-error") {
		t.Errorf("reply socket as owner: %s, want an answer", got)
	}
	if out, _, _ := cliRun(t, d.env, "", "replies", msg); !strings.HasSuffix(out, ": relayed\n") {
		t.Errorf("the owner's reply is not recorded: %q", out)
	}
}

// TestReplyRelayOnlyToOwnUID: `xmsg reply` hands its text only to a reply socket whose server
// the kernel says is of its own uid. A socket another real user planted in the relay directory
// (which a shared --register-sock directory would allow) gets nothing, and reply says nobody
// took it. Mutant tried: relayOne without the SO_PEERCRED check (red: the impostor's ok is
// taken as the reply's answer).
func TestReplyRelayOnlyToOwnUID(t *testing.T) {
	other := ostest.AddUser(t)
	dir, bin := ostest.WorldExe(t, "impostor")
	relays := filepath.Join(dir, "listen")
	if err := os.Mkdir(relays, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(relays, 0o777) // past the umask: the other user must be able to bind in it
	cmd := ostest.Command(bin, "relay-impostor", filepath.Join(relays, "cli:x.sock"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: other.UID, Gid: other.GID}}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("impostor: %q %v", line, err)
	}
	ans, err := relayReply(relays, "some-id", "a secret reply")
	if err == nil || ans.Status == "ok" {
		t.Fatalf("the reply went to another uid's socket: %+v %v", ans, err)
	}
	if !strings.Contains(err.Error(), "no xmsg listen is running") {
		t.Errorf("reply's answer: %v, want that no listen of ours took it", err)
	}
}
