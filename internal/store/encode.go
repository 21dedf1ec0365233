package store

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// A message row, and a queued recipient's queue row, are encoded in every send's transaction,
// while the commit's writer lock is held (and, in a group commit, once for each send of the
// batch, one after the other), so they are written by hand: encoding/json's reflection was the
// largest part of a send's work inside the transaction. The bytes are exactly json.Marshal's
// (TestAppendMessageIsMarshal, TestAppendPendingIsMarshal and their fuzzers): a row reads the
// same whichever wrote it.

// appendMessage appends json.Marshal(m).
func appendMessage(dst []byte, m Message) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, m.ID)
	dst = append(dst, `,"createdAt":`...)
	dst = strconv.AppendInt(dst, m.CreatedAt, 10)
	dst = append(dst, `,"sessionId":`...)
	dst = appendString(dst, m.SessionID)
	dst = append(dst, `,"fromName":`...)
	dst = appendString(dst, m.FromName)
	dst = append(dst, `,"bytes":`...)
	dst = strconv.AppendInt(dst, int64(m.Bytes), 10)
	dst = append(dst, `,"outcome":`...)
	dst = appendString(dst, m.Outcome.String())
	dst = append(dst, `,"recipientHarness":`...)
	dst = appendString(dst, m.RecipientHarness)
	if m.ReturnHarness != "" {
		dst = append(dst, `,"returnHarness":`...)
		dst = appendString(dst, m.ReturnHarness)
	}
	if m.ReturnSessionID != "" {
		dst = append(dst, `,"returnSessionId":`...)
		dst = appendString(dst, m.ReturnSessionID)
	}
	if m.ReturnHost != "" {
		dst = append(dst, `,"returnHost":`...)
		dst = appendString(dst, m.ReturnHost)
	}
	dst = append(dst, `,"pushReplies":`...)
	dst = strconv.AppendBool(dst, m.PushReplies)
	dst = append(dst, `,"threadId":`...)
	dst = appendString(dst, m.ThreadID)
	if m.Report != "" {
		dst = append(dst, `,"report":`...)
		dst = appendString(dst, m.Report)
	}
	return append(dst, '}')
}

// appendPending appends json.Marshal(p); ok is false when p.Origin is not valid JSON (then
// json.Marshal says why).
func appendPending(dst []byte, p Pending) ([]byte, bool) {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, p.ID)
	if p.Share != "" {
		dst = append(dst, `,"share":`...)
		dst = appendString(dst, p.Share)
	}
	dst = append(dst, `,"sessionId":`...)
	dst = appendString(dst, p.SessionID)
	dst = append(dst, `,"createdAt":`...)
	dst = strconv.AppendInt(dst, p.CreatedAt, 10)
	dst = append(dst, `,"fromName":`...)
	dst = appendString(dst, p.FromName)
	dst = append(dst, `,"bytes":`...)
	dst = strconv.AppendInt(dst, int64(p.Bytes), 10)
	dst = append(dst, `,"text":`...)
	dst = appendString(dst, p.Text)
	dst = append(dst, `,"envelope":`...)
	dst = appendString(dst, p.Envelope)
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

const hexDigits = "0123456789abcdef"

// appendString appends s as encoding/json writes a string by default: '"' and '\\' escaped,
// \b \f \n \r \t by name, other control characters and the HTML characters < > & as \u00xx,
// invalid UTF-8 as \ufffd, and U+2028 and U+2029 escaped.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
