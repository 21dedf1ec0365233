package agentsock_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/agentsock"
	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/gate"
	"github.com/xmsg/xmsg/internal/peercred"
)

func TestMain(m *testing.M) { daemontest.Main(m) }

const (
	claudeID = "11111111-2222-4333-8444-555555555555"
	otherID  = "99999999-2222-4333-8444-555555555555"
)

// svcEnv is a daemon that trusts the test binary as service "matrix-xmsg" and "dispatcher".
func svcEnv(t *testing.T, opt daemontest.Options) *daemontest.Env {
	opt.SvcExe = map[string]string{"matrix-xmsg": os.Args[0], "dispatcher": os.Args[0]}
	return daemontest.New(t, opt)
}

func field(t *testing.T, m map[string]any, path ...string) any {
	t.Helper()
	var v any = m
	for _, k := range path {
		obj, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%v: no object at %q", m, k)
		}
		v = obj[k]
	}
	return v
}

func wantError(t *testing.T, got map[string]any, code, detail string) {
	t.Helper()
	if got["status"] != "error" || got["error"] != code || (detail != "" && got["detail"] != detail) {
		t.Fatalf("got %v, want status error, error %q, detail %q", got, code, detail)
	}
}

// TestMatrixXmsgSequence runs matrix-xmsg's frames exactly (docs/protocol.md §11.2 "Current"): it
// registers as svc, forwards a question to a Claude session through agent.sock with
// push_replies, the session replies through agent.sock, and the pushed reply reaches the
// service's queue carrying `reply to message_id=<id>`; ack; nothing is left.
func TestMatrixXmsgSequence(t *testing.T) {
	e := svcEnv(t, daemontest.Options{})
	session := daemontest.Start(t, "")
	inbox := e.Claude(session.PID, claudeID, "expert")

	bot, reg := e.Service("", "matrix-xmsg")

	// 3. Forward a question on a NEW agent.sock connection.
	a := bot.Dial(e.AgentPath)
	got := bot.Call(a, map[string]any{"action": "send", "ref": "expert", "text": "what is 2+2?", "push_replies": true})
	if got["status"] != "ok" {
		t.Fatalf("send: got %v, want ok", got)
	}
	id, _ := field(t, got, "delivery", "messageId").(string)
	if id == "" || field(t, got, "delivery", "sessionId") != claudeID || field(t, got, "delivery", "outcome") != "delivered" {
		t.Fatalf("send: got %v, want messageId, sessionId %s, outcome delivered", got, claudeID)
	}
	if got, want := field(t, got, "delivery", "fromName"), "xmsg@testhost · svc:matrix-xmsg"; got != want {
		t.Fatalf("fromName: got %v, want %q", got, want)
	}
	if got, want := field(t, got, "delivery", "bytes"), float64(len("what is 2+2?")); got != want {
		t.Fatalf("bytes: got %v, want %v", got, want)
	}
	content := daemontest.InboxContent(t, inbox.Next(t))
	if !strings.Contains(content, `from-name="xmsg@testhost · svc:matrix-xmsg"`) || !strings.Contains(content, "what is 2+2?") ||
		!strings.Contains(content, "[xmsg] message_id="+id) {
		t.Fatalf("inbox content %q lacks the attested sender, the text or the message id", content)
	}

	// The session answers through agent.sock.
	sc := session.Dial(e.AgentPath)
	rep := session.Call(sc, map[string]any{"action": "reply", "messageId": id, "text": "4"})
	if rep["status"] != "ok" || field(t, rep, "reply", "pushOutcome") != "pushed" || field(t, rep, "reply", "messageId") != id ||
		field(t, rep, "reply", "sessionRef") != claudeID || field(t, rep, "reply", "replierSessionId") != claudeID {
		t.Fatalf("reply: got %v, want ok, pushed, original id, replier %s", rep, claudeID)
	}
	pushedID, _ := field(t, rep, "reply", "pushedMessageId").(string)
	if pushedID == "" {
		t.Fatalf("reply: got %v, want a pushedMessageId", rep)
	}

	// 2. The bot's inbox loop: poll → deliver (the pushed reply) → ack → nothing left.
	d := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 5})
	if d["action"] != "deliver" || d["messageId"] != pushedID || d["text"] != "4" {
		t.Fatalf("poll: got %v, want deliver of %s with text 4", d, pushedID)
	}
	env, _ := d["envelope"].(string)
	if !strings.Contains(env, "reply to message_id="+id) {
		t.Fatalf("envelope %q does not contain %q", env, "reply to message_id="+id)
	}
	if got, want := d["fromName"], "xmsg@testhost · claude:expert"; got != want {
		t.Fatalf("deliver fromName: got %v, want %q", got, want)
	}
	origin, _ := d["origin"].(map[string]any)
	if origin["kind"] != "local" || origin["harness"] != "claude" || origin["sessionId"] != claudeID {
		t.Fatalf("origin: got %v, want local claude %s", d["origin"], claudeID)
	}
	if got := bot.Call(reg, map[string]any{"action": "ack", "messageId": pushedID}); got["status"] != "ok" {
		t.Fatalf("ack: got %v, want ok", got)
	}
	if got := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0}); got["action"] != "timeout" {
		t.Fatalf("poll after ack: got %v, want timeout", got)
	}

	// 4. The bot replies to the pushed reply (it is the recipient); the push goes back to the
	// session's inbox.
	r2 := bot.Call(a, map[string]any{"action": "reply", "messageId": pushedID, "text": "thanks"})
	if r2["status"] != "ok" || field(t, r2, "reply", "pushOutcome") != "pushed" || field(t, r2, "reply", "sessionRef") != "svc:matrix-xmsg" {
		t.Fatalf("bot reply: got %v, want ok pushed from svc:matrix-xmsg", r2)
	}
	content = daemontest.InboxContent(t, inbox.Next(t))
	if !strings.Contains(content, "reply to message_id="+pushedID) || !strings.Contains(content, "thanks") {
		t.Fatalf("inbox content %q: want the pushed reply to %s", content, pushedID)
	}
}

