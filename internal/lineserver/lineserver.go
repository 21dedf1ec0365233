// Package lineserver is the part of agent.sock and register.sock that does not depend on their
// protocols: accepting connections behind the peer gate, capping how many are served at once,
// attesting the connecting process, reading size-capped '\n'-terminated lines, writing responses
// with a deadline, and draining at shutdown. Each protocol package supplies a Handle function
// that reads its frames and answers them.
//
// Fairness (the way dbus-broker accounts per peer): a connection starts unattested, in a pool
// of its own (MaxPending) with one deadline for the whole unattested phase (PendingTimeout,
// from the connect, never extended). Only when the protocol has attested it (Attest: the
// peer is a known session or a verified service) does it take one of the MaxConns slots, and
// no peer pid holds more than MaxPerPID of those. When the unattested pool is full, a new
// connection is never refused while an unattested one waits idle for its next line: the
// oldest idle one of the pid holding the most unattested connections is told so (an error
// frame) and closed to make room. So connections that never attest cannot keep attested
// clients out, and a client that speaks at once is served however many silent ones are held.
// A connection refused outright (the pool is full of connections being answered) gets an
// error frame too, never a silent close.
//
// The frame loop is here as well (Reader): a line over the cap, a line that is not UTF-8, an
// eviction each come back as a *FrameError, which Answer logs and writes as the protocols'
// error frame {"status":"error","error":code,"detail":...}.
//
// Who the peer is never comes from what it sends. The listener must be a gate.Listener, which
// has already refused other uids; here the peer's pid comes from the gate (SO_PEERCRED) and its
// start time is read from /proc at connect, so that the protocol can check before each frame
// that the pid still names the process that connected.
package lineserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/xmsg/xmsg/internal/gate"
	"github.com/xmsg/xmsg/internal/inq"
	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/ledger"
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
	// MaxPending is how many connections not yet attested are served at once; the next one
	// evicts the oldest idle of them (of the pid holding most), or is refused with an error
	// frame when none is idle. Not positive: MaxConns.
	MaxPending int
	// MaxPerPID is how many attested connections one peer pid may hold; Attest refuses the
	// next. Not positive: no bound of its own (MaxConns). Unattested connections need no
	// per-pid bound: eviction takes the heaviest holder's first.
	MaxPerPID int
	// NoEvict turns eviction off: over MaxPending the new connection is refused (with an
	// error frame) even when an idle one could make room. For the attack tests' controls.
	NoEvict bool
	// PendingTimeout is how long a connection may stay unattested, counted from the connect:
	// ArmRead never sets a deadline past it, so neither blank lines nor a byte trickle nor
	// frames that fail attestation extend it. Not positive: 30s.
	PendingTimeout time.Duration
	// WriteTimeout abandons a response the client does not read; not positive: 10s.
	WriteTimeout time.Duration
	// AttestedName is what attested connections are called in refusals ("registrations" on
	// register.sock); "" is "attested connections".
	AttestedName string
	// Handle serves one attested connection; the Server closes c when it returns.
	Handle func(c net.Conn, p Peer)
}

const (
	defaultWriteTimeout   = 10 * time.Second
	defaultPendingTimeout = 30 * time.Second
)

// Server accepts and tracks connections for one protocol. Safe for concurrent use.
type Server struct {
	cfg       Config
	evictions atomic.Uint64 // connections evicted to make room (Evictions)

	mu        sync.Mutex
	closing   bool
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]*slot
	attested  int // conns holding one of the MaxConns slots
	evicting  int // unattested conns told to make room, not yet gone
	// evicted is when each peer pid last had a connection evicted: a pid that keeps coming
	// back after eviction weighs one more (see victimLocked).
	evicted map[int]time.Time
	perPID  map[int]int // attested conns by peer pid
	wg      sync.WaitGroup
	lim     ratelog.Limiter
}

