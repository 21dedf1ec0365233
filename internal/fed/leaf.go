package fed

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/xmsg/xmsg/internal/hub"
	"github.com/xmsg/xmsg/internal/ledger"
)

// The wire of both sides of a leaf's mailbox (docs/protocol.md §7.5, §8.3); the mailboxes
// themselves are internal/hub's, the pull loop internal/leaf's. The hub serves GET
// /fed/v2/inbox and POST /fed/v2/inbox/{id}/ack (one row at a time, as the protocol has them)
// and, this daemon's extension, POST /fed/v2/inbox: one request acks what the leaf delivered,
// rejects what it can never deliver, and pulls the next batch. The leaf's client of all three is here too, and Hubs names the
// peers a leaf pulls from.
//
// The inbox routes are not held to the peer's send rate (a busy leaf would get a message a
// second): a request that moves mail (acks a row, or pulls after an ack) is free, so the
// path is bounded by the mailbox, which senders fill under their own rate limits and the
// mailbox's bounds. Only requests that move nothing (a poll with no ack since the last one, an
// ack of nothing) spend the `inbox:<peer>` / `inbox-ack:<peer>` buckets.

// InboxAckTimeout is the budget of one inbox ack (§5.6).
const InboxAckTimeout = 10 * time.Second

// Batch bounds of POST /fed/v2/inbox on the hub: what a leaf asks for is cut to these.
const (
	MaxInboxBatch      = 256     // rows per pull, and ids per ack
	MaxInboxBatchBytes = 1 << 20 // stored bytes of the rows of one pull, past the first
)

// pulls remembers, per leaf, whether it acked a row since its last poll, and the stream
// whose last poll handed out rows: such a poll is progress, not a retry, and spends no rate
// token. A leaf that pulls its next batch while its service works on the last carries no
// ack then, but each row comes to it once per stream, so it cannot spin on free polls; one
// that starts a new stream (every row handed out again) pays for that poll. Its size is the
// number of leaves that ever pulled, each a configured peer.
type pulls struct {
	mu     sync.Mutex
	acked  map[string]bool
	handed map[string]string
}

func (p *pulls) ack(peer string) {
	p.mu.Lock()
	if p.acked == nil {
		p.acked = map[string]bool{}
	}
	p.acked[peer] = true
	p.mu.Unlock()
}

// poll reports whether peer acked since its last poll, or that poll on stream handed out
// rows, and starts a new round.
func (p *pulls) poll(peer, stream string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	ok := p.acked[peer] || (stream != "" && p.handed[peer] == stream)
	delete(p.acked, peer)
	delete(p.handed, peer)
	return ok
}

// handedOut records that peer's poll on stream handed out rows.
func (p *pulls) handedOut(peer, stream string) {
	if stream == "" {
		return
	}
	p.mu.Lock()
	if p.handed == nil {
		p.handed = map[string]string{}
	}
	p.handed[peer] = stream
	p.mu.Unlock()
}

func (s *Server) leafRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /fed/v2/inbox", s.inbox)
	mux.HandleFunc("POST /fed/v2/inbox", s.inboxPull)
	mux.HandleFunc("POST /fed/v2/inbox/{id}/ack", s.inboxAck)
}

// leaf authenticates a leaf peer for its inbox routes.
func (s *Server) leaf(w http.ResponseWriter, r *http.Request) (*Peer, bool) {
	p, ok := s.peer(w, r)
	if !ok {
		return nil, false
	}
	if !p.Leaf {
		writeError(w, apiError(ledger.OpDenied, "peer is not a leaf"))
		return nil, false
	}
	if s.n.Mailboxes() == nil {
		writeError(w, apiError(ledger.OpDenied, "this node keeps no mailboxes"))
		return nil, false
	}
	return p, true
}

// idle spends a token of bucket for a request of peer that moved no mail; false (answered
// 429) when none is left.
func (s *Server) idle(w http.ResponseWriter, bucket, peer string) bool {
	if !s.rate(bucket + peer) {
		writeError(w, rateLimited())
		return false
	}
	return true
}

func waitParam(v string) (time.Duration, bool) {
	if v == "" {
		return 0, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, false
	}
	return time.Duration(min(n, 60)) * time.Second, true
}

