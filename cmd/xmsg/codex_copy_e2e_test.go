package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/sandbox"
)

// copyAt writes a copy of src at path (parents made), with the byte at flip (counted from
// the end, 0 = none) inverted.
func copyAt(t *testing.T, src, path string, flip int) string {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if flip > 0 {
		data[len(data)-flip] ^= 0xff
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCodexAppServerCopy: Codex's shared app-server daemon runs a copy of the trusted binary
// under the Codex home (packages/app-server-daemon/releases/<version>/bin/codex). The copy is
// attested by its content: the same bytes under the home are Codex, and the thread its lock
// and rollout name is listed and addressable before any tool call; a copy with one byte
// changed, the same bytes outside the home, and a copy deleted after it started are not.
func TestCodexAppServerCopy(t *testing.T) {
	base := shortTemp(t)
	home := newCodexHome(t, base)
	exe := daemontest.CopyExe(t, base, "codex")
	args := []string{"--codex-exe", exe, "--codex-home", home.dir}
	if sandbox.Probe() >= 6 {
		args = append(args, "--require-landlock") // the digests must be readable from inside the sandbox
	}
	d := newDaemon(t, args...)
	releases := filepath.Join(home.dir, "packages", "app-server-daemon", "releases")

	// start runs a fake app-server from path writing a new thread, and returns the thread
	// and a connection to agent.sock from below it (its puppet answers once the parent holds
	// the files).
	start := func(path string) (string, *daemontest.Puppet, int) {
		thread := uuid.NewString()
		p := codexProcess(t, path, home.lock(thread), home.rollout(thread, thread))
		return thread, p, p.Dial(d.sock("agent"))
	}
	listed := func(thread string) bool {
		status, _ := d.do("GET", "/v1/sessions/codex:"+thread, "")
		return status == 200
	}

	same := copyAt(t, exe, filepath.Join(releases, "0.169.0", "bin", "codex"), 0)
	good, cx, ag := start(same)
	// Before any call: found by its writer lock, listed by the list and by id.
	status, v := d.do("GET", "/v1/sessions", "")
	found := false
	for _, s := range v.([]any) {
		if field(s, "sessionId") == "codex:"+good && field(s, "harness") == "codex" {
			found = true
		}
	}
	if status != 200 || !found {
		t.Fatalf("GET /v1/sessions = %d %v, want codex:%s listed before its first call\n%s", status, v, good, d.stderr.String())
	}
	if status, v := d.do("POST", "/v1/sessions/"+good+"/messages", `{"from":"x","text":"hi"}`); status != 202 {
		t.Fatalf("send to a thread before its first call: %d %v", status, v)
	}
	if r := cx.Call(ag, map[string]any{"action": "poll", "waitSecs": 5, "_meta": map[string]any{"threadId": good}}); r["action"] != "deliver" {
		t.Fatalf("poll from the copy: %v", r)
	}

	refused := func(what, path string) {
		t.Helper()
		thread, p, c := start(path)
		if listed(thread) {
			t.Errorf("%s: its thread is listed", what)
		}
		if r := p.Call(c, map[string]any{"action": "peek", "_meta": map[string]any{"threadId": thread}}); r["status"] != "error" {
			t.Errorf("%s: peek answered %v, want a refusal", what, r)
		}
	}
	refused("a copy with one byte changed", copyAt(t, exe, filepath.Join(releases, "0.169.1", "bin", "codex"), 1))
	refused("the same bytes outside the home", copyAt(t, exe, filepath.Join(base, "elsewhere", "codex"), 0))

	gone := copyAt(t, exe, filepath.Join(releases, "0.169.2", "bin", "codex"), 0)
	thread, p, c := start(gone)
	if r := p.Call(c, map[string]any{"action": "peek", "_meta": map[string]any{"threadId": thread}}); !listed(thread) || r["status"] != "ok" {
		t.Fatalf("control: a second good copy: listed %v, peek %v", listed(thread), r)
	}
	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	if r := p.Call(c, map[string]any{"action": "peek", "_meta": map[string]any{"threadId": thread}}); r["status"] != "error" {
		t.Errorf("a deleted copy: peek answered %v, want a refusal", r)
	}
	if listed(thread) {
		t.Error("a deleted copy's thread is still listed")
	}
}

// TestMCPReceiveOnlyUnderCodex: the bridge offers receive only when the daemon attests a
// trusted Codex process (the installed binary or its app-server copy) in its ancestry at
// start; a bridge below anything else lists exactly list, send, reply.
func TestMCPReceiveOnlyUnderCodex(t *testing.T) {
	base := shortTemp(t)
	home := newCodexHome(t, base)
	exe := daemontest.CopyExe(t, base, "codex")
	d := newDaemon(t, "--codex-exe", exe, "--codex-home", home.dir)
	copied := copyAt(t, exe, filepath.Join(home.dir, "packages", "app-server-daemon", "releases", "1", "bin", "codex"), 0)
	for _, c := range []struct{ parent, want string }{
		{exe, "list,send,reply,receive"},
		{copied, "list,send,reply,receive"},
		{os.Args[0], "list,send,reply"},
	} {
		_, in, out := daemontest.StartMCPAt(t, c.parent, d.sock("agent"), d.sock("http"))
		if _, err := in.Write([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}` + "\n")); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, tl := range readResult(t, out)["tools"].([]any) {
			names = append(names, field(tl, "name").(string))
		}
		if got := strings.Join(names, ","); got != c.want {
			t.Errorf("bridge below %s: tools %s, want %s", c.parent, got, c.want)
		}
	}
}