// slot is the accounting of one connection.
type slot struct {
	pid      int       // peer pid (0: unknown)
	attested bool      // holds a MaxConns slot
	deadline time.Time // end of the unattested phase; zero once attested
	idle     bool      // waiting for its next line (Reader.Next), not being answered
	since    time.Time // the connect, or the last line read: "oldest idle" is by this
	evicted  bool      // told to make room: its Reader answers so and the connection ends
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
		cfg.MaxPending = max(cfg.MaxConns, 0)
	}
	if cfg.MaxPerPID <= 0 {
		cfg.MaxPerPID = max(cfg.MaxConns, 0)
	}
	if cfg.PendingTimeout <= 0 {
		cfg.PendingTimeout = defaultPendingTimeout
	}
	if cfg.AttestedName == "" {
		cfg.AttestedName = "attested connections"
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
// knows who the peer is; calling it again is a no-op. False means every slot is taken (or
// the peer pid holds MaxPerPID of them, or c was just evicted): the protocol refuses what
// the connection asked and ends it. From now on ArmRead's deadlines are the protocol's own
// (idle), no longer capped by PendingTimeout, and c is never evicted.
func (s *Server) Attest(c net.Conn) bool { return s.AttestErr(c) == nil }

// AttestErr is Attest with the refusal as a *FrameError naming the bound, for the protocol
// to answer (Answer) after logging it in its own words, or to write (FrameError.Line).
func (s *Server) AttestErr(c net.Conn) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := s.conns[c]
	if sl == nil || sl.evicted {
		return &FrameError{Code: ledger.ServiceUnavailable, Reason: "evicted to make room", Detail: "connection closed to make room; retry"}
	}
	if sl.attested {
		return nil
	}
	if s.attested >= s.cfg.MaxConns {
		reason := "too many " + s.cfg.AttestedName
		s.refuseLocked(c, "attest", reason, s.cfg.MaxConns)
		return &FrameError{Code: ledger.ServiceUnavailable, Reason: reason, Detail: fmt.Sprintf("%s (limit %d); retry later", reason, s.cfg.MaxConns)}
	}
	// Attested connections cannot be evicted (their peer proved who it is and may be in the
	// middle of a poll), so this is the bound that keeps one process from taking them all.
	if s.perPID[sl.pid] >= s.cfg.MaxPerPID {
		reason := "too many " + s.cfg.AttestedName + " from one process"
		s.refuseLocked(c, "attest", reason, s.cfg.MaxPerPID)
		return &FrameError{Code: ledger.ServiceUnavailable, Reason: reason, Detail: fmt.Sprintf("%s (limit %d); retry later", reason, s.cfg.MaxPerPID)}
	}
	s.attested++
	s.perPID[sl.pid]++
	sl.attested, sl.deadline = true, time.Time{}
	return nil
}

// Idle is the number of unattested connections waiting for their next line: the ones a new
// connection may evict.
func (s *Server) Idle() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sl := range s.conns {
		if sl.idle && !sl.attested && !sl.evicted {
			n++
		}
	}
	return n
}

// Evictions counts the connections evicted so far to make room (fairness, not failure).
func (s *Server) Evictions() uint64 { return s.evictions.Load() }

// Conns is the number of connections being served now.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Serve accepts connections on l until Shutdown, then returns net.ErrClosed. l must be a
// gate.Listener: a connection without gate credentials is closed unread. Any other error is
// l's non-temporary Accept error, wrapped with the socket's name.
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
				return fmt.Errorf("lineserver: %s.sock: accept: %w", s.cfg.Socket, err)
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
		if s.closing {
			s.mu.Unlock()
			c.Close()
			return net.ErrClosed
		}
		if s.cfg.MaxPending <= 0 || len(s.conns)-s.attested-s.evicting >= s.cfg.MaxPending {
			// The pool is full: the newest client, which may be about to speak, is served,
			// and an idle one makes room. Only when none is idle (every unattested
			// connection is being answered) is the new one refused, with an error frame
			// written before the close; the count of goroutines and buffers stays bounded
			// either way. Logged first, so the peer's answer implies the record.
			if v := s.victimLocked(); v != nil && !s.cfg.NoEvict {
				s.evictLocked(v)
			} else {
				s.refuseLocked(c, "connect", "too many connections", s.cfg.MaxPending)
				s.mu.Unlock()
				c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
				why := ", none idle"
				if s.cfg.NoEvict {
					why = ""
				}
				c.Write(ErrorLine(ledger.ServiceUnavailable, fmt.Sprintf("more than %d connections waiting to be attested%s; retry later", s.cfg.MaxPending, why)))
				c.Close()
				continue
			}
		}
		now := time.Now()
		s.conns[c] = &slot{pid: pid, deadline: now.Add(s.cfg.PendingTimeout), idle: true, since: now}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

