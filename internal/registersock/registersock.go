// Package registersock serves register.sock: a service (svc) or a uid-admitted session (pi,
// opencode, hermes) registers with its first frame and then long-polls its queue on the same
// connection (docs/protocol.md §2.5, §4.2, §7).
//
// A registration belongs to its connection. It is made from the kernel's peer credentials (and
// for svc the peer's executable), never from ids in the request; every later frame acts on that
// registration only, and closing the connection ends it. A newer registration by the same
// process (a client that reconnected, its old connection still open) takes over: the old
// connection is closed and what it was handed but did not ack is delivered on the new one.
// An agy credential frame registers credentials and ends the connection after flushing the
// conversation's queue. Before a frame acts (and for a poll, when it is answered) the
// registered process must still be alive with the start time it registered with, so a
// descriptor passed on to another process (or outliving its process) cannot keep acting for it.
//
// Connections waiting for their first frame are in lineserver's unattested pool (MaxPending,
// closed FirstFrameTimeout after the connect, whatever they send). A registration takes one of
// the MaxConns slots; uid-only registrations (pi, opencode, hermes: any process of the uid can
// make one) take at most MaxUIDOnly of them, so they cannot keep an exe-attested service from
// re-registering. One pid holds at most MaxPerPID connections. After its first frame every
// registration must send a frame at least every IdleTimeout (plus the longest poll wait);
// blank lines do not count. Accepting, attesting the peer at connect, line framing, the pools
// and draining come from lineserver.
package registersock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/xmsg/xmsg/internal/agy"
	"github.com/xmsg/xmsg/internal/answer"
	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/custody"
	"github.com/xmsg/xmsg/internal/harness"
	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/limits"
	"github.com/xmsg/xmsg/internal/lineserver"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/ratelog"
)

// Defaults (docs/protocol.md §2.5, §5.6), from package limits.
const (
	DefaultFirstFrameTimeout = limits.RegisterFirstFrameTimeout
	DefaultMaxFirstFrame     = limits.RegisterMaxFirstFrame
	DefaultMaxFrame          = limits.RegisterMaxFrame
	// DefaultMaxConns caps connections served at once. Each costs goroutines (a registered
	// one two: the frame loop, which also waits a poll's wait, and its takeover watch) and a
	// read buffer, so a flood from one uid must not grow them without bound; 64 leaves room
	// for every service and session a user runs.
	DefaultMaxConns = limits.RegisterMaxConns
	// DefaultMaxUIDOnly caps uid-only registrations (pi, opencode, hermes, cli), which any process
	// of the uid can make, leaving the rest of MaxConns to exe-attested services.
	DefaultMaxUIDOnly = limits.RegisterMaxUIDOnly
	// DefaultIdleTimeout is how long a registration may send nothing beyond a poll's wait.
	DefaultIdleTimeout = limits.RegisterIdleTimeout
	// maxPipelined bounds the frames a client sends ahead of a poll that waits (a client may
	// send its next frame meanwhile), together with their size (MaxFrame and their newlines in
	// all); past either the client is refused and the connection ends. Outside a wait the
	// loop reads one frame after the other: what a client sends ahead waits in its socket.
	maxPipelined = 16
	// writeTimeout abandons a response the client does not read. A deliver frame that is not
	// written stays queued and is delivered again.
	writeTimeout = 10 * time.Second
	defaultWait  = 30 // seconds, when a poll names none
)

// Config of the server. Zero values take the defaults above.
type Config struct {
	Bus               Bus
	Proc              peercred.Proc
	Log               *slog.Logger
	FirstFrameTimeout time.Duration
	MaxFirstFrame     int
	MaxFrame          int
	MaxConns          int  // registrations served at once
	MaxPending        int  // connections before their first frame; 0: MaxConns
	MaxPerPID         int  // registrations of one peer pid; 0: no bound of its own
	NoEvict           bool // a full pending pool refuses the newest instead of evicting (lineserver)
	MaxUIDOnly        int  // uid-only registrations (pi, opencode, hermes, cli) at once
	IdleTimeout       time.Duration
	WriteTimeout      time.Duration // an answer the client does not read is abandoned after this
	// Custody holds the secrets a registered service may ask for (credential.go); nil: none.
	Custody *custody.Holder
}

// Server serves register.sock. Safe for concurrent use.
type Server struct {
	cfg Config
	srv *lineserver.Server

	// ctx ends long-polls at Shutdown; frames that change state ignore it and finish.
	ctx    context.Context
	cancel context.CancelFunc
	lim    ratelog.Limiter

	mu      sync.Mutex
	uidOnly map[string]int // uid-only registrations now, by process (pid and start time)

	// testSubscribed, when set (tests only), runs in a wait between its subscription and its
	// poll: where a message queued then claims the poll that the poll also finds.
	testSubscribed atomic.Pointer[func()]
}

