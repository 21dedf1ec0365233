package fed

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/claude"
	"github.com/xmsg/xmsg/internal/envelope"
	inbox "github.com/xmsg/xmsg/internal/hub"
	"github.com/xmsg/xmsg/internal/leaf"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/store"
)

// startLeaf builds nd as a leaf (client only, no listener) whose one service is bot.
func (nd *node) startLeaf(peers string) {
	t := nd.t
	t.Helper()
	nd.ln.Close() // a leaf listens for no federation connection
	nd.write("peers.json", []byte(peers))
	var err error
	if nd.n, err = New(Config{Host: nd.name, CertPath: filepath.Join(nd.dir, "cert.pem"), KeyPath: filepath.Join(nd.dir, "key.pem"),
		PeersPath: filepath.Join(nd.dir, "peers.json"), Log: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}
	if nd.store, err = store.Open(filepath.Join(nd.dir, "xmsg.db"), time.Second); err != nil {
		t.Fatal(err)
	}
	id, err := leaf.ParsePrincipal("svc:bot")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	nd.n.Attach(nd.store, nil, nil)
	nd.bus = bus.New(bus.Config{Host: nd.name, MaxBody: 65536, ReplyTTL: time.Hour, IdemTTL: time.Hour, Store: nd.store,
		Proc: peercred.Proc{}, Log: log, Fed: nd.n, Leaf: id.Bus(), Claude: &claude.Scanner{UID: os.Geteuid(), Log: log}})
	t.Cleanup(func() {
		nd.n.Close()
		nd.bus.Close()
		nd.store.Close()
	})
}

// pull runs a pull loop of leaf nd against hub until the returned stop is called.
func (nd *node) pull(hub string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	p := &leaf.Puller{Bus: nd.bus, Hub: nd.n, Peer: hub, Service: "bot", MaxBody: 65536, Log: slog.New(slog.DiscardHandler), Wait: 5 * time.Second}
	go func() { p.Run(ctx); close(done) }()
	return func() { cancel(); <-done }
}

// mailbox is peer's mail as committed, once the acks and rejects taken so far are: they ride
// the hub's next commit (hub.Mailboxes.Ack), which this makes.
func (nd *node) mailbox(peer string) int {
	nd.settled()
	return nd.n.Mailboxes().Len(peer)
}

// settled makes a commit, which carries the acks and rejects taken so far.
func (nd *node) settled() {
	if err := nd.store.Update(func(*store.Tx) error { return nil }); err != nil {
		nd.t.Fatal(err)
	}
}

func (nd *node) outcome(id string) string {
	nd.settled()
	v, err := nd.bus.Message(id)
	if err != nil {
		return err.Error()
	}
	return v.Outcome.String()
}

// eventually waits (bounded) for cond; the bound is a hang guard, not a timing assertion.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 2000; i++ {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("never: %s", what)
}

// hubWithLeaves starts a hub knowing two leaves (l1, l2) and one ordinary peer (plain).
func hubWithLeaves(t *testing.T, l1Extra string) (hub, l1, l2, plain *node) {
	hub, l1, l2, plain = newNode(t, "hub"), newNode(t, "l1"), newNode(t, "l2"), newNode(t, "plain")
	leafAllow := `, "leaf": true, "allow": ["send", "reply"]`
	hub.start("{"+peerEntry("l1", "192.0.2.201:1", l1.cert.Pin, leafAllow+l1Extra)+","+
		peerEntry("l2", "192.0.2.202:1", l2.cert.Pin, leafAllow)+","+
		peerEntry("plain", plain.addr(), plain.cert.Pin, `, "allow": ["send", "reply", "list"]`)+"}", 100000, 100000)
	return hub, l1, l2, plain
}

