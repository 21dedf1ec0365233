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
	i := jsonline.SkipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return Principal{}, false
	}
	i = jsonline.SkipSpace(raw, i+1)
	var seen uint8 // one bit a key: a repeated one goes to json.Unmarshal (the last wins there)
	if i < len(raw) && raw[i] == '}' {
		i++
	} else {
		for {
			key, j, ok := jsonline.PlainStringAt(raw, i)
			if !ok {
				return Principal{}, false
			}
			if j = jsonline.SkipSpace(raw, j); j >= len(raw) || raw[j] != ':' {
				return Principal{}, false
			}
			val, j, ok := jsonline.PlainStringAt(raw, jsonline.SkipSpace(raw, j+1))
			if !ok {
				return Principal{}, false
			}
			var bit uint8
			// Exact names only: json.Unmarshal also matches a key of another case, and
			// takes or skips a key it does not know; both are left to it.
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
				return Principal{}, false
			}
			if seen&bit != 0 {
				return Principal{}, false
			}
			seen |= bit
			j = jsonline.SkipSpace(raw, j)
			if j < len(raw) && raw[j] == ',' {
				i = jsonline.SkipSpace(raw, j+1)
				continue
			}
			if j < len(raw) && raw[j] == '}' {
				i = j + 1
				break
			}
			return Principal{}, false
		}
	}
	if jsonline.SkipSpace(raw, i) != len(raw) {
		return Principal{}, false
	}
	return p, true
}
