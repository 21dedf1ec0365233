package notify

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// listen opens a datagram socket standing in for systemd's notify socket.
func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// recv reads one datagram. A datagram sent on a local socket is queued
// before the send returns, so it is already there; the deadline only keeps a
// broken test from hanging.
func recv(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

func TestMessagesArrive(t *testing.T) {
	tests := []struct {
		name     string
		listenAt func(t *testing.T) (listen, env string)
	}{
		{name: "path", listenAt: func(t *testing.T) (string, string) {
			p := filepath.Join(t.TempDir(), "notify")
			return p, p
		}},
		{name: "abstract", listenAt: func(t *testing.T) (string, string) {
			a := "@xmsg-notify-test-" + strconv.Itoa(os.Getpid()) + "-" + t.Name()
			return a, a
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at, env := tt.listenAt(t)
			l := listen(t, at)
			t.Setenv("NOTIFY_SOCKET", env)
			n, err := Open()
			if err != nil {
				t.Fatalf("Open() = %v", err)
			}
			defer n.Close()
			if v, ok := os.LookupEnv("NOTIFY_SOCKET"); ok {
				t.Errorf("NOTIFY_SOCKET=%q after Open; want unset so children do not inherit it", v)
			}
			if !n.Enabled() {
				t.Fatal("Enabled() = false; want true")
			}
			steps := []struct {
				send func() error
				want string
			}{
				{n.Ready, "READY=1"},
				{func() error { return n.Status("sessions=3 queued=0") }, "STATUS=sessions=3 queued=0"},
				// A newline would start a second assignment.
				{func() error { return n.Status("ok\nREADY=1\r\x00x") }, "STATUS=ok READY=1  x"},
				{n.Watchdog, "WATCHDOG=1"},
				{n.Stopping, "STOPPING=1"},
			}
			for _, s := range steps {
				if err := s.send(); err != nil {
					t.Fatalf("send %q: %v", s.want, err)
				}
				if got := recv(t, l); got != s.want {
					t.Errorf("got %q; want %q", got, s.want)
				}
			}
		})
	}
}

// TestSendsUseTheOpenConnection: after Open the notify socket's path may
// become unreachable (here: removed; in the daemon: outside the sandbox).
// Messages still arrive, because Open connected once and sends reuse it.
func TestSendsUseTheOpenConnection(t *testing.T) {
	p := filepath.Join(t.TempDir(), "notify")
	l := listen(t, p)
	t.Setenv("NOTIFY_SOCKET", p)
	n, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := n.Ready(); err != nil {
		t.Fatalf("Ready() after the path is gone = %v; want nil", err)
	}
	if got := recv(t, l); got != "READY=1" {
		t.Errorf("got %q; want READY=1", got)
	}
}

func TestOpenErrors(t *testing.T) {
	tests := []struct {
		name string
		env  string
	}{
		{name: "missing socket", env: filepath.Join(t.TempDir(), "absent")},
		{name: "relative path", env: "notify.sock"},
		{name: "vsock address", env: "vsock:2:1234"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("NOTIFY_SOCKET", tt.env)
			n, err := Open()
			if err == nil {
				n.Close()
				t.Fatalf("Open() with NOTIFY_SOCKET=%q = nil error; want an error", tt.env)
			}
			if n != nil {
				t.Errorf("Open() = %v with error; want nil notifier", n)
			}
		})
	}
}

func TestUnsetIsANoOp(t *testing.T) {
	for _, set := range []bool{false, true} {
		if set {
			t.Setenv("NOTIFY_SOCKET", "")
		} else {
			t.Setenv("NOTIFY_SOCKET", "x")
			os.Unsetenv("NOTIFY_SOCKET")
		}
		n, err := Open()
		if n != nil || err != nil {
			t.Fatalf("Open() = %v, %v; want nil, nil", n, err)
		}
		assertNoOp(t, n)
	}
}

func TestNilNotifier(t *testing.T) {
	var n *Notifier
	assertNoOp(t, n)
}

