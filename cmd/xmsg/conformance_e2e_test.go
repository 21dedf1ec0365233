//go:build linux

package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/daemontest"
	"github.com/xmsg/xmsg/internal/fed/fedtest"
	"github.com/xmsg/xmsg/internal/peercred"
)

// The conformance matrix: every harness × every way in × online/offline recipient, against
// one real daemon (this binary as `xmsg serve`), with real processes on every side: fake
// Claude sessions with real inboxes, Codex and Antigravity processes holding real flocks,
// uid-admitted sessions and services polling register.sock, a fake agentapi, and federation
// inbound over real mTLS on loopback. Each row checks the answer (outcome or refusal code),
// that the recipient gets the message exactly once once it acknowledged it (a queue that
// hands it out again after the ack, or a second inbox line or agentapi run, is red), what
// GET /v1/messages/{id} says afterwards, and the send's audit line.
//
// The way "leaf" is a leaf's pull: a send on the hub's http.sock to <ref>@leaf1, queued in
// leaf1's mailbox, and a second real daemon, the leaf (`xmsg serve --leaf`, principal
// svc:bot, same uid), pulling it over mTLS on loopback (no namespaces: the leaf end-to-end
// tests need those for their network faults, a row does not). Its recipients are the leaf's
// (leafRecipients): its one service, and a ref of every other harness, which no leaf hosts
// (docs/protocol.md §7.5, §8.3). Its rows check, besides the hub's answer and record, the
// leaf's side: its record, its pull's audit line, and when it acked the hub.

// answer is what a way in answered, in one shape for all of them.
type answer struct {
	code      string // refusal code; "" when accepted
	outcome   string
	messageID string
	sessionID string
}

// way is one way a message enters the daemon.
type way struct {
	name string
	send func(t *testing.T, ref, text string) answer
}

// recipient is a harness's session in one state, made fresh for one row.
type recipient struct {
	ref string
	// wantCode is the refusal per way ("" = accepted); agent.sock words some codes its own
	// way (docs/protocol.md §4.1: a gone session is not_found there).
	wantCode   map[string]string
	wantAnswer string // the outcome answered
	wantStored string // GET /v1/messages/{id} afterwards
	// wantHarness is GET's recipientHarness when it is not the row's harness (on the hub, a
	// send to a leaf is "fed").
	wantHarness string
	// receive checks that the message reached the recipient exactly once after its ack.
	receive func(t *testing.T, id string)
}

type matrix struct {
	d        *daemon
	hc       *http.Client // one client for the whole matrix, so its connections are reused
	agyExe   string
	botExe   string
	codexExe string
	home     *codexHome
	presence string
	apiLog   string
	fedAddr  string
	fedPeer  *http.Client
	leaf     *daemon      // the leaf daemon pulling from the hub (m.d) as peer leaf1
	leafHC   *http.Client // on the leaf's http.sock
}

func (m *matrix) lock(conv string) string { return filepath.Join(m.presence, conv+".lock") }

// pollOnce polls conn (register.sock frames, or agent.sock frames with meta), expects id,
// acks it and checks that the queue is then empty.
func pollOnce(t *testing.T, p *daemontest.Puppet, conn int, id string, meta map[string]any) {
	t.Helper()
	frame := func(v map[string]any) map[string]any {
		if meta != nil {
			v["_meta"] = meta
		}
		return v
	}
	got := p.Call(conn, frame(map[string]any{"action": "poll", "waitSecs": 10}))
	if got["action"] != "deliver" || got["messageId"] != id {
		t.Fatalf("poll: got %v, want deliver %s", got, id)
	}
	if r := p.Call(conn, frame(map[string]any{"action": "ack", "messageId": id})); r["status"] != "ok" {
		t.Fatalf("ack: %v", r)
	}
	if again := p.Call(conn, frame(map[string]any{"action": "poll", "waitSecs": 0})); again["action"] != "timeout" {
		t.Fatalf("poll after ack: got %v, want timeout (delivered once)", again)
	}
}

// agentapiRuns counts the fake agentapi's runs for message id.
func (m *matrix) agentapiRuns(t *testing.T, id string) int {
	n := 0
	for _, c := range agentapiCalls(t, m.apiLog) {
		if len(c.Argv) == 6 && strings.Contains(c.Argv[5], "message_id="+id) {
			n++
		}
	}
	return n
}

