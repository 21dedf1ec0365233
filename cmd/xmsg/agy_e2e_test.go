package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/sandbox"
)

// agentapiCall is what the fake agentapi recorded of one run.
type agentapiCall struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"` // the ANTIGRAVITY_* entries of its environment
}

// fakeAgentapi stands in for `agy agentapi send-message`: it appends its argv and its
// ANTIGRAVITY_* environment to $XMSG_TEST_AGENTAPI_LOG and answers like agentapi: a CSRF
// token "stale" is refused as unauthenticated, "broken" fails, anything else delivers.
func fakeAgentapi() int {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "ANTIGRAVITY_") {
			env = append(env, kv)
		}
	}
	line, _ := json.Marshal(agentapiCall{Argv: os.Args[1:], Env: env})
	f, err := os.OpenFile(os.Getenv("XMSG_TEST_AGENTAPI_LOG"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return 9
	}
	f.Write(append(line, '\n'))
	f.Close()
	switch os.Getenv("ANTIGRAVITY_CSRF_TOKEN") {
	case "stale":
		fmt.Fprintln(os.Stderr, "rpc error: code = Unauthenticated desc = invalid CSRF token")
		return 1
	case "broken":
		return 3
	}
	return 0
}

func agentapiCalls(t *testing.T, path string) []agentapiCall {
	t.Helper()
	raw, _ := os.ReadFile(path)
	var out []agentapiCall
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if l == "" {
			continue
		}
		var c agentapiCall
		if err := json.Unmarshal([]byte(l), &c); err != nil {
			t.Fatalf("agentapi log line %q: %v", l, err)
		}
		out = append(out, c)
	}
	return out
}

