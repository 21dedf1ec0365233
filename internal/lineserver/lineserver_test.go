package lineserver_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/gate"
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

// holding makes a "hold" line of the next echo server waits for before it
// is echoed (a connection being answered, not idle); it is closed when the test ends, before
// the server's shutdown.
func holding(t *testing.T) {
	release := make(chan struct{})
	hold = release
	t.Cleanup(func() { hold = nil })
	cleanupFirst = func() { close(release) }
}

var (
	hold         chan struct{}
	cleanupFirst func()
	// slowStart delays each connection's first read, as a server busy accepting a flood
	// would: its client's first frame then waits, unread, in the socket.
	slowStart time.Duration
)

// echoCfg is echo with more of the Config; the line "attest" is answered "attested" or "full"
// (lineserver.Attest) instead of being echoed, and "hold" is echoed once hold is closed.
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
	h, delay := hold, slowStart
	cfg.Handle = func(c net.Conn, p lineserver.Peer) {
		time.Sleep(delay)
		r := s.NewReader(c, 64, "line")
		for s.ArmRead(c, wait) {
			line, _, err := r.Next()
			if err != nil {
				s.Answer(c, p.Actor, "frame", err)
				return
			}
			switch string(line) {
			case "attest":
				line = []byte("full")
				if s.Attest(c) {
					line = []byte("attested")
				}
			case "hold":
				<-h
			}
			if !s.Write(c, append(line, '\n')) {
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
	release := cleanupFirst
	cleanupFirst = nil
	t.Cleanup(func() {
		if release != nil {
			release()
		}
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

// TestMaxConns: a limit that is not positive serves nothing (fails closed), and says so with an
// error frame; over a positive one the newest connection is served and the oldest idle one is
// told it was closed to make room (an error frame, never a silent close), with the eviction
// logged.
func TestMaxConns(t *testing.T) {
	for _, maxConns := range []int{-1, 0, 1, 3} {
		s, path, logs := echo(t, maxConns, true)
		if maxConns <= 0 {
			c, r := dial(t, path)
			if got, _ := call(t, c, r, "hi"); !strings.Contains(got, `"error":"service_unavailable"`) {
				t.Fatalf("MaxConns %d: got %q, want a service_unavailable frame", maxConns, got)
			}
			if !strings.Contains(logs(), `reason="too many connections"`) {
				t.Fatalf("MaxConns %d: refusal not logged:\n%s", maxConns, logs())
			}
			continue
		}
		var held []net.Conn
		var readers []*bufio.Reader
		for i := 0; i < maxConns; i++ {
			c, r := dial(t, path)
			if got, eof := call(t, c, r, "hi"); eof || got != "hi" {
				t.Fatalf("MaxConns %d, connection %d: got %q (eof %v), want %q", maxConns, i+1, got, eof, "hi")
			}
			held, readers = append(held, c), append(readers, r)
		}
		waitFor(t, func() bool { return s.Idle() == maxConns })
		c, r := dial(t, path)
		if got, eof := call(t, c, r, "hi"); eof || got != "hi" {
			t.Fatalf("MaxConns %d, connection %d: got %q (eof %v), want it served", maxConns, maxConns+1, got, eof)
		}
		held[0].SetDeadline(time.Now().Add(wait))
		got, err := readers[0].ReadString('\n')
		if err != nil || !strings.Contains(got, `"error":"service_unavailable"`) || !strings.Contains(got, "to make room") {
			t.Fatalf("MaxConns %d: the oldest idle connection got %q (%v), want the eviction frame", maxConns, got, err)
		}
		waitFor(t, func() bool { return s.Conns() == maxConns })
		if !strings.Contains(logs(), `reason="evicted to make room"`) {
			t.Fatalf("MaxConns %d: eviction not logged:\n%s", maxConns, logs())
		}
	}
}

// waitFor polls cond until it holds (or fails the test after wait).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(wait); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("condition never held")
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
	if got, _ := call(t, c, r, fits+"x"); got != `{"status":"error","error":"payload_too_large","detail":"line exceeds 64 bytes"}` {
		t.Fatalf("line of 65 bytes: got %q, want the payload_too_large frame", got)
	}
	if got, err := r.ReadString('\n'); err == nil {
		t.Fatalf("after the refusal: got %q, want closed", got)
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
	// The pending pool is full: the next connection is served, and the oldest idle pending
	// one (never an attested one) makes room.
	c, r := dial(t, path)
	if got, eof := call(t, c, r, "hi"); eof || got != "hi" {
		t.Fatalf("over the pending pool: got %q (eof %v), want served", got, eof)
	}
	waitFor(t, func() bool { return s.Conns() == 4 && s.Attested() == 2 })
	if !strings.Contains(logs(), `reason="evicted to make room"`) {
		t.Fatalf("eviction not logged:\n%s", logs())
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

// TestPerPIDShare: one process cannot hold more than MaxPerPID attested connections, however
// many slots are free; its unattested connections are not refused for it. (Every connection
// here comes from this test's pid.)
func TestPerPIDShare(t *testing.T) {
	s, path, logs := echoCfg(t, lineserver.Config{MaxConns: 10, MaxPending: 10, MaxPerPID: 3}, true)
	for i := range 3 {
		c, r := dial(t, path)
		if got, eof := call(t, c, r, "attest"); eof || got != "attested" {
			t.Fatalf("connection %d: got %q (eof %v)", i, got, eof)
		}
	}
	c, r := dial(t, path)
	if got, eof := call(t, c, r, "hi"); eof || got != "hi" {
		t.Fatalf("connection 4 of one pid, unattested: got %q (eof %v), want served", got, eof)
	}
	if got, _ := call(t, c, r, "attest"); got != "full" {
		t.Fatalf("attested connection 4 of one pid: got %q, want full", got)
	}
	if s.Attested() != 3 || !strings.Contains(logs(), `reason="too many attested connections from one process"`) {
		t.Fatalf("attested %d; log:\n%s", s.Attested(), logs())
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

// TestEvictionSparesBusy: only an idle connection makes room. One being answered is never
// evicted, even when it is the oldest; when none is idle the newest is refused, and told so
// with an error frame.
func TestEvictionSparesBusy(t *testing.T) {
	holding(t)
	s, path, logs := echoCfg(t, lineserver.Config{MaxConns: 4, MaxPending: 2}, true)
	busy, _ := dial(t, path)
	busy.Write([]byte("hold\n"))
	idle, ir := dial(t, path)
	if got, _ := call(t, idle, ir, "hi"); got != "hi" {
		t.Fatalf("idle: got %q", got)
	}
	waitFor(t, func() bool { return s.Conns() == 2 && s.Idle() == 1 })
	// Full: the newest is served, the idle one (not the older busy one) makes room.
	fresh, fr := dial(t, path)
	if got, eof := call(t, fresh, fr, "hi"); eof || got != "hi" {
		t.Fatalf("fresh: got %q (eof %v), want served", got, eof)
	}
	idle.SetDeadline(time.Now().Add(wait))
	if got, err := ir.ReadString('\n'); err != nil || !strings.Contains(got, "to make room") {
		t.Fatalf("idle: got %q (%v), want the eviction frame", got, err)
	}
	// Now make the fresh one busy too: nothing is idle, so the next is refused with a frame.
	fresh.Write([]byte("hold\n"))
	waitFor(t, func() bool { return s.Conns() == 2 && s.Idle() == 0 })
	last, lr := dial(t, path)
	last.SetDeadline(time.Now().Add(wait))
	got, _ := lr.ReadString('\n')
	if !strings.Contains(got, `"error":"service_unavailable"`) || !strings.Contains(got, "none idle") {
		t.Fatalf("with no idle connection: got %q, want the refusal frame", got)
	}
	if !strings.Contains(logs(), `reason="too many connections"`) {
		t.Fatalf("refusal not logged:\n%s", logs())
	}
}

// TestMain runs the test binary as a holder process when asked (see holder).
func TestMain(m *testing.M) {
	if spec := os.Getenv("LINESERVER_HOLDER"); spec != "" {
		holderMain(spec)
		return
	}
	os.Exit(m.Run())
}

// holderMain dials n connections to path ("path n"), has each answered once, says "ready",
// then prints "<i>: <line>" for each further line a connection gets, until stdin closes.
func holderMain(spec string) {
	path, nStr, _ := strings.Cut(spec, " ")
	n, _ := strconv.Atoi(nStr)
	for i := range n {
		c, err := net.Dial("unix", path)
		if err != nil {
			fmt.Println("dial:", err)
			os.Exit(1)
		}
		r := bufio.NewReader(c)
		c.Write([]byte("hi\n"))
		if _, err := r.ReadString('\n'); err != nil {
			fmt.Println("read:", err)
			os.Exit(1)
		}
		go func() {
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				fmt.Printf("%d: %s", i, line)
			}
		}()
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
}

// holder starts a process of its own (another peer pid) holding n idle connections to path;
// lines returns what they were sent since.
func holder(t *testing.T, path string, n int) (lines *bufio.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "LINESERVER_HOLDER="+path+" "+strconv.Itoa(n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	lines = bufio.NewReader(out)
	if got, err := lines.ReadString('\n'); got != "ready\n" {
		t.Fatalf("holder: got %q (%v), want ready", got, err)
	}
	return lines
}

// TestEvictsHeaviestHolder: the connection that makes room is the oldest idle one of the
// process holding the most, not the oldest overall: one process holding many idle
// connections cannot push out another's single one.
func TestEvictsHeaviestHolder(t *testing.T) {
	s, path, _ := echoCfg(t, lineserver.Config{MaxConns: 4, MaxPending: 3}, true)
	mine, mr := dial(t, path)
	if got, _ := call(t, mine, mr, "hi"); got != "hi" {
		t.Fatalf("mine: got %q", got)
	}
	lines := holder(t, path, 2)
	waitFor(t, func() bool { return s.Idle() == 3 })
	fresh, fr := dial(t, path)
	if got, _ := call(t, fresh, fr, "hi"); got != "hi" {
		t.Fatalf("fresh: got %q, want served", got)
	}
	if got, eof := call(t, mine, mr, "hi"); eof || got != "hi" {
		t.Fatalf("the oldest connection, of the lighter process: got %q (eof %v), want still served", got, eof)
	}
	if got, err := lines.ReadString('\n'); err != nil || !strings.HasPrefix(got, "0: ") || !strings.Contains(got, "to make room") {
		t.Fatalf("holder: got %q (%v), want its oldest connection evicted", got, err)
	}
	if n := s.Evictions(); n != 1 {
		t.Errorf("Evictions() = %d after one eviction (the metrics' count)", n)
	}
}

// TestBlankLinesDoNotMakeYounger: the oldest idle connection makes room even when it keeps
// sending blank lines; they move neither its deadline nor its place in the eviction order.
func TestBlankLinesDoNotMakeYounger(t *testing.T) {
	s, path, _ := echoCfg(t, lineserver.Config{MaxConns: 4, MaxPending: 2}, true)
	old, or := dial(t, path)
	if got, _ := call(t, old, or, "hi"); got != "hi" {
		t.Fatalf("old: got %q", got)
	}
	young, yr := dial(t, path)
	if got, _ := call(t, young, yr, "hi"); got != "hi" {
		t.Fatalf("young: got %q", got)
	}
	// The old one now sends blank lines. The pause lets the server read them (if it had not
	// yet, this test could not tell the mutant apart, but it would not fail for that).
	for range 3 {
		old.Write([]byte("\n"))
	}
	time.Sleep(20 * time.Millisecond)
	waitFor(t, func() bool { return s.Idle() == 2 })
	fresh, fr := dial(t, path)
	if got, _ := call(t, fresh, fr, "hi"); got != "hi" {
		t.Fatalf("fresh: got %q", got)
	}
	if got, eof := call(t, young, yr, "hi"); eof || got != "hi" {
		t.Fatalf("the younger silent connection: got %q (eof %v), want still served", got, eof)
	}
	old.SetDeadline(time.Now().Add(wait))
	if got, err := or.ReadString('\n'); err != nil || !strings.Contains(got, "to make room") {
		t.Fatalf("the older blank-line sender: got %q (%v), want the eviction frame", got, err)
	}
}

// TestSpokenIsNotIdle: a connection whose first frame is in its socket, not yet read (its
// goroutine is slow to start), is not evicted for a newer one, even when it is the only
// candidate: the newer one is refused instead. Mutant: no inq.Pending check: red (the
// spoken connection gets the eviction frame).
func TestSpokenIsNotIdle(t *testing.T) {
	slowStart = 300 * time.Millisecond
	t.Cleanup(func() { slowStart = 0 })
	_, path, _ := echoCfg(t, lineserver.Config{MaxConns: 4, MaxPending: 1}, true)
	spoken, sr := dial(t, path)
	spoken.Write([]byte("hi\n"))
	time.Sleep(50 * time.Millisecond) // the bytes reach its socket; its first read is still far off
	late, lr := dial(t, path)
	late.SetDeadline(time.Now().Add(wait))
	if got, _ := lr.ReadString('\n'); !strings.Contains(got, "none idle") {
		t.Fatalf("the newer connection: got %q, want refused (none idle)", got)
	}
	spoken.SetDeadline(time.Now().Add(wait))
	if got, err := sr.ReadString('\n'); got != "hi\n" {
		t.Fatalf("the connection that had spoken: got %q (%v), want its frame answered", got, err)
	}
}

// TestChatterPastGraceIsIdle: bytes waiting unread spare a connection only for spokenGrace
// after its connect (or last frame): one that has held its place longer with bytes still
// waiting (blank lines a loaded server has not read yet) is the one closed for a newcomer.
func TestChatterPastGraceIsIdle(t *testing.T) {
	slowStart = 1800 * time.Millisecond // its first read comes after the grace has passed
	t.Cleanup(func() { slowStart = 0 })
	_, path, _ := echoCfg(t, lineserver.Config{MaxConns: 4, MaxPending: 1}, true)
	holder, hr := dial(t, path)
	holder.Write([]byte("\n\n\n"))
	time.Sleep(1200 * time.Millisecond) // past spokenGrace (1 s), before its first read
	late, lr := dial(t, path)
	late.Write([]byte("hi\n"))
	holder.SetDeadline(time.Now().Add(wait))
	if got, _ := hr.ReadString('\n'); !strings.Contains(got, "to make room") {
		t.Fatalf("the holder past its grace: got %q, want the eviction frame", got)
	}
	late.SetDeadline(time.Now().Add(wait))
	if got, err := lr.ReadString('\n'); got != "hi\n" {
		t.Fatalf("the newcomer: got %q (%v), want its frame answered", got, err)
	}
}

// TestFloodShareIsIdle: a process holding more than a quarter of the pending pool is a flood,
// so its connections make room for a newcomer even while young and with bytes waiting unread
// (blank lines sent the moment they connect, on a server too loaded to read them yet).
func TestFloodShareIsIdle(t *testing.T) {
	slowStart = 1800 * time.Millisecond // no first read before the newcomer comes
	t.Cleanup(func() { slowStart = 0 })
	_, path, _ := echoCfg(t, lineserver.Config{MaxConns: 8, MaxPending: 4}, true)
	var holders []*bufio.Reader
	for range 4 {
		c, r := dial(t, path)
		c.Write([]byte("\n"))
		c.SetDeadline(time.Now().Add(wait))
		holders = append(holders, r)
	}
	time.Sleep(100 * time.Millisecond) // their bytes are in their sockets
	late, lr := dial(t, path)
	late.Write([]byte("hi\n"))
	late.SetDeadline(time.Now().Add(wait))
	if got, err := lr.ReadString('\n'); got != "hi\n" {
		t.Fatalf("the newcomer beside a process holding the whole pool: got %q (%v), want its frame answered", got, err)
	}
	if got, _ := holders[0].ReadString('\n'); !strings.Contains(got, "to make room") {
		t.Errorf("the oldest holder: got %q, want the eviction frame", got)
	}
}

// TestReadAheadUntil: ReadAhead's until is told the frames waiting ahead, before each read
// and after each read that brought bytes, and ends the read-ahead when it reports true; what
// was read ahead is Next's, in order. Without it (or while it reports false) the read-ahead
// ends at the read deadline.
func TestReadAheadUntil(t *testing.T) {
	s := lineserver.New(lineserver.Config{Socket: "test"})
	srv, cli := net.Pipe()
	defer srv.Close()
	defer cli.Close()
	r := s.NewReader(srv, 1024, "frame")
	go func() {
		cli.Write([]byte("one\n"))
		cli.Write([]byte("two\nthr"))
	}()
	var seen []int
	srv.SetReadDeadline(time.Now().Add(wait))
	if err := r.ReadAhead(16, 1<<16, func(lines int) bool {
		seen = append(seen, lines)
		return lines >= 2
	}); err != nil {
		t.Fatalf("ReadAhead: %v", err)
	}
	if len(seen) == 0 || seen[0] != 0 || seen[len(seen)-1] != 2 {
		t.Fatalf("until was told %v, want from 0 up to 2 frames", seen)
	}
	go cli.Write([]byte("ee\n"))
	for _, want := range []string{"one", "two", "three"} {
		line, _, err := r.Next()
		if err != nil || string(line) != want {
			t.Fatalf("Next: %q %v, want %q", line, err, want)
		}
	}
	srv.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	if err := r.ReadAhead(16, 1<<16, func(int) bool { return false }); err != nil {
		t.Fatalf("ReadAhead to its deadline: %v, want nil", err)
	}
}