// agyOnce waits for agentapi to have run for id and checks that it ran once.
func (m *matrix) agyOnce(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(daemontest.Wait)
	for m.agentapiRuns(t, id) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("agentapi never ran for %s", id)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := m.agentapiRuns(t, id); n != 1 {
		t.Fatalf("agentapi ran %d times for %s, want once", n, id)
	}
}

// agy starts an agy process present in a fresh conversation (mcp_start done) and returns it
// with its session id and conversation.
func (m *matrix) agy(t *testing.T) (p *daemontest.Puppet, sessionID, conv string) {
	t.Helper()
	conv = uuid.NewString()
	p = daemontest.StartNestedExe(t, m.agyExe, daemontest.LockEnv+"="+m.lock(conv))
	start, err := peercred.Proc{}.StartTime(p.PID)
	if err != nil {
		t.Fatal(err)
	}
	sessionID = fmt.Sprintf("agy:%d:%s", p.PID, start)
	if r := p.Call(p.Dial(m.d.sock("agent")), map[string]any{"action": "mcp_start"}); r["status"] != "ok" || r["sessionId"] != sessionID {
		t.Fatalf("mcp_start: %v, want %s", r, sessionID)
	}
	return p, sessionID, conv
}

// agyCredentials sends conv's credential frame from below p and waits until the daemon closes
// the connection, which it does once the conversation's queue is flushed (docs/protocol.md §4.2).
func agyCredentials(t *testing.T, p *daemontest.Puppet, sock, conv string) {
	t.Helper()
	c := p.Dial(sock)
	r := p.Call(c, map[string]any{"conversation_id": conv, "ls_address": "127.0.0.1:9", "csrf_token": "tok-" + conv[:8]})
	if r["status"] != "ok" {
		t.Fatalf("credential frame: %v", r)
	}
	if line, eof := p.Recv(c); !eof {
		t.Fatalf("after the credential frame: %q, want the connection closed after the flush", line)
	}
}

// register registers p on register.sock as harness (name for services) and returns the
// connection and the session id.
func register(t *testing.T, p *daemontest.Puppet, sock, harness, name string) (int, string) {
	t.Helper()
	c := p.Dial(sock)
	frame := map[string]any{"harness": harness, "sessionName": name}
	if harness == "svc" {
		frame = map[string]any{"harness": "svc", "name": name}
	}
	r := p.Call(c, frame)
	if r["status"] != "ok" {
		t.Fatalf("register %s %s: %v", harness, name, r)
	}
	return c, r["sessionId"].(string)
}