// TestDispatcherSequence follows the dispatcher daemon's client (docs/protocol.md §11.1): register
// without cwd, one-shot agent.sock sends with push_replies false and an idempotency key, reply,
// and not_found for a session that is not running.
func TestDispatcherSequence(t *testing.T) {
	e := svcEnv(t, daemontest.Options{})
	session := daemontest.Start(t, "")
	inbox := e.Claude(session.PID, claudeID, "")

	disp := daemontest.Start(t, "")
	reg := disp.Dial(e.RegPath)
	if got := disp.Call(reg, map[string]any{"harness": "svc", "name": "dispatcher"}); got["status"] != "ok" || got["sessionId"] != "svc:dispatcher" {
		t.Fatalf("register: got %v", got)
	}
	send := func(ref, key string) map[string]any {
		c := disp.Dial(e.AgentPath)
		defer disp.Close(c)
		return disp.Call(c, map[string]any{"action": "send", "ref": ref, "text": "job 1", "push_replies": false, "idempotency_key": key})
	}
	first := send(claudeID, "k1")
	id, _ := field(t, first, "delivery", "messageId").(string)
	if first["status"] != "ok" || id == "" {
		t.Fatalf("send: got %v", first)
	}
	inbox.Next(t)
	again := send(claudeID, "k1")
	if got := field(t, again, "delivery", "messageId"); got != id {
		t.Fatalf("idempotent retry: messageId %v, want %s", got, id)
	}
	if inbox.Len() != 0 {
		t.Fatalf("idempotent retry delivered again")
	}
	wantError(t, send("no-such-session", "k2"), "not_found", "no live session matches 'no-such-session'")

	// The session replies; the dispatcher asked for no pushes, so the reply is poll-only.
	sc := session.Dial(e.AgentPath)
	rep := session.Call(sc, map[string]any{"action": "reply", "message_id": id, "text": "done"})
	if rep["status"] != "ok" || field(t, rep, "reply", "pushOutcome") != "disabled" || field(t, rep, "reply", "pushedMessageId") != nil {
		t.Fatalf("reply: got %v, want pushOutcome disabled, pushedMessageId null", rep)
	}
	replies, err := e.Bus.Replies(context.Background(), id, 0, 0)
	if err != nil || len(replies) != 1 || replies[0].Text != "done" {
		t.Fatalf("replies: got %v, %v, want one reply 'done'", replies, err)
	}
	if got := disp.Call(reg, map[string]any{"action": "poll", "waitSecs": 0}); got["action"] != "timeout" {
		t.Fatalf("poll: got %v, want timeout (nothing pushed)", got)
	}
}

