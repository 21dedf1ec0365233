package fed

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/fed/fedtest"
	inbox "github.com/xmsg/xmsg/internal/hub"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/store"
)

// node is an in-process federating node on loopback: a real bus and store, a real mTLS
// listener. The end-to-end tests (cmd/xmsg) run real daemons in network namespaces; these
// run everywhere, without root.
type node struct {
	t     testing.TB
	name  string
	dir   string
	cert  *fedtest.Cert
	ln    net.Listener
	n     *Node
	bus   *bus.Bus
	store *store.Store
	srv   *Server
	tune  func(*Config) // set before start: adjusts the node's Config
}

func newNode(t testing.TB, name string) *node {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nd := &node{t: t, name: name, dir: t.TempDir(), cert: fedtest.New(t, name, nil, fedtest.Options{}), ln: ln}
	nd.write("cert.pem", nd.cert.CertPEM)
	nd.write("key.pem", nd.cert.KeyPEM)
	return nd
}

func (nd *node) addr() string { return nd.ln.Addr().String() }

func (nd *node) write(name string, data []byte) {
	nd.t.Helper()
	tmp := filepath.Join(nd.dir, "."+name)
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		nd.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(nd.dir, name)); err != nil {
		nd.t.Fatal(err)
	}
}

// start builds the node with peers (a JSON peers file) and serves it.
func (nd *node) start(peers string, rates ...int) {
	t := nd.t
	t.Helper()
	nd.write("peers.json", []byte(peers))
	cfg := Config{Host: nd.name, Listen: nd.addr(), CertPath: filepath.Join(nd.dir, "cert.pem"), KeyPath: filepath.Join(nd.dir, "key.pem"),
		PeersPath: filepath.Join(nd.dir, "peers.json"), Log: slog.New(slog.DiscardHandler)}
	if len(rates) == 2 {
		cfg.PeerRate, cfg.PrincipalRate = rates[0], rates[1]
	}
	if nd.tune != nil {
		nd.tune(&cfg)
	}
	var err error
	if nd.n, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	if nd.store, err = store.Open(filepath.Join(nd.dir, "xmsg.db"), time.Second); err != nil {
		t.Fatal(err)
	}
	sessions := filepath.Join(nd.dir, "sessions")
	os.Mkdir(sessions, 0o700)
	log := slog.New(slog.DiscardHandler)
	nd.n.Attach(nd.store, inbox.New(nd.store, log, 0, 0), nil)
	nd.bus = bus.New(bus.Config{Host: nd.name, MaxBody: 65536, ReplyTTL: time.Hour, IdemTTL: time.Hour, SvcExe: map[string]string{"bot": "/bin/true", "other": "/bin/true"},
		Store: nd.store, Proc: peercred.Proc{}, Log: log, Fed: nd.n, Claude: &claude.Scanner{Dirs: []string{sessions}, UID: os.Geteuid(), Log: log}})
	nd.srv = nd.n.NewServer(nd.ln, nd.bus)
	go nd.srv.Serve()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		nd.srv.Shutdown(ctx)
		nd.n.Close()
		nd.bus.Close()
		nd.store.Close()
	})
}

// queued returns how many messages wait for session id.
func (nd *node) queued(id string) int {
	var n int
	nd.store.View(func(tx *store.Tx) error { n = tx.QueueLen(id); return nil })
	return n
}

func (nd *node) messages() int {
	c, _ := nd.bus.Counts()
	return c.Messages
}

// rawClient speaks to nd's listener with cert, outside any Node: for envelopes a Node
// would never send.
func rawClient(cert *fedtest.Cert) *http.Client {
	pair, _ := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{pair},
		InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}}, Timeout: 10 * time.Second}
}

