package registersock

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	"github.com/xmsg/xmsg/internal/answer"
	"github.com/xmsg/xmsg/internal/jsonline"
)

// The frames of a consumer's loop, a poll and an ack (or one poll that carries the ack), are
// most of register.sock's traffic. They are read and written here without encoding/json's
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
		ack                   string
		hasID, hasID2, hasW2  bool
		wait, wait2           = -1, -1
		batch                 = 0
		seen                  uint8 // fields seen, one bit each
	)
	ok = jsonline.EachField(line, func(key string, j int) (int, bool) {
		var (
			str string
			ok  bool
		)
		num, isNum := -1, false
		if line[j] == '"' {
			if str, j, ok = jsonline.PlainStringAt(line, j); !ok {
				return 0, false
			}
		} else if num, j, ok = plainUint(line, j); ok {
			isNum = true
		} else {
			return 0, false
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
		case "ack":
			if str == "" && !isNum {
				return 0, false // refused by decodeLoop (errEmptyAck)
			}
			bit, ack = 64, str
		case "max":
			bit, batch = 128, max(1, min(num, maxBatch))
		case "acks":
			return 0, false // an array: decodeLoop's (never ignored, as an unknown field is)
		}
		// Other fields are ignored, as decodeLoop ignores them (repeated or not).
		if bit != 0 {
			if seen&bit != 0 || (bit == 16 || bit == 32 || bit == 128) != isNum {
				return 0, false // a repeated field, or one of the wrong type
			}
			seen |= bit
		}
		return j, true
	})
	if !ok {
		return loopReq{}, false
	}
	req = loopReq{Action: action, Text: text, WaitSecs: defaultWait, Ack: ack, Max: batch}
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
	dst = jsonline.AppendString(dst, d.Action, false)
	dst = append(dst, `,"messageId":`...)
	dst = jsonline.AppendString(dst, d.MessageID, false)
	dst = append(dst, `,"fromName":`...)
	dst = jsonline.AppendString(dst, d.FromName, false)
	dst = append(dst, `,"text":`...)
	dst = jsonline.AppendString(dst, d.Text, false)
	dst = append(dst, `,"envelope":`...)
	dst = jsonline.AppendString(dst, d.Envelope, false)
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