// TestNotRecipient: a process of our uid that is no session and no registration, nor descends
// from one, cannot send or reply.
func TestNotRecipient(t *testing.T) {
	e := svcEnv(t, daemontest.Options{})
	session := daemontest.Start(t, "")
	e.Claude(session.PID, claudeID, "")
	stranger := daemontest.Start(t, "")
	c := stranger.Dial(e.AgentPath)
	want := fmt.Sprintf("peer PID %d does not descend from an active agent session", stranger.PID)
	wantError(t, stranger.Call(c, map[string]any{"action": "send", "ref": claudeID, "text": "hi"}), "not_recipient", want)
	wantError(t, stranger.Call(c, map[string]any{"action": "reply", "messageId": "x", "text": "hi"}), "not_recipient", want)
	// The connection stays usable; the refusal is logged with actor, request and reason.
	wantError(t, stranger.Call(c, map[string]any{"action": "nope"}), "bad_request", "unknown action: 'nope'")
	logs := e.Logs.String()
	if !strings.Contains(logs, "actor=pid:"+strconv.Itoa(stranger.PID)) || !strings.Contains(logs, "request=send") || !strings.Contains(logs, "does not descend") {
		t.Fatalf("refusal not logged with actor, request and reason:\n%s", logs)
	}
}

// TestAncestorWalk: a child of a session process (as an MCP bridge is) acts as that session.
func TestAncestorWalk(t *testing.T) {
	e := svcEnv(t, daemontest.Options{})
	target := daemontest.Start(t, "")
	inbox := e.Claude(target.PID, otherID, "target")
	nested := daemontest.StartNested(t) // PID is the parent's; the dialer is its child
	e.Claude(nested.PID, claudeID, "alice")
	c := nested.Dial(e.AgentPath)
	got := nested.Call(c, map[string]any{"action": "send", "ref": "target", "text": "hello"})
	if got["status"] != "ok" || field(t, got, "delivery", "fromName") != "xmsg@testhost · claude:alice" {
		t.Fatalf("send from a child of the session: got %v, want ok from claude:alice", got)
	}
	inbox.Next(t)
	m, err := e.Bus.Message(field(t, got, "delivery", "messageId").(string))
	if err != nil || m.ReturnHarness != "claude" || m.ReturnSessionID != claudeID {
		t.Fatalf("message return address: got %+v, %v, want claude %s", m, err, claudeID)
	}
}

// TestClaimedIdentityIgnored: identity fields written by the client change nothing: the badge,
// the return address and the idempotency scope all come from attestation.
func TestClaimedIdentityIgnored(t *testing.T) {
	e := svcEnv(t, daemontest.Options{})
	target := daemontest.Start(t, "")
	inbox := e.Claude(target.PID, otherID, "")
	sender := daemontest.Start(t, "")
	e.Claude(sender.PID, claudeID, "alice")
	c := sender.Dial(e.AgentPath)
	got := sender.Call(c, map[string]any{"action": "send", "ref": otherID, "text": "hi", "from": "svc:root", "fromName": "xmsg@testhost · svc:root",
		"return_to": "svc:evil", "sessionId": "svc:evil", "harness": "svc", "principal": "session:svc:evil"})
	if got["status"] != "ok" || field(t, got, "delivery", "fromName") != "xmsg@testhost · claude:alice" {
		t.Fatalf("got %v, want ok with the attested badge", got)
	}
	if content := daemontest.InboxContent(t, inbox.Next(t)); strings.Contains(content, "svc:root") || strings.Contains(content, "evil") {
		t.Fatalf("claimed identity reached the inbox: %q", content)
	}
	m, err := e.Bus.Message(field(t, got, "delivery", "messageId").(string))
	if err != nil || m.ReturnSessionID != claudeID {
		t.Fatalf("return address: got %+v, %v, want %s", m, err, claudeID)
	}
}

