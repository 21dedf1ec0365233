package httpapi

// Fast paths for the JSON of a send, the request path's hottest: encoding/json's reflection
// cost about a tenth of a send's CPU. Each handles only the plain common case and hands
// anything else to encoding/json, so the bytes and errors are encoding/json's either way
// (TestFastSendDecodeMatches, TestFastDeliveryMatches).

import (
	"strconv"
	"unicode/utf8"

	"github.com/xmsg/xmsg/internal/answer"
	"github.com/xmsg/xmsg/internal/jsonline"
)

// decodeSendFast decodes a body that is one flat object of the known fields with plain
// string values: no escapes, no control characters, exact-case names. ok is false for
// anything else (the caller then decodes with encoding/json, which also gives the error).
// body is valid UTF-8 (checked before).
func decodeSendFast(body []byte) (req SendRequest, ok bool) {
	ok = jsonline.EachString(body, func(key, val string) bool {
		switch key { // a repeated field: the last one counts, as in encoding/json
		case "from":
			req.From = val
		case "text":
			req.Text = val
		case "idempotency_key":
			req.IdempotencyKey = val
		case "idempotencyKey":
			req.IdempotencyKeyAlias = val
		default:
			return false
		}
		return true
	})
	return req, ok
}

// encodeDelivery is jsonline.Encode(d): by hand when no string needs escaping.
func encodeDelivery(d answer.Delivery) ([]byte, error) {
	if !plainJSON(d.SessionID) || !plainJSON(d.FromName) || !plainJSON(d.MessageID) || !plainJSON(d.Outcome.String()) {
		return jsonline.Encode(d)
	}
	b := make([]byte, 0, 96+len(d.SessionID)+len(d.FromName)+len(d.MessageID)+len(d.Outcome.String()))
	b = append(b, `{"sessionId":"`...)
	b = append(b, d.SessionID...)
	b = append(b, `","fromName":"`...)
	b = append(b, d.FromName...)
	b = append(b, `","bytes":`...)
	b = strconv.AppendInt(b, int64(d.Bytes), 10)
	b = append(b, `,"messageId":"`...)
	b = append(b, d.MessageID...)
	b = append(b, `","outcome":"`...)
	b = append(b, d.Outcome.String()...)
	b = append(b, "\"}\n"...)
	return b, nil
}

// plainJSON reports whether encoding/json (without HTML escaping) writes s as it is: valid
// UTF-8 without '"', '\\', control characters, U+2028 or U+2029.
func plainJSON(s string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == '"' || c == '\\' {
				return false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError || r == '\u2028' || r == '\u2029' {
			return false
		}
		i += size
	}
	return true
}
