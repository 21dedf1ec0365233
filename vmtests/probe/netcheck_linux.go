package main

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// netcheck runs INSIDE a federating tier's unit (the ExecStart= of a copy of xmsg@.service
// with the federation drop-in) and checks the unit's network restrictions from the inside:
//
//   - bindOK: a TCP listener on each address can be opened (the tier's own port:
//     SocketBindAllow=);
//   - bindDenied: on each of these the bind fails with EPERM (SocketBindDeny=any), not with
//     EADDRINUSE or EADDRNOTAVAIL, which would prove nothing;
//   - dialOK: a TCP connection to each address completes and a UDP datagram can be sent
//     there (a peer: IPAddressAllow=);
//   - dialDenied: a UDP datagram fails with EPERM and a TCP connect gets no answer
//     (IPAddressDeny=any drops the packets), while a listener does run there (the caller
//     starts one), so ECONNREFUSED would be a FAIL;
//   - with families: AF_INET and AF_INET6 sockets can be made, AF_NETLINK and AF_PACKET ones
//     cannot (RestrictAddressFamilies=, a seccomp filter: only a process the unit started
//     has it, while the BPF filters above hold for any process in the unit's cgroup).
func netcheck(r *report, bindOK, bindDenied, dialOK, dialDenied []string, families bool) {
	for _, a := range bindOK {
		ln, err := net.Listen("tcp", a)
		if r.check("bind-allowed:"+a, err) {
			ln.Close()
		}
	}
	for _, a := range bindDenied {
		ln, err := net.Listen("tcp", a)
		switch {
		case err == nil:
			ln.Close()
			err = errors.New("bind succeeded, want EPERM")
		case errors.Is(err, syscall.EPERM):
			r.info("bind %s: %v", a, err)
			err = nil
		default:
			err = fmt.Errorf("%v: want EPERM (refused by the unit, not by the address)", err)
		}
		r.check("bind-denied:"+a, err)
	}
	for _, a := range dialOK {
		c, err := net.DialTimeout("tcp", a, 5*time.Second)
		if r.check("dial-allowed:"+a, err) {
			c.Close()
		}
		r.check("udp-allowed:"+a, udpSend(a))
	}
	for _, a := range dialDenied {
		// UDP first: a datagram the unit's egress filter drops fails sendto(2) with EPERM at
		// once, which TCP cannot show (the kernel retransmits a dropped SYN until connect
		// gives up).
		err := udpSend(a)
		switch {
		case err == nil:
			err = errors.New("datagram sent, want EPERM")
		case errors.Is(err, syscall.EPERM):
			r.info("udp %s: %v", a, err)
			err = nil
		default:
			err = fmt.Errorf("%v: want EPERM (dropped by the unit's IP filter)", err)
		}
		r.check("udp-denied:"+a, err)
		// TCP: a listener runs there (the caller's positive control), so only the filter
		// can keep the handshake from completing: no connection, and no refusal either.
		c, err := net.DialTimeout("tcp", a, 2*time.Second)
		var ne net.Error
		switch {
		case err == nil:
			c.Close()
			err = errors.New("connection established, want it dropped")
		case errors.Is(err, syscall.EPERM) || (errors.As(err, &ne) && ne.Timeout()):
			r.info("dial %s: %v", a, err)
			err = nil
		default:
			err = fmt.Errorf("%v: want no answer at all (dropped by the unit's IP filter)", err)
		}
		r.check("dial-denied:"+a, err)
	}
	if !families {
		return
	}
	for _, fam := range []struct {
		name    string
		af, typ int
		allowed bool
	}{
		{"inet", syscall.AF_INET, syscall.SOCK_STREAM, true},
		{"inet6", syscall.AF_INET6, syscall.SOCK_STREAM, true},
		{"netlink", syscall.AF_NETLINK, syscall.SOCK_RAW, false},
		{"packet", syscall.AF_PACKET, syscall.SOCK_RAW, false},
	} {
		fd, err := syscall.Socket(fam.af, fam.typ, 0)
		if err == nil {
			syscall.Close(fd)
		}
		switch {
		case fam.allowed:
			r.check("family-allowed:"+fam.name, err)
		case err == nil:
			r.fail("family-denied:"+fam.name, "socket() succeeded, want it refused")
		default:
			r.info("socket %s: %v", fam.name, err)
			r.pass("family-denied:" + fam.name)
		}
	}
}

// udpSend sends one datagram to addr (nothing needs to listen: only the sender's filter can
// refuse it synchronously).
func udpSend(addr string) error {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte("xmsg-probe"))
	return err
}