// recipients are the harnesses' sessions: name → state → a fresh recipient for way w.
func (m *matrix) recipients() map[string]map[string]func(t *testing.T, w string) recipient {
	d := m.d
	uidAdmitted := func(harness string) map[string]func(t *testing.T, w string) recipient {
		return map[string]func(t *testing.T, w string) recipient{
			"online": func(t *testing.T, w string) recipient {
				p := daemontest.Start(t, "")
				c, id := register(t, p, d.sock("register"), harness, harness+"-"+w)
				return recipient{ref: id, wantAnswer: "delivered", wantStored: "delivered",
					receive: func(t *testing.T, msg string) { pollOnce(t, p, c, msg, nil) }}
			},
			// Registered once, then its connection closed: the process lives, so its id stays
			// addressable and its queue durable until it registers again.
			"offline": func(t *testing.T, w string) recipient {
				p := daemontest.Start(t, "")
				c, id := register(t, p, d.sock("register"), harness, harness+"-"+w)
				p.Close(c)
				daemontest.WaitFor(t, "the registration to end with its connection", func() bool {
					_, v := m.do(t, "GET", "/v1/sessions", "")
					return !strings.Contains(fmt.Sprint(v), id)
				})
				// Nobody has it until it registers again: queued, then delivered.
				return recipient{ref: id, wantAnswer: "queued", wantStored: "delivered", receive: func(t *testing.T, msg string) {
					c, again := register(t, p, d.sock("register"), harness, harness+"-"+w)
					if again != id {
						t.Fatalf("re-registered as %s, want %s", again, id)
					}
					pollOnce(t, p, c, msg, nil)
				}}
			},
		}
	}
	return map[string]map[string]func(t *testing.T, w string) recipient{
		"claude": {
			"online": func(t *testing.T, w string) recipient {
				s := startClaude(t, d.sess, uuid.NewString(), "cl-"+w, "/")
				return recipient{ref: "claude:" + s.id, wantAnswer: "delivered", wantStored: "delivered", receive: func(t *testing.T, msg string) {
					lines := s.waitLines(t, 1)
					if n := strings.Count(strings.Join(lines, "\n"), "message_id="+msg); n != 1 {
						t.Fatalf("inbox holds %s %d times, want once: %q", msg, n, lines)
					}
				}}
			},
			// Its process exited, its session file stays: gone, nothing stored for it.
			"offline": func(t *testing.T, w string) recipient {
				s := startClaude(t, d.sess, uuid.NewString(), "clx-"+w, "/")
				s.Exit()
				return recipient{ref: "claude:" + s.id, wantCode: map[string]string{"http": "gone", "fed": "gone", "agent": "not_found", "svc": "not_found"}}
			},
		},
		"codex": {
			"online": func(t *testing.T, w string) recipient {
				thread := uuid.NewString()
				cx := codexProcess(t, m.codexExe, m.home.lock(thread), m.home.rollout(thread, thread))
				meta := map[string]any{"sessionId": thread, "threadId": thread}
				c := cx.Dial(d.sock("agent"))
				// The first attested frame makes the lease.
				if r := cx.Call(c, map[string]any{"action": "poll", "waitSecs": 0, "_meta": meta}); r["action"] != "timeout" {
					t.Fatalf("codex poll: %v", r)
				}
				return recipient{ref: "codex:" + thread, wantAnswer: "delivered", wantStored: "delivered",
					receive: func(t *testing.T, msg string) { pollOnce(t, cx, c, msg, meta) }}
			},
			// A thread whose writer lock is gone has no lease: not found.
			"offline": func(t *testing.T, w string) recipient {
				return recipient{ref: "codex:" + uuid.NewString(), wantCode: map[string]string{"http": "not_found", "fed": "not_found", "agent": "not_found", "svc": "not_found"}}
			},
		},
		"agy": {
			"online": func(t *testing.T, w string) recipient {
				p, id, conv := m.agy(t)
				agyCredentials(t, p, d.sock("register"), conv)
				return recipient{ref: id, wantAnswer: "delivered", wantStored: "delivered", receive: m.agyOnce}
			},
			// Present, without credentials: queued for the conversation; the credential
			// frame flushes it, after which the message reads delivered.
			"offline": func(t *testing.T, w string) recipient {
				p, id, conv := m.agy(t)
				return recipient{ref: id, wantAnswer: "queued", wantStored: "delivered", receive: func(t *testing.T, msg string) {
					if n := m.agentapiRuns(t, msg); n != 0 {
						t.Fatalf("agentapi ran %d times before credentials", n)
					}
					agyCredentials(t, p, d.sock("register"), conv)
					m.agyOnce(t, msg)
				}}
			},
		},
		"pi":       uidAdmitted("pi"),
		"opencode": uidAdmitted("opencode"),
		"hermes":   uidAdmitted("hermes"),
		"svc": {
			"online": func(t *testing.T, w string) recipient {
				p := daemontest.Start(t, m.botExe)
				c, id := register(t, p, d.sock("register"), "svc", "on-"+w)
				return recipient{ref: id, wantAnswer: "delivered", wantStored: "delivered",
					receive: func(t *testing.T, msg string) { pollOnce(t, p, c, msg, nil) }}
			},
			// Configured, not registered: its queue is durable; it gets the message when it
			// registers (queued until then, delivered after).
			"offline": func(t *testing.T, w string) recipient {
				return recipient{ref: "svc:off-" + w, wantAnswer: "queued", wantStored: "delivered", receive: func(t *testing.T, msg string) {
					p := daemontest.Start(t, m.botExe)
					c, _ := register(t, p, d.sock("register"), "svc", "off-"+w)
					pollOnce(t, p, c, msg, nil)
				}}
			},
		},
	}
}

