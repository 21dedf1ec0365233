//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/ostest"
	"github.com/xmsg/xmsg/internal/realharness"
)

var realHarnessRoles = ostest.Roles{realharness.NetnsRole: realharness.Netns}

var messageIDRe = regexp.MustCompile(`message_id=([0-9a-f-]{36})`)

// peerScript is the model of every harness in these tests: a turn holding an xmsg message
// is answered with the reply tool (naming the message), a turn asking "xmsg-send REF TEXT"
// with the send tool, a tool's result with text, anything else with "ok".
func peerScript(t realharness.Turn) realharness.Answer {
	if (strings.Contains(t.Last, "check xmsg") || strings.Contains(t.Last, "call the receive tool")) && t.Tool("receive") != "" {
		return realharness.Answer{Call: t.Tool("receive"), Args: map[string]any{}}
	}
	if t.ToolResult && !strings.Contains(t.Last, "cross-session-message") {
		return realharness.Answer{Text: "done"}
	}
	if m := regexp.MustCompile(`xmsg-send (\S+) (.+)`).FindStringSubmatch(t.Last); m != nil && t.Tool("send") != "" && !strings.Contains(t.Last, "[xmsg]") {
		return realharness.Answer{Call: t.Tool("send"), Args: map[string]any{"ref": m[1], "text": strings.TrimSpace(m[2])}}
	}
	// xmsg's envelopes: the Claude/Codex wrapper, or the plain one of registered sessions.
	envelope := strings.Contains(t.Last, "cross-session-message") || strings.Contains(t.Last, "[xmsg] from=")
	if m := messageIDRe.FindAllStringSubmatch(t.Last, -1); m != nil && envelope &&
		!strings.Contains(t.Last, "reply to message_id=") && t.Tool("reply") != "" {
		id := m[len(m)-1][1]
		return realharness.Answer{Call: t.Tool("reply"), Args: map[string]any{"message_id": id, "text": "pong " + id}}
	}
	return realharness.Answer{Text: "ok"}
}

func init() { realharness.Scripts["peer"] = peerScript }

// run is one harness process in its own network namespace, with its evidence.
type harnessRun struct {
	t        *testing.T
	name     string
	cmd      *exec.Cmd
	in       *os.File
	evidence string // model request bodies
	screen   string // what its terminal showed
	dir      string
}

// startHarness runs argv (a harness) in a namespace with only loopback, against the fake
// model; its evidence goes under dir and is listed when the test fails.
func startHarness(t *testing.T, name, dir string, env []string, argv ...string) *harnessRun {
	t.Helper()
	r := &harnessRun{t: t, name: name, dir: dir, evidence: filepath.Join(dir, "model"), screen: filepath.Join(dir, "screen.txt")}
	os.MkdirAll(r.evidence, 0o700)
	r.cmd = realharness.NetnsCommand("peer", r.evidence, r.screen, env, argv...)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.cmd.Stdin, r.in = pr, pw
	stderr, _ := os.Create(filepath.Join(dir, "netns.stderr"))
	r.cmd.Stdout, r.cmd.Stderr = stderr, stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	t.Cleanup(func() {
		r.in.Close()
		done := make(chan struct{})
		go func() { r.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			r.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s evidence kept in %s (model requests in model/, terminal in screen.txt)", name, dir)
		}
	})
	return r
}

// typeText types s into the harness's terminal.
func (r *harnessRun) typeText(s string) {
	line, _ := json.Marshal(s)
	r.in.Write(append(line, '\n'))
}

// requests returns the bodies of the model requests so far, oldest first.
func (r *harnessRun) requests() []string {
	ents, _ := os.ReadDir(r.evidence)
	var out []string
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(r.evidence, e.Name()))
		out = append(out, string(b))
	}
	return out
}

func (r *harnessRun) screenText() string { b, _ := os.ReadFile(r.screen); return string(b) }

// settle waits until the terminal has shown nothing new for a second.
func (r *harnessRun) settle(t *testing.T) {
	t.Helper()
	waitStill(t, 30*time.Second, "the terminal to settle", 10, func() int { return len(r.screenText()) })
}

