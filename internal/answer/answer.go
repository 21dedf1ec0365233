// Package answer holds the JSON shapes of the bus's answers, one per answer, shared by the
// transports that send them (http.sock, agent.sock, register.sock, federation) and read by
// federation's client from a peer. The bus's results are plain values; each shape here is
// made from one by the function named after it (DeliveryOf, ReplyOf, ...), which is where
// "none" becomes JSON null or an omitted field, and a peer's answer turns back into the bus's
// value with its Bus method. docs/protocol.md is the reference for every field (TestShapes
// and TestShapesDocumented hold them to it).
package answer

import (
	"encoding/json"

	"github.com/xmsg/xmsg/internal/bus"
	"github.com/xmsg/xmsg/internal/ledger"
)

// Delivery is the answer to an accepted send: http.sock's 202 (docs/protocol.md §3.5),
// agent.sock's `delivery` (§4.1) and a peer's 202 to POST /fed/v2/messages (§8.3).
type Delivery struct {
	SessionID string         `json:"sessionId"`
	FromName  string         `json:"fromName"`
	Bytes     int            `json:"bytes"`
	MessageID string         `json:"messageId"`
	Outcome   ledger.Outcome `json:"outcome"`
}

// DeliveryOf is d's answer.
func DeliveryOf(d bus.Delivery) Delivery {
	return Delivery{SessionID: d.SessionID, FromName: d.FromName, Bytes: d.Bytes, MessageID: d.MessageID, Outcome: d.Outcome}
}

// Bus is a peer's answer as the bus's value; the event's Harness and Peer are the caller's.
func (d Delivery) Bus() bus.Delivery {
	return bus.Delivery{SessionID: d.SessionID, FromName: d.FromName, Bytes: d.Bytes, MessageID: d.MessageID, Outcome: d.Outcome}
}

// Session is a Session object of GET /v1/sessions and GET /v1/sessions/{ref}
// (docs/protocol.md §3.3, §3.4).
type Session struct {
	SessionID  string          `json:"sessionId"`
	Name       *string         `json:"name"`
	PID        int             `json:"pid"`
	Cwd        string          `json:"cwd"`
	Status     string          `json:"status"`
	Kind       string          `json:"kind"`
	Entrypoint *string         `json:"entrypoint"`
	Version    *string         `json:"version"`
	StartedAt  json.RawMessage `json:"startedAt"`
	UpdatedAt  json.RawMessage `json:"updatedAt"`
	Harness    string          `json:"harness"`
	Registered *bool           `json:"registered,omitempty"`
}

// SessionOf is s's Session object: a time the session file lacks is null.
func SessionOf(s bus.Session) Session {
	return Session{SessionID: s.SessionID, Name: s.Name, PID: s.PID, Cwd: s.Cwd, Status: s.Status, Kind: s.Kind,
		Entrypoint: s.Entrypoint, Version: s.Version, StartedAt: rawOrNull(s.StartedAt), UpdatedAt: rawOrNull(s.UpdatedAt),
		Harness: s.Harness, Registered: s.Registered}
}

// SessionsOf is the session list's answer (nil stays nil).
func SessionsOf(ss []bus.Session) []Session { return each(ss, SessionOf) }

func rawOrNull(r json.RawMessage) json.RawMessage {
	if len(r) == 0 {
		return json.RawMessage("null")
	}
	return r
}

// RemoteSession is an entry of GET /v1/sessions?peer=P (docs/protocol.md §3.3): exactly
// these keys.
type RemoteSession struct {
	Harness   string  `json:"harness"`
	Kind      string  `json:"kind"`
	Name      *string `json:"name"`
	Ref       string  `json:"ref"`
	SessionID string  `json:"sessionId"`
	Status    string  `json:"status"`
}

// RemoteSessionOf is s's entry.
func RemoteSessionOf(s bus.RemoteSession) RemoteSession {
	return RemoteSession{Harness: s.Harness, Kind: s.Kind, Name: s.Name, Ref: s.Ref, SessionID: s.SessionID, Status: s.Status}
}

// RemoteSessionsOf is a peer's session list's answer (nil stays nil).
func RemoteSessionsOf(ss []bus.RemoteSession) []RemoteSession { return each(ss, RemoteSessionOf) }

// Reply is a Reply object (docs/protocol.md §3.7): GET /v1/messages/{id}/replies, the
// `replies` of GET /v1/messages/{id}, and a peer's GET /fed/v2/messages/{id}/replies (§8.3).
type Reply struct {
	Seq              uint64  `json:"seq"`
	MessageID        string  `json:"messageId"`
	CreatedAt        int64   `json:"createdAt"`
	ReplierSessionID string  `json:"replierSessionId"`
	Text             string  `json:"text"`
	PushOutcome      *string `json:"pushOutcome"`
	PushedMessageID  *string `json:"pushedMessageId"`
}

// ReplyOf is r's Reply object: a push outcome or pushed id it lacks is null.
func ReplyOf(r bus.Reply) Reply {
	return Reply{Seq: r.Seq, MessageID: r.MessageID, CreatedAt: r.CreatedAt, ReplierSessionID: r.ReplierSessionID,
		Text: r.Text, PushOutcome: outcomeOrNull(r.PushOutcome), PushedMessageID: stringOrNull(r.PushedMessageID)}
}