// hubOutcome is GET /v1/messages/{id}'s outcome on the hub.
func (m *matrix) hubOutcome(t *testing.T, id string) string {
	t.Helper()
	_, v := m.do(t, "GET", "/v1/messages/"+id, "")
	return str(field(v, "outcome"))
}

// leafOnce checks the leaf service's delivery got of msg on p's connection c, acks it, and
// checks the rest of the way: the leaf holds its own record, delivered to svc:bot, pulled
// once (its audit line); before the service's ack the hub still says queued (the leaf acks
// the hub only after its service did: checked last before the ack, so that a leaf acking
// early has had the time of those round trips to show it); after it the hub says delivered
// (the leaf's next pull acked it, which the hub audits once), and nothing comes again.
func (m *matrix) leafOnce(t *testing.T, p *daemontest.Puppet, c int, got map[string]any, msg string) {
	t.Helper()
	if got["action"] != "deliver" || got["messageId"] != msg || jstr(got, "origin", "kind") != "fed" || jstr(got, "origin", "host") != "testhost" {
		t.Fatalf("leaf service poll: got %v, want deliver %s from the hub", got, msg)
	}
	status, v := doOn(t, m.leafHC, "GET", "/v1/messages/"+msg, "")
	if status != 200 || field(v, "outcome") != "delivered" || field(v, "recipientHarness") != "svc" || field(v, "sessionId") != "svc:bot" {
		t.Fatalf("GET /v1/messages/%s on the leaf: %d %v, want delivered to svc:bot", msg, status, v)
	}
	// The pull loop writes its audit line once the row's commit is done, which may come just
	// after the service has the row and a GET has waited for the record (docs/protocol.md §7.5).
	daemontest.WaitFor(t, "the leaf's audit line of the pull", func() bool { return auditLines(m.leaf.stderr.String(), "leaf", "pull", msg) > 0 })
	if n := auditLines(m.leaf.stderr.String(), "leaf", "pull", msg); n != 1 {
		t.Fatalf("the leaf audited %d pulls of %s, want 1:\n%s", n, msg, m.leaf.stderr)
	}
	if o := m.hubOutcome(t, msg); o != "queued" {
		t.Fatalf("before the leaf service's ack the hub says %q, want queued", o)
	}
	if r := p.Call(c, map[string]any{"action": "ack", "messageId": msg}); r["status"] != "ok" {
		t.Fatalf("ack: %v", r)
	}
	daemontest.WaitFor(t, "the hub to read delivered once the leaf acked", func() bool { return m.hubOutcome(t, msg) == "delivered" })
	if again := p.Call(c, map[string]any{"action": "poll", "waitSecs": 0}); again["action"] != "timeout" {
		t.Fatalf("poll after ack: got %v, want timeout (delivered once)", again)
	}
	daemontest.WaitFor(t, "the hub's audit line of the leaf's ack", func() bool { return auditLines(m.d.stderr.String(), "fed", "inbox_ack", msg) > 0 })
	if n := auditLines(m.d.stderr.String(), "fed", "inbox_ack", msg); n != 1 {
		t.Fatalf("the hub audited %d acks of %s, want 1", n, msg)
	}
}

// leafRejected checks what becomes of msg, a row whose `to` names another service than the
// leaf's: the leaf rejects it with its next pull (docs/protocol.md §8.3), so the hub reads
// not_found, not delivered (nobody received it); the leaf records nothing, and its service
// gets nothing. The leaf's warning about the drop is not checked per row: it is rate-limited
// (one line per 30 s per hub, the rest counted as `suppressed`).
func (m *matrix) leafRejected(t *testing.T, msg string) {
	t.Helper()
	daemontest.WaitFor(t, "the leaf's reject of the row (the hub's audit line)", func() bool { return auditLines(m.d.stderr.String(), "fed", "inbox_reject", msg) > 0 })
	if o := m.hubOutcome(t, msg); o != "not_found" {
		t.Fatalf("after the leaf rejected the row the hub says %q, want not_found", o)
	}
	if n := auditLines(m.d.stderr.String(), "fed", "inbox_ack", msg); n != 0 {
		t.Fatalf("the hub audited %d acks of the rejected %s", n, msg)
	}
	if status, v := doOn(t, m.leafHC, "GET", "/v1/messages/"+msg, ""); status != 404 {
		t.Fatalf("GET /v1/messages/%s on the leaf: %d %v, want 404 (it recorded nothing)", msg, status, v)
	}
	if n := auditLines(m.leaf.stderr.String(), "leaf", "pull", msg); n != 0 {
		t.Fatalf("the leaf audited %d pulls of %s into its service's queue, want none", n, msg)
	}
}