// inbox is GET /fed/v2/inbox?wait=N: a leaf pulls the oldest mail queued for it, which
// stays until acked. Mailboxes are per peer: a leaf sees its own only.
func (s *Server) inbox(w http.ResponseWriter, r *http.Request) {
	p, ok := s.leaf(w, r)
	if !ok {
		return
	}
	if !s.pulls.poll(p.Name, "") && !s.idle(w, "inbox:", p.Name) {
		return
	}
	wait, ok := waitParam(r.URL.Query().Get("wait"))
	if !ok {
		writeError(w, apiError(ledger.BadRequest, "wait must be a non-negative integer (seconds)"))
		return
	}
	rows, err := s.n.Mailboxes().Pull(r.Context(), p.Name, "", wait, 1, 0)
	if err != nil {
		writeError(w, err)
		return
	}
	if len(rows) == 0 {
		writeJSON(w, http.StatusOK, nil)
		return
	}
	// The row as writeJSON would write it (hub.EncodeRow), with its newline; a copy: the
	// mailboxes share the row's bytes.
	writeRaw(w, http.StatusOK, append(append(make([]byte, 0, len(rows[0].JSON)+1), rows[0].JSON...), '\n'))
}

// inboxAck is POST /fed/v2/inbox/{id}/ack.
func (s *Server) inboxAck(w http.ResponseWriter, r *http.Request) {
	p, ok := s.leaf(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	n, err := s.n.Mailboxes().Ack(p.Name, []string{id})
	if err != nil {
		writeError(w, err)
		return
	}
	if n == 1 {
		s.pulls.ack(p.Name)
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		return
	}
	if !s.idle(w, "inbox-ack:", p.Name) {
		return
	}
	writeError(w, apiError(ledger.NotFound, "no mail '%s' for peer '%s'", id, p.Name))
}

// PullRequest is the body of POST /fed/v2/inbox: the ids the leaf delivered since its last
// pull (its service acked them), those it can never deliver (a `to` naming another service
// than its own), and the next batch it wants.
type PullRequest struct {
	Ack      []string `json:"ack"`
	Reject   []string `json:"reject,omitempty"`
	Max      int      `json:"max"`       // rows, 0..MaxInboxBatch; 0 pulls nothing (acks only)
	MaxBytes int      `json:"max_bytes"` // 0 = MaxInboxBatchBytes
	Wait     int      `json:"wait"`      // seconds, 0..60
	// Stream, a UUID the leaf chose, names its pull stream: rows handed out on it are not
	// handed out again on it until settled (hub.Mailboxes.Pull). Left out: every row not
	// settled is handed out, as a leaf that pulls only once its service acked the last batch
	// wants.
	Stream string `json:"stream,omitempty"`
	// Follow (with a Stream and Max > 0) makes the answer a stream of its own: a line (a
	// PullAnswer) at once with the acks' counts and the rows there are, then one for each
	// batch that comes, as long as the rows handed out on the stream and not settled stay
	// within Max, until none came for Wait seconds (hub.Mailboxes.Follow). The leaf acks
	// meanwhile with requests of Max 0.
	Follow bool `json:"follow,omitempty"`
}

// followType is the media type of a followed pull's answer: JSON lines.
const followType = "application/x-ndjson"

// PullAnswer is its answer: how many of the ids were removed (the others were gone
// already), and the batch.
type PullAnswer struct {
	Acked    int       `json:"acked"`
	Rejected int       `json:"rejected,omitempty"`
	Rows     []hub.Row `json:"rows"`
}

// inboxPull is POST /fed/v2/inbox: ack, then pull. The acks are taken before the batch is
// read, so the batch never holds what was just acked; their deletes ride the hub's next
// commit (hub.Mailboxes.Ack), so a pull costs the hub no commit of its own. An answer lost on
// the way is no loss (the acks are taken, the rows come again).
func (s *Server) inboxPull(w http.ResponseWriter, r *http.Request) {
	p, ok := s.leaf(w, r)
	if !ok {
		return
	}
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	var req PullRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, apiError(ledger.BadRequest, "pull request: %v", err))
		return
	}
	if req.Max < 0 || len(req.Ack)+len(req.Reject) > MaxInboxBatch || req.MaxBytes < 0 || req.Wait < 0 {
		writeError(w, apiError(ledger.BadRequest, "max must be >= 0, ack and reject at most %d ids, max_bytes and wait >= 0", MaxInboxBatch))
		return
	}
	if req.Stream != "" && !validRef(req.Stream) {
		writeError(w, apiError(ledger.BadRequest, "stream must be a UUID"))
		return
	}
	if req.Follow && (req.Stream == "" || req.Max == 0) {
		writeError(w, apiError(ledger.BadRequest, "follow needs a stream and max > 0"))
		return
	}
	for _, id := range append(req.Ack, req.Reject...) {
		if !validRef(id) {
			writeError(w, apiError(ledger.BadRequest, "ack and reject ids must be UUIDs"))
			return
		}
	}
	var ans PullAnswer
	mb := s.n.Mailboxes()
	for _, settle := range []struct {
		ids []string
		do  func(peer string, ids []string) (int, error)
		n   *int
	}{{req.Ack, mb.Ack, &ans.Acked}, {req.Reject, mb.Reject, &ans.Rejected}} {
		if len(settle.ids) == 0 {
			continue
		}
		n, err := settle.do(p.Name, settle.ids)
		if err != nil {
			writeError(w, err)
			return
		}
		if *settle.n = n; n > 0 {
			s.pulls.ack(p.Name)
		}
	}
	if req.Max == 0 {
		// Acks only: the leaf's pull is waiting on its own connection. It moved mail or it
		// spends an ack token; either way the next poll is what it would have been.
		if ans.Acked+ans.Rejected == 0 && !s.idle(w, "inbox-ack:", p.Name) {
			return
		}
		ans.Rows = []hub.Row{}
		writeJSON(w, http.StatusOK, ans)
		return
	}
	if !s.pulls.poll(p.Name, req.Stream) && !s.idle(w, "inbox:", p.Name) {
		return
	}
	maxBytes := MaxInboxBatchBytes
	if req.MaxBytes > 0 {
		maxBytes = min(req.MaxBytes, maxBytes)
	}
	if req.Follow {
		s.follow(w, r, p.Name, req, ans, maxBytes)
		return
	}
	rows, err := s.n.Mailboxes().Pull(r.Context(), p.Name, req.Stream, time.Duration(min(req.Wait, 60))*time.Second, min(req.Max, MaxInboxBatch), maxBytes)
	if err != nil {
		writeError(w, err)
		return
	}
	if len(rows) > 0 {
		s.pulls.handedOut(p.Name, req.Stream)
	}
	writeRaw(w, http.StatusOK, appendPullAnswer(nil, ans.Acked, ans.Rejected, rows))
}