// New returns a server; it serves once Serve is called.
func New(cfg Config) *Server {
	if cfg.FirstFrameTimeout <= 0 {
		cfg.FirstFrameTimeout = DefaultFirstFrameTimeout
	}
	if cfg.MaxFirstFrame <= 0 {
		cfg.MaxFirstFrame = DefaultMaxFirstFrame
	}
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = DefaultMaxFrame
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxUIDOnly <= 0 {
		cfg.MaxUIDOnly = DefaultMaxUIDOnly
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = writeTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, ctx: ctx, cancel: cancel}
	s.srv = lineserver.New(lineserver.Config{Socket: "register", Proc: cfg.Proc, Log: cfg.Log,
		MaxConns: cfg.MaxConns, MaxPending: cfg.MaxPending, MaxPerPID: cfg.MaxPerPID, PendingTimeout: cfg.FirstFrameTimeout, NoEvict: cfg.NoEvict, AttestedName: "registrations",
		WriteTimeout: cfg.WriteTimeout, Handle: s.serveConn})
	return s
}

// Evictions counts the connections evicted so far to make room for others.
func (s *Server) Evictions() uint64 { return s.srv.Evictions() }

// Conns is the number of connections being served now.
func (s *Server) Conns() int { return s.srv.Conns() }

// Idle is the number of connections waiting for their first frame (lineserver.Server.Idle).
func (s *Server) Idle() int { return s.srv.Idle() }

// Serve accepts connections on l until Shutdown, then returns net.ErrClosed. l must be a
// gate.Listener: a connection without gate credentials is closed unread.
func (s *Server) Serve(l net.Listener) error { return s.srv.Serve(l) }

// Shutdown stops accepting, ends long-polls (their messages stay queued), lets other frames
// being processed finish, and closes every connection, which ends its registration. When ctx
// ends first, the remaining connections are closed at once and ctx's error returned.
func (s *Server) Shutdown(ctx context.Context) error {
	// Long-polls end first: a poll is waiting, not working, and would otherwise hold the drain
	// for up to a minute. Every reader (first frame or loop) is then woken by lineserver; a
	// frame already read is still answered.
	s.cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("registersock: shutdown: %w", err)
	}
	return nil
}

// refuse logs a refusal, at most one line a second per (request, reason) with the count of
// the others.
func (s *Server) refuse(actor, request, reason string) {
	s.lim.Log(s.cfg.Log, slog.LevelWarn, request+" "+reason, "refused", "socket", "register", "actor", actor, "request", request, "reason", reason)
}

// attest takes one of the registration slots for c, before the bus registers anything: a
// registration refused for lack of a slot must not first replace a live one. Connections
// waiting for a first frame (or sending a bad one) never hold such a slot, so they cannot
// crowd registered services out. False: refused and answered.
func (s *Server) attest(c net.Conn, actor string) bool {
	err := s.srv.AttestErr(c)
	if err == nil {
		return true
	}
	// The bound named: all registrations, or this process's share of them.
	fe := err.(*lineserver.FrameError)
	s.refuse(actor, "register", fe.Reason)
	s.srv.Write(c, fe.Line())
	return false
}

// UIDOnly is the number of processes holding uid-only registrations now.
func (s *Server) UIDOnly() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.uidOnly)
}

// takeUIDOnly reserves a uid-only place for the process proc (pid and start time); false when
// all MaxUIDOnly are taken by other processes. A process registering again (it takes its older
// registration over) keeps its one place, so a reconnect is never refused for the place its
// own older connection still holds.
func (s *Server) takeUIDOnly(proc string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.uidOnly == nil {
		s.uidOnly = map[string]int{}
	}
	if s.uidOnly[proc] == 0 && len(s.uidOnly) >= s.cfg.MaxUIDOnly {
		return false
	}
	s.uidOnly[proc]++
	return true
}

func (s *Server) releaseUIDOnly(proc string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.uidOnly[proc]--; s.uidOnly[proc] <= 0 {
		delete(s.uidOnly, proc)
	}
}

