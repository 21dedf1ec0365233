package principal

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/xmsg/xmsg/internal/jsonline"
)

// Decode reads a principal as json.Unmarshal would. A leaf reads one with every row it pulls,
// and encoding/json's reflection there was 4% of a leaf's CPU, so the shape a node writes
// (one flat object of this type's own keys with string values that need no decoding; a
// repeated key's last value counts, as there) is read in one pass of its own; anything else
// goes to json.Unmarshal, which also says what is wrong (FuzzDecode holds the two equal).
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
	ok = jsonline.EachString(raw, func(key, val string) bool {
		// Exact names only: json.Unmarshal also matches a key of another case, and takes or
		// skips a key it does not know; both are left to it.
		switch key {
		case "kind":
			p.Kind = Kind(val)
		case "harness":
			p.Harness = val
		case "session_id":
			p.SessionID = val
		case "name":
			p.Name = val
		case "from":
			p.From = val
		default:
			return false
		}
		return true
	})
	if !ok {
		return Principal{}, false
	}
	return p, true
}

// Append appends json.Marshal(p): a hub writes a principal into each leaf message's envelope
// and its pull row (TestAppendIsMarshal).
func Append(dst []byte, p Principal) []byte {
	dst = append(dst, `{"kind":`...)
	dst = jsonline.AppendString(dst, string(p.Kind), true)
	for _, f := range [...]struct{ key, val string }{{`,"harness":`, p.Harness}, {`,"session_id":`, p.SessionID}, {`,"name":`, p.Name}, {`,"from":`, p.From}} {
		if f.val != "" {
			dst = append(dst, f.key...)
			dst = jsonline.AppendString(dst, f.val, true)
		}
	}
	return append(dst, '}')
}