// follow answers a followed pull (PullRequest.Follow): a line at once (the acks' counts and
// the rows there are), then a line for each batch that comes, until none came for the pull's
// wait, the leaf pulls on another stream, goes, or the daemon stops. One request carries the
// rows of many, where a long-poll is a request for each batch: on a leaf that gets a row at
// a time, a request per message. Each line written spends the write budget afresh.
func (s *Server) follow(w http.ResponseWriter, r *http.Request, peer string, req PullRequest, ans PullAnswer, maxBytes int) {
	mb := s.n.Mailboxes()
	window := min(req.Max, MaxInboxBatch)
	wait := time.Duration(min(req.Wait, 60)) * time.Second
	rows, err := mb.Follow(r.Context(), peer, req.Stream, true, 0, window, maxBytes)
	if err != nil {
		writeError(w, err)
		return
	}
	// The peers file this request was judged under: a reload ends the answer before its next
	// line, so that the next request is judged again (Server.peer), as a request per batch
	// would be.
	st := s.n.st.Load()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", followType)
	w.WriteHeader(http.StatusOK)
	for {
		if len(rows) > 0 {
			s.pulls.handedOut(peer, req.Stream)
		}
		rc.SetWriteDeadline(time.Now().Add(wait + 15*time.Second))
		if _, err := w.Write(appendPullAnswer(nil, ans.Acked, ans.Rejected, rows)); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
		ans = PullAnswer{}
		// Superseded, gone, stopping, or nothing for a wait: the answer ends, and the leaf
		// pulls again.
		if rows, err = mb.Follow(r.Context(), peer, req.Stream, false, wait, window, maxBytes); err != nil || len(rows) == 0 {
			return
		}
		if s.n.st.Load() != st {
			ids := make([]string, len(rows))
			for i, row := range rows {
				ids[i] = row.ID
			}
			mb.Unhand(peer, req.Stream, ids) // not written: the next pull on the stream has them
			return
		}
	}
}

// appendPullAnswer appends the PullAnswer of acked, rejected and rows as writeJSON would
// write it (TestPullAnswerIsWriteJSON), from the rows' wire JSON as the mailboxes keep it.
func appendPullAnswer(dst []byte, acked, rejected int, rows []hub.Wire) []byte {
	dst = append(dst, `{"acked":`...)
	dst = strconv.AppendInt(dst, int64(acked), 10)
	if rejected != 0 {
		dst = append(dst, `,"rejected":`...)
		dst = strconv.AppendInt(dst, int64(rejected), 10)
	}
	dst = append(dst, `,"rows":[`...)
	for i, r := range rows {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, r.JSON...)
	}
	return append(dst, "]}\n"...)
}

// Hubs returns the peers a leaf pulls from: every peer that is not itself a leaf.
func (n *Node) Hubs() []string {
	var out []string
	for _, p := range n.st.Load().peers.All() {
		if !p.Leaf {
			out = append(out, p.Name)
		}
	}
	return out
}

// Inbox long-polls peer's GET /fed/v2/inbox (budget wait + 5 s); nil means nothing came.
func (n *Node) Inbox(ctx context.Context, peer string, wait time.Duration) (*hub.Row, error) {
	ctx, cancel := context.WithTimeout(ctx, wait+CallTimeout)
	defer cancel()
	var row *hub.Row
	q := url.Values{"wait": {strconv.Itoa(int(wait / time.Second))}}
	if err := n.call(ctx, peer, http.MethodGet, "/fed/v2/inbox?"+q.Encode(), nil, &row, ""); err != nil {
		return nil, err
	}
	return row, nil
}

