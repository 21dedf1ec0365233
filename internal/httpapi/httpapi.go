// Package httpapi serves the HTTP API of docs/protocol.md §3 on http.sock (and the optional TCP
// listener). Anonymous senders can send and read replies; replying is socket-only.
package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/xmsg/xmsg/internal/answer"
	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/leaf"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/limits"
	"github.com/xmsg/xmsg/internal/ratelog"
	"github.com/xmsg/xmsg/internal/version"
)

// Config of the API.
type Config struct {
	Bus     Bus
	MaxBody int
	Log     *slog.Logger
	Socket  string          // "http" or "tcp", for the audit log
	Doctor  func() []string // protections in force, for GET /v1/doctor (xmsg doctor)
	Limits  Limits          // per-connection deadlines and per-pid shares; zero: DefaultLimits
	// Leaf, when set, is the leaf principal every send is attributed to (docs/protocol.md §7.5).
	Leaf *leaf.Identity
	// Backup writes a consistent copy of the store (store.Store.Backup) for POST
	// /v1/admin/backup. Set on http.sock only: its peers passed the gate (the daemon's own
	// uid); nil on the TCP listener, which has no peer check, so it answers op_denied there.
	Backup func(w io.Writer, begin func(size int64)) (int64, error)
	// Tier, when set, serves GET /v1/events (monitors) and GET /metrics.
	Tier Tier
}

// Handler returns the API router.
func Handler(cfg Config) http.Handler {
	cfg.Limits = cfg.Limits.withDefaults()
	h := &handler{cfg: cfg, waiters: &waiters{max: cfg.Limits.MaxWaitersPerPID}, monitors: &waiters{max: MaxMonitorsPerPID}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", h.healthz)
	mux.HandleFunc("GET /v1/sessions", h.sessions)
	// Not in the original xmsg (docs/protocol.md §3.9): lets `xmsg doctor` show the running
	// instance's protections.
	mux.HandleFunc("GET /v1/doctor", h.doctor)
	// Not in the original xmsg (docs/protocol.md §3.12): `xmsg backup`.
	mux.HandleFunc("POST /v1/admin/backup", h.backup)
	// Not in the original xmsg: the event stream of `xmsg monitor` (§3.10) and the metrics
	// (§3.11).
	mux.HandleFunc("GET /v1/events", h.events)
	mux.HandleFunc("GET /metrics", h.metrics)
	mux.HandleFunc("GET /v1/sessions/{ref}", h.session)
	mux.HandleFunc("POST /v1/sessions/{ref}/messages", h.send)
	mux.HandleFunc("GET /v1/messages/{id}", h.message)
	mux.HandleFunc("GET /v1/messages/{id}/replies", h.replies)
	// Replying is attested (agent.sock / register.sock); HTTP callers are anonymous.
	mux.HandleFunc("/v1/messages/{id}/replies", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, &bus.Error{Code: ledger.MethodNotAllowed, Detail: "replies are sent over agent.sock"})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &bus.Error{Code: ledger.NotFound, Detail: "no route " + r.Method + " " + r.URL.Path})
	})
	var root http.Handler = bodyDeadline(logReads(mux, cfg.Log, cfg.Socket), cfg.Limits.BodyTimeout)
	if cfg.Socket == "tcp" {
		root = refuseBrowsers(root)
	}
	return root
}

// refuseBrowsers guards the optional TCP listener, which has no peer check, against web
// pages: a page can make a browser send a "simple" cross-site POST (text/plain, no preflight)
// or, through DNS rebinding, read answers. So on TCP: no Origin header (browsers send one on
// such requests), a Host that is an IP literal or localhost, and POST bodies declared as JSON.
func refuseBrowsers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		switch {
		case r.Header.Get("Origin") != "":
			writeRefusal(w, http.StatusForbidden, &bus.Error{Code: ledger.BadRequest, Detail: "requests from web pages are refused"})
		case host != "localhost" && net.ParseIP(strings.Trim(host, "[]")) == nil:
			writeRefusal(w, http.StatusForbidden, &bus.Error{Code: ledger.BadRequest, Detail: "Host must be an IP address or localhost"})
		case r.Method == http.MethodPost && !isJSON(r.Header.Get("Content-Type")):
			writeRefusal(w, http.StatusUnsupportedMediaType, &bus.Error{Code: ledger.BadRequest, Detail: "Content-Type must be application/json"})
		default:
			next.ServeHTTP(w, r)
		}
	})
}

func isJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

