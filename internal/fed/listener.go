package fed

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Connection limits of the federation listener (docs/protocol.md §2.6).
const (
	maxConns        = 128 // concurrent connections in total; the next is dropped
	maxPreHandshake = 8   // connections per source IP still in the TLS handshake
	maxPerPeer      = 8   // concurrent authenticated connections per peer
	handshakeTime   = 3 * time.Second
)

// conn is an authenticated federation connection: the TLS handshake is done and the peer
// identified before the HTTP server ever sees it.
type conn struct {
	*tls.Conn
	raw    *rawConn
	l      *listener
	once   sync.Once
	source netip.Addr
}

// rawConn is the TCP connection under TLS; the handshake's verifier records its result here,
// where the listener finds it after the handshake.
type rawConn struct {
	net.Conn
	st    *state // the snapshot the handshake used
	peer  *Peer
	chain []*x509.Certificate
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.raw.peer, true) })
	return err
}

// listener accepts TCP connections, enforces the connection limits, runs the TLS handshake
// (3 s budget) and hands out only authenticated connections.
type listener struct {
	inner net.Listener
	n     *Node
	out   chan net.Conn
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup

	mu         sync.Mutex
	lastLog    time.Time // refusals are logged at most once a second (a flood must not fill the journal)
	suppressed int
	total      int
	preHS      map[netip.Addr]int
	perPeer    map[string]int
}

func (n *Node) newListener(inner net.Listener) *listener {
	l := &listener{inner: inner, n: n, out: make(chan net.Conn), done: make(chan struct{}),
		preHS: map[netip.Addr]int{}, perPeer: map[string]int{}}
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

func (l *listener) Addr() net.Addr { return l.inner.Addr() }

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.out:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *listener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.inner.Close()
	})
	return err
}

func sourceOf(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap().WithZone("")
	}
	return netip.Addr{}
}

func (l *listener) acceptLoop() {
	defer l.wg.Done()
	for {
		c, err := l.inner.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				l.Close()
				return
			}
			// Out of file descriptors and the like: wait and go on, as net/http does.
			select {
			case <-l.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		src := sourceOf(c)
		l.mu.Lock()
		ok := l.total < maxConns && l.preHS[src] < maxPreHandshake
		if ok {
			l.total++
			l.preHS[src]++
		}
		l.mu.Unlock()
		if !ok {
			// Dropped without a byte: the limits are for floods, which get no answer.
			c.Close()
			continue
		}
		go l.handshake(c, src)
	}
}

// release gives back a connection's slots: the total always, and the peer's when it was
// authenticated.
func (l *listener) release(p *Peer, authenticated bool) {
	l.mu.Lock()
	l.total--
	if authenticated && p != nil {
		if l.perPeer[p.Name]--; l.perPeer[p.Name] <= 0 {
			delete(l.perPeer, p.Name)
		}
	}
	l.mu.Unlock()
}

func (l *listener) handshake(c net.Conn, src netip.Addr) {
	raw := &rawConn{Conn: c}
	tc := tls.Server(raw, l.n.serverConfig())
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTime)
	err := tc.HandshakeContext(ctx)
	cancel()
	l.mu.Lock()
	if l.preHS[src]--; l.preHS[src] <= 0 {
		delete(l.preHS, src)
	}
	authed := err == nil && raw.peer != nil
	if authed && l.perPeer[raw.peer.Name] >= maxPerPeer {
		authed, err = false, errors.New("too many connections from this peer")
	}
	if authed {
		l.perPeer[raw.peer.Name]++
	}
	l.mu.Unlock()
	if !authed {
		if err != nil && raw.peer == nil {
			l.logRefusal(src, err)
		}
		tc.Close()
		l.release(nil, false)
		return
	}
	fc := &conn{Conn: tc, raw: raw, l: l, source: src}
	select {
	case l.out <- fc:
	case <-l.done:
		fc.Close()
	}
}

func (l *listener) logRefusal(src netip.Addr, err error) {
	l.mu.Lock()
	now := time.Now()
	if now.Sub(l.lastLog) < time.Second {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	n := l.suppressed
	l.lastLog, l.suppressed = now, 0
	l.mu.Unlock()
	l.n.cfg.Log.Warn("fed handshake refused", "source", src.String(), "err", oneLine(err.Error()), "suppressed_since_last", n)
}

// serverConfig is the static outer config: it fetches the current snapshot per connection,
// so a reload applies to the next handshake and never to one in progress.
func (n *Node) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			raw, _ := hello.Conn.(*rawConn)
			st := n.st.Load()
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				Certificates: []tls.Certificate{st.cert},
				NextProtos:   []string{"http/1.1"},
				// Any certificate is requested; VerifyConnection alone decides (no system
				// roots, no name check): pins and CA peers are ours to judge (§8.1).
				ClientAuth: tls.RequireAnyClientCert,
				VerifyConnection: func(cs tls.ConnectionState) error {
					p, err := st.peers.Inbound(cs.PeerCertificates)
					name := "(unknown)"
					if p != nil {
						name = p.Name
					}
					n.book.handshake(name, "inbound", err)
					if err != nil {
						return err
					}
					if raw != nil {
						raw.st, raw.peer, raw.chain = st, p, cs.PeerCertificates
					}
					return nil
				},
			}, nil
		},
	}
}
