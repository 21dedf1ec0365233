package daemontest

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/xmsg/xmsg/internal/limits"
)

func TestMain(m *testing.M) { Main(m) }

// TestProductionBounds: a test daemon has production's bounds, here http.sock's connection
// cap per process (limits.HTTPMaxPerPID), which a copy of the assembly in this package once
// left out. Every connection is this process's: the first HTTPMaxPerPID are served, the next
// is closed unanswered and the refusal logged.
func TestProductionBounds(t *testing.T) {
	e := New(t, Options{})
	get := func(c net.Conn) (string, error) {
		c.SetDeadline(time.Now().Add(Wait))
		if _, err := fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: xmsg\r\n\r\n"); err != nil {
			return "", err
		}
		return bufio.NewReader(c).ReadString('\n')
	}
	for i := 0; i < limits.HTTPMaxPerPID; i++ {
		c, err := net.Dial("unix", e.HTTPPath)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		// An answer proves the server holds this connection (kept alive).
		if line, err := get(c); !strings.HasPrefix(line, "HTTP/1.1 200") {
			t.Fatalf("connection %d: got %q, %v, want 200", i+1, line, err)
		}
	}
	c, err := net.Dial("unix", e.HTTPPath)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if line, err := get(c); err == nil {
		t.Fatalf("connection %d: got %q, want it closed unanswered", limits.HTTPMaxPerPID+1, line)
	}
	if !strings.Contains(e.Logs.String(), "socket=http") || !strings.Contains(e.Logs.String(), fmt.Sprintf("limit=%d", limits.HTTPMaxPerPID)) {
		t.Fatalf("refusal not logged with socket=http and limit=%d:\n%s", limits.HTTPMaxPerPID, e.Logs.String())
	}
}
