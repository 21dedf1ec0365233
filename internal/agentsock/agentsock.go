// Package agentsock serves agent.sock: newline-delimited JSON requests from processes of our own
// uid, each attested by the kernel and /proc (docs/protocol.md §2.4, §4.1).
//
// Who the caller is never comes from the request. The listener (a gate.Listener) has already
// refused other uids; here the peer's pid comes from SO_PEERCRED, its start time is read at
// connect, and before every frame the pid must still be that same process. The session the
// frame acts for is then found by the bus's ancestor walk from that pid. Fields a client writes
// about itself (`from`, `return_to`, ...) are ignored. The one exception is `_meta`, the MCP
// request's params._meta passed on by the bridge: for a caller below a trusted Codex process it
// names the thread the call is for, and the daemon then proves that process writes it (see
// bus.IdentifyMeta); for anyone else it is ignored. Codex threads read their queue here with
// poll/ack frames; `mcp_start` attests an Antigravity session.
//
// Each connection is bounded: a line longer than MaxLine is answered with one error and the
// connection closed, a connection with no frame for IdleTimeout is closed (blank lines do not
// count: only an answered frame re-arms the deadline), a response the client does not read
// within WriteTimeout is abandoned. A connection counts against MaxConns only once a frame from
// it has been attested to a session; until then it is in lineserver's unattested pool
// (MaxPending, closed PendingTimeout after the connect whatever it sends), and one pid holds at
// most MaxPerPID connections. Accepting, attesting the peer at connect, line framing, the pools
// and draining come from lineserver.
package agentsock

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/xmsg/xmsg/internal/answer"
	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/custody"
	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/limits"
	"github.com/xmsg/xmsg/internal/lineserver"
	"github.com/xmsg/xmsg/internal/peercred"
	"github.com/xmsg/xmsg/internal/ratelog"
)

// Defaults of the per-socket limits (docs/design.md §3), from package limits.
const (
	DefaultMaxLine      = limits.AgentMaxLine
	DefaultMaxConns     = limits.AgentMaxConns
	DefaultIdleTimeout  = limits.AgentIdleTimeout
	DefaultWriteTimeout = limits.AgentWriteTimeout
	// DefaultMaxPending and DefaultPendingTimeout bound connections no frame of which has been
	// attested yet (see limits).
	DefaultMaxPending     = limits.AgentMaxPending
	DefaultPendingTimeout = limits.AgentPendingTimeout
)

// Config of the server. Zero limits take the defaults above.
type Config struct {
	Bus     Bus
	Proc    peercred.Proc
	Log     *slog.Logger
	MaxLine int // bytes per request line, without the newline
	// MaxFrame is the protocol's frame cap, max_body*6+4096 (docs/protocol.md §2.4); 0 = none.
	// It is kept in addition to MaxLine (docs/protocol.md §2.4): the smaller of the two applies.
	MaxFrame   int
	MaxConns   int  // attested connections served at once
	MaxPending int  // connections not yet attested; the next is closed at accept
	MaxPerPID  int  // attested connections of one peer pid; 0: no bound of its own
	NoEvict    bool // a full pending pool refuses the newest instead of evicting (lineserver)
	// PendingTimeout closes a connection that has not been attested this long after connect.
	PendingTimeout time.Duration
	IdleTimeout    time.Duration // no complete line for this long: close
	WriteTimeout   time.Duration // a response not read by the client for this long: close
	Host           string        // host label for sender badges; "" = Bus.Host()
	// Custody holds the secrets a service's descendant may ask for (credential.go); nil: none.
	Custody *custody.Holder
}

// Server serves agent.sock. Safe for concurrent use.
type Server struct {
	cfg Config
	srv *lineserver.Server

	// ctx is passed to the bus; it is cancelled only when Shutdown's deadline expires.
	ctx    context.Context
	cancel context.CancelFunc
	lim    ratelog.Limiter
}