// serveConn registers the attested peer with its first frame, then serves its loop.
func (s *Server) serveConn(c net.Conn, p lineserver.Peer) {
	cred, start, actor := p.Cred, p.Start, p.Actor
	// The registration must be made for the process that connected (p.Start), not for
	// whatever holds its pid by the time the first frame arrives.
	if !s.srv.ArmRead(c, s.cfg.FirstFrameTimeout) {
		return
	}
	r := s.srv.NewReader(c, s.cfg.MaxFirstFrame, "first frame")
	r.Alive = func() bool { return s.cfg.Proc.Alive(cred.PID, start) }
	r.Blank = true
	line, last, err := r.Next()
	if err != nil {
		s.srv.Answer(c, actor, "register", err)
		return
	}
	if last {
		// A first frame without its newline: nothing was asked, nothing answered.
		s.cfg.Log.Debug("no first frame", "socket", "register", "actor", actor)
		return
	}
	first, err := decodeFirst(line, s.cfg.Bus.Harnesses())
	if err != nil {
		s.refuse(actor, "register", "invalid json")
		s.srv.Write(c, errorLine(ledger.BadRequest, err.Error()))
		return
	}
	var reg *bus.Registration
	switch first.Kind {
	case kindCheck:
		has := s.cfg.Bus.Agy().HasCredentials(first.Conversation)
		s.srv.Write(c, encode(checkResp{Status: "ok", HasCredentials: has, HasCredentialsSnake: has}))
		return
	case kindAgy:
		s.registerAgy(c, first, cred, start, actor)
		return
	case kindService:
		if !s.attest(c, actor) {
			return
		}
		reg, err = s.cfg.Bus.RegisterService(first.Name, first.Cwd, cred, start)
	case kindSession:
		// Anyone of the uid can make one: a bounded number at once.
		proc := strconv.Itoa(cred.PID) + ":" + start
		if !s.takeUIDOnly(proc) {
			s.refuse(actor, "register", "too many uid-only registrations")
			s.srv.Write(c, errorLine(ledger.ServiceUnavailable, fmt.Sprintf("too many %s registrations (limit %d); retry later", first.Harness, s.cfg.MaxUIDOnly)))
			return
		}
		defer s.releaseUIDOnly(proc)
		if !s.attest(c, actor) {
			return
		}
		reg, err = s.cfg.Bus.RegisterSession(first.Harness, first.Name, first.Cwd, cred, start)
	}
	if err == nil && reg.Start != start {
		// The bus read the start time again: a different one means the pid was reused since
		// the connect, and the registration would belong to the wrong process.
		s.cfg.Bus.Unregister(reg)
		err = &bus.Error{Code: ledger.NotRecipient, Detail: fmt.Sprintf("peer process %d is gone", cred.PID)}
	}
	if err != nil {
		e := bus.AsError(err)
		s.refuse(actor, "register", e.Detail)
		s.srv.Write(c, errorLine(e.Code, e.Detail))
		return
	}
	defer s.cfg.Bus.Unregister(reg)
	s.cfg.Log.Info("registered", "socket", "register", "actor", reg.Caller().Actor(), "session_id", reg.SessionID, "peer_pid", reg.PID)
	// pollAck says that this daemon carries out an ack on a poll (frame): a client that sees
	// it may send its acks that way; one that does not sends ack frames. pollBatch says how
	// many messages a poll may ask for at once (max), and acks it may carry (acks).
	if !s.srv.Write(c, encode(registeredResp{Status: "ok", SessionID: reg.SessionID, PollAck: true, PollBatch: maxBatch})) {
		return
	}
	s.loop(c, r, reg)
	s.cfg.Log.Info("unregistered", "socket", "register", "actor", reg.Caller().Actor(), "session_id", reg.SessionID)
}

// registerAgy answers an agy credential frame, then flushes the conversation's queue (in
// FIFO order, each message once) and ends the connection.
func (s *Server) registerAgy(c net.Conn, f first, cred peercred.Cred, start, actor string) {
	if f.AgyErr != nil {
		s.refuse(actor, "register", f.AgyErr.Error())
		s.srv.Write(c, errorLine(ledger.BadRequest, f.AgyErr.Error()))
		return
	}
	reg, err := s.cfg.Bus.Agy().Register(f.Agy, cred, start)
	if err != nil {
		e := bus.AsError(err)
		s.refuse(actor, "register", e.Detail)
		s.srv.Write(c, errorLine(e.Code, e.Detail))
		return
	}
	s.cfg.Log.Info("registered", "socket", "register", "actor", reg.Caller().Actor(), "session_id", reg.SessionID, "peer_pid", cred.PID)
	s.srv.Write(c, encode(registeredResp{Status: "ok", SessionID: reg.SessionID}))
	s.cfg.Bus.Agy().Flush(reg)
}

