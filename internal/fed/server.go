package fed

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/xmsg/xmsg/internal/answer"
	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/envelope"
	"github.com/xmsg/xmsg/internal/ledger"
	"github.com/xmsg/xmsg/internal/limits"
	"github.com/xmsg/xmsg/internal/principal"
)

// Server is the federation listener with its /fed/v2 routes (docs/protocol.md §8.3). Only those
// routes exist on it: no /healthz, no /v1.
type Server struct {
	n   *Node
	bus Bus
	l   *listener
	srv *http.Server
	// pulls is what the inbox routes remember per leaf (leaf.go).
	pulls pulls
}

type connKey struct{}

// NewServer wraps an already bound TCP listener. Serve runs it.
func (n *Node) NewServer(inner net.Listener, b Bus) *Server {
	s := &Server{n: n, bus: b}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /fed/v2/messages", s.messages)
	mux.HandleFunc("POST /fed/v2/replies", s.replies)
	mux.HandleFunc("GET /fed/v2/messages/{id}/replies", s.poll)
	mux.HandleFunc("GET /fed/v2/sessions", s.sessions)
	s.leafRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &bus.Error{Code: ledger.NotFound, Detail: "no route " + r.Method + " " + r.URL.Path})
	})
	s.srv = &http.Server{
		Handler:           s.bodyDeadline(mux),
		ReadHeaderTimeout: 5 * time.Second, // §2.6
		MaxHeaderBytes:    64 << 10,
		WriteTimeout:      bus.MaxWait + 15*time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(n.cfg.Log.Handler(), slog.LevelDebug),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
	}
	s.l = n.newListener(inner)
	s.srv.ConnState = s.l.connState
	return s
}

// bodyDeadline gives a request body BodyTimeout from the end of its headers, as http.sock
// does (net/http's ReadTimeout would also cut the long-polls that follow): a peer that
// announces 1000 bytes and sends one a second is cut off. readBody lifts the deadline once
// the body is in; a body the handler leaves unread (a refusal) stays under it while net/http
// drains it.
func (s *Server) bodyDeadline(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 {
			http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.n.cfg.BodyTimeout))
		}
		h.ServeHTTP(w, r)
	})
}

// Addr is the listening address.
func (s *Server) Addr() net.Addr { return s.l.Addr() }

// Serve serves until Shutdown.
func (s *Server) Serve() error { return s.srv.Serve(s.l) }

// Shutdown stops accepting and drains (bounded by ctx).
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	s.l.Close()
	return err
}

// BaseContext lets the daemon cancel long-polls when it stops.
func (s *Server) BaseContext(ctx context.Context) {
	s.srv.BaseContext = func(net.Listener) context.Context { return ctx }
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		status = http.StatusInternalServerError
		buf.Reset()
		buf.WriteString(`{"error":"` + ledger.Internal.String() + `","detail":"encoding failed"}` + "\n")
	}
	writeRaw(w, status, buf.Bytes())
}

// writeRaw answers with body, JSON encoded already (its line ended).
func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}

func writeError(w http.ResponseWriter, err error) {
	e := bus.AsError(err)
	writeJSON(w, e.Code.Status(), map[string]string{"error": e.Code.String(), "detail": e.Detail})
}

func apiError(code ledger.Code, format string, args ...any) *bus.Error {
	return &bus.Error{Code: code, Detail: fmt.Sprintf(format, args...)}
}

// peer returns the authenticated peer of the request's connection, under the CURRENT
// snapshot: after a reload the connection's certificate is judged again, so a peer removed
// or re-pinned loses its kept-alive connections at their next request (fail closed). The
// source check applies to every request of a connection whose address the peer may not
// use (§8.1: 403 peer_rejected, each time).
func (s *Server) peer(w http.ResponseWriter, r *http.Request) (*Peer, bool) {
	c, _ := r.Context().Value(connKey{}).(*conn)
	if c == nil || c.raw.peer == nil {
		writeError(w, apiError(ledger.PeerRejected, "unauthenticated connection"))
		return nil, false
	}
	if c.busy {
		// Authenticated, but neither the peer's own room nor the shared pool had a place
		// (capacity.go): a code of its own, so that a leaf looks for capacity, not for a
		// certificate problem. The connection is closed after the answer.
		w.Header().Set("Connection", "close")
		w.Header().Set("Retry-After", "1")
		writeError(w, apiError(ledger.HubBusy, "no connection room for peer %q (budget %d connections); retry later", c.raw.peer.Name, s.n.cap.total))
		return nil, false
	}
	p := c.raw.peer
	if st := s.n.st.Load(); st != c.raw.st {
		np, err := st.peers.Inbound(c.raw.chain)
		if err != nil {
			w.Header().Set("Connection", "close")
			writeError(w, apiError(ledger.PeerRejected, "certificate no longer accepted"))
			return nil, false
		}
		if np.Name != p.Name {
			// The same certificate now names another peer: its per-peer connection slot
			// (and everything else keyed by the name) would be wrong. Make it reconnect.
			w.Header().Set("Connection", "close")
			writeError(w, apiError(ledger.PeerRejected, "certificate now names another peer; reconnect"))
			return nil, false
		}
		// Judged under this snapshot now; requests on one connection come one at a time.
		c.raw.st, c.raw.peer = st, np
		p = np
	}
	if !p.SourceAllowed(c.source) {
		writeError(w, apiError(ledger.PeerRejected, "source address %s not allowed for peer %q", c.source, p.Name))
		return nil, false
	}
	return p, true
}

