package httpapi

import (
	"bufio"
	"context"
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
	go srv.Serve(Listener(gate.Listener(l, uint32(os.Geteuid()), "http", nil), lim, "http", nil))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return path
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

// TestConnectionShares: one process gets MaxPerPID connections, the next is closed unread;
// a closed one frees its place.
func TestConnectionShares(t *testing.T) {
	path := serve(t, Config{}, Limits{MaxConns: 10, MaxPerPID: 2})
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	// The server accepts in order: a request on each proves both are in.
	for _, c := range held {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte("GET /nope HTTP/1.1\r\nHost: l\r\n\r\n"))
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 404 {
			t.Fatalf("held connection: %v %v", resp, err)
		}
	}
	extra, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	extra.SetDeadline(time.Now().Add(5 * time.Second))
	extra.Write([]byte("GET /nope HTTP/1.1\r\nHost: l\r\n\r\n"))
	if b, _ := io.ReadAll(extra); len(b) != 0 {
		t.Fatalf("connection 3 of one process got %q, want it closed unread", b)
	}
	held[0].Close()
	for i := 0; ; i++ {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte("GET /nope HTTP/1.1\r\nHost: l\r\n\r\n"))
		b, _ := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if strings.HasPrefix(b, "HTTP/1.1 404") {
			break
		}
		if i > 200 {
			t.Fatal("a closed connection never gave its place back")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