// leafRecipients are the recipients of the way "leaf": harness → state → a fresh recipient
// on the leaf. The leaf's one service (svc:bot) is the only recipient a leaf hosts: online,
// registered on the leaf's register socket and polling; offline, configured (the leaf
// principal) but not connected. Every other harness's ref is refused by the hub (leaf1 has
// no `targets`: the refusal is the hub's own rule, docs/protocol.md §8.4).
func (m *matrix) leafRecipients() map[string]map[string]func(t *testing.T, w string) recipient {
	reg := m.leaf.sock("register")
	// bot registers a fresh service process as svc:bot on the leaf.
	bot := func(t *testing.T) (*daemontest.Puppet, int) {
		p := daemontest.Start(t, "")
		c, id := register(t, p, reg, "svc", "bot")
		if id != "svc:bot" {
			t.Fatalf("leaf service registered as %s", id)
		}
		return p, c
	}
	poll := func(waitSecs int) map[string]any { return map[string]any{"action": "poll", "waitSecs": waitSecs} }
	// clean leaves the leaf as a row found it when the row fails: the leaf waits for its
	// service's ack of what it delivered before it pulls more, so what a failed row left
	// unacked would fail every row after it. Registered before the row's service, it runs
	// after that service is gone, with a fresh one that acks all that is left.
	clean := func(t *testing.T) {
		t.Cleanup(func() {
			if !t.Failed() {
				return
			}
			p, c := bot(t)
			for i := 0; i < 100; i++ {
				r := p.Call(c, poll(1))
				if r["action"] != "deliver" {
					return
				}
				p.Call(c, map[string]any{"action": "ack", "messageId": r["messageId"]})
			}
		})
	}
	// A leaf hosts its one service and no session: a ref of any other harness is refused by
	// the hub at send time (404 not_found), not queued to be dropped there. Online is a
	// session of that harness on the leaf's side that does not exist either way.
	other := func(ref func() string) map[string]func(t *testing.T, w string) recipient {
		refused := func(t *testing.T, w string) recipient {
			return recipient{ref: ref(), wantCode: map[string]string{"leaf": "not_found"}}
		}
		return map[string]func(t *testing.T, w string) recipient{"online": refused, "offline": refused}
	}
	id := func(harness string) func() string { return func() string { return harness + ":" + uuid.NewString() } }
	return map[string]map[string]func(t *testing.T, w string) recipient{
		"claude":   other(id("claude")),
		"codex":    other(id("codex")),
		"agy":      other(func() string { return fmt.Sprintf("agy:%d:%d", os.Getpid(), time.Now().UnixNano()) }),
		"pi":       other(id("pi")),
		"opencode": other(id("opencode")),
		"hermes":   other(id("hermes")),
		"svc": {
			"online": func(t *testing.T, w string) recipient {
				clean(t)
				p, c := bot(t)
				p.Send(c, poll(30))
				return recipient{ref: "svc:bot", wantAnswer: "queued", wantStored: "delivered", wantHarness: "fed",
					receive: func(t *testing.T, msg string) { m.leafOnce(t, p, c, p.RecvJSON(c), msg) }}
			},
			// The leaf pulls it into its service's durable queue (its record reads delivered
			// there at once, as a svc's on the hub does) and holds the hub's row, queued,
			// until the service registers, takes and acks it. This is the row that catches a
			// leaf acking the hub before its service did every time: the service is not even
			// running when the row is pulled (online, only a slow enough round trip shows it).
			"offline": func(t *testing.T, w string) recipient {
				clean(t)
				return recipient{ref: "svc:bot", wantAnswer: "queued", wantStored: "delivered", wantHarness: "fed", receive: func(t *testing.T, msg string) {
					daemontest.WaitFor(t, "the leaf to pull the row", func() bool { return auditLines(m.leaf.stderr.String(), "leaf", "pull", msg) > 0 })
					if status, v := doOn(t, m.leafHC, "GET", "/v1/messages/"+msg, ""); status != 200 || field(v, "outcome") != "delivered" {
						t.Fatalf("GET /v1/messages/%s on the leaf before its service registered: %d %v", msg, status, v)
					}
					p, c := bot(t)
					m.leafOnce(t, p, c, p.Call(c, poll(10)), msg)
				}}
			},
		},
	}
}

