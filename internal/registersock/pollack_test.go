package registersock_test

import (
	"os"
	"strings"
	"testing"

	"github.com/xmsg/xmsg/internal/daemontest"
)

// TestPollCarriesAck: a poll that carries the previous message's ack deletes it (it comes
// neither on the next poll nor after a reconnect) and is answered once, with the poll's own
// deliver or timeout; the ack's audit line is written.
func TestPollCarriesAck(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg := e.Service("", "bot")
	m1 := anonSend(t, e, "svc:bot", "one")
	m2 := anonSend(t, e, "svc:bot", "two")
	if d := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0}); d["messageId"] != m1 {
		t.Fatalf("first poll: got %v, want %s", d, m1)
	}
	if d := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0, "ack": m1}); d["action"] != "deliver" || d["messageId"] != m2 {
		t.Fatalf("poll with the ack of %s: got %v, want %s delivered", m1, d, m2)
	}
	// The next answer is the next frame's: no {"status":"ok"} for the ack came in between.
	if d := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0}); d["messageId"] != m2 {
		t.Fatalf("poll without an ack: got %v, want %s again (not acked)", d, m2)
	}
	daemontest.WaitFor(t, "the ack's audit line", func() bool {
		return strings.Contains(e.Logs.String(), "request=ack message_id="+m1)
	})
	// After a crash and a new registration: m1 stays acked, m2 comes again.
	bot.Kill()
	bot2, reg2 := e.Service("", "bot")
	if d := bot2.Call(reg2, map[string]any{"action": "poll", "waitSecs": 0}); d["messageId"] != m2 {
		t.Fatalf("after reconnect: got %v, want %s (and never the acked %s)", d, m2, m1)
	}
	if d := bot2.Call(reg2, map[string]any{"action": "poll", "waitSecs": 0, "ack": m2}); d["action"] != "timeout" {
		t.Fatalf("poll with the last ack: got %v, want timeout", d)
	}
	if d := bot2.Call(reg2, map[string]any{"action": "poll", "waitSecs": 0}); d["action"] != "timeout" {
		t.Fatalf("poll after the last ack: got %v, want timeout", d)
	}
}

// TestPollAckIsScoped: an ack carried by a poll acts on the connection's own registration
// only: another registration's message stays queued for it.
func TestPollAckIsScoped(t *testing.T) {
	e := newEnv(t, daemontest.Options{SvcExe: map[string]string{"bot": os.Args[0], "other": os.Args[0]}})
	bot, reg := e.Service("", "bot")
	other, oreg := e.Service("", "other")
	id := anonSend(t, e, "svc:other", "for other")
	if d := other.Call(oreg, map[string]any{"action": "poll", "waitSecs": 0}); d["messageId"] != id {
		t.Fatalf("other's poll: got %v, want %s", d, id)
	}
	if d := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0, "ack": id}); d["action"] != "timeout" {
		t.Fatalf("bot's poll acking other's message: got %v, want timeout", d)
	}
	if d := other.Call(oreg, map[string]any{"action": "poll", "waitSecs": 0}); d["messageId"] != id {
		t.Fatalf("other's poll after bot's ack: got %v, want %s still queued", d, id)
	}
}

// TestPollAckFromHeir: a poll with an ack sent by the heir of a dead registration is closed
// unanswered before the ack acts, as an ack frame is: the message is delivered again to the
// service's next registration.
func TestPollAckFromHeir(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg, id := handedOne(t, e, "secret")
	heir := bot.Handoff(reg)
	heir.Send(reg, map[string]any{"action": "poll", "waitSecs": 0, "ack": id})
	if line, eof := heir.Recv(reg); !eof {
		t.Fatalf("poll with an ack by the heir of a dead registration: got %q, want closed", line)
	}
	bot2, reg2 := e.Service("", "bot")
	if d := bot2.Call(reg2, map[string]any{"action": "poll", "waitSecs": 0}); d["messageId"] != id {
		t.Fatalf("next registration's poll: got %v, want %s (the heir's ack must not act)", d, id)
	}
	if strings.Contains(e.Logs.String(), "request=ack message_id="+id) {
		t.Fatalf("the heir's ack was audited")
	}
}

// TestPollAckAuditBeforeWait: when the poll that carries an ack has to wait, the ack's audit
// line is written before the wait, not held until a message or the wait's end.
func TestPollAckAuditBeforeWait(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	// The poll waits 60 s for a message that only comes once the line is seen.
	bot, reg := ackedWaiting(t, e)
	next := anonSend(t, e, "svc:bot", "two")
	if d := bot.RecvJSON(reg); d["messageId"] != next {
		t.Fatalf("the waiting poll: got %v, want %s", d, next)
	}
}

