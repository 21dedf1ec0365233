// Package lineserver is the part of agent.sock and register.sock that does not depend on their
// protocols: accepting connections behind the peer gate, capping how many are served at once,
// attesting the connecting process, reading size-capped '\n'-terminated lines, writing responses
// with a deadline, and draining at shutdown. Each protocol package supplies a Handle function
// that reads its frames and answers them.
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
	// MaxConns is how many connections are served at once; the next is closed unread. When it
	// is not positive none is served: a forgotten limit refuses rather than admits.
	MaxConns int
	// WriteTimeout abandons a response the client does not read; not positive: 10s.
	WriteTimeout time.Duration
	// Handle serves one attested connection; the Server closes c when it returns.
	Handle func(c net.Conn, p Peer)
}

const defaultWriteTimeout = 10 * time.Second

// Server accepts and tracks connections for one protocol. Safe for concurrent use.
type Server struct {
	cfg Config

	mu        sync.Mutex
	closing   bool
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{}
	wg        sync.WaitGroup
}

// New returns a server; it serves once Serve is called.
func New(cfg Config) *Server {
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = defaultWriteTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, listeners: map[net.Listener]struct{}{}, conns: map[net.Conn]struct{}{}}
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
			s.cfg.Log.Warn("accept failed", "socket", s.cfg.Socket, "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		s.mu.Lock()
		switch {
		case s.closing:
			s.mu.Unlock()
			c.Close()
			return net.ErrClosed
		case len(s.conns) >= s.cfg.MaxConns:
			s.mu.Unlock()
			// Closed before reading a byte: a flood of connections from one uid cannot grow
			// the daemon's goroutines and buffers without bound. Logged first, so that the
			// peer's EOF implies the refusal is on record.
			s.cfg.Log.Warn("refused", "socket", s.cfg.Socket, "actor", actorOf(c), "request", "connect", "reason", "too many connections", "limit", s.cfg.MaxConns)
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
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
// connection must end. Holding mu orders it with Shutdown: either Shutdown's immediate deadline
// comes after this one, or this sees closing.
func (s *Server) ArmRead(c net.Conn, d time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	c.SetReadDeadline(time.Now().Add(d))
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
	s.cfg.Log.Warn("refused", "socket", s.cfg.Socket, "actor", actor, "request", "connect", "reason", reason)
}

func (s *Server) serveConn(c net.Conn) {
	defer func() {
		c.Close()
		s.mu.Lock()
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
