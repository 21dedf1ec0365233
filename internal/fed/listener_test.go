package fed

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/fed/fedtest"
	"github.com/xmsg/xmsg/internal/inq"
	"github.com/xmsg/xmsg/internal/ledger"
)

// logBuf collects a node's log lines.
type logBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}
func (b *logBuf) String() string { b.mu.Lock(); defer b.mu.Unlock(); return b.buf.String() }

// small gives nd a budget of 32 connections (16 pending, 8 per source; 16 authenticated)
// and a log to read.
func small(nd *node) *logBuf {
	logs := &logBuf{}
	nd.tune = func(c *Config) {
		c.MaxConns = 32
		c.BodyTimeout = time.Second
		c.Log = slog.New(slog.NewTextHandler(logs, nil))
	}
	return logs
}

// dialFrom opens a TCP connection to addr from the loopback address src (any of 127/8).
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closed reports whether the server closed c (EOF or reset) within d; false: still open.
func closed(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

func (nd *node) pending() int {
	nd.srv.l.mu.Lock()
	defer nd.srv.l.mu.Unlock()
	return nd.srv.l.npend
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 500 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestCapacitySizing(t *testing.T) {
	for _, tt := range []struct {
		flag                         int
		nofile                       uint64
		total, pending, perSrc, auth int
		clamped                      bool
	}{
		{0, 1024, 768, 96, 48, 672, false},
		{0, 20000, 18976, 1024, 512, 17952, false},
		{0, 0, 1 << 16, 1024, 512, 1<<16 - 1024, false},
		{32, 20000, 32, 16, 8, 16, false},
		{10, 20000, 32, 16, 8, 16, false},
		{5000, 1024, 768, 96, 48, 672, true},
	} {
		c := sizeCapacity(tt.flag, tt.nofile)
		if c.total != tt.total || c.pending != tt.pending || c.perSrc != tt.perSrc || c.auth != tt.auth || c.clamped != tt.clamped {
			t.Errorf("sizeCapacity(%d, %d) = %+v, want total %d pending %d perSrc %d auth %d clamped %v", tt.flag, tt.nofile, c, tt.total, tt.pending, tt.perSrc, tt.auth, tt.clamped)
		}
	}
	c := sizeCapacity(0, 1024)
	if c.room(672) != 1 || c.room(673) != 0 || c.shared(600) != 72 {
		t.Errorf("room/shared: %d %d %d", c.room(672), c.room(673), c.shared(600))
	}
	if w := c.warnings(700); len(w) != 1 || !strings.Contains(w[0], "700 peers") {
		t.Errorf("warnings for 700 peers: %q", w)
	}
	if w := c.warnings(10); len(w) != 0 {
		t.Errorf("warnings for 10 peers: %q", w)
	}
}

// TestHandshakeTokens: the per-source bucket gives a burst at once, then makes a newcomer
// wait for its token, and refuses one that would wait longer than maxTokenWait.
func TestHandshakeTokens(t *testing.T) {
	l := &listener{buckets: map[netip.Addr]*hsBucket{}}
	now := time.Unix(1000, 0)
	src := netip.MustParseAddr("192.0.2.7")
	for i := range hsBurst {
		if w, ok := l.token(src, now, hsRate, hsBurst); !ok || w != 0 {
			t.Fatalf("token %d: wait %v ok %v", i, w, ok)
		}
	}
	w, ok := l.token(src, now, hsRate, hsBurst)
	if !ok || w <= 0 || w > 20*time.Millisecond {
		t.Errorf("first over the burst: wait %v ok %v, want a short wait", w, ok)
	}
	for range hsRate * 2 {
		l.token(src, now, hsRate, hsBurst)
	}
	if _, ok := l.token(src, now, hsRate, hsBurst); ok {
		t.Error("a token more than maxTokenWait ahead was given")
	}
	if w, ok := l.token(netip.MustParseAddr("192.0.2.8"), now, hsRate, hsBurst); !ok || w != 0 {
		t.Errorf("another source: wait %v ok %v", w, ok)
	}
	if w, ok := l.token(src, now.Add(3*time.Second), hsRate, hsBurst); !ok || w != 0 {
		t.Errorf("after refill: wait %v ok %v", w, ok)
	}
}

// TestSourceShareFollowsFleet: a source may hold half the pending pool, or all of it when more
// peers may connect than half the pool holds (a fleet behind one NAT). Mutant tried: srcShare
// returning perSrc whatever the fleet: red.
func TestSourceShareFollowsFleet(t *testing.T) {
	c := sizeCapacity(0, 20000)
	if got := c.srcShare(10); got != c.perSrc || c.perSrc != c.pending/2 {
		t.Errorf("share with 10 peers = %d, want half the pool %d", got, c.pending/2)
	}
	if got := c.srcShare(10000); got != c.pending {
		t.Errorf("share with 10,000 peers = %d, want the whole pool %d", got, c.pending)
	}
}

// TestHandshakeBudgetFollowsFleet: the per-source handshake bucket holds the whole configured
// fleet. 10,000 leaves behind one address restarting with the hub: every one gets its token
// at once, and those that must come again (a handshake lost) are all refilled within
// hsRefill; a small hub keeps the fixed bounds, so one address flooding it gets no more than
// before. Mutant tried: hsBudget returning (hsRate, hsBurst) whatever the fleet: red.
func TestHandshakeBudgetFollowsFleet(t *testing.T) {
	if rate, burst := hsBudget(10); rate != hsRate || burst != hsBurst {
		t.Errorf("budget of 10 peers = %v/s burst %v; want the fixed %d/s burst %d", rate, burst, hsRate, hsBurst)
	}
	const fleet = 10000
	rate, burst := hsBudget(fleet)
	l := &listener{buckets: map[netip.Addr]*hsBucket{}}
	src := netip.MustParseAddr("192.0.2.7")
	now := time.Unix(1000, 0)
	for i := range fleet {
		if w, ok := l.token(src, now, rate, burst); !ok || w != 0 {
			t.Fatalf("leaf %d of %d behind one address: wait %v ok %v; want its token at once", i, fleet, w, ok)
		}
	}
	// All of them again (every handshake lost): tokens for them all within hsRefill, and the
	// last one's wait no longer than maxTokenWait past the refill of those before.
	got := 0
	for at := now; at.Sub(now) <= hsRefill && got < fleet; at = at.Add(100 * time.Millisecond) {
		for got < fleet {
			w, ok := l.token(src, at, rate, burst)
			if !ok || w > 0 {
				if ok { // taken in advance: it counts, at its time
					got++
				}
				break
			}
			got++
		}
	}
	if got < fleet {
		t.Errorf("only %d of %d leaves had a token again within %v", got, fleet, hsRefill)
	}
}

// TestPendingPoolEvictsIdle: silent TCP connections fill the pending pool from four source
// addresses; a pinned peer that speaks at once still gets through, and one of the silent
// holders (of the heaviest source) is what goes. Within one source, the oldest silent one
// makes room for the newest.
func TestPendingPoolEvictsIdle(t *testing.T) {
	a, b := newNode(t, "a"), newNode(t, "b")
	logs := small(b)
	a.start("{" + peerEntry("b", b.addr(), b.cert.Pin, `, "allow": ["send", "reply", "list"]`) + "}")
	b.start("{" + peerEntry("a", a.addr(), a.cert.Pin, `, "allow": ["send", "reply", "list"]`) + "}")
	var idle []net.Conn
	for i := range 16 {
		idle = append(idle, dialFrom(t, fmt.Sprintf("127.0.0.%d", 2+i%4), b.addr()))
	}
	waitFor(t, "16 pending", func() bool { return b.pending() == 16 })
	for i := range 3 {
		if _, err := a.bus.Send(context.Background(), bus.Send{To: envelope.ParseRef("svc:bot@b"), Text: "x", Principal: "p", From: "c"}); err != nil {
			t.Fatalf("send %d with the pending pool full of silent connections: %v", i, err)
		}
		a.n.transport.CloseIdleConnections() // each send a fresh connection
	}
	gone := 0
	for _, c := range idle {
		if closed(c, 50*time.Millisecond) {
			gone++
		}
	}
	if gone < 1 || gone > 3 {
		t.Errorf("%d silent connections evicted, want 1..3 (one per fresh connection of the peer)", gone)
	}
	if !strings.Contains(logs.String(), "evicted") {
		t.Errorf("no eviction logged:\n%s", logs)
	}

	// One source's share: 8, with room in the pool. The oldest connection of the source is a
	// handshake under way (it sent the start of a ClientHello): it is not what goes. The 9th
	// takes the place of the oldest silent one.
	for _, c := range idle {
		c.Close()
	}
	waitFor(t, "an empty pending pool", func() bool { return b.pending() == 0 })
	speaking := dialFrom(t, "127.0.0.20", b.addr())
	speaking.Write([]byte{0x16, 0x03, 0x01, 0x00, 0x80, 0x01}) // a record header and a byte of 128
	var own []net.Conn
	for range 7 {
		time.Sleep(5 * time.Millisecond) // accept order = dial order
		own = append(own, dialFrom(t, "127.0.0.20", b.addr()))
	}
	waitFor(t, "8 pending", func() bool { return b.pending() == 8 })
	newest := dialFrom(t, "127.0.0.20", b.addr())
	if !closed(own[0], 2*time.Second) {
		t.Error("the oldest silent connection of the source was kept (its share is 8)")
	}
	if closed(newest, 100*time.Millisecond) {
		t.Error("the newest connection was refused instead of the oldest silent one evicted")
	}
	if closed(speaking, 50*time.Millisecond) {
		t.Error("the handshake under way was evicted instead of a silent connection")
	}
}

// TestSourceOutsideEveryFromClosedBeforeTLS: when every peer that may connect has a `from`
// list, a connection from outside all of them gets no handshake; one from inside does.
func TestSourceOutsideEveryFromClosedBeforeTLS(t *testing.T) {
	a, b := newNode(t, "a"), newNode(t, "b")
	logs := small(b)
	a.start("{" + peerEntry("b", b.addr(), b.cert.Pin, `, "allow": ["send"]`) + "}")
	b.start("{" + peerEntry("a", a.addr(), a.cert.Pin, `, "allow": ["send"], "from": ["127.0.0.1"]`) + "}")
	pair, _ := tls.X509KeyPair(a.cert.CertPEM, a.cert.KeyPEM)
	hs := func(src string) error {
		c := dialFrom(t, src, b.addr())
		tc := tls.Client(c, &tls.Config{Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		return tc.Handshake()
	}
	if err := hs("127.0.0.2"); err == nil {
		t.Error("handshake from outside every from list succeeded")
	}
	waitFor(t, "the log line", func() bool { return strings.Contains(logs.String(), "closed before TLS") })
	if got := b.n.book.get("(unknown)", "inbound"); got != "none yet" {
		t.Errorf("a handshake was run: %s", got)
	}
	if err := hs("127.0.0.1"); err != nil {
		t.Errorf("handshake from the peer's address: %v", err)
	}
}

// poller holds one authenticated connection of cert to nd with an inbox long-poll (or a
// quick request, after which it is an idle keep-alive).
type poller struct {
	c *tls.Conn
	r *bufio.Reader
}

func startPoll(t *testing.T, nd *node, cert *fedtest.Cert, wait int) *poller {
	t.Helper()
	pair, _ := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
	c, err := tls.Dial("tcp", nd.addr(), &tls.Config{Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "GET /fed/v2/inbox?wait=%d HTTP/1.1\r\nHost: hub\r\n\r\n", wait)
	return &poller{c: c, r: bufio.NewReader(c)}
}

// answer reads the response within d: its status and error code, or 0 when none came.
func (p *poller) answer(d time.Duration) (int, string) {
	p.c.SetReadDeadline(time.Now().Add(d))
	resp, err := http.ReadResponse(p.r, nil)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (nd *node) authenticated() (n, shared int) {
	l := nd.srv.l
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, list := range l.perPeer {
		n += len(list)
	}
	return n, l.shared
}

// TestAuthenticatedRoom: each peer that may connect keeps room of its own; the rest is
// shared; an idle keep-alive makes room for a newcomer, a busy connection never does; a
// peer finding no room is answered 503 hub_busy, which its client reports as hub_busy.
func TestAuthenticatedRoom(t *testing.T) {
	hub, a, c, d := newNode(t, "hub"), newNode(t, "a"), newNode(t, "c"), newNode(t, "d")
	logs := small(hub)
	leafEntry := func(n *node) string { return peerEntry(n.name, n.addr(), n.cert.Pin, `, "leaf": true`) }
	hub.start("{" + leafEntry(a) + "," + leafEntry(c) + "," + leafEntry(d) + "}")
	// 16 authenticated: room 1 for each of the 3, 13 shared.
	var aConns []*poller
	for i := range maxPerPeer { // a: room + 7 shared, each idle after a quick request
		p := startPoll(t, hub, a.cert, 0)
		if st, body := p.answer(5 * time.Second); st != 200 {
			t.Fatalf("a's connection %d: %d %s", i, st, body)
		}
		aConns = append(aConns, p)
	}
	var dConns []*poller
	for i := range maxPerPeer { // d: room + 6 shared, and the 8th takes an idle one of a's
		p := startPoll(t, hub, d.cert, 30)
		if st, body := p.answer(300 * time.Millisecond); st != 0 {
			t.Fatalf("d's long-poll %d answered at once: %d %s", i, st, body)
		}
		dConns = append(dConns, p)
	}
	if n, shared := hub.authenticated(); n != 15 || shared != 13 { // c's room is free
		t.Errorf("authenticated %d (shared %d), want 15 (13)", n, shared)
	}
	gone := 0
	for _, p := range aConns {
		if closed(p.c, 50*time.Millisecond) {
			gone++
		}
	}
	if gone != 1 {
		t.Errorf("%d of a's idle connections closed, want 1", gone)
	}
	// c still has its own room, though the shared pool is full of busy connections.
	cp := startPoll(t, hub, c.cert, 30)
	if st, body := cp.answer(300 * time.Millisecond); st != 0 {
		t.Fatalf("c's first connection: %d %s, want it served (a long-poll)", st, body)
	}
	// d at its 8, all busy: its 9th is answered hub_busy.
	if st, body := startPoll(t, hub, d.cert, 30).answer(5 * time.Second); st != 503 || !strings.Contains(body, "hub_busy") {
		t.Errorf("d's 9th connection: %d %s, want 503 hub_busy", st, body)
	}
	// c's client, past its room with the shared pool full of a's idle and d's busy
	// connections: a's idle ones make room (7-1 = 6 of them).
	// Take them all first with c's raw connections, then c's client must hear hub_busy.
	for range 6 {
		p := startPoll(t, hub, c.cert, 30)
		if st, body := p.answer(300 * time.Millisecond); st != 0 {
			t.Fatalf("c's connection: %d %s", st, body)
		}
	}
	c.startLeaf("{" + peerEntry("hub", hub.addr(), hub.cert.Pin, "") + "}")
	_, err := c.n.Inbox(context.Background(), "hub", 0)
	if e := bus.AsError(err); e.Code != ledger.HubBusy {
		t.Errorf("c's client with no room: %v, want 503 hub_busy", err)
	}
	if !strings.Contains(logs.String(), "refused for capacity") {
		t.Errorf("capacity refusal not logged:\n%s", logs)
	}
	if lines := strings.Join(hub.n.DoctorLines(), "\n"); !strings.Contains(lines, "federation capacity: 32 connections") || !strings.Contains(lines, "refused for capacity") {
		t.Errorf("doctor:\n%s", lines)
	}
}

// rawRequest sends head (request line and headers) on a fresh authenticated connection of
// cert, then body a byte every every, and returns the status of the answer (0: none) and
// how many body bytes were sent before it came.
func rawRequest(t *testing.T, nd *node, cert *fedtest.Cert, head string, body []byte, every time.Duration) (int, int) {
	t.Helper()
	pair, _ := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
	c, err := tls.Dial("tcp", nd.addr(), &tls.Config{Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	got := make(chan int, 1)
	go func() {
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			got <- 0
			return
		}
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	for i := range body {
		select {
		case st := <-got:
			return st, i
		case <-time.After(every):
		}
		if _, err := c.Write(body[i : i+1]); err != nil {
			return <-got, i
		}
	}
	return <-got, len(body)
}

// TestBodyDeadline: a peer that announces 1000 bytes and sends one every 100 ms is cut off
// at the body deadline (1 s here), not after the 100 s its body would take.
func TestBodyDeadline(t *testing.T) {
	a, b := newNode(t, "a"), newNode(t, "b")
	small(b)
	a.start("{" + peerEntry("b", b.addr(), b.cert.Pin, "") + "}")
	b.start("{" + peerEntry("a", a.addr(), a.cert.Pin, `, "allow": ["send"]`) + "}")
	head := "POST /fed/v2/messages HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
	st, sent := rawRequest(t, b, a.cert, head, bytes.Repeat([]byte(" "), 1000), 100*time.Millisecond)
	if sent >= 100 {
		t.Errorf("answered (%d) after %d body bytes, want the deadline to cut it off within ~10", st, sent)
	}
	t.Logf("slow body: answer %d after %d of 1000 bytes (1 per 100 ms, deadline 1 s)", st, sent)
}

// TestRateCheckedBeforeBody: a peer over its rate is answered 429 without its body being
// read: the body never comes here, and the answer is still 429 (read first, it would be a
// 400 for the body that never came).
func TestRateCheckedBeforeBody(t *testing.T) {
	a, b := newNode(t, "a"), newNode(t, "b")
	small(b)
	a.start("{" + peerEntry("b", b.addr(), b.cert.Pin, "") + "}")
	b.start("{"+peerEntry("a", a.addr(), a.cert.Pin, `, "allow": ["send"]`)+"}", 1, 1)
	if status, out := post(t, rawClient(a.cert), b.addr(), "/fed/v2/messages", envelopeTo("svc:bot")); status != 202 {
		t.Fatalf("first send: %d %v", status, out)
	}
	head := "POST /fed/v2/messages HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
	if st, _ := rawRequest(t, b, a.cert, head, nil, 0); st != http.StatusTooManyRequests {
		t.Errorf("over the rate, body withheld: %d, want 429", st)
	}
}

// TestReloadUnchangedParsesNothing: a reload of unchanged files compares bytes and parses
// nothing; a changed file is parsed once.
func TestReloadUnchangedParsesNothing(t *testing.T) {
	a, b := pair(t, "")
	before := b.n.builds.Load()
	for range 5 {
		if changed, err := b.n.Reload(); changed || err != nil {
			t.Fatalf("reload of unchanged files: %v %v", changed, err)
		}
	}
	if got := b.n.builds.Load() - before; got != 0 {
		t.Errorf("%d parses for 5 reloads of unchanged files, want 0", got)
	}
	// Once the files' stamps are older than the clock could blur (2 s), a reload stats them
	// and reads nothing.
	time.Sleep(2100 * time.Millisecond)
	b.n.Reload()
	reads := b.n.reads.Load()
	for range 5 {
		b.n.Reload()
	}
	if got := b.n.reads.Load() - reads; got != 0 {
		t.Errorf("%d reads for 5 reloads of files whose stamps did not move, want 0", got)
	}
	b.write("peers.json", []byte("{"+peerEntry("a", a.addr(), a.cert.Pin, `, "allow": ["send"]`)+"}"))
	if changed, err := b.n.Reload(); !changed || err != nil {
		t.Fatalf("reload of a changed peers file: %v %v", changed, err)
	}
	if got := b.n.builds.Load() - before; got != 1 {
		t.Errorf("%d parses after one change, want 1", got)
	}
}

// TestHandshakeErrorKinds: only a refusal (ours of the certificate, or the peer's alert)
// is rejected; a connection closed in the handshake, EOF included, is unreachable.
func TestHandshakeErrorKinds(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want error
	}{
		{io.EOF, errUnreachable},
		{fmt.Errorf("read: %w", syscall.ECONNRESET), errUnreachable},
		{&verifyError{errors.New("pin mismatch")}, errRejected},
		{&net.OpError{Op: "remote error", Err: errors.New("tls: bad certificate")}, errRejected},
		{context.DeadlineExceeded, errUnreachable},
	} {
		if got := handshakeError(tt.err); !errors.Is(got, tt.want) {
			t.Errorf("handshakeError(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
	// End to end: a "peer" that closes every connection unread is unreachable, not rejected.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	a := newNode(t, "a")
	a.start("{" + peerEntry("b", ln.Addr().String(), a.cert.Pin, `, "allow": ["send"]`) + "}")
	_, err = a.bus.Send(context.Background(), bus.Send{To: envelope.ParseRef("svc:bot@b"), Text: "x", Principal: "p", From: "c"})
	if e := bus.AsError(err); e.Code != ledger.PeerUnreachable {
		t.Errorf("send to a peer that closes in the handshake: %v, want peer_unreachable", err)
	}
}

// TestUnread: bytes a client sent but nobody read yet count as spoken (the kernel's receive
// buffer is asked), so a ClientHello waiting for a busy goroutine is not taken for silence.
func TestUnread(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c := dialFrom(t, "127.0.0.1", ln.Addr().String())
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := &pending{raw: &rawConn{Conn: s}}
	if p.heard() {
		t.Error("a connection that sent nothing was heard")
	}
	c.Write([]byte{0x16})
	waitFor(t, "the byte to be heard", p.heard)
	if p.quiet() {
		t.Error("heard, but still quiet")
	}
}

// TestReloadKubeletSwap: --fed-cert, --fed-key and --peers-file naming a Secret volume's
// links (name -> ..data/name, ..data -> ..<ts>) load, and the kubelet's swap of ..data is
// what the next reload applies.
func TestReloadKubeletSwap(t *testing.T) {
	a, b := newNode(t, "a"), newNode(t, "b")
	vol := t.TempDir()
	layout := func(ts, peers string) {
		os.Mkdir(filepath.Join(vol, ts), 0o755)
		for name, data := range map[string][]byte{"fed-cert": b.cert.CertPEM, "fed-key": b.cert.KeyPEM, "peers": []byte(peers)} {
			if err := os.WriteFile(filepath.Join(vol, ts, name), data, 0o400); err != nil {
				t.Fatal(err)
			}
			os.Symlink("..data/"+name, filepath.Join(vol, name)) // exists after the first
		}
		os.Symlink(ts, filepath.Join(vol, "..data_tmp"))
		if err := os.Rename(filepath.Join(vol, "..data_tmp"), filepath.Join(vol, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	layout("..2026_12_01_10_00_00.1", "{"+peerEntry("a", a.addr(), a.cert.Pin, `, "allow": ["send"]`)+"}")
	b.tune = func(c *Config) {
		c.CertPath, c.KeyPath, c.PeersPath = filepath.Join(vol, "fed-cert"), filepath.Join(vol, "fed-key"), filepath.Join(vol, "peers")
	}
	b.start("{}")
	if p, ok := b.n.st.Load().peers.Get("a"); !ok || !p.Allow["send"] || p.Allow["list"] {
		t.Fatalf("loaded through the kubelet's links: %+v %v", p, ok)
	}
	if changed, err := b.n.Reload(); changed || err != nil {
		t.Errorf("reload before the swap: %v %v", changed, err)
	}
	layout("..2026_12_01_11_00_00.2", "{"+peerEntry("a", a.addr(), a.cert.Pin, `, "allow": ["send", "list"]`)+"}")
	if changed, err := b.n.Reload(); !changed || err != nil {
		t.Fatalf("reload after the swap: %v %v", changed, err)
	}
	if p, _ := b.n.st.Load().peers.Get("a"); !p.Allow["list"] {
		t.Errorf("the swapped peers file was not applied: %+v", p)
	}
}

// TestEvictedSourceWeighsMore: among sources holding one silent pending connection each, the
// one that lost a connection to a newcomer within the handshake time is chosen to make room,
// even when another's connection is older: a flood that redials the moment it is evicted goes
// before a peer whose ClientHello is a moment late.
func TestEvictedSourceWeighsMore(t *testing.T) {
	now := time.Now()
	l := &listener{bySrc: map[netip.Addr]*queue{}, evictedAt: map[netip.Addr]time.Time{}}
	peer, flood := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	old := &pending{raw: &rawConn{Conn: c1}, key: peer, at: now.Add(-time.Second), in: true}
	young := &pending{raw: &rawConn{Conn: c2}, key: flood, at: now, in: true}
	l.bySrc[peer], l.bySrc[flood] = &queue{}, &queue{}
	l.bySrc[peer].push(old)
	l.bySrc[flood].push(young)
	if v := l.heaviest(now); v != old {
		t.Fatalf("without an eviction: victim %v, want the oldest silent one", v)
	}
	l.markEvicted(flood, now)
	if v := l.heaviest(now); v != young {
		t.Fatalf("the flood's source lost one just now: victim %v, want its connection", v)
	}
	if v := l.heaviest(now.Add(handshakeTime)); v != old {
		t.Fatalf("past the handshake time the weight is gone: victim %v, want the oldest", v)
	}
}

// tcpPair is a loopback TCP connection: the server's end (as the listener holds it) and the
// client's.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if server, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

// TestBusyHandshakeKept: a source at its share makes room with a handshake stalled by its
// client (its Read has waited over staleHandshake and nothing waits in the kernel), never with
// one slow because the hub is busy, however old: a fleet coming back at once would lose that
// work and do it again. Mutant tried: the old rule (the oldest, once staleHandshake old): red.
func TestBusyHandshakeKept(t *testing.T) {
	now := time.Now()
	mk := func(age time.Duration) (*pending, net.Conn) {
		s, c := tcpPair(t)
		p := &pending{raw: &rawConn{Conn: s}, at: now.Add(-age), in: true}
		p.raw.spoke.Store(true)
		return p, c
	}
	busy, _ := mk(10 * time.Second) // spoke; the hub is computing, no Read waits
	q := &queue{}
	q.push(busy)
	if v := pick(q, now); v != nil {
		t.Fatal("a handshake the hub is busy with was taken to make room")
	}
	answered, client := mk(2 * time.Second) // its Read has waited, but the client's bytes are there
	answered.raw.waitFrom.Store(now.Add(-2 * time.Second).UnixNano())
	answered.raw.inRead.Store(true)
	client.Write([]byte{0x16})
	waitFor(t, "the byte in the kernel", func() bool { return inq.Pending(answered.raw.Conn) })
	q.push(answered)
	if v := pick(q, now); v != nil {
		t.Fatal("a handshake whose client's bytes wait unread was taken to make room")
	}
	stalled, _ := mk(2 * time.Second) // its Read has waited 2 s for a silent client
	stalled.raw.waitFrom.Store(now.Add(-2 * time.Second).UnixNano())
	stalled.raw.inRead.Store(true)
	q.push(stalled)
	if v := pick(q, now); v != stalled {
		t.Fatalf("victim %v, want the handshake its client stalled", v)
	}
	l := &listener{bySrc: map[netip.Addr]*queue{netip.MustParseAddr("192.0.2.1"): q}, evictedAt: map[netip.Addr]time.Time{}}
	if v := l.heaviest(now); v != stalled {
		t.Fatalf("pool full: victim %v, want the handshake its client stalled", v)
	}
}

// TestEvictedSilentGivesTokenBack: a connection evicted before it sent a byte gives its
// handshake token back. A fleet behind one address whose connections keep being evicted
// while their ClientHellos are late (10,000 evictions at one instant, past the bucket's
// burst) still finds its tokens: the next connection starts its handshake at once. Mutant
// tried: no give-back on eviction: red.
func TestEvictedSilentGivesTokenBack(t *testing.T) {
	nd := &Node{}
	peers := &Peers{inbound: 10}
	nd.st.Store(&state{peers: peers})
	l := &listener{n: nd, cap: sizeCapacity(32, 0), bySrc: map[netip.Addr]*queue{}, buckets: map[netip.Addr]*hsBucket{},
		evictedAt: map[netip.Addr]time.Time{}}
	src := netip.MustParseAddr("192.0.2.1")
	now := time.Now()
	var held []net.Conn
	for range l.cap.srcShare(peers.inbound) {
		s, _ := tcpPair(t)
		held = append(held, s)
		if p, wait, victim, why := l.admit(s, src, now); p == nil || victim != nil || wait != 0 {
			t.Fatalf("filling the share: %v %v %v %s", p, wait, victim, why)
		}
	}
	_, burst := hsBudget(peers.inbound)
	s, _ := tcpPair(t)
	for i := range 10000 {
		p, wait, victim, why := l.admit(s, src, now)
		if p == nil || victim == nil || wait != 0 {
			t.Fatalf("eviction %d (burst %v): admitted %v, victim %v, wait %v %s; want a silent one evicted and the handshake at once",
				i, burst, p != nil, victim != nil, wait, why)
		}
	}
}

// TestNoSessionResumption: the listener issues no session tickets, so a peer's next
// connection is a full handshake that proves its key again, never one resumed on a ticket's
// memory of the certificate. Mutant tried: session tickets left on: red (a ticket arrived;
// none resumed even then, each handshake having a config, and so ticket keys, of its own).
func TestNoSessionResumption(t *testing.T) {
	hub, a := newNode(t, "hub"), newNode(t, "a")
	hub.start("{" + peerEntry("a", a.addr(), a.cert.Pin, `, "leaf": true`) + "}")
	pair, _ := tls.X509KeyPair(a.cert.CertPEM, a.cert.KeyPEM)
	cache := &ticketCount{ClientSessionCache: tls.NewLRUClientSessionCache(4)}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13,
		NextProtos: []string{"http/1.1"}, ClientSessionCache: cache}
	for i := range 2 {
		c, err := tls.Dial("tcp", hub.addr(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		// A request and its answer: a ticket, were one sent, has arrived by then.
		fmt.Fprintf(c, "GET /fed/v2/inbox?wait=0 HTTP/1.1\r\nHost: hub\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if c.ConnectionState().DidResume {
			t.Errorf("connection %d resumed a session", i+1)
		}
		c.Close()
	}
	if n := cache.puts.Load(); n != 0 {
		t.Errorf("%d session tickets received, want none", n)
	}
}

// ticketCount counts the session tickets a client is handed.
type ticketCount struct {
	tls.ClientSessionCache
	puts atomic.Int64
}

func (c *ticketCount) Put(key string, cs *tls.ClientSessionState) {
	if cs != nil {
		c.puts.Add(1)
	}
	c.ClientSessionCache.Put(key, cs)
}

// TestTrickledHandshakeStalls: a client that trickles its flight a byte at a time, each within
// staleHandshake, has still stalled its handshake once it has owed the flight that long: the
// wait counts from our last write, not from its last byte. Mutant tried: the wait counted
// from each Read: red.
func TestTrickledHandshakeStalls(t *testing.T) {
	s, c := tcpPair(t)
	p := &pending{raw: &rawConn{Conn: s}, at: time.Now(), in: true}
	go func() { // the handshake reading its client's record
		buf := make([]byte, 1)
		for {
			if _, err := p.raw.Read(buf); err != nil {
				return
			}
		}
	}()
	start := time.Now()
	for time.Since(start) < 3*staleHandshake {
		c.Write([]byte{0x16})
		for range 4 {
			time.Sleep(staleHandshake / 20)
			if p.stalled(time.Now()) {
				return
			}
		}
	}
	t.Fatalf("a client trickling a byte every %v never stalled its handshake in %v", staleHandshake/5, 3*staleHandshake)
}

// TestHandshakeCPUSlots: a handshake holds a CPU slot while it computes (from its client's
// bytes read until it waits for the client again), never while it waits; one whose bytes came
// while every slot is held waits for one. Mutant tried: no slot taken after a read: red.
func TestHandshakeCPUSlots(t *testing.T) {
	cpu := make(chan struct{}, 1)
	mk := func() (*rawConn, net.Conn) {
		s, c := tcpPair(t)
		return &rawConn{Conn: s, cpu: cpu, closed: make(chan struct{}), gone: make(chan struct{})}, c
	}
	a, ac := mk()
	b, bc := mk()
	buf := make([]byte, 1)
	ac.Write([]byte{1})
	if _, err := a.Read(buf); err != nil || !a.held {
		t.Fatalf("a read its client's byte: held %v, err %v; want the slot", a.held, err)
	}
	bc.Write([]byte{1})
	bRead := make(chan error, 1)
	go func() { _, err := b.Read(buf); bRead <- err }()
	select {
	case err := <-bRead:
		t.Fatalf("b went on computing while a held the only slot (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	aRead := make(chan error, 1)
	go func() { _, err := a.Read(make([]byte, 1)); aRead <- err }() // a waits for its client
	if err := <-bRead; err != nil || !b.held {
		t.Fatalf("b, once a waits for its client: held %v, err %v; want the slot", b.held, err)
	}
	b.handshakeDone()
	if b.held || len(cpu) != 0 || b.cpu != nil {
		t.Fatal("the slot not given back at the handshake's end")
	}
	a.Close() // a's wait ends; it takes no slot without its client's bytes
	<-aRead
	if a.held {
		t.Error("a closed connection took a slot")
	}
}
