package main

import (
	"net"
	"strings"
	"testing"
)

// TestNetcheckOutsideAUnit is netcheck's own control: outside any unit nothing is restricted,
// so every "denied" check must FAIL and every "allowed" one PASS. Inside the nspawn stage the
// same checks then mean what they say.
func TestNetcheckOutsideAUnit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	target := ln.Addr().String()
	out, code := runProbe(t, self(t), nil, "netcheck", "--bind-ok", "127.0.0.1:0", "--bind-denied", "127.0.0.1:0",
		"--dial-ok", target, "--dial-denied", target, "--families")
	if code != 1 {
		t.Errorf("exit code %d, want 1 (the denied checks fail outside a unit):\n%s", code, out)
	}
	for _, want := range []string{
		"PASS bind-allowed:127.0.0.1:0", "FAIL bind-denied:127.0.0.1:0: bind succeeded",
		"PASS dial-allowed:" + target, "PASS udp-allowed:" + target,
		"FAIL udp-denied:" + target + ": datagram sent", "FAIL dial-denied:" + target + ": connection established",
		"PASS family-allowed:inet", "FAIL family-denied:netlink",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if _, code := runProbe(t, self(t), nil, "netcheck"); code != 2 {
		t.Errorf("netcheck without checks: exit %d, want 2 (usage)", code)
	}
}
