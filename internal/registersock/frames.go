package registersock

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	"github.com/xmsg/xmsg/internal/answer"
	"github.com/xmsg/xmsg/internal/jsonline"
)

// The two frames of a consumer's loop, a poll and an ack, are most of register.sock's traffic
// (two per message delivered). They are read and written here without encoding/json's
// reflection: quickLoop reads the plain shape clients send (flat, no escapes) and leaves
// everything else to decodeLoop; appendDeliver writes the bytes encode(answer.Deliver) would.
// Both are checked against the general paths by fuzz tests.

// quickLoop decodes line as decodeLoop would, if it is one flat object whose keys are plain
// strings and whose values are strings without escapes or unsigned integers, each key once.
// ok is false for anything else (the caller then uses decodeLoop).
func quickLoop(line []byte) (req loopReq, ok bool) {
	if !utf8.Valid(line) {
		return loopReq{}, false
	}
	var (
		action, id, id2, text string
		hasID, hasID2, hasW2  bool
		wait, wait2           = -1, -1
		seen                  uint8 // fields seen, one bit each
	)
	i := jsonline.SkipSpace(line, 0)
	if i >= len(line) || line[i] != '{' {
		return loopReq{}, false
	}
	i = jsonline.SkipSpace(line, i+1)
	if i < len(line) && line[i] == '}' {
		i++
	} else {
		for {
			key, j, ok := jsonline.PlainStringAt(line, i)
			if !ok {
				return loopReq{}, false
			}
			j = jsonline.SkipSpace(line, j)
			if j >= len(line) || line[j] != ':' {
				return loopReq{}, false
			}
			j = jsonline.SkipSpace(line, j+1)
			if j >= len(line) {
				return loopReq{}, false
			}
			var str string
			num, isNum := -1, false
			if line[j] == '"' {
				if str, j, ok = jsonline.PlainStringAt(line, j); !ok {
					return loopReq{}, false
				}
			} else if num, j, ok = plainUint(line, j); ok {
				isNum = true
			} else {
				return loopReq{}, false
			}
			var bit uint8
			switch key {
			case "action":
				bit, action = 1, str
			case "messageId":
				bit, id, hasID = 2, str, true
			case "message_id":
				bit, id2, hasID2 = 4, str, true
			case "text":
				bit, text = 8, str
			case "waitSecs":
				bit, wait = 16, num
			case "wait_secs":
				bit, wait2, hasW2 = 32, num, true
			}
			// Other fields are ignored, as decodeLoop ignores them (repeated or not).
			if bit != 0 {
				if seen&bit != 0 || (bit == 16 || bit == 32) != isNum {
					return loopReq{}, false // a repeated field, or one of the wrong type
				}
				seen |= bit
			}
			j = jsonline.SkipSpace(line, j)
			if j < len(line) && line[j] == ',' {
				i = jsonline.SkipSpace(line, j+1)
				continue
			}
			if j < len(line) && line[j] == '}' {
				i = j + 1
				break
			}
			return loopReq{}, false
		}
	}
	if jsonline.SkipSpace(line, i) != len(line) {
		return loopReq{}, false
	}
	req = loopReq{Action: action, Text: text, WaitSecs: defaultWait}
	switch {
	case hasID:
		req.MessageID = id
	case hasID2:
		req.MessageID = id2
	}
	switch {
	case seen&16 != 0:
		req.WaitSecs = min(wait, maxWaitSecs)
	case hasW2:
		req.WaitSecs = min(wait2, maxWaitSecs)
	}
	return req, true
}

// maxWaitSecs is the longest poll wait in seconds (bus.MaxWait).
const maxWaitSecs = 60

// plainUint reads an unsigned JSON integer of at most 9 digits (no sign, fraction, exponent
// or leading zero) at b[i].
func plainUint(b []byte, i int) (n, next int, ok bool) {
	j := i
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		n = n*10 + int(b[j]-'0')
		j++
	}
	if j == i || j-i > 9 || (b[i] == '0' && j-i > 1) {
		return 0, 0, false
	}
	if j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E') {
		return 0, 0, false
	}
	return n, j, true
}

// appendDeliver appends the line encode(d) renders: the same bytes (fields in struct order,
// strings escaped as encoding/json does without HTML escaping, origin compacted), newline
// included. ok is false if origin is not valid JSON (encode then reports the failure).
func appendDeliver(dst []byte, d answer.Deliver) ([]byte, bool) {
	dst = append(dst, `{"action":`...)
	dst = appendString(dst, d.Action)
	dst = append(dst, `,"messageId":`...)
	dst = appendString(dst, d.MessageID)
	dst = append(dst, `,"fromName":`...)
	dst = appendString(dst, d.FromName)
	dst = append(dst, `,"text":`...)
	dst = appendString(dst, d.Text)
	dst = append(dst, `,"envelope":`...)
	dst = appendString(dst, d.Envelope)
	if len(d.Origin) > 0 {
		dst = append(dst, `,"origin":`...)
		n := len(dst)
		var err error
		if dst, err = appendCompact(dst, d.Origin); err != nil {
			return dst[:n], false
		}
	}
	return append(dst, "}\n"...), true
}

func appendCompact(dst []byte, raw []byte) ([]byte, error) {
	buf := bytes.NewBuffer(dst)
	err := json.Compact(buf, raw)
	return buf.Bytes(), err
}

const hexDigits = "0123456789abcdef"

// appendString appends s as encoding/json writes a string with HTML escaping off: '"' and '\\'
// escaped, \b \f \n \r \t by name, other control characters as \u00xx, invalid UTF-8 as
// \ufffd, and U+2028 and U+2029 escaped (JavaScript line terminators).
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
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