func post(t *testing.T, c *http.Client, addr, path string, v any) (int, map[string]any) {
	t.Helper()
	raw, _ := json.Marshal(v)
	resp, err := c.Post("https://"+addr+path, "application/json", bytes.NewReader(raw))
	if err != nil {
		return 0, map[string]any{"transport": err.Error()}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out map[string]any
	json.Unmarshal(body, &out)
	return resp.StatusCode, out
}

func envelopeTo(ref string) map[string]any {
	id := uuid.Must(uuid.NewV7()).String()
	return map[string]any{"v": 2, "id": id, "principal": map[string]any{"kind": "session", "harness": "claude", "session_id": "s-1", "name": "alice"},
		"to": map[string]any{"ref": ref}, "body": "hello", "push_replies": true, "thread_id": id, "created_at": time.Now().Unix()}
}

func peerEntry(name, addr, pin, extra string) string {
	return fmt.Sprintf(`%q: {"address": %q, "pin": %q %s}`, name, addr, pin, extra)
}

// benchPair is pair for benchmarks, with rate limits out of the way.
func benchPair(t testing.TB) (a, b *node) { return pair(t, "", 1e9, 1e9) }

// pair starts a and b, each pinning the other, b accepting everything from a unless bExtra
// narrows it.
func pair(t testing.TB, bExtra string, rates ...int) (a, b *node) {
	a, b = newNode(t, "a"), newNode(t, "b")
	a.start("{"+peerEntry("b", b.addr(), b.cert.Pin, `, "allow": ["send", "reply", "list"]`)+"}", rates...)
	b.start("{"+peerEntry("a", a.addr(), a.cert.Pin, `, "allow": ["send", "reply", "list"]`+bExtra)+"}", rates...)
	return a, b
}

func TestSendAndReplyAcrossNodes(t *testing.T) {
	a, b := pair(t, "")
	ctx := context.Background()
	// An attested sender on a (a registered service, standing in for any caller).
	caller := bus.Caller{Harness: "svc", SessionID: "svc:bot", Name: "bot"}
	d, err := a.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:bot@b"), Text: "ping", Bytes: 4, FromName: "xmsg@a · svc:bot", Principal: "session:svc:bot",
		Caller: &caller, PushReplies: true})
	if err != nil {
		t.Fatal(err)
	}
	// svc:bot on b is configured but not connected: its queue holds the message, nobody has it.
	if d.Outcome.String() != "queued" || d.SessionID != "svc:bot" {
		t.Errorf("delivery = %+v; want queued for svc:bot", d)
	}
	if got := b.queued("svc:bot"); got != 1 {
		t.Fatalf("b queued %d, want 1", got)
	}
	// The recipient on b replies; the reply is pushed back into a's svc:bot queue.
	res, err := b.bus.Reply(ctx, caller, d.MessageID, "pong")
	if err != nil {
		t.Fatal(err)
	}
	if res.PushOutcome.String() != "pushed" {
		t.Errorf("push outcome = %v, want pushed", res.PushOutcome)
	}
	if got := a.queued("svc:bot"); got != 1 {
		t.Errorf("a queued %d replies, want 1", got)
	}
	// And a long-poll on a sees the reply.
	replies, err := a.bus.Replies(ctx, d.MessageID, 0, 0)
	if err != nil || len(replies) != 1 || replies[0].Text != "pong" {
		t.Errorf("replies on a = %+v, %v", replies, err)
	}
	// A reply to the reply goes back to b (a holds an outbound row for the pushed message).
	res2, err := a.bus.Reply(ctx, caller, res.PushedMessageID, "pong again")
	if err != nil || res2.PushOutcome.String() != "pushed" {
		t.Fatalf("reply to the reply: %+v %v", res2, err)
	}
	// The remote session list, and an unknown peer.
	list, err := a.bus.RemoteSessions(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	_ = list
	if _, err := a.bus.RemoteSessions(ctx, "nobody"); bus.AsError(err).Code != ledger.NotFound {
		t.Errorf("unknown peer list: %v", err)
	}
	if _, err := a.bus.Send(ctx, bus.Send{To: envelope.ParseRef("x@nobody"), Text: "t", Principal: "p"}); bus.AsError(err).Code != ledger.UnknownPeer {
		t.Errorf("unknown peer send: %v", err)
	}
}