// logReads logs requests that change nothing at debug level (state-changing requests are
// audited by the bus at info). Paths carry ids, never bodies.
func logReads(next http.Handler, log *slog.Logger, socket string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !log.Enabled(r.Context(), slog.LevelDebug) {
			next.ServeHTTP(w, r)
			return
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		log.Debug("read", "socket", socket, "actor", "anon", "request", r.Method+" "+r.URL.Path, "status", sw.status)
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

// NewServer wraps Handler with the socket limits of docs/design.md §3: a header deadline (5 s) and
// 64 KiB of headers, a body deadline (10 s, see bodyDeadline), an idle deadline (60 s), and a
// write timeout that leaves room for a 60 s long-poll. Each deadline is counted once per
// phase: the server sets it when the phase begins, so a byte trickle does not extend it. The
// connection caps are Listener's. The server is server.go's, not net/http's.
func NewServer(cfg Config) *Server {
	lim := cfg.Limits.withDefaults()
	return &Server{
		Handler:        Handler(cfg),
		HeaderTimeout:  lim.HeaderTimeout,
		MaxHeaderBytes: 64 << 10,
		WriteTimeout:   bus.MaxWait + 15*time.Second,
		IdleTimeout:    lim.IdleTimeout,
		Log:            cfg.Log,
	}
}

type handler struct {
	cfg      Config
	waiters  *waiters
	monitors *waiters // GET /v1/events per peer pid
	lim      ratelog.Limiter
}

// via is where a request on this server came from, for its event.
func (h *handler) via(actor string) ledger.Via {
	t := ledger.HTTP
	if h.cfg.Socket == "tcp" {
		t = ledger.TCP
	}
	return ledger.Via{Transport: t, Actor: actor}
}

// sendAudited runs s on the bus and writes its audit line once the answer is out, where the work
// Send leaves for then goes too.
func (h *handler) sendAudited(ctx context.Context, w http.ResponseWriter, actor string, s bus.Send) (bus.Delivery, error) {
	after := afterAnswer(w)
	d, err := h.cfg.Bus.Send(bus.WithAfter(ctx, after), s)
	after(func() {
		h.cfg.Bus.Events().Request(h.via(actor), ledger.Sent, "send", s.To.String(), d.Result(s.Text), err)
	})
	return d, err
}

// writeJSON answers v as JSON (jsonline's encoding: no HTML escaping, one line).
func writeJSON(w http.ResponseWriter, status int, v any) {
	var body []byte
	var err error
	if d, ok := v.(answer.Delivery); ok {
		body, err = encodeDelivery(d) // the answer to every send: fastjson.go
	} else {
		body, err = jsonline.Encode(v)
	}
	if err != nil {
		status = http.StatusInternalServerError
		body = []byte(`{"error":"` + ledger.Internal.String() + `","detail":"encoding failed"}` + "\n")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}

func writeError(w http.ResponseWriter, err error) {
	e := bus.AsError(err)
	writeJSON(w, e.Code.Status(), map[string]string{"error": e.Code.String(), "detail": e.Detail})
}

// writeRefusal writes e with a status of its own: the TCP listener's refusals of what a
// browser could send are bad_request with 403 or 415 (docs/protocol.md §2.3, §3.1).
func writeRefusal(w http.ResponseWriter, status int, e *bus.Error) {
	writeJSON(w, status, map[string]string{"error": e.Code.String(), "detail": e.Detail})
}

// started is when the daemon's process began (this package is loaded at its start).
var started = time.Now()

func (h *handler) healthz(w http.ResponseWriter, r *http.Request) {
	sd := h.cfg.Bus.SessionDirs()
	if !sd.Configured {
		// A leaf has no session directory: nothing to report, and nothing to look at.
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
		return
	}
	// "ok" only when a directory can really be listed: under Landlock one replaced after
	// start exists but is denied, and sessions there are invisible.
	dirs := "ok"
	switch {
	case !sd.Present:
		dirs = "sessions_dir_missing"
	case !sd.Readable:
		dirs = "sessions_dir_unreadable"
	}
	// What the daemon is, for `xmsg doctor`, and the text limit, which a client checks before
	// it sends (docs/protocol.md §3.2).
	resp := map[string]any{"status": "ok", "sessions_dir": dirs, "version": version.String(),
		"uptime_s": int64(time.Since(started) / time.Second), "pid": os.Getpid(), "max_body": h.cfg.MaxBody}
	// A directory that exists but is not served (e.g. recreated outside the sandbox's rules)
	// is named, so that missing sessions are explained rather than silently absent.
	if p := sd.Problems; len(p) > 0 {
		resp["sessions_dir_problems"] = p
	}
	writeJSON(w, http.StatusOK, resp)
}

func (h *handler) doctor(w http.ResponseWriter, r *http.Request) {
	lines := []string{}
	if h.cfg.Doctor != nil {
		lines = h.cfg.Doctor()
	}
	writeJSON(w, http.StatusOK, map[string][]string{"lines": lines})
}

// backupStall bounds how long a backup's reader may take no byte, and backupMinRate the
// average it must keep over the whole copy: the copy holds a read transaction, and while one
// is open the store file cannot grow (bbolt remaps it under a lock its readers hold), so a
// commit that must grow the file waits for the copy. A stalled reader, and a slow one that
// never quite stalls, must not keep it: the copy gets backupStall plus its size at
// backupMinRate, and is cut off after that.
var (
	backupStall         = 30 * time.Second
	backupMinRate int64 = 1 << 20 // bytes a second
)

// backup streams a consistent copy of the store (docs/protocol.md §3.12): its exact length
// first, then the bytes; a copy cut short is one the client refuses by its length.
func (h *handler) backup(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Backup == nil {
		writeError(w, &bus.Error{Code: ledger.OpDenied, Detail: "backups are served on http.sock only (its peers are checked)"})
		return
	}
	rc := http.NewResponseController(w)
	started := false
	sw := &stallWriter{w: w, rc: rc}
	n, err := h.cfg.Backup(sw, func(size int64) {
		started = true
		sw.end = time.Now().Add(backupStall + time.Duration(size/backupMinRate)*time.Second)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		w.WriteHeader(http.StatusOK)
	})
	if err != nil {
		// Before the first byte the answer is still an error; after it, the connection ends
		// short of Content-Length and the client discards what it got.
		h.cfg.Log.Warn("backup failed", "socket", h.cfg.Socket, "peer_pid", peerPID(r.Context()), "bytes", n, "err", err)
		if !started {
			writeError(w, err)
		}
		return
	}
	h.cfg.Log.Info("backup", "socket", h.cfg.Socket, "peer_pid", peerPID(r.Context()), "bytes", n)
}

// stallWriter gives each write backupStall from its start, and none past end (the whole
// copy's deadline; zero: none yet).
type stallWriter struct {
	w   io.Writer
	rc  *http.ResponseController
	end time.Time
}

func (s *stallWriter) Write(p []byte) (int, error) {
	d := time.Now().Add(backupStall)
	if !s.end.IsZero() && s.end.Before(d) {
		d = s.end
	}
	s.rc.SetWriteDeadline(d)
	return s.w.Write(p)
}

func (h *handler) sessions(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if peer := q.Get("peer"); peer != "" {
		// A peer's sessions instead of ours (docs/protocol.md §3.3); unknown peer → 404.
		list, err := h.cfg.Bus.RemoteSessions(hangupContext(w, r), peer)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, answer.RemoteSessionsOf(list))
		return
	}
	writeJSON(w, http.StatusOK, answer.SessionsOf(h.cfg.Bus.Sessions(q.Get("cwd"), q.Get("status"))))
}

func (h *handler) session(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("ref")
	t, err := h.cfg.Bus.Resolve(ref)
	if err == nil && t.Offline {
		// A configured service that is not connected can be sent to, but it is no session.
		err = &bus.Error{Code: ledger.NotFound, Detail: "no live session matches '" + ref + "'"}
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, answer.SessionOf(t.Session))
}

// RequestCap is the largest send request body for a text limit of maxBody: every byte of the
// text escaped as \u00XX (6 bytes), and 4,096 for the rest of the object, as agent.sock's
// frame cap.
func RequestCap(maxBody int) int { return limits.RequestCap(maxBody) }

// SendRequest is the body of POST /v1/sessions/{ref}/messages.
type SendRequest struct {
	From                string `json:"from"`
	Text                string `json:"text"`
	IdempotencyKey      string `json:"idempotency_key"`
	IdempotencyKeyAlias string `json:"idempotencyKey"`
}

// DecodeSend parses a send body strictly: valid UTF-8, one JSON object, no unknown fields.
// (encoding/json would silently turn invalid UTF-8 into U+FFFD, so it is checked first.)
func DecodeSend(body []byte) (SendRequest, error) {
	var req SendRequest
	if !utf8.Valid(body) {
		return req, errors.New("body is not valid UTF-8")
	}
	if fast, ok := decodeSendFast(body); ok {
		req = fast
	} else if err := decodeSendJSON(body, &req); err != nil {
		return req, err
	}
	if req.IdempotencyKey == "" {
		req.IdempotencyKey = req.IdempotencyKeyAlias
	}
	return req, nil
}

// decodeSendJSON is the strict decoding of a send body with encoding/json.
func decodeSendJSON(body []byte, req *SendRequest) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(req); err != nil {
		return fmt.Errorf("invalid JSON: %v", err)
	}
	if dec.More() {
		return errors.New("invalid JSON: trailing data after the object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("invalid JSON: trailing data after the object")
	}
	return nil
}

func (h *handler) send(w http.ResponseWriter, r *http.Request) {
	// --max-body is the text's limit (the bus checks it); the request may add the JSON
	// envelope around it, so its own cap is what the largest text can take once escaped,
	// checked before any parsing (docs/protocol.md §3.5 step 1).
	max := RequestCap(h.cfg.MaxBody)
	if r.ContentLength > int64(max) {
		writeError(w, &bus.Error{Code: ledger.PayloadTooLarge, Detail: fmt.Sprintf("body %d exceeds limit %d", r.ContentLength, max)})
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(max)+1))
	if err != nil {
		writeError(w, &bus.Error{Code: ledger.BadRequest, Detail: "could not read body"})
		return
	}
	// The body is in: the rest of the request is the daemon's time, not the client's.
	http.NewResponseController(w).SetReadDeadline(time.Time{})
	if len(body) > max {
		writeError(w, &bus.Error{Code: ledger.PayloadTooLarge, Detail: fmt.Sprintf("body %d exceeds limit %d", len(body), max)})
		return
	}
	req, err := DecodeSend(body)
	if err != nil {
		writeError(w, &bus.Error{Code: ledger.BadRequest, Detail: err.Error()})
		return
	}
	if req.Text == "" {
		writeError(w, &bus.Error{Code: ledger.BadRequest, Detail: "text must not be empty"})
		return
	}
	to := envelope.ParseRef(r.PathValue("ref")) // the one parse of the ref: every layer takes it as it is
	if l := h.cfg.Leaf; l != nil {
		// Leaf mode (docs/protocol.md §7.5): every send is the leaf principal's; `from` is ignored.
		from := "xmsg@" + h.cfg.Bus.Host() + " \u00b7 " + l.Principal
		d, err := h.sendAudited(hangupContext(w, r), w, l.Principal, bus.Send{
			To: to, Text: req.Text, Bytes: len(body), FromName: from, Principal: l.Principal,
			Key: req.IdempotencyKey, FedPrincipal: &l.Fed, From: l.Fed.From,
		})
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusAccepted, answer.DeliveryOf(d))
		return
	}
	clean, err := envelope.Anonymous(req.From)
	if err != nil {
		h.lim.Log(h.cfg.Log, slog.LevelWarn, "send bad_sender", "refused", "socket", h.cfg.Socket, "actor", "anon", "request", "send", "code", "bad_sender")
		writeError(w, &bus.Error{Code: ledger.BadSender, Detail: err.Error()})
		return
	}
	from := envelope.AnonymousBadge(h.cfg.Bus.Host(), clean)
	ctx := r.Context()
	if to.Remote() {
		// A send to a peer waits on the network: a client that hangs up cancels it.
		ctx = hangupContext(w, r)
	}
	d, err := h.sendAudited(ctx, w, "anon:"+clean, bus.Send{
		To: to, Text: req.Text, Bytes: len(body), FromName: from,
		Principal: "http:" + from, Key: req.IdempotencyKey, From: clean,
	})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, answer.DeliveryOf(d))
}