// TestErrors covers every error code agent.sock answers (docs/protocol.md §4.1).
func TestErrors(t *testing.T) {
	e := svcEnv(t, daemontest.Options{MaxBody: 16})
	sender := daemontest.Start(t, "")
	e.Claude(sender.PID, claudeID, "alice")
	target := daemontest.Start(t, "")
	inbox := e.Claude(target.PID, otherID, "")
	// Two live sessions named "twin": ambiguous.
	twin1, twin2 := daemontest.Start(t, ""), daemontest.Start(t, "")
	e.Claude(twin1.PID, "aaaaaaaa-0000-4000-8000-000000000001", "twin")
	e.Claude(twin2.PID, "bbbbbbbb-0000-4000-8000-000000000002", "twin")
	// A session whose process exited: gone.
	dead := daemontest.Start(t, "")
	e.Claude(dead.PID, "cccccccc-0000-4000-8000-000000000003", "dead")
	dead.Kill()
	// A live session whose inbox socket does not exist: delivery failed.
	noInbox := daemontest.Start(t, "")
	e.Claude(noInbox.PID, "dddddddd-0000-4000-8000-000000000004", "noinbox")
	os.Remove(filepath.Join(e.Dir, "inbox-dddddddd.sock"))
	// A live process that is no session: unregistered.
	plain := daemontest.Start(t, "")

	c := sender.Dial(e.AgentPath)
	ok := sender.Call(c, map[string]any{"action": "send", "ref": otherID, "text": "x", "idempotency_key": "k"})
	if ok["status"] != "ok" {
		t.Fatalf("send: %v", ok)
	}
	inbox.Next(t)
	id := field(t, ok, "delivery", "messageId").(string)

	tests := []struct {
		name         string
		req          map[string]any
		code, detail string
	}{
		{"missing ref", map[string]any{"action": "send", "text": "x"}, "bad_request", "ref and text are required"},
		{"missing text", map[string]any{"action": "send", "ref": otherID}, "bad_request", "ref and text are required"},
		{"empty text", map[string]any{"action": "send", "ref": otherID, "text": ""}, "bad_request", "ref and text are required"},
		{"too large", map[string]any{"action": "send", "ref": otherID, "text": strings.Repeat("x", 17)}, "body_too_large", "text 17 exceeds limit 16"},
		{"bad key", map[string]any{"action": "send", "ref": otherID, "text": "x", "idempotencyKey": "a\nb"}, "bad_request", ""},
		{"conflict", map[string]any{"action": "send", "ref": otherID, "text": "y", "idempotency_key": "k"}, "conflict", ""},
		{"not found", map[string]any{"action": "send", "ref": "nobody", "text": "x"}, "not_found", "no live session matches 'nobody'"},
		{"ambiguous", map[string]any{"action": "send", "ref": "twin", "text": "x"}, "not_found", "aaaaaaaa-0000-4000-8000-000000000001,bbbbbbbb-0000-4000-8000-000000000002"},
		{"gone", map[string]any{"action": "send", "ref": "dead", "text": "x"}, "not_found", fmt.Sprintf("session cccccccc-0000-4000-8000-000000000003 process %d exited", dead.PID)},
		{"unregistered", map[string]any{"action": "send", "ref": strconv.Itoa(plain.PID), "text": "x"}, "unregistered", fmt.Sprintf("pid %d is unregistered", plain.PID)},
		{"delivery failed", map[string]any{"action": "send", "ref": "noinbox", "text": "x"}, "delivery_failed", ""},
		{"remote unknown peer", map[string]any{"action": "send", "ref": "x@elsewhere", "text": "x"}, "unknown_peer", ""},
		{"reply missing", map[string]any{"action": "reply", "text": "x"}, "bad_request", "messageId and text are required"},
		{"reply unknown", map[string]any{"action": "reply", "messageId": "nope", "text": "x"}, "not_found", "no message 'nope'"},
		{"reply not recipient", map[string]any{"action": "reply", "messageId": id, "text": "x"}, "not_recipient",
			fmt.Sprintf("caller session 'claude:%s' is not recipient of message '%s' (expected 'claude:%s')", claudeID, id, otherID)},
		{"mcp_start", map[string]any{"action": "mcp_start"}, "unattested",
			fmt.Sprintf("peer PID %d does not descend from a trusted agy process holding a presence lock", sender.PID)},
		{"unknown action", map[string]any{"action": "launch"}, "bad_request", "unknown action: 'launch'"},
		{"no action", map[string]any{"ref": "x"}, "bad_request", "unknown action: ''"},
		{"wrong type", map[string]any{"action": "send", "ref": 5, "text": "x"}, "bad_request", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, sender.Call(c, tc.req), tc.code, tc.detail)
		})
	}
	if inbox.Len() != 0 {
		t.Fatalf("a refused request delivered something")
	}
}