func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	// The envelope may carry a text of max_body bytes JSON-escaped, as a local send's request
	// may: the one rule of every socket (limits.RequestCap), so a text this node's senders may
	// send is never refused by a peer for its escaping. The text itself is checked below.
	max := limits.RequestCap(s.n.cfg.MaxBody)
	if r.ContentLength > int64(max) {
		writeError(w, apiError(ledger.PayloadTooLarge, "body %d exceeds limit %d", r.ContentLength, max))
		return nil, false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(max)+1))
	if err == nil {
		// In: the wait for the answer (a delivery, a reply push) is not the body's.
		http.NewResponseController(w).SetReadDeadline(time.Time{})
	}
	if err != nil {
		if isTimeout(err) {
			writeError(w, apiError(ledger.BadRequest, "body not received within %s", s.n.cfg.BodyTimeout))
			return nil, false
		}
		writeError(w, apiError(ledger.BadRequest, "could not read body"))
		return nil, false
	}
	if len(body) > max {
		writeError(w, apiError(ledger.PayloadTooLarge, "body %d exceeds limit %d", len(body), max))
		return nil, false
	}
	return body, true
}

// idSkew is how far the time inside an envelope id may be from our clock.
const idSkew = time.Hour

// validID: envelope ids become keys of the messages bucket, whose order is taken for time
// order (retention purges from the oldest key and stops at the first young row). So only
// canonical UUID v7 ids are taken, and only with a time near ours: an id from 1970 would
// sort first, be young, and hold back every purge.
func validID(id string) bool {
	u, err := uuid.Parse(id)
	if err != nil || u.String() != id || u.Version() != 7 {
		return false
	}
	sec, nsec := u.Time().UnixTime()
	d := time.Since(time.Unix(sec, nsec))
	return d < idSkew && d > -idSkew
}

// validRef is an id that names an existing message (in_reply_to, thread_id): any canonical
// UUID, however old.
func validRef(id string) bool {
	u, err := uuid.Parse(id)
	return err == nil && u.String() == id
}

func intersects(a, b []string) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return true
			}
		}
	}
	return false
}

// targetNames are a local target's badges for a peer's `targets` (§8.3 step 5).
func targetNames(harness, sessionID string, name *string) []string {
	bare := strings.TrimPrefix(sessionID, harness+":")
	out := []string{"session:" + sessionID, harness + ":" + sessionID, harness + ":" + bare}
	if name != nil && *name != "" {
		out = append(out, harness+":"+*name)
	}
	return out
}

func (t *Peer) allowsTarget(names []string) bool {
	return !t.TargetsSet || intersects(names, t.Targets)
}

func (s *Server) rate(keys ...string) bool {
	rates := make([]int, len(keys))
	for i, k := range keys {
		rates[i] = s.n.cfg.PeerRate
		if strings.HasPrefix(k, "principal:") {
			rates[i] = s.n.cfg.PrincipalRate
		}
	}
	return s.n.limits.take(keys, rates)
}

// peerHasRoom checks the peer's bucket before its body is read: a peer over its rate is
// answered 429 without decoding, resolving or storing anything (the token itself is taken
// later, with the principal's, by rate).
func (s *Server) peerHasRoom(w http.ResponseWriter, r *http.Request, p *Peer) bool {
	if !s.n.limits.has("peer:"+p.Name, s.n.cfg.PeerRate) {
		if r.ContentLength < 0 || r.ContentLength > unreadBody {
			// Draining it would still cost its decryption: a peer flooding 64 KiB bodies
			// over its rate pays a new handshake instead (per-source handshake rate).
			w.Header().Set("Connection", "close")
		}
		writeError(w, rateLimited())
		return false
	}
	return true
}