func TestAnonymousRemoteSendPollsThePeer(t *testing.T) {
	a, b := pair(t, "")
	ctx := context.Background()
	d, err := a.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:bot@b"), Text: "ping", Bytes: 4, FromName: "xmsg@a · carol", Principal: "http:x", From: "carol"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan []bus.Reply)
	go func() {
		r, err := a.bus.Replies(ctx, d.MessageID, 0, 20*time.Second)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	// The recipient replies (no push: an anonymous sender has no return address); a's
	// long-poll, waiting on b's, wakes with it.
	time.Sleep(50 * time.Millisecond)
	res, err := b.bus.Reply(ctx, bus.Caller{Harness: "svc", SessionID: "svc:bot", Name: "bot"}, d.MessageID, "pong")
	if err != nil || res.PushOutcome.String() != "" {
		t.Fatalf("reply: %+v %v", res, err)
	}
	r := <-done
	if len(r) != 1 || r[0].Text != "pong" {
		t.Fatalf("a's long-poll got %+v", r)
	}
	// A long-poll for replies after that one waits (on b) for the next, instead of answering
	// at once with nothing: b numbers its replies its own way.
	go func() {
		r, err := a.bus.Replies(ctx, d.MessageID, r[0].Seq, 20*time.Second)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	time.Sleep(50 * time.Millisecond)
	if _, err := b.bus.Reply(ctx, bus.Caller{Harness: "svc", SessionID: "svc:bot", Name: "bot"}, d.MessageID, "pong 2"); err != nil {
		t.Fatal(err)
	}
	if r := <-done; len(r) != 1 || r[0].Text != "pong 2" {
		t.Errorf("second long-poll got %+v, want the second reply only", r)
	}
}

func TestRefusals(t *testing.T) {
	a, b := pair(t, `, "from": ["127.0.0.0/8"], "principals": ["claude:alice", "claude:mallory"], "targets": ["svc:bot"]`, 60, 3)
	c := rawClient(a.cert)
	for _, tt := range []struct {
		name   string
		mutate func(map[string]any)
		status int
		code   string
	}{
		{"wrong v", func(e map[string]any) { e["v"] = 1 }, 400, "bad_request"},
		{"unknown field", func(e map[string]any) { e["extra"] = true }, 400, "bad_request"},
		{"principal not allowed", func(e map[string]any) {
			e["principal"] = map[string]any{"kind": "session", "harness": "claude", "session_id": "s-2", "name": "eve"}
		}, 403, "op_denied"},
		{"no_forward", func(e map[string]any) { e["to"] = map[string]any{"ref": "svc:bot@c"} }, 400, "no_forward"},
		{"target not allowed", func(e map[string]any) { e["to"] = map[string]any{"ref": "svc:other"} }, 403, "op_denied"},
		{"target unknown", func(e map[string]any) { e["to"] = map[string]any{"ref": "nobody"} }, 403, "op_denied"},
		{"bad id", func(e map[string]any) { e["id"] = "../x" }, 400, "bad_request"},
		{"id not v7", func(e map[string]any) { e["id"] = uuid.NewString() }, 400, "bad_request"},
		{"id from 1970", func(e map[string]any) { e["id"] = "00000000-0001-7000-8000-000000000000" }, 400, "bad_request"},
		{"bad harness", func(e map[string]any) {
			e["principal"] = map[string]any{"kind": "session", "harness": "evil", "session_id": "s-1", "name": "alice"}
		}, 403, "op_denied"},
	} {
		e := envelopeTo("svc:bot")
		tt.mutate(e)
		status, out := post(t, c, b.addr(), "/fed/v2/messages", e)
		if status != tt.status || out["error"] != tt.code {
			t.Errorf("%s: got %d %v, want %d %s", tt.name, status, out, tt.status, tt.code)
		}
	}
	if got := b.messages(); got != 0 {
		t.Errorf("refused envelopes stored %d messages", got)
	}
	// Only /fed/v2 routes exist on the federation listener.
	for _, path := range []string{"/healthz", "/v1/sessions", "/v1/doctor"} {
		if status, _ := get(t, c, b.addr(), path); status != 404 {
			t.Errorf("GET %s on the federation listener: %d, want 404", path, status)
		}
	}
	// Rate limit: the principal budget is 3 per minute.
	for i := range 4 {
		e := envelopeTo("svc:bot")
		status, out := post(t, c, b.addr(), "/fed/v2/messages", e)
		if i < 3 && status != 202 {
			t.Errorf("send %d: %d %v", i, status, out)
		}
		if i == 3 && (status != 429 || out["error"] != "rate_limited") {
			t.Errorf("send %d: got %d %v, want 429 rate_limited", i, status, out)
		}
	}
	if got := b.queued("svc:bot"); got != 3 {
		t.Errorf("queued %d, want 3 (the rate-limited one not)", got)
	}
	// Another principal has its own budget.
	e := envelopeTo("svc:bot")
	e["principal"] = map[string]any{"kind": "session", "harness": "claude", "session_id": "s-9", "name": "mallory"}
	if status, out := post(t, c, b.addr(), "/fed/v2/messages", e); status != 202 {
		t.Errorf("other principal: %d %v", status, out)
	}
	// Idempotent envelope ids: the same envelope again answers the stored result.
	status1, out1 := post(t, c, b.addr(), "/fed/v2/messages", e)
	if status1 != 202 || out1["messageId"] != e["id"] || b.queued("svc:bot") != 4 {
		t.Errorf("replay: %d %v, queued %d", status1, out1, b.queued("svc:bot"))
	}
}

func TestHandshakeRefusalsReachNoHandler(t *testing.T) {
	a, b := pair(t, "")
	stranger := fedtest.New(t, "stranger", nil, fedtest.Options{})
	status, out := post(t, rawClient(stranger), b.addr(), "/fed/v2/messages", envelopeTo("svc:bot"))
	if status != 0 || !strings.Contains(fmt.Sprint(out["transport"]), "tls") {
		t.Errorf("unknown pin: got %d %v, want a TLS failure", status, out)
	}
	// TLS 1.2 is refused, even with a known certificate.
	pairA, _ := tls.X509KeyPair(a.cert.CertPEM, a.cert.KeyPEM)
	old := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{pairA},
		InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12}}, Timeout: 10 * time.Second}
	if status, out := post(t, old, b.addr(), "/fed/v2/messages", envelopeTo("svc:bot")); status != 0 {
		t.Errorf("TLS 1.2: got %d %v, want a TLS failure", status, out)
	}
	// Outbound-only: b knows c's pin but allows it nothing.
	c := newNode(t, "c")
	_ = a
	b.write("peers.json", []byte("{"+peerEntry("a", a.addr(), a.cert.Pin, `, "allow": ["send"]`)+","+peerEntry("c", c.addr(), c.cert.Pin, "")+"}"))
	if changed, err := b.n.Reload(); !changed || err != nil {
		t.Fatalf("reload: %v %v", changed, err)
	}
	status, out = post(t, rawClient(c.cert), b.addr(), "/fed/v2/messages", envelopeTo("svc:bot"))
	if status != 0 {
		t.Errorf("outbound-only: got %d %v, want a TLS failure", status, out)
	}
	if got := b.messages(); got != 0 {
		t.Errorf("stored %d messages", got)
	}
	if lines := strings.Join(b.n.DoctorLines(), "\n"); !strings.Contains(lines, "federation peer c: address") || !strings.Contains(lines, "outbound-only") {
		t.Errorf("doctor lines:\n%s", lines)
	}
}