// victimLocked is the unattested connection to evict: idle, of the pid that holds the most
// unattested connections, the one idle longest. A connection with bytes waiting in its socket
// is not idle, whatever its state says: it has spoken, and its server goroutine has not read
// it yet (under a flood of connects, that can take a while). Nil when none is idle.
//
// "Holds the most" counts a pid evicted within the last PendingTimeout as holding one more:
// under a flood of processes that each redial the moment they are evicted, every holder holds
// one, and the weight keeps their returning connections ahead of a client that came once.
func (s *Server) victimLocked() net.Conn {
	held := map[int]int{}
	for _, sl := range s.conns {
		if !sl.attested && !sl.evicted {
			held[sl.pid]++
		}
	}
	now := time.Now()
	for pid, at := range s.evicted {
		if now.Sub(at) > s.cfg.PendingTimeout {
			delete(s.evicted, pid)
		} else if held[pid] > 0 {
			held[pid]++
		}
	}
	type cand struct {
		c  net.Conn
		sl *slot
	}
	var cands []cand
	for c, sl := range s.conns {
		if !sl.attested && !sl.evicted && sl.idle {
			cands = append(cands, cand{c, sl})
		}
	}
	sort.Slice(cands, func(i, j int) bool {
		a, b := cands[i].sl, cands[j].sl
		if held[a.pid] != held[b.pid] {
			return held[a.pid] > held[b.pid]
		}
		return a.since.Before(b.since)
	})
	// A process holding more than a quarter of the pool is a flood whatever its connections
	// have sent: the spared-if-spoken rule below is for the others.
	share := max(1, s.cfg.MaxPending/4)
	for _, cd := range cands {
		// Bytes waiting unread mean a frame has arrived that its goroutine has not read yet
		// (a flood of connects delays it): spared, but only for spokenGrace after its connect
		// or last frame. A connection that has held its place longer with bytes still
		// waiting is chatter (blank lines a loaded server reads late), not a frame.
		if held[cd.sl.pid] > share || now.Sub(cd.sl.since) >= spokenGrace || !inq.Pending(cd.c) {
			return cd.c
		}
	}
	return nil
}

// spokenGrace is how long a connection with bytes waiting unread is spared eviction
// (victimLocked): long enough for a loaded server to read a frame that arrived with the
// connect, short enough that a holder sending blank lines cannot keep its place by them.
const spokenGrace = time.Second

