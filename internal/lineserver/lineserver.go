// Package lineserver is the part of agent.sock and register.sock that does not depend on their
// protocols: accepting connections behind the peer gate, capping how many are served at once,
// attesting the connecting process, reading size-capped '\n'-terminated lines, writing responses
// with a deadline, and draining at shutdown. Each protocol package supplies a Handle function
// that reads its frames and answers them.
//
// Fairness (the way dbus-broker accounts per peer): a connection starts unattested, in a pool
// of its own (MaxPending) with one deadline for the whole unattested phase (PendingTimeout,
// from the connect, never extended). Only when the protocol has attested it (Attest: the
// peer is a known session or a verified service) does it take one of the MaxConns slots. No
// peer pid holds more than MaxPerPID connections, attested or not. So connections that never
// attest cannot keep attested clients out, and no single process can take a socket.
//
// Who the peer is never comes from what it sends. The listener must be a gate.Listener, which
// has already refused other uids; here the peer's pid comes from the gate (SO_PEERCRED) and its
// start time is read from /proc at connect, so that the protocol can check before each frame
// that the pid still names the process that connected.
package lineserver

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/xmsg/xmsg/internal/gate"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/ratelog"
)

// Peer is the process that connected, as attested at accept.
type Peer struct {
	Cred peercred.Cred // from the kernel (SO_PEERCRED) via the gate
	// Start is the process's start time read at connect. With the pid it names one process:
	// a later frame from a different process with the same pid (a recycled pid, or the
	// descriptor passed on after the connector exited) fails Proc.Alive(Cred.PID, Start).
	Start string
	Actor string // "pid:<pid>", the peer's name in log lines
}

// Config of a Server.
type Config struct {
	Socket string // the socket's name in log lines: "agent", "register"
	Proc   peercred.Proc
	Log    *slog.Logger // nil: discard
	// MaxConns is how many attested connections (see Attest) are served at once. When it is
	// not positive none is: a forgotten limit refuses rather than admits.
	MaxConns int
	// MaxPending is how many connections not yet attested are served at once; the next is
	// closed unread. Not positive: MaxConns.
	MaxPending int
	// MaxPerPID is how many connections one peer pid may hold, attested or not; the next is
	// closed unread. Not positive: no bound of its own (MaxConns + MaxPending).
	MaxPerPID int
	// PendingTimeout is how long a connection may stay unattested, counted from the connect:
	// ArmRead never sets a deadline past it, so neither blank lines nor a byte trickle nor
	// frames that fail attestation extend it. Not positive: 30s.
	PendingTimeout time.Duration
	// WriteTimeout abandons a response the client does not read; not positive: 10s.
	WriteTimeout time.Duration
	// Handle serves one attested connection; the Server closes c when it returns.
	Handle func(c net.Conn, p Peer)
}

const (
	defaultWriteTimeout   = 10 * time.Second
	defaultPendingTimeout = 30 * time.Second
)

// Server accepts and tracks connections for one protocol. Safe for concurrent use.
type Server struct {
	cfg Config

	mu        sync.Mutex
	closing   bool
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]*slot
	attested  int         // conns holding one of the MaxConns slots
	perPID    map[int]int // conns by peer pid
	wg        sync.WaitGroup
	lim       ratelog.Limiter
}

// slot is the accounting of one connection.
type slot struct {
	pid      int       // peer pid (0: unknown)
	attested bool      // holds a MaxConns slot
	deadline time.Time // end of the unattested phase; zero once attested
}

// New returns a server; it serves once Serve is called.
func New(cfg Config) *Server {
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = defaultWriteTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = cfg.MaxConns
	}
	if cfg.MaxPerPID <= 0 {
		cfg.MaxPerPID = max(cfg.MaxConns, 0) + cfg.MaxPending
	}
	if cfg.PendingTimeout <= 0 {
		cfg.PendingTimeout = defaultPendingTimeout
	}
	return &Server{cfg: cfg, listeners: map[net.Listener]struct{}{}, conns: map[net.Conn]*slot{}, perPID: map[int]int{}}
}

// Attested is the number of connections holding an attested slot now.
func (s *Server) Attested() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attested
}

// Attest moves c from the unattested pool to one of the MaxConns slots, once its protocol
// knows who the peer is; calling it again is a no-op. False means every slot is taken: the
// protocol refuses what the connection asked and ends it. From now on ArmRead's deadlines are
// the protocol's own (idle), no longer capped by PendingTimeout.
func (s *Server) Attest(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := s.conns[c]
	if sl == nil {
		return false
	}
	if sl.attested {
		return true
	}
	if s.attested >= s.cfg.MaxConns {
		s.refuseLocked(c, "attest", "too many attested connections", s.cfg.MaxConns)
		return false
	}
	s.attested++
	sl.attested, sl.deadline = true, time.Time{}
	return true
}