// AckInbox acknowledges row id of our mailbox on peer (budget 10 s). A 404 comes back as
// the peer's error: the row is gone, which is what the ack wanted.
func (n *Node) AckInbox(ctx context.Context, peer, id string) error {
	ctx, cancel := context.WithTimeout(ctx, InboxAckTimeout)
	defer cancel()
	return n.call(ctx, peer, http.MethodPost, "/fed/v2/inbox/"+url.PathEscape(id)+"/ack", struct{}{}, nil, id)
}

// Pull acks ids, rejects the ids in reject, and pulls the next batch of our mailbox on peer
// on stream (a UUID, or "" for none: PullRequest.Stream) with one POST /fed/v2/inbox
// (budget wait + 10 s). It returns the rows (none when the wait ran out).
func (n *Node) Pull(ctx context.Context, peer, stream string, ack, reject []string, max, maxBytes int, wait time.Duration) ([]hub.Row, error) {
	ctx, cancel := context.WithTimeout(ctx, wait+InboxAckTimeout)
	defer cancel()
	body, err := pullBody(PullRequest{Ack: ack, Reject: reject, Max: max, MaxBytes: maxBytes, Wait: int(wait / time.Second), Stream: stream})
	if err != nil {
		return nil, err
	}
	// On the hub's pull connection (pullconn.go), not the shared client.
	status, raw, err := n.postPull(ctx, peer, body)
	if err != nil {
		return nil, err
	}
	if err := decodeAnswer(peer, status, raw, nil); err != nil {
		return nil, err
	}
	var ans PullAnswer
	if err := decodePullAnswer(raw, &ans); err != nil {
		return nil, malformed(peer)
	}
	return ans.Rows, nil
}

// Follow acks ids, rejects the ids in reject, and follows our mailbox on peer on stream
// (PullRequest.Follow) with one POST /fed/v2/inbox: each batch that comes goes to each, the
// first (the acks were taken then, first true) at once, until none came for wait (nil), the
// answer broke off, or each failed (its error). A hub that does not follow answers as it
// would any pull it cannot take (an error, the acks not taken: first was never called).
func (n *Node) Follow(ctx context.Context, peer, stream string, ack, reject []string, max, maxBytes int, wait time.Duration, each func(rows []hub.Row, first bool) error) error {
	body, err := pullBody(PullRequest{Ack: ack, Reject: reject, Max: max, MaxBytes: maxBytes, Wait: int(wait / time.Second), Stream: stream, Follow: true})
	if err != nil {
		return err
	}
	first := true
	st := n.st.Load()
	status, raw, err := n.pullRequest(ctx, peer, body, wait, func(line []byte) error {
		if n.st.Load() != st {
			// Reloaded: the hub is dialled again with what the peers file says now. What
			// the hub wrote after this line is not read: the stream starts over.
			return hub.ErrRestream
		}
		var ans PullAnswer
		if err := decodePullAnswer(line, &ans); err != nil {
			return malformed(peer)
		}
		f := first
		first = false
		return each(ans.Rows, f)
	})
	if err != nil {
		return err
	}
	if status == 0 {
		return nil // the followed answer's end
	}
	if err := decodeAnswer(peer, status, raw, nil); err != nil {
		return err
	}
	return malformed(peer) // a 2xx that is no followed answer
}

// AckPulled acks ids and rejects those of reject on peer without pulling (POST
// /fed/v2/inbox with max 0), on the shared client: the pull connection is busy with the
// pull loop's long-poll meanwhile (budget 10 s).
func (n *Node) AckPulled(ctx context.Context, peer string, ack, reject []string) error {
	ctx, cancel := context.WithTimeout(ctx, InboxAckTimeout)
	defer cancel()
	body, err := pullBody(PullRequest{Ack: ack, Reject: reject})
	if err != nil {
		return err
	}
	return n.call(ctx, peer, http.MethodPost, "/fed/v2/inbox", json.RawMessage(body), nil, "")
}

func pullBody(req PullRequest) ([]byte, error) {
	if req.Ack == nil {
		req.Ack = []string{}
	}
	return json.Marshal(req)
}

// NamedHubs returns the hubs whose address names a host instead of an IP: reaching them needs
// DNS, which a sandboxed daemon cannot do (no UDP, TCP connects only to peer ports).
func (n *Node) NamedHubs() []string {
	var out []string
	for _, p := range n.st.Load().peers.All() {
		if host, _, err := net.SplitHostPort(p.Address); !p.Leaf && (err != nil || net.ParseIP(host) == nil) {
			out = append(out, p.Name)
		}
	}
	return out
}
