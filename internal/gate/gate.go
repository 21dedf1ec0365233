// Package gate is the peer gate of every xmsg socket (docs/design.md §3): a
// net.Listener wrapper whose Accept hands out only connections from
// processes running as the daemon's own uid.
//
// The OS uid is xmsg's hard trust boundary. Directory and socket modes
// already keep other users out; the gate is the third, independent wall, so
// a mistake in one of the others (a relaxed mode, a socket passed by a
// misconfigured unit) still lets nobody else in. It reads the peer's uid
// from the kernel (SO_PEERCRED), never from anything the peer sends, and
// refuses before reading or writing a single byte: a refused peer learns
// nothing but that the connection was closed.
package gate

import (
	"log/slog"
	"net"

	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/ratelog"
)

// Conn is a connection admitted by the gate, with the credentials the
// kernel reported for its peer.
type Conn struct {
	*net.UnixConn
	Cred peercred.Cred
}

// CredOf returns the peer credentials of a connection returned by a gated
// listener (for example in http.Server.ConnContext). ok is false for any
// other connection; callers must then treat the peer as unidentified.
func CredOf(c net.Conn) (peercred.Cred, bool) {
	if gc, ok := c.(*Conn); ok && gc != nil {
		return gc.Cred, true
	}
	return peercred.Cred{}, false
}

// Listener wraps l so that Accept returns only *Conn values whose peer uid
// (SO_PEERCRED) equals uid. Every other connection (another uid, credentials
// that cannot be read, or a connection that is not a *net.UnixConn) is
// closed before one byte is read or written, logged at warn level with
// peer_uid, peer_pid and socket (at most about one line per second, with
// the count of refusals suppressed since the last line), and Accept waits
// for the next one. Errors of l.Accept are returned unchanged, so closing l
// ends a serving loop as usual. socket names the listener in log lines; log
// may be nil.
func Listener(l net.Listener, uid uint32, socket string, log *slog.Logger) net.Listener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &listener{Listener: l, uid: uid, socket: socket, log: log}
}

type listener struct {
	net.Listener
	uid    uint32
	socket string
	log    *slog.Logger
	lim    ratelog.Limiter
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if gc := l.admit(c); gc != nil {
			return gc, nil
		}
	}
}

// admit returns c as a *Conn if its peer runs as l.uid; otherwise it logs
// the refusal, closes c and returns nil. The log line is written before the
// close so that a refused peer's EOF implies the refusal was recorded.
func (l *listener) admit(c net.Conn) *Conn {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		// Only a Unix socket carries kernel-attested credentials; a TCP or
		// other connection has no uid to check, so it is refused (fail
		// closed) rather than trusted.
		l.refuse(c, "not a unix socket", -1, -1)
		return nil
	}
	cred, err := peercred.FromConn(uc)
	if err != nil {
		// Unknown peer: refuse rather than guess.
		l.refuse(c, "credentials unreadable", -1, -1)
		return nil
	}
	if cred.UID != l.uid {
		l.refuse(c, "uid mismatch", int64(cred.UID), cred.PID)
		return nil
	}
	return &Conn{UnixConn: uc, Cred: cred}
}

// refuse logs (rate-limited) and closes c. peerUID and peerPID are -1 when
// unknown.
func (l *listener) refuse(c net.Conn, reason string, peerUID int64, peerPID int) {
	if ok, suppressed := l.lim.Allow(""); ok {
		l.log.Warn("peer refused",
			"socket", l.socket,
			"reason", reason,
			"peer_uid", peerUID,
			"peer_pid", peerPID,
			"suppressed", suppressed)
	}
	c.Close()
}
