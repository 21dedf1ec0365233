package jsonline

import (
	"bytes"
	"unicode/utf8"
)

// scanDepth is how deeply nested a value may be for scanObject; deeper frames go to
// encoding/json, whose own limit (and error) applies. No protocol frame comes close.
const scanDepth = 64

// scanObject decodes t (a trimmed line that starts with '{', valid UTF-8) in one pass over
// its bytes: every field's raw value is a sub-slice of one copy of t. It handles the frames
// clients send (keys without escapes, any values); ok false means it declined, and the
// caller asks encoding/json, which then accepts or refuses the frame exactly as before. So
// scanObject must accept only what json.Unmarshal into an Object accepts, and give the same
// fields (FuzzDecodeFast holds it to that): a frame with a send's text was validated and
// copied three times by encoding/json (checkValid, the map decode, the field's Unmarshal).
func scanObject(t []byte) (obj Object, ok bool) {
	b := bytes.Clone(t)
	s := scanner{b: b, i: 1}
	obj = Object{}
	s.ws()
	if s.peek() == '}' {
		s.i++
		return obj, s.i == len(b)
	}
	for {
		if s.peek() != '"' {
			return nil, false
		}
		ks := s.i + 1
		if !s.str() {
			return nil, false
		}
		key := b[ks : s.i-1]
		// A key with an escape is left to encoding/json, which unescapes it.
		if bytes.IndexByte(key, '\\') >= 0 {
			return nil, false
		}
		s.ws()
		if s.peek() != ':' {
			return nil, false
		}
		s.i++
		s.ws()
		vs := s.i
		if !s.value(0) {
			return nil, false
		}
		// A full slice expression: appending to one field cannot overwrite the next.
		obj[string(key)] = b[vs:s.i:s.i]
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
			s.ws()
		case '}':
			s.i++
			return obj, s.i == len(b)
		default:
			return nil, false
		}
	}
}

type scanner struct {
	b []byte
	i int
}

// peek is the byte at the cursor, 0 at the end (0 starts no JSON token).
func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// ws skips JSON white space.
func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\r', '\n':
			s.i++
		default:
			return
		}
	}
}

// value skips one JSON value at the cursor; false: not one.
func (s *scanner) value(depth int) bool {
	switch c := s.peek(); {
	case c == '"':
		return s.str()
	case c == '{', c == '[':
		return s.nested(depth + 1)
	case c == 't':
		return s.lit("true")
	case c == 'f':
		return s.lit("false")
	case c == 'n':
		return s.lit("null")
	case c == '-', c >= '0' && c <= '9':
		return s.num()
	}
	return false
}

func (s *scanner) lit(w string) bool {
	if len(s.b)-s.i < len(w) || string(s.b[s.i:s.i+len(w)]) != w {
		return false
	}
	s.i += len(w)
	return true
}

// str skips a string (the cursor on its opening quote), checking its escapes; no control
// character may appear raw. The bytes are valid UTF-8 already (Decode checked the line).
func (s *scanner) str() bool {
	s.i++
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return true
		case c < 0x20:
			return false
		case c == '\\':
			s.i++
			switch s.peek() {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i++
			case 'u':
				if len(s.b)-s.i < 5 {
					return false
				}
				for _, h := range s.b[s.i+1 : s.i+5] {
					if !isHex(h) {
						return false
					}
				}
				s.i += 5
			default:
				return false
			}
		default:
			// Any other byte, a UTF-8 continuation byte included, is part of the string.
			s.i++
		}
	}
	return false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// num skips a number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) num() bool {
	if s.peek() == '-' {
		s.i++
	}
	switch c := s.peek(); {
	case c == '0':
		s.i++
	case c >= '1' && c <= '9':
		s.digits()
	default:
		return false
	}
	if s.peek() == '.' {
		s.i++
		if !s.digits() {
			return false
		}
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		s.i++
		if c := s.peek(); c == '+' || c == '-' {
			s.i++
		}
		if !s.digits() {
			return false
		}
	}
	return true
}

// digits skips one or more decimal digits; false: none.
func (s *scanner) digits() bool {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}

// nested skips an object or an array (the cursor on its opening bracket).
func (s *scanner) nested(depth int) bool {
	if depth > scanDepth {
		return false
	}
	obj := s.b[s.i] == '{'
	end := byte(']')
	if obj {
		end = '}'
	}
	s.i++
	s.ws()
	if s.peek() == end {
		s.i++
		return true
	}
	for {
		if obj {
			if s.peek() != '"' || !s.str() {
				return false
			}
			s.ws()
			if s.peek() != ':' {
				return false
			}
			s.i++
			s.ws()
		}
		if !s.value(depth) {
			return false
		}
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
			s.ws()
		case end:
			s.i++
			return true
		default:
			return false
		}
	}
}

// plainString is the value of raw when it is a JSON string with no escape, no raw control
// character and valid UTF-8: then its bytes are the string, with nothing to decode.
func plainString(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	in := raw[1 : len(raw)-1]
	for _, c := range in {
		if c < 0x20 || c == '"' || c == '\\' {
			return "", false
		}
	}
	if !utf8.Valid(in) {
		return "", false
	}
	return string(in), true
}

// SkipSpace returns the index of the first byte at or after i in b that is not JSON white
// space (space, tab, CR, LF): for the hand decoders of the hottest frames.
func SkipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// EachField reads b as one flat JSON object, white space around and inside it allowed, for the
// hand decoders of the hottest frames: it calls field with each key (a plain string, see
// PlainStringAt) and the index of its value, and field reads the value and returns the index
// after it, or false to give the object up. EachField reports whether b was read whole so: the
// caller leaves anything else to encoding/json. It does not check UTF-8.
func EachField(b []byte, field func(key string, at int) (next int, ok bool)) bool {
	i := SkipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	if i = SkipSpace(b, i+1); i < len(b) && b[i] == '}' {
		return SkipSpace(b, i+1) == len(b)
	}
	for {
		key, j, ok := PlainStringAt(b, i)
		if !ok {
			return false
		}
		if j = SkipSpace(b, j); j >= len(b) || b[j] != ':' {
			return false
		}
		if j = SkipSpace(b, j+1); j >= len(b) {
			return false
		}
		if j, ok = field(key, j); !ok {
			return false
		}
		if j = SkipSpace(b, j); j >= len(b) {
			return false
		}
		switch b[j] {
		case ',':
			i = SkipSpace(b, j+1)
		case '}':
			return SkipSpace(b, j+1) == len(b)
		default:
			return false
		}
	}
}

// EachString is EachField for an object whose values are all plain strings (PlainStringAt):
// field is called with each key and its value, and returns false to give the object up.
func EachString(b []byte, field func(key, val string) bool) bool {
	return EachField(b, func(key string, at int) (int, bool) {
		val, next, ok := PlainStringAt(b, at)
		if !ok || !field(key, val) {
			return 0, false
		}
		return next, true
	})
}

// PlainStringAt reads the JSON string that starts at b[i] if it needs no decoding (no escape,
// no raw control character), returning it and the index after its closing quote; ok is false
// for anything else, which the caller leaves to encoding/json. It does not check UTF-8: the
// callers validate the whole line first.
func PlainStringAt(b []byte, i int) (s string, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return "", 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return string(b[i+1 : j]), j + 1, true
		case c == '\\' || c < 0x20:
			return "", 0, false
		}
	}
	return "", 0, false
}
