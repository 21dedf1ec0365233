package fed

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	l := newLimiter()
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	for i := range 3 {
		if !l.take([]string{"peer", "p1"}, []int{60, 3}) {
			t.Fatalf("take %d refused", i)
		}
	}
	if l.take([]string{"peer", "p1"}, []int{60, 3}) {
		t.Error("4th take of a 3/min bucket allowed")
	}
	// The refused take did not drain the peer bucket: 57 left for other principals.
	for i := range 57 {
		if !l.take([]string{"peer", "p2"}, []int{60, 100}) {
			t.Fatalf("other principal, take %d refused", i)
		}
	}
	if l.take([]string{"peer", "p3"}, []int{60, 100}) {
		t.Error("61st take of the peer bucket allowed")
	}
	now = now.Add(20 * time.Second) // refills 1 token of p1 (3/min) and 20 of the peer
	if !l.take([]string{"peer", "p1"}, []int{60, 3}) || l.take([]string{"peer", "p1"}, []int{60, 3}) {
		t.Error("refill: want exactly one more take after 20 s")
	}
}

// TestPreHandshakeLimit: at most 8 connections per source address may sit in the TLS
// handshake; the 9th is closed without an answer, while the 8 stay open.
func TestPreHandshakeLimit(t *testing.T) {
	_, b := pair(t, "")
	var held []net.Conn
	for range maxPreHandshake {
		c, err := net.Dial("tcp", b.addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	time.Sleep(100 * time.Millisecond) // let the listener count them (not asserted)
	c, err := net.Dial("tcp", b.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("9th pre-handshake connection: read %v, want EOF (closed)", err)
	}
	held[0].SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := held[0].Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a held connection: read %v, want it still open", err)
	}
}

// TestPerPeerLimit: a peer may hold 8 authenticated connections; the 9th is closed after
// its handshake, before any request is served.
func TestPerPeerLimit(t *testing.T) {
	a, b := pair(t, "")
	pairCert, _ := tls.X509KeyPair(a.cert.CertPEM, a.cert.KeyPEM)
	dial := func() (*tls.Conn, error) {
		return tls.Dial("tcp", b.addr(), &tls.Config{Certificates: []tls.Certificate{pairCert}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13, NextProtos: []string{"http/1.1"}})
	}
	req := "GET /fed/v2/sessions HTTP/1.1\r\nHost: b\r\n\r\n"
	for i := range maxPerPeer {
		c, err := dial()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte(req))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 12)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf[9:12]) != "200" {
			t.Fatalf("connection %d: %q %v", i, buf, err)
		}
	}
	c, err := dial()
	if err != nil {
		return // refused during the handshake: also closed
	}
	defer c.Close()
	c.Write([]byte(req))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 64)); err == nil {
		t.Errorf("9th connection of the peer was served (%d bytes)", n)
	}
}