func TestSourceCheckEveryRequest(t *testing.T) {
	// A second peer without a `from` list: else the listener would close a's connection
	// before TLS (TestSourceOutsideEveryFromClosedBeforeTLS) and the per-request check
	// would never be reached.
	a, b, other := newNode(t, "a"), newNode(t, "b"), fedtest.New(t, "other", nil, fedtest.Options{})
	a.start("{" + peerEntry("b", b.addr(), b.cert.Pin, `, "allow": ["send", "reply", "list"]`) + "}")
	b.start("{" + peerEntry("a", a.addr(), a.cert.Pin, `, "allow": ["send", "reply", "list"], "from": ["192.0.2.0/24"]`) + "," +
		peerEntry("other", "192.0.2.9:1", other.Pin, `, "allow": ["send"]`) + "}")
	c := rawClient(a.cert) // one kept-alive connection from 127.0.0.1
	for i := range 2 {
		status, out := post(t, c, b.addr(), "/fed/v2/messages", envelopeTo("svc:bot"))
		if status != 403 || out["error"] != "peer_rejected" {
			t.Errorf("request %d: got %d %v, want 403 peer_rejected", i, status, out)
		}
	}
	// The same refusal reaches a sender on a as its own error code.
	_, err := a.bus.Send(context.Background(), bus.Send{To: envelope.ParseRef("svc:bot@b"), Text: "x", Principal: "p", From: "x"})
	if e := bus.AsError(err); e.Code != ledger.PeerRejected {
		t.Errorf("send from a: %v", err)
	}
	if got := b.messages(); got != 0 {
		t.Errorf("stored %d messages", got)
	}
	if got := a.messages(); got != 0 {
		t.Errorf("the refused send left %d message rows on a", got)
	}
}