// unreadBody is the largest refused body drained to keep the connection.
const unreadBody = 4096

func rateLimited() *bus.Error {
	return apiError(ledger.RateLimited, "rate limit exceeded")
}

// messages is POST /fed/v2/messages, its checks in the order of §8.3.
func (s *Server) messages(w http.ResponseWriter, r *http.Request) {
	p, ok := s.peer(w, r)
	if !ok || !s.peerHasRoom(w, r, p) {
		return
	}
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	e, err := DecodeEnvelope(body)
	if err == nil {
		err = e.Principal.Check()
	}
	if err != nil {
		writeError(w, apiError(ledger.BadRequest, "%v", err))
		return
	}
	// The principal's bucket too, before anything is resolved or validated (the token is
	// taken at step 6; a refused request takes none).
	if !s.n.limits.has("principal:"+p.Name+"\x00"+e.Principal.RateKey(), s.n.cfg.PrincipalRate) {
		writeError(w, rateLimited())
		return
	}
	// 1. version
	if e.V != Version {
		writeError(w, apiError(ledger.BadRequest, "unsupported envelope version %d (want %d)", e.V, Version))
		return
	}
	if !validID(e.ID) || e.Body == "" || (e.ThreadID != "" && !validRef(e.ThreadID)) {
		writeError(w, apiError(ledger.BadRequest, "id and thread_id must be UUIDs and body non-empty"))
		return
	}
	if len(e.Body) > s.n.cfg.MaxBody {
		writeError(w, apiError(ledger.PayloadTooLarge, "body %d exceeds limit %d", len(e.Body), s.n.cfg.MaxBody))
		return
	}
	// 2. the peer may send
	if !p.Allow["send"] {
		writeError(w, apiError(ledger.OpDenied, "send operation not allowed for peer"))
		return
	}
	// 3. the sender principal
	if p.Principals != nil && !intersects(e.Principal.PolicyNames(), p.Principals) {
		writeError(w, apiError(ledger.OpDenied, "principal not authorized for peer"))
		return
	}
	if e.To.Ref == "" || len(e.To.Ref) > 256 {
		writeError(w, apiError(ledger.BadRequest, "to.ref must be 1..256 bytes"))
		return
	}
	// 4. no multi-hop forwarding
	if envelope.ParseRef(e.To.Ref).NamesHost() {
		writeError(w, apiError(ledger.NoForward, "federated ref '%s' names another host; forwarding is not allowed", e.To.Ref))
		return
	}
	// 5. the local target
	t, resolveErr := s.bus.Resolve(e.To.Ref)
	if resolveErr == nil {
		// The view names every target that has a name, an offline service included.
		if !p.allowsTarget(targetNames(t.Harness, t.SessionID, t.Session.Name)) {
			writeError(w, apiError(ledger.OpDenied, "target not allowed for peer"))
			return
		}
	} else if p.TargetsSet {
		// With a targets list, an unknown ref is refused like a forbidden one: the peer
		// learns nothing about what exists here.
		writeError(w, apiError(ledger.OpDenied, "target not allowed for peer"))
		return
	}
	// 6. rate limits: the peer's bucket and the principal's
	if !s.rate("peer:"+p.Name, "principal:"+p.Name+"\x00"+e.Principal.RateKey()) {
		writeError(w, rateLimited())
		return
	}
	// 7. the principal itself, and the sender badge (host = the PEER's name)
	sender, perr := e.Principal.Sender(p.Name)
	if errors.Is(perr, principal.ErrSender) {
		writeError(w, apiError(ledger.BadSender, "%v", perr))
		return
	} else if perr != nil {
		writeError(w, apiError(ledger.BadRequest, "%v", perr))
		return
	}
	// 8. idempotent by envelope id; 9. record, deliver; 10. answer
	push := e.PushReplies && !p.Leaf
	d, err := s.bus.Accept(r.Context(), bus.InboundFrom(sender, bus.Inbound{ID: e.ID, Peer: p.Name, Ref: e.To.Ref,
		Body: e.Body, PushReplies: push, ThreadID: e.ThreadID}), t, resolveErr)
	if err != nil {
		writeError(w, err)
	} else {
		writeJSON(w, http.StatusAccepted, answer.DeliveryOf(d))
	}
	s.bus.Events().Request(ledger.Via{Transport: ledger.Fed, Actor: "fed:" + p.Name, Peer: p.Name}, ledger.Sent, "send", t.SessionID, d.Result(e.Body), err)
}

