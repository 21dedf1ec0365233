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
// pool (limits.HTTPMaxConns), which a copy of the assembly in this package once left out.
// HTTPMaxConns idle keep-alives are held; the next connection is served, and the oldest idle
// one is closed to make room, the eviction logged with the production limit.
func TestProductionBounds(t *testing.T) {
	e := New(t, Options{})
	get := func(c net.Conn) (string, error) {
		c.SetDeadline(time.Now().Add(Wait))
		if _, err := fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: xmsg\r\n\r\n"); err != nil {
			return "", err
		}
		return bufio.NewReader(c).ReadString('\n')
	}
	var held []net.Conn
	for i := 0; i < limits.HTTPMaxConns; i++ {
		c, err := net.Dial("unix", e.HTTPPath)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		// An answer proves the server holds this connection (kept alive, idle).
		if line, err := get(c); !strings.HasPrefix(line, "HTTP/1.1 200") {
			t.Fatalf("connection %d: got %q, %v, want 200", i+1, line, err)
		}
		held = append(held, c)
	}
	c, err := net.Dial("unix", e.HTTPPath)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if line, err := get(c); !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("connection %d: got %q, %v, want it served", limits.HTTPMaxConns+1, line, err)
	}
	held[0].SetReadDeadline(time.Now().Add(Wait))
	if n, err := held[0].Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("the oldest idle connection: read %d, %v; want it closed to make room", n, err)
	}
	want := fmt.Sprintf("limit=%d", limits.HTTPMaxConns)
	WaitFor(t, "the eviction logged", func() bool {
		return strings.Contains(e.Logs.String(), "socket=http") && strings.Contains(e.Logs.String(), "to make room") && strings.Contains(e.Logs.String(), want)
	})
}