// Conns is the number of connections being served now.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Serve accepts connections on l until Shutdown, then returns net.ErrClosed. l must be a
// gate.Listener: a connection without gate credentials is closed unread. Any other error is
// l's non-temporary Accept error, returned unwrapped for the protocol package to name.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		l.Close()
		return net.ErrClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing || errors.Is(err, net.ErrClosed) {
				return net.ErrClosed
			}
			if !retryable(err) {
				return err
			}
			// Out of descriptors or an aborted handshake: wait and retry rather than stop
			// serving, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.lim.Log(s.cfg.Log, slog.LevelWarn, "accept", "accept failed", "socket", s.cfg.Socket, "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		pid := 0
		if cred, ok := gate.CredOf(c); ok {
			pid = cred.PID
		}
		s.mu.Lock()
		switch {
		case s.closing:
			s.mu.Unlock()
			c.Close()
			return net.ErrClosed
		case len(s.conns)-s.attested >= s.cfg.MaxPending:
			// Closed before reading a byte: a flood of connections from one uid cannot grow
			// the daemon's goroutines and buffers without bound. Logged first, so that the
			// peer's EOF implies the refusal is on record.
			s.refuseLocked(c, "connect", "too many connections", s.cfg.MaxPending)
			s.mu.Unlock()
			c.Close()
			continue
		case s.perPID[pid] >= s.cfg.MaxPerPID:
			s.refuseLocked(c, "connect", "too many connections from one process", s.cfg.MaxPerPID)
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.conns[c] = &slot{pid: pid, deadline: time.Now().Add(s.cfg.PendingTimeout)}
		s.perPID[pid]++
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

func retryable(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ECONNABORTED) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// Shutdown stops accepting and wakes every connection waiting for its next line (its read
// deadline is set to now): a Handle that re-arms through ArmRead sees the server closing and
// returns; one processing a frame finishes it first. When every Handle has returned, Shutdown
// returns nil. When ctx ends first, the remaining connections are closed at once and ctx's
// error is returned, unwrapped, after every Handle has returned.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	for l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.SetReadDeadline(time.Now())
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
}

// ArmRead sets c's read deadline d from now, unless the server is closing; false means the
// connection must end. While c is unattested the deadline is never later than the end of its
// unattested phase. Holding mu orders it with Shutdown: either Shutdown's immediate deadline
// comes after this one, or this sees closing. Protocols arm once per phase (first frame, the
// wait after an answered frame), never for a blank line, so that nothing short of a frame
// moves a deadline.
func (s *Server) ArmRead(c net.Conn, d time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	t := time.Now().Add(d)
	if sl := s.conns[c]; sl != nil && !sl.attested && sl.deadline.Before(t) {
		t = sl.deadline
	}
	c.SetReadDeadline(t)
	return true
}

// Write sends one response line within WriteTimeout; false means the connection must end.
func (s *Server) Write(c net.Conn, line []byte) bool {
	c.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	if _, err := c.Write(line); err != nil {
		s.cfg.Log.Debug("write abandoned", "socket", s.cfg.Socket, "actor", actorOf(c), "err", err)
		return false
	}
	return true
}

func actorOf(c net.Conn) string {
	if cred, ok := gate.CredOf(c); ok {
		return "pid:" + strconv.Itoa(cred.PID)
	}
	return "unknown"
}

func (s *Server) refuse(actor, reason string) {
	s.lim.Log(s.cfg.Log, slog.LevelWarn, "connect "+reason, "refused", "socket", s.cfg.Socket, "actor", actor, "request", "connect", "reason", reason)
}

// refuseLocked logs a refusal of c over a limit, rate-limited per reason (a flood of
// connections is one line a second, with the count of the others).
func (s *Server) refuseLocked(c net.Conn, request, reason string, limit int) {
	s.lim.Log(s.cfg.Log, slog.LevelWarn, request+" "+reason, "refused", "socket", s.cfg.Socket, "actor", actorOf(c), "request", request, "reason", reason, "limit", limit)
}

func (s *Server) serveConn(c net.Conn) {
	defer func() {
		c.Close()
		s.mu.Lock()
		if sl := s.conns[c]; sl != nil {
			if sl.attested {
				s.attested--
			}
			if s.perPID[sl.pid]--; s.perPID[sl.pid] <= 0 {
				delete(s.perPID, sl.pid)
			}
		}
		delete(s.conns, c)
		s.mu.Unlock()
		s.wg.Done()
	}()
	cred, ok := gate.CredOf(c)
	if !ok {
		// Not from a gate.Listener: nobody vouched for the peer's uid. Fail closed.
		s.refuse("unknown", "no peer credentials")
		return
	}
	p := Peer{Cred: cred, Actor: "pid:" + strconv.Itoa(cred.PID)}
	// The start time names the process that connected, which is the one every frame must come
	// from; without it nothing could be checked later, so the connection ends unanswered.
	start, err := s.cfg.Proc.StartTime(cred.PID)
	if err != nil {
		s.refuse(p.Actor, "peer start time unreadable")
		return
	}
	p.Start = start
	s.cfg.Handle(c, p)
}