// leafSend sends text to ref on leaf1 from the hub's http.sock and returns the message id.
func (m *matrix) leafSend(t *testing.T, ref, text string) string {
	t.Helper()
	status, v := m.do(t, "POST", "/v1/sessions/"+ref+"@leaf1/messages", `{"from":"tester","text":"`+text+`"}`)
	if status != 202 || field(v, "outcome") != "queued" {
		t.Fatalf("send to %s@leaf1: %d %v, want 202 queued", ref, status, v)
	}
	return str(field(v, "messageId"))
}

// newLeafDaemon starts `xmsg serve --leaf` as leaf1 with principal svc:bot, pulling from the
// hub at hubAddr (pinned hubPin, peer name testhost) on loopback.
func newLeafDaemon(t *testing.T, cert *fedtest.Cert, hubAddr, hubPin string) *daemon {
	t.Helper()
	base := shortTemp(t)
	d := &daemon{t: t, rt: filepath.Join(base, "rt"), db: filepath.Join(base, "state", "xmsg.db")}
	if err := os.Mkdir(d.rt, 0o700); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"cert.pem": cert.CertPEM, "key.pem": cert.KeyPEM,
		"peers.json": peersJSON(map[string]map[string]any{"testhost": {"address": hubAddr, "pin": hubPin}})}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(base, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d.env = []string{"XDG_RUNTIME_DIR=" + d.rt, "HOME=" + base}
	d.args = []string{"serve", "--leaf", "--leaf-principal", "svc:bot", "--db-path", d.db, "--peers-file", filepath.Join(base, "peers.json"),
		"--fed-cert", filepath.Join(base, "cert.pem"), "--fed-key", filepath.Join(base, "key.pem"), "--fed-reload-interval-secs", "0",
		"--host-label", "leaf1"}
	d.start()
	t.Cleanup(d.stop)
	return d
}

// agentAnswer reads an agent.sock send answer.
func agentAnswer(r map[string]any) answer {
	if r["status"] != "ok" {
		return answer{code: str(r["error"])}
	}
	return answer{outcome: str(field(r["delivery"], "outcome")), messageID: str(field(r["delivery"], "messageId")),
		sessionID: str(field(r["delivery"], "sessionId"))}
}

func (m *matrix) ways(t *testing.T) []way {
	d := m.d
	sender := startClaude(t, d.sess, uuid.NewString(), "sender", "/")
	sc := sender.Dial(d.sock("agent"))
	svc := daemontest.Start(t, m.botExe)
	register(t, svc, d.sock("register"), "svc", "sender")
	svcAgent := svc.Dial(d.sock("agent"))
	httpSend := func(t *testing.T, ref, text string) answer {
		status, v := m.do(t, "POST", "/v1/sessions/"+ref+"/messages", `{"from":"tester","text":"`+text+`"}`)
		if status != 202 {
			return answer{code: str(field(v, "error"))}
		}
		return answer{outcome: str(field(v, "outcome")), messageID: str(field(v, "messageId")), sessionID: str(field(v, "sessionId"))}
	}
	return []way{
		{"http", httpSend},
		{"agent", func(t *testing.T, ref, text string) answer {
			return agentAnswer(sender.Call(sc, map[string]any{"action": "send", "ref": ref, "text": text}))
		}},
		{"svc", func(t *testing.T, ref, text string) answer {
			return agentAnswer(svc.Call(svcAgent, map[string]any{"action": "send", "ref": ref, "text": text}))
		}},
		{"fed", func(t *testing.T, ref, text string) answer {
			id := uuid.Must(uuid.NewV7()).String()
			env, _ := json.Marshal(map[string]any{"v": 2, "id": id, "to": map[string]any{"ref": ref}, "body": text, "push_replies": true,
				"thread_id": id, "created_at": time.Now().Unix(),
				"principal": map[string]any{"kind": "session", "harness": "claude", "session_id": "s-1", "name": "alice"}})
			resp, err := m.fedPeer.Post("https://"+m.fedAddr+"/fed/v2/messages", "application/json", bytes.NewReader(env))
			if err != nil {
				t.Fatalf("fed post: %v", err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			var v map[string]any
			json.Unmarshal(raw, &v)
			if resp.StatusCode != 202 {
				return answer{code: str(v["error"])}
			}
			return answer{outcome: str(v["outcome"]), messageID: str(v["messageId"]), sessionID: str(v["sessionId"])}
		}},
		// A leaf's pull: sent on the hub's http.sock to the leaf's ref; the hub queues it in
		// leaf1's mailbox, and the leaf daemon pulls it from there.
		{"leaf", func(t *testing.T, ref, text string) answer { return httpSend(t, ref+"@leaf1", text) }},
	}
}

// do is daemon.do on the matrix's one client, failing t (a row) rather than the daemon's test.
func (m *matrix) do(t *testing.T, method, path, body string) (int, any) {
	t.Helper()
	return doOn(t, m.hc, method, path, body)
}

// doOn is do on client hc (the hub's or the leaf's http.sock).
func doOn(t *testing.T, hc *http.Client, method, path, body string) (int, any) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://localhost"+path, strings.NewReader(body))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var v any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("%s %s: not JSON: %q", method, path, raw)
		}
	}
	return resp.StatusCode, v
}