// loop answers poll/ack(/reply) frames for reg until the connection ends. It reads its own
// frames, one after the other, answering each before the next is read (no goroutine hands
// them over); while a poll waits it reads on (waitPoll), so that the peer hanging up ends the
// poll at once (with or without frames sent ahead of it) instead of holding a dead
// registration for up to a minute. Each frame taken re-arms the idle deadline; blank lines do
// not.
func (s *Server) loop(c net.Conn, r *lineserver.Reader, reg *bus.Registration) {
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	// A newer registration by the same process takes over (a client that reconnected while
	// this connection stayed open): this connection ends, a poll waiting here included, and
	// whatever it was handed but did not ack is delivered again on the new one. The read
	// deadline wakes a loop waiting for its next frame; it is set after the cancel, and the
	// loop looks at ctx after its last ArmRead and before each read, so a deadline armed
	// later cannot hide the takeover.
	go func() {
		select {
		case <-reg.Replaced():
			s.cfg.Log.Info("replaced by a newer registration", "socket", "register", "actor", reg.Caller().Actor(), "session_id", reg.SessionID)
			cancel()
			c.SetReadDeadline(time.Now())
		case <-ctx.Done():
		}
	}()
	// Each frame taken re-arms the deadline (in frame): IdleTimeout, plus a poll's wait
	// (during which a well-behaved client sends nothing) for a poll.
	if !s.srv.ArmRead(c, s.cfg.IdleTimeout) {
		return
	}
	// The loop checks the registration itself (Bus.Alive, Bus.Current) in its turn.
	r.Max, r.What, r.Alive, r.Blank = s.cfg.MaxFrame, "frame", nil, false
	l := &conn{c: c, r: r, reg: reg, ctx: ctx, actor: reg.Caller().Actor(), raw: rawOf(c)}
	if l.raw == nil {
		// Every connection served is a gated Unix one, which has its descriptor: nothing
		// could answer a waiting poll without one.
		s.cfg.Log.Error("connection without a descriptor", "socket", "register", "actor", l.actor)
		return
	}
	for {
		if ctx.Err() != nil {
			return
		}
		// A frame the Reader refuses (too long, not UTF-8) is answered, and the connection
		// ends; so does a hang-up or a final line without its newline, unanswered.
		line, last, err := r.Next()
		if err != nil {
			if ctx.Err() == nil {
				s.srv.Answer(c, l.actor, "frame", err)
			}
			return
		}
		if last {
			return
		}
		resp, audit, ok := s.frame(l, line)
		// nil: answered by the frame (credential.go)
		written := ok && (resp == nil || s.srv.Write(c, resp))
		if audit != nil {
			// After the answer, off the client's wait (bus.Ack, WithAfter); also when the
			// answer could not be written, or was not (a poll that carried an ack, then ended
			// unanswered): what the frame did took effect all the same.
			audit()
		}
		if !written {
			return
		}
	}
}

// conn is one registration's connection, as its loop serves it.
type conn struct {
	c     net.Conn
	r     *lineserver.Reader
	reg   *bus.Registration
	ctx   context.Context // ends with the connection, a takeover, or Shutdown
	actor string
	// raw writes a waiting poll's answer from the goroutine that queued its message
	// (handover.go).
	raw  syscall.RawConn
	wait waiting
	// batch is the waiting poll's Max (0: no batch), for the goroutine that answers it.
	batch atomic.Int32
}

// alive reports whether the registered process is still the one that registered, and its
// registration still the one in force. If the process is gone (or its pid now names another
// process) nobody may act for it on this descriptor; if a newer registration took over, the
// new connection acts for it. Either way the connection ends unanswered.
func (s *Server) alive(l *conn, request string) bool {
	if !s.cfg.Bus.Alive(l.reg) {
		s.refuse(l.actor, request, "registered process exited or its pid was reused")
		return false
	}
	return l.reg.Current() // false: replaced; the takeover watch has cancelled ctx
}

