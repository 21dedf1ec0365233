package principal

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/xmsg/xmsg/internal/jsonline"
)

// Decode reads a principal as json.Unmarshal would. A leaf reads one with every row it pulls,
// and encoding/json's reflection was a twentieth of a leaf's CPU, so the shape a node writes
// (one flat object of this type's own keys, each once, with string values that need no
// decoding) is read in one pass of its own; anything else goes to json.Unmarshal, which also
// says what is wrong (FuzzDecode holds the two equal).
func Decode(raw []byte) (Principal, error) {
	if p, ok := quick(raw); ok {
		return p, nil
	}
	var p Principal
	err := json.Unmarshal(raw, &p)
	return p, err
}

// quick is Decode's one pass; ok is false for anything but the plain shape.
func quick(raw []byte) (p Principal, ok bool) {
	if !utf8.Valid(raw) {
		return Principal{}, false
	}
	var seen uint8 // one bit a key: a repeated one goes to json.Unmarshal (the last wins there)
	ok = jsonline.EachField(raw, func(key string, at int) (int, bool) {
		val, next, ok := jsonline.PlainStringAt(raw, at)
		if !ok {
			return 0, false
		}
		var bit uint8
		// Exact names only: json.Unmarshal also matches a key of another case, and takes or
		// skips a key it does not know; both are left to it.
		switch key {
		case "kind":
			bit, p.Kind = 1, Kind(val)
		case "harness":
			bit, p.Harness = 2, val
		case "session_id":
			bit, p.SessionID = 4, val
		case "name":
			bit, p.Name = 8, val
		case "from":
			bit, p.From = 16, val
		default:
			return 0, false
		}
		if seen&bit != 0 {
			return 0, false
		}
		seen |= bit
		return next, true
	})
	if !ok {
		return Principal{}, false
	}
	return p, true
}
