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
	return echoCfg(t, lineserver.Config{MaxConns: maxConns}, gated)
}

// echoCfg is echo with more of the Config; the line "attest" is answered "attested" or "full"
// (lineserver.Attest) instead of being echoed.
func echoCfg(t *testing.T, cfg lineserver.Config, gated bool) (s *lineserver.Server, path string, logs func() string) {
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
	cfg.Socket, cfg.Log = "echo", log
	cfg.Handle = func(c net.Conn, p lineserver.Peer) {
		r := bufio.NewReader(c)
		for s.ArmRead(c, wait) {
			line, err := jsonline.ReadLine(r, 64)
			if err == nil && string(line) == "attest" {
				line = []byte("full")
				if s.Attest(c) {
					line = []byte("attested")
				}
			}
			if err != nil || !s.Write(c, append(line, '\n')) {
				return
			}
		}
	}
	s = lineserver.New(cfg)
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

// TestPendingPoolAndAttestedSlots: unattested connections have a pool of their own, so holding
// every one of them keeps no attested client out, and an attested connection frees its
// pending place.
func TestPendingPoolAndAttestedSlots(t *testing.T) {
	s, path, logs := echoCfg(t, lineserver.Config{MaxConns: 2, MaxPending: 2}, true)
	// Two attested connections, then two held unattested: all four are served.
	for i := range 2 {
		c, r := dial(t, path)
		if got, _ := call(t, c, r, "attest"); got != "attested" {
			t.Fatalf("attest %d: got %q", i, got)
		}
	}
	for i := range 2 {
		c, r := dial(t, path)
		if got, eof := call(t, c, r, "hi"); eof || got != "hi" {
			t.Fatalf("pending %d: got %q (eof %v)", i, got, eof)
		}
	}
	if s.Conns() != 4 || s.Attested() != 2 {
		t.Fatalf("conns %d attested %d, want 4 and 2", s.Conns(), s.Attested())
	}
	// The pending pool is full: the next connection is closed unread.
	c, r := dial(t, path)
	if got, eof := call(t, c, r, "hi"); !eof {
		t.Fatalf("over the pending pool: got %q, want closed", got)
	}
	if !strings.Contains(logs(), `reason="too many connections"`) {
		t.Fatalf("refusal not logged:\n%s", logs())
	}
}

// TestAttestedSlotsFull: a connection asking for an attested slot when all are taken is told so.
func TestAttestedSlotsFull(t *testing.T) {
	_, path, logs := echoCfg(t, lineserver.Config{MaxConns: 1, MaxPending: 4}, true)
	c, r := dial(t, path)
	if got, _ := call(t, c, r, "attest"); got != "attested" {
		t.Fatalf("first attest: got %q", got)
	}
	c2, r2 := dial(t, path)
	if got, _ := call(t, c2, r2, "attest"); got != "full" {
		t.Fatalf("second attest: got %q, want full", got)
	}
	if !strings.Contains(logs(), `reason="too many attested connections"`) {
		t.Fatalf("refusal not logged:\n%s", logs())
	}
}

// TestPerPIDShare: one process cannot hold more than MaxPerPID connections, however many
// slots are free. (Every connection here comes from this test's pid.)
func TestPerPIDShare(t *testing.T) {
	s, path, logs := echoCfg(t, lineserver.Config{MaxConns: 10, MaxPending: 10, MaxPerPID: 3}, true)
	for i := range 3 {
		c, r := dial(t, path)
		if got, eof := call(t, c, r, "hi"); eof || got != "hi" {
			t.Fatalf("connection %d: got %q (eof %v)", i, got, eof)
		}
	}
	c, r := dial(t, path)
	if got, eof := call(t, c, r, "hi"); !eof {
		t.Fatalf("connection 4 of one pid: got %q, want closed", got)
	}
	if s.Conns() != 3 || !strings.Contains(logs(), `reason="too many connections from one process"`) {
		t.Fatalf("conns %d; log:\n%s", s.Conns(), logs())
	}
}

// TestPendingDeadlineIsNotExtended: an unattested connection that keeps sending lines (each
// re-arms the protocol's deadline) is still closed at the end of its unattested phase, and an
// attested one is not.
func TestPendingDeadlineIsNotExtended(t *testing.T) {
	_, path, _ := echoCfg(t, lineserver.Config{MaxConns: 4, PendingTimeout: 300 * time.Millisecond}, true)
	pending, pr := dial(t, path)
	attested, ar := dial(t, path)
	if got, _ := call(t, attested, ar, "attest"); got != "attested" {
		t.Fatalf("attest: got %q", got)
	}
	closed := false
	for i := 0; i < 400 && !closed; i++ {
		_, closed = call(t, pending, pr, "hi")
		time.Sleep(10 * time.Millisecond)
	}
	if !closed {
		t.Fatal("an unattested connection sending a line every 10ms was never closed")
	}
	if got, eof := call(t, attested, ar, "hi"); eof || got != "hi" {
		t.Fatalf("attested connection: got %q (eof %v), want served", got, eof)
	}
}