// waitPoll is a poll that found nothing queued: it waits up to wait for a message, reading
// the connection meanwhile (lineserver.Reader.ReadAhead), so that a hang-up (or a client too
// far ahead) ends the wait at once. The wait is the loop's read itself, its deadline the end
// of the wait, so no goroutine is started for it. The goroutine that queues a message for reg
// answers the poll itself (handOver) while the loop reads on; the loop takes up the next
// frame once it is in (answered: the poll needs no answer from the loop). A takeover and
// Shutdown move the deadline into the past, as does a handover that leaves something to the
// loop. ok false: the connection ends (a client too far ahead is told so first).
func (s *Server) waitPoll(l *conn, wait time.Duration) (p *bus.Queued, answered bool, err error, ok bool) {
	end := time.Now().Add(wait)
	w := &l.wait
	for {
		w.open()
		stop := s.notify(l, w)
		if f := s.testSubscribed.Load(); f != nil {
			(*f)()
		}
		// After subscribing: a message queued from now on is seen here or claims the poll.
		p, err = s.cfg.Bus.Poll(l.ctx, l.reg, 0)
		if p != nil || err != nil {
			stop()
			if w.close() {
				return p, false, err, s.srv.ArmRead(l.c, s.cfg.IdleTimeout)
			}
			// A message queued meanwhile claimed the poll: the handover's answer stands, and
			// this one is dropped (the same message, or an older one that stays queued).
			p, err = nil, nil
		} else {
			// Each of the deadline's movers sets its mark (the wait's state, ctx) before the
			// deadline, and the marks are read after this arms it: a wakeup that came first
			// is seen here, and one that comes later moves the deadline armed here.
			if !s.srv.ArmReadUntil(l.c, end) {
				stop()
				w.close()
				return nil, false, nil, false
			}
			var rerr error
			if w.state.Load() == pollWaiting && l.ctx.Err() == nil {
				rerr = l.r.ReadAhead(maxPipelined, s.cfg.MaxFrame+maxPipelined, w.answeredAhead)
			}
			stop()
			if errors.Is(rerr, lineserver.ErrAhead) {
				w.close()
				s.refuse(l.actor, "frame", "too many frames pipelined")
				s.srv.Write(l.c, errorLine(ledger.BadRequest, fmt.Sprintf("more than %d frames sent ahead of their answers", maxPipelined)))
				return nil, false, nil, false
			}
			if w.close() {
				switch {
				case rerr != nil, l.ctx.Err() != nil:
					return nil, false, nil, false // hung up, taken over, or shutting down: the poll ends unanswered
				case !time.Now().Before(end):
					// Timed out. The idle time counts from the poll's end (IdleTimeout beyond
					// its wait, as when the poll was taken).
					return nil, false, nil, s.srv.ArmRead(l.c, s.cfg.IdleTimeout)
				}
				continue // woken early for nothing it knows of: look again
			}
			if rerr != nil {
				return nil, false, nil, false // hung up: what was handed over comes again
			}
		}
		// A handover ended the wait.
		switch w.state.Load() {
		case pollAnswered:
			return nil, true, nil, s.settled(l, w)
		case pollGone:
			return nil, false, nil, false
		}
		// Returned: nothing was answered; look again, unless the connection is ending.
		switch {
		case l.ctx.Err() != nil:
			return nil, false, nil, false
		case !time.Now().Before(end):
			return nil, false, nil, s.srv.ArmRead(l.c, s.cfg.IdleTimeout)
		}
	}
}

// notify subscribes l's waiting poll to its queue: the goroutine that queues a message
// answers the poll (handOver).
func (s *Server) notify(l *conn, w *waiting) (stop func()) {
	return l.reg.NotifyQueuedThen(func() func() {
		if !w.claim() {
			return nil
		}
		return func() { s.handOver(l, w) }
	})
}

// settled finishes a poll a handover answered: what it could not write is written now (the
// loop may wait for the socket, as for any answer), and the idle deadline is armed from here.
// False: the connection ends.
func (s *Server) settled(l *conn, w *waiting) bool {
	if w.state.Load() != pollAnswered {
		return false
	}
	if len(w.rest) > 0 && !s.srv.Write(l.c, w.rest) {
		return false
	}
	w.rest = nil
	return s.srv.ArmRead(l.c, s.cfg.IdleTimeout)
}

