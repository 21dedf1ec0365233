package fed

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"

	"github.com/xmsg/xmsg/internal/jsonline"
	"github.com/xmsg/xmsg/internal/principal"
)

// Version is the envelope version of this project ("v":2; the original used 1).
const Version = 2

// Envelope is a FedEnvelope (POST /fed/v2/messages).
type Envelope struct {
	V         int                 `json:"v"`
	ID        string              `json:"id"`
	Principal principal.Principal `json:"principal"`
	To        struct {
		Ref string `json:"ref"`
	} `json:"to"`
	Body        string `json:"body"`
	PushReplies bool   `json:"push_replies"`
	ThreadID    string `json:"thread_id"`
	CreatedAt   int64  `json:"created_at"`
}

// appendEnvelope appends json.Marshal(e), given its principal as principal.Append writes it
// (the caller keeps that for the mail's pull row): a hub writes one with each leaf message,
// into the mail it keeps (TestAppendEnvelopeIsMarshal).
func appendEnvelope(dst []byte, e Envelope, principalJSON []byte) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, int64(e.V), 10)
	dst = append(dst, `,"id":`...)
	dst = jsonline.AppendString(dst, e.ID, true)
	dst = append(dst, `,"principal":`...)
	dst = append(dst, principalJSON...)
	dst = append(dst, `,"to":{"ref":`...)
	dst = jsonline.AppendString(dst, e.To.Ref, true)
	dst = append(dst, `},"body":`...)
	dst = jsonline.AppendString(dst, e.Body, true)
	dst = append(dst, `,"push_replies":`...)
	dst = strconv.AppendBool(dst, e.PushReplies)
	dst = append(dst, `,"thread_id":`...)
	dst = jsonline.AppendString(dst, e.ThreadID, true)
	dst = append(dst, `,"created_at":`...)
	dst = strconv.AppendInt(dst, e.CreatedAt, 10)
	return append(dst, '}')
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
