package gate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/peercred"
)

// logBuffer collects JSON log lines from several goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

func newLogger() (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
	return slog.New(slog.NewJSONHandler(b, nil)), b
}

// serveEcho accepts on l until it is closed; every accepted connection is
// counted and gets its first line echoed back. The counter is the
// "handler was called" probe.
func serveEcho(t *testing.T, l net.Listener) *atomic.Int32 {
	t.Helper()
	var calls atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			calls.Add(1)
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				c.Write([]byte(line))
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
	})
	return &calls
}

// exchange writes a line to c and returns how many bytes came back before
// EOF or an error (a refused peer may see ECONNRESET instead of EOF).
func exchange(c net.Conn) int {
	defer c.Close()
	c.Write([]byte("ping\n"))
	n, _ := io.Copy(io.Discard, c)
	return int(n)
}

// pipeListener hands out in-memory connections: not *net.UnixConn.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (p *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-p.conns:
		return c, nil
	case <-p.closed:
		return nil, net.ErrClosed
	}
}

func (p *pipeListener) Close() error   { p.once.Do(func() { close(p.closed) }); return nil }
func (p *pipeListener) Addr() net.Addr { return &net.UnixAddr{Name: "pipe", Net: "unix"} }

func (p *pipeListener) dial() net.Conn {
	client, server := net.Pipe()
	p.conns <- server
	return client
}

func TestNonUnixConnsRefused(t *testing.T) {
	t.Run("tcp", func(t *testing.T) {
		tl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Skipf("no loopback TCP: %v", err)
		}
		log, logs := newLogger()
		calls := serveEcho(t, Listener(tl, 0, "tcp-test", log))
		for i := 0; i < 3; i++ {
			c, err := net.Dial("tcp", tl.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			if got := exchange(c); got != 0 {
				t.Errorf("refused TCP peer got %d bytes back, want 0", got)
			}
		}
		if got := calls.Load(); got != 0 {
			t.Errorf("handler called %d times for TCP peers, want 0", got)
		}
		lines := logs.lines(t)
		if len(lines) == 0 || lines[0]["reason"] != "not a unix socket" || lines[0]["socket"] != "tcp-test" {
			t.Errorf("log = %v, want a refusal naming the socket and reason", lines)
		}
	})
	t.Run("pipe", func(t *testing.T) {
		pl := newPipeListener()
		calls := serveEcho(t, Listener(pl, 0, "pipe-test", nil))
		// net.Pipe is synchronous: the write blocks until the gate closes
		// the other end, and then the read sees EOF.
		if got := exchange(pl.dial()); got != 0 {
			t.Errorf("refused pipe peer got %d bytes back, want 0", got)
		}
		if got := calls.Load(); got != 0 {
			t.Errorf("handler called %d times for a pipe peer, want 0", got)
		}
	})
}

func TestAcceptErrorReturned(t *testing.T) {
	pl := newPipeListener()
	l := Listener(pl, 0, "x", nil)
	l.Close()
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close = %v, want net.ErrClosed", err)
	}
	if got, want := l.Addr().String(), pl.Addr().String(); got != want {
		t.Errorf("Addr = %v, want %v", got, want)
	}
}

func TestCredOf(t *testing.T) {
	want := peercred.Cred{PID: 7, UID: 1000, GID: 100}
	if got, ok := CredOf(&Conn{Cred: want}); !ok || got != want {
		t.Errorf("CredOf(*Conn) = %+v, %v; want %+v, true", got, ok, want)
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got, ok := CredOf(a); ok {
		t.Errorf("CredOf(pipe) = %+v, true; want false", got)
	}
	if _, ok := CredOf(nil); ok {
		t.Error("CredOf(nil) = true, want false")
	}
	if _, ok := CredOf((*Conn)(nil)); ok {
		t.Error("CredOf((*Conn)(nil)) = true, want false")
	}
}

// TestRefusalLogRateLimited drives the limiter with a fake clock: within one
// second only the first refusal is logged; the next line carries the count.
func TestRefusalLogRateLimited(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	log, logs := newLogger()
	pl := newPipeListener()
	gl := Listener(pl, 0, "rl", log)
	gl.(*listener).lim.Now = func() time.Time { return time.Unix(0, clock.Load()) }
	serveEcho(t, gl)
	refuse := func(n int) {
		for i := 0; i < n; i++ {
			exchange(pl.dial()) // returns after the gate logged and closed
		}
	}
	refuse(5)
	clock.Add(int64(999 * time.Millisecond))
	refuse(1)
	clock.Add(int64(time.Millisecond))
	refuse(2)
	lines := logs.lines(t)
	if len(lines) != 2 {
		t.Fatalf("got %d log lines, want 2: %v", len(lines), lines)
	}
	for i, want := range []float64{0, 5} {
		if got := lines[i]["suppressed"]; got != want {
			t.Errorf("line %d suppressed = %v, want %v", i, got, want)
		}
		if got := lines[i]["msg"]; got != "peer refused" {
			t.Errorf("line %d msg = %v, want %q", i, got, "peer refused")
		}
	}
}