func TestRotatedCertificate(t *testing.T) {
	a, b := pair(t, "")
	ctx := context.Background()
	send := func() error {
		_, err := a.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:bot@b"), Text: "x", Principal: "p", From: "x"})
		return err
	}
	if err := send(); err != nil {
		t.Fatal(err)
	}
	// A kept-alive connection made with the old certificate, before any reload.
	keep := rawClient(a.cert)
	if status, out := post(t, keep, b.addr(), "/fed/v2/messages", envelopeTo("svc:bot")); status != 202 {
		t.Fatalf("kept-alive connection: %d %v", status, out)
	}
	old := a.cert
	a.cert = fedtest.New(t, "a", nil, fedtest.Options{})
	a.write("cert.pem", a.cert.CertPEM)
	a.write("key.pem", a.cert.KeyPEM)
	// Half a rotation (the cert without its key) is refused and the old pair kept.
	a.write("key.pem", old.KeyPEM)
	if changed, err := a.n.Reload(); changed || err == nil {
		t.Fatalf("mismatched key: reload %v %v, want refused", changed, err)
	}
	if err := send(); err != nil {
		t.Fatalf("after a refused reload the old pair must still work: %v", err)
	}
	a.write("key.pem", a.cert.KeyPEM)
	if changed, err := a.n.Reload(); !changed || err != nil {
		t.Fatalf("reload a: %v %v", changed, err)
	}
	// b still pins the old certificate: the new one is refused at the handshake.
	if err := send(); bus.AsError(err).Code != ledger.PeerRejected {
		t.Fatalf("new cert before b knows it: %v, want peer_rejected", err)
	}
	b.write("peers.json", []byte("{"+peerEntry("a", a.addr(), a.cert.Pin, `, "allow": ["send", "reply", "list"]`)+"}"))
	if changed, err := b.n.Reload(); !changed || err != nil {
		t.Fatalf("reload b: %v %v", changed, err)
	}
	if err := send(); err != nil {
		t.Fatalf("new cert after b's reload: %v", err)
	}
	// The connection made with the old certificate is judged again at its next request.
	if status, out := post(t, keep, b.addr(), "/fed/v2/messages", envelopeTo("svc:bot")); status != 403 || out["error"] != "peer_rejected" {
		t.Errorf("old kept-alive connection after b's reload: got %d %v, want 403 peer_rejected", status, out)
	}
	// And the old certificate is refused now.
	if status, out := post(t, rawClient(old), b.addr(), "/fed/v2/messages", envelopeTo("svc:bot")); status != 0 {
		t.Errorf("old certificate: got %d %v, want a TLS failure", status, out)
	}
}

