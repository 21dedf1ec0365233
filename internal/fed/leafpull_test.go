package fed

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/envelope"
	inbox "github.com/xmsg/xmsg/internal/hub"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/limits"
	"github.com/xmsg/xmsg/internal/store"
)

// pullRaw is one POST /fed/v2/inbox of a raw leaf client.
func pullRaw(t *testing.T, c *http.Client, addr string, req map[string]any) (int, PullAnswer, map[string]any) {
	t.Helper()
	status, out := post(t, c, addr, "/fed/v2/inbox", req)
	raw, _ := json.Marshal(out)
	var ans PullAnswer
	json.Unmarshal(raw, &ans)
	return status, ans, out
}

// A batched pull hands out the oldest rows, bounded in count and bytes; the next pull acks
// them and hands out the next ones; rows leave the mailbox only when acked. At the default
// peer rate (60/min), 300 messages go through with no 429: the inbox path is bounded by the
// mailbox, not by the send rate; so does a leaf pulling on one stream with no acks (its
// service still working), while one spinning new streams pays. Mutants tried: every inbox
// request spending the bucket again (fed/leaf.go idle always called): 429 at the 61st
// request, red; a poll free after rows on any stream: the spin is never refused, red; a
// poll free only after an ack: 429 at the 56th pull on one stream, red.
func TestLeafPullBatch(t *testing.T) {
	hub, l1 := newNode(t, "hub"), newNode(t, "l1")
	hub.start("{" + peerEntry("l1", "192.0.2.201:1", l1.cert.Pin, `, "leaf": true, "allow": ["send", "reply"]`) + "}")
	ctx := context.Background()
	const n = 300
	var ids []string
	for i := range n {
		d, err := hub.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:bot@l1"), Text: fmt.Sprintf("m%d", i), Bytes: 4, FromName: "xmsg@hub · c", Principal: "http:c", From: "c"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, d.MessageID)
	}
	c := rawClient(l1.cert)
	for _, bad := range []map[string]any{{"ack": []string{}, "max": -1}, {"max": 1, "stream": "x"}} {
		if status, _, out := pullRaw(t, c, hub.addr(), bad); status != 400 {
			t.Errorf("%v: %d %v, want 400", bad, status, out)
		}
	}
	// max_bytes below one row: one row all the same.
	if status, ans, out := pullRaw(t, c, hub.addr(), map[string]any{"max": 10, "max_bytes": 1}); status != 200 || len(ans.Rows) != 1 || ans.Rows[0].ID != ids[0] {
		t.Fatalf("max_bytes 1: %d %v", status, out)
	}
	var got []string
	var ack []string
	for i := 0; i < 3*n && len(got) < n; i++ {
		status, ans, out := pullRaw(t, c, hub.addr(), map[string]any{"ack": ack, "max": 50})
		if status != 200 {
			t.Fatalf("pull %d (%d received): %d %v", i, len(got), status, out)
		}
		if ans.Acked != len(ack) {
			t.Errorf("pull %d acked %d of %d", i, ans.Acked, len(ack))
		}
		if len(ans.Rows) > 50 {
			t.Fatalf("pull %d: %d rows, over max", i, len(ans.Rows))
		}
		ack = ack[:0]
		for _, r := range ans.Rows {
			got = append(got, r.ID)
			ack = append(ack, r.ID)
		}
		if hub.mailbox("l1") != n-len(got)+len(ans.Rows) {
			t.Fatalf("mailbox %d after %d received, %d unacked", hub.mailbox("l1"), len(got), len(ans.Rows))
		}
	}
	if status, ans, out := pullRaw(t, c, hub.addr(), map[string]any{"ack": ack, "max": 50}); status != 200 || len(ans.Rows) != 0 {
		t.Fatalf("last ack: %d %v", status, out)
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") || hub.mailbox("l1") != 0 {
		t.Fatalf("received %d of %d in order? %v; mailbox %d", len(got), n, strings.Join(got, ",") == strings.Join(ids, ","), hub.mailbox("l1"))
	}
	if o := hub.outcome(ids[n-1]); o != "delivered" {
		t.Errorf("outcome after the batch ack = %q", o)
	}

	// One row at a time (the protocol's routes), at the default rate too.
	for i := range 100 {
		if _, err := hub.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:bot@l1"), Text: fmt.Sprintf("o%d", i), Bytes: 4, FromName: "xmsg@hub · c", Principal: "http:c", From: "c"}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100 {
		status, body := get(t, c, hub.addr(), "/fed/v2/inbox?wait=0")
		var row inbox.Row
		if status != 200 || json.Unmarshal(body, &row) != nil || row.ID == "" {
			t.Fatalf("one-row poll %d: %d %s", i, status, body)
		}
		if status, out := post(t, c, hub.addr(), "/fed/v2/inbox/"+row.ID+"/ack", map[string]any{}); status != 200 {
			t.Fatalf("one-row ack %d: %d %v", i, status, out)
		}
	}

	// On a stream, a row handed out is not handed out again until settled; max 0 acks
	// without pulling; a new stream hands out again every row not settled.
	var four []string
	for i := range 4 {
		d, err := hub.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:bot@l1"), Text: fmt.Sprintf("s%d", i), Bytes: 4, FromName: "xmsg@hub · c", Principal: "http:c", From: "c"})
		if err != nil {
			t.Fatal(err)
		}
		four = append(four, d.MessageID)
	}
	rowIDs := func(a PullAnswer) string {
		var out []string
		for _, r := range a.Rows {
			out = append(out, r.ID)
		}
		return strings.Join(out, ",")
	}
	s1, s2 := uuid.NewString(), uuid.NewString()
	for _, step := range []struct {
		req   map[string]any
		acked int
		rows  []string
	}{
		{map[string]any{"max": 2, "stream": s1}, 0, four[:2]},
		{map[string]any{"max": 2, "stream": s1}, 0, four[2:]},
		{map[string]any{"max": 2, "stream": s1}, 0, nil},
		{map[string]any{"ack": four[:2], "max": 0}, 2, nil},
		{map[string]any{"max": 10, "stream": s2}, 0, four[2:]},
		{map[string]any{"ack": four[2:], "max": 0}, 2, nil},
	} {
		status, ans, out := pullRaw(t, c, hub.addr(), step.req)
		if status != 200 || ans.Acked != step.acked || rowIDs(ans) != strings.Join(step.rows, ",") {
			t.Fatalf("%v: %d %v; want acked %d, rows %v", step.req, status, out, step.acked, step.rows)
		}
	}

	// A leaf pulling while its service works (no ack on the pull) is free as long as each
	// poll on its stream hands out rows: 150 rows one per pull at 60/min, no 429. Then every
	// row is handed out again on each new stream: those polls pay, and run out.
	var more []string
	for i := range 150 {
		d, err := hub.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:bot@l1"), Text: fmt.Sprintf("p%d", i), Bytes: 4, FromName: "xmsg@hub · c", Principal: "http:c", From: "c"})
		if err != nil {
			t.Fatal(err)
		}
		more = append(more, d.MessageID)
	}
	s3 := uuid.NewString()
	for i := range more {
		status, ans, out := pullRaw(t, c, hub.addr(), map[string]any{"max": 1, "stream": s3})
		if status != 200 || len(ans.Rows) != 1 || ans.Rows[0].ID != more[i] {
			t.Fatalf("pull %d on one stream, no acks: %d %v", i, status, out)
		}
	}
	spun := 0
	for range 70 {
		if status, _, _ := pullRaw(t, c, hub.addr(), map[string]any{"max": 1, "stream": uuid.NewString()}); status == 429 {
			spun++
		}
	}
	if spun == 0 {
		t.Error("70 polls each on a new stream at 60/min: none refused")
	}
	for i := 0; i < len(more); i += 100 {
		if status, ans, out := pullRaw(t, c, hub.addr(), map[string]any{"ack": more[i:min(i+100, len(more))], "max": 0}); status != 200 || ans.Acked != min(100, len(more)-i) {
			t.Fatalf("acks: %d %v", status, out)
		}
	}

	// Requests that move nothing still spend the bucket: empty polls run out.
	limited := 0
	for range 70 {
		if status, _ := get(t, c, hub.addr(), "/fed/v2/inbox?wait=0"); status == 429 {
			limited++
		}
	}
	if limited == 0 {
		t.Error("70 empty polls at 60/min: none refused")
	}
	bogus := uuid.Must(uuid.NewV7()).String()
	if status, _ := post(t, c, hub.addr(), "/fed/v2/inbox/"+bogus+"/ack", map[string]any{}); status != 429 && status != 404 {
		t.Errorf("ack of nothing = %d", status)
	}
}