// TestClosedIsANoOp: a watchdog goroutine may still tick after shutdown
// closed the notifier; that must neither fail nor write to a closed fd.
func TestClosedIsANoOp(t *testing.T) {
	p := filepath.Join(t.TempDir(), "notify")
	listen(t, p)
	t.Setenv("NOTIFY_SOCKET", p)
	n, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	assertNoOp(t, n)
}

func assertNoOp(t *testing.T, n *Notifier) {
	t.Helper()
	if n.Enabled() {
		t.Error("Enabled() = true; want false")
	}
	for name, f := range map[string]func() error{
		"Ready": n.Ready, "Stopping": n.Stopping, "Watchdog": n.Watchdog,
		"Status": func() error { return n.Status("x") }, "Close": n.Close,
	} {
		if err := f(); err != nil {
			t.Errorf("%s() = %v; want nil (no-op)", name, err)
		}
	}
}

// TestConcurrentUse: watchdog pings and status updates come from different
// goroutines while shutdown closes (run with -race).
func TestConcurrentUse(t *testing.T) {
	p := filepath.Join(t.TempDir(), "notify")
	l := listen(t, p)
	t.Setenv("NOTIFY_SOCKET", p)
	n, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	// Keep reading, as systemd does: the receive queue is short
	// (net.unix.max_dgram_qlen) and a full one blocks senders.
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			if _, err := l.Read(buf); err != nil {
				return
			}
		}
	}()
	defer func() { l.Close(); <-done }()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 10 {
				_ = n.Watchdog()
				_ = n.Status("x")
			}
		})
	}
	wg.Go(func() { _ = n.Close() })
	wg.Wait()
	if n.Enabled() {
		t.Error("Enabled() after Close = true; want false")
	}
}

// TestStalledReceiver: when the service manager stops reading, sends fail
// after the send timeout instead of blocking forever, and Close still works.
func TestStalledReceiver(t *testing.T) {
	old := sendTimeout
	sendTimeout = 10 * time.Millisecond
	t.Cleanup(func() { sendTimeout = old })
	p := filepath.Join(t.TempDir(), "notify")
	listen(t, p) // never read
	t.Setenv("NOTIFY_SOCKET", p)
	n, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	// The queue holds net.unix.max_dgram_qlen datagrams (10 by default);
	// some send past that must fail.
	var sendErr error
	for i := 0; i < 10000 && sendErr == nil; i++ {
		sendErr = n.Watchdog()
	}
	if sendErr == nil {
		t.Fatal("10000 sends to a receiver that never reads all succeeded; want a timeout error")
	}
	if err := n.Close(); err != nil {
		t.Errorf("Close() = %v", err)
	}
}

func TestWatchdogInterval(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	tests := []struct {
		usec, pid string
		want      time.Duration
	}{
		{"", "", 0},
		{"30000000", "", 30 * time.Second},
		{"30000000", self, 30 * time.Second},
		{"30000000", "1", 0}, // inherited from a parent: not our watchdog
		{"", self, 0},
		{"0", "", 0},
		{"-5", "", 0},
		{"x", "", 0},
		{"30000000", "x", 0},
	}
	for _, tt := range tests {
		t.Setenv("WATCHDOG_USEC", tt.usec)
		t.Setenv("WATCHDOG_PID", tt.pid)
		if got := WatchdogInterval(); got != tt.want {
			t.Errorf("WATCHDOG_USEC=%q WATCHDOG_PID=%q: got %v; want %v", tt.usec, tt.pid, got, tt.want)
		}
	}
}

// TestWatchdogIntervalAfterOpen: Open does not disturb the watchdog
// variables, so the call order in the daemon does not matter.
func TestWatchdogIntervalAfterOpen(t *testing.T) {
	p := filepath.Join(t.TempDir(), "notify")
	listen(t, p)
	t.Setenv("NOTIFY_SOCKET", p)
	t.Setenv("WATCHDOG_USEC", "2000000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	n, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if got, want := WatchdogInterval(), 2*time.Second; got != want {
		t.Errorf("WatchdogInterval() after Open = %v; want %v", got, want)
	}
}
