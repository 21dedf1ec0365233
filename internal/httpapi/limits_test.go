package httpapi

import (
	"bufio"
	"context"
	"github.com/xmsg/xmsg/internal/inq"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/gate"
)

// serve runs NewServer(cfg) on a gated Unix socket behind Listener(lim) and returns its path.
func serve(t *testing.T, cfg Config, lim Limits) string {
	t.Helper()
	path, _ := serveL(t, cfg, lim)
	return path
}

// busyCount is the number of l's connections in a request.
func busyCount(l *limitListener) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, b := range l.busy {
		n += b
	}
	return n
}

// idleCount is the number of l's connections waiting for a request.
func idleCount(l *limitListener) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for c := range l.conns {
		if c.idle {
			n++
		}
	}
	return n
}

// waitBusy waits until l has n connections in a request.
func waitBusy(t *testing.T, l *limitListener, n int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); busyCount(l) != n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("busy connections: %d, want %d", busyCount(l), n)
		}
	}
}

// serveL is serve, also returning the Listener.
func serveL(t *testing.T, cfg Config, lim Limits) (string, *limitListener) {
	t.Helper()
	cfg.Log = slog.New(slog.DiscardHandler)
	cfg.Limits = lim
	if cfg.MaxBody == 0 {
		cfg.MaxBody = 1 << 16
	}
	dir, err := os.MkdirTemp("", "hl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "http.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(cfg)
	ll := Listener(gate.Listener(l, uint32(os.Geteuid()), "http", nil), lim, "http", nil).(*limitListener)
	go srv.Serve(ll)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return path, ll
}

// trickleUntilClosed writes a byte every 10 ms (at most 400 times) and reports whether the
// server ended the connection meanwhile.
func trickleUntilClosed(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, c); close(done) }()
	for range 400 {
		select {
		case <-done:
			return true
		default:
		}
		c.Write([]byte(" "))
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// TestBodyDeadline: a body trickled a byte every 10 ms is cut off at the body deadline.
// Mutant tried: Handler without bodyDeadline: never closed.
func TestBodyDeadline(t *testing.T) {
	path := serve(t, Config{}, Limits{BodyTimeout: 200 * time.Millisecond})
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("POST /v1/sessions/x/messages HTTP/1.1\r\nHost: l\r\nContent-Type: application/json\r\nContent-Length: 60000\r\n\r\n{"))
	if !trickleUntilClosed(c) {
		t.Fatal("a trickled body held the connection past the body deadline")
	}
}

// TestHeaderDeadline: headers trickled a byte at a time are cut off too.
func TestHeaderDeadline(t *testing.T) {
	path := serve(t, Config{}, Limits{HeaderTimeout: 200 * time.Millisecond})
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("GET /healthz HTTP/1.1\r\nX-Slow: "))
	if !trickleUntilClosed(c) {
		t.Fatal("trickled headers held the connection past the header deadline")
	}
}

// dialReq dials path and sends one request (GET /nope, a 404) without reading the answer.
func dialReq(t *testing.T, path string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte("GET /nope HTTP/1.1\r\nHost: l\r\n\r\n"))
	return c, bufio.NewReader(c)
}

// status reads one answer and returns its status code and body (0 for none: closed).
func status(r *bufio.Reader) (int, string) {
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return 0, err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// busyConn dials path and sends the first bytes of a request: a connection in a request,
// which cannot be evicted.
func busyConn(t *testing.T, path string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte("GET /nope HTTP/1.1\r\n"))
	return c, bufio.NewReader(c)
}

// TestEvictOldestIdle: over MaxConns the newest connection is served and the oldest idle
// keep-alive is closed to make room; a connection in a request is never the one closed.
func TestEvictOldestIdle(t *testing.T) {
	path, ll := serveL(t, Config{}, Limits{MaxConns: 3, MaxPerPID: 10})
	busy, br := busyConn(t, path) // the oldest, but busy
	waitBusy(t, ll, 1)
	waitIdle := func(n int) {
		for end := time.Now().Add(10 * time.Second); idleCount(ll) != n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("idle connections: %d, want %d", idleCount(ll), n)
			}
		}
	}
	idle1, r1 := dialReq(t, path)
	if code, _ := status(r1); code != 404 {
		t.Fatalf("idle1: %d", code)
	}
	waitIdle(1) // idle1 waits for its next request before idle2 does: it is the older idle
	idle2, r2 := dialReq(t, path)
	if code, _ := status(r2); code != 404 {
		t.Fatalf("idle2: %d", code)
	}
	waitIdle(2)
	_, r3 := dialReq(t, path)
	if code, body := status(r3); code != 404 {
		t.Fatalf("over MaxConns: %d %s, want served", code, body)
	}
	if _, err := r1.ReadByte(); err != io.EOF {
		t.Fatalf("the oldest idle connection: %v, want closed (EOF)", err)
	}
	idle2.Write([]byte("GET /nope HTTP/1.1\r\nHost: l\r\n\r\n"))
	if code, _ := status(r2); code != 404 {
		t.Fatalf("the younger idle connection: %d, want still served", code)
	}
	busy.Write([]byte("Host: l\r\n\r\n"))
	if code, _ := status(br); code != 404 {
		t.Fatalf("the busy connection: %d, want still served", code)
	}
	_ = idle1
}

