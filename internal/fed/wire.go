package fed

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// Version is the envelope version of this project ("v":2; the original used 1).
const Version = 2

// WirePrincipal is a sender on the wire, tagged by kind (§8.3): "session" (harness,
// session_id, name), "service" (name) or "anonymous" (from).
type WirePrincipal struct {
	Kind      string `json:"kind"`
	Harness   string `json:"harness,omitempty"`
	SessionID string `json:"session_id,omitempty"`
	Name      string `json:"name,omitempty"`
	From      string `json:"from,omitempty"`
}

// Envelope is a FedEnvelope (POST /fed/v2/messages).
type Envelope struct {
	V         int           `json:"v"`
	ID        string        `json:"id"`
	Principal WirePrincipal `json:"principal"`
	To        struct {
		Ref string `json:"ref"`
	} `json:"to"`
	Body        string `json:"body"`
	PushReplies bool   `json:"push_replies"`
	ThreadID    string `json:"thread_id"`
	CreatedAt   int64  `json:"created_at"`
}

// WireReplier is the replier of a reply envelope.
type WireReplier struct {
	Harness   string `json:"harness"`
	SessionID string `json:"session_id"`
	Name      string `json:"name"`
}

// ReplyEnvelope is a FedReplyEnvelope (POST /fed/v2/replies).
type ReplyEnvelope struct {
	V         int         `json:"v"`
	ID        string      `json:"id"`
	InReplyTo string      `json:"in_reply_to"`
	Replier   WireReplier `json:"replier"`
	Text      string      `json:"text"`
	CreatedAt int64       `json:"created_at"`
}

// decodeStrict decodes exactly one JSON object from body: valid UTF-8 (encoding/json would
// turn invalid bytes into U+FFFD silently), no unknown field at any level, nothing after it.
func decodeStrict(body []byte, v any) error {
	if !utf8.Valid(body) {
		return errors.New("body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("invalid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("invalid JSON: trailing data after the object")
	}
	return nil
}

// principal fields per kind; a field of another kind is refused like an unknown field.
func (p WirePrincipal) check() error {
	switch p.Kind {
	case "session":
		if p.From != "" {
			return errors.New("principal: \"from\" is not a field of a session principal")
		}
	case "service":
		if p.Harness != "" || p.SessionID != "" || p.From != "" {
			return errors.New("principal: a service principal has only \"name\"")
		}
	case "anonymous":
		if p.Harness != "" || p.SessionID != "" || p.Name != "" {
			return errors.New("principal: an anonymous principal has only \"from\"")
		}
	default:
		return fmt.Errorf("principal: unknown kind %q", p.Kind)
	}
	return nil
}

// DecodeEnvelope parses a message envelope. The version is NOT checked here: a wrong "v"
// is step 1 of the route's checks and has its own answer.
func DecodeEnvelope(body []byte) (Envelope, error) {
	var e Envelope
	if err := decodeStrict(body, &e); err != nil {
		return e, err
	}
	return e, nil
}

// DecodeReply parses a reply envelope (version not checked, as for DecodeEnvelope).
func DecodeReply(body []byte) (ReplyEnvelope, error) {
	var e ReplyEnvelope
	err := decodeStrict(body, &e)
	return e, err
}
