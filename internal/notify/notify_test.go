package notify

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func recv(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

func TestMessagesReachTheSocket(t *testing.T) {
	for _, abstract := range []bool{false, true} {
		name := filepath.Join(t.TempDir(), "notify.sock")
		env := name
		if abstract {
			name = "\x00xmsg-notify-test-" + strconv.Itoa(os.Getpid())
			env = "@" + name[1:]
		}
		l := listen(t, name)
		t.Setenv("NOTIFY_SOCKET", env)
		n, err := Open()
		if err != nil {
			t.Fatal(err)
		}
		if os.Getenv("NOTIFY_SOCKET") != "" {
			t.Error("NOTIFY_SOCKET still set after Open; children would inherit it")
		}
		if !n.Enabled() {
			t.Fatal("not enabled")
		}
		steps := []struct {
			send func() error
			want string
		}{
			{n.Ready, "READY=1"},
			{func() error { return n.Status("serving: 1\n2") }, "STATUS=serving: 1 2"},
			{n.Watchdog, "WATCHDOG=1"},
			{n.Stopping, "STOPPING=1"},
		}
		for _, s := range steps {
			if err := s.send(); err != nil {
				t.Fatal(err)
			}
			if got := recv(t, l); got != s.want {
				t.Errorf("abstract=%v: got %q, want %q", abstract, got, s.want)
			}
		}
		n.Close()
	}
}

func TestUnsetIsANoOp(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	n, err := Open()
	if n != nil || err != nil {
		t.Fatalf("Open() = %v, %v; want nil, nil", n, err)
	}
	if n.Enabled() || n.Ready() != nil || n.Status("x") != nil || n.Stopping() != nil || n.Watchdog() != nil || n.Close() != nil {
		t.Error("nil notifier must be a silent no-op")
	}
}

func TestUnreachableSocketIsAnError(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "absent.sock"))
	if _, err := Open(); err == nil {
		t.Error("Open of a missing socket succeeded")
	}
}

func TestWatchdogInterval(t *testing.T) {
	cases := []struct {
		usec, pid string
		want      time.Duration
	}{
		{"", "", 0},
		{"30000000", "", 30 * time.Second},
		{"30000000", strconv.Itoa(os.Getpid()), 30 * time.Second},
		{"30000000", "1", 0},
		{"-5", "", 0},
		{"x", "", 0},
	}
	for _, c := range cases {
		t.Setenv("WATCHDOG_USEC", c.usec)
		t.Setenv("WATCHDOG_PID", c.pid)
		if got := WatchdogInterval(); got != c.want {
			t.Errorf("WATCHDOG_USEC=%q WATCHDOG_PID=%q: got %v, want %v", c.usec, c.pid, got, c.want)
		}
	}
}
