package fed

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/xmsg/xmsg/internal/answer"
	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/ledger"
)

// CallTimeout is the budget of one outbound call (§8.4); a reply poll gets its wait on top.
const CallTimeout = 5 * time.Second

// errUnreachable and errRejected classify a failed dial for the answer to the caller.
var (
	errUnreachable = errors.New("peer unreachable")
	errRejected    = errors.New("peer rejected")
)

// dialTLS is the transport's dialer: the URL's host is the peer's configured name (so the
// pool is per peer), the address comes from the current peers snapshot, and the handshake
// uses the current credentials. Pooled connections keep the snapshot they were made with;
// a reload closes the idle ones.
func (n *Node) dialTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	name, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	st := n.st.Load()
	p, ok := st.peers.Get(name)
	if !ok {
		return nil, fmt.Errorf("%w: unknown peer %q", errRejected, name)
	}
	if p.Leaf {
		return nil, fmt.Errorf("%w: peer %q is a leaf (it connects to us)", errUnreachable, name)
	}
	raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", p.Address)
	if err != nil {
		n.book.handshake(name, "outbound", err)
		return nil, fmt.Errorf("%w: %v", errUnreachable, err)
	}
	tc := tls.Client(raw, &tls.Config{
		MinVersion:   tls.VersionTLS13,
		ServerName:   p.Name,
		Certificates: []tls.Certificate{st.cert},
		NextProtos:   []string{"http/1.1"},
		// The standard verification (system roots, DNS names) does not apply: the peer is
		// judged by its pin or its CA and URI SAN, in VerifyConnection (§8.1).
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if err := p.VerifyServer(cs.PeerCertificates); err != nil {
				return &verifyError{err}
			}
			return nil
		},
	})
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		n.book.handshake(name, "outbound", err)
		return nil, handshakeError(err)
	}
	n.book.handshake(name, "outbound", nil)
	n.dials.Add(1)
	return tc, nil
}

// verifyError is our refusal of the peer's certificate (pin, CA, identity).
type verifyError struct{ error }

func (e *verifyError) Unwrap() error { return e.error }

// handshakeError classifies a failed outbound handshake. Rejected is only a refusal: ours
// of the peer's certificate, or the peer's TLS alert. A connection closed or reset during
// the handshake (EOF included) is what a busy or restarting peer does, and a timeout is a
// slow or absent one: both unreachable, which sends an operator to capacity and the
// network, not to certificates.
func handshakeError(err error) error {
	var ve *verifyError
	if errors.As(err, &ve) || isAlert(err) {
		return fmt.Errorf("%w: %v", errRejected, err)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return fmt.Errorf("%w: connection closed during the TLS handshake (the peer may be busy or restarting): %v", errUnreachable, err)
	}
	return fmt.Errorf("%w: %v", errUnreachable, err)
}

// isAlert reports a TLS alert from the peer ("remote error: tls: ..."): a refusal.
func isAlert(err error) bool {
	var alert tls.AlertError
	var oe *net.OpError
	return errors.As(err, &alert) || (errors.As(err, &oe) && oe.Op == "remote error")
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// callError maps a transport failure to the protocol's codes (§8.4): TLS refusals (ours, or
// the peer's alert, which TLS 1.3 delivers on the first read) are peer_rejected; connect
// failures and timeouts are peer_unreachable.
func callError(peer string, err error) *bus.Error {
	switch {
	case errors.Is(err, errRejected), isAlert(err), strings.Contains(err.Error(), "remote error: tls"):
		return &bus.Error{Code: ledger.PeerRejected, Detail: fmt.Sprintf("peer '%s' refused the TLS connection", peer)}
	case errors.Is(err, errUnreachable), errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		return &bus.Error{Code: ledger.PeerUnreachable, Detail: fmt.Sprintf("peer '%s' unreachable", peer)}
	}
	return &bus.Error{Code: ledger.PeerUnreachable, Detail: fmt.Sprintf("peer '%s' unreachable: connection failed", peer)}
}

// call performs one request to peer and decodes a 2xx answer into out. A peer's error
// answer comes back with its status and code.
func (n *Node) call(ctx context.Context, peer, method, path string, body any, out any, idem string) error {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, "https://"+peer+path, rd)
	if err != nil {
		return &bus.Error{Code: ledger.UnknownPeer, Detail: fmt.Sprintf("unknown peer '%s'", peer)}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if idem != "" {
		// Marks the POST as safe to retry on a kept-alive connection that the peer closed
		// meanwhile: the envelope id makes the peer answer a retry with the stored result.
		req.Header.Set("Idempotency-Key", idem)
	}
	resp, err := n.client.Do(req)
	if err != nil {
		return callError(peer, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, int64(n.cfg.MaxBody)*64+65536))
	if err != nil {
		return callError(peer, err)
	}
	return decodeAnswer(peer, resp.StatusCode, raw, out)
}

// decodeAnswer decodes a peer's answer: a 2xx one into out, an error one into its code.
func decodeAnswer(peer string, status int, raw []byte, out any) error {
	if status/100 != 2 {
		var e struct {
			Error  string `json:"error"`
			Detail string `json:"detail"`
		}
		if json.Unmarshal(raw, &e) != nil || e.Error == "" {
			return &bus.Error{Code: ledger.ServiceUnavailable, Detail: fmt.Sprintf("peer '%s' answered %d", peer, status)}
		}
		code, known := ledger.ParseCode(e.Error)
		if !known {
			// A newer peer's code: internal here, its word kept in the detail.
			return &bus.Error{Code: code, Detail: "peer " + peer + " answered " + strconv.Quote(e.Error) + ": " + e.Detail}
		}
		return &bus.Error{Code: code, Detail: "peer " + peer + ": " + e.Detail}
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return malformed(peer)
		}
	}
	return nil
}

