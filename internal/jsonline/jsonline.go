// Package jsonline is the codec of xmsg's JSON-line protocols (agent.sock, register.sock, the
// MCP bridge): reading size-capped '\n'-terminated lines, decoding one frame into an Object
// whose fields are looked up by name and alias, and encoding one answer line. It is pure: no
// I/O but the bufio.Reader it is handed, no state, fuzzed (docs/protocol.md §2.4, §2.5, §2.8).
//
// The rules, the same on every socket:
//
//   - A line of nothing but white space is no frame (IsBlank), and is ignored.
//   - A frame is exactly one JSON object in valid UTF-8. Only JSON's own whitespace (space,
//     tab, CR, LF) may surround it; anything after it is an error (so `{} {}` and `{}\v` are
//     refused, as is a frame that only looks like JSON to bytes.TrimSpace).
//   - Field names match exactly, as in the original xmsg (serde): `"Ref"` is not `"ref"`.
//     Unknown fields are ignored: clients may send extras such as `return_to`, and none is
//     ever used. A field that is null counts as absent.
//   - A field of the wrong type is an error naming the field.
//   - Answers are written without HTML escaping: `<`, `>` and `&` appear as themselves, byte
//     for byte like the original's answers (encoding/json would write `\u003c`). Control
//     characters, U+2028 and U+2029 are still escaped, so every answer is exactly one line.
package jsonline

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"unicode/utf8"
)

// ErrTooLong is ReadLine's error for a line over its limit.
var ErrTooLong = errors.New("jsonline: line too long")

// ReadLine returns the next line of r without its '\n'. A line of more than max bytes is
// ErrTooLong, and the rest of it is not read (a server then ends the connection, since the
// frame boundary is lost; a client that must stay in step calls SkipLine). At EOF a final
// unterminated line is returned with io.ErrUnexpectedEOF; a protocol that requires the newline
// treats that like any other error.
func ReadLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		n := len(chunk)
		if err == nil {
			n--
		}
		if len(line)+n > max {
			return nil, ErrTooLong
		}
		line = append(line, chunk[:n]...)
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return line, io.ErrUnexpectedEOF
		default:
			return line, err
		}
	}
}

// SkipLine discards the rest of the current line, through its '\n'. It returns nil once the
// newline is consumed, and the read error (io.EOF at the end) otherwise.
func SkipLine(r *bufio.Reader) error {
	for {
		_, err := r.ReadSlice('\n')
		if !errors.Is(err, bufio.ErrBufferFull) {
			return err
		}
	}
}

// IsBlank reports whether line holds nothing but white space (Unicode's, as the original
// xmsg's trim): a blank line is no frame, and is ignored.
func IsBlank(line []byte) bool { return len(bytes.TrimSpace(line)) == 0 }

func trim(b []byte) []byte { return bytes.Trim(b, " \t\r\n") }

// SyntaxError is a frame that is not one JSON object.
type SyntaxError struct {
	Reason    string // what is wrong, for a detail line
	NotObject bool   // valid JSON, but not an object (an array, a string, null)
}

func (e *SyntaxError) Error() string { return "invalid json: " + e.Reason }

// FieldError is a field whose value has the wrong type.
type FieldError struct {
	Field     string // the name as it appeared in the frame
	Canonical string // the first of the names asked for
	Want      string // "string", "boolean", "number"
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("invalid json: field '%s' must be a %s", e.Field, e.Want)
}

// Object is one decoded frame, field by field.
type Object map[string]json.RawMessage

// Decode parses line as exactly one JSON object (see the package rules).
func Decode(line []byte) (Object, error) {
	if !utf8.Valid(line) {
		return nil, &SyntaxError{Reason: "frame is not valid UTF-8"}
	}
	t := trim(line)
	if len(t) == 0 || t[0] != '{' {
		return nil, &SyntaxError{Reason: "frame must be a JSON object", NotObject: len(t) > 0 && json.Valid(t)}
	}
	// The common case, a frame as clients write it, in one pass of our own (scanObject).
	if obj, ok := scanObject(t); ok {
		return obj, nil
	}
	// Next, one well-formed object in one call: json.Unmarshal accepts exactly
	// the inputs that the decoder below accepts (one value, then only white space), and costs
	// no decoder, reader or token. The decoder is kept for the rest: its errors are the
	// detail lines clients see.
	var obj Object
	if json.Unmarshal(t, &obj) == nil {
		return obj, nil
	}
	return decodeStream(t)
}

// decodeStream is Decode of a trimmed line that starts with '{', through a decoder.
func decodeStream(t []byte) (Object, error) {
	var obj Object
	dec := json.NewDecoder(bytes.NewReader(t))
	if err := dec.Decode(&obj); err != nil {
		return nil, &SyntaxError{Reason: err.Error()}
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, &SyntaxError{Reason: "trailing data after the object"}
	}
	return obj, nil
}

// Raw returns the first of names (a canonical name, then its aliases) that is present and not
// null, and the name it was found under.
func (o Object) Raw(names ...string) (raw json.RawMessage, name string, ok bool) {
	for _, n := range names {
		if v, found := o[n]; found && string(v) != "null" {
			return v, n, true
		}
	}
	return nil, "", false
}

// String returns the string field under the first present name of names; "" when absent.
func (o Object) String(names ...string) (string, error) {
	s, _, err := o.OptString(names...)
	return s, err
}

// OptString is String that also tells whether the field was present.
func (o Object) OptString(names ...string) (s string, present bool, err error) {
	raw, n, ok := o.Raw(names...)
	if !ok {
		return "", false, nil
	}
	if p, ok := plainString(raw); ok {
		return p, true, nil
	}
	if s, ok = unmarshal[string](raw); !ok {
		return "", true, &FieldError{Field: n, Canonical: names[0], Want: "string"}
	}
	return s, true, nil
}

// unmarshal is json.Unmarshal of raw into a new T. A function of its own so that the
// variable it decodes into, which escapes, is allocated only on this slow path, not on
// every call of the field getters.
func unmarshal[T any](raw []byte) (v T, ok bool) {
	p := new(T)
	if json.Unmarshal(raw, p) != nil {
		return v, false
	}
	return *p, true
}

// Bool returns the boolean field under the first present name of names; present is false
// when none is.
func (o Object) Bool(names ...string) (v, present bool, err error) {
	raw, n, ok := o.Raw(names...)
	if !ok {
		return false, false, nil
	}
	switch string(raw) {
	case "true":
		return true, true, nil
	case "false":
		return false, true, nil
	}
	if v, ok = unmarshal[bool](raw); !ok {
		return false, true, &FieldError{Field: n, Canonical: names[0], Want: "boolean"}
	}
	return v, true, nil
}

// Number returns the numeric field under the first present name of names; present is false
// when none is. NaN cannot occur (JSON has none); overflowing values are an error.
func (o Object) Number(names ...string) (v float64, present bool, err error) {
	raw, n, ok := o.Raw(names...)
	if !ok {
		return 0, false, nil
	}
	if v, ok = unmarshal[float64](raw); !ok || math.IsNaN(v) {
		return 0, true, &FieldError{Field: n, Canonical: names[0], Want: "number"}
	}
	return v, true, nil
}

// Encode renders v as one answer line: JSON without HTML escaping, then '\n'.
func Encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("jsonline: encode: %w", err)
	}
	return buf.Bytes(), nil
}
