package inq

import (
	"net"
	"path/filepath"
	"testing"
	"time"
)

// TestPending: a Unix and a TCP connection report bytes the peer sent and nobody read, and
// report none once they are read.
func TestPending(t *testing.T) {
	for _, network := range []string{"unix", "tcp"} {
		addr := "127.0.0.1:0"
		if network == "unix" {
			addr = filepath.Join(t.TempDir(), "s")
		}
		l, err := net.Listen(network, addr)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		c, err := net.Dial(network, l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if Pending(s) {
			t.Fatalf("%s: pending before anything was sent", network)
		}
		c.Write([]byte("hi"))
		for end := time.Now().Add(5 * time.Second); !Pending(s); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: 2 bytes sent, never pending", network)
			}
		}
		s.Read(make([]byte, 2))
		if Pending(s) {
			t.Fatalf("%s: pending after the bytes were read", network)
		}
	}
}