// frame answers one loop frame. ok is false when the connection must end without an answer
// (a poll interrupted by hang-up or shutdown). audit, when not nil, is the frame's audit line,
// to be written once the answer is out (or, when ok is false, at once: a poll's ack that took
// effect before the poll ended unanswered).
func (s *Server) frame(l *conn, line []byte) (resp []byte, audit func(), ok bool) {
	ctx, c, reg, actor := l.ctx, l.c, l.reg, l.actor
	req, quick := quickLoop(line)
	var derr error
	if !quick {
		req, derr = decodeLoop(line)
	}
	// The frame taken re-arms the read deadline, once: IdleTimeout, plus its wait for a poll.
	idle := s.cfg.IdleTimeout
	if derr == nil && req.Action == "poll" {
		idle += time.Duration(req.WaitSecs) * time.Second
	}
	if !s.srv.ArmRead(c, idle) {
		return nil, nil, false
	}
	// Liveness is checked where a frame acts: before anything but a plain poll (a poll that
	// carries an ack acts before it polls), and for a poll when it is answered (below), which
	// also covers a poll that waited.
	acks := req.acked()
	if (derr != nil || req.Action != "poll" || len(acks) > 0) && !s.alive(l, "frame") {
		return nil, nil, false
	}
	if derr != nil {
		s.refuse(actor, "frame", "invalid json")
		return errorLine(ledger.BadRequest, derr.Error()), nil, true
	}
	if len(acks) > 0 && req.Action != "poll" {
		// Refused rather than ignored: a client that put its ack on another frame must not
		// believe it took effect.
		s.refuse(actor, "frame", "ack is only for poll")
		return errorLine(ledger.BadRequest, "ack is only for poll"), nil, true
	}
	switch {
	case req.Action == "poll":
		// The acks first, in order, each as an ack frame would do it; the poll's answer is
		// the only answer. An ack that could not be stored is answered instead, and nothing is
		// polled: the client must not believe it (or any after it) took effect, and sends
		// them again (acking a message again changes nothing). Those before it stand, and are
		// audited.
		var lines []func()
		for _, id := range acks {
			var line func()
			if resp := s.ack(ctx, l, id, &line); resp != nil {
				return resp, auditAll(lines), true
			}
			if line != nil {
				lines = append(lines, line)
			}
		}
		audit = auditAll(lines)
		wait := time.Duration(req.WaitSecs) * time.Second
		// checked: the process was checked in this frame, before its acks, with nothing
		// waited for since; a poll answered at once needs no second look (the answer's write
		// is as far from either check).
		checked := len(acks) > 0
		p, err := s.cfg.Bus.Poll(ctx, reg, 0)
		if err == nil && p == nil && wait > 0 {
			checked = false
			// The ack's audit line is not held for the wait (up to a minute).
			if audit != nil {
				audit()
				audit = nil
			}
			var answered bool
			l.batch.Store(int32(req.Max)) // how the goroutine that queues a message answers
			if p, answered, err, ok = s.waitPoll(l, wait); !ok {
				return nil, nil, false
			}
			if answered {
				return nil, nil, true // by the goroutine that queued the message (handOver)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, audit, false
			}
			s.lim.Log(s.cfg.Log, slog.LevelError, "poll failed", "poll failed", "socket", "register", "actor", actor, "err", err)
			return errorLine(ledger.Internal, "poll failed"), audit, true
		}
		// The registered process must still be the one holding this connection when the
		// poll is answered, a message handed out or not: checked now, not when the poll was
		// read (a poll may wait a minute), and once.
		if !checked && !s.alive(l, "poll") {
			return nil, audit, false
		}
		if p == nil {
			return encode(timeoutResp{Action: "timeout"}), audit, true
		}
		return s.answer(reg, *p, req.Max), audit, true
	case req.Action == "ack":
		if resp := s.ack(ctx, l, req.MessageID, &audit); resp != nil {
			return resp, nil, true
		}
		return okLine, audit, true
	case req.Action == "reply" && s.cfg.Bus.Harnesses().Is(reg.Harness, harness.Exe):
		if req.MessageID == "" || req.Text == "" {
			s.refuse(actor, "reply", "messageId and text are required")
			return errorLine(ledger.BadRequest, "messageId and text are required"), nil, true
		}
		// Unlike the original xmsg (which recorded `pushed` without pushing), a local reply
		// here is pushed like an agent.sock reply (docs/protocol.md §7.4).
		res, err := s.cfg.Bus.Reply(context.WithoutCancel(ctx), reg.Caller(), req.MessageID, req.Text)
		audit = func() {
			s.cfg.Bus.Events().Request(ledger.Via{Transport: ledger.Register, Actor: actor}, ledger.Replied, "reply", req.MessageID, res.Result(req.MessageID), err)
		}
		if err != nil {
			e := bus.AsError(err)
			detail := e.Detail
			if e.Code == ledger.NotFound {
				// The original's wording on this socket (docs/protocol.md §4.2).
				detail = "message '" + req.MessageID + "' not found"
			}
			return errorLine(e.Code, detail), audit, true
		}
		// The pushed message is the reply's new message id; with no push (no return address,
		// pushes disabled, sender gone) there is none, and the original id is returned.
		id := res.MessageID
		if res.PushedMessageID != "" {
			id = res.PushedMessageID
		}
		return encode(replyResp{Status: "ok", MessageID: id}), audit, true
	case req.Action == "credential":
		resp, ok := s.credential(c, reg, line)
		return resp, nil, ok
	default:
		s.refuse(actor, "frame", "unknown action")
		return errorLine(ledger.BadRequest, "unknown action: "+req.Action), nil, true
	}
}

// ack acknowledges messageID for l's registration, for an ack frame or a poll that carries
// one. It returns nil when the ack is stored (or changes nothing: an id that is not this
// registration's pending message, as in the original xmsg, docs/protocol.md §4.2, is scoped
// away by the bus and says nothing about it), with the ack's audit line in *audit; otherwise
// the error line to answer: the message stays queued and comes again, and the client must not
// believe otherwise.
func (s *Server) ack(ctx context.Context, l *conn, messageID string, audit *func()) []byte {
	if err := s.cfg.Bus.Ack(bus.WithAfter(ctx, func(line func()) { *audit = line }), l.reg, messageID); err != nil {
		s.lim.Log(s.cfg.Log, slog.LevelError, "ack failed", "ack failed", "socket", "register", "actor", l.actor, "err", err)
		e := bus.AsError(err)
		return errorLine(e.Code, e.Detail)
	}
	return nil
}

