package fed

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/xmsg/xmsg/internal/hub"
)

// A leaf decodes a pull's answer for every batch it is handed, on each message's way to its
// service; encoding/json's reflection was the largest part of the leaf's own work on it. The
// answer of a hub of this version (appendPullAnswer, hub.EncodeRow: fixed keys in a fixed
// order, no white space) is read in one pass here; anything else (an older hub, another
// implementation) goes to json.Unmarshal. The pass takes only what json.Unmarshal reads the
// same way (TestQuickPullAnswerIsUnmarshal, FuzzQuickPullAnswer).

// decodePullAnswer is json.Unmarshal(raw, ans).
func decodePullAnswer(raw []byte, ans *PullAnswer) error {
	if quickPullAnswer(raw, ans) {
		return nil
	}
	*ans = PullAnswer{}
	return json.Unmarshal(raw, ans)
}

// quickPullAnswer decodes raw if it is a pull's answer as this version writes it; false (and
// ans to be reset) for anything else.
func quickPullAnswer(raw []byte, ans *PullAnswer) bool {
	*ans = PullAnswer{}
	raw = bytes.TrimSuffix(raw, []byte("\n"))
	c := cursor{b: raw, ok: true}
	c.lit(`{"acked":`)
	ans.Acked = int(c.int())
	if c.peekLit(`,"rejected":`) {
		ans.Rejected = int(c.int())
	}
	c.lit(`,"rows":[`)
	ans.Rows = []hub.Row{}
	for c.ok && !c.peekLit("]") {
		if len(ans.Rows) > 0 {
			c.lit(",")
		}
		var r hub.Row
		c.lit(`{"id":`)
		r.ID = c.str()
		c.lit(`,"origin":`)
		r.Origin = c.raw()
		c.lit(`,"body":`)
		r.Body = c.str()
		c.lit(`,"to":`)
		r.To = c.str()
		if c.peekLit(`,"principal":`) {
			r.Principal = c.raw()
		}
		c.lit(`,"push_replies":`)
		r.PushReplies = c.bool()
		if c.peekLit(`,"thread_id":`) {
			r.ThreadID = c.str()
		}
		c.lit(`,"created_at":`)
		r.CreatedAt = c.int()
		c.lit("}")
		ans.Rows = append(ans.Rows, r)
	}
	c.lit("}")
	return c.ok && c.i == len(c.b)
}

// cursor reads b from i; ok turns false at the first thing it does not take, and every read
// after that does nothing.
type cursor struct {
	b  []byte
	i  int
	ok bool
}

func (c *cursor) lit(s string) {
	if c.ok && !c.peekLit(s) {
		c.ok = false
	}
}

// peekLit takes s if it comes next.
func (c *cursor) peekLit(s string) bool {
	if c.ok && bytes.HasPrefix(c.b[c.i:], []byte(s)) {
		c.i += len(s)
		return true
	}
	return false
}

// int reads an integer as json.Unmarshal does into an int or int64: digits, a sign, no
// fraction or exponent.
func (c *cursor) int() int64 {
	if !c.ok {
		return 0
	}
	j := c.i
	if j < len(c.b) && c.b[j] == '-' {
		j++
	}
	start := j
	for j < len(c.b) && c.b[j] >= '0' && c.b[j] <= '9' {
		j++
	}
	if j == start || (c.b[start] == '0' && j-start > 1) {
		c.ok = false
		return 0
	}
	n, err := strconv.ParseInt(string(c.b[c.i:j]), 10, 64)
	if err != nil || n != int64(int(n)) {
		c.ok = false
		return 0
	}
	c.i = j
	return n
}

func (c *cursor) bool() bool {
	switch {
	case c.peekLit("true"):
		return true
	case c.peekLit("false"):
		return false
	}
	c.ok = false
	return false
}

// str reads a JSON string: as it is when it holds no escape and is valid UTF-8, else through
// json.Unmarshal (escapes, and invalid UTF-8, which it replaces).
func (c *cursor) str() string {
	if !c.ok || c.i >= len(c.b) || c.b[c.i] != '"' {
		c.ok = false
		return ""
	}
	plain := true
	for j := c.i + 1; j < len(c.b); j++ {
		switch b := c.b[j]; {
		case b == '\\':
			plain = false
			j++ // the escaped byte is never the string's end
		case b < 0x20:
			c.ok = false
			return ""
		case b == '"':
			tok := c.b[c.i : j+1]
			c.i = j + 1
			if plain && utf8.Valid(tok) {
				return string(tok[1 : len(tok)-1])
			}
			var s string
			if json.Unmarshal(tok, &s) != nil {
				c.ok = false
			}
			return s
		}
	}
	c.ok = false
	return ""
}

// raw reads one JSON value as json.Unmarshal keeps it in a json.RawMessage: its bytes, copied.
func (c *cursor) raw() json.RawMessage {
	if !c.ok {
		return nil
	}
	end, ok := valueEnd(c.b, c.i, 0)
	if !ok || !json.Valid(c.b[c.i:end]) {
		c.ok = false
		return nil
	}
	v := append(json.RawMessage(nil), c.b[c.i:end]...)
	c.i = end
	return v
}

// valueEnd finds where the JSON value at b[i] ends (without white space around it), nested
// at most 64 deep; json.Valid then checks what it spans.
func valueEnd(b []byte, i, depth int) (int, bool) {
	if i >= len(b) || depth > 64 {
		return 0, false
	}
	switch b[i] {
	case '"':
		for j := i + 1; j < len(b); j++ {
			switch b[j] {
			case '\\':
				j++
			case '"':
				return j + 1, true
			}
		}
		return 0, false
	case '{', '[':
		closing := byte('}')
		if b[i] == '[' {
			closing = ']'
		}
		j := i + 1
		if j < len(b) && b[j] == closing {
			return j + 1, true
		}
		for j < len(b) {
			var ok bool
			if j, ok = valueEnd(b, j, depth+1); !ok || j >= len(b) {
				return 0, false
			}
			switch b[j] {
			case ':', ',':
				j++
			case closing:
				return j + 1, true
			default:
				return 0, false
			}
		}
		return 0, false
	default:
		j := i
		for j < len(b) && (b[j] == '-' || b[j] == '+' || b[j] == '.' || (b[j] >= '0' && b[j] <= '9') || (b[j] >= 'a' && b[j] <= 'z') || (b[j] >= 'A' && b[j] <= 'Z')) {
			j++
		}
		return j, j > i
	}
}