// TestFrameBytes pins answers byte for byte where the codec decides them: no HTML escaping
// (the original xmsg's serde bytes, not encoding/json's \u003c), field names that match
// exactly, and a wrong type named by its field.
func TestFrameBytes(t *testing.T) {
	e := daemontest.New(t, daemontest.Options{})
	c := daemontest.Dial(t, e.AgentPath)
	for _, tc := range []struct{ frame, want string }{
		{`{"action":"<a&b>"}`, `{"status":"error","error":"bad_request","detail":"unknown action: '<a&b>'"}`},
		{`{"Action":"send","ref":"x","text":"y"}`, `{"status":"error","error":"bad_request","detail":"unknown action: ''"}`},
		{`{"action":"send","ref":5}`, `{"status":"error","error":"bad_request","detail":"invalid json: field 'ref' must be a string"}`},
		{`{"action":"send","pushReplies":"yes"}`, `{"status":"error","error":"bad_request","detail":"invalid json: field 'pushReplies' must be a boolean"}`},
		{`[1]`, `{"status":"error","error":"bad_request","detail":"invalid json: frame must be a JSON object"}`},
		{`{} {}`, `{"status":"error","error":"bad_request","detail":"invalid json: trailing data after the object"}`},
	} {
		c.Write([]byte(tc.frame + "\n"))
		if line, _ := c.Recv(); line != tc.want {
			t.Errorf("%s: got %s, want %s", tc.frame, line, tc.want)
		}
	}
}

// TestMaxConns: with DefaultMaxPending unattested connections held idle, the next one is
// served, and the oldest idle one is told it was closed to make room (an error frame).
func TestMaxConns(t *testing.T) {
	// Every connection is the test process's: its per-process bound is lifted above the cap.
	e := daemontest.New(t, daemontest.Options{Agent: agentsock.Config{MaxPerPID: agentsock.DefaultMaxConns + 1}})
	var clients []*daemontest.Client
	for i := 0; i < agentsock.DefaultMaxPending; i++ {
		c := daemontest.Dial(t, e.AgentPath)
		// An answer proves the server holds this connection.
		wantError(t, c.Call(map[string]any{"action": "x"}), "bad_request", "unknown action: 'x'")
		clients = append(clients, c)
	}
	daemontest.WaitFor(t, "every held connection to wait idle", func() bool { return e.Agent.Idle() == agentsock.DefaultMaxPending })
	extra := daemontest.Dial(t, e.AgentPath)
	wantError(t, extra.Call(map[string]any{"action": "x"}), "bad_request", "unknown action: 'x'")
	line, _ := clients[0].Recv()
	if !strings.Contains(line, `"error":"service_unavailable"`) || !strings.Contains(line, "to make room") {
		t.Fatalf("the oldest idle connection: got %q, want the eviction frame", line)
	}
	if _, eof := clients[0].Recv(); !eof {
		t.Fatal("the evicted connection stayed open")
	}
	if !strings.Contains(e.Logs.String(), "evicted to make room") {
		t.Fatalf("eviction not logged")
	}
	wantError(t, clients[1].Call(map[string]any{"action": "x"}), "bad_request", "unknown action: 'x'")
}