// evictLocked tells c's Reader to end the connection with an error frame: its read deadline
// is set to now, which wakes the read it is waiting in.
func (s *Server) evictLocked(c net.Conn) {
	s.evictions.Add(1)
	sl := s.conns[c]
	sl.evicted = true
	s.evicting++
	if s.evicted == nil {
		s.evicted = map[int]time.Time{}
	}
	s.evicted[sl.pid] = time.Now()
	s.refuseLocked(c, "connect", "evicted to make room", s.cfg.MaxPending)
	c.SetReadDeadline(time.Now())
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
	sl := s.conns[c]
	if sl != nil && sl.evicted {
		return true // its deadline is now: the Reader answers the eviction
	}
	t := time.Now().Add(d)
	if sl != nil && !sl.attested && sl.deadline.Before(t) {
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
				if s.perPID[sl.pid]--; s.perPID[sl.pid] <= 0 {
					delete(s.perPID, sl.pid)
				}
			}
			if sl.evicted {
				s.evicting--
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

// FrameError is a frame the protocol must refuse and then end the connection: it is answered
// with the error frame {"status":"error","error":Code,"detail":Detail} (Answer).
type FrameError struct {
	Code   ledger.Code // the protocol's error code: payload_too_large, bad_request, service_unavailable
	Detail string      // what the client is told
	Reason string      // what the log says (request=frame reason=...)
}

func (e *FrameError) Error() string { return "lineserver: " + e.Reason }

// Line is e's error frame.
func (e *FrameError) Line() []byte { return ErrorLine(e.Code, e.Detail) }

// ErrGone is Reader.Next's error when Alive says the peer process is no longer the one that
// connected: nobody may act for it on this descriptor, and nothing is answered.
var ErrGone = errors.New("lineserver: peer process exited or its pid was reused")

// Reader reads one connection's frames: '\n'-terminated lines of at most Max bytes (without
// the newline), blank lines skipped. It is the read prologue both protocols share.
type Reader struct {
	s   *Server
	c   net.Conn
	r   *bufio.Reader
	src *source // under r: what a Watch read, then c
	// Max is the cap of the next line; a protocol may change it between frames (a first
	// frame and the loop's frames have caps of their own).
	Max int
	// What names a line in the over-long answer: "<What> exceeds <Max> bytes".
	What string
	// Alive, when set, is checked before a frame is returned; false ends the connection
	// unanswered (ErrGone).
	Alive func() bool
	// Blank returns blank lines as frames instead of skipping them (register.sock's first
	// frame: a blank one is invalid JSON, answered so).
	Blank bool
}

// NewReader returns c's frame reader, with a 64 KiB read buffer.
func (s *Server) NewReader(c net.Conn, max int, what string) *Reader {
	src := &source{c: c}
	return &Reader{s: s, c: c, r: bufio.NewReaderSize(src, 64<<10), src: src, Max: max, What: what}
}

// source is what a Reader's buffer reads: first the bytes a Watch read, then the connection.
type source struct {
	c    net.Conn
	held []byte
}

func (s *source) Read(p []byte) (int, error) {
	if len(s.held) > 0 {
		n := copy(p, s.held)
		if s.held = s.held[n:]; len(s.held) == 0 {
			s.held = nil
		}
		return n, nil
	}
	return s.c.Read(p)
}

// ErrAhead is ReadAhead's error when the peer sent more ahead than it may.
var ErrAhead = errors.New("lineserver: too much sent ahead")

// ReadAhead reads the connection while the protocol waits for something other than the peer
// (a long poll), so that the peer hanging up ends the wait at once, also behind bytes it sent
// ahead. It reads in the calling goroutine until the read deadline passes: the protocol sets
// that to the end of its wait (ArmReadUntil), and moves it into the past to end the wait
// sooner (what it waits for has come; a takeover; Shutdown). What it reads is kept, in order,
// for Next: nothing is lost, and nothing is answered before its turn. It returns nil at the
// deadline, and when until (if not nil) reports true: until is told, before each read and
// after each read that brought bytes, how many frames are waiting ahead (a wait answered by
// another goroutine ends once the next frame is in). It returns ErrAhead when the peer has
// sent more than maxLines frames or maxBytes bytes ahead of the one being answered, counting
// what Next has buffered but not returned (blank lines count as bytes, not frames);
// otherwise the read's error (io.EOF: the peer hung up). Outside ReadAhead nothing is read
// that Next would not read next: a peer that sends ahead is held back by its socket's buffer.
func (r *Reader) ReadAhead(maxLines, maxBytes int, until func(lines int) bool) error {
	var a aheadCount
	if n := r.r.Buffered(); n > 0 {
		b, _ := r.r.Peek(n)
		a.add(b)
	}
	a.add(r.src.held)
	var buf [4 << 10]byte
	for !a.over(maxLines, maxBytes) {
		if until != nil && until(a.lines) {
			return nil
		}
		n, err := r.c.Read(buf[:])
		r.src.held = append(r.src.held, buf[:n]...)
		a.add(buf[:n])
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil
			}
			return err
		}
	}
	return ErrAhead
}

// ArmReadUntil is ArmRead with the deadline t (ReadAhead's end).
func (s *Server) ArmReadUntil(c net.Conn, t time.Time) bool {
	return s.ArmRead(c, time.Until(t))
}

// aheadCount counts what a peer sent ahead: bytes, and the frames (lines that are not blank)
// among them.
type aheadCount struct {
	lines, bytes int
	content      bool // the line being counted has something besides white space
}

func (a *aheadCount) add(b []byte) {
	a.bytes += len(b)
	for _, x := range b {
		switch x {
		case '\n':
			if a.content {
				a.lines++
			}
			a.content = false
		case ' ', '\t', '\r', '\v', '\f':
		default:
			a.content = true
		}
	}
}