// audited reports whether log holds the accepted-send line of message id from socket.
func audited(log, socket, id string) bool { return auditLines(log, socket, "send", id) > 0 }

// auditLines counts log's accepted lines of request on socket for message id.
func auditLines(log, socket, request, id string) int {
	n := 0
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "msg=accepted") && strings.Contains(l, "socket="+socket+" ") && strings.Contains(l, "request="+request+" ") &&
			strings.HasSuffix(l, "message_id="+id) {
			n++
		}
	}
	return n
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func newMatrix(t *testing.T) *matrix {
	base := shortTemp(t)
	m := &matrix{presence: filepath.Join(base, "presence"), apiLog: filepath.Join(base, "agentapi.log")}
	if err := os.Mkdir(m.presence, 0o700); err != nil {
		t.Fatal(err)
	}
	m.agyExe = daemontest.CopyExe(t, base, "agy")
	m.botExe = daemontest.CopyExe(t, base, "bot")
	m.codexExe = daemontest.CopyExe(t, base, "codex")
	m.home = newCodexHome(t, base)
	t.Setenv("XMSG_TEST_AGENTAPI_LOG", m.apiLog)
	self := fedtest.New(t, "testhost", nil, fedtest.Options{})
	peer := fedtest.New(t, "a", nil, fedtest.Options{})
	leafCert := fedtest.New(t, "leaf1", nil, fedtest.Options{})
	m.fedAddr = freePort(t)
	// leaf1 as the leaf tests configure it: no `targets`, so the hub queues any ref for it.
	files := map[string][]byte{"cert.pem": self.CertPEM, "key.pem": self.KeyPEM,
		"peers.json": peersJSON(map[string]map[string]any{"a": {"address": freePort(t), "pin": peer.Pin, "allow": []string{"send", "reply", "list"}},
			"leaf1": {"address": freePort(t), "pin": leafCert.Pin, "leaf": true, "allow": []string{"send", "reply"}}})}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(base, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--agy-exe", m.agyExe, "--agy-presence-dir", m.presence, "--codex-exe", m.codexExe, "--codex-home", m.home.dir,
		"--svc-exe", "sender=" + m.botExe, "--fed-listen", m.fedAddr, "--fed-cert", filepath.Join(base, "cert.pem"),
		"--fed-key", filepath.Join(base, "key.pem"), "--peers-file", filepath.Join(base, "peers.json")}
	for _, w := range []string{"http", "agent", "svc", "fed"} {
		args = append(args, "--svc-exe", "on-"+w+"="+m.botExe, "--svc-exe", "off-"+w+"="+m.botExe)
	}
	m.d = newDaemon(t, args...)
	m.hc = m.d.client()
	m.leaf = newLeafDaemon(t, leafCert, m.fedAddr, self.Pin)
	m.leafHC = m.leaf.client()
	pair, err := tls.X509KeyPair(peer.CertPEM, peer.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	m.fedPeer = &http.Client{Timeout: daemontest.Wait, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}}}
	return m
}

