package registersock_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/registersock"
)

func TestMain(m *testing.M) { daemontest.Main(m) }

const claudeID = "11111111-2222-4333-8444-555555555555"

const convID = "22222222-3333-4444-8555-666666666666"

func newEnv(t *testing.T, opt daemontest.Options) *daemontest.Env {
	if opt.SvcExe == nil {
		opt.SvcExe = map[string]string{"bot": os.Args[0]}
	}
	return daemontest.New(t, opt)
}

// anonSend queues a message for ref as an anonymous HTTP sender would.
func anonSend(t *testing.T, e *daemontest.Env, ref, text string) string {
	t.Helper()
	d, err := e.Bus.Send(context.Background(), bus.Send{To: envelope.ParseRef(ref), Text: text, Bytes: len(text), FromName: "xmsg@testhost · tester",
		Principal: "http:tester"})
	if err != nil {
		t.Fatalf("send to %s: %v", ref, err)
	}
	return d.MessageID
}

func TestFirstFrame(t *testing.T) {
	e := newEnv(t, daemontest.Options{Register: registersock.Config{MaxFirstFrame: 1024}})
	tests := []struct {
		name, frame, want string
	}{
		{"check", `{"action":"check","conversation_id":"c1"}`, `{"status":"ok","hasCredentials":false,"has_credentials":false}`},
		{"has_credentials", `{"action":"has_credentials","conversationId":"c1"}`, `{"status":"ok","hasCredentials":false,"has_credentials":false}`},
		{"agy credentials, bad conversation", `{"conversation_id":"c","ls_address":"127.0.0.1:1","csrf_token":"t"}`, `{"status":"error","error":"bad_request","detail":"conversation_id is not a valid conversation id"}`},
		{"agy credentials, token with a space", `{"conversation_id":"` + convID + `","ls_address":"127.0.0.1:1","csrf_token":"a b"}`, `{"status":"error","error":"bad_request","detail":"csrf_token is not a valid token"}`},
		{"agy credentials, not below agy", `{"conversation_id":"` + convID + `","ls_address":"127.0.0.1:1","csrf_token":"t"}`,
			fmt.Sprintf(`{"status":"error","error":"unattested","detail":"peer process %d does not descend from a trusted agy process holding the presence lock of conversation %s"}`, os.Getpid(), convID)},
		{"unknown harness", `{"harness":"codex","name":"x"}`, `{"status":"error","error":"bad_request","detail":"conversation_id, ls_address and csrf_token are required"}`},
		{"not json", `hello`, `{"status":"error","error":"bad_request","detail":"invalid json"}`},
		{"array", `[1]`, `{"status":"error","error":"bad_request","detail":"invalid json"}`},
		{"blank", ``, `{"status":"error","error":"bad_request","detail":"invalid json"}`},
		{"two objects", `{} {}`, `{"status":"error","error":"bad_request","detail":"invalid json"}`},
		{"wrong type", `{"harness":5}`, `{"status":"error","error":"bad_request","detail":"invalid json: field 'harness' must be a string"}`},
		{"svc empty name", `{"harness":"svc","name":"  "}`, `{"status":"error","error":"bad_request","detail":"service name must not be empty"}`},
		{"svc not configured", `{"harness":"svc","name":"other"}`, `{"status":"error","error":"not_recipient","detail":"no trusted executable configured for service 'other'"}`},
		// No HTML escaping: the bytes of the original xmsg (serde), not encoding/json's \u003c.
		{"html unescaped", `{"harness":"svc","name":"<a&b>"}`, `{"status":"error","error":"not_recipient","detail":"no trusted executable configured for service '<a&b>'"}`},
		// Field names match exactly (serde), so this names no harness at all.
		{"names are case-sensitive", `{"Harness":"svc","Name":"bot"}`, `{"status":"error","error":"bad_request","detail":"conversation_id, ls_address and csrf_token are required"}`},
		{"trailing vertical tab", "{}\v", `{"status":"error","error":"bad_request","detail":"invalid json"}`},
		{"invalid UTF-8", "{\"harness\":\"\xff\"}", `{"status":"error","error":"bad_request","detail":"frame is not valid UTF-8"}`},
		{"too long", `{"harness":"` + strings.Repeat("x", 1100) + `"}`, `{"status":"error","error":"payload_too_large","detail":"first frame exceeds 1024 bytes"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := daemontest.Dial(t, e.RegPath)
			c.Write([]byte(tc.frame + "\n"))
			if line, _ := c.Recv(); line != tc.want {
				t.Fatalf("got %q, want %q", line, tc.want)
			}
			// Every first frame but a registration ends the connection.
			if line, eof := c.Recv(); !eof {
				t.Fatalf("then got %q, want the connection closed", line)
			}
		})
	}
	if registrations(e.Bus) != 0 {
		t.Fatalf("registrations: got %d, want 0", registrations(e.Bus))
	}
}

// TestFirstFrameDeadline: a connection that does not send its first frame in time, or sends
// it without the newline, is closed unanswered.
func TestFirstFrameDeadline(t *testing.T) {
	e := newEnv(t, daemontest.Options{Register: registersock.Config{FirstFrameTimeout: 100 * time.Millisecond}})
	for _, partial := range []string{"", `{"harness":"pi"}`} {
		c := daemontest.Dial(t, e.RegPath)
		c.Write([]byte(partial))
		if line, eof := c.Recv(); !eof {
			t.Fatalf("partial %q: got %q, want closed", partial, line)
		}
	}
	c := daemontest.Dial(t, e.RegPath)
	c.Write([]byte(`{"action":"check"}`))
	c.C.CloseWrite()
	if line, eof := c.Recv(); !eof {
		t.Fatalf("frame without newline: got %q, want closed", line)
	}
}

// TestServiceAttestation: a service is admitted only when its process runs the configured
// executable (the same bytes at another path do not count), one live registration at a time.
func TestServiceAttestation(t *testing.T) {
	dir := t.TempDir()
	trusted := daemontest.CopyExe(t, dir, "bot")
	e := newEnv(t, daemontest.Options{SvcExe: map[string]string{"bot": trusted}})

	impostor := daemontest.Start(t, "") // the original test binary: same content, other file
	c := impostor.Dial(e.RegPath)
	got := impostor.Call(c, map[string]any{"harness": "svc", "name": "bot"})
	want := fmt.Sprintf("peer process %d executable does not match trusted executable for service 'bot'", impostor.PID)
	if got["status"] != "error" || got["detail"] != want {
		t.Fatalf("impostor: got %v, want detail %q", got, want)
	}
	if _, eof := impostor.Recv(c); !eof {
		t.Fatalf("impostor connection not closed")
	}
	if !strings.Contains(e.Logs.String(), "does not match trusted executable") {
		t.Fatalf("refusal not logged")
	}

	bot := daemontest.Start(t, trusted)
	if got := bot.Call(bot.Dial(e.RegPath), map[string]any{"harness": "svc", "name": " svc:bot "}); got["status"] != "ok" || got["sessionId"] != "svc:bot" {
		t.Fatalf("trusted exe (name with svc: prefix and spaces): got %v, want ok svc:bot", got)
	}
	second := daemontest.Start(t, trusted)
	c2 := second.Dial(e.RegPath)
	got = second.Call(c2, map[string]any{"harness": "svc", "name": "bot"})
	if got["status"] != "error" || got["detail"] != "service 'svc:bot' already has an active registration" {
		t.Fatalf("second live registration: got %v", got)
	}
	// Once the first process is gone, a new one registers at once.
	bot.Kill()
	c3 := second.Dial(e.RegPath)
	if got := second.Call(c3, map[string]any{"harness": "svc", "name": "bot"}); got["status"] != "ok" {
		t.Fatalf("registration after the first died: got %v", got)
	}
}

// TestServiceQueue: poll/deliver/ack with origin, long-poll wakeup, at-least-once redelivery
// to a re-registered service after a crash before the ack.
func TestServiceQueue(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg := e.Service("", "bot")
	if got := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0}); got["action"] != "timeout" {
		t.Fatalf("empty poll: got %v, want timeout", got)
	}
	// A poll waiting when the message arrives is woken by it.
	bot.Send(reg, map[string]any{"action": "poll", "waitSecs": 60})
	id := anonSend(t, e, "bot", "hello")
	d := bot.RecvJSON(reg)
	if d["action"] != "deliver" || d["messageId"] != id || d["text"] != "hello" || d["fromName"] != "xmsg@testhost · tester" {
		t.Fatalf("deliver: got %v", d)
	}
	if o, _ := d["origin"].(map[string]any); o["kind"] != "anonymous" || len(o) != 1 {
		t.Fatalf("origin: got %v, want {kind: anonymous}", d["origin"])
	}
	if env, _ := d["envelope"].(string); !strings.HasPrefix(env, "[xmsg] from=xmsg@testhost · tester message_id="+id) || !strings.HasSuffix(env, "\n\nhello") {
		t.Fatalf("envelope: got %q", env)
	}
	// Crash before the ack: the message is delivered again to the next registration.
	bot.Kill()
	bot2, reg2 := e.Service("", "bot")
	d2 := bot2.Call(reg2, map[string]any{"action": "poll", "waitSecs": 5})
	if d2["action"] != "deliver" || d2["messageId"] != id {
		t.Fatalf("after crash: got %v, want redelivery of %s", d2, id)
	}
	// Unacked: the same message again, also on the same connection.
	if d3 := bot2.Call(reg2, map[string]any{"action": "poll", "waitSecs": 0}); d3["messageId"] != id {
		t.Fatalf("second poll before ack: got %v, want %s again", d3, id)
	}
	if got := bot2.Call(reg2, map[string]any{"action": "ack", "message_id": id}); got["status"] != "ok" {
		t.Fatalf("ack: got %v", got)
	}
	if got := bot2.Call(reg2, map[string]any{"action": "poll", "waitSecs": 0}); got["action"] != "timeout" {
		t.Fatalf("after ack: got %v, want timeout", got)
	}
	// Acking an unknown id is still ok and changes nothing.
	if got := bot2.Call(reg2, map[string]any{"action": "ack", "messageId": "nope"}); got["status"] != "ok" {
		t.Fatalf("ack unknown: got %v", got)
	}
}

// TestSessionRegistration: pi-like sessions get a fresh server-minted id; a claimed id is
// ignored; frames act only on the connection's own registration; closing ends it.
func TestSessionRegistration(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	p1, p2 := daemontest.Start(t, ""), daemontest.Start(t, "")
	c1, c2 := p1.Dial(e.RegPath), p2.Dial(e.RegPath)
	r1 := p1.Call(c1, map[string]any{"harness": "pi", "sessionName": "one", "sessionId": "pi:claimed", "cwd": "/w"})
	r2 := p2.Call(c2, map[string]any{"harness": "opencode", "session_name": "two"})
	id1, _ := r1["sessionId"].(string)
	id2, _ := r2["sessionId"].(string)
	if r1["status"] != "ok" || !strings.HasPrefix(id1, "pi:") || len(id1) != len("pi:")+36 || id1 == "pi:claimed" {
		t.Fatalf("pi registration: got %v, want a minted pi:<uuid>", r1)
	}
	if r2["status"] != "ok" || !strings.HasPrefix(id2, "opencode:") {
		t.Fatalf("opencode registration: got %v", r2)
	}
	m1 := anonSend(t, e, "one", "for one")
	m2 := anonSend(t, e, "two", "for two")
	// p2 cannot ack p1's message: the ack is scoped to p2's own registration.
	if got := p2.Call(c2, map[string]any{"action": "ack", "messageId": m1}); got["status"] != "ok" {
		t.Fatalf("foreign ack: got %v", got)
	}
	d := p1.Call(c1, map[string]any{"action": "poll", "waitSecs": 0})
	if d["messageId"] != m1 || d["text"] != "for one" {
		t.Fatalf("p1 poll after p2's foreign ack: got %v, want %s still queued", d, m1)
	}
	if _, has := d["origin"]; has {
		t.Fatalf("pi deliver carries origin: %v", d)
	}
	if d := p2.Call(c2, map[string]any{"action": "poll", "waitSecs": 0}); d["messageId"] != m2 {
		t.Fatalf("p2 poll: got %v, want %s", d, m2)
	}
	// reply is svc-only on register.sock.
	if got := p1.Call(c1, map[string]any{"action": "reply", "messageId": m1, "text": "x"}); got["detail"] != "unknown action: reply" {
		t.Fatalf("pi reply: got %v", got)
	}
	// Closing the connection ends the registration.
	p1.Close(c1)
	daemontest.WaitFor(t, "the registration to end", func() bool { return registrations(e.Bus) == 1 })
	if _, err := e.Bus.Resolve("one"); err == nil {
		t.Fatalf("closed registration still resolves")
	}
}

func TestLoopFrames(t *testing.T) {
	e := newEnv(t, daemontest.Options{Register: registersock.Config{MaxFrame: 2048}})
	bot, reg := e.Service("", "bot")
	for _, tc := range []struct{ frame, want string }{
		{`{"action":"dance"}`, `{"status":"error","error":"bad_request","detail":"unknown action: dance"}`},
		{`{nope`, `{"status":"error","error":"bad_request","detail":"invalid json"}`},
		{`{"action":"poll","waitSecs":"soon"}`, `{"status":"error","error":"bad_request","detail":"invalid json: field 'waitSecs' must be a number"}`},
		{`{"action":"poll","waitSecs":-5}`, `{"action":"timeout"}`},
		{`{"action":"reply","text":"x"}`, `{"status":"error","error":"bad_request","detail":"messageId and text are required"}`},
		{`{"action":"reply","messageId":"nope","text":"x"}`, `{"status":"error","error":"not_found","detail":"message 'nope' not found"}`},
	} {
		bot.Write(reg, []byte("\n"+tc.frame+"\n")) // the blank line is ignored
		if line, _ := bot.Recv(reg); line != tc.want {
			t.Fatalf("%s: got %q, want %q", tc.frame, line, tc.want)
		}
	}
	bot.Write(reg, []byte(`{"action":"`+strings.Repeat("x", 3000)+`"}`+"\n"))
	if line, _ := bot.Recv(reg); line != `{"status":"error","error":"payload_too_large","detail":"frame exceeds 2048 bytes"}` {
		t.Fatalf("oversized: got %q", line)
	}
	if line, eof := bot.Recv(reg); !eof {
		t.Fatalf("after oversized frame got %q, want closed", line)
	}
	daemontest.WaitFor(t, "the registration to end", func() bool { return registrations(e.Bus) == 0 })

	bot2, reg2 := e.Service("", "bot")
	bot2.Write(reg2, []byte("{\"action\":\"\xfe\"}\n"))
	if line, _ := bot2.Recv(reg2); line != `{"status":"error","error":"bad_request","detail":"frame is not valid UTF-8"}` {
		t.Fatalf("invalid UTF-8: got %q", line)
	}
	if line, eof := bot2.Recv(reg2); !eof {
		t.Fatalf("after invalid UTF-8 got %q, want closed", line)
	}
}

// TestServiceReply: a svc reply on register.sock to a local message is pushed (decisions
// table), and the answer names the pushed message.
func TestServiceReply(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg := e.Service("", "bot")
	session := daemontest.Start(t, "")
	inbox := e.Claude(session.PID, claudeID, "alice")
	sc := session.Dial(e.AgentPath)
	sent := session.Call(sc, map[string]any{"action": "send", "ref": "svc:bot", "text": "ping"})
	id := sent["delivery"].(map[string]any)["messageId"].(string)
	d := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 5})
	if o, _ := d["origin"].(map[string]any); o["kind"] != "local" || o["harness"] != "claude" || o["sessionId"] != claudeID {
		t.Fatalf("origin: got %v", d["origin"])
	}
	got := bot.Call(reg, map[string]any{"action": "reply", "messageId": id, "text": "pong"})
	pushed, _ := got["messageId"].(string)
	if got["status"] != "ok" || pushed == "" || pushed == id {
		t.Fatalf("reply: got %v, want ok with the pushed message id", got)
	}
	content := daemontest.InboxContent(t, inbox.Next(t))
	if want := "[xmsg] reply to message_id=" + id + " — message_id=" + pushed; !strings.Contains(content, want) || !strings.Contains(content, "pong") {
		t.Fatalf("inbox: got %q, want %q and the text", content, want)
	}
	replies, err := e.Bus.Replies(context.Background(), id, 0, 0)
	if err != nil || len(replies) != 1 || replies[0].PushOutcome.String() != "pushed" || replies[0].ReplierSessionID != "svc:bot" {
		t.Fatalf("stored reply: got %+v, %v", replies, err)
	}
	// Not the recipient of its own pushed reply.
	got = bot.Call(reg, map[string]any{"action": "reply", "messageId": pushed, "text": "x"})
	if got["status"] != "error" || !strings.Contains(got["detail"].(string), "is not recipient") {
		t.Fatalf("reply to a message for someone else: got %v", got)
	}
	// With no return address (anonymous sender) nothing is pushed: the original id comes back.
	anon := anonSend(t, e, "bot", "anon")
	if got := bot.Call(reg, map[string]any{"action": "reply", "messageId": anon, "text": "x"}); got["messageId"] != anon {
		t.Fatalf("reply without push: got %v, want messageId %s", got, anon)
	}
}

// TestPIDGuard: once the registered process has exited, its connection (inherited by a child)
// cannot poll, ack or reply, and is closed. A poll is checked when it is answered: "poll
// waiting" sends its message only after the heir's poll frame, so that whether the poll finds
// it at once or is woken by it, the answer is what the check stops.
func TestPIDGuard(t *testing.T) {
	for _, action := range []string{"poll", "poll waiting", "ack", "reply"} {
		t.Run(action, func(t *testing.T) {
			e := newEnv(t, daemontest.Options{})
			bot, reg := e.Service("", "bot")
			wait, id := 0, ""
			if action != "poll waiting" {
				id = anonSend(t, e, "bot", "secret")
			}
			heir := bot.Handoff(reg)
			if action == "poll waiting" {
				heir.Send(reg, map[string]any{"action": "poll", "waitSecs": 5})
				id = anonSend(t, e, "bot", "secret")
			} else {
				heir.Send(reg, map[string]any{"action": action, "waitSecs": wait, "messageId": id, "text": "x"})
			}
			if line, eof := heir.Recv(reg); !eof {
				t.Fatalf("%s by the heir of a dead registration: got %q, want closed", action, line)
			}
			if !strings.Contains(e.Logs.String(), "registered process exited or its pid was reused") {
				t.Fatalf("closing not logged")
			}
		})
	}
}

// TestFirstFrameFromHeir: a registration is made for the process that connected; when that
// process is gone by the first frame, nobody is registered and the connection is closed.
func TestFirstFrameFromHeir(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	p := daemontest.Start(t, "")
	c := p.Dial(e.RegPath)
	heir := p.Handoff(c)
	heir.Send(c, map[string]any{"harness": "pi", "sessionName": "stolen"})
	if line, eof := heir.Recv(c); !eof {
		t.Fatalf("registration by the heir: got %q, want the connection closed", line)
	}
	if n := registrations(e.Bus); n != 0 {
		t.Fatalf("registrations: got %d, want 0", n)
	}
	if !strings.Contains(e.Logs.String(), "peer process exited or its pid was reused") {
		t.Fatalf("refusal not logged")
	}
}

// TestPIDGuardDuringPoll: a poll that was waiting when the registered process exited hands
// nothing to the process that inherited the connection.
func TestPIDGuardDuringPoll(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg := e.Service("", "bot")
	bot.Send(reg, map[string]any{"action": "poll", "waitSecs": 60})
	heir := bot.Handoff(reg)
	anonSend(t, e, "svc:bot", "secret") // a service stays addressable by its id while away
	if line, eof := heir.Recv(reg); !eof {
		t.Fatalf("heir of a dead registration got %q, want the connection closed", line)
	}
}

// TestHangupEndsPoll: a client that hangs up during a long poll is noticed at once: the
// registration ends without waiting for the poll's 60 s.
func TestHangupEndsPoll(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	p := daemontest.Start(t, "")
	c := p.Dial(e.RegPath)
	if got := p.Call(c, map[string]any{"harness": "pi", "sessionName": "x"}); got["status"] != "ok" {
		t.Fatal(got)
	}
	p.Send(c, map[string]any{"action": "poll", "waitSecs": 60})
	p.Close(c)
	daemontest.WaitFor(t, "the connection to end", func() bool { return e.Register.Conns() == 0 })
}

// TestShutdown ends waiting polls and registrations; Serve returns net.ErrClosed.
func TestShutdown(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg := e.Service("", "bot")
	bot.Send(reg, map[string]any{"action": "poll", "waitSecs": 60})
	idle := daemontest.Dial(t, e.RegPath) // no first frame yet
	// Served, so that Shutdown must wake it (its first-frame deadline is beyond the bound).
	daemontest.WaitFor(t, "the idle connection to be served", func() bool { return e.Register.Conns() == 2 })
	ctx, cancel := context.WithTimeout(context.Background(), daemontest.Wait)
	defer cancel()
	if err := e.Register.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if line, eof := bot.Recv(reg); !eof {
		t.Fatalf("poll during shutdown: got %q, want closed", line)
	}
	if line, eof := idle.Recv(); !eof {
		t.Fatalf("idle connection: got %q, want closed", line)
	}
	if n := e.Register.Conns(); n != 0 {
		t.Fatalf("conns: got %d, want 0", n)
	}
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "r.sock"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Register.Serve(l); err != net.ErrClosed {
		t.Fatalf("Serve after Shutdown: got %v, want net.ErrClosed", err)
	}
}

// TestUngated: connections that did not come through the gate are closed unanswered.
func TestUngated(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "raw.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go e.Register.Serve(l)
	c := daemontest.Dial(t, l.Addr().String())
	c.C.Write([]byte(`{"action":"check"}` + "\n"))
	if line, eof := c.Recv(); !eof {
		t.Fatalf("got %q, want closed", line)
	}
}

// TestDeliverFrameBytes: a deliver frame carries the text as written, without HTML escaping
// (the original xmsg's bytes; encoding/json would write \u003c for '<').
func TestDeliverFrameBytes(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg := e.Service("", "bot")
	anonSend(t, e, "bot", "a<b>&c")
	bot.Send(reg, map[string]any{"action": "poll", "waitSecs": 0})
	line, _ := bot.Recv(reg)
	if !strings.Contains(line, `"text":"a<b>&c"`) || strings.Contains(line, `\u00`) {
		t.Fatalf("deliver %s: want the text unescaped, %q", line, `"text":"a<b>&c"`)
	}
}

// TestDeliverFrameShape pins the exact field names matrix-xmsg reads.
func TestDeliverFrameShape(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg := e.Service("", "bot")
	anonSend(t, e, "bot", "x")
	bot.Send(reg, map[string]any{"action": "poll"}) // default wait
	line, _ := bot.Recv(reg)
	var d map[string]json.RawMessage
	json.Unmarshal([]byte(line), &d)
	var keys []string
	for k := range d {
		keys = append(keys, k)
	}
	for _, k := range []string{"action", "messageId", "fromName", "text", "envelope", "origin"} {
		if _, ok := d[k]; !ok {
			t.Fatalf("deliver %s lacks %q", line, k)
		}
	}
	if len(d) != 6 {
		t.Fatalf("deliver has fields %v, want exactly 6", keys)
	}
}

// TestMaxConns: with the pending pool (MaxPending, which defaults to MaxConns) held by
// connections waiting for their first frame, the next one is served, and the oldest idle one
// is told it was closed to make room (an error frame), the eviction logged with the limit.
func TestMaxConns(t *testing.T) {
	check := `{"status":"ok","hasCredentials":false,"has_credentials":false}`
	tests := []struct {
		name        string
		cfg, served int
	}{
		{"default", 0, registersock.DefaultMaxConns},
		{"configured", 3, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "default" && registersock.DefaultMaxConns != 64 {
				t.Fatalf("DefaultMaxConns: got %d, want 64", registersock.DefaultMaxConns)
			}
			// Every connection is the test process's and sends no frame: the per-process and
			// the pending bounds are lifted to the cap under test.
			e := newEnv(t, daemontest.Options{Register: registersock.Config{MaxConns: tc.cfg, MaxPending: tc.served, MaxPerPID: tc.served + 1}})
			var held []*daemontest.Client
			for i := 0; i < tc.served; i++ {
				held = append(held, daemontest.Dial(t, e.RegPath))
				// One at a time, so that "oldest" is the first.
				daemontest.WaitFor(t, "the held connection to wait idle", func() bool { return e.Register.Idle() == i+1 })
			}
			extra := daemontest.Dial(t, e.RegPath)
			extra.Write([]byte(`{"action":"check"}` + "\n"))
			if line, _ := extra.Recv(); line != check {
				t.Fatalf("connection %d: got %q, want %q", tc.served+1, line, check)
			}
			line, _ := held[0].Recv()
			if !strings.Contains(line, `"error":"service_unavailable"`) || !strings.Contains(line, "to make room") {
				t.Fatalf("the oldest idle connection: got %q, want the eviction frame", line)
			}
			want := fmt.Sprintf("limit=%d", tc.served)
			var logged bool
			for _, l := range strings.Split(e.Logs.String(), "\n") {
				logged = logged || strings.Contains(l, "msg=refused") && strings.Contains(l, "socket=register") &&
					strings.Contains(l, "evicted to make room") && strings.Contains(l, want)
			}
			if !logged {
				t.Fatalf("eviction not logged with socket=register, reason and %s:\n%s", want, e.Logs.String())
			}
			held[1].Write([]byte(`{"action":"check"}` + "\n"))
			if line, _ := held[1].Recv(); line != check {
				t.Fatalf("a younger held connection: got %q, want %q", line, check)
			}
		})
	}
}

// TestPipelinedFrameAfterFatalOneEndsTheHandler: a frame read ahead of a fatal one (here
// invalid UTF-8, then a poll in the same write) must not leave the reader goroutine blocked:
// the connection slot and the registration are released.
func TestPipelinedFrameAfterFatalOneEndsTheHandler(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg := e.Service("", "bot")
	bot.Write(reg, []byte("{\"action\":\"\xff\"}\n{\"action\":\"poll\",\"waitSecs\":0}\n"))
	bot.Close(reg)
	daemontest.WaitFor(t, "the handler to end", func() bool { return e.Register.Conns() == 0 && registrations(e.Bus) == 0 })
}

// TestPipelinedPollThenHangup: a poll with a frame pipelined behind it, then a hang-up. The
// reader must still be reading (not blocked handing over the pipelined frame), so the hang-up
// ends the poll, frees the slot and ends the registration at once, not after the poll's 60 s.
func TestPipelinedPollThenHangup(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	p := daemontest.Start(t, "")
	c := p.Dial(e.RegPath)
	if got := p.Call(c, map[string]any{"harness": "pi", "sessionName": "x"}); got["status"] != "ok" {
		t.Fatal(got)
	}
	p.Write(c, []byte(`{"action":"poll","waitSecs":60}`+"\n"+`{"action":"ack","messageId":"m"}`+"\n"))
	daemontest.WaitFor(t, "the registration", func() bool { return registrations(e.Bus) == 1 })
	p.Close(c)
	daemontest.WaitFor(t, "the slot and the registration to be freed", func() bool {
		return e.Register.Conns() == 0 && registrations(e.Bus) == 0
	})
}

// TestTooManyPipelinedFrames: a client far ahead of its answers is cut off with one error.
func TestTooManyPipelinedFrames(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	p := daemontest.Start(t, "")
	c := p.Dial(e.RegPath)
	if got := p.Call(c, map[string]any{"harness": "pi", "sessionName": "x"}); got["status"] != "ok" {
		t.Fatal(got)
	}
	p.Write(c, []byte(strings.Repeat(`{"action":"poll","waitSecs":60}`+"\n", 40)))
	daemontest.WaitFor(t, "the connection to be cut off", func() bool { return e.Register.Conns() == 0 })
	if !strings.Contains(e.Logs.String(), "too many frames pipelined") {
		t.Fatalf("refusal not logged:\n%s", e.Logs.String())
	}
}

// TestUIDOnlyShare: uid-only registrations take at most MaxUIDOnly slots; a service still
// registers while they are all held, and a freed place is taken again.
func TestUIDOnlyShare(t *testing.T) {
	e := newEnv(t, daemontest.Options{Register: registersock.Config{MaxConns: 4, MaxUIDOnly: 2}})
	// One process each: a second registration by the same process takes its first one over.
	type held struct {
		p *daemontest.Puppet
		c int
	}
	var hs []held
	for i := range 2 {
		p := daemontest.Start(t, "")
		c := p.Dial(e.RegPath)
		if got := p.Call(c, map[string]any{"harness": "pi", "sessionName": fmt.Sprint("s", i)}); got["status"] != "ok" {
			t.Fatalf("pi %d: %v", i, got)
		}
		hs = append(hs, held{p, c})
	}
	p := daemontest.Start(t, "")
	c := p.Dial(e.RegPath)
	got := p.Call(c, map[string]any{"harness": "pi", "sessionName": "third"})
	if got["status"] != "error" || !strings.Contains(fmt.Sprint(got["detail"]), "too many pi registrations") {
		t.Fatalf("third pi: got %v, want refused", got)
	}
	// At the cap, a process that holds a place may still register again (a reconnect takes
	// its older registration over).
	again := hs[1].p.Dial(e.RegPath)
	if got := hs[1].p.Call(again, map[string]any{"harness": "pi", "sessionName": "s1"}); got["status"] != "ok" {
		t.Fatalf("a holder's reconnect at the cap: %v", got)
	}
	e.Service("", "bot") // fatal unless registered
	hs[0].p.Close(hs[0].c)
	daemontest.WaitFor(t, "a uid-only place to free", func() bool { return e.Register.UIDOnly() == 1 })
	c = p.Dial(e.RegPath)
	if got := p.Call(c, map[string]any{"harness": "pi", "sessionName": "again"}); got["status"] != "ok" {
		t.Fatalf("after a place freed: %v", got)
	}
}

// TestRegistrationIdleDeadline: after its first frame, a registration that sends only blank
// lines is closed when IdleTimeout runs out; one that polls is not.
func TestRegistrationIdleDeadline(t *testing.T) {
	e := newEnv(t, daemontest.Options{Register: registersock.Config{IdleTimeout: 300 * time.Millisecond}})
	// A uid-only registration from the test process itself, so that a write to the closed
	// connection fails without ending the test.
	idle := daemontest.Dial(t, e.RegPath)
	if got := idle.Call(map[string]any{"harness": "pi", "sessionName": "idle"}); got["status"] != "ok" {
		t.Fatal(got)
	}
	bot, reg := e.Service("", "bot")
	for i := 0; i < 500 && registrations(e.Bus) == 2; i++ {
		idle.C.Write([]byte("\n"))
		// The service polls for longer than the idle timeout: the poll's wait counts.
		if i%50 == 0 {
			if got := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 1}); got["action"] != "timeout" {
				t.Fatalf("poll: %v", got)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	daemontest.WaitFor(t, "the blank-line registration to end", func() bool { return registrations(e.Bus) == 1 })
	if got := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0}); got["action"] != "timeout" {
		t.Fatalf("the polling service was cut off: %v", got)
	}
}

// TestAckThatIsNotStoredIsAnError: an ack whose store write fails (here the store is closed;
// on a full disk it is ENOSPC) is answered with an error, never {"status":"ok"}: the message
// stays queued and comes again.
func TestAckThatIsNotStoredIsAnError(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg := e.Service("", "bot")
	id := anonSend(t, e, "svc:bot", "hello")
	if d := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0}); d["messageId"] != id {
		t.Fatalf("poll: %v", d)
	}
	e.Store.Close()
	if got := bot.Call(reg, map[string]any{"action": "ack", "messageId": id}); got["status"] != "error" {
		t.Fatalf("ack with the store gone: got %v, want an error", got)
	}
}

// TestLineSplitAcrossWaitingPoll: a frame whose first part arrives while a poll waits and whose
// rest arrives after the poll answered is one frame: whoever reads the connection during a
// waiting poll loses nothing of a partly read line. The ack's audit line is written (after its
// answer).
func TestLineSplitAcrossWaitingPoll(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg := e.Service("", "bot")
	bot.Send(reg, map[string]any{"action": "poll", "waitSecs": 60})
	// Not timing assertions: the pauses only make it likely that the poll waits, and that its
	// first part has been read, before the message arrives. Any interleaving must pass.
	time.Sleep(50 * time.Millisecond)
	bot.Write(reg, []byte(`{"action":"ack","mess`))
	time.Sleep(50 * time.Millisecond)
	id := anonSend(t, e, "svc:bot", "hello")
	line, eof := bot.Recv(reg)
	if eof || daemontest.DeliveredID(t, line) != id {
		t.Fatalf("poll: got %q (eof %v), want %s delivered", line, eof, id)
	}
	bot.Write(reg, []byte(`ageId":"`+id+`"}`+"\n"))
	if line, eof := bot.Recv(reg); eof || line != `{"status":"ok"}` {
		t.Fatalf("the split ack: got %q (eof %v), want ok", line, eof)
	}
	if got := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0}); got["action"] != "timeout" {
		t.Fatalf("poll after the ack: got %v, want timeout (acknowledged)", got)
	}
	// Written before the next frame was answered: the same goroutine writes it after the ack's.
	if logs := e.Logs.String(); !strings.Contains(logs, "request=ack message_id="+id) {
		t.Fatalf("the ack's audit line is missing:\n%s", logs)
	}
}

// TestFramesAfterWaitingPollInOrder: frames sent while a poll waits are answered after it, in
// order, and the loop then reads on from the connection.
func TestFramesAfterWaitingPollInOrder(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg := e.Service("", "bot")
	bot.Send(reg, map[string]any{"action": "poll", "waitSecs": 60})
	time.Sleep(50 * time.Millisecond) // likely waiting (not an assertion)
	bot.Write(reg, []byte(`{"action":"ack","messageId":"none"}`+"\n"+`{"action":"poll","waitSecs":0}`+"\n"))
	time.Sleep(50 * time.Millisecond)
	id := anonSend(t, e, "svc:bot", "hello")
	for i, want := range []string{"deliver", "ok", "deliver"} {
		got := bot.RecvJSON(reg)
		if got["action"] != want && got["status"] != want {
			t.Fatalf("answer %d: got %v, want %s", i, got, want)
		}
		if want == "deliver" && got["messageId"] != id {
			t.Fatalf("answer %d: got %v, want %s", i, got, id)
		}
	}
	if got := bot.Call(reg, map[string]any{"action": "ack", "messageId": id}); got["status"] != "ok" {
		t.Fatalf("ack: %v", got)
	}
	if got := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0}); got["action"] != "timeout" {
		t.Fatalf("poll after the ack: got %v, want timeout", got)
	}
}

// registrations is the count of live registrations on b.
func registrations(b *bus.Bus) int {
	c, _ := b.Counts()
	return c.Registrations
}