func TestLeafMailboxRoutes(t *testing.T) {
	hub, l1, l2, plain := hubWithLeaves(t, "")
	ctx := context.Background()
	d, err := hub.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:bot@l1"), Text: "for l1", Bytes: 6, FromName: "xmsg@hub · carol", Principal: "http:x", From: "carol"})
	if err != nil {
		t.Fatal(err)
	}
	if d.Outcome.String() != "queued" || d.SessionID != "svc:bot" {
		t.Errorf("send to a leaf = %+v, want queued for svc:bot", d)
	}
	if got := hub.mailbox("l1"); got != 1 {
		t.Fatalf("l1 mailbox = %d, want 1", got)
	}
	if got := hub.outcome(d.MessageID); got != "queued" {
		t.Errorf("message outcome = %q, want queued", got)
	}

	// Isolation: l2 sees nothing of l1's mail and cannot ack it; the row stays.
	c2 := rawClient(l2.cert)
	if status, body := get(t, c2, hub.addr(), "/fed/v2/inbox?wait=0"); status != 200 || strings.TrimSpace(string(body)) != "null" {
		t.Errorf("l2 inbox = %d %s, want 200 null", status, body)
	}
	if status, out := post(t, c2, hub.addr(), "/fed/v2/inbox/"+d.MessageID+"/ack", map[string]any{}); status != 404 {
		t.Errorf("l2 acking l1's row = %d %v, want 404", status, out)
	}
	if got := hub.mailbox("l1"); got != 1 {
		t.Fatalf("after l2's ack l1 mailbox = %d, want 1", got)
	}

	// A peer that is not a leaf has no inbox.
	cp := rawClient(plain.cert)
	if status, body := get(t, cp, hub.addr(), "/fed/v2/inbox?wait=0"); status != 403 || !strings.Contains(strings.TrimSpace(string(body)), `"op_denied"`) || !strings.Contains(strings.TrimSpace(string(body)), "peer is not a leaf") {
		t.Errorf("non-leaf inbox = %d %s, want 403 op_denied peer is not a leaf", status, body)
	}
	if status, out := post(t, cp, hub.addr(), "/fed/v2/inbox/"+d.MessageID+"/ack", map[string]any{}); status != 403 || out["error"] != "op_denied" {
		t.Errorf("non-leaf ack = %d %v, want 403 op_denied", status, out)
	}

	// l1 reads its row twice (a read removes nothing), acks it once; a second ack is 404.
	c1 := rawClient(l1.cert)
	for i := 0; i < 2; i++ {
		status, body := get(t, c1, hub.addr(), "/fed/v2/inbox?wait=0")
		var row inbox.Row
		if status != 200 || json.Unmarshal(body, &row) != nil || row.ID != d.MessageID || row.Body != "for l1" || row.To != "svc:bot" {
			t.Fatalf("l1 inbox read %d = %d %s", i, status, body)
		}
		var origin map[string]string
		json.Unmarshal(row.Origin, &origin)
		if origin["kind"] != "fed" || origin["host"] != "hub" || origin["principal"] != "anon:carol" {
			t.Errorf("origin = %v", origin)
		}
	}
	if status, out := post(t, c1, hub.addr(), "/fed/v2/inbox/"+d.MessageID+"/ack", map[string]any{}); status != 200 || out["status"] != "ok" {
		t.Errorf("l1 ack = %d %v", status, out)
	}
	if status, _ := post(t, c1, hub.addr(), "/fed/v2/inbox/"+d.MessageID+"/ack", map[string]any{}); status != 404 {
		t.Errorf("second ack = %d, want 404", status)
	}
	if got := hub.mailbox("l1"); got != 0 {
		t.Errorf("l1 mailbox after ack = %d", got)
	}
	if got := hub.outcome(d.MessageID); got != "delivered" {
		t.Errorf("outcome after the leaf's ack = %q, want delivered", got)
	}

	// A long-poll wakes when mail arrives.
	type res struct {
		status int
		body   []byte
	}
	ch := make(chan res, 1)
	go func() {
		s, b := get(t, c1, hub.addr(), "/fed/v2/inbox?wait=30")
		ch <- res{s, b}
	}()
	time.Sleep(100 * time.Millisecond) // lets the poll start waiting first; either order must work
	d2, err := hub.bus.Send(ctx, bus.Send{To: envelope.ParseRef("bot@l1"), Text: "second", Bytes: 6, FromName: "xmsg@hub · carol", Principal: "http:x", From: "carol"})
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.status != 200 || !strings.Contains(string(r.body), d2.MessageID) {
		t.Errorf("woken poll = %d %s, want the new row", r.status, r.body)
	}

	// Retention purges the mailbox like the queues.
	hub.bus.Purge(time.Now().Add(2 * time.Hour))
	if got := hub.mailbox("l1"); got != 0 {
		t.Errorf("l1 mailbox after retention = %d, want 0", got)
	}
}

func TestLeafTargetsApplyBeforeStoring(t *testing.T) {
	hub, _, _, _ := hubWithLeaves(t, `, "targets": ["svc:bot"]`)
	ctx := context.Background()
	_, err := hub.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:other@l1"), Text: "no", Bytes: 2, FromName: "xmsg@hub · carol", Principal: "http:x", From: "carol"})
	if e := bus.AsError(err); e.Code != ledger.OpDenied {
		t.Errorf("send to a target outside l1's targets = %v, want 403 op_denied", err)
	}
	if got, n := hub.mailbox("l1"), hub.messages(); got != 0 || n != 0 {
		t.Errorf("refused send stored %d mailbox rows, %d messages", got, n)
	}
	if _, err := hub.bus.Send(ctx, bus.Send{To: envelope.ParseRef("bot@l1"), Text: "yes", Bytes: 3, FromName: "xmsg@hub · carol", Principal: "http:x", From: "carol"}); err != nil {
		t.Errorf("send to an allowed target: %v", err)
	}
}

