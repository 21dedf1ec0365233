package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/daemontest"
)

// TestPiBridgeKeepsItsIdentity runs the real daemon with a real child process that speaks the
// Pi bridge's frames (register, poll, ack on register.sock; reply on agent.sock). Across a
// daemon restart and a reconnect that leaves the old connection open after a failed delivery,
// the session keeps one id: nothing queued is lost, its name never turns ambiguous, and its
// late reply to a message received before the restart is accepted.
func TestPiBridgeKeepsItsIdentity(t *testing.T) {
	d := newDaemon(t)
	pi := daemontest.Start(t, "")
	register := func() (int, string) {
		t.Helper()
		c := pi.Dial(d.sock("register"))
		r := pi.Call(c, map[string]any{"harness": "pi", "sessionName": "bridge", "cwd": "/work"})
		id, _ := r["sessionId"].(string)
		if r["status"] != "ok" || !strings.HasPrefix(id, "pi:") {
			t.Fatalf("register: got %v", r)
		}
		return c, id
	}
	send := func(text string) string {
		t.Helper()
		status, v := d.do("POST", "/v1/sessions/bridge/messages", `{"from":"tester","text":"`+text+`"}`)
		if status != 202 {
			t.Fatalf("send %s: %d %v", text, status, v)
		}
		return field(v, "messageId").(string)
	}
	poll := func(c int) string {
		t.Helper()
		pi.Send(c, map[string]any{"action": "poll", "waitSecs": 5})
		line, eof := pi.Recv(c)
		if eof {
			t.Fatal("poll: connection closed")
		}
		return daemontest.DeliveredID(t, line)
	}
	c1, id := register()
	m1 := send("before-restart")
	if got := poll(c1); got != m1 {
		t.Fatalf("poll: got %s, want %s", got, m1)
	}
	pi.Call(c1, map[string]any{"action": "ack", "messageId": m1})

	d.stop()
	d.start()
	if _, eof := pi.Recv(c1); !eof {
		t.Fatal("the old daemon's connection is still open")
	}
	// Between the restart and the re-registration the id still takes messages: the process
	// lives, and its queue is durable.
	status, v := d.do("POST", "/v1/sessions/"+id+"/messages", `{"from":"tester","text":"while-away"}`)
	if status != 202 || field(v, "sessionId") != id {
		t.Fatalf("send to the id before it re-registered: %d %v", status, v)
	}
	away := field(v, "messageId").(string)
	c2, id2 := register()
	if id2 != id {
		t.Fatalf("after the restart: id %s, want %s", id2, id)
	}
	if got := poll(c2); got != away {
		t.Fatalf("poll after re-registering: got %s, want %s", got, away)
	}
	pi.Call(c2, map[string]any{"action": "ack", "messageId": away})
	// The late reply to m1, received before the restart, is the recipient's.
	ag := pi.Dial(d.sock("agent"))
	if got := pi.Call(ag, map[string]any{"action": "reply", "messageId": m1, "text": "late answer"}); got["status"] != "ok" {
		t.Fatalf("late reply: got %v", got)
	}
	// One delivery fails in the host: no ack, and the bridge reconnects, old connection open.
	m2 := send("failed-once")
	if got := poll(c2); got != m2 {
		t.Fatalf("poll: got %s, want %s", got, m2)
	}
	c3, id3 := register()
	if id3 != id {
		t.Fatalf("reconnect: id %s, want %s", id3, id)
	}
	if _, eof := pi.Recv(c2); !eof {
		t.Fatal("the replaced connection is still open")
	}
	status, v = d.do("GET", "/v1/sessions/bridge", "")
	if status != 200 || field(v, "sessionId") != id {
		t.Fatalf("GET bridge: %d %v, want the one session %s", status, v, id)
	}
	if got := poll(c3); got != m2 {
		t.Fatalf("poll on the new connection: got %s, want the un-acked %s", got, m2)
	}
	pi.Call(c3, map[string]any{"action": "ack", "messageId": m2})
	pi.Send(c3, map[string]any{"action": "poll", "waitSecs": 0})
	if line, _ := pi.Recv(c3); !strings.Contains(line, `"timeout"`) {
		t.Fatalf("after the acks: got %q, want timeout", line)
	}
	// The reply is stored under the session's one id.
	status, v = d.do("GET", "/v1/messages/"+m1, "")
	raw, _ := json.Marshal(v)
	if status != 200 || !strings.Contains(string(raw), `"replierSessionId":"`+id+`"`) {
		t.Fatalf("GET m1: %d %s", status, raw)
	}
	_, list := d.do("GET", "/v1/sessions", "")
	n := 0
	for _, s := range list.([]any) {
		if field(s, "harness") == "pi" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("pi sessions listed: %d, want 1", n)
	}
}