func TestFraming(t *testing.T) {
	e := daemontest.New(t, daemontest.Options{Agent: agentsock.Config{MaxLine: 1024}})
	unknown := `{"status":"error","error":"bad_request","detail":"unknown action: 'x'"}`
	t.Run("line too long: error, then closed", func(t *testing.T) {
		c := daemontest.Dial(t, e.AgentPath)
		c.Write([]byte(`{"action":"` + strings.Repeat("x", 2000) + `"}` + "\n" + `{"action":"x"}` + "\n"))
		line, _ := c.Recv()
		if want := `{"status":"error","error":"payload_too_large","detail":"line exceeds 1024 bytes"}`; line != want {
			t.Fatalf("got %q, want %q", line, want)
		}
		if line, eof := c.Recv(); !eof {
			t.Fatalf("after an oversized line got %q, want the connection closed", line)
		}
	})
	t.Run("line of exactly the limit is served", func(t *testing.T) {
		c := daemontest.Dial(t, e.AgentPath)
		req := `{"action":"x"}`
		c.Write([]byte(req + strings.Repeat(" ", 1024-len(req)) + "\n"))
		if line, _ := c.Recv(); line != unknown {
			t.Fatalf("got %q, want %q", line, unknown)
		}
	})
	t.Run("invalid UTF-8: error, then closed", func(t *testing.T) {
		c := daemontest.Dial(t, e.AgentPath)
		c.Write([]byte("{\"action\":\"\xff\"}\n{\"action\":\"x\"}\n"))
		line, _ := c.Recv()
		if want := `{"status":"error","error":"bad_request","detail":"frame is not valid UTF-8"}`; line != want {
			t.Fatalf("got %q, want %q", line, want)
		}
		if line, eof := c.Recv(); !eof {
			t.Fatalf("after invalid UTF-8 got %q, want the connection closed", line)
		}
	})
	t.Run("invalid JSON: error, connection stays", func(t *testing.T) {
		c := daemontest.Dial(t, e.AgentPath)
		for _, bad := range []string{"{nope", "[1,2]", `"str"`, `{"action":"x"} {}`, "null"} {
			c.Write([]byte(bad + "\n"))
			line, _ := c.Recv()
			var got map[string]any
			json.Unmarshal([]byte(line), &got)
			if got["status"] != "error" || got["error"] != "bad_request" || !strings.HasPrefix(got["detail"].(string), "invalid json") {
				t.Fatalf("%q: got %v, want bad_request invalid json", bad, got)
			}
		}
		wantError(t, c.Call(map[string]any{"action": "x"}), "bad_request", "unknown action: 'x'")
	})
	t.Run("blank lines are ignored", func(t *testing.T) {
		c := daemontest.Dial(t, e.AgentPath)
		c.Write([]byte("\n  \r\n\t\n{\"action\":\"x\"}\n"))
		if line, _ := c.Recv(); line != unknown {
			t.Fatalf("got %q, want %q", line, unknown)
		}
	})
	t.Run("last line without newline is answered", func(t *testing.T) {
		c := daemontest.Dial(t, e.AgentPath)
		c.Write([]byte(`{"action":"x"}`))
		c.C.CloseWrite()
		if line, _ := c.Recv(); line != unknown {
			t.Fatalf("got %q, want %q", line, unknown)
		}
	})
}

// TestMaxFrame: the protocol's frame cap applies when it is below MaxLine.
func TestMaxFrame(t *testing.T) {
	e := daemontest.New(t, daemontest.Options{Agent: agentsock.Config{MaxLine: 4096, MaxFrame: 100}})
	c := daemontest.Dial(t, e.AgentPath)
	c.Write([]byte(`{"action":"` + strings.Repeat("x", 100) + `"}` + "\n"))
	if line, _ := c.Recv(); line != `{"status":"error","error":"payload_too_large","detail":"line exceeds 100 bytes"}` {
		t.Fatalf("got %q", line)
	}
}

// TestIdleTimeout: a connection that sends no complete line is closed.
func TestIdleTimeout(t *testing.T) {
	e := daemontest.New(t, daemontest.Options{Agent: agentsock.Config{IdleTimeout: 100 * time.Millisecond}})
	c := daemontest.Dial(t, e.AgentPath)
	wantError(t, c.Call(map[string]any{"action": "x"}), "bad_request", "unknown action: 'x'")
	c.Write([]byte(`{"action":`)) // half a line does not count
	if line, eof := c.Recv(); !eof {
		t.Fatalf("got %q, want the idle connection closed", line)
	}
}

// TestWriteTimeout: a client that sends but never reads is dropped once the server cannot
// write, instead of holding a server goroutine forever.
func TestWriteTimeout(t *testing.T) {
	e := daemontest.New(t, daemontest.Options{Agent: agentsock.Config{WriteTimeout: 100 * time.Millisecond}})
	c := daemontest.Dial(t, e.AgentPath)
	c.C.SetReadBuffer(4096)
	// Each answer echoes a 200 KiB action name: a few fill every socket buffer.
	frame := []byte(`{"action":"` + strings.Repeat("x", 200<<10) + `"}` + "\n")
	go func() {
		c.C.SetWriteDeadline(time.Now().Add(daemontest.Wait))
		for i := 0; i < 64; i++ {
			if _, err := c.C.Write(frame); err != nil {
				return
			}
		}
	}()
	daemontest.WaitFor(t, "the unread connection to be dropped", func() bool { return e.Agent.Conns() == 0 && strings.Contains(e.Logs.String(), "write abandoned") })
}