// RepliesOf is a reply list's answer (nil stays nil).
func RepliesOf(rs []bus.Reply) []Reply { return each(rs, ReplyOf) }

// Bus is a peer's Reply object as the bus's value; a push outcome word this node does not
// know reads as none.
func (r Reply) Bus() bus.Reply {
	out := bus.Reply{Seq: r.Seq, MessageID: r.MessageID, CreatedAt: r.CreatedAt, ReplierSessionID: r.ReplierSessionID, Text: r.Text}
	if r.PushOutcome != nil {
		out.PushOutcome, _ = ledger.ParseOutcome(*r.PushOutcome)
	}
	if r.PushedMessageID != nil {
		out.PushedMessageID = *r.PushedMessageID
	}
	return out
}

// ReplyResult is agent.sock's `reply` object, the answer to an accepted reply
// (docs/protocol.md §4.1).
type ReplyResult struct {
	MessageID        string  `json:"messageId"` // the ORIGINAL message
	Seq              uint64  `json:"seq"`
	SessionRef       string  `json:"sessionRef"`
	ReplierSessionID string  `json:"replierSessionId"`
	CreatedAt        int64   `json:"createdAt"`
	Text             string  `json:"text"`
	PushOutcome      *string `json:"pushOutcome"`
	PushedMessageID  *string `json:"pushedMessageId"`
}

// ReplyResultOf is r's answer: no push, or no pushed message, is null.
func ReplyResultOf(r bus.ReplyResult) ReplyResult {
	return ReplyResult{MessageID: r.MessageID, Seq: r.Seq, SessionRef: r.SessionRef, ReplierSessionID: r.ReplierSessionID,
		CreatedAt: r.CreatedAt, Text: r.Text, PushOutcome: outcomeOrNull(r.PushOutcome), PushedMessageID: stringOrNull(r.PushedMessageID)}
}

// Message is the answer of GET /v1/messages/{id} (docs/protocol.md §3.6).
type Message struct {
	ID               string  `json:"id"`
	CreatedAt        int64   `json:"createdAt"`
	SessionID        string  `json:"sessionId"`
	FromName         string  `json:"fromName"`
	Bytes            int     `json:"bytes"`
	Outcome          string  `json:"outcome"`
	RecipientHarness string  `json:"recipientHarness"`
	ReturnHarness    *string `json:"returnHarness"`
	ReturnSessionID  *string `json:"returnSessionId"`
	PushReplies      bool    `json:"pushReplies"`
	ThreadID         string  `json:"threadId"`
	Report           string  `json:"report,omitempty"`
	Replies          []Reply `json:"replies"`
}

// MessageOf is m's answer: no return address is null, no report is left out, and no
// replies is an empty list.
func MessageOf(m bus.Message) Message {
	replies := RepliesOf(m.Replies)
	if replies == nil {
		replies = []Reply{}
	}
	return Message{ID: m.ID, CreatedAt: m.CreatedAt, SessionID: m.SessionID, FromName: m.FromName, Bytes: m.Bytes,
		Outcome: m.Outcome.String(), RecipientHarness: m.RecipientHarness, ReturnHarness: stringOrNull(m.ReturnHarness),
		ReturnSessionID: stringOrNull(m.ReturnSessionID), PushReplies: m.PushReplies, ThreadID: m.ThreadID,
		Report: m.Report, Replies: replies}
}

// Deliver is the deliver frame of a queued message: register.sock's answer to a poll
// (docs/protocol.md §4.2), and agent.sock's to a Codex thread's poll and peek (§4.1).
type Deliver struct {
	Action    string          `json:"action"` // always "deliver"
	MessageID string          `json:"messageId"`
	FromName  string          `json:"fromName"`
	Text      string          `json:"text"`
	Envelope  string          `json:"envelope"`
	Origin    json.RawMessage `json:"origin,omitempty"`
}

// anonymous is the origin of a message queued without one (docs/protocol.md §4.2).
var anonymous = json.RawMessage(`{"kind":"anonymous"}`)

// DeliverOf is q's deliver frame; withOrigin: the recipient's harness is told who sent it
// (services, §7.3), anonymous when nobody was recorded; otherwise the frame has no origin.
func DeliverOf(q bus.Queued, withOrigin bool) Deliver {
	d := Deliver{Action: "deliver", MessageID: q.ID, FromName: q.FromName, Text: q.Text, Envelope: q.Envelope}
	if withOrigin {
		d.Origin = q.Origin
		if len(d.Origin) == 0 {
			d.Origin = anonymous
		}
	}
	return d
}

func stringOrNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func outcomeOrNull(o ledger.Outcome) *string {
	if o == ledger.NoOutcome {
		return nil
	}
	return stringOrNull(o.String())
}

// each maps in through of; nil stays nil (it is JSON null, an empty list is []).
func each[T, S any](in []T, of func(T) S) []S {
	if in == nil {
		return nil
	}
	out := make([]S, len(in))
	for i, v := range in {
		out[i] = of(v)
	}
	return out
}