// TestPollAckRefusals: an ack of the wrong type or empty, or on a frame other than a poll, is a
// bad_request that acts on nothing; the loop goes on.
func TestPollAckRefusals(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg, id := handedOne(t, e, "one")
	for _, tc := range []struct{ frame, want string }{
		{`{"action":"poll","waitSecs":0,"ack":5}`, `{"status":"error","error":"bad_request","detail":"invalid json: field 'ack' must be a string"}`},
		{`{"action":"poll","waitSecs":0,"ack":""}`, `{"status":"error","error":"bad_request","detail":"invalid json: field 'ack' must not be empty"}`},
		{`{"action":"poll","waitSecs":0,"ack":{"id":"` + id + `"}}`, `{"status":"error","error":"bad_request","detail":"invalid json: field 'ack' must be a string"}`},
		{`{"action":"ack","messageId":"` + id + `","ack":"` + id + `"}`, `{"status":"error","error":"bad_request","detail":"ack is only for poll"}`},
		{`{"action":"reply","messageId":"` + id + `","text":"x","ack":"` + id + `"}`, `{"status":"error","error":"bad_request","detail":"ack is only for poll"}`},
	} {
		bot.Write(reg, []byte(tc.frame+"\n"))
		if line, _ := bot.Recv(reg); line != tc.want {
			t.Fatalf("%s: got %q, want %q", tc.frame, line, tc.want)
		}
	}
	// None of them acked: the message is still there.
	if d := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0, "ack": "not-this-one"}); d["messageId"] != id {
		t.Fatalf("poll after the refusals: got %v, want %s still queued", d, id)
	}
}

// TestPollAckNotStored: a poll whose ack cannot be stored is answered with the ack's error, and
// nothing is polled: the client must not take a deliver for its ack's success.
func TestPollAckNotStored(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot, reg := e.Service("", "bot")
	id := anonSend(t, e, "svc:bot", "one")
	anonSend(t, e, "svc:bot", "two")
	if d := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0}); d["messageId"] != id {
		t.Fatalf("poll: got %v, want %s", d, id)
	}
	e.Store.Close()
	if got := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0, "ack": id}); got["status"] != "error" || got["action"] != nil {
		t.Fatalf("poll with an ack and the store gone: got %v, want the ack's error and no poll", got)
	}
}

// TestPollAckWaitChecksAgain: a poll that carries an ack has its process checked before the
// ack, and, when it waited, again when it is answered: a process that exited during the wait
// hands nothing to the heir of its connection. Mutant tried: the check before the ack
// standing for the answer's after a wait too: red.
func TestPollAckWaitChecksAgain(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	// The ack is done (its line written before the wait) while the process lived.
	bot, reg := ackedWaiting(t, e)
	heir := bot.Handoff(reg)
	anonSend(t, e, "svc:bot", "secret")
	if line, eof := heir.Recv(reg); !eof {
		t.Fatalf("heir of a registration that died during its poll's wait got %q, want the connection closed", line)
	}
}

// ackedWaiting is handedOne's message acked by a poll that then waits (60 s): it returns
// once the ack's audit line is written, with the poll still waiting.
func ackedWaiting(t *testing.T, e *daemontest.Env) (*daemontest.Puppet, int) {
	t.Helper()
	bot, reg, id := handedOne(t, e, "one")
	bot.Send(reg, map[string]any{"action": "poll", "waitSecs": 60, "ack": id})
	daemontest.WaitFor(t, "the ack's audit line while the poll waits", func() bool {
		return strings.Contains(e.Logs.String(), "request=ack message_id="+id)
	})
	return bot, reg
}

// handedOne registers svc:bot, sends it text and polls it once: the service holds that
// message, not acked yet.
func handedOne(t *testing.T, e *daemontest.Env, text string) (*daemontest.Puppet, int, string) {
	t.Helper()
	bot, reg := e.Service("", "bot")
	id := anonSend(t, e, "svc:bot", text)
	if d := bot.Call(reg, map[string]any{"action": "poll", "waitSecs": 0}); d["messageId"] != id {
		t.Fatalf("poll: got %v, want %s", d, id)
	}
	return bot, reg, id
}

// TestRegistrationAnnouncesPollAck: the answer to a registration that goes on to the poll
// loop (a service, a uid-admitted session) says the daemon carries out an ack on a poll, so
// that a client need not find out by a message coming again, and how large a batch a poll may
// ask for. Mutant tried: the field left out (red).
func TestRegistrationAnnouncesPollAck(t *testing.T) {
	e := newEnv(t, daemontest.Options{})
	bot := daemontest.Start(t, "")
	if got := bot.Call(bot.Dial(e.RegPath), map[string]any{"harness": "svc", "name": "bot"}); got["status"] != "ok" || got["pollAck"] != true || got["pollBatch"] != 64.0 {
		t.Errorf("service registration: got %v, want ok with pollAck true and pollBatch 64", got)
	}
	pi := daemontest.Start(t, "")
	if got := pi.Call(pi.Dial(e.RegPath), map[string]any{"harness": "pi", "sessionName": "one", "cwd": "/w"}); got["status"] != "ok" || got["pollAck"] != true || got["pollBatch"] != 64.0 {
		t.Errorf("session registration: got %v, want ok with pollAck true and pollBatch 64", got)
	}
}