// TestPIDGuard: a connection whose connecting process exited is closed at its next frame, even
// though a live process (here the connector's own child, which inherited the socket) writes it.
func TestPIDGuard(t *testing.T) {
	e := svcEnv(t, daemontest.Options{})
	session := daemontest.Start(t, "")
	e.Claude(session.PID, claudeID, "")
	c := session.Dial(e.AgentPath)
	if got := session.Call(c, map[string]any{"action": "x"}); got["status"] != "error" {
		t.Fatalf("got %v", got)
	}
	heir := session.Handoff(c) // session exits, its child holds the socket
	heir.Send(c, map[string]any{"action": "send", "ref": claudeID, "text": "x"})
	if line, eof := heir.Recv(c); !eof {
		t.Fatalf("frame after the connecting process died: got %q, want the connection closed", line)
	}
	if !strings.Contains(e.Logs.String(), "peer process exited or its pid was reused") {
		t.Fatalf("closing not logged")
	}
}

// TestShutdown: Serve returns net.ErrClosed, idle connections are closed, new ones refused.
func TestShutdown(t *testing.T) {
	e := daemontest.New(t, daemontest.Options{})
	c := daemontest.Dial(t, e.AgentPath)
	wantError(t, c.Call(map[string]any{"action": "x"}), "bad_request", "unknown action: 'x'")
	// Bounded below the idle timeout: the idle connection must be woken by Shutdown, not
	// outwaited.
	ctx, cancel := context.WithTimeout(context.Background(), daemontest.Wait)
	defer cancel()
	if err := e.Agent.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if line, eof := c.Recv(); !eof {
		t.Fatalf("after shutdown got %q, want closed", line)
	}
	if e.Agent.Conns() != 0 {
		t.Fatalf("conns after shutdown: got %d, want 0", e.Agent.Conns())
	}
	if _, err := net.Dial("unix", e.AgentPath); err == nil {
		t.Fatalf("dial after shutdown succeeded")
	}
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "a.sock"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Agent.Serve(gate.Listener(l, uint32(os.Geteuid()), "agent", nil)); err != net.ErrClosed {
		t.Fatalf("Serve after Shutdown: got %v, want net.ErrClosed", err)
	}
}

// TestUngatedConnectionRefused: a listener without the gate yields connections with no
// credentials; they are closed unanswered.
func TestUngatedConnectionRefused(t *testing.T) {
	e := daemontest.New(t, daemontest.Options{})
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "raw.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go e.Agent.Serve(l)
	c := daemontest.Dial(t, l.Addr().String())
	c.C.Write([]byte(`{"action":"x"}` + "\n")) // may fail: the server may have closed already
	if line, eof := c.Recv(); !eof {
		t.Fatalf("got %q, want closed", line)
	}
	if !strings.Contains(e.Logs.String(), "no peer credentials") {
		t.Fatalf("refusal not logged with its reason")
	}
}

// TestStartTimeUnreadable: Proc pointing at an empty tree cannot read the peer's start time,
// so every connection is closed unanswered (fail closed).
func TestStartTimeUnreadable(t *testing.T) {
	e := daemontest.New(t, daemontest.Options{})
	s := agentsock.New(agentsock.Config{Bus: e.Bus, Proc: peercred.Proc{Root: t.TempDir()}, Log: e.Log})
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "a.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(gate.Listener(l, uint32(os.Geteuid()), "agent", nil))
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	c := daemontest.Dial(t, l.Addr().String())
	c.C.Write([]byte(`{"action":"x"}` + "\n")) // may fail: the server may have closed already
	if line, eof := c.Recv(); !eof {
		t.Fatalf("got %q, want closed", line)
	}
	if !strings.Contains(e.Logs.String(), "peer start time unreadable") {
		t.Fatalf("refusal not logged with its reason")
	}
}