func (h *handler) message(w http.ResponseWriter, r *http.Request) {
	m, err := h.cfg.Bus.Message(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, answer.MessageOf(m))
}

func (h *handler) replies(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var after uint64
	var wait int
	var err error
	if s := q.Get("after"); s != "" {
		if after, err = strconv.ParseUint(s, 10, 64); err != nil {
			writeError(w, &bus.Error{Code: ledger.BadRequest, Detail: "after must be a non-negative integer"})
			return
		}
	}
	if s := q.Get("wait"); s != "" {
		if wait, err = strconv.Atoi(s); err != nil || wait < 0 {
			writeError(w, &bus.Error{Code: ledger.BadRequest, Detail: "wait must be a non-negative integer (seconds)"})
			return
		}
	}
	if wait > 0 {
		release, ok := h.waiters.take(peerPID(r.Context()))
		if !ok {
			writeError(w, tooManyWaiters())
			return
		}
		defer release()
	}
	ctx := r.Context()
	if wait > 0 {
		// A client that hangs up while waiting gives its waiter place back at once.
		ctx = hangupContext(w, r)
	}
	out, err := h.cfg.Bus.Replies(ctx, r.PathValue("id"), after, time.Duration(min(wait, 60))*time.Second)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, answer.RepliesOf(out))
}
