package registersock_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/daemontest"
)

// TestSessionTakeover: a uid-admitted session keeps its id for the life of its process. A
// second registration by the same process (the client reconnected while its old connection
// stayed open) gets the same id and takes over: the old connection ends, the message it was
// handed but did not ack comes again on the new one, the name stays unambiguous, and the
// reply to a message delivered on the old connection is accepted. Another process never gets
// the id.
func TestSessionTakeover(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	p := daemontest.Start(t, "")
	old := p.Dial(e.RegPath)
	r := p.Call(old, map[string]any{"harness": "pi", "sessionName": "bridge", "cwd": "/w"})
	id, _ := r["sessionId"].(string)
	if r["status"] != "ok" || !strings.HasPrefix(id, "pi:") {
		t.Fatalf("register: got %v", r)
	}
	m1 := anonSend(t, e, "bridge", "first")
	if got := daemontest.DeliveredID(t, mustLine(t, p, old, map[string]any{"action": "poll", "waitSecs": 0})); got != m1 {
		t.Fatalf("poll on the old connection: got %s, want %s", got, m1)
	}
	// Not acked: the host failed to take it. The client registers again, old conn still open.
	cur := p.Dial(e.RegPath)
	if r := p.Call(cur, map[string]any{"harness": "pi", "sessionName": "bridge", "cwd": "/w"}); r["status"] != "ok" || r["sessionId"] != id {
		t.Fatalf("re-registration by the same process: got %v, want ok %s", r, id)
	}
	if line, eof := p.Recv(old); !eof {
		t.Fatalf("old connection after the takeover: got %q, want it closed", line)
	}
	if got := daemontest.DeliveredID(t, mustLine(t, p, cur, map[string]any{"action": "poll", "waitSecs": 0})); got != m1 {
		t.Fatalf("poll on the new connection: got %s, want the un-acked %s again", got, m1)
	}
	if got := p.Call(cur, map[string]any{"action": "ack", "messageId": m1}); got["status"] != "ok" {
		t.Fatalf("ack: %v", got)
	}
	if tg, err := e.Bus.Resolve("bridge"); err != nil || tg.SessionID != id {
		t.Fatalf("Resolve(bridge) = %v, %v; want %s (one session, not ambiguous)", tg.SessionID, err, id)
	}
	if n := registrations(e.Bus); n != 1 {
		t.Fatalf("registrations: %d, want 1", n)
	}
	// Reply rights follow the id: the process replies over agent.sock to m1.
	ag := p.Dial(e.AgentPath)
	if got := p.Call(ag, map[string]any{"action": "reply", "messageId": m1, "text": "late"}); got["status"] != "ok" {
		t.Fatalf("reply after the takeover: got %v", got)
	}
	// A different process registering under the same name gets its own id.
	q := daemontest.Start(t, "")
	qc := q.Dial(e.RegPath)
	if r := q.Call(qc, map[string]any{"harness": "pi", "sessionName": "other"}); r["status"] != "ok" || r["sessionId"] == id {
		t.Fatalf("another process: got %v, want a fresh id", r)
	}
	// ... and may not reply to the first session's message; the detail names each id once.
	qa := q.Dial(e.AgentPath)
	got := q.Call(qa, map[string]any{"action": "reply", "messageId": m1, "text": "steal"})
	if got["error"] != "not_recipient" || strings.Contains(got["detail"].(string), "pi:pi:") ||
		!strings.Contains(got["detail"].(string), fmt.Sprintf("(expected '%s')", id)) {
		t.Fatalf("foreign reply: got %v", got)
	}
	// The current connection is unaffected by the other process.
	if got := p.Call(cur, map[string]any{"action": "poll", "waitSecs": 0}); got["action"] != "timeout" {
		t.Fatalf("poll after ack: got %v, want timeout", got)
	}
}

func mustLine(t *testing.T, p *daemontest.Puppet, conn int, v any) string {
	t.Helper()
	p.Send(conn, v)
	line, eof := p.Recv(conn)
	if eof {
		t.Fatal("connection closed, want a line")
	}
	return line
}
