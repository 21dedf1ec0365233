//go:build linux

package claude

import (
	"bytes"
	"errors"
	"io"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestDeliverOneConnectionOneLine: a short line and one larger than the socket buffer (which
// the fast path must finish through the poller) each arrive whole, on exactly one connection.
func TestDeliverOneConnectionOneLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan []byte, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				raw, _ := io.ReadAll(c)
				c.Close()
				got <- raw
			}()
		}
	}()
	for _, n := range []int{100, 4 << 20} {
		line := append(bytes.Repeat([]byte("x"), n), '\n')
		if err := Deliver(path, line, 5*time.Second); err != nil {
			t.Fatalf("deliver %d bytes: %v", n, err)
		}
		if raw := <-got; !bytes.Equal(raw, line) {
			t.Fatalf("inbox got %d bytes, want %d", len(raw), len(line))
		}
	}
	select {
	case raw := <-got:
		t.Fatalf("an extra connection carried %d bytes", len(raw))
	case <-time.After(100 * time.Millisecond):
	}
	if err := Deliver(filepath.Join(t.TempDir(), "none.sock"), []byte("x\n"), time.Second); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("deliver to a missing socket = %v, want ENOENT", err)
	}
}