func get(t *testing.T, c *http.Client, addr, path string) (int, []byte) {
	t.Helper()
	resp, err := c.Get("https://" + addr + path)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// TestLeafMailbox: the hub queues mail for a leaf peer without connecting to it; the leaf
// pulls it (it stays until acked), and each leaf sees only its own mailbox.
func TestLeafMailbox(t *testing.T) {
	hub, leaf, other := newNode(t, "hub"), newNode(t, "leaf"), newNode(t, "other")
	hub.start("{" + peerEntry("leaf", leaf.addr(), leaf.cert.Pin, `, "leaf": true, "targets": ["svc:matrix"]`) + "," +
		peerEntry("other", other.addr(), other.cert.Pin, `, "leaf": true`) + "}")
	ctx := context.Background()
	d, err := hub.bus.Send(ctx, bus.Send{To: envelope.ParseRef("matrix@leaf"), Text: "for the leaf", Bytes: 12, FromName: "xmsg@hub · carol", Principal: "http:c", From: "carol"})
	if err != nil || d.Outcome.String() != "queued" || d.SessionID != "matrix" {
		t.Fatalf("send to leaf: %+v %v", d, err)
	}
	if _, err := hub.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:bot@leaf"), Text: "x", Principal: "p", From: "c"}); bus.AsError(err).Code != ledger.OpDenied {
		t.Errorf("target outside the leaf's targets: %v", err)
	}
	c := rawClient(leaf.cert)
	for range 2 { // not removed by reading
		status, body := get(t, c, hub.addr(), "/fed/v2/inbox?wait=0")
		var e map[string]any
		json.Unmarshal(body, &e)
		if o, _ := e["origin"].(map[string]any); status != 200 || e["id"] != d.MessageID || e["body"] != "for the leaf" || e["to"] != "matrix" || o["host"] != "hub" {
			t.Fatalf("inbox: %d %s", status, body)
		}
	}
	// Another leaf has its own (empty) mailbox, and cannot ack the first one's mail.
	if status, body := get(t, rawClient(other.cert), hub.addr(), "/fed/v2/inbox?wait=0"); status != 200 || strings.TrimSpace(string(body)) != "null" {
		t.Errorf("other leaf's inbox: %d %s", status, body)
	}
	if status, out := post(t, rawClient(other.cert), hub.addr(), "/fed/v2/inbox/"+d.MessageID+"/ack", nil); status != 404 {
		t.Errorf("other leaf acking: %d %v", status, out)
	}
	if status, out := post(t, c, hub.addr(), "/fed/v2/inbox/"+d.MessageID+"/ack", nil); status != 200 || out["status"] != "ok" {
		t.Errorf("ack: %d %v", status, out)
	}
	if status, out := post(t, c, hub.addr(), "/fed/v2/inbox/"+d.MessageID+"/ack", nil); status != 404 {
		t.Errorf("second ack: %d %v", status, out)
	}
	if status, body := get(t, c, hub.addr(), "/fed/v2/inbox?wait=0"); strings.TrimSpace(string(body)) != "null" {
		t.Errorf("inbox after ack: %d %s", status, body)
	}
	// A long-poll wakes when mail arrives.
	got := make(chan []byte, 1)
	go func() { _, body := get(t, c, hub.addr(), "/fed/v2/inbox?wait=20"); got <- body }()
	time.Sleep(50 * time.Millisecond)
	d2, err := hub.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:matrix@leaf"), Text: "second", Principal: "p", From: "c"})
	if err != nil {
		t.Fatal(err)
	}
	if body := <-got; !strings.Contains(string(body), d2.MessageID) {
		t.Errorf("long-poll got %s", body)
	}
}