// TestRefusedWhenNoneIdle: when every connection is in a request, the new one is answered 503
// naming the bound, and the answer is read whole (no reset). Mutant: answerAndClose without
// CloseWrite and drain: the client may see a reset instead.
func TestRefusedWhenNoneIdle(t *testing.T) {
	path, ll := serveL(t, Config{}, Limits{MaxConns: 2, MaxPerPID: 10})
	busyConn(t, path)
	busyConn(t, path)
	waitBusy(t, ll, 2)
	_, r := dialReq(t, path)
	code, body := status(r)
	if code != 503 || !strings.Contains(body, "too many connections on http (limit 2), none idle") {
		t.Fatalf("with none idle: %d %s, want 503 naming the bound", code, body)
	}
}

// TestBusyShare: one process has at most MaxPerPID requests in progress; the next is answered
// 503 naming the bound (not closed unread), and its other connections are not refused.
func TestBusyShare(t *testing.T) {
	path, ll := serveL(t, Config{}, Limits{MaxConns: 10, MaxPerPID: 2})
	busyConn(t, path)
	busyConn(t, path)
	waitBusy(t, ll, 2)
	_, r := dialReq(t, path)
	code, body := status(r)
	if code != 503 || !strings.Contains(body, "too many requests in progress from one process (limit 2)") {
		t.Fatalf("third request in progress of one process: %d %s, want 503 naming the bound", code, body)
	}
}

// TestRefusedIsEvictable: a connection answered 503 for its holder's requests in progress,
// still draining what its client sends, is the one closed for a newcomer when the pool is full,
// even with bytes waiting in its socket (which makes any other connection not idle): otherwise
// a slow-body attacker's refused connections, each draining while its bytes trickle in, can
// fill the pool on a busy machine, and every newcomer is refused.
func TestRefusedIsEvictable(t *testing.T) {
	l := Listener(nil, Limits{MaxConns: 2, MaxPerPID: 2}, "http", nil).(*limitListener)
	pair := func() (net.Conn, net.Conn) {
		ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		client, err := net.Dial("unix", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		server, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close(); server.Close() })
		return server, client
	}
	busyS, _ := pair()
	refusedS, refusedC := pair()
	busy := &limitConn{Conn: busyS, l: l, holder: 7, since: time.Now()}
	refused := &limitConn{Conn: refusedS, l: l, holder: 7, idle: true, since: time.Now(), closing: true}
	refusedC.Write([]byte("the rest of a slow body")) // waiting, unread, in the refused one's socket
	l.conns[busy], l.conns[refused] = struct{}{}, struct{}{}
	l.held[7], l.busy[7] = 2, 1
	for end := time.Now().Add(5 * time.Second); !inq.Pending(refusedS); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the bytes never showed as waiting")
		}
	}
	if v := l.victimLocked(); v != refused {
		t.Fatalf("victim %v, want the refused connection still draining", v)
	}
	// Positive control: not closing, the same connection with bytes waiting is not idle.
	refused.closing = false
	if v := l.victimLocked(); v != nil {
		t.Fatalf("victim %v, want none (the only idle one has bytes waiting)", v)
	}
	// Its holder at MaxPerPID requests in progress: its request would be refused at once, so
	// it is the one closed for a newcomer although its bytes wait.
	l.busy[7] = 2
	if v := l.victimLocked(); v != refused {
		t.Fatalf("holder at its bound: victim %v, want its connection whose request would be refused", v)
	}
}

// TestPoolOf64: one process with a pool of 64 keep-alive connections, each used in turn, is
// served on every one (it once got resets past 32).
func TestPoolOf64(t *testing.T) {
	path := serve(t, Config{}, Limits{})
	var pool []*bufio.Reader
	var conns []net.Conn
	for i := range 64 {
		c, r := dialReq(t, path)
		if code, body := status(r); code != 404 {
			t.Fatalf("connection %d: %d %s", i, code, body)
		}
		pool, conns = append(pool, r), append(conns, c)
	}
	for round := range 2 {
		for i, c := range conns {
			c.Write([]byte("GET /nope HTTP/1.1\r\nHost: l\r\n\r\n"))
			if code, body := status(pool[i]); code != 404 {
				t.Fatalf("round %d, connection %d: %d %s", round, i, code, body)
			}
		}
	}
}

// TestTCPPerConnection: on a PerConnection listener (TCP: no pid) every connection is its
// own holder, so one peer's requests in progress do not count against another's (they once
// all counted as "pid 0").
func TestTCPPerConnection(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(Config{Log: slog.New(slog.DiscardHandler), MaxBody: 1 << 16})
	ll := Listener(l, Limits{MaxConns: 10, MaxPerPID: 1, PerConnection: true}, "tcp", nil).(*limitListener)
	go srv.Serve(ll)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("GET /nope HTTP/1.1\r\n")) // in a request
		held = append(held, c)
	}
	waitBusy(t, ll, 3)
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte("GET /nope HTTP/1.1\r\nHost: l\r\n\r\n"))
	if code, body := status(bufio.NewReader(c)); code != 404 {
		t.Fatalf("a TCP client beside 3 others in a request: %d %s, want served", code, body)
	}
}