// TestLeafMailOnlyForItsService: a leaf hosts one service, so the hub refuses a session ref
// for it at send time (404, nothing stored), and a row for another service, which the hub
// cannot tell from the leaf's (no targets), is rejected by the leaf's next pull: the hub then
// reads not_found, not delivered. Mutants tried: no ServiceName check in Node.queue (the
// session send is queued: red); the leaf acking such a row instead (delivered: red).
func TestLeafMailOnlyForItsService(t *testing.T) {
	hub, l1, _, _ := hubWithLeaves(t, "")
	l1.startLeaf("{" + peerEntry("hub", hub.addr(), hub.cert.Pin, "") + "}")
	ctx := context.Background()
	send := func(ref string) (bus.Delivery, error) {
		return hub.bus.Send(ctx, bus.Send{To: envelope.ParseRef(ref), Text: "hi", Bytes: 2, FromName: "xmsg@hub · carol", Principal: "http:x", From: "carol"})
	}
	for _, ref := range []string{"claude:s-1@l1", "session:svc:bot@l1", "pi:x@l1", "codex:t@l1"} {
		if _, err := send(ref); bus.AsError(err).Code != ledger.NotFound || !strings.Contains(bus.AsError(err).Detail, "serves one service") {
			t.Errorf("send to %s = %v, want 404 not_found: a leaf serves one service", ref, err)
		}
	}
	if got, n := hub.mailbox("l1"), hub.messages(); got != 0 || n != 0 {
		t.Fatalf("refused sends stored %d mailbox rows, %d messages", got, n)
	}
	other, err := send("svc:other@l1")
	if err != nil || other.Outcome.String() != "queued" {
		t.Fatalf("send to another service of l1 = %+v %v, want queued", other, err)
	}
	stop := l1.pull("hub")
	defer stop()
	eventually(t, "the leaf's reject", func() bool { return hub.mailbox("l1") == 0 })
	if got := hub.outcome(other.MessageID); got != "not_found" {
		t.Errorf("hub outcome of a row the leaf rejected = %q, want not_found", got)
	}
	if got := l1.queued("svc:bot"); got != 0 {
		t.Errorf("leaf service's queue = %d, want nothing of another service's", got)
	}
}