func TestConformance(t *testing.T) {
	m := newMatrix(t)
	ways := m.ways(t)
	recipients, leafRecipients := m.recipients(), m.leafRecipients()
	for _, harness := range []string{"claude", "codex", "agy", "pi", "opencode", "hermes", "svc"} {
		for _, state := range []string{"online", "offline"} {
			for _, w := range ways {
				t.Run(harness+"/"+state+"/"+w.name, func(t *testing.T) {
					mk := recipients[harness][state]
					if w.name == "leaf" {
						mk = leafRecipients[harness][state]
					}
					r := mk(t, w.name)
					text := "to " + harness + " " + state + " by " + w.name
					got := w.send(t, r.ref, text)
					if want := r.wantCode[w.name]; want != "" {
						if got.code != want {
							t.Fatalf("send to %s: got %+v, want refusal %s", r.ref, got, want)
						}
						return
					}
					if got.code != "" || got.outcome != r.wantAnswer || got.messageID == "" {
						t.Fatalf("send to %s: got %+v, want outcome %s", r.ref, got, r.wantAnswer)
					}
					r.receive(t, got.messageID)
					status, v := m.do(t, "GET", "/v1/messages/"+got.messageID, "")
					wantHarness := harness
					if r.wantHarness != "" {
						wantHarness = r.wantHarness
					}
					if status != 200 || field(v, "outcome") != r.wantStored || field(v, "recipientHarness") != wantHarness {
						t.Fatalf("GET /v1/messages/%s: %d %v, want outcome %s, recipient %s", got.messageID, status, v, r.wantStored, wantHarness)
					}
					// Each accepted send has its audit line, from the socket it came in on
					// (written once the answer is out, so it may trail the answer).
					socket := map[string]string{"http": "http", "agent": "agent", "svc": "agent", "fed": "fed", "leaf": "http"}[w.name]
					daemontest.WaitFor(t, "the send's audit line", func() bool { return audited(m.d.stderr.String(), socket, got.messageID) })
				})
			}
		}
	}
	// A service ref the hub cannot tell from the leaf's (leaf1 has no `targets`) is queued;
	// the leaf, which serves svc:bot only, rejects it with its next pull, and the hub reads
	// not_found. The leaf's service, polling, gets only what is sent after it.
	t.Run("svc/another service/leaf", func(t *testing.T) {
		p := daemontest.Start(t, "")
		c, _ := register(t, p, m.leaf.sock("register"), "svc", "bot")
		p.Send(c, map[string]any{"action": "poll", "waitSecs": 30})
		msg := m.leafSend(t, "svc:other", "to another service by leaf")
		m.leafRejected(t, msg)
		after := m.leafSend(t, "svc:bot", "sent after "+msg)
		m.leafOnce(t, p, c, p.RecvJSON(c), after)
	})
	// An agy process with the presence lock open but flocked by a process that is not its
	// ancestor is no session: the chosen ancestor must hold the flock itself.
	t.Run("agy/flock held by a non-ancestor", func(t *testing.T) {
		conv := uuid.NewString()
		holder := daemontest.StartNestedExe(t, os.Args[0], daemontest.LockEnv+"="+m.lock(conv))
		holder.Dial(m.d.sock("http")) // its child answers: the parent has taken the flock
		p := daemontest.StartNestedExe(t, m.agyExe, daemontest.OpenEnv+"="+m.lock(conv))
		c := p.Dial(m.d.sock("agent"))
		if r := p.Call(c, map[string]any{"action": "mcp_start"}); r["status"] != "error" || r["error"] != "unattested" {
			t.Fatalf("mcp_start under an agy process whose lock another process flocked: %v, want unattested", r)
		}
		rc := p.Dial(m.d.sock("register"))
		if r := p.Call(rc, map[string]any{"conversation_id": conv, "ls_address": "127.0.0.1:9", "csrf_token": "t"}); r["error"] != "unattested" {
			t.Fatalf("credentials under an agy process whose lock another process flocked: %v, want unattested", r)
		}
	})
}