// TestAgySessions: Antigravity sessions attested by the running (sandboxed) daemon, with real
// processes: a copy of the test binary trusted by --agy-exe holding a real exclusive flock on
// the presence lock, its child speaking the MCP bridge's mcp_start and the hook's credential
// frame, and a fake agentapi that records argv and environment.
func TestAgySessions(t *testing.T) {
	base := shortTemp(t)
	presence := filepath.Join(base, "presence")
	if err := os.Mkdir(presence, 0o700); err != nil {
		t.Fatal(err)
	}
	agyExe := daemontest.CopyExe(t, base, "agy")
	botExe := daemontest.CopyExe(t, base, "bot")
	log := filepath.Join(base, "agentapi.log")
	t.Setenv("XMSG_TEST_AGENTAPI_LOG", log)
	args := []string{"--agy-exe", agyExe, "--agy-presence-dir", presence, "--svc-exe", "bot=" + botExe}
	if sandbox.Probe() >= 6 {
		args = append(args, "--require-landlock") // attestation and agentapi must work from inside the sandbox
	} else if os.Getenv("CI") == "true" {
		t.Fatal("Landlock ABI >= 6 is required in CI")
	}
	d := newDaemon(t, args...)
	lock := func(conv string) string { return filepath.Join(presence, conv+".lock") }

	conv := uuid.NewString()
	ag := daemontest.StartNestedExe(t, agyExe, daemontest.LockEnv+"="+lock(conv))
	start, err := peercred.Proc{}.StartTime(ag.PID)
	if err != nil {
		t.Fatal(err)
	}
	sessionID := fmt.Sprintf("agy:%d:%s", ag.PID, start)
	ac := ag.Dial(d.sock("agent"))
	if r := ag.Call(ac, map[string]any{"action": "mcp_start"}); r["status"] != "ok" || r["sessionId"] != sessionID {
		t.Fatalf("mcp_start: got %v, want ok %s", r, sessionID)
	}
	// Listing order: claude, agy, pi, svc.
	startClaude(t, d.sess, "11111111-2222-4333-8444-555555555555", "alice", "/w")
	pi := daemontest.Start(t, "")
	pc := pi.Dial(d.sock("register"))
	pi.Call(pc, map[string]any{"harness": "pi", "sessionName": "peer"})
	bot := daemontest.Start(t, botExe)
	if r := bot.Call(bot.Dial(d.sock("register")), map[string]any{"harness": "svc", "name": "bot"}); r["status"] != "ok" {
		t.Fatalf("svc register: %v", r)
	}
	_, list := d.do("GET", "/v1/sessions", "")
	var order []string
	for _, s := range list.([]any) {
		order = append(order, field(s, "harness").(string))
		if field(s, "harness") == "agy" && (field(s, "registered") != false || field(s, "status") != "unregistered" || field(s, "name") != conv) {
			t.Fatalf("unregistered agy entry: %v", s)
		}
	}
	if strings.Join(order, ",") != "claude,agy,pi,svc" {
		t.Fatalf("listing order %v, want claude,agy,pi,svc", order)
	}
	// Unregistered: visible by its exact session id only; a wrong start time is another process.
	if status, _ := d.do("GET", "/v1/sessions/"+conv, ""); status != 404 {
		t.Fatalf("GET by conversation while unregistered: %d, want 404", status)
	}
	if status, v := d.do("GET", "/v1/sessions/"+sessionID, ""); status != 200 || field(v, "sessionId") != sessionID {
		t.Fatalf("GET by session id: %d %v", status, v)
	}
	if status, _ := d.do("GET", fmt.Sprintf("/v1/sessions/agy:%d:1", ag.PID), ""); status != 404 {
		t.Fatalf("GET with a wrong start time: %d, want 404", status)
	}
	// Without credentials, sends by conversation id queue.
	var queued []string
	for _, text := range []string{"first", "second"} {
		status, v := d.do("POST", "/v1/sessions/"+conv+"/messages", `{"from":"tester","text":"`+text+`"}`)
		if status != 202 || field(v, "outcome") != "queued" || field(v, "sessionId") != conv {
			t.Fatalf("send %s: %d %v, want 202 queued to %s", text, status, v, conv)
		}
		queued = append(queued, field(v, "messageId").(string))
	}
	// A presence lock nobody holds is no session: 404 and nothing stored.
	lonely := uuid.NewString()
	os.WriteFile(lock(lonely), nil, 0o600)
	if status, _ := d.do("POST", "/v1/sessions/"+lonely+"/messages", `{"from":"tester","text":"x"}`); status != 404 {
		t.Fatalf("send to an unheld lock: %d, want 404", status)
	}
	if calls := agentapiCalls(t, log); len(calls) != 0 {
		t.Fatalf("agentapi ran before credentials: %v", calls)
	}
	hook := func() string {
		t.Helper()
		cmd := xmsgCmd(d.env, "register", "agy", "--hook")
		cmd.Stdin = strings.NewReader(`{"conversationId":"` + conv + `"}`)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("register agy --hook: %v", err)
		}
		return strings.TrimSpace(string(out))
	}
	if got := hook(); !strings.Contains(got, "register agy` before anything else") {
		t.Fatalf("hook without credentials: %s", got)
	}
	// The hook helper run by something that is not below agy: refused, but the hook still
	// gets its answer and exit 0.
	cli := xmsgCmd(append(d.env, "ANTIGRAVITY_CONVERSATION_ID="+conv, "ANTIGRAVITY_LS_ADDRESS=127.0.0.1:9", "ANTIGRAVITY_CSRF_TOKEN=nope"), "register", "agy")
	var stderr strings.Builder
	cli.Stderr = &stderr
	if out, err := cli.Output(); err != nil || strings.TrimSpace(string(out)) != `{"injectSteps":[]}` || !strings.Contains(stderr.String(), "unattested") {
		t.Fatalf("register agy outside agy: %q %v, stderr %q", out, err, stderr.String())
	}

	// Credentials for a conversation this agy process is not present in: refused.
	rc := ag.Dial(d.sock("register"))
	if r := ag.Call(rc, map[string]any{"conversation_id": lonely, "ls_address": "127.0.0.1:9", "csrf_token": "t"}); r["error"] != "unattested" {
		t.Fatalf("credentials for another conversation: %v", r)
	}
	// The credential frame from below the agy process registers it and flushes FIFO.
	rc = ag.Dial(d.sock("register"))
	creds := map[string]any{"conversation_id": conv, "ls_address": "127.0.0.1:9", "csrf_token": "tok-secret-1"}
	if r := ag.Call(rc, creds); r["status"] != "ok" || r["sessionId"] != sessionID {
		t.Fatalf("credential frame: %v", r)
	}
	daemontest.WaitFor(t, "the queue flush", func() bool { return len(agentapiCalls(t, log)) == 2 })
	calls := agentapiCalls(t, log)
	for i, c := range calls {
		if len(c.Argv) != 6 || c.Argv[0] != "agentapi" || c.Argv[1] != "send-message" || c.Argv[2] != "--title" ||
			c.Argv[3] != "xmsg@testhost · tester" || c.Argv[4] != conv || !strings.Contains(c.Argv[5], "message_id="+queued[i]) {
			t.Fatalf("agentapi call %d argv %q", i, c.Argv)
		}
		if strings.Contains(strings.Join(c.Argv, " "), "tok-secret-1") || strings.Contains(strings.Join(c.Argv, " "), "127.0.0.1:9") {
			t.Fatalf("credentials in argv: %q", c.Argv)
		}
		if strings.Join(c.Env, ",") != "ANTIGRAVITY_LS_ADDRESS=127.0.0.1:9,ANTIGRAVITY_CSRF_TOKEN=tok-secret-1" {
			t.Fatalf("agentapi env %q", c.Env)
		}
	}
	if got := hook(); got != "{}" {
		t.Fatalf("hook with credentials: %s", got)
	}
	// With credentials, a send is delivered at once; the session replies to it.
	status, v := d.do("POST", "/v1/sessions/"+conv+"/messages", `{"from":"tester","text":"third"}`)
	if status != 202 || field(v, "outcome") != "delivered" || field(v, "sessionId") != sessionID {
		t.Fatalf("send with credentials: %d %v", status, v)
	}
	m3 := field(v, "messageId").(string)
	if n := len(agentapiCalls(t, log)); n != 3 {
		t.Fatalf("agentapi calls: %d, want 3", n)
	}
	if r := ag.Call(ac, map[string]any{"action": "reply", "messageId": m3, "text": "got it"}); r["status"] != "ok" {
		t.Fatalf("agy reply: %v", r)
	}
	if r := ag.Call(ac, map[string]any{"action": "send", "ref": "peer", "text": "hi pi"}); r["status"] != "ok" ||
		!strings.Contains(fmt.Sprint(r["delivery"]), "agy:"+conv) {
		t.Fatalf("agy send: %v", r)
	}
	// Stale credentials: agentapi refuses, the bus says credentials_stale and forgets them.
	rc = ag.Dial(d.sock("register"))
	creds["csrf_token"] = "stale"
	ag.Call(rc, creds)
	status, v = d.do("POST", "/v1/sessions/"+conv+"/messages", `{"from":"tester","text":"fourth"}`)
	wantError(t, status, v, 503, "credentials_stale")
	if got := hook(); got == "{}" {
		t.Fatal("hook after stale credentials: {}, want the registration step")
	}

	// Refused: the lock held by the wrong executable; the right executable with the lock
	// open but not flocked; the right executable without the lock.
	for name, p := range map[string]*daemontest.Puppet{
		"wrong exe":      daemontest.StartNestedExe(t, os.Args[0], daemontest.LockEnv+"="+lock(uuid.NewString())),
		"open, no flock": daemontest.StartNestedExe(t, agyExe, daemontest.OpenEnv+"="+lock(lonely)),
		"no lock":        daemontest.StartNestedExe(t, agyExe),
	} {
		c := p.Dial(d.sock("agent"))
		if r := p.Call(c, map[string]any{"action": "mcp_start"}); r["status"] != "error" || r["error"] != "unattested" {
			t.Fatalf("%s: mcp_start got %v, want unattested", name, r)
		}
	}
	// The real MCP bridge under an agy process announces the session by itself (mcp_start on
	// a connection it keeps).
	conv2 := uuid.NewString()
	bridge, _, _ := daemontest.StartMCPAt(t, agyExe, d.sock("agent"), d.sock("http"),
		daemontest.LockEnv+"="+lock(conv2), "ANTIGRAVITY_CONVERSATION_ID="+conv2)
	start2, _ := peercred.Proc{}.StartTime(bridge.Process.Pid)
	daemontest.WaitFor(t, "the bridge's mcp_start", func() bool {
		status, v := d.do("GET", fmt.Sprintf("/v1/sessions/agy:%d:%s", bridge.Process.Pid, start2), "")
		return status == 200 && field(v, "name") == conv2
	})
	// Removing the presence lock ends the session at once.
	if err := os.Remove(lock(conv)); err != nil {
		t.Fatal(err)
	}
	daemontest.WaitFor(t, "the agy session to end with its lock", func() bool {
		status, _ := d.do("GET", "/v1/sessions/"+sessionID, "")
		return status == 404
	})
	if strings.Contains(d.stderr.String(), "tok-secret-1") {
		t.Fatal("a credential reached the log")
	}
}