// One pinned peer flooding svc:bot with a new principal per request holds at most its share
// of the queue; a second peer still gets in. Mutant tried: DeliverFed without the share
// (EnqueueShare with 0): the flood takes all 100 places and every send of the second peer
// is refused, red.
func TestQueueShareAcrossPeers(t *testing.T) {
	hub, p1, p2 := newNode(t, "hub"), newNode(t, "p1"), newNode(t, "p2")
	allow := `, "allow": ["send"]`
	hub.start("{"+peerEntry("p1", "192.0.2.211:1", p1.cert.Pin, allow)+","+peerEntry("p2", "192.0.2.212:1", p2.cert.Pin, allow)+"}", 100000, 100000)
	c1, c2 := rawClient(p1.cert), rawClient(p2.cert)
	accepted, refused := 0, 0
	for i := range 150 {
		e := envelopeTo("svc:bot")
		e["principal"] = map[string]any{"kind": "anonymous", "from": fmt.Sprintf("flood%d", i)}
		switch status, out := post(t, c1, hub.addr(), "/fed/v2/messages", e); status {
		case 202:
			accepted++
		case 503:
			refused++
			if !strings.Contains(fmt.Sprint(out["detail"]), "full") {
				t.Errorf("refusal detail: %v", out)
			}
		default:
			t.Fatalf("flood %d: %d %v", i, status, out)
		}
	}
	if accepted != bus.DefaultQueueShare {
		t.Errorf("flooding peer: %d accepted, want its share %d", accepted, bus.DefaultQueueShare)
	}
	ok := 0
	for range 20 {
		if status, _ := post(t, c2, hub.addr(), "/fed/v2/messages", envelopeTo("svc:bot")); status == 202 {
			ok++
		}
	}
	t.Logf("flood: %d accepted, %d refused; second peer: %d of 20 accepted; svc:bot queue %d", accepted, refused, ok, hub.queued("svc:bot"))
	if ok != 20 {
		t.Errorf("second peer: %d of 20 sends accepted while the first floods", ok)
	}
}