// replies is POST /fed/v2/replies.
func (s *Server) replies(w http.ResponseWriter, r *http.Request) {
	p, ok := s.peer(w, r)
	if !ok || !s.peerHasRoom(w, r, p) {
		return
	}
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	e, err := DecodeReply(body)
	if err != nil {
		writeError(w, apiError(ledger.BadRequest, "%v", err))
		return
	}
	if e.V != Version {
		writeError(w, apiError(ledger.BadRequest, "unsupported envelope version %d (want %d)", e.V, Version))
		return
	}
	if !p.Allow["reply"] {
		writeError(w, apiError(ledger.OpDenied, "reply operation not allowed for peer"))
		return
	}
	if !validID(e.ID) || !validRef(e.InReplyTo) || e.Text == "" || !principal.Harness(e.Replier.Harness) ||
		e.Replier.SessionID == "" || len(e.Replier.SessionID) > 256 || !principal.Printable(e.Replier.SessionID) {
		writeError(w, apiError(ledger.BadRequest, "id, in_reply_to, replier and text are required"))
		return
	}
	if !s.rate("peer:"+p.Name, "principal:"+p.Name+"\x00"+e.Replier.Harness+":"+e.Replier.SessionID) {
		writeError(w, rateLimited())
		return
	}
	name := e.Replier.Name
	if name == "" {
		name = e.Replier.SessionID
	}
	// A reply can overtake the record of the send it answers (Node.Send).
	s.n.waitRecorded(r.Context(), e.InReplyTo)
	outcome, id, err := s.bus.AcceptReply(r.Context(), bus.InboundReply{ID: e.ID, Peer: p.Name, InReplyTo: e.InReplyTo,
		Replier: bus.Caller{Harness: e.Replier.Harness, SessionID: e.Replier.SessionID, Name: name}, Text: e.Text})
	if err != nil {
		writeError(w, err)
	} else {
		writeJSON(w, http.StatusOK, map[string]string{"push_outcome": outcome.String(), "message_id": id})
	}
	s.bus.Events().Request(ledger.Via{Transport: ledger.Fed, Actor: "fed:" + p.Name, Peer: p.Name}, ledger.Replied, "reply", e.InReplyTo,
		ledger.Result{MessageID: id, InReplyTo: e.InReplyTo, Outcome: outcome, Bytes: len(e.Text), Text: e.Text}, err)
}

// poll is GET /fed/v2/messages/{id}/replies: only the message's return host may read it.
func (s *Server) poll(w http.ResponseWriter, r *http.Request) {
	p, ok := s.peer(w, r)
	if !ok {
		return
	}
	if !s.rate("poll:" + p.Name) {
		writeError(w, rateLimited())
		return
	}
	q := r.URL.Query()
	var after uint64
	var wait int
	var err error
	if v := q.Get("after"); v != "" {
		if after, err = strconv.ParseUint(v, 10, 64); err != nil {
			writeError(w, apiError(ledger.BadRequest, "after must be a non-negative integer"))
			return
		}
	}
	if v := q.Get("wait"); v != "" {
		if wait, err = strconv.Atoi(v); err != nil || wait < 0 {
			writeError(w, apiError(ledger.BadRequest, "wait must be a non-negative integer (seconds)"))
			return
		}
	}
	out, err := s.bus.PeerReplies(r.Context(), p.Name, r.PathValue("id"), after, time.Duration(min(wait, 60))*time.Second)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, answer.RepliesOf(out))
}

// wireSession is an entry of GET /fed/v2/sessions.
type wireSession struct {
	Name      *string `json:"name"`
	SessionID string  `json:"sessionId"`
	Harness   string  `json:"harness"`
	Kind      string  `json:"kind"`
	Status    string  `json:"status"`
}

// sessions is GET /fed/v2/sessions, filtered by the peer's targets.
func (s *Server) sessions(w http.ResponseWriter, r *http.Request) {
	p, ok := s.peer(w, r)
	if !ok {
		return
	}
	if !p.Allow["list"] {
		writeError(w, apiError(ledger.OpDenied, "list operation not allowed for peer"))
		return
	}
	if !s.rate("list:" + p.Name) {
		writeError(w, rateLimited())
		return
	}
	out := []wireSession{}
	for _, v := range s.bus.Sessions("", "") {
		if !p.allowsTarget(targetNames(v.Harness, v.SessionID, v.Name)) {
			continue
		}
		out = append(out, wireSession{Name: v.Name, SessionID: v.SessionID, Harness: v.Harness, Kind: v.Kind, Status: v.Status})
	}
	writeJSON(w, http.StatusOK, out)
}