// TestPullLoop runs a leaf's pull loop against a hub in-process: delivery into the local
// service queue, the hub ack only after the local ack, the reply pushed back to the hub
// sender, a leaf send reaching the hub, and restarts of the loop between the local delivery
// and the hub ack.
func TestPullLoop(t *testing.T) {
	hub, l1, _, _ := hubWithLeaves(t, "")
	l1.startLeaf("{" + peerEntry("hub", hub.addr(), hub.cert.Pin, "") + "}")
	ctx := context.Background()
	stop := l1.pull("hub")
	defer func() { stop() }()
	svc := &bus.Registration{Harness: "svc", SessionID: "svc:bot", Name: "bot"}
	sender := bus.Caller{Harness: "svc", SessionID: "svc:asker", Name: "asker"}

	d, err := hub.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:bot@l1"), Text: "ping", Bytes: 4, FromName: "xmsg@hub · svc:asker",
		Principal: "session:svc:asker", Caller: &sender, PushReplies: true})
	if err != nil {
		t.Fatal(err)
	}
	p, err := l1.bus.Poll(ctx, svc, 10*time.Second)
	if err != nil || p == nil || p.ID != d.MessageID || p.Text != "ping" {
		t.Fatalf("leaf service poll = %+v %v", p, err)
	}
	var origin map[string]string
	json.Unmarshal(p.Origin, &origin)
	if origin["kind"] != "fed" || origin["host"] != "hub" || origin["principal"] != "svc:asker" {
		t.Errorf("origin on the leaf = %v", origin)
	}
	// Delivered locally but not acked: the hub keeps the row.
	if got := hub.mailbox("l1"); got != 1 {
		t.Errorf("hub mailbox before the local ack = %d, want 1", got)
	}
	// The loop stops here (a crash between local delivery and hub ack) and starts again.
	stop()
	stop = l1.pull("hub")
	if got := hub.mailbox("l1"); got != 1 {
		t.Errorf("hub mailbox after a restart = %d, want 1", got)
	}
	if got := l1.queued("svc:bot"); got != 1 {
		t.Errorf("leaf queue after a restart = %d, want 1 (not queued twice)", got)
	}
	if err := l1.bus.Ack(context.Background(), svc, p.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "hub mailbox empty after the local ack", func() bool { return hub.mailbox("l1") == 0 })
	if got := hub.outcome(d.MessageID); got != "delivered" {
		t.Errorf("hub outcome = %q", got)
	}

	// The service replies on the leaf; the reply is pushed to the hub sender's queue.
	res, err := l1.bus.Reply(ctx, svc.Caller(), d.MessageID, "pong")
	if err != nil || res.PushOutcome.String() != "pushed" {
		t.Fatalf("leaf reply = %+v %v", res, err)
	}
	if got := hub.queued("svc:asker"); got != 1 {
		t.Errorf("hub sender's queue = %d, want the pushed reply", got)
	}
	// The hub answers reply polls for mail it sent a leaf from what the leaf pushed: it
	// never tries to connect to the leaf.
	if replies, err := hub.bus.Replies(ctx, d.MessageID, 0, time.Second); err != nil || len(replies) != 1 || replies[0].Text != "pong" {
		t.Errorf("hub reply poll of a leaf-bound message = %+v %v", replies, err)
	}

	// Locally acked, hub ack lost: a fresh loop finds the row on the hub again and acks it
	// without a second local delivery.
	stop()
	d3, err := hub.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:bot@l1"), Text: "three", Bytes: 5, FromName: "xmsg@hub · carol", Principal: "http:x", From: "carol"})
	if err != nil {
		t.Fatal(err)
	}
	_, committed, err := l1.bus.AcceptBatch(bus.Target{Harness: "svc", SessionID: "svc:bot"},
		[]bus.Inbound{{ID: d3.MessageID, Peer: "hub", FromName: "x", Body: "three", Badge: "anon:carol"}}, bus.BatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	if err := l1.bus.Ack(context.Background(), svc, d3.MessageID); err != nil {
		t.Fatal(err)
	}
	if replies, err := hub.bus.Replies(ctx, d3.MessageID, 0, 0); err != nil || len(replies) != 0 {
		t.Errorf("hub reply poll of an anonymous leaf-bound message = %+v %v, want [] without error", replies, err)
	}
	stop = l1.pull("hub")
	eventually(t, "hub mailbox empty", func() bool { return hub.mailbox("l1") == 0 })
	if got := l1.queued("svc:bot"); got != 0 {
		t.Errorf("already acked message queued again: %d", got)
	}

	// A send on the leaf, attributed to the leaf principal, reaches the hub; a reply there
	// is not pushed (the leaf pulls it), and the leaf's reply poll fetches it from the hub.
	hubSvc := bus.Caller{Harness: "svc", SessionID: "svc:bot", Name: "bot"}
	id, _ := leaf.ParsePrincipal("svc:bot")
	d4, err := l1.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:bot@hub"), Text: "from the leaf", Bytes: 13, FromName: "xmsg@l1 · svc:bot", Principal: id.Principal, FedPrincipal: &id.Fed})
	// The hub's svc:bot is configured but not connected: queued there.
	if err != nil || d4.Outcome.String() != "queued" {
		t.Fatalf("leaf send = %+v %v; want queued", d4, err)
	}
	if got := hub.queued("svc:bot"); got != 1 {
		t.Fatalf("hub svc:bot queue = %d", got)
	}
	r4, err := hub.bus.Reply(ctx, hubSvc, d4.MessageID, "answer")
	if err != nil || r4.PushOutcome.String() != "disabled" {
		t.Errorf("reply to a leaf-originated message: %+v %v, want disabled", r4, err)
	}
	replies, err := l1.bus.Replies(ctx, d4.MessageID, 0, 2*time.Second)
	if err != nil || len(replies) != 1 || replies[0].Text != "answer" {
		t.Errorf("leaf reply poll = %+v %v", replies, err)
	}
}

// The inbox poll and the inbox ack have their own buckets (inbox:<peer>, inbox-ack:<peer>):
// a leaf that spent its polls can still ack what it holds.
func TestLeafInboxRateBuckets(t *testing.T) {
	hub, l1 := newNode(t, "hub"), newNode(t, "l1")
	hub.start("{"+peerEntry("l1", "192.0.2.201:1", l1.cert.Pin, `, "leaf": true`)+"}", 2, 2)
	d, err := hub.bus.Send(context.Background(), bus.Send{To: envelope.ParseRef("bot@l1"), Text: "x", Bytes: 1, FromName: "xmsg@hub · c", Principal: "http:c", From: "c"})
	if err != nil {
		t.Fatal(err)
	}
	c := rawClient(l1.cert)
	for i := 0; i < 2; i++ {
		if status, body := get(t, c, hub.addr(), "/fed/v2/inbox?wait=0"); status != 200 {
			t.Fatalf("poll %d: %d %s", i, status, body)
		}
	}
	if status, _ := get(t, c, hub.addr(), "/fed/v2/inbox?wait=0"); status != 429 {
		t.Errorf("third poll at 2/min: %d, want 429", status)
	}
	if status, out := post(t, c, hub.addr(), "/fed/v2/inbox/"+d.MessageID+"/ack", nil); status != 200 {
		t.Errorf("ack after the polls ran out: %d %v, want 200", status, out)
	}
}