// A leaf's mailbox is bounded in bytes (and messages): past the bound a send is answered like
// a full queue, and the mailbox holds no more. Mutant tried: PutMailbox instead of
// PutMailboxMax in sendLeaf: all 200 accepted, red.
func TestLeafMailboxBound(t *testing.T) {
	hub, l1 := newNode(t, "hub"), newNode(t, "l1")
	hub.start("{" + peerEntry("l1", "192.0.2.201:1", l1.cert.Pin, `, "leaf": true, "allow": ["send", "reply"]`) + "}")
	body := strings.Repeat("x", 65536)
	accepted := 0
	var last error
	for range 200 {
		_, err := hub.bus.Send(context.Background(), bus.Send{To: envelope.ParseRef("svc:bot@l1"), Text: body, Bytes: len(body), FromName: "xmsg@hub · c", Principal: "http:c", From: "c"})
		if err != nil {
			last = err
			continue
		}
		accepted++
	}
	var size int
	hub.store.View(func(tx *store.Tx) error { _, size = tx.MailboxSize("l1"); return nil })
	t.Logf("64 KiB sends to a leaf nobody pulls: %d of 200 accepted, mailbox %d rows, %d bytes (bound %d)", accepted, hub.mailbox("l1"), size, limits.LeafMailboxMaxBytes)
	if e := bus.AsError(last); e.Code != ledger.ServiceUnavailable || !strings.Contains(e.Detail, "mailbox of leaf 'l1' is full") {
		t.Fatalf("past the bound: %v", last)
	}
	if size > limits.LeafMailboxMaxBytes || hub.mailbox("l1") != accepted {
		t.Errorf("mailbox %d bytes, %d rows: over its bound", size, hub.mailbox("l1"))
	}
}

