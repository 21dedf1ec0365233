//go:build linux

package claude

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// deliver is one whole delivery, as the bus makes it: Dial, Write, Close.
func deliver(path string, line []byte, timeout time.Duration) error {
	in := Dial(path, timeout)
	defer in.Close()
	return in.Write(line)
}

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
		if err := deliver(path, line, 5*time.Second); err != nil {
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
	if err := deliver(filepath.Join(t.TempDir(), "none.sock"), []byte("x\n"), time.Second); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("deliver to a missing socket = %v, want ENOENT", err)
	}
}

// TestInboxDialedEarly: a delivery dialled before its line exists shows the inbox a
// connection that carries nothing until Write, and nothing at all if it is closed unwritten;
// when the listener's backlog is full at Dial, Write waits for room (up to its timeout, then
// ErrInboxTimeout), connects once the session accepts, and the line arrives whole on one
// connection. Mutants tried: Dial
// failing on a full backlog (red); Write not connecting when Dial could not (red); the
// connect not tried again while the backlog is full, as net.Dial does (red: a timeout).
func TestInboxDialedEarly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.sock")
	lfd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(lfd)
	if err := syscall.Bind(lfd, &syscall.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(lfd, 0); err != nil { // room for one waiting connection
		t.Fatal(err)
	}
	read := func() []byte {
		t.Helper()
		fd, _, err := syscall.Accept(lfd)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), "accepted")
		c, err := net.FileConn(f) // a dup: f is closed here
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		raw, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("reading the accepted connection: %v", err)
		}
		return raw
	}

	// Closed without a line: the inbox sees a connection that carried nothing.
	in := Dial(path, 5*time.Second)
	if in.fd < 0 || in.err != nil {
		t.Fatalf("Dial with room in the backlog: fd %d, err %v", in.fd, in.err)
	}
	in.Close()
	if raw := read(); len(raw) != 0 {
		t.Fatalf("an unwritten delivery carried %q", raw)
	}

	// The backlog is full at Dial: the connection is made by Write once the session accepts.
	filler := Dial(path, 5*time.Second)
	defer filler.Close()
	in = Dial(path, 5*time.Second)
	defer in.Close()
	if in.fd >= 0 || in.err != nil {
		t.Fatalf("Dial with a full backlog: fd %d, err %v; want no connection yet and no error", in.fd, in.err)
	}
	// Nobody accepts: Write waits its timeout, then says so.
	short := Dial(path, 50*time.Millisecond)
	if err := short.Write([]byte("x\n")); !errors.Is(err, ErrInboxTimeout) {
		t.Fatalf("Write to a backlog that stays full = %v, want ErrInboxTimeout", err)
	}
	short.Close()
	got := make(chan []byte, 1)
	go func() {
		time.Sleep(20 * time.Millisecond) // Write is waiting by now, in all likelihood
		filler.Close()
		read()        // the filler's empty connection: room again
		got <- read() // the delivery's
	}()
	line := []byte("{\"x\":1}\n")
	if err := in.Write(line); err != nil {
		t.Fatalf("Write after a full backlog: %v", err)
	}
	in.Close()
	select {
	case raw := <-got:
		if !bytes.Equal(raw, line) {
			t.Fatalf("inbox got %q, want %q", raw, line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the delivery never arrived")
	}
}