func (a *aheadCount) over(maxLines, maxBytes int) bool {
	return a.lines > maxLines || a.bytes > maxBytes
}

// Next returns the next frame. last reports a final line without its newline, followed by
// EOF (a client that half-closed after its request): a protocol that serves it answers it and
// ends. On error the connection ends: a *FrameError is to be answered (Answer) first; ErrGone
// and read errors (EOF, the deadline, a closed connection) are not.
func (r *Reader) Next() (line []byte, last bool, err error) {
	for {
		r.s.setIdle(r.c, true, false)
		line, err = jsonline.ReadLine(r.r, r.Max)
		if r.s.setIdle(r.c, false, err == nil && !jsonline.IsBlank(line)) {
			return nil, false, &FrameError{Code: ledger.ServiceUnavailable, Reason: "evicted to make room",
				Detail: fmt.Sprintf("closed to make room for a new connection: more than %d connections waiting to be attested, this one idle longest", r.s.cfg.MaxPending)}
		}
		if errors.Is(err, jsonline.ErrTooLong) {
			// The rest of the line is not read: the connection ends here, so the frame
			// boundary is lost anyway.
			return nil, false, &FrameError{Code: ledger.PayloadTooLarge, Reason: r.What + " too long",
				Detail: fmt.Sprintf("%s exceeds %d bytes", r.What, r.Max)}
		}
		last = errors.Is(err, io.ErrUnexpectedEOF)
		if err != nil && !last {
			return nil, false, err
		}
		if !r.Blank && jsonline.IsBlank(line) {
			if last {
				return nil, false, io.EOF
			}
			continue
		}
		if r.Alive != nil && !r.Alive() {
			return nil, false, ErrGone
		}
		if !utf8.Valid(line) {
			return nil, false, &FrameError{Code: ledger.BadRequest, Reason: "invalid UTF-8", Detail: "frame is not valid UTF-8"}
		}
		return line, last, nil
	}
}

// setIdle marks c as waiting for a line (or not) and reports whether it was evicted. A
// frame read (framed true) moves it to the back of the eviction order; a blank line does
// not, so that blank lines keep a connection no younger than they keep its deadline.
func (s *Server) setIdle(c net.Conn, idle, framed bool) (evicted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := s.conns[c]
	if sl == nil {
		return false
	}
	if framed {
		sl.since = time.Now()
	}
	sl.idle = idle
	return sl.evicted
}

// Answer logs err as a refusal of request by actor and, when it is a *FrameError, writes its
// error frame. Other errors are logged at debug level (a timeout, a hang-up) or not at all.
func (s *Server) Answer(c net.Conn, actor, request string, err error) {
	var fe *FrameError
	switch {
	case errors.As(err, &fe):
		s.lim.Log(s.cfg.Log, slog.LevelWarn, request+" "+fe.Reason, "refused", "socket", s.cfg.Socket, "actor", actor, "request", request, "code", fe.Code, "reason", fe.Reason)
		s.Write(c, ErrorLine(fe.Code, fe.Detail))
	case errors.Is(err, ErrGone):
		s.lim.Log(s.cfg.Log, slog.LevelWarn, request+" gone", "refused", "socket", s.cfg.Socket, "actor", actor, "request", request, "reason", "peer process exited or its pid was reused")
	default:
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			s.cfg.Log.Debug("idle connection closed", "socket", s.cfg.Socket, "actor", actor)
		}
	}
}

// errorResp is the error frame of both line protocols (docs/protocol.md §2.4, §2.5).
type errorResp struct {
	Status string `json:"status"`
	Error  string `json:"error"`
	Detail string `json:"detail"`
}

// ErrorLine renders an error frame, with its newline.
func ErrorLine(code ledger.Code, detail string) []byte {
	line, err := jsonline.Encode(errorResp{Status: "error", Error: code.String(), Detail: detail})
	if err != nil {
		// Three strings always encode; fail closed with a fixed frame all the same.
		return []byte(`{"status":"error","error":"internal","detail":"encoding failed"}` + "\n")
	}
	return line
}