// waitStill waits until size has not changed for polls checks in a row (100 ms apart).
func waitStill(t *testing.T, limit time.Duration, what string, polls int, size func() int) {
	t.Helper()
	n, still := size(), 0
	waitUntil(t, limit, what, func() bool {
		if m := size(); m != n {
			n, still = m, 0
			return false
		}
		still++
		return still >= polls
	})
}

// submit types a prompt into the harness's interface and presses Enter until the model is
// asked with it: an interface still starting, or one that takes a typed line and its
// Enter as one paste, drops the Enter.
func (r *harnessRun) submit(t *testing.T, prompt string) {
	t.Helper()
	// A prompt typed during a turn is merged into that turn: wait until the model has not
	// been asked anything for a while (the harness is idle) before typing.
	waitStill(t, 60*time.Second, "the harness to be idle", 15, func() int { return len(r.requests()) })
	r.typeText(prompt)
	tries := 0
	waitUntil(t, 60*time.Second, "the harness to take the prompt "+prompt, func() bool {
		if r.sawRequest(prompt) {
			return true
		}
		if tries%20 == 0 {
			r.typeText("\r")
		}
		tries++
		return false
	})
}

// evidenceDir is where a harness run keeps its evidence: under $XMSG_HARNESS_EVIDENCE when
// set (kept after the test), else in the test's temporary directory.
func evidenceDir(t *testing.T, name string) string {
	base := os.Getenv("XMSG_HARNESS_EVIDENCE")
	if base == "" {
		base = t.TempDir()
	}
	d := filepath.Join(base, fmt.Sprintf("%s-%s-%d", t.Name(), name, time.Now().UnixNano()))
	if err := os.MkdirAll(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

// waitUntil polls cond every 100 ms for at most limit (a harness's own pace bounds these
// waits, not an assertion about speed), failing with what.
func waitUntil(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s after %s", what, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// listed is the first session `xmsg list --json` shows that match accepts (nil: none yet).
func listed(d *daemon, match func(map[string]any) bool) map[string]any {
	out, err := xmsgCmd(d.env, "list", "--json").Output()
	if err != nil {
		return nil
	}
	var list []map[string]any
	json.Unmarshal(out, &list)
	for _, s := range list {
		if match(s) {
			return s
		}
	}
	return nil
}

// claudeSession is one real Claude Code session in its own namespace, with xmsg's MCP bridge.
type claudeSession struct {
	*harnessRun
	id, name string
	debug    string
}

// claudeConfig writes what a new user's Claude Code config holds once past its first-run
// dialogs (onboarding done, this API key approved, the folder trusted) and xmsg's MCP
// bridge, into the config directory shared by the test's sessions (the daemon's
// --sessions-dir is its sessions/).
func claudeConfig(t *testing.T, d *daemon, key string, cwds []string, settings map[string]any) (cfgDir, mcpPath string) {
	cfgDir = filepath.Dir(d.sess)
	projects := map[string]any{}
	for _, c := range cwds {
		os.MkdirAll(c, 0o700)
		projects[c] = map[string]any{"hasTrustDialogAccepted": true, "hasCompletedProjectOnboarding": true}
	}
	global := map[string]any{"hasCompletedOnboarding": true, "theme": "dark", "numStartups": 3, "bypassPermissionsModeAccepted": true,
		"customApiKeyResponses": map[string]any{"approved": []string{key[len(key)-20:]}, "rejected": []string{}}, "projects": projects}
	write := func(name string, v any) string {
		b, _ := json.Marshal(v)
		p := filepath.Join(cfgDir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write(".claude.json", global)
	write("settings.json", settings)
	mcpPath = write("mcp.json", map[string]any{"mcpServers": map[string]any{"xmsg": map[string]any{"command": os.Args[0], "args": []string{"mcp"},
		"env": map[string]string{ostest.RoleEnv: "xmsg", "XDG_RUNTIME_DIR": d.rt}}}})
	return cfgDir, mcpPath
}

const claudeKey = "sk-ant-api03-xmsgtest-0123456789abcdefghij"

// startRealClaude starts Claude Code in cwd (its session name derives from it) and waits until
// xmsg lists it and its MCP bridge is connected.
func startRealClaude(t *testing.T, d *daemon, bin, cfgDir, mcpPath, cwd string, extra ...string) *claudeSession {
	t.Helper()
	name := filepath.Base(cwd)
	ev := evidenceDir(t, "claude-"+name)
	c := &claudeSession{debug: filepath.Join(ev, "debug.txt")}
	env := []string{"HOME=" + cfgDir, "CLAUDE_CONFIG_DIR=" + cfgDir, "XDG_RUNTIME_DIR=" + d.rt, "ANTHROPIC_BASE_URL={{MODEL}}",
		"ANTHROPIC_API_KEY=" + claudeKey, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_AUTOUPDATER=1",
		"ENABLE_TOOL_SEARCH=false", "TERM=xterm-256color", "IS_SANDBOX=1"}
	args := append([]string{bin, "--mcp-config", mcpPath, "--strict-mcp-config", "--debug-file", c.debug}, extra...)
	c.harnessRun = startHarness(t, "claude "+name, ev, env, append([]string{"sh", "-c", `cd "$0" && exec "$@"`, cwd}, args...)...)
	waitUntil(t, 90*time.Second, "claude "+name+" listed by xmsg with its MCP bridge connected", func() bool {
		dbg, _ := os.ReadFile(c.debug)
		if !strings.Contains(string(dbg), `MCP server "xmsg": Successfully connected`) {
			return false
		}
		s := listed(d, func(s map[string]any) bool { return s["harness"] == "claude" && s["cwd"] == cwd })
		c.id, _ = s["sessionId"].(string)
		c.name, _ = s["name"].(string)
		return c.id != "" && strings.HasPrefix(c.name, name)
	})
	return c
}

// sawRequest reports whether a model request of the session holds every one of subs.
func (r *harnessRun) sawRequest(subs ...string) bool {
	for _, b := range r.requests() {
		all := true
		for _, s := range subs {
			// Request bodies are JSON: compare against the string as JSON escapes it.
			var q strings.Builder
			enc := json.NewEncoder(&q)
			enc.SetEscapeHTML(false)
			enc.Encode(s)
			all = all && strings.Contains(b, strings.Trim(strings.TrimSpace(q.String()), `"`))
		}
		if all {
			return true
		}
	}
	return false
}

// TestRealClaudeCode runs two real Claude Code sessions (the npm package, pinned) against a
// real daemon: each is listed with its id, name and harness; a message sent to one reaches
// its model as a new user turn holding xmsg's envelope; the model's reply through `xmsg mcp`
// reaches the sender's `xmsg replies --wait`; and one session sends to the other, whose reply
// comes back to it.
func TestRealClaudeCode(t *testing.T) {
	bin := realharness.BinPath(realharness.Install(t, realharness.ClaudeCode), realharness.ClaudeCode)
	d := newDaemon(t)
	base := filepath.Dir(d.sess)
	alice, bob := filepath.Join(base, "alice"), filepath.Join(base, "bob")
	cfgDir, mcpPath := claudeConfig(t, d, claudeKey, []string{alice, bob},
		map[string]any{"permissions": map[string]any{"allow": []string{"mcp__xmsg__send", "mcp__xmsg__reply", "mcp__xmsg__list"}}})
	a := startRealClaude(t, d, bin, cfgDir, mcpPath, alice)
	b := startRealClaude(t, d, bin, cfgDir, mcpPath, bob)

	// Delivery and reply: an anonymous send reaches the model; its reply reaches replies --wait.
	out, err := xmsgCmd(d.env, "send", a.id, "ping from the test").Output()
	if err != nil {
		t.Fatalf("xmsg send: %v", err)
	}
	mid := strings.TrimSpace(string(out))
	if m := regexp.MustCompile(`[0-9a-f-]{36}`).FindString(mid); m != "" {
		mid = m
	}
	replies, err := xmsgCmd(d.env, "replies", mid, "--wait", "60").Output()
	if err != nil || !strings.Contains(string(replies), "pong "+mid) {
		t.Fatalf("xmsg replies %s --wait: %v %s", mid, err, replies)
	}
	if !a.sawRequest(`<cross-session-message from-name="xmsg@testhost · cli `, "ping from the test", "message_id="+mid) {
		t.Fatalf("no model request of alice holds xmsg's envelope of %s", mid)
	}

	// Alice sends to bob through her model's send tool; bob's model replies; the reply is
	// pushed back into alice's conversation.
	a.submit(t, "xmsg-send "+b.id+" hello bob")
	waitUntil(t, 60*time.Second, "bob's model to see alice's message", func() bool {
		return b.sawRequest("xmsg@testhost · claude:"+a.name, "hello bob")
	})
	waitUntil(t, 60*time.Second, "alice's model to see bob's reply", func() bool {
		return a.sawRequest("reply to message_id=", "pong ")
	})
}

// codexHomeFor writes a Codex home whose config points Codex at the fake model (in the
// namespace, ModelURL), trusts cwd, runs tools without asking, and starts xmsg's MCP bridge.
// Nothing is overridden on the command line: Codex starts its shared app-server daemon (from
// its copy under the home) only without -c overrides, and that default mode is what runs.
func codexHomeFor(t *testing.T, base, cwd string, d *daemon) string {
	home := filepath.Join(base, "codex-home")
	for _, dir := range []string{home, cwd} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	cfg := fmt.Sprintf(`model = "gpt-5.1-codex"
model_provider = "fake"
approval_policy = "never"
sandbox_mode = "danger-full-access"

[model_providers.fake]
name = "fake"
base_url = "%s/v1"
wire_api = "responses"
env_key = "FAKE_API_KEY"

[projects.%q]
trust_level = "trusted"

[mcp_servers.xmsg]
command = %q
args = ["mcp"]
env = { XMSG_TEST_ROLE = "xmsg", XDG_RUNTIME_DIR = %q }
`, realharness.ModelURL, cwd, os.Args[0], d.rt)
	if err := os.WriteFile(filepath.Join(home, "config.toml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return home
}

// stopBeneath ends the processes (started by this test's harness) whose executable lies
// beneath dir: Codex's app-server daemon outlives the TUI that started it.
func stopBeneath(dir string) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && strings.HasPrefix(exe, dir+"/") {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// TestRealCodex runs the real Codex TUI (the npm package, pinned) in its default mode, where
// its shared app-server daemon runs from a copy of the binary under the Codex home and is
// the parent of `xmsg mcp`, with the daemon trusting only the installed binary
// (--codex-exe, as docs/operations.md says): the thread is listed before any tool call,
// a message sent to it is read by the model through receive (its bridge lists receive) and
// answered with reply, which reaches the sender's `xmsg replies --wait`; and the thread
// sends to a real Claude Code session, whose model gets the message.
func TestRealCodex(t *testing.T) {
	cdir := realharness.Install(t, realharness.Codex)
	cbin := realharness.BinPath(realharness.Install(t, realharness.ClaudeCode), realharness.ClaudeCode)
	base := realharness.HomeDir(t)
	cwd := filepath.Join(base, "proj")
	// The daemon's sockets live in a short temporary directory; the Codex home must exist
	// before it starts (a sandbox rule).
	sock := shortTemp(t)
	pre := &daemon{rt: filepath.Join(sock, "rt")}
	os.MkdirAll(pre.rt, 0o700)
	home := codexHomeFor(t, base, cwd, pre)
	d := newDaemon(t, "--codex-exe", realharness.CodexNative(cdir), "--codex-home", home)
	// The config names the daemon's runtime directory: write it again for this daemon.
	codexHomeFor(t, base, cwd, d)
	t.Cleanup(func() { stopBeneath(home) })

	alice := filepath.Join(filepath.Dir(d.sess), "alice")
	cfgDir, mcpPath := claudeConfig(t, d, claudeKey, []string{alice},
		map[string]any{"permissions": map[string]any{"allow": []string{"mcp__xmsg__send", "mcp__xmsg__reply", "mcp__xmsg__list"}}})
	a := startRealClaude(t, d, cbin, cfgDir, mcpPath, alice)

	ev := evidenceDir(t, "codex")
	t.Cleanup(func() {
		if t.Failed() {
			exec.Command("cp", "-a", home, filepath.Join(ev, "codex-home")).Run()
		}
	})
	cx := startHarness(t, "codex", ev, []string{"HOME=" + base, "CODEX_HOME=" + home, "FAKE_API_KEY=x", "TERM=xterm-256color"},
		"sh", "-c", `cd "$0" && exec "$@"`, cwd, realharness.BinPath(cdir, realharness.Codex))

	// A first turn that calls no tool: Codex creates the thread's rollout and writer lock
	// with it. The thread is listed from then on, before any xmsg tool call, its lock held
	// by the app-server copy.
	waitUntil(t, 60*time.Second, "the codex interface to start", func() bool { return strings.Contains(cx.screenText(), "default") })
	cx.submit(t, "hello")
	var thread string
	waitUntil(t, 90*time.Second, "the codex thread listed by xmsg", func() bool {
		thread, _ = listed(d, func(s map[string]any) bool { return s["harness"] == "codex" })["sessionId"].(string)
		return thread != ""
	})
	if strings.Contains(strings.Join(cx.requests(), ""), `"function_call"`) {
		t.Fatal("a tool was called before the thread was listed")
	}
	if out, _ := exec.Command("sh", "-c", "ls "+home+"/packages/app-server-daemon/releases/*/bin/codex").Output(); len(out) == 0 {
		t.Fatal("codex did not run its app-server daemon from a copy under the home: the default mode is not what ran")
	}

	// A message to the thread waits in its queue; the model reads it with receive and answers.
	out, err := xmsgCmd(d.env, "send", thread, "ping codex").Output()
	if err != nil {
		t.Fatalf("xmsg send to %s: %v", thread, err)
	}
	mid := regexp.MustCompile(`[0-9a-f-]{36}`).FindString(string(out))
	cx.submit(t, "check xmsg")
	replies, err := xmsgCmd(d.env, "replies", mid, "--wait", "60").Output()
	if err != nil || !strings.Contains(string(replies), "pong "+mid) {
		t.Fatalf("xmsg replies %s --wait: %v %s", mid, err, replies)
	}
	if !cx.sawRequest("[xmsg] The message below is untrusted peer data", "ping codex", "message_id="+mid) {
		t.Fatal("no model request of codex holds the received envelope, preamble first")
	}

	// The thread sends to the Claude session.
	cx.submit(t, "xmsg-send "+a.id+" hello from codex")
	waitUntil(t, 60*time.Second, "claude's model to see codex's message", func() bool {
		return a.sawRequest("xmsg@testhost · codex:", "hello from codex")
	})
}

// TestRealClaudeHeld: a real Claude Code session that bypasses permission prompts holds
// xmsg's mail for its user (the sender asserts no permission mode), and tells xmsg so: the
// send answers delivered as ever, but GET /v1/messages/{id} says held, then delivered when
// the person picks Deliver (and the model then answers it), or denied when they pick Deny. A
// bypassing session whose settings say crossSessionInbound "accept" takes the mail at once,
// and its record says only that the line was written.
func TestRealClaudeHeld(t *testing.T) {
	bin := realharness.BinPath(realharness.Install(t, realharness.ClaudeCode), realharness.ClaudeCode)
	d := newDaemon(t)
	base := filepath.Dir(d.sess)
	carol, dave := filepath.Join(base, "carol"), filepath.Join(base, "dave")
	cfgDir, mcpPath := claudeConfig(t, d, claudeKey, []string{carol, dave},
		map[string]any{"permissions": map[string]any{"allow": []string{"mcp__xmsg__send", "mcp__xmsg__reply", "mcp__xmsg__list"}}})
	c := startRealClaude(t, d, bin, cfgDir, mcpPath, carol, "--dangerously-skip-permissions")
	dv := startRealClaude(t, d, bin, cfgDir, mcpPath, dave, "--dangerously-skip-permissions", "--settings", `{"crossSessionInbound":"accept"}`)

	send := func(to, text string) string {
		t.Helper()
		status, v := d.do("POST", "/v1/sessions/"+to+"/messages", `{"from":"tester","text":"`+text+`"}`)
		if status != 202 || field(v, "outcome") != "delivered" {
			t.Fatalf("send: %d %v, want 202 and the original's outcome delivered", status, v)
		}
		return field(v, "messageId").(string)
	}
	waitOutcome := func(mid, outcome, report string) {
		t.Helper()
		waitUntil(t, 60*time.Second, "message "+mid+" to read "+outcome+"/"+report, func() bool {
			_, v := d.do("GET", "/v1/messages/"+mid, "")
			return field(v, "outcome") == outcome && field(v, "report") == report
		})
	}
	// decided waits for the person's choice on held message m to be recorded. An Enter
	// pressed while the dialog is drawn once more can be lost too, and then nothing is
	// decided: the message stays held, the dialog stays up, and Enter is pressed again (at
	// most three times more, 15 s apart; a second Enter after the dialog closed falls on an
	// empty prompt, which ignores it).
	decided := func(m string) string {
		t.Helper()
		for again := 0; ; again++ {
			var got string
			deadline := time.Now().Add(15 * time.Second)
			for time.Now().Before(deadline) {
				_, v := d.do("GET", "/v1/messages/"+m, "")
				if got, _ = field(v, "outcome").(string); got == "delivered" || got == "denied" {
					return got
				}
				time.Sleep(100 * time.Millisecond)
			}
			if again == 3 {
				t.Fatalf("message %s still reads %q a minute after the choice", m, got)
			}
			t.Logf("message %s still reads %q: the Enter was lost, pressing it again", m, got)
			c.settle(t)
			c.typeText("\r")
		}
	}
	m1 := send(c.id, "first held")
	waitOutcome(m1, "held", "held")
	waitUntil(t, 30*time.Second, "the held message's dialog", func() bool { return strings.Contains(c.screenText(), "Deliver") })
	// Its session file says it waits for its user: xmsg doctor names it.
	waitUntil(t, 30*time.Second, "xmsg doctor to note the waiting session", func() bool {
		out, _ := xmsgCmd(d.env, "doctor").Output()
		return strings.Contains(string(out), "claude sessions waiting for their user") && strings.Contains(string(out), c.id)
	})
	// Deny is the dialog's first choice, its default: Enter denies. The dialog is drawn again
	// while it settles, so keys are pressed once the terminal has been quiet for a while.
	c.settle(t)
	c.typeText("\r")
	if got := decided(m1); got != "denied" {
		t.Fatalf("Enter on the dialog's default: message %s reads %q, want denied", m1, got)
	}
	waitOutcome(m1, "denied", "denied")

	// Deliver is below Deny. The terminal's bytes cannot say which choice is marked (the
	// interface moves the mark without drawing the line again), and on a loaded machine an
	// arrow pressed while the dialog is drawn once more is lost: then the message reads
	// denied, truthfully, and another is sent. What is tested is xmsg's record of what the
	// person chose, so each try is checked by that record. Bounded: three tries.
	delivered := false
	for try := 1; try <= 3 && !delivered; try++ {
		m := send(c.id, fmt.Sprint("held, try ", try))
		waitOutcome(m, "held", "held")
		c.settle(t)
		c.typeText("\x1b[B")
		c.settle(t)
		c.typeText("\r")
		if got := decided(m); got == "denied" {
			t.Logf("try %d: the arrow was lost, the message was denied (and recorded so); trying again", try)
			continue
		}
		waitOutcome(m, "delivered", "delivered")
		if out, err := xmsgCmd(d.env, "replies", m, "--wait", "60").Output(); err != nil || !strings.Contains(string(out), "pong "+m) {
			t.Fatalf("the delivered message was not answered: %v %s", err, out)
		}
		delivered = true
	}
	if !delivered {
		t.Fatal("three held messages, none delivered: Deliver was never chosen")
	}

	m3 := send(dv.id, "accepted")
	if out, err := xmsgCmd(d.env, "replies", m3, "--wait", "60").Output(); err != nil || !strings.Contains(string(out), "pong "+m3) {
		t.Fatalf("crossSessionInbound accept: not answered: %v %s", err, out)
	}
	waitOutcome(m3, "delivered", "written")
}

// TestRealPi runs the real pi coding agent (the npm package, pinned) with a minimal xmsg
// extension of its own (testdata/pi-xmsg.ts: register on register.sock, mail as user
// messages, send and reply tools on agent.sock) against a real daemon: listed as a pi
// session with its name, a message reaches its model, and the model's reply reaches
// `xmsg replies --wait`; it sends to a real Claude Code session, whose model gets it.
func TestRealPi(t *testing.T) {
	pdir := realharness.Install(t, realharness.Pi)
	cbin := realharness.BinPath(realharness.Install(t, realharness.ClaudeCode), realharness.ClaudeCode)
	d := newDaemon(t)
	base := filepath.Dir(d.sess)
	alice, cwd := filepath.Join(base, "alice"), filepath.Join(base, "pi-proj")
	cfgDir, mcpPath := claudeConfig(t, d, claudeKey, []string{alice},
		map[string]any{"permissions": map[string]any{"allow": []string{"mcp__xmsg__send", "mcp__xmsg__reply", "mcp__xmsg__list"}}})
	a := startRealClaude(t, d, cbin, cfgDir, mcpPath, alice)

	home := filepath.Join(base, "pi-home")
	agentDir := filepath.Join(home, ".pi", "agent")
	os.MkdirAll(agentDir, 0o700)
	os.MkdirAll(cwd, 0o700)
	models, _ := json.Marshal(map[string]any{"providers": map[string]any{"fake": map[string]any{
		"baseUrl": realharness.ModelURL, "api": "anthropic-messages", "apiKey": "x",
		"models": []any{map[string]any{"id": "fake-model", "name": "fake", "reasoning": false, "input": []string{"text"},
			"contextWindow": 200000, "maxTokens": 8192, "cost": map[string]any{"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}}}}}})
	os.WriteFile(filepath.Join(agentDir, "models.json"), models, 0o600)
	ext, err := filepath.Abs("testdata/pi-xmsg.ts")
	if err != nil {
		t.Fatal(err)
	}
	ev := evidenceDir(t, "pi")
	p := startHarness(t, "pi", ev, []string{"HOME=" + home, "XDG_RUNTIME_DIR=" + d.rt, "XMSG_PI_NAME=pia", "TERM=xterm-256color"},
		"sh", "-c", `cd "$0" && exec "$@"`, cwd, realharness.BinPath(pdir, realharness.Pi), "--provider", "fake", "--model", "fake-model", "-e", ext)

	var id string
	waitUntil(t, 90*time.Second, "pi listed by xmsg", func() bool {
		id, _ = listed(d, func(s map[string]any) bool { return s["harness"] == "pi" && s["name"] == "pia" })["sessionId"].(string)
		return id != ""
	})
	out, err := xmsgCmd(d.env, "send", id, "ping pi").Output()
	if err != nil {
		t.Fatalf("xmsg send %s: %v", id, err)
	}
	mid := regexp.MustCompile(`[0-9a-f-]{36}`).FindString(string(out))
	if out, err := xmsgCmd(d.env, "replies", mid, "--wait", "60").Output(); err != nil || !strings.Contains(string(out), "pong "+mid) {
		t.Fatalf("xmsg replies %s --wait: %v %s", mid, err, out)
	}
	if !p.sawRequest("ping pi", "message_id="+mid) {
		t.Fatal("no model request of pi holds the message")
	}
	p.submit(t, "xmsg-send "+a.id+" hello from pi")
	waitUntil(t, 60*time.Second, "claude's model to see pi's message", func() bool {
		return a.sawRequest("xmsg@testhost · pi:pia", "hello from pi")
	})
}