func TestInboxOnlyForLeaves(t *testing.T) {
	a, b := pair(t, "")
	if status, body := get(t, rawClient(a.cert), b.addr(), "/fed/v2/inbox?wait=0"); status != 403 || !strings.Contains(string(body), "op_denied") {
		t.Errorf("non-leaf inbox: %d %s", status, body)
	}
}

// TestConcurrentCopiesDeliverOnce: the same envelope sent many times at once is delivered
// once; every copy gets the same answer.
func TestConcurrentCopiesDeliverOnce(t *testing.T) {
	a, b := pair(t, "")
	e := envelopeTo("svc:bot")
	results := make(chan string, 8)
	start := make(chan struct{})
	for range 8 {
		c := rawClient(a.cert)
		get(t, c, b.addr(), "/fed/v2/sessions") // handshake done before the race
		go func() {
			<-start
			status, out := post(t, c, b.addr(), "/fed/v2/messages", e)
			results <- fmt.Sprint(status, out["messageId"])
		}()
	}
	close(start)
	for range 8 {
		if got, want := <-results, fmt.Sprint(202, e["id"]); got != want {
			t.Errorf("copy answered %s, want %s", got, want)
		}
	}
	if got := b.queued("svc:bot"); got != 1 {
		t.Errorf("queued %d copies, want 1", got)
	}
}

// TestPrincipalValidation: step 7 of §8.3 for a peer without a principals filter.
func TestPrincipalValidation(t *testing.T) {
	a, b := pair(t, "")
	c := rawClient(a.cert)
	for _, tt := range []struct {
		principal map[string]any
		status    int
		code      string
	}{
		{map[string]any{"kind": "session", "harness": "evil", "session_id": "s", "name": "n"}, 400, "bad_request"},
		{map[string]any{"kind": "session", "harness": "claude", "session_id": "", "name": "n"}, 400, "bad_request"},
		{map[string]any{"kind": "service", "name": "bad name!"}, 400, "bad_request"},
		{map[string]any{"kind": "anonymous", "from": "a:b"}, 400, "bad_sender"},
		{map[string]any{"kind": "anonymous", "from": "x", "name": "extra"}, 400, "bad_request"},
		{map[string]any{"kind": "robot"}, 400, "bad_request"},
		{map[string]any{"kind": "service", "name": "matrix"}, 202, ""},
	} {
		e := envelopeTo("svc:bot")
		e["principal"] = tt.principal
		status, out := post(t, c, b.addr(), "/fed/v2/messages", e)
		if status != tt.status || (tt.code != "" && out["error"] != tt.code) {
			t.Errorf("%v: got %d %v, want %d %s", tt.principal, status, out, tt.status, tt.code)
		}
	}
	if got := b.queued("svc:bot"); got != 1 {
		t.Errorf("queued %d, want only the valid one", got)
	}
}

// TestEscapedTextCrossesNodes: a text of exactly max_body bytes that JSON escapes to six
// times its size (control bytes) is taken by the sending node and by its peer alike: the
// envelope's cap is the local request's (limits.RequestCap). Mutant tried: the old cap,
// max_body+4096 (red: the peer answers payload_too_large).
func TestEscapedTextCrossesNodes(t *testing.T) {
	a, b := pair(t, "")
	caller := bus.Caller{Harness: "svc", SessionID: "svc:bot", Name: "bot"}
	text := strings.Repeat("\x01", 65536)
	d, err := a.bus.Send(context.Background(), bus.Send{To: envelope.ParseRef("svc:bot@b"), Text: text, Bytes: len(text),
		FromName: "xmsg@a · svc:bot", Principal: "session:svc:bot", Caller: &caller})
	if err != nil {
		t.Fatalf("a max_body text, escaped six times over: %v", err)
	}
	if got := b.queued("svc:bot"); got != 1 || d.MessageID == "" {
		t.Fatalf("b queued %d (%+v), want the message", got, d)
	}
}