// malformed is the error of an answer of peer's that is not what it should be.
func malformed(peer string) *bus.Error {
	return &bus.Error{Code: ledger.ServiceUnavailable, Detail: fmt.Sprintf("peer '%s' answered malformed JSON", peer)}
}

// post is a send's round trip: POST /fed/v2/messages with the 5 s budget.
func (n *Node) post(ctx context.Context, peer string, e Envelope) (bus.Delivery, error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	var d answer.Delivery
	if err := n.call(ctx, peer, http.MethodPost, "/fed/v2/messages", e, &d, e.ID); err != nil {
		return bus.Delivery{}, err
	}
	return d.Bus(), nil
}

// PushReply implements bus.Federation: POST /fed/v2/replies (§8.5).
func (n *Node) PushReply(ctx context.Context, r bus.OutgoingReply) ledger.Outcome {
	e := ReplyEnvelope{V: Version, ID: r.ID, InReplyTo: r.InReplyTo, Text: r.Text, CreatedAt: r.CreatedAt,
		Replier: WireReplier{Harness: r.Replier.Harness, SessionID: r.Replier.SessionID, Name: r.Replier.Name}}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	var out struct {
		PushOutcome string `json:"push_outcome"`
	}
	err := n.call(ctx, r.Peer, http.MethodPost, "/fed/v2/replies", e, &out, r.ID)
	switch {
	case err == nil:
		// The peer took the reply (2xx); what its own push did is its business.
		return ledger.Pushed
	case bus.AsError(err).Code == ledger.Gone:
		return ledger.SenderGone
	}
	n.cfg.Log.Warn("fed reply push failed", "peer", r.Peer, "message_id", r.InReplyTo, "code", bus.AsError(err).Code)
	return ledger.PushFailed
}

// Sessions implements bus.Federation: GET /fed/v2/sessions.
func (n *Node) Sessions(ctx context.Context, peer string) ([]bus.RemoteSession, error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	var list []wireSession
	if err := n.call(ctx, peer, http.MethodGet, "/fed/v2/sessions", nil, &list, ""); err != nil {
		return nil, err
	}
	out := make([]bus.RemoteSession, 0, len(list))
	for _, s := range list {
		out = append(out, bus.RemoteSession{Harness: s.Harness, Kind: s.Kind, Name: s.Name, SessionID: s.SessionID, Status: s.Status})
	}
	return out, nil
}

// Replies implements bus.Federation: GET /fed/v2/messages/{id}/replies, budget wait + 5 s.
func (n *Node) Replies(ctx context.Context, peer, id string, after uint64, wait time.Duration) ([]bus.Reply, error) {
	ctx, cancel := context.WithTimeout(ctx, wait+CallTimeout)
	defer cancel()
	q := url.Values{"after": {strconv.FormatUint(after, 10)}, "wait": {strconv.Itoa(int(wait / time.Second))}}
	var list []answer.Reply
	if err := n.call(ctx, peer, http.MethodGet, "/fed/v2/messages/"+url.PathEscape(id)+"/replies?"+q.Encode(), nil, &list, ""); err != nil {
		return nil, err
	}
	out := make([]bus.Reply, 0, len(list))
	for _, r := range list {
		out = append(out, r.Bus())
	}
	return out, nil
}