// answer is a poll's answer that hands out head, the oldest message of reg's queue: its
// deliver frame, or with limit (a batch asked for) a batch frame of up to limit messages from
// head on, together at most maxBatchBytes of text and envelope (head whatever its size).
// Should the batch not start at head after all (the queue changed between the two looks,
// which only a takeover does), or not be read, head goes alone.
func (s *Server) answer(reg *bus.Registration, head bus.Queued, limit int) []byte {
	origin := s.origin(reg)
	if limit == 0 {
		return encodeDeliver(answer.DeliverOf(head, origin))
	}
	msgs := []bus.Queued{head}
	if limit > 1 {
		if more, _, err := s.cfg.Bus.Peek(reg, limit, maxBatchBytes); err == nil && len(more) > 0 && more[0].ID == head.ID {
			msgs = more
		}
	}
	dst := append(make([]byte, 0, 64), `{"action":"batch","messages":[`...)
	for i, m := range msgs {
		if i > 0 {
			dst = append(dst, ',')
		}
		line := encodeDeliver(answer.DeliverOf(m, origin))
		dst = append(dst, line[:len(line)-1]...) // without its newline
	}
	return append(dst, "]}\n"...)
}

// maxBatchBytes bounds a batch's texts and envelopes together.
const maxBatchBytes = limits.RegisterMaxBatchBytes

// auditAll is the audit lines of a frame's acks, in order; nil for none.
func auditAll(lines []func()) func() {
	switch len(lines) {
	case 0:
		return nil
	case 1:
		return lines[0]
	}
	return func() {
		for _, line := range lines {
			line()
		}
	}
}

// origin reports whether reg's harness's queue entries carry their origin (services).
func (s *Server) origin(reg *bus.Registration) bool {
	h := s.cfg.Bus.Harnesses().Named(reg.Harness)
	return h != nil && h.Origin()
}

// okLine is encode(okResp{Status: "ok"}), the answer to every ack: written, never changed.
var okLine = encode(okResp{Status: "ok"})

// encodeDeliver is encode(d), without reflection (appendDeliver).
func encodeDeliver(d answer.Deliver) []byte {
	line, ok := appendDeliver(make([]byte, 0, 128+len(d.Text)+len(d.Envelope)+len(d.Origin)), d)
	if !ok {
		return encode(d)
	}
	return line
}

type (
	okResp struct {
		Status string `json:"status"`
	}
	checkResp struct {
		Status              string `json:"status"`
		HasCredentials      bool   `json:"hasCredentials"`
		HasCredentialsSnake bool   `json:"has_credentials"`
	}
	registeredResp struct {
		Status    string `json:"status"`
		SessionID string `json:"sessionId"`
		PollAck   bool   `json:"pollAck,omitempty"`
		PollBatch int    `json:"pollBatch,omitempty"` // the most messages a poll's max may ask for
	}
	timeoutResp struct {
		Action string `json:"action"`
	}
	replyResp struct {
		Status    string `json:"status"`
		MessageID string `json:"messageId"`
	}
)

// errorLine is register.sock's error shape. The original had no code field (docs/protocol.md
// §4.2); this one carries the protocol's code next to the detail, as agent.sock does, so that
// clients can branch on it. Clients that read only `detail` ignore the extra field.
// errorLine is the error frame (shared with agent.sock: lineserver.ErrorLine).
func errorLine(code ledger.Code, detail string) []byte { return lineserver.ErrorLine(code, detail) }

// encode renders one response line (jsonline: no HTML escaping, as the original xmsg).
func encode(v any) []byte {
	line, err := jsonline.Encode(v)
	if err != nil {
		return []byte(`{"status":"error","error":"internal","detail":"encoding failed"}` + "\n")
	}
	return line
}

// decodeError is the detail of a frame that does not decode: "invalid json" for anything that
// is not one JSON object (docs/protocol.md §4.2), and the field for a field of the wrong type.
func decodeError(err error) string {
	var fe *jsonline.FieldError
	if errors.As(err, &fe) {
		return fe.Error()
	}
	return "invalid json"
}

// Kinds of first frame (docs/protocol.md §4.2 dispatch order).
const (
	kindCheck   = "check"
	kindSession = "session"
	kindService = "service"
	kindAgy     = "credential"
)

type first struct {
	Kind         string
	Harness      string // for kindSession: pi, opencode, hermes
	Name         string // service name, or session name
	Cwd          string
	Conversation string          // for kindCheck
	Agy          agy.Credentials // for kindAgy
	AgyErr       error           // for kindAgy: why the credential frame is invalid
}