// New returns a server; it serves once Serve is called.
func New(cfg Config) *Server {
	if cfg.MaxLine <= 0 {
		cfg.MaxLine = DefaultMaxLine
	}
	if cfg.MaxFrame > 0 && cfg.MaxFrame < cfg.MaxLine {
		cfg.MaxLine = cfg.MaxFrame
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	if cfg.PendingTimeout <= 0 {
		cfg.PendingTimeout = DefaultPendingTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.Host == "" && cfg.Bus != nil {
		cfg.Host = cfg.Bus.Host()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, ctx: ctx, cancel: cancel}
	s.srv = lineserver.New(lineserver.Config{Socket: "agent", Proc: cfg.Proc, Log: cfg.Log,
		MaxConns: cfg.MaxConns, MaxPending: cfg.MaxPending, MaxPerPID: cfg.MaxPerPID, PendingTimeout: cfg.PendingTimeout, NoEvict: cfg.NoEvict,
		WriteTimeout: cfg.WriteTimeout, Handle: s.serveConn})
	return s
}

// Evictions counts the connections evicted so far to make room for others.
func (s *Server) Evictions() uint64 { return s.srv.Evictions() }

// Conns is the number of connections being served now.
func (s *Server) Conns() int { return s.srv.Conns() }

// Idle is the number of unattested connections waiting for a frame (lineserver.Server.Idle).
func (s *Server) Idle() int { return s.srv.Idle() }

// Serve accepts connections on l until Shutdown, then returns net.ErrClosed. l must be a
// gate.Listener: a connection without gate credentials is closed unread.
func (s *Server) Serve(l net.Listener) error { return s.srv.Serve(l) }

// Shutdown stops accepting, lets frames being processed finish and closes every connection.
// When ctx ends first, the remaining connections are closed at once and ctx's error returned.
func (s *Server) Shutdown(ctx context.Context) error {
	// A frame being processed finishes its bus call with the bus context intact; only when the
	// drain deadline passes is that context cancelled, so a call stuck in delivery gives up.
	stop := context.AfterFunc(ctx, s.cancel)
	defer stop()
	err := s.srv.Shutdown(ctx)
	s.cancel()
	if err != nil {
		return fmt.Errorf("agentsock: shutdown: %w", err)
	}
	return nil
}

// refuse logs a refused frame, at most one line a second per (request, code) with the count
// of the others: a client looping on a refused frame must not flood the journal.
func (s *Server) refuse(actor, request string, code ledger.Code, reason string) {
	s.lim.Log(s.cfg.Log, slog.LevelWarn, request+" "+code.String(), "refused", "socket", "agent", "actor", actor, "request", request, "code", code.String(), "reason", reason)
}

// serveConn answers the frames of one connection until it ends. lineserver's Reader does
// the read prologue (blank lines, the line cap, the pid check, UTF-8, an eviction).
func (s *Server) serveConn(c net.Conn, p lineserver.Peer) {
	cred, start, actor := p.Cred, p.Start, p.Actor
	var att *bus.Attested // the connection's caller, attested at its first send or reply
	// The pid must still name the process that connected (lineserver.Peer.Start), checked
	// before every frame; the guard does it with a pidfd where it can (no /proc read).
	peer := s.cfg.Proc.Guard(cred.PID, start)
	defer peer.Close()
	r := s.srv.NewReader(c, s.cfg.MaxLine, "line")
	r.Alive = peer.Alive
	// The idle deadline is armed here and after each answered frame, never for a blank line:
	// a client sending only blank lines (or a line a byte at a time) is still closed when it
	// runs out. A connection waiting for its next line is woken by Shutdown; one processing a
	// frame finishes it, answers, and then sees the server closing when it re-arms.
	if !s.srv.ArmRead(c, s.cfg.IdleTimeout) {
		return
	}
	var later []func()
	after := func(fn func()) { later = append(later, fn) }
	for {
		// An unterminated line followed by EOF is still a request (the client half-closed);
		// a partial line cut off by the idle deadline or a read error is not.
		line, last, err := r.Next()
		if err != nil {
			s.srv.Answer(c, actor, "frame", err)
			return
		}
		resp, keep := s.frame(c, cred, actor, peer, &att, line, after)
		wrote := resp == nil || s.srv.Write(c, resp) // nil: answered by the frame (credential.go)
		// The work the frame handed over (bus.WithAfter, the audit line) is done once the
		// answer is out, off the client's wait, whether or not it could be written.
		for i, fn := range later {
			fn()
			later[i] = nil
		}
		later = later[:0]
		if !wrote || last || !keep || !s.srv.ArmRead(c, s.cfg.IdleTimeout) {
			return
		}
	}
}

// request is every field of every agent.sock frame, decoded by jsonline (its aliases
// folded into the canonical names).
type request struct {
	Action         string
	Ref, Text, Key string
	MessageID      string
	PushReplies    *bool // nil: not given (the default is true)
	// Meta is the MCP request's params._meta, passed on by the bridge. Only a caller that
	// descends from a trusted Codex process uses it (to name its thread); see bus.IdentifyMeta.
	Meta     json.RawMessage
	WaitSecs *float64 // poll (codex threads)
	// Max and MaxBytes bound a peek's batch (codex threads); nil: the defaults.
	Max, MaxBytes *float64
}

// decodeRequest parses one frame: a single JSON object. Unknown fields are ignored (the
// protocol lets clients send extras such as `return_to`; none of them is ever used).
func decodeRequest(line []byte) (request, error) {
	obj, err := jsonline.Decode(line)
	if err != nil {
		return request{}, err
	}
	var req request
	for _, f := range []struct {
		dst   *string
		names []string
	}{
		{&req.Action, []string{"action"}},
		{&req.Ref, []string{"ref"}},
		{&req.Text, []string{"text"}},
		{&req.Key, []string{"idempotency_key", "idempotencyKey"}},
		{&req.MessageID, []string{"messageId", "message_id"}},
	} {
		if *f.dst, err = obj.String(f.names...); err != nil {
			return request{}, err
		}
	}
	push, present, err := obj.Bool("push_replies", "pushReplies")
	if err != nil {
		return request{}, err
	}
	if present {
		req.PushReplies = &push
	}
	if raw, _, ok := obj.Raw("_meta"); ok {
		req.Meta = raw
	}
	wait, present, err := obj.Number("waitSecs", "wait_secs")
	if err != nil {
		return request{}, err
	}
	if present {
		req.WaitSecs = &wait
	}
	for _, f := range []struct {
		dst   **float64
		names []string
	}{{&req.Max, []string{"max"}}, {&req.MaxBytes, []string{"maxBytes", "max_bytes"}}} {
		v, present, err := obj.Number(f.names...)
		if err != nil {
			return request{}, err
		}
		if present {
			*f.dst = &v
		}
	}
	return req, nil
}

// errorLine is the error frame (shared with register.sock: lineserver.ErrorLine).
func errorLine(code ledger.Code, detail string) []byte { return lineserver.ErrorLine(code, detail) }

// encode renders one response line (jsonline: no HTML escaping, as the original xmsg,
// docs/protocol.md §4.1).
func encode(v any) []byte {
	line, err := jsonline.Encode(v)
	if err != nil {
		return []byte(`{"status":"error","error":"internal","detail":"encoding failed"}` + "\n")
	}
	return line
}

// frame answers one valid-UTF-8, non-blank line; keep false means the connection ends after
// the answer.
//
// The caller is attested once per connection (the ancestor walk) and, before each later
// frame, only re-checked: the peer's start time (serveConn), the ancestor's start time and
// its session (bus.Recheck). When that fails, the ancestry is walked again. after takes the
// work that can wait until the answer is written (bus.WithAfter).
func (s *Server) frame(c net.Conn, cred peercred.Cred, actor string, peer *peercred.Guard, att **bus.Attested, line []byte, after func(func())) (resp []byte, keep bool) {
	req, err := decodeRequest(line)
	if err != nil {
		s.refuse(actor, "frame", ledger.BadRequest, "invalid json")
		return errorLine(ledger.BadRequest, err.Error()), true
	}
	switch req.Action {
	case "send", "reply", "poll", "ack", "peek", "credential":
	case "harness":
		// Which harness the caller's ancestry belongs to (no attestation of a thread): the
		// MCP bridge asks once at start, to offer receive only under Codex.
		h := s.cfg.Bus.Ancestry(cred.PID)
		if !peer.Alive() {
			h = ""
		}
		return encode(harnessResp{Status: "ok", Harness: h}), true
	case "mcp_start":
		// agy attestation without credentials: the chain above the peer must hold a
		// conversation's presence lock from a trusted agy executable.
		id, err := s.cfg.Bus.Agy().MCPStart(cred.PID)
		if err == nil && !peer.Alive() {
			err = &bus.Error{Code: ledger.Unattested, Detail: fmt.Sprintf("peer PID %d exited", cred.PID)}
		}
		if err != nil {
			e := bus.AsError(err)
			s.refuse(actor, "mcp_start", e.Code, e.Detail)
			return errorLine(e.Code, e.Detail), true
		}
		if err := s.srv.AttestErr(c); err != nil {
			fe := err.(*lineserver.FrameError)
			s.refuse(actor, "mcp_start", fe.Code, fe.Reason)
			return fe.Line(), false
		}
		s.cfg.Log.Info("accepted", "socket", "agent", "actor", actor, "request", "mcp_start", "session_id", id)
		return encode(mcpStartResp{Status: "ok", SessionID: id}), true
	default:
		detail := fmt.Sprintf("unknown action: '%s'", req.Action)
		s.refuse(actor, "frame", ledger.BadRequest, "unknown action")
		return errorLine(ledger.BadRequest, detail), true
	}
	var err2 error
	if *att == nil || !(**att).Recheck() {
		*att = nil
		a, err := s.cfg.Bus.Attest(cred.PID, req.Meta)
		// The walk read /proc/<pid> again. If the pid was recycled between the check before
		// this frame and the walk, the walk may have found the new process's session;
		// re-checking the start time afterwards rules that out (a pid cannot come back with
		// the same start time).
		if err == nil && !peer.Alive() {
			err = &bus.Error{Code: ledger.NotRecipient, Detail: fmt.Sprintf("peer PID %d exited", cred.PID)}
		}
		if err == nil {
			*att = &a
		}
		err2 = err
	}
	if err2 != nil {
		e := bus.AsError(err2)
		if req.Action == "credential" && e.Code != ledger.ServiceUnavailable {
			return s.unattested(actor, cred.PID, line, e.Detail), true // credential.go
		}
		s.refuse(actor, req.Action, e.Code, e.Detail)
		return errorLine(e.Code, e.Detail), true
	}
	caller := (*att).Caller
	// Only now does the connection take an attested slot: connections that never attest stay
	// in the unattested pool and cannot crowd sessions out.
	if err := s.srv.AttestErr(c); err != nil {
		fe := err.(*lineserver.FrameError)
		s.refuse(caller.Actor(), req.Action, fe.Code, fe.Reason)
		return fe.Line(), false
	}
	switch req.Action {
	case "send":
		return s.send(caller, req, after), true
	case "poll", "ack", "peek":
		return s.queue(caller, req), true
	case "credential":
		return s.credential(c, caller, cred.PID, line, func() bool { return peer.Alive() && (**att).Recheck() })
	}
	return s.reply(caller, req), true
}

type harnessResp struct {
	Status  string `json:"status"`
	Harness string `json:"harness"`
}

type mcpStartResp struct {
	Status    string `json:"status"`
	SessionID string `json:"sessionId"`
}

type sendResp struct {
	Status   string          `json:"status"`
	Delivery answer.Delivery `json:"delivery"`
}

func (s *Server) send(caller bus.Caller, req request, after func(func())) []byte {
	ref, text := req.Ref, req.Text
	if ref == "" || text == "" {
		s.refuse(caller.Actor(), "send", ledger.BadRequest, "ref and text are required")
		return errorLine(ledger.BadRequest, "ref and text are required")
	}
	push := true
	if req.PushReplies != nil {
		push = *req.PushReplies
	}
	// Every identity field comes from attestation: the badge, the idempotency principal and
	// the return address (Caller). Nothing in req can name another sender.
	d, err := s.cfg.Bus.Send(bus.WithAfter(s.ctx, after), bus.Send{
		To: envelope.ParseRef(ref), Text: text, Bytes: len(text),
		FromName:    envelope.AttestedBadge(s.cfg.Host, caller.Harness, caller.Name),
		Principal:   "session:" + caller.SessionID,
		Caller:      &caller,
		PushReplies: push,
		Key:         req.Key,
	})
	after(func() {
		s.cfg.Bus.Events().Request(ledger.Via{Transport: ledger.Agent, Actor: caller.Actor()}, ledger.Sent, "send", ref, d.Result(text), err)
	})
	if err != nil {
		e := sendError(err, ref)
		return errorLine(e.Code, e.Detail)
	}
	return encode(sendResp{Status: "ok", Delivery: answer.DeliveryOf(d)})
}

// sendError maps bus refusals to agent.sock's codes (docs/protocol.md §4.1 send).
func sendError(err error, ref string) *bus.Error {
	e := bus.AsError(err)
	switch e.Code {
	case ledger.NotFound, ledger.Ambiguous, ledger.Gone:
		return &bus.Error{Code: ledger.NotFound, Detail: e.Detail}
	case ledger.Unregistered:
		if e.PID == 0 {
			return &bus.Error{Code: ledger.Unregistered, Detail: fmt.Sprintf("pid %s is unregistered", ref)}
		}
		return &bus.Error{Code: ledger.Unregistered, Detail: fmt.Sprintf("pid %d is unregistered", e.PID), PID: e.PID}
	case ledger.InboxUnavailable, ledger.InboxTimeout:
		return &bus.Error{Code: ledger.DeliveryFailed, Detail: e.Detail}
	}
	return e
}

type replyResp struct {
	Status string             `json:"status"`
	Reply  answer.ReplyResult `json:"reply"`
}

func (s *Server) reply(caller bus.Caller, req request) []byte {
	id, text := req.MessageID, req.Text
	if id == "" || text == "" {
		s.refuse(caller.Actor(), "reply", ledger.BadRequest, "messageId and text are required")
		return errorLine(ledger.BadRequest, "messageId and text are required")
	}
	res, err := s.cfg.Bus.Reply(s.ctx, caller, id, text)
	s.cfg.Bus.Events().Request(ledger.Via{Transport: ledger.Agent, Actor: caller.Actor()}, ledger.Replied, "reply", id, res.Result(id), err)
	if err != nil {
		e := bus.AsError(err)
		return errorLine(e.Code, e.Detail)
	}
	return encode(replyResp{Status: "ok", Reply: answer.ReplyResultOf(res)})
}

// Attested is the number of connections holding an attested slot now.
func (s *Server) Attested() int { return s.srv.Attested() }
