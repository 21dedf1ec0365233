package lineserver_test

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/gate"
	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/lineserver"
)

// wait bounds every wait for something that must happen; nothing asserts on durations.
const wait = 20 * time.Second

// echo starts a server whose protocol answers every line with itself. gated false serves a
// plain listener, whose connections carry no peer credentials. logs returns everything the
// server logged so far.
func echo(t *testing.T, maxConns int, gated bool) (s *lineserver.Server, path string, logs func() string) {
	t.Helper()
	// A file, not a buffer: each log line is one write(2), and reading it back while the
	// server logs is no data race.
	logPath := filepath.Join(t.TempDir(), "log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	logs = func() string {
		b, err := os.ReadFile(logPath)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	log := slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s = lineserver.New(lineserver.Config{Socket: "echo", Log: log, MaxConns: maxConns,
		Handle: func(c net.Conn, p lineserver.Peer) {
			r := bufio.NewReader(c)
			for s.ArmRead(c, wait) {
				line, err := jsonline.ReadLine(r, 64)
				if err != nil || !s.Write(c, append(line, '\n')) {
					return
				}
			}
		}})
	path = filepath.Join(t.TempDir(), "echo.sock")
	var l net.Listener
	l, err = net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	if gated {
		l = gate.Listener(l, uint32(os.Geteuid()), "echo", log)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; err != net.ErrClosed {
			t.Errorf("Serve: got %v, want net.ErrClosed", err)
		}
	})
	return s, path, logs
}

// call writes line and returns the answer, or eof when the server closed the connection.
func call(t *testing.T, c net.Conn, r *bufio.Reader, line string) (string, bool) {
	t.Helper()
	c.SetDeadline(time.Now().Add(wait))
	c.Write([]byte(line + "\n")) // may fail: the server may have closed it already
	got, err := r.ReadString('\n')
	if err != nil {
		return "", true
	}
	return strings.TrimSuffix(got, "\n"), false
}

func dial(t *testing.T, path string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// TestMaxConns: connections beyond MaxConns are closed unanswered and the refusal logged; a
// limit that is not positive serves nothing (fails closed).
func TestMaxConns(t *testing.T) {
	for _, maxConns := range []int{-1, 0, 1, 3} {
		s, path, logs := echo(t, maxConns, true)
		served := max(maxConns, 0)
		for i := 0; i < served; i++ {
			c, r := dial(t, path)
			if got, eof := call(t, c, r, "hi"); eof || got != "hi" {
				t.Fatalf("MaxConns %d, connection %d: got %q (eof %v), want %q", maxConns, i+1, got, eof, "hi")
			}
		}
		c, r := dial(t, path)
		if got, eof := call(t, c, r, "hi"); !eof {
			t.Fatalf("MaxConns %d, connection %d: got %q, want it closed", maxConns, served+1, got)
		}
		if got := s.Conns(); got != served {
			t.Fatalf("MaxConns %d: Conns got %d, want %d", maxConns, got, served)
		}
		if !strings.Contains(logs(), `reason="too many connections"`) {
			t.Fatalf("MaxConns %d: refusal not logged:\n%s", maxConns, logs())
		}
	}
}

// TestUngated: a connection that did not come through the gate has no peer credentials and is
// closed unanswered.
func TestUngated(t *testing.T) {
	_, path, logs := echo(t, 4, false)
	c, r := dial(t, path)
	if got, eof := call(t, c, r, "hi"); !eof {
		t.Fatalf("got %q, want closed", got)
	}
	if !strings.Contains(logs(), `reason="no peer credentials"`) {
		t.Fatalf("refusal not logged:\n%s", logs())
	}
}

// TestLineCap: a line over the limit ends the connection; one at the limit is served.
func TestLineCap(t *testing.T) {
	_, path, _ := echo(t, 4, true)
	c, r := dial(t, path)
	fits := strings.Repeat("x", 64)
	if got, eof := call(t, c, r, fits); eof || got != fits {
		t.Fatalf("line of 64 bytes: got %q (eof %v), want it echoed", got, eof)
	}
	if got, eof := call(t, c, r, fits+"x"); !eof {
		t.Fatalf("line of 65 bytes: got %q, want closed", got)
	}
}
