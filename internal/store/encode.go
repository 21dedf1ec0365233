package store

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strconv"

	"github.com/xmsg/xmsg/internal/jsonline"
)

// A message row, and a queued recipient's queue row (a leaf's mailbox and outbound rows on a
// hub), are encoded in every send's transaction, while the commit's writer lock is held (and,
// in a group commit, once for each send of the batch, one after the other), so they are
// written by hand: encoding/json's reflection was the largest part of a send's work inside the
// transaction. The bytes are exactly json.Marshal's (TestAppend*IsMarshal and their fuzzers):
// a row reads the same whichever wrote it.

// appendMessage appends json.Marshal(m).
func appendMessage(dst []byte, m Message) []byte {
	dst = append(dst, `{"id":`...)
	dst = jsonline.AppendString(dst, m.ID, true)
	dst = append(dst, `,"createdAt":`...)
	dst = strconv.AppendInt(dst, m.CreatedAt, 10)
	dst = append(dst, `,"sessionId":`...)
	dst = jsonline.AppendString(dst, m.SessionID, true)
	dst = append(dst, `,"fromName":`...)
	dst = jsonline.AppendString(dst, m.FromName, true)
	dst = append(dst, `,"bytes":`...)
	dst = strconv.AppendInt(dst, int64(m.Bytes), 10)
	dst = append(dst, `,"outcome":`...)
	dst = jsonline.AppendString(dst, m.Outcome.String(), true)
	dst = append(dst, `,"recipientHarness":`...)
	dst = jsonline.AppendString(dst, m.RecipientHarness, true)
	if m.ReturnHarness != "" {
		dst = append(dst, `,"returnHarness":`...)
		dst = jsonline.AppendString(dst, m.ReturnHarness, true)
	}
	if m.ReturnSessionID != "" {
		dst = append(dst, `,"returnSessionId":`...)
		dst = jsonline.AppendString(dst, m.ReturnSessionID, true)
	}
	if m.ReturnHost != "" {
		dst = append(dst, `,"returnHost":`...)
		dst = jsonline.AppendString(dst, m.ReturnHost, true)
	}
	dst = append(dst, `,"pushReplies":`...)
	dst = strconv.AppendBool(dst, m.PushReplies)
	dst = append(dst, `,"threadId":`...)
	dst = jsonline.AppendString(dst, m.ThreadID, true)
	if m.Report != "" {
		dst = append(dst, `,"report":`...)
		dst = jsonline.AppendString(dst, m.Report, true)
	}
	return append(dst, '}')
}

// appendPending appends json.Marshal(p); ok is false when p.Origin is not valid JSON (then
// json.Marshal says why).
func appendPending(dst []byte, p Pending) ([]byte, bool) {
	dst = append(dst, `{"id":`...)
	dst = jsonline.AppendString(dst, p.ID, true)
	if p.Share != "" {
		dst = append(dst, `,"share":`...)
		dst = jsonline.AppendString(dst, p.Share, true)
	}
	dst = append(dst, `,"sessionId":`...)
	dst = jsonline.AppendString(dst, p.SessionID, true)
	dst = append(dst, `,"createdAt":`...)
	dst = strconv.AppendInt(dst, p.CreatedAt, 10)
	dst = append(dst, `,"fromName":`...)
	dst = jsonline.AppendString(dst, p.FromName, true)
	dst = append(dst, `,"bytes":`...)
	dst = strconv.AppendInt(dst, int64(p.Bytes), 10)
	dst = append(dst, `,"text":`...)
	dst = jsonline.AppendString(dst, p.Text, true)
	dst = append(dst, `,"envelope":`...)
	dst = jsonline.AppendString(dst, p.Envelope, true)
	if len(p.Origin) > 0 {
		// As json.Marshal writes a RawMessage: compacted, with < > & U+2028 U+2029 escaped.
		var c bytes.Buffer
		if json.Compact(&c, p.Origin) != nil {
			return dst, false
		}
		out := bytes.NewBuffer(append(dst, `,"origin":`...))
		json.HTMLEscape(out, c.Bytes())
		dst = out.Bytes()
	}
	return append(dst, '}'), true
}

// appendMailbox appends json.Marshal(e): a leaf's mail is written in the send's transaction
// too, on the hub. Its two byte fields are base64, as encoding/json writes a []byte (null
// when nil).
func appendMailbox(dst []byte, e MailboxEntry) []byte {
	dst = append(dst, `{"id":`...)
	dst = jsonline.AppendString(dst, e.ID, true)
	dst = append(dst, `,"peer":`...)
	dst = jsonline.AppendString(dst, e.Peer, true)
	dst = append(dst, `,"targetRef":`...)
	dst = jsonline.AppendString(dst, e.TargetRef, true)
	dst = append(dst, `,"createdAt":`...)
	dst = strconv.AppendInt(dst, e.CreatedAt, 10)
	dst = append(dst, `,"fromName":`...)
	dst = jsonline.AppendString(dst, e.FromName, true)
	dst = append(dst, `,"bytes":`...)
	dst = strconv.AppendInt(dst, int64(e.Bytes), 10)
	dst = append(dst, `,"body":`...)
	dst = jsonline.AppendString(dst, e.Body, true)
	dst = append(dst, `,"envelope":`...)
	dst = appendBytes(dst, e.Envelope)
	dst = append(dst, `,"origin":`...)
	dst = appendBytes(dst, e.Origin)
	return append(dst, '}')
}

// appendOutbound appends json.Marshal(o): a leaf's mail writes one in the send's transaction
// too, on the hub.
func appendOutbound(dst []byte, o Outbound) []byte {
	dst = append(dst, `{"id":`...)
	dst = jsonline.AppendString(dst, o.ID, true)
	dst = append(dst, `,"peer":`...)
	dst = jsonline.AppendString(dst, o.Peer, true)
	dst = append(dst, `,"targetRef":`...)
	dst = jsonline.AppendString(dst, o.TargetRef, true)
	dst = append(dst, `,"outcome":`...)
	dst = jsonline.AppendString(dst, o.Outcome.String(), true)
	dst = append(dst, `,"createdAt":`...)
	dst = strconv.AppendInt(dst, o.CreatedAt, 10)
	return append(dst, '}')
}

// appendBytes appends b as encoding/json writes a []byte.
func appendBytes(dst, b []byte) []byte {
	if b == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '"')
	dst = base64.StdEncoding.AppendEncode(dst, b)
	return append(dst, '"')
}