// A leaf's pulls share one kept connection it reads and writes itself: no handshake after
// the first; a reload dials with the new snapshot; cancelling the pull's context ends its
// long-poll. Mutant tried: a kept connection surviving a reload (dials stay 1: red).
func TestPullConnection(t *testing.T) {
	hub, l1, _, plain := hubWithLeaves(t, "")
	peers := "{" + peerEntry("hub", hub.addr(), hub.cert.Pin, "") + "}"
	l1.startLeaf(peers)
	ctx := context.Background()
	send := func(text string) string {
		d, err := hub.bus.Send(ctx, bus.Send{To: envelope.ParseRef("svc:bot@l1"), Text: text, Bytes: len(text), FromName: "xmsg@hub · c", Principal: "http:c", From: "c"})
		if err != nil {
			t.Fatal(err)
		}
		return d.MessageID
	}
	pull := func(what string, ack []string, want int) []string {
		t.Helper()
		rows, err := l1.n.Pull(ctx, "hub", "", ack, nil, 10, 0, 0)
		if err != nil || len(rows) != want {
			t.Fatalf("%s: pull = %d rows, %v; want %d", what, len(rows), err, want)
		}
		var ids []string
		for _, r := range rows {
			ids = append(ids, r.ID)
		}
		return ids
	}
	dials := func() int64 { return l1.n.dials.Load() }
	send("one")
	got := pull("first", nil, 1)
	send("two")
	got = pull("second, acking the first", got, 1)
	send("three")
	got = pull("third, acking the second", got, 1)
	if dials() != 1 {
		t.Errorf("%d handshakes for two pulls, want 1 (a kept connection)", dials())
	}
	// A reload (another peer added): the next pull dials with the new snapshot.
	l1.write("peers.json", []byte("{"+peerEntry("hub", hub.addr(), hub.cert.Pin, "")+","+peerEntry("other", "192.0.2.9:1", plain.cert.Pin, "")+"}"))
	if changed, err := l1.n.Reload(); err != nil || !changed {
		t.Fatalf("reload = %v, %v", changed, err)
	}
	pull("after a reload", got, 0)
	if dials() != 2 {
		t.Errorf("%d handshakes, want 2 (a reload dials again)", dials())
	}
	// A long-poll ends with its context.
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := l1.n.Pull(cctx, "hub", "", nil, nil, 10, 0, 30*time.Second)
		done <- err
	}()
	cancel()
	if err := <-done; err == nil {
		t.Error("a cancelled long-poll returned no error")
	}
	if hub.mailbox("l1") != 0 {
		t.Errorf("mailbox %d after every row was acked, want 0", hub.mailbox("l1"))
	}
}

// A hub that closed the leaf's kept connection while it was idle (a restart, its idle
// timeout): the next pull finds it closed before any answer came, dials again and sends the
// pull again, and its caller sees an answer, not an error. The hub here is a TLS listener with
// the hub's pinned certificate that answers each connection's first request and closes it.
// Mutant tried: no resend after errStale (the second pull fails: red).
func TestPullConnectionClosedByHub(t *testing.T) {
	hub, l1, _, _ := hubWithLeaves(t, "")
	pair, err := tls.X509KeyPair(hub.cert.CertPEM, hub.cert.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				const ans = `{"acked":0,"rows":[]}`
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(ans), ans)
			}()
		}
	}()
	l1.startLeaf("{" + peerEntry("hub", ln.Addr().String(), hub.cert.Pin, "") + "}")
	for i := range 3 {
		if _, err := l1.n.Pull(context.Background(), "hub", "", nil, nil, 10, 0, 0); err != nil {
			t.Fatalf("pull %d: %v", i, err)
		}
	}
	if n := accepted.Load(); n != 3 {
		t.Errorf("%d connections for 3 pulls each answered on a connection then closed, want 3", n)
	}
}