// TestBlankLinesDoNotResetIdle: an attested session that sends only blank lines after its
// frame is closed when its idle time runs out, as if it had sent nothing.
func TestBlankLinesDoNotResetIdle(t *testing.T) {
	e := daemontest.New(t, daemontest.Options{Agent: agentsock.Config{IdleTimeout: 300 * time.Millisecond}})
	// The test process itself is the session, so that its writes can fail without ending it.
	e.Claude(os.Getpid(), claudeID, "blank")
	c := daemontest.Dial(t, e.AgentPath)
	got := c.Call(map[string]any{"action": "reply", "messageId": "nope", "text": "x"})
	if got["error"] != "not_found" {
		t.Fatalf("reply to an unknown message: got %v, want not_found", got)
	}
	if e.Agent.Attested() != 1 {
		t.Fatalf("attested connections %d, want 1", e.Agent.Attested())
	}
	// Blank lines every 20 ms, for far longer than the idle timeout: the server must close.
	closed := false
	for i := 0; i < 500 && !closed; i++ {
		_, err := c.C.Write([]byte("\n"))
		closed = err != nil || e.Agent.Conns() == 0
		time.Sleep(20 * time.Millisecond)
	}
	if !closed {
		t.Fatal("blank lines kept an idle connection open")
	}
}

// TestUnattestedDoNotTakeAttestedSlots: with every unattested place held by connections that
// never attest, a session's connection is refused at accept only if it is over the pending
// pool; once in, its attested slot does not depend on them. Here the holders fill MaxConns
// worth of connections and a session is still served.
func TestUnattestedDoNotTakeAttestedSlots(t *testing.T) {
	e := daemontest.New(t, daemontest.Options{Agent: agentsock.Config{MaxConns: 2, MaxPending: 4}})
	// Three holders from this test process: unknown pid, never attested.
	for range 3 {
		h := daemontest.Dial(t, e.AgentPath)
		h.Write([]byte("\n"))
	}
	daemontest.WaitFor(t, "the holders to be served", func() bool { return e.Agent.Conns() == 3 })
	session := daemontest.Start(t, "")
	e.Claude(session.PID, claudeID, "fair")
	for i := range 2 {
		c := session.Dial(e.AgentPath)
		if got := session.Call(c, map[string]any{"action": "reply", "messageId": "nope", "text": "x"}); got["error"] != "not_found" {
			t.Fatalf("session connection %d: got %v, want served (not_found)", i, got)
		}
	}
	if e.Agent.Attested() != 2 {
		t.Fatalf("attested %d, want 2", e.Agent.Attested())
	}
	// A third attested connection is over MaxConns: refused with a retryable code, closed.
	c := session.Dial(e.AgentPath)
	if got := session.Call(c, map[string]any{"action": "reply", "messageId": "nope", "text": "x"}); got["error"] != "service_unavailable" ||
		got["detail"] != "too many attested connections (limit 2); retry later" {
		t.Fatalf("over MaxConns: got %v, want service_unavailable naming the bound", got)
	}
}

// TestAttestationRecheckedPerFrame: a connection is attested once, but every later frame
// re-checks that its session is still there: when the session file is removed (the session
// ended while the process lives on), the next frame is refused; when it comes back, the
// connection acts for it again.
func TestAttestationRecheckedPerFrame(t *testing.T) {
	e := svcEnv(t, daemontest.Options{})
	target := daemontest.Start(t, "")
	inbox := e.Claude(target.PID, otherID, "target")
	nested := daemontest.StartNested(t)
	e.Claude(nested.PID, claudeID, "alice")
	c := nested.Dial(e.AgentPath)
	send := func() map[string]any {
		return nested.Call(c, map[string]any{"action": "send", "ref": "target", "text": "hello"})
	}
	if got := send(); got["status"] != "ok" {
		t.Fatalf("first send: %v", got)
	}
	inbox.Next(t)
	file := filepath.Join(e.SessionsDir, claudeID+".json")
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if got := send(); got["status"] != "error" || got["error"] != "not_recipient" {
		t.Fatalf("send after the session file was removed: %v, want not_recipient", got)
	}
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := send(); got["status"] != "ok" {
		t.Fatalf("send after the session came back: %v", got)
	}
	inbox.Next(t)
}