// decodeFirst classifies a first frame. Any caller-supplied session id is ignored: ids are
// minted by the bus.
func decodeFirst(line []byte, hs *harness.Registry) (first, error) {
	obj, err := jsonline.Decode(line)
	if err != nil {
		return first{}, errors.New(decodeError(err))
	}
	field := func(names ...string) (string, error) {
		v, err := obj.String(names...)
		if err != nil {
			return "", errors.New(decodeError(err))
		}
		return v, nil
	}
	action, err := field("action")
	if err != nil {
		return first{}, err
	}
	if action == "check" || action == "has_credentials" {
		conv, err := field("conversation_id", "conversationId")
		if err != nil {
			return first{}, err
		}
		return first{Kind: kindCheck, Conversation: conv}, nil
	}
	name, err := field("harness")
	if err != nil {
		return first{}, err
	}
	cwd, err := field("cwd")
	if err != nil {
		return first{}, err
	}
	switch {
	case hs.Is(name, harness.Exe):
		name, err := field("name")
		if err != nil {
			return first{}, err
		}
		return first{Kind: kindService, Name: name, Cwd: cwd}, nil
	case hs.Is(name, harness.UID):
		session, err := field("sessionName", "session_name")
		if err != nil {
			return first{}, err
		}
		return first{Kind: kindSession, Harness: name, Name: session, Cwd: cwd}, nil
	}
	creds, err := agy.DecodeCredentials(obj)
	return first{Kind: kindAgy, Agy: creds, AgyErr: err}, nil
}

type loopReq struct {
	Action    string
	MessageID string
	Text      string
	WaitSecs  int
	// Ack is the message a poll acknowledges before it polls (docs/protocol.md §4.2); "" for
	// none. Only a poll may carry one (frame refuses it elsewhere).
	Ack string
	// Acks are more messages a poll acknowledges, after Ack: those of the batch before.
	Acks []string
	// Max, when not 0, asks for a batch: up to Max messages in one answer (1..maxBatch).
	Max int
}

// errEmptyAck refuses an ack field that names no message: a client that sends one meant to
// acknowledge something, and an ack of nothing must not be taken for one that took effect.
var errEmptyAck = errors.New("invalid json: field 'ack' must not be empty")

// acked returns the messages req acknowledges: its ack, then its acks.
func (req loopReq) acked() []string {
	if req.Ack == "" {
		return req.Acks
	}
	return append([]string{req.Ack}, req.Acks...)
}

// decodeLoop parses a poll/ack/reply frame. waitSecs defaults to 30 and is clamped to 0..60
// (rounded up); messageId also accepts message_id, waitSecs wait_secs. ack, when present
// (and not null), must be a non-empty string.
func decodeLoop(line []byte) (loopReq, error) {
	obj, err := jsonline.Decode(line)
	if err != nil {
		return loopReq{}, errors.New(decodeError(err))
	}
	var req loopReq
	for _, f := range []struct {
		dst   *string
		names []string
	}{
		{&req.Action, []string{"action"}},
		{&req.MessageID, []string{"messageId", "message_id"}},
		{&req.Text, []string{"text"}},
	} {
		if *f.dst, err = obj.String(f.names...); err != nil {
			return loopReq{}, errors.New(decodeError(err))
		}
	}
	ack, present, err := obj.OptString("ack")
	if err != nil {
		return loopReq{}, errors.New(decodeError(err))
	}
	if present && ack == "" {
		return loopReq{}, errEmptyAck
	}
	req.Ack = ack
	w, present, err := obj.Number("waitSecs", "wait_secs")
	if err != nil {
		return loopReq{}, errors.New(decodeError(err))
	}
	req.WaitSecs = defaultWait
	if present {
		req.WaitSecs = int(math.Ceil(min(max(w, 0), float64(bus.MaxWait/time.Second))))
	}
	n, present, err := obj.Number("max")
	if err != nil {
		return loopReq{}, errors.New(decodeError(err))
	}
	if present {
		req.Max = int(math.Ceil(min(max(n, 1), maxBatch)))
	}
	if raw, _, present := obj.Raw("acks"); present {
		if json.Unmarshal(raw, &req.Acks) != nil {
			return loopReq{}, errAcks
		}
		if len(req.Acks) > maxBatch {
			return loopReq{}, errTooManyAcks
		}
		if slices.Contains(req.Acks, "") {
			return loopReq{}, errEmptyAcks
		}
	}
	return req, nil
}

// maxBatch is the most messages a poll hands out at once, and acks it carries.
const maxBatch = limits.RegisterMaxBatch

var (
	errAcks        = errors.New("invalid json: field 'acks' must be an array of strings")
	errTooManyAcks = fmt.Errorf("invalid json: field 'acks' holds more than %d ids", maxBatch)
	errEmptyAcks   = errors.New("invalid json: field 'acks' must not hold an empty id")
)
